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
        readonly MemoLock c;
        readonly Flight f;
        Watch w;                 // the value and events channels; null until the first wait
        readonly Stopwatch clock = Stopwatch.StartNew();
        long deadlineMs;         // when the holder's lock would expire, on clock
        string holder;           // token of the holder waited for
        bool waited;
        volatile bool own;       // the lock is the flight's own (external mode)

        /// <summary>A lookup failed after it may have taken the lock: End releases it.</summary>
        public bool MaybeLocked;
        /// <summary>Run by End: work that can wait until the callers have their answer.</summary>
        public Action After;

        public Wait(MemoLock c, Flight f) { this.c = c; this.f = f; }

        public bool Own { get { return own; } set { own = value; } }

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
                else if (i == 1) return f.Err != null ? Next.Fail(f.Err) : Next.Value(f.Val);
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
            long d = r.Pttl < 0 ? c.LockTtlMs : r.Pttl + 1; // a lock without expiry: look again after our lock TTL
            deadlineMs = clock.ElapsedMilliseconds + d;
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
            foreach (var m in ev.Messages)
            {
                if (m.Key == notif) { n = Value(m.Value); return true; }
                string kind, token, text;
                Tokens.ParseEvent(m.Value, out kind, out token, out text);
                if (token != holder) continue; // about an earlier holder
                if (kind == Tokens.EventFail)
                {
                    if (own) Release(new byte[0]); // our external producer failed: the lock must go
                    n = Next.Fail(new HolderFailedException(text));
                    return true;
                }
                if (kind == Tokens.EventNotFound)
                {
                    Value(null); // ends the wait as a value would
                    n = Next.Fail(MemoLock.NotFoundFor(f));
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

        public void Takeover() { if (waited) Interlocked.Increment(ref c.Takeovers); }

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
            var after = After;
            After = null;
            if (after != null) after();
        }
    }
}
