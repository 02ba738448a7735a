// A wait is a flight's wait for a lock somebody else holds (or, in
// external-producer mode, that the flight holds while another program
// works). It owns the flight's watch, its timer and what it knows of the
// holder; every lookup reply replaces holder and timer.
using System;
using System.Diagnostics;
using System.Threading;

namespace MemoLockNet
{
    sealed class Wait
    {
        readonly FlightEngine c;
        readonly Flight f;
        Watch w;                 // the value and events channels; null until the first wait
        readonly Stopwatch clock = Stopwatch.StartNew();
        long deadlineMs;         // when the holder's lock would expire, on clock
        string holder;           // token of the holder waited for
        bool waited;
        bool liveAtLookup;       // the watch was live when the latest lookup went out
        volatile bool own;       // the lock is the flight's own (external mode)
        bool started;            // external mode: start was called, and its producer may answer late
        string lateKind, lateText; // external mode: that producer's fail or notfound, kept ([E1a]; KeepLate)
        byte[] lateMsg;          // its message as received, for publishing it again (ActOnLate)

        /// <summary>A lookup failed after it may have taken the lock: End releases it.</summary>
        public bool MaybeLocked;

        public Wait(FlightEngine c, Flight f) { this.c = c; this.f = f; }

        public bool Own { get { return own; } set { own = value; } }

        /// <summary>External mode: the flight is about to call its start function.</summary>
        public void Started() { started = true; }

        /// <summary>Waits on busy reply r until the value, an error, or a reason to look again.</summary>
        public Next WaitFor(AcquireReply r)
        {
            Busy(r);
            var handles = new WaitHandle[] { w.Signal, f.Done, f.Cancel.Token.WaitHandle };
            while (true)
            {
                long left = deadlineMs - clock.ElapsedMilliseconds;
                if (left <= 0) return Next.LookAgain; // the lock expired: take over if the holder died
                int i = WaitHandle.WaitAny(handles, (int)Math.Min(left, int.MaxValue));
                if (i == WaitHandle.WaitTimeout) return Next.LookAgain;
                if (i == 0)
                {
                    Next n;
                    if (OnEvents(c.Sub.Take(w), out n)) return n;
                }
                else if (i == 1) return f.Err != null ? Next.Fail(f.Err) : Value(f.Val); // a lock of ours lingers, as on any value
                else return Next.Fail(c.Ended());
            }
        }

        void Busy(AcquireReply r)
        {
            own = r.Holder == f.Token;
            if (r.Holder != holder)
            {
                holder = r.Holder;
                if (!own) c.NotifyWait(f, holder);
            }
            waited = true;
            if (w == null) w = c.Sub.Add(OnValue, c.Keys.Notif(f.Key), c.Keys.Events(f.Key));
            // A lock without expiry: look again after our lock TTL. A renewing
            // holder resets its PTTL every lock TTL/3, so waiters that all
            // looked at pttl + 1 ms would land on its renewal moments, and on
            // the millisecond a failing fetch releases the lock: spread them.
            long d = r.Pttl < 0 ? c.LockTtlMs : r.Pttl + 1 + Spread(r.Pttl);
            deadlineMs = clock.ElapsedMilliseconds + d;
        }

        static readonly Random spread = new Random(BitConverter.ToInt32(Guid.NewGuid().ToByteArray(), 0));

        /// <summary>A uniformly random extra delay in [0, min(pttl/10, 1 s)] ms (none when the engine's SpreadTimers is off).</summary>
        long Spread(long pttl)
        {
            if (!c.SpreadTimers) return 0;
            long max = Math.Min(pttl / 10, 1000);
            lock (spread) return (long)(spread.NextDouble() * (max + 1));
        }

        /// <summary>Called before each lookup of the flight: whether the watch is live then decides what a takeover must check.</summary>
        public void BeforeLookup() { liveAtLookup = w != null && c.Sub.IsLive(w); }

