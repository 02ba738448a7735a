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

        static readonly int[] nums = { 2, 15, 1, 3 }; // SIGINT, SIGTERM, SIGHUP, SIGQUIT (Linux numbers)
        static readonly ShuttingDown notShuttingDown = () => 0; // kept alive: native code holds it

        /// <summary>Set on the first signal; Second on the next.</summary>
        public readonly ManualResetEvent First = new ManualResetEvent(false);
        public readonly ManualResetEvent Second = new ManualResetEvent(false);
        volatile int caught;
        volatile bool stopped;
        /// <summary>Called once, on the signal thread, at the first signal.</summary>
        public Action OnFirst;

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

        public bool Start()
        {
            IntPtr[] infos;
            try
            {
                infos = new IntPtr[nums.Length];
                for (int i = 0; i < nums.Length; i++) infos[i] = Install(nums[i]);
            }
            catch (Exception) { return false; } // no libMonoPosixHelper: signals keep their default action
            var t = new Thread(() =>
            {
                while (!stopped)
                {
                    int r = WaitAny(infos, infos.Length, 200, notShuttingDown);
                    if (r < 0 || r >= infos.Length) continue;
                    if (caught == 0)
                    {
                        caught = nums[r];
                        First.Set();
                        var f = OnFirst;
                        if (f != null) f();
                    }
                    else Second.Set();
                }
            }) { IsBackground = true, Name = "memolock-signals" };
            t.Start();
            return true;
        }

        public void Stop() { stopped = true; }
    }
}
