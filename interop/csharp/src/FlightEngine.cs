// The flight engine: takes each flight of one client from its first lookup
// to its end. A flight looks up; on a hit it is done; on a busy lock it
// waits (Wait.cs) and looks again; once it holds the lock it computes under
// it (renewed by Lease.cs) and stores the value, or tells waiters elsewhere
// why not. FlightGroup (Flight.cs) owns each flight's state; Callbacks runs
// the user's code; whatever ends a flight reaches all of its callers at once.
using System;
using System.Diagnostics;
using System.Runtime.ExceptionServices;
using System.Threading;

namespace MemoLockNet
{
    sealed class FlightEngine
    {
        const int CloseWaitMs = 1000;

        internal readonly Protocol Proto;
        internal readonly Subscriber Sub;
        internal readonly FlightGroup Flights = new FlightGroup();
        internal readonly Callbacks Callbacks = new Callbacks();
        internal readonly long LockTtlMs;
        internal readonly long NegTtlMs;
        readonly Action<string, string> onWait;

        readonly object mu = new object();
        int running; // flight threads, and callers doing a first lookup
        volatile bool closing;
        readonly ManualResetEvent closed = new ManualResetEvent(false);

        internal long Fetches, Waits, Takeovers;
        /// <summary>Waiters add a random delay to their lock timers (PROTOCOL.md); tests turn it off to isolate the takeover check.</summary>
        internal bool SpreadTimers = true;

        public FlightEngine(Protocol proto, Subscriber sub, long lockTtlMs, long negTtlMs, Action<string, string> onWait)
        {
            Proto = proto;
            Sub = sub;
            LockTtlMs = lockTtlMs;
            NegTtlMs = negTtlMs;
            this.onWait = onWait;
        }

        public KeyScheme Keys { get { return Proto.Keys; } }

        /// <summary>The value of id (key: the id as sent to Redis), through the flight of key in this process.</summary>
        public byte[] Get(byte[] id, byte[] key, Func<Lease, ValueTuple<byte[], TimeSpan>> fetch, Action<Lease> start, TimeSpan? timeout)
        {
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
            else if (!MemoLock.WaitUpTo(f.Done, timeout.Value))
            {
                Flights.Leave(f);
                throw new MemoLockTimeoutException(timeout.Value);
            }
            if (f.Err != null) ExceptionDispatchInfo.Capture(f.Err).Throw();
            return f.Val;
        }

        void Enter() { lock (mu) running++; }
        void Exit() { lock (mu) { running--; Monitor.PulseAll(mu); } }

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

        /// <summary>Runs flight f to its end on its own thread; its outcome, whatever it is, reaches every caller.</summary>
        void Resolve(Flight f, Attempt first)
        {
            var w = new Wait(this, f);
            Next n;
            try { n = Pursue(f, w, first); }
            catch (Exception e) { n = Next.Fail(e); }
            Flights.Finish(f, n.Val, n.Err); // callers first; the rest can wait
            try { w.End(); } catch { }
            if (n.After != null) try { n.After(); } catch { }
            Exit();
        }