        /// <summary>
        /// The takeover rule (PROTOCOL.md). The latest lookup took the lock
        /// after the flight waited on holder H with a live subscription: H may
        /// have failed in the very millisecond it released the lock, its
        /// event still on its way. Before computing, a marker round trip on
        /// the pub/sub connection brings in everything published before the
        /// lookup. H's fail or notfound event, or a value, ends the flight
        /// without computing (n), and the lock just taken is released with
        /// the same news under our token, for waiters that already saw us as
        /// the holder. Otherwise (an abandon, nothing, a broken connection, or
        /// no answer within lockTTL/3) it is a genuine takeover: false.
        /// External mode, [X4]: the holder may be the flight itself, whose own
        /// lock expired while its producer worked. The same round trip then
        /// brings in that producer's late news under our token: a value ends
        /// the flight as [E2] says. Its fail or notfound, like one heard here
        /// while the holder is another, is kept (KeepLate) and acted on by
        /// the caller (ActOnLate) if nothing here decided: the holder waited
        /// on decides first, H's word or, at a re-take of our own lock, a
        /// value, wherever it comes in the check ([E1a]).
        /// </summary>
        public bool HolderEndedFirst(out Next n)
        {
            n = default(Next);
            if (!waited || holder == null || !liveAtLookup) return false;
            bool self = holder == f.Token;
            if (!c.Sub.RoundTrip(w)) return false;
            var handles = new WaitHandle[] { w.Signal, f.Cancel.Token.WaitHandle };
            var sw = Stopwatch.StartNew();
            long bound = Math.Max(c.LockTtlMs / 3, 1);
            string notif = Bytes.Latin1(c.Keys.Notif(f.Key));
            while (true)
            {
                var ev = c.Sub.Take(w);
                foreach (var m in ev.Messages)
                {
                    if (m.Key == notif)
                    {
                        // Our own producer's value: the lock goes with its linger ([E2]).
                        if (self) { n = Value(m.Value); return true; }
                        // A holder that published without storing: the value is the value.
                        c.Release(f, Tokens.AbandonEvent(f.Token), 0);
                        n = Next.Value(m.Value);
                        return true;
                    }
                    string kind, token, text;
                    Tokens.ParseEvent(m.Value, out kind, out token, out text);
                    // Our earlier producer's late word (and, self, abandon,
                    // stale, unknown kinds: start again) decides nothing here.
                    if (self || token != holder) { KeepLate(m.Value, kind, token, text); continue; }
                    if (kind == Tokens.EventFail)
                    {
                        c.Release(f, Tokens.FailEvent(f.Token, Tokens.EventMessage(m.Value)), 0);
                        n = Next.Fail(new HolderFailedException(text));
                        return true;
                    }
                    if (kind == Tokens.EventNotFound)
                    {
                        c.Release(f, Tokens.Event(Tokens.EventNotFound, f.Token), 0);
                        n = Next.Fail(FlightEngine.NotFoundFor(f));
                        return true;
                    }
                }
                if (ev.Closed || f.Cancel.IsCancellationRequested)
                {
                    c.Release(f, Tokens.AbandonEvent(f.Token), 0);
                    n = Next.Fail(c.Ended());
                    return true;
                }
                // The marker is back (on this connection or, after a break,
                // a new one), or the channel was refused: compute.
                if (ev.Reread || ev.Err != null) return false;
                long left = bound - sw.ElapsedMilliseconds;
                if (left <= 0) return false;
                WaitHandle.WaitAny(handles, (int)left);
            }
        }

