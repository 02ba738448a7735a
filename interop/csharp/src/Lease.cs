// The lease: a flight's hold on the lock key, which holds its token. Fetch
// sees it as Lease; the engine keeps it alive with a Renewal while fetch runs.
using System;
using System.Threading;

namespace MemoLockNet
{
    /// <summary>
    /// The right to compute one value: the lock key holding our token. The
    /// client renews it while fetch runs; fetch may check or extend it.
    /// </summary>
    public sealed class Lease
    {
        readonly Protocol proto;
        readonly Flight f;
        internal Lease(Protocol proto, Flight f) { this.proto = proto; this.f = f; }

        /// <summary>The id as sent to Redis.</summary>
        public byte[] Id { get { return f.Key; } }
        /// <summary>The token in the lock: 32 hex digits, then "@host:pid".</summary>
        public string Token { get { return f.Token; } }
        /// <summary>Cancelled when the client closes: fetch should stop.</summary>
        public CancellationToken Cancellation { get { return f.Cancel.Token; } }

        /// <summary>Whether the lock still holds our token (a lost lease is reported to waiters).</summary>
        public bool Held() { return proto.Renew(f.Key, f.Token, 0); }

        /// <summary>Makes the lock live at least ttl more; never shortens it. Throws if the lease is lost.</summary>
        public void Extend(TimeSpan ttl)
        {
            if (ttl < TimeSpan.FromMilliseconds(1))
                throw new ArgumentOutOfRangeException("ttl", "memolock: lease extension " + ttl + " is under 1ms");
            if (!proto.Renew(f.Key, f.Token, (long)ttl.TotalMilliseconds))
                throw new MemoLockException("memolock: lease lost");
        }
    }

    /// <summary>
    /// Renews a lease every lock TTL/3 on a thread of its own, from Start
    /// until Stop, or until renew answers 0 (the lock is lost, and the
    /// script has told waiters so).
    /// </summary>
    sealed class Renewal
    {
        readonly Protocol proto;
        readonly Flight f;
        readonly long lockTtlMs;
        readonly ManualResetEvent stop = new ManualResetEvent(false);
        Thread thread;

        public Renewal(Protocol proto, Flight f, long lockTtlMs) { this.proto = proto; this.f = f; this.lockTtlMs = lockTtlMs; }

        /// <summary>Starts renewing; the first renewal comes after firstMs.</summary>
        public void Start(long firstMs)
        {
            thread = new Thread(() => Run(firstMs)) { IsBackground = true, Name = "memolock-renew" };
            thread.Start();
        }

        /// <summary>Stops renewing and waits for a renewal under way, so that it cannot find the lock gone and report it lost.</summary>
        public void Stop()
        {
            stop.Set();
            thread.Join();
        }

        void Run(long firstMs)
        {
            long wait = firstMs;
            while (!stop.WaitOne((int)Math.Min(Math.Max(wait, 0), int.MaxValue)))
            {
                try { if (!proto.Renew(f.Key, f.Token, lockTtlMs)) return; }
                catch (Exception) { } // a failed renewal is retried at the next tick; the lock outlives one
                wait = lockTtlMs / 3;
            }
        }
    }
}