        Next Pursue(Flight f, Wait w, Attempt a)
        {
            while (true)
            {
                if (a == null)
                {
                    w.BeforeLookup();
                    a = Lookup(f);
                }
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
                    w.NotFound(); // external mode: our lock goes first, with no linger ([L4])
                    return Next.Fail(NotFoundFor(f));
                }
                if (r.Kind == ReplyKind.Locked && f.Start == null)
                {
                    var took = Stopwatch.StartNew();
                    Next ended;
                    if (w.HolderEndedFirst(out ended)) return ended;
                    w.Takeover();
                    w.End(); // our own value needs no notification
                    long pttl = (r.Pttl >= 0 ? r.Pttl : LockTtlMs) - took.ElapsedMilliseconds;
                    return Compute(f, Math.Max(pttl, 0));
                }
                if (r.Kind == ReplyKind.Locked && w.Own && r.Pttl >= 0)
                {
                    // External mode: our lock still holds, the producer still
                    // works, unless it has spoken: a word of its kept from a
                    // read that sent us to look again ends the flight now,
                    // not a lock TTL later ([E1a]).
                    Next late;
                    if (w.ActOnLate(out late)) return late;
                    r = new AcquireReply { Kind = ReplyKind.Busy, Pttl = r.Pttl, Holder = f.Token };
                }
                else if (r.Kind == ReplyKind.Locked)
                {
                    var won = Stopwatch.StartNew(); // about when Redis took the lock
                    // Found already ours (a retried lookup whose first reply
                    // was lost): the lock has what the reply says left.
                    long held = r.Pttl >= 0 ? r.Pttl : LockTtlMs;
                    // External mode: we took the lock. Start the work, unless
                    // the holder we waited on ended first, or, when the flight
                    // took its own expired lock again, a value came; unless
                    // its earlier producer's late fail or notfound, kept,
                    // ends it ([E1a], before [E4]'s abandon); or nobody wants it.
                    Next ended;
                    if (w.HolderEndedFirst(out ended)) return ended;
                    if (w.ActOnLate(out ended)) return ended;
                    if (Flights.Retire(f)) { w.Own = true; return Next.Fail(new AbandonedException()); }
                    w.Takeover();
                    // The lock is ours from here: a value the producer
                    // publishes while start runs must end the flight through
                    // the wait, which releases the lock with its linger, and
                    // not from the subscriber thread (OnValue), after which
                    // the lock went with an abandon event (seen under load).
                    // Live before start ([E1]): a producer that fails or
                    // finishes during start must not publish into the void.
                    if (w.EndedBeforeStart(out ended)) return ended;
                    // [E4]: every caller may have left during that wait.
                    if (Flights.Retire(f)) return Next.Fail(new AbandonedException());
                    w.Started(); // from here its producer may answer late ([E1])
                    var err = StartExternal(f);
                    if (err != null) { w.Own = false; return Next.Fail(err); }
                    // Our timer runs from what is left of the lock: the
                    // takeover check, going live and start took some of it ([E1]).
                    r = new AcquireReply { Kind = ReplyKind.Busy, Pttl = Math.Max(held - won.ElapsedMilliseconds, 0), Holder = f.Token };
                }
                var n = w.WaitFor(r);
                if (!n.Again) return n;
            }
        }

        /// <summary>Runs fetch under f's lock (pttl ms left, -1: a full lock TTL) while renewing it, then stores the value.</summary>
        Next Compute(Flight f, long pttl)
        {
            if (!BecomeHolder(f)) return Next.Fail(Ended());
            Interlocked.Increment(ref Fetches);
            var lease = new Lease(Proto, f);
            var renewal = new Renewal(Proto, f, LockTtlMs);
            long first = LockTtlMs / 3;
            if (pttl >= 0) first = Math.Min(first, pttl / 2);
            renewal.Start(first);
            byte[] val = null;
            TimeSpan ttl = TimeSpan.Zero;
            Exception err = Callbacks.Run(() =>
            {
                var res = f.Fetch(lease);
                val = res.Item1;
                ttl = res.Item2;
            });
            renewal.Stop();

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
                Relay(f, token => Tokens.Event(Tokens.EventNotFound, token));
                return Next.Fail(err);
            }
            if (err != null)
            {
                Release(f, Tokens.FailEvent(f.Token, err.Message), 0);
                Relay(f, token => Tokens.FailEvent(token, err.Message));
                return Next.Fail(err);
            }
            long ms = 0;
            if (ttl > TimeSpan.Zero) ms = Math.Max(ttl.Ticks / TimeSpan.TicksPerMillisecond, 1);
            try { Proto.Store(f.Key, f.Token, val, ms); }
            catch (Exception e) { return Next.ValueThen(val, () => StoreFailed(f, e)); }
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
        bool BecomeHolder(Flight f)
        {
            if (Flights.Hold(f)) return true;
            Release(f, Tokens.AbandonEvent(f.Token), 0);
            return false;
        }

