// Running the command: resolving it as a shell would (127 not found, 126
// cannot execute, a file without #! runs with /bin/sh), capturing its
// standard output as raw bytes, and stopping it and its descendants
// (SIGTERM, then SIGKILL after 2 s or at a second signal).
using System;
using System.Collections.Generic;
using System.Diagnostics;
using System.IO;
using System.Linq;
using System.Runtime.InteropServices;
using System.Threading;

namespace MemoLockCli
{
    /// <summary>The command failed where it ran: its exit status, or the signal that killed it (Code 128+N then).</summary>
    sealed class CommandExitException : Exception
    {
        public readonly int Code, Signal;
        public CommandExitException(int code, int signal)
            : base(signal != 0 ? "command killed by signal " + signal + " (" + Signals.GoName(signal) + ")" : "command exited with status " + code)
        {
            Code = signal != 0 ? 128 + signal : code;
            Signal = signal;
        }
    }

    /// <summary>The command could not start: 127 not found, 126 cannot execute.</summary>
    sealed class StartException : Exception
    {
        public readonly int Code;
        public StartException(int code, string message) : base(message) { Code = code; }
    }

    /// <summary>The run was interrupted by a signal or by Close.</summary>
    sealed class InterruptedException : Exception
    {
        public InterruptedException() : base("interrupted") { }
    }

    static class Command
    {
        [DllImport("libc", SetLastError = true)] static extern int kill(int pid, int sig);
        [DllImport("libc", SetLastError = true)] static extern int access(string path, int mode);
        const int SIGTERM = 15, SIGKILL = 9, X_OK = 1;
        /// <summary>How long the command's processes have after SIGTERM before SIGKILL: 2 s, as in Go, unless MEMOLOCK_KILL_GRACE says otherwise.</summary>
        public static int KillGraceMs = 2000;

        /// <summary>
        /// Finds argv[0] as exec.LookPath does and decides how to run it.
        /// argv and the result are in exec form (Argv.cs); a name that is
        /// not UTF-8, which the file APIs cannot name, goes to exec as it is.
        /// </summary>
        static string[] Resolve(string[] argv)
        {
            string name = Argv.ForFiles(argv[0]), path = null;
            if (name == null) return argv;
            if (name.Contains("/")) path = name;
            else
            {
                foreach (var dir in (Environment.GetEnvironmentVariable("PATH") ?? "").Split(':'))
                {
                    string p = Path.Combine(dir == "" ? "." : dir, name);
                    if (File.Exists(p) && access(p, X_OK) == 0) { path = p; break; }
                }
                if (path == null) throw new StartException(127, "exec: \"" + name + "\": executable file not found in $PATH");
            }
            // As Go words them (exec of a directory fails with EACCES there).
            if (Directory.Exists(path)) throw new StartException(126, "fork/exec " + path + ": permission denied");
            if (!File.Exists(path)) throw new StartException(127, "fork/exec " + path + ": no such file or directory");
            if (access(path, X_OK) != 0) throw new StartException(126, "fork/exec " + path + ": permission denied");
            byte[] head = new byte[256];
            int n;
            try { using (var f = File.OpenRead(path)) n = f.Read(head, 0, head.Length); }
            catch (Exception) { n = 0; } // executable but unreadable: let exec decide
            var rest = argv.Skip(1);
            if (n >= 2 && head[0] == '#' && head[1] == '!')
            {
                string line = System.Text.Encoding.UTF8.GetString(head, 2, n - 2).Split('\n')[0].Trim();
                string interp = line.Split(new[] { ' ', '\t' }, 2)[0];
                if (!File.Exists(interp)) throw new StartException(126, path + ": bad interpreter: fork/exec " + path + ": no such file or directory");
            }
            else if (n >= 4 && !(head[0] == 0x7f && head[1] == 'E' && head[2] == 'L' && head[3] == 'F'))
                return new[] { "/bin/sh", Argv.ForExec(path) }.Concat(rest).ToArray(); // as a shell runs it
            return new[] { Argv.ForExec(path) }.Concat(rest).ToArray();
        }

