// MemoLock computes a value once across processes and shares it through
// Redis: the caller that wins the lock runs fetch, and every other caller,
// in any process, waits for the value it publishes. See interop/PROTOCOL.md.
//
// This file is the public client only: it checks its arguments and hands
// every call to the flight engine (FlightEngine.cs), which runs it.
using System;
using System.Diagnostics;
using System.Threading;

namespace MemoLockNet
{
    /// <summary>
    /// Gets values of one tag, computing each at most once at a time across
    /// every process sharing the Redis server. Thread-safe. Concurrent Get
    /// calls for one id in this process share one flight. Close (or Dispose)
    /// releases held locks (with an abandon event, so waiters elsewhere take
    /// over at once) and stops the client's threads.
    /// </summary>
    public sealed class MemoLock : IDisposable
    {
        /// <summary>Lock TTL used when none is given: 10 s.</summary>
        public static readonly TimeSpan DefaultLockTtl = TimeSpan.FromSeconds(10);

        internal readonly Subscriber Sub;
        internal readonly FlightEngine Engine;
        readonly bool hashIds;

        /// <param name="redis">the connection; Close does not dispose it.</param>
        /// <param name="tag">non-empty, without "/lock" or "/notif".</param>
        /// <param name="lockTtl">how long a lock lives unrenewed (default 10 s; at least 1 ms).</param>
        /// <param name="hashIds">send the lowercase hex SHA-256 of each id instead of the id.</param>
        /// <param name="onWait">called with (id, holder token) when a flight starts waiting on another holder.</param>
        /// <param name="negTtl">how long Redis remembers that fetch threw NotFoundException (default
        /// zero: not at all, the next Get calls fetch again; else at least 1 ms).</param>
        public MemoLock(IRedisTransport redis, string tag, TimeSpan? lockTtl = null, bool hashIds = false, Action<string, string> onWait = null,
            TimeSpan? negTtl = null)
        {
            if (redis == null) throw new ArgumentNullException("redis", "memolock: redis transport is null");
            var keys = new KeyScheme(tag);
            TimeSpan ttl = lockTtl ?? DefaultLockTtl;
            if (ttl < TimeSpan.FromMilliseconds(1))
                throw new ArgumentOutOfRangeException("lockTtl", "memolock: lock TTL " + ttl + " is under 1ms; Redis locks are set in whole milliseconds");
            TimeSpan neg = negTtl ?? TimeSpan.Zero;
            if (neg < TimeSpan.Zero)
                throw new ArgumentOutOfRangeException("negTtl", "memolock: NegTtl " + neg + " is negative; use zero to turn it off");
            if (neg > TimeSpan.Zero && neg < TimeSpan.FromMilliseconds(1))
                throw new ArgumentOutOfRangeException("negTtl", "memolock: NegTtl " + neg + " is under 1ms; Redis keeps times in whole milliseconds");
            Sub = new Subscriber(redis);
            Engine = new FlightEngine(new Protocol(redis, keys), Sub, (long)ttl.TotalMilliseconds,
                neg.Ticks / TimeSpan.TicksPerMillisecond, onWait);
            this.hashIds = hashIds;
        }

        public KeyScheme Keys { get { return Engine.Keys; } }

        /// <summary>How long Redis remembers that fetch found nothing (zero: not at all).</summary>
        public TimeSpan NegTtl { get { return TimeSpan.FromMilliseconds(Engine.NegTtlMs); } }

        /// <summary>Fetches (and external starts) run by this client.</summary>
        public long Fetches { get { return Interlocked.Read(ref Engine.Fetches); } }

        /// <summary>Flights that waited on a holder elsewhere.</summary>
        public long Waits { get { return Interlocked.Read(ref Engine.Waits); } }

        /// <summary>Flights that took the lock over after waiting on a holder elsewhere.</summary>
        public long Takeovers { get { return Interlocked.Read(ref Engine.Takeovers); } }

        /// <summary>Get calls that joined a flight already running in this process.</summary>
        public long Coalesced { get { return Engine.Flights.Coalesced; } }

        /// <summary>Subscriber reconnections so far (for tests and monitoring).</summary>
        public int Reconnects { get { return Sub.Reconnects; } }