        /// <summary>
        /// External mode, [E1]: the flight holds its lock and is about to call
        /// its start function. A producer may publish its value or its
        /// failure the moment it is started, and what is published before a
        /// subscription takes effect is lost, so the flight first subscribes
        /// (the lock is its own from here) and waits until that subscription
        /// is live; a watch live already (a takeover after a wait, a restart
        /// after the lock expired) needs no wait. A value on the channel
        /// meanwhile is the answer (the lock goes with its linger, [E2]); a
        /// refused subscription, Close, or every caller leaving end the
        /// flight: true, with n, and start is not called (End releases the
        /// lock with an abandon event). Bounded by lock TTL/3: past it, false,
        /// start runs anyway, and the wait looks again once live ([W11]).
        /// A flight that took its lock again also acts on a fail or notfound
        /// under its own token taken here (its earlier producer's, late,
        /// [E1a]): true, start is not called again (ActOnLate; the caller has
        /// acted on one kept earlier). A watch live already is read once:
        /// what it has delivered is acted on before start is called again.
        /// What arrives once live is left for the wait after start.
        /// </summary>
        public bool EndedBeforeStart(out Next n)
        {
            own = true;
            n = default(Next);
            if (w == null) w = c.Sub.Add(OnValue, c.Keys.Notif(f.Key), c.Keys.Events(f.Key));
            var handles = new WaitHandle[] { w.Signal, f.Cancel.Token.WaitHandle };
            var sw = Stopwatch.StartNew();
            long bound = Math.Max(c.LockTtlMs / 3, 1);
            string notif = Bytes.Latin1(c.Keys.Notif(f.Key));
            while (true)
            {
                // Liveness read before Take: if live, this Take holds all
                // that arrived before the watch became live, and a value
                // among it means start must not run.
                bool live = c.Sub.IsLive(w);
                var ev = c.Sub.Take(w);
                foreach (var m in ev.Messages)
                {
                    if (m.Key == notif) { n = Value(m.Value); return true; }
                    // A flight that took its own expired lock again hears its
                    // earlier producer's late fail or notfound here too, if
                    // the takeover check did not (not live at the lookup, or
                    // it came after the marker): start must not run again.
                    string kind, token, text;
                    Tokens.ParseEvent(m.Value, out kind, out token, out text);
                    KeepLate(m.Value, kind, token, text);
                    if (ActOnLate(out n)) return true;
                }
                // Other events before start concern earlier holders only (the
                // takeover check had those of the holder waited on).
                if (ev.Closed) { n = Next.Fail(new MemoLockClosedException()); return true; }
                if (ev.Err != null)
                {
                    n = Next.Fail(new RedisException("memolock: redis: subscribing to \"" + notif + "\": " + ev.Err));
                    return true;
                }
                if (f.Cancel.IsCancellationRequested) { n = Next.Fail(c.Ended()); return true; }
                // Live: the marker's re-read is not needed, the lock is ours
                // and nothing was published for it that we did not get.
                if (live || ev.Reread) return false;
                long left = bound - sw.ElapsedMilliseconds;
                if (left <= 0) return false;
                WaitHandle.WaitAny(handles, (int)Math.Min(left, int.MaxValue));
            }
        }

        /// <summary>
        /// External mode, [E1a]: keeps the first fail or notfound under the
        /// flight's own token once start was called: its producer's word
        /// (payload, parsed as kind, token and text), which the flight does
        /// not act on where it reads it. Called for every event the flight
        /// reads, whatever the holder and wherever it comes in a read: a
        /// look-again earlier in the same read, another holder waited on
        /// ([W6]) or a takeover check that something else decides must not
        /// lose it. A value that comes meanwhile still ends the wait.
        /// </summary>
        void KeepLate(byte[] payload, string kind, string token, string text)
        {
            if (!started || lateKind != null || token != f.Token) return;
            if (kind != Tokens.EventFail && kind != Tokens.EventNotFound) return;
            lateKind = kind;
            lateText = text;
            lateMsg = Tokens.EventMessage(payload);
        }

        /// <summary>
        /// External mode, [E1a]: the lock is the flight's (taken again, or
        /// found still its own) and start is not called again. A kept word
        /// (KeepLate) ends the flight: true, with n, the failure with its
        /// message or "not found". Whether or not any caller is left (this
        /// comes before [E4]'s abandon), the lock goes with no linger,
        /// publishing the word again under our token, for the waiters that
        /// found the lock under it since the producer published it; after a
        /// takeover from another holder H, under H's token too ([X5]'s
        /// relay). Nothing kept: false.
        /// </summary>
        public bool ActOnLate(out Next n)
        {
            n = default(Next);
            if (lateKind == null) return false;
            Func<string, byte[]> word;
            if (lateKind == Tokens.EventFail)
            {
                byte[] msg = lateMsg;
                word = t => Tokens.FailEvent(t, msg);
                n = Next.Fail(new HolderFailedException(lateText));
            }
            else
            {
                word = t => Tokens.Event(Tokens.EventNotFound, t);
                n = Next.Fail(FlightEngine.NotFoundFor(f));
            }
            Release(word(f.Token));
            // The other holder last waited on (whose lock the flight just
            // took, Takeover having run or not); once a lookup found the
            // lock still ours, holder is our own token, and H is the one
            // the flight took over from (TookOverFrom).
            string h = waited && holder != null && holder != f.Token ? holder : f.TookOverFrom;
            if (h != null)
                try { c.Proto.Event(f.Key, word(h)); }
                catch (Exception) { } // as a release's: their timers still end their wait
            return true;
        }

