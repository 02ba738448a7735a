// SIGINT, SIGTERM, SIGHUP and SIGQUIT, caught through libMonoPosixHelper.so
// (shipped with mono-runtime; the managed Mono.Posix.dll is not), the same
// native calls Mono.Unix.UnixSignal makes.
using System;
using System.Runtime.InteropServices;
using System.Threading;

namespace MemoLockCli
{
    sealed class Signals
    {
        delegate int ShuttingDown();
        [DllImport("MonoPosixHelper", EntryPoint = "Mono_Unix_UnixSignal_install")]
        static extern IntPtr Install(int sig);
        [DllImport("MonoPosixHelper", EntryPoint = "Mono_Unix_UnixSignal_WaitAny")]
        static extern int WaitAny(IntPtr[] infos, int count, int timeoutMs, ShuttingDown shuttingDown);
        [DllImport("MonoPosixHelper", EntryPoint = "Mono_Unix_UnixSignal_uninstall")]
        static extern int NativeUninstall(IntPtr info);

        // The native signal_info starts { int signum; int count; ... }: the
        // handler adds one to count for every signal, whether a WaitAny is
        // under way or not (Mono.Unix.UnixSignal.Count reads the same field).
        const int CountOffset = 4;

        static readonly int[] nums = { 2, 15, 1, 3 }; // SIGINT, SIGTERM, SIGHUP, SIGQUIT (Linux numbers)
        static readonly ShuttingDown notShuttingDown = () => 0; // kept alive: native code holds it

        /// <summary>Set on the first signal; Second on the next.</summary>
        public readonly ManualResetEvent First = new ManualResetEvent(false);
        public readonly ManualResetEvent Second = new ManualResetEvent(false);
        volatile int caught;
        volatile bool stopped;
        /// <summary>Called once, on the signal thread, at the first signal.</summary>
        public Action OnFirst { get; set; }

        // Linux's signals as Go names them (syscall.Signal.String), for the
        // texts that waiters elsewhere read (PROTOCOL.md, [A6]).
        static readonly string[] goNames =
        {
            null, "hangup", "interrupt", "quit", "illegal instruction", "trace/breakpoint trap", "aborted", "bus error",
            "floating point exception", "killed", "user defined signal 1", "segmentation fault", "user defined signal 2",
            "broken pipe", "alarm clock", "terminated", "stack fault", "child exited", "continued", "stopped (signal)",
            "stopped", "stopped (tty input)", "stopped (tty output)", "urgent I/O condition", "CPU time limit exceeded",
            "file size limit exceeded", "virtual timer expired", "profiling timer expired", "window changed",
            "I/O possible", "power failure", "bad system call",
        };

        /// <summary>Signal n's name as Go writes it: "killed" for 9, "terminated" for 15.</summary>
        public static string GoName(int n) { return n > 0 && n < goNames.Length ? goNames[n] : "signal " + n; }

        /// <summary>The first signal's number, 0 if none.</summary>
        public int Caught { get { return caught; } }

        /// <summary>Called on the signal thread after each WaitAny, before the counts are read: a test's way into the window between two WaitAny calls.</summary>
        internal Action AfterWait { get; set; }
        IntPtr[] infos;
        Thread thread;

        public bool Start()
        {
            try
            {
                infos = new IntPtr[nums.Length];
                for (int i = 0; i < nums.Length; i++) infos[i] = Install(nums[i]);
            }
            catch (Exception) { return false; } // no libMonoPosixHelper: signals keep their default action
            thread = new Thread(Loop) { IsBackground = true, Name = "memolock-signals" };
            thread.Start();
            return true;
        }

        // WaitAny reports a signal through a pipe that it sets up for the
        // call and tears down after it, so a signal that comes between two
        // calls is counted by the handler but never reported (a signal once went
        // unseen for 20 s and once for 60 s in the CLI tests). So the counts decide, read after
        // every WaitAny; WaitAny only wakes the thread early.
        void Loop()
        {
            var seen = new int[infos.Length];
            while (!stopped)
            {
                WaitAny(infos, infos.Length, 200, notShuttingDown);
                var hook = AfterWait;
                if (hook != null) hook();
                for (int i = 0; i < infos.Length; i++)
                {
                    int n = Marshal.ReadInt32(infos[i], CountOffset);
                    for (; seen[i] < n; seen[i]++) Got(nums[i]);
                }
            }
        }

        void Got(int signum)
        {
            if (caught == 0)
            {
                caught = signum;
                First.Set();
                var f = OnFirst;
                if (f != null) f();
            }
            else Second.Set();
        }

        public void Stop() { stopped = true; }

        /// <summary>How many times signal signum has been caught, as the native handler counts them (0 before Start).</summary>
        internal int Count(int signum)
        {
            int i = Array.IndexOf(nums, signum);
            return infos == null || i < 0 ? 0 : Marshal.ReadInt32(infos[i], CountOffset);
        }

        /// <summary>Stops the thread, and gives the signals their default action again.</summary>
        internal void Uninstall()
        {
            stopped = true;
            if (thread != null) thread.Join();
            if (infos != null) foreach (var info in infos) NativeUninstall(info);
        }
    }
}
