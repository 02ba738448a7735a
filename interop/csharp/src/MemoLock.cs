// MemoLock computes a value once across processes and shares it through
// Redis: the caller that wins the lock runs fetch, and every other caller,
// in any process, waits for the value it publishes. See interop/PROTOCOL.md.
using System;
using System.Collections.Generic;
using System.Diagnostics;
using System.Runtime.ExceptionServices;
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
        const int CloseWaitMs = 1000;

        internal readonly IRedisTransport Rdb;
        internal readonly Protocol Proto;
        internal readonly Subscriber Sub;
        internal readonly FlightGroup Flights = new FlightGroup();
        internal readonly long LockTtlMs;
        internal readonly long NegTtlMs;
        readonly bool hashIds;
        readonly Action<string, string> onWait;

        readonly object counts = new object();
        int running;   // flight threads, and callers doing a first lookup
        int callbacks; // fetch and start functions running
        volatile bool closing;
        readonly ManualResetEvent closed = new ManualResetEvent(false);
        [ThreadStatic] static int inCallback;

        /// <summary>Stats: fetches run here, and how many callers joined a running flight.</summary>
        public long Fetches, Waits, Takeovers;

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
            Rdb = redis;
            Proto = new Protocol(redis, keys);
            Sub = new Subscriber(redis);
            LockTtlMs = (long)ttl.TotalMilliseconds;
            NegTtlMs = neg.Ticks / TimeSpan.TicksPerMillisecond;
            this.hashIds = hashIds;
            this.onWait = onWait;
        }

        public KeyScheme Keys { get { return Proto.Keys; } }

        /// <summary>How long Redis remembers that fetch found nothing (zero: not at all).</summary>
        public TimeSpan NegTtl { get { return TimeSpan.FromMilliseconds(NegTtlMs); } }

        /// <summary>Get calls that joined a flight already running in this process.</summary>
        public long Coalesced { get { return Flights.Coalesced; } }

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
            return DoGet(id, fetch, null, timeout);
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
            return DoGet(Bytes.Utf8.GetBytes(id), null, start, timeout);
        }

        byte[] DoGet(byte[] id, Func<Lease, ValueTuple<byte[], TimeSpan>> fetch, Action<Lease> start, TimeSpan? timeout)
        {
            if (id == null) throw new ArgumentNullException("id", "memolock: id is null");
            if (timeout.HasValue && timeout.Value < TimeSpan.Zero)
                throw new ArgumentOutOfRangeException("timeout", "memolock: timeout " + timeout.Value + " is negative");
            byte[] key = hashIds ? KeyScheme.HashID(id) : id;
            bool leader;
            var f = Flights.Join(Bytes.Latin1(key), () => new Flight
            {
                Id = Bytes.Utf8.GetString(id),
                Key = key,
                Token = Tokens.New(),
                Fetch = fetch,
                Start = start,
            }, out leader);
            if (leader)
            {
                Enter();
                Attempt first = null;
                if (!timeout.HasValue)
                {
                    // This caller cannot leave: the first lookup runs on its
                    // thread, and a hit costs no thread.
                    first = Lookup(f);
                    if (first.Err == null && first.R.Kind == ReplyKind.Hit)
                    {
                        Flights.Finish(f, first.R.Value, null);
                        Exit();
                        return first.R.Value;
                    }
                    if (first.Err == null && first.R.Kind == ReplyKind.NotFound)
                    {
                        Flights.Finish(f, null, NotFoundFor(f));
                        Exit();
                        return Await(f, null);
                    }
                }
                var t = new Thread(() => Resolve(f, first)) { IsBackground = true, Name = "memolock-flight" };
                t.Start();
            }
            return Await(f, timeout);
        }

        byte[] Await(Flight f, TimeSpan? timeout)
        {
            if (!timeout.HasValue) f.Done.WaitOne();
            else if (!WaitUpTo(f.Done, timeout.Value))
            {
                Flights.Leave(f);
                throw new MemoLockTimeoutException(timeout.Value);
            }
            if (f.Err != null) ExceptionDispatchInfo.Capture(f.Err).Throw();
            return f.Val;
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

        void Enter() { lock (counts) running++; }
        void Exit() { lock (counts) { running--; Monitor.PulseAll(counts); } }

        internal sealed class Attempt
        {
            public AcquireReply R;
            public Exception Err;
            public bool Sent; // the script may have run despite Err: the lock may hold our token
        }

        internal Attempt Lookup(Flight f)
        {
            try { return new Attempt { R = Proto.Acquire(f.Key, f.Token, LockTtlMs) }; }
            catch (RedisConnectionException e) { return new Attempt { Err = e, Sent = true }; }
            catch (Exception e) { return new Attempt { Err = e }; }
        }

        /// <summary>Runs flight f to its end on its own thread.</summary>
        void Resolve(Flight f, Attempt first)
        {
            var w = new Wait(this, f);
            Next n;
            try { n = Pursue(f, w, first); }
            catch (Exception e) { n = Next.Fail(e); }
            Flights.Finish(f, n.Val, n.Err); // callers first; the rest can wait
            try { w.End(); } catch { }
            Exit();
        }

        Next Pursue(Flight f, Wait w, Attempt a)
        {
            while (true)
            {
                if (a == null) a = Lookup(f);
                var r = a.R;
                if (a.Err != null)
                {
                    w.MaybeLocked |= a.Sent;
                    if (f.Cancel.IsCancellationRequested) return Next.Fail(Ended());
                    return Next.Fail(a.Err);
                }
                a = null;
                if (r.Kind == ReplyKind.Hit) return w.Value(r.Value);
                if (r.Kind == ReplyKind.NotFound)
                {
                    w.Value(null); // ends the wait as a value would (external mode: our lock goes)
                    return Next.Fail(NotFoundFor(f));
                }
                if (r.Kind == ReplyKind.Locked && f.Start == null)
                {
                    w.Takeover();
                    w.End(); // our own value needs no notification
                    return Hold(f, w, r.Pttl);
                }
                if (r.Kind == ReplyKind.Locked && w.Own && r.Pttl >= 0)
                {
                    // External mode: our lock still holds, the producer still works.
                    r = new AcquireReply { Kind = ReplyKind.Busy, Pttl = r.Pttl, Holder = f.Token };
                }
                else if (r.Kind == ReplyKind.Locked)
                {
                    // External mode: we took the lock. Start the work, unless nobody wants it.
                    if (Flights.Retire(f)) { w.Own = true; return Next.Fail(new AbandonedException()); }
                    w.Takeover();
                    var err = StartExternal(f);
                    if (err != null) return Next.Fail(err);
                    r = new AcquireReply { Kind = ReplyKind.Busy, Pttl = LockTtlMs, Holder = f.Token };
                }
                var n = w.WaitFor(r);
                if (!n.Again) return n;
            }
        }

        /// <summary>Runs fetch under f's lock while renewing it, then stores the value.</summary>
        Next Hold(Flight f, Wait w, long pttl)
        {
            if (!Take(f)) return Next.Fail(Ended());
            Interlocked.Increment(ref Fetches);
            var lease = new Lease(this, f);
            var stop = new ManualResetEvent(false);
            long first = LockTtlMs / 3;
            if (pttl >= 0) first = Math.Min(first, pttl / 2);
            var dog = new Thread(() => Watchdog(f, first, stop)) { IsBackground = true, Name = "memolock-renew" };
            dog.Start();
            byte[] val = null;
            TimeSpan ttl = TimeSpan.Zero;
            Exception err = null;
            try
            {
                inCallback++;
                var res = f.Fetch(lease);
                val = res.Item1;
                ttl = res.Item2;
            }
            catch (Exception e) { err = e; }
            finally { inCallback--; EndCallback(); }
            stop.Set();
            dog.Join(); // a late renewal must not find the lock gone and report it lost

            if (err == null && ttl < TimeSpan.Zero)
                err = new ArgumentOutOfRangeException("ttl", "memolock: fetch returned negative TTL " + ttl + " for id \"" + f.Id + "\"");
            if (err == null && val == null)
                err = new ArgumentNullException("value", "memolock: fetch returned a null value for id \"" + f.Id + "\"; return an empty array for an empty value");
            if (err != null && Closing)
            {
                // Most likely cancelled by Close: let a waiter elsewhere take over.
                Release(f, Tokens.AbandonEvent(f.Token), 0);
                return Next.Fail(new MemoLockClosedException());
            }
            if (err is NotFoundException)
            {
                // Not a failure: no fail event; the callers get fetch's own exception.
                RecordNotFound(f);
                return Next.Fail(err);
            }
            if (err != null)
            {
                Release(f, Tokens.FailEvent(f.Token, err.Message), 0);
                return Next.Fail(err);
            }
            long ms = 0;
            if (ttl > TimeSpan.Zero) ms = Math.Max(ttl.Ticks / TimeSpan.TicksPerMillisecond, 1);
            try { Proto.Store(f.Key, f.Token, val, ms); }
            catch (Exception e) { w.After = () => StoreFailed(f, e); }
            return Next.Value(val);
        }

        /// <summary>Records for NegTtl that fetch found nothing, and tells waiters; if that fails,
        /// releases the lock with an abandon event so that they look again at once.</summary>
        void RecordNotFound(Flight f)
        {
            try { Proto.NotFound(f.Key, f.Token, NegTtlMs); }
            catch (Exception)
            {
                // The script may have run in part, or the lock expired: tell waiters anyway.
                if (!Release(f, Tokens.AbandonEvent(f.Token), 0))
                    try { Proto.Abandoned(f.Key, f.Token); } catch { }
            }
        }

        internal static NotFoundException NotFoundFor(Flight f) { return new NotFoundException("memolock: not found: id \"" + f.Id + "\""); }

        /// <summary>Makes f a holder; if every caller left or Close began, hands the lock over instead.</summary>
        bool Take(Flight f)
        {
            if (!Flights.Hold(f)) { Release(f, Tokens.AbandonEvent(f.Token), 0); return false; }
            lock (counts) callbacks++;
            return true;
        }

        void EndCallback() { lock (counts) { callbacks--; Monitor.PulseAll(counts); } }

        /// <summary>Tells waiters at once that the store failed: fail if the lock is still ours, else abandon.</summary>
        void StoreFailed(Flight f, Exception err)
        {
            if (Release(f, Tokens.FailEvent(f.Token, err.Message), 0)) return;
            try { Proto.Abandoned(f.Key, f.Token); } catch { }
        }

        /// <summary>Renews the lease every lockTTL/3 until stop, or until renew answers 0.</summary>
        void Watchdog(Flight f, long firstMs, ManualResetEvent stop)
        {
            long wait = firstMs;
            while (!stop.WaitOne((int)Math.Min(Math.Max(wait, 0), int.MaxValue)))
            {
                try { if (!Proto.Renew(f.Key, f.Token, LockTtlMs)) return; }
                catch (Exception) { }
                wait = LockTtlMs / 3;
            }
        }

        Exception StartExternal(Flight f)
        {
            if (!Take(f)) return Ended();
            Interlocked.Increment(ref Fetches);
            Exception err = null;
            try { inCallback++; f.Start(new Lease(this, f)); }
            catch (Exception e) { err = e; }
            finally { inCallback--; EndCallback(); }
            if (err != null) Release(f, Tokens.FailEvent(f.Token, err.Message), 0);
            return err;
        }

        /// <summary>Releases f's lock if it holds f's token, publishing evt; failures are harmless (the lock expires).</summary>
        internal bool Release(Flight f, byte[] evt, long lingerMs)
        {
            try { return Proto.Release(f.Key, f.Token, evt, lingerMs); }
            catch (Exception) { return false; }
        }

        internal void NotifyWait(Flight f, string holder)
        {
            Interlocked.Increment(ref Waits);
            if (onWait == null) return;
            try { inCallback++; onWait(f.Id, holder); } catch { } finally { inCallback--; }
        }

        // Work ended by Close must never report AbandonedException: the
        // group's flag is set before any flight is cancelled.
        internal Exception Ended() { return Closing ? (Exception)new MemoLockClosedException() : new AbandonedException(); }

        /// <summary>True once Close has begun.</summary>
        public bool Closing { get { return closing || Flights.Closed; } }

        /// <summary>
        /// Releases this client's locks, cancels running fetches (Lease.Cancellation)
        /// and waits for them, and stops the subscriber thread. Waiting callers
        /// get MemoLockClosedException. Safe to call more than once; from
        /// inside fetch it starts closing and returns at once.
        /// </summary>
        public void Close()
        {
            var flights = Flights.Close();
            if (flights == null)
            {
                if (inCallback == 0) closed.WaitOne();
                return;
            }
            closing = true;
            foreach (var f in flights) f.Cancel.Cancel();
            foreach (var f in flights) Flights.Finish(f, null, new MemoLockClosedException());
            if (inCallback > 0) { new Thread(Shutdown) { IsBackground = true }.Start(); return; }
            Shutdown();
        }

        void Shutdown()
        {
            var sw = Stopwatch.StartNew();
            lock (counts)
            {
                while (callbacks > 0) Monitor.Wait(counts);
                while (running > 0)
                {
                    int left = CloseWaitMs - (int)sw.ElapsedMilliseconds;
                    if (left <= 0) break;
                    Monitor.Wait(counts, left);
                }
            }
            Sub.Close(Math.Max(CloseWaitMs - (int)sw.ElapsedMilliseconds, 100));
            closed.Set();
        }

        public void Dispose() { Close(); }
    }

    /// <summary>Ends a flight every caller left; nobody sees it.</summary>
    sealed class AbandonedException : Exception { public AbandonedException() : base("memolock: flight abandoned") { } }

    /// <summary>What a wait decided: a value, an error, or look again.</summary>
    struct Next
    {
        public byte[] Val;
        public Exception Err;
        public bool Again;
        public static Next Value(byte[] v) { return new Next { Val = v }; }
        public static Next Fail(Exception e) { return new Next { Err = e }; }
        public static readonly Next LookAgain = new Next { Again = true };
    }

    /// <summary>
    /// The right to compute one value: the lock key holding our token. The
    /// client renews it while fetch runs; fetch may check or extend it.
    /// </summary>
    public sealed class Lease
    {
        readonly MemoLock c;
        readonly Flight f;
        internal Lease(MemoLock c, Flight f) { this.c = c; this.f = f; }

        /// <summary>The id as sent to Redis.</summary>
        public byte[] Id { get { return f.Key; } }
        /// <summary>The token in the lock: 32 hex digits, then "@host:pid".</summary>
        public string Token { get { return f.Token; } }
        /// <summary>Cancelled when the client closes: fetch should stop.</summary>
        public CancellationToken Cancellation { get { return f.Cancel.Token; } }

        /// <summary>Whether the lock still holds our token (a lost lease is reported to waiters).</summary>
        public bool Held() { return c.Proto.Renew(f.Key, f.Token, 0); }

        /// <summary>Makes the lock live at least ttl more; never shortens it. Throws if the lease is lost.</summary>
        public void Extend(TimeSpan ttl)
        {
            if (ttl < TimeSpan.FromMilliseconds(1))
                throw new ArgumentOutOfRangeException("ttl", "memolock: lease extension " + ttl + " is under 1ms");
            if (!c.Proto.Renew(f.Key, f.Token, (long)ttl.TotalMilliseconds))
                throw new MemoLockException("memolock: lease lost");
        }
    }
}