        /// <summary>
        /// Returns the value of id (its UTF-8 bytes). On a miss exactly one
        /// caller across all processes runs fetch, which returns the value and
        /// how long Redis keeps it (TimeSpan.Zero: for ever); everyone else
        /// waits for it. If fetch throws, its exception reaches this process's
        /// callers and other processes' waiters get HolderFailedException with
        /// its message. If fetch throws NotFoundException (the id has no value),
        /// its callers get that exception and waiters elsewhere a
        /// NotFoundException, and Redis remembers it for NegTtl: until then,
        /// or until a value is stored, Get throws NotFoundException at once.
        /// With a timeout, a caller gives up with
        /// MemoLockTimeoutException; the flight goes on for other callers.
        /// </summary>
        public byte[] Get(string id, Func<Lease, ValueTuple<byte[], TimeSpan>> fetch, TimeSpan? timeout = null)
        {
            if (id == null) throw new ArgumentNullException("id", "memolock: id is null");
            return Get(Bytes.Utf8.GetBytes(id), fetch, timeout);
        }

        /// <summary>Get for an id given as raw bytes.</summary>
        public byte[] Get(byte[] id, Func<Lease, ValueTuple<byte[], TimeSpan>> fetch, TimeSpan? timeout = null)
        {
            if (fetch == null) throw new ArgumentNullException("fetch", "memolock: fetch is null");
            return Run(id, fetch, null, timeout);
        }

        /// <summary>
        /// Get for JSON values, the peer of Go's Typed with its default codec:
        /// fetch returns a value made of dictionaries (string keys), lists,
        /// numbers, strings, bools and null, stored as Go's encoding/json
        /// would encode it; every caller gets its own copy, parsed from the
        /// stored bytes (objects as Dictionary&lt;string, object&gt;, arrays as
        /// List&lt;object&gt;, numbers as double).
        /// </summary>
        public object GetJson(string id, Func<Lease, ValueTuple<object, TimeSpan>> fetch, TimeSpan? timeout = null)
        {
            if (fetch == null) throw new ArgumentNullException("fetch", "memolock: fetch is null");
            byte[] data = Get(id, l =>
            {
                var r = fetch(l);
                return (GoJson.Encode(r.Item1), r.Item2);
            }, timeout);
            return GoJson.Parse(Bytes.Utf8.GetString(data));
        }

        /// <summary>
        /// Get for values another program produces: the lock winner calls
        /// start, then waits like everybody else for the value to be SET and
        /// PUBLISHed. It keeps its lock until then and releases it (with a
        /// 1 s linger) when the value arrives.
        /// </summary>
        public byte[] GetExternal(string id, Action<Lease> start, TimeSpan? timeout = null)
        {
            if (id == null) throw new ArgumentNullException("id", "memolock: id is null");
            if (start == null) throw new ArgumentNullException("start", "memolock: start is null");
            return Run(Bytes.Utf8.GetBytes(id), null, start, timeout);
        }

        byte[] Run(byte[] id, Func<Lease, ValueTuple<byte[], TimeSpan>> fetch, Action<Lease> start, TimeSpan? timeout)
        {
            if (id == null) throw new ArgumentNullException("id", "memolock: id is null");
            if (timeout.HasValue && timeout.Value < TimeSpan.Zero)
                throw new ArgumentOutOfRangeException("timeout", "memolock: timeout " + timeout.Value + " is negative");
            return Engine.Get(id, hashIds ? KeyScheme.HashID(id) : id, fetch, start, timeout);
        }

        /// <summary>WaitOne for any timeout: WaitHandle takes at most int.MaxValue ms (24.8 days).</summary>
        internal static bool WaitUpTo(WaitHandle h, TimeSpan timeout)
        {
            var sw = Stopwatch.StartNew();
            while (true)
            {
                double left = (timeout - sw.Elapsed).TotalMilliseconds;
                if (left <= 0) return h.WaitOne(0);
                if (h.WaitOne((int)Math.Min(Math.Ceiling(left), int.MaxValue))) return true;
            }
        }

        /// <summary>True once Close has begun.</summary>
        public bool Closing { get { return Engine.Closing; } }

        /// <summary>
        /// Releases this client's locks, cancels running fetches (Lease.Cancellation)
        /// and waits for them, and stops the subscriber thread. Waiting callers
        /// get MemoLockClosedException. Safe to call more than once; from
        /// inside fetch it starts closing and returns at once.
        /// </summary>
        public void Close() { Engine.Close(); }

        public void Dispose() { Close(); }
    }
}
