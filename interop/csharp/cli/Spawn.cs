// Starting the command with the C library's posix_spawn and waiting for it
// with waitpid, rather than System.Diagnostics.Process: Mono reports a
// command killed by signal N as exit status 128+N, and Go's CLI (and the
// waiters elsewhere that read the fail event) tell "command killed by
// signal 9 (killed)" from "command exited with status 137". Mono reaps only
// the children it started itself, so the wait status of this one is ours.
// The arguments and the environment go to exec as the bytes they came as
// (Argv.cs), with no decoding on the way.
using System;
using System.Collections.Generic;
using System.IO;
using System.Runtime.InteropServices;
using System.Threading;

namespace MemoLockCli
{
    static class Spawn
    {
        [DllImport("libc", SetLastError = true)] static extern int pipe2(int[] fds, int flags);
        [DllImport("libc", SetLastError = true)] static extern int close(int fd);
        [DllImport("libc", SetLastError = true)] static extern IntPtr read(int fd, byte[] buf, IntPtr count);
        [DllImport("libc", SetLastError = true)] static extern int waitpid(int pid, out int status, int options);
        [DllImport("libc")] static extern int posix_spawn_file_actions_init(IntPtr fa);
        [DllImport("libc")] static extern int posix_spawn_file_actions_adddup2(IntPtr fa, int fd, int newfd);
        [DllImport("libc")] static extern int posix_spawn_file_actions_destroy(IntPtr fa);
        [DllImport("libc")] static extern int posix_spawn(out int pid, byte[] path, IntPtr fileActions, IntPtr attr, IntPtr[] argv, IntPtr[] envp);
        [DllImport("libc")] static extern IntPtr strerror(int errnum);
        const int O_CLOEXEC = 0x80000, EINTR = 4, ENOENT = 2;
        const int FileActionsSize = 256; // glibc's posix_spawn_file_actions_t is 80 bytes

        public sealed class Child
        {
            public int Pid;
            public int Stdout = -1, Stderr = -1; // our ends of the pipes; -1: none
        }

        /// <summary>The C library's text for errno e, as Go words it (lower case first).</summary>
        public static string ErrnoText(int e)
        {
            string s = Marshal.PtrToStringAnsi(strerror(e)) ?? ("errno " + e);
            return s.Length > 0 ? char.ToLowerInvariant(s[0]) + s.Substring(1) : s;
        }

        static int[] Pipe()
        {
            var fds = new int[2];
            if (pipe2(fds, O_CLOEXEC) != 0) throw new IOException("pipe: " + ErrnoText(Marshal.GetLastWin32Error()));
            return fds;
        }

        /// <summary>Starts argv (exec form, Argv.cs; argv[0] a path) with its stdout on a pipe, and its stderr too if pipeStderr.</summary>
        public static Child Start(string[] argv, bool pipeStderr)
        {
            var child = new Child();
            var outPipe = Pipe();
            int[] errPipe = pipeStderr ? Pipe() : null;
            var fa = Marshal.AllocHGlobal(FileActionsSize);
            var owned = new List<IntPtr>();
            try
            {
                posix_spawn_file_actions_init(fa);
                posix_spawn_file_actions_adddup2(fa, outPipe[1], 1);
                if (errPipe != null) posix_spawn_file_actions_adddup2(fa, errPipe[1], 2);
                var args = new IntPtr[argv.Length + 1];
                for (int i = 0; i < argv.Length; i++) args[i] = CString(Argv.Bytes(argv[i]), owned);
                var env = Environment();
                var envp = new IntPtr[env.Count + 1];
                for (int i = 0; i < env.Count; i++) envp[i] = CString(env[i], owned);
                int e = posix_spawn(out child.Pid, Terminated(Argv.Bytes(argv[0])), fa, IntPtr.Zero, args, envp);
                if (e != 0)
                    throw new StartException(e == ENOENT ? 127 : 126, "fork/exec " + Argv.Show(argv[0]) + ": " + ErrnoText(e));
                child.Stdout = outPipe[0];
                if (errPipe != null) child.Stderr = errPipe[0];
                return child;
            }
            catch (Exception)
            {
                close(outPipe[0]);
                if (errPipe != null) close(errPipe[0]);
                throw;
            }
            finally
            {
                posix_spawn_file_actions_destroy(fa);
                Marshal.FreeHGlobal(fa);
                foreach (var p in owned) Marshal.FreeHGlobal(p);
                close(outPipe[1]);
                if (errPipe != null) close(errPipe[1]);
            }
        }