        // On the subscriber thread: hands a published value to the callers at
        // once. With a lock of our own the flight releases it first.
        void OnValue(byte[] payload)
        {
            if (!own) c.Flights.Finish(f, payload, null);
        }

        bool OnEvents(WatchEvents ev, out Next n)
        {
            n = default(Next);
            if (ev.Closed) { n = Next.Fail(new MemoLockClosedException()); return true; }
            if (ev.Err != null)
            {
                n = Next.Fail(new RedisException("memolock: redis: subscribing to \"" + Bytes.Latin1(c.Keys.Notif(f.Key)) + "\": " + ev.Err));
                return true;
            }
            string notif = Bytes.Latin1(c.Keys.Notif(f.Key));
            // Our producer's word is kept first, from the whole read and
            // whatever the holder ([E1a]): waiting on another holder, we
            // ignore it for now, and a look-again below drops the rest.
            foreach (var m in ev.Messages)
            {
                if (m.Key == notif) continue;
                string kind, token, text;
                Tokens.ParseEvent(m.Value, out kind, out token, out text);
                KeepLate(m.Value, kind, token, text);
            }
            foreach (var m in ev.Messages)
            {
                if (m.Key == notif) { n = Value(m.Value); return true; }
                string kind, token, text;
                Tokens.ParseEvent(m.Value, out kind, out token, out text);
                if (token != holder) continue; // about an earlier holder (or, KeepLate, our earlier producer)
                if (kind == Tokens.EventFail)
                {
                    if (own) Release(new byte[0]); // our external producer failed: the lock must go
                    n = Next.Fail(new HolderFailedException(text));
                    return true;
                }
                if (kind == Tokens.EventNotFound)
                {
                    if (own) Release(new byte[0]); // as for fail, [E3]: no event, no linger
                    n = Next.Fail(FlightEngine.NotFoundFor(f));
                    return true;
                }
                // abandon, stale (the holder put a stale value back), or a
                // kind this version does not know: look again.
                n = Next.LookAgain;
                return true;
            }
            if (ev.Reread) { n = Next.LookAgain; return true; } // live now: whatever came before is lost
            return false;
        }

        /// <summary>Ends the wait with a value looked up or received.</summary>
        public Next Value(byte[] v)
        {
            if (own)
            {
                own = false;
                c.Release(f, new byte[0], Scripts.LingerMs); // external mode: done, keep the lock 1 s as store does
            }
            return Next.Value(v);
        }

        /// <summary>
        /// [L4]: a lookup found a cached "not found". A lock of the flight's
        /// own (external mode) goes first, with an abandon event and no
        /// linger: nothing of ours was stored for it to guard (a value's
        /// linger, as Value gives, would keep it as done:&lt;token&gt; for up to
        /// a second over a value stored elsewhere meanwhile, and publish
        /// nothing).
        /// </summary>
        public void NotFound()
        {
            if (own) Release(Tokens.AbandonEvent(f.Token));
        }

        /// <summary>Counts a takeover, and notes whom from for [X5]'s relay; a re-take of the flight's own lock is none ([E1a]).</summary>
        public void Takeover()
        {
            if (!waited || holder == null || holder == f.Token) return;
            Interlocked.Increment(ref c.Takeovers);
            f.TookOverFrom = holder;
        }

        void Release(byte[] evt)
        {
            own = false;
            c.Release(f, evt, 0);
        }

        /// <summary>Stops the wait; a lock the flight may hold goes with an abandon event. Idempotent.</summary>
        public void End()
        {
            if (w != null) { c.Sub.Remove(w); w = null; }
            if (own || MaybeLocked)
            {
                MaybeLocked = false;
                Release(Tokens.AbandonEvent(f.Token));
            }
        }
    }
}
