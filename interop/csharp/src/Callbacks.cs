// The one place where a client runs its user's code: fetch, an external
// start, and the onWait notification. Whatever that code throws comes back
// as a value, which the engine hands to every caller of the flight; Close
// waits for what runs here, and returns at once when called from inside.
using System;
using System.Threading;

namespace MemoLockNet
{
    sealed class Callbacks
    {
        readonly object mu = new object();
        int running;
        // Per thread, not per client: a fetch of one client may close another.
        [ThreadStatic] static int depth;

        /// <summary>True on a thread that is running user code (of any client).</summary>
        public static bool OnThisThread { get { return depth > 0; } }

        /// <summary>Runs body; returns what it threw, or null.</summary>
        public Exception Run(Action body)
        {
            lock (mu) running++;
            depth++;
            try
            {
                body();
                return null;
            }
            catch (Exception e) { return e; }
            finally
            {
                depth--;
                lock (mu) { running--; Monitor.PulseAll(mu); }
            }
        }

        /// <summary>Blocks until no user code of this client runs.</summary>
        public void WaitIdle()
        {
            lock (mu) while (running > 0) Monitor.Wait(mu);
        }
    }
}