        static byte[] Terminated(byte[] b)
        {
            var z = new byte[b.Length + 1];
            Buffer.BlockCopy(b, 0, z, 0, b.Length);
            return z;
        }

        static IntPtr CString(byte[] b, List<IntPtr> owned)
        {
            var z = Terminated(b);
            var p = Marshal.AllocHGlobal(z.Length);
            owned.Add(p);
            Marshal.Copy(z, 0, p, z.Length);
            return p;
        }

        static readonly string[] launcherVars = { "MEMOLOCK_ARGV_ENCODING=", "MEMOLOCK_CALLER_MONO_EXTERNAL_ENCODINGS=", "MONO_EXTERNAL_ENCODINGS=" };
        const string CallerVar = "MEMOLOCK_CALLER_MONO_EXTERNAL_ENCODINGS=";

        /// <summary>
        /// The environment memolock was given, as the bytes it came as
        /// (/proc/self/environ: Mono cannot even read a variable that is not
        /// UTF-8). Through the launcher, less the launcher's own settings, and
        /// with the caller's MONO_EXTERNAL_ENCODINGS back: a Mono command
        /// decodes its own argv as usual.
        /// </summary>
        static List<byte[]> Environment()
        {
            var env = new List<byte[]>();
            byte[] all = File.ReadAllBytes("/proc/self/environ");
            byte[] caller = null;
            int start = 0;
            for (int i = 0; i <= all.Length; i++)
            {
                if (i < all.Length && all[i] != 0) continue;
                if (i > start)
                {
                    var v = new byte[i - start];
                    Buffer.BlockCopy(all, start, v, 0, v.Length);
                    string head = System.Text.Encoding.ASCII.GetString(v, 0, Math.Min(v.Length, 48));
                    bool launcher = false;
                    if (Argv.Latin1)
                        foreach (var l in launcherVars) if (head.StartsWith(l, StringComparison.Ordinal)) launcher = true;
                    if (launcher && head.StartsWith(CallerVar, StringComparison.Ordinal))
                    {
                        caller = new byte[v.Length - CallerVar.Length];
                        Buffer.BlockCopy(v, CallerVar.Length, caller, 0, caller.Length);
                    }
                    if (!launcher) env.Add(v);
                }
                start = i + 1;
            }
            if (caller != null)
            {
                var name = System.Text.Encoding.ASCII.GetBytes("MONO_EXTERNAL_ENCODINGS=");
                var v = new byte[name.Length + caller.Length];
                Buffer.BlockCopy(name, 0, v, 0, name.Length);
                Buffer.BlockCopy(caller, 0, v, name.Length, caller.Length);
                env.Add(v);
            }
            return env;
        }

        /// <summary>Reads fd to its end on a thread of its own, handing each chunk to sink; the handle is set, and fd closed, at the end.</summary>
        public static ManualResetEvent Drain(int fd, Action<byte[]> sink)
        {
            var done = new ManualResetEvent(false);
            new Thread(() =>
            {
                var buf = new byte[32 * 1024];
                try
                {
                    while (true)
                    {
                        long n = (long)read(fd, buf, (IntPtr)buf.Length);
                        if (n < 0 && Marshal.GetLastWin32Error() == EINTR) continue;
                        if (n <= 0) break;
                        var chunk = new byte[n];
                        Buffer.BlockCopy(buf, 0, chunk, 0, (int)n);
                        sink(chunk);
                    }
                }
                catch (Exception) { }
                close(fd);
                done.Set();
            }) { IsBackground = true, Name = "memolock-pipe" }.Start();
            return done;
        }

        /// <summary>Waits for pid to end; its wait status.</summary>
        public static int Wait(int pid)
        {
            while (true)
            {
                int st;
                int r = waitpid(pid, out st, 0);
                if (r == pid) return st;
                if (r < 0 && Marshal.GetLastWin32Error() == EINTR) continue;
                return 0xff << 8; // cannot happen for our own child: report a failure, not a success
            }
        }

        /// <summary>The signal that killed the process, 0 if none.</summary>
        public static int TermSignal(int st) { int s = st & 0x7f; return s != 0 && s != 0x7f ? s : 0; }

        public static int ExitStatus(int st) { return (st >> 8) & 0xff; }
    }
}