        /// <summary>Tells waiters at once that the store failed: fail if the lock is still ours, else abandon.</summary>
        void StoreFailed(Flight f, Exception err)
        {
            if (Release(f, Tokens.FailEvent(f.Token, err.Message), 0)) return;
            try { Proto.Abandoned(f.Key, f.Token); } catch { }
        }

        Exception StartExternal(Flight f)
        {
            if (!BecomeHolder(f)) return Ended();
            Interlocked.Increment(ref Fetches);
            var lease = new Lease(Proto, f);
            var err = Callbacks.Run(() => f.Start(lease));
            if (err != null && Closing)
            {
                // Most likely cancelled by Close: a shutdown, not a failure of
                // the work ([E4]). Let a waiter elsewhere take over, as for fetch.
                Release(f, Tokens.AbandonEvent(f.Token), 0);
                return new MemoLockClosedException();
            }
            if (err != null)
            {
                Release(f, Tokens.FailEvent(f.Token, err.Message), 0);
                Relay(f, token => Tokens.FailEvent(token, err.Message));
            }
            return err;
        }

        /// <summary>
        /// Tells the waiters of the holder that f took the lock over from (if
        /// it did) what became of f's work: the event that evt makes for a
        /// token, under that holder's token too. A holder that died leaves its
        /// waiters looking again one by one as their (spread) timers fire;
        /// without this each would take the lock in turn after the one before
        /// failed, and run a failing fetch again (PROTOCOL.md, [X5]).
        /// </summary>
        void Relay(Flight f, Func<string, byte[]> evt)
        {
            if (f.TookOverFrom == null) return;
            try { Proto.Event(f.Key, evt(f.TookOverFrom)); }
            catch (Exception) { } // as a release's: the waiters' timers still end their wait
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
            if (onWait != null) Callbacks.Run(() => onWait(f.Id, holder)); // what it throws concerns nobody waiting
        }

        // Work ended by Close must never report AbandonedException: the
        // group's flag is set before any flight is cancelled.
        internal Exception Ended() { return Closing ? (Exception)new MemoLockClosedException() : new AbandonedException(); }

        public bool Closing { get { return closing || Flights.Closed; } }

        public void Close()
        {
            var flights = Flights.Close();
            if (flights == null)
            {
                if (!Callbacks.OnThisThread) closed.WaitOne();
                return;
            }
            closing = true;
            foreach (var f in flights) f.Cancel.Cancel();
            foreach (var f in flights) Flights.Finish(f, null, new MemoLockClosedException());
            if (Callbacks.OnThisThread) { new Thread(Shutdown) { IsBackground = true }.Start(); return; }
            Shutdown();
        }

        void Shutdown()
        {
            Callbacks.WaitIdle(); // fetches see their cancellation and return
            // From here Close waits CloseWaitMs for the work under way, as in
            // Go and Python: timed from when Close began, the release after a
            // fetch slow to return was cut off by the subscriber's shutdown.
            var sw = Stopwatch.StartNew();
            lock (mu)
            {
                while (running > 0)
                {
                    int left = CloseWaitMs - (int)sw.ElapsedMilliseconds;
                    if (left <= 0) break;
                    Monitor.Wait(mu, left);
                }
            }
            Sub.Close(Math.Max(CloseWaitMs - (int)sw.ElapsedMilliseconds, 100));
            closed.Set();
        }
    }

    /// <summary>Ends a flight every caller left; nobody sees it.</summary>
    sealed class AbandonedException : Exception { public AbandonedException() : base("memolock: flight abandoned") { } }

    /// <summary>What a step of a flight decided: a value, an error, or look again; and work that can wait until the callers have it.</summary>
    struct Next
    {
        public byte[] Val;
        public Exception Err;
        public bool Again;
        public Action After;
        public static Next Value(byte[] v) { return new Next { Val = v }; }
        public static Next ValueThen(byte[] v, Action after) { return new Next { Val = v, After = after }; }
        public static Next Fail(Exception e) { return new Next { Err = e }; }
        public static readonly Next LookAgain = new Next { Again = true };
    }
}