        /// <summary>
        /// Runs argv and returns its standard output. If cancel fires or a
        /// signal arrives, stops every process of the command and throws
        /// InterruptedException once they are gone. A failing command throws
        /// CommandExitException, with its output in partial. With a status
        /// line on a terminal, the command's stderr passes through it.
        /// </summary>
        public static byte[] Run(string[] argv, CancellationToken cancel, Signals sig, Status status, out byte[] partial)
        {
            partial = null;
            if (cancel.IsCancellationRequested || sig.First.WaitOne(0)) throw new InterruptedException();
            var full = Resolve(argv);
            bool relay = status != null && status.OnTerminal;
            var child = Spawn.Start(full, relay);
            var buf = new MemoryStream();
            var read = Spawn.Drain(child.Stdout, b => buf.Write(b, 0, b.Length));
            var relayed = relay ? Spawn.Drain(child.Stderr, status.Relay) : null;
            var exited = new ManualResetEvent(false);
            int waitStatus = 0;
            new Thread(() => { waitStatus = Spawn.Wait(child.Pid); exited.Set(); }) { IsBackground = true }.Start();
            try
            {
                // All of the output, as a shell's $(...) has it: the command's
                // exit, and the end of its output, which processes it left
                // behind may hold.
                bool leaderDone = false, readDone = false;
                var handles = new WaitHandle[] { cancel.WaitHandle, sig.First, exited, read };
                while (!leaderDone || !readDone)
                {
                    int i = WaitHandle.WaitAny(handles, 1000);
                    if (i == 0 || i == 1) return Stop(child.Pid, exited, sig, read);
                    if (i == 2 && !leaderDone)
                    {
                        leaderDone = true;
                        handles = new WaitHandle[] { cancel.WaitHandle, sig.First, read };
                        if (KilledLike(waitStatus) && sig.First.WaitOne(100))
                            return Stop(child.Pid, exited, sig, read); // ^C on a terminal reaches the command and us alike: interrupted, not failed
                    }
                    if (read.WaitOne(0)) readDone = true;
                }
            }
            finally
            {
                // The last of the command's stderr, before anything run says
                // about its end; a process left behind that holds stderr
                // open does not hold run up for long.
                if (relayed != null) relayed.WaitOne(200);
            }
            int signal = Spawn.TermSignal(waitStatus), code = Spawn.ExitStatus(waitStatus);
            if (signal != 0 || code != 0) { partial = buf.ToArray(); throw new CommandExitException(code, signal); }
            return buf.ToArray();
        }

        /// <summary>Whether the command ended as an interrupted command does: killed by a signal, or with a status above 128.</summary>
        static bool KilledLike(int waitStatus) { return Spawn.TermSignal(waitStatus) != 0 || Spawn.ExitStatus(waitStatus) > 128; }

        static byte[] Stop(int pid, WaitHandle exited, Signals sig, WaitHandle read)
        {
            StopAll(pid, exited, sig.Second);
            read.WaitOne(KillGraceMs);
            throw new InterruptedException();
        }

        /// <summary>SIGTERM to the leader and its descendants, SIGKILL after the grace (or when force is set), until all are gone.</summary>
        static void StopAll(int leader, WaitHandle exited, WaitHandle force)
        {
            var known = new HashSet<int>(Descendants(leader)) { leader };
            int sig = SIGTERM;
            var sw = Stopwatch.StartNew();
            foreach (var pid in known) kill(pid, sig);
            while (true)
            {
                if (sig == SIGTERM && (sw.ElapsedMilliseconds > KillGraceMs || force.WaitOne(0))) sig = SIGKILL;
                Thread.Sleep(10);
                bool leaderDone = exited.WaitOne(0);
                if (!leaderDone) known.UnionWith(Descendants(leader));
                known.RemoveWhere(pid => pid != leader && !Alive(pid));
                if (leaderDone) known.Remove(leader);
                if (known.Count == 0) return;
                foreach (var pid in known) kill(pid, sig);
            }
        }

        static bool Alive(int pid)
        {
            // A zombie has exited: nothing to wait for.
            try { return File.ReadAllText("/proc/" + pid + "/stat").Split(')').Last().Trim()[0] != 'Z'; }
            catch (Exception) { return false; }
        }

        /// <summary>Every process below root, from /proc.</summary>
        static List<int> Descendants(int root)
        {
            var children = new Dictionary<int, List<int>>();
            foreach (var dir in Directory.GetDirectories("/proc"))
            {
                int pid;
                if (!int.TryParse(Path.GetFileName(dir), out pid)) continue;
                try
                {
                    string stat = File.ReadAllText(dir + "/stat");
                    var f = stat.Substring(stat.LastIndexOf(')') + 2).Split(' ');
                    int ppid = int.Parse(f[1]);
                    List<int> l;
                    if (!children.TryGetValue(ppid, out l)) children[ppid] = l = new List<int>();
                    l.Add(pid);
                }
                catch (Exception) { }
            }
            var res = new List<int>();
            var todo = new Stack<int>();
            todo.Push(root);
            while (todo.Count > 0)
            {
                List<int> l;
                if (!children.TryGetValue(todo.Pop(), out l)) continue;
                foreach (var c in l) { res.Add(c); todo.Push(c); }
            }
            return res;
        }
    }
}
