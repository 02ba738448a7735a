// The subscriber: ONE thread per client owns ONE pub/sub connection and
// multiplexes every waiter's channels over it, subscribed once however many
// waiters share them (reference-counted through the watch sets).
//
// Redis acknowledges SUBSCRIBE asynchronously and pub/sub is at-most-once,
// so a watch is live only once a PING sent after its SUBSCRIBE on the same
// connection has come back ("PING memolock:<n>"): it is then told to
// re-read its key. Any error on the connection, or a reply that does not
// match what we sent, in order, replaces the connection: every channel is
// subscribed again, a new marker goes out, and every watch re-reads once it
// returns. A connection silent for 3 s gets "PING memolock:probe", and is
// replaced if nothing arrives 3 s later.
//
// The thread alternates between sending what the watches need and polling
// the socket for 10 ms, so a new watch waits at most that long to go out.
using System;
using System.Collections.Generic;
using System.Diagnostics;
using System.Threading;

namespace MemoLockNet
{
    /// <summary>One waiter's interest in a value channel and an events channel.</summary>
    sealed class Watch
    {
        public readonly byte[][] Channels;
        public readonly AutoResetEvent Signal = new AutoResetEvent(false);
        /// <summary>Called by the subscriber thread with each message on Channels[0]: the fast path for values.</summary>
        public readonly Action<byte[]> OnValue;

        // Guarded by the subscriber's lock.
        public ulong Seq;
        public bool Live, Reread, Closed, Gone;
        public List<KeyValuePair<string, byte[]>> Messages = new List<KeyValuePair<string, byte[]>>();
        public string Err;

        public Watch(Action<byte[]> onValue, byte[][] channels) { OnValue = onValue; Channels = channels; }
    }

    /// <summary>What a watch collected since it last looked.</summary>
    struct WatchEvents
    {
        public bool Reread, Closed;
        public List<KeyValuePair<string, byte[]>> Messages;
        public string Err;
    }

    sealed class Subscriber
    {
        const string MarkerPrefix = "memolock:";
        /// <summary>Silence before a probe PING, and then before giving the connection up.</summary>
        public int HealthMs = 3000;
        const int PollMs = 10;

        readonly IRedisTransport rdb;
        readonly object mu = new object();
        readonly AutoResetEvent kick = new AutoResetEvent(false);
        Thread thread;
        bool closed;

        // Guarded by mu.
        readonly HashSet<Watch> all = new HashSet<Watch>();
        readonly Dictionary<string, HashSet<Watch>> watches = new Dictionary<string, HashSet<Watch>>(); // channel (Latin1): its watches
        readonly HashSet<string> dirty = new HashSet<string>();
        readonly HashSet<string> sent = new HashSet<string>();    // subscribed on the current connection
        readonly List<Watch> unmarked = new List<Watch>();
        readonly List<KeyValuePair<Watch, ulong>> marked = new List<KeyValuePair<Watch, ulong>>();
        readonly List<SentCmd> acks = new List<SentCmd>();       // replies owed, in order
        bool broken;
        ulong nextSeq = 1, pongSeq;

        /// <summary>Connections replaced so far (for tests).</summary>
        public int Reconnects;

        sealed class SentCmd { public string Kind; public string[] Args; public int Acked; }

        public Subscriber(IRedisTransport rdb) { this.rdb = rdb; }

        /// <summary>Subscribes channels for a new watch, which is told to re-read once live.</summary>
        public Watch Add(Action<byte[]> onValue, params byte[][] channels)
        {
            var w = new Watch(onValue, channels);
            lock (mu)
            {
                if (closed) { w.Closed = true; w.Signal.Set(); return w; }
                if (thread == null)
                {
                    // Connect only once somebody waits.
                    thread = new Thread(Run) { IsBackground = true, Name = "memolock-subscriber" };
                    thread.Start();
                }
                all.Add(w);
                foreach (var chb in channels)
                {
                    string ch = Bytes.Latin1(chb);
                    HashSet<Watch> ws;
                    if (!watches.TryGetValue(ch, out ws)) watches[ch] = ws = new HashSet<Watch>();
                    if (!sent.Contains(ch)) dirty.Add(ch);
                    ws.Add(w);
                }
                unmarked.Add(w);
            }
            kick.Set();
            return w;
        }

        /// <summary>Drops w; channels nobody watches any more are unsubscribed.</summary>
        public void Remove(Watch w)
        {
            lock (mu)
            {
                if (w.Gone || w.Closed) return;
                w.Gone = true;
                all.Remove(w);
                foreach (var chb in w.Channels)
                {
                    string ch = Bytes.Latin1(chb);
                    HashSet<Watch> ws;
                    if (!watches.TryGetValue(ch, out ws)) continue;
                    ws.Remove(w);
                    if (ws.Count == 0) { watches.Remove(ch); dirty.Add(ch); }
                }
            }
            kick.Set();
        }

        /// <summary>Returns and clears what w collected.</summary>
        public WatchEvents Take(Watch w)
        {
            lock (mu)
            {
                var ev = new WatchEvents { Reread = w.Reread, Messages = w.Messages, Err = w.Err, Closed = w.Closed };
                w.Reread = false;
                w.Messages = new List<KeyValuePair<string, byte[]>>();
                return ev;
            }
        }

        /// <summary>Breaks the current connection as if it had failed (for tests).</summary>
        public void Break() { lock (mu) broken = true; kick.Set(); }

        void Run()
        {
            IPubSubConnection conn = null;
            int backoff = 0;
            var silence = Stopwatch.StartNew(); // since something last arrived
            bool probing = false;
            try
            {
                while (true)
                {
                    bool replace;
                    lock (mu)
                    {
                        if (closed) return;
                        replace = broken;
                    }
                    if (replace || conn == null)
                    {
                        if (conn != null) { conn.Dispose(); conn = null; Interlocked.Increment(ref Reconnects); }
                        if (replace)
                        {
                            if (backoff > 0 && kickOrClose(backoff)) return;
                            backoff = Math.Min(Math.Max(2 * backoff, 5), 1000);
                        }
                        Reset();
                        try { conn = rdb.OpenPubSub(); }
                        catch (Exception) { lock (mu) broken = true; if (backoff == 0) backoff = 5; continue; }
                        silence.Restart();
                        probing = false;
                    }
                    try
                    {
                        Send(conn, silence, ref probing);
                        PubSubPush p = conn.Receive(PollMs);
                        while (p != null)
                        {
                            silence.Restart();
                            probing = false;
                            if (!Deliver(p)) throw new RedisConnectionException("pub/sub reply out of order", null);
                            if (Deliver_heard) { backoff = 0; Deliver_heard = false; }
                            p = conn.Receive(0);
                        }
                        if (probing && silence.ElapsedMilliseconds > 2 * HealthMs)
                            throw new RedisConnectionException("pub/sub connection silent", null);
                    }
                    catch (Exception)
                    {
                        lock (mu) broken = true;
                    }
                }
            }
            finally
            {
                if (conn != null) conn.Dispose();
            }
        }

        bool Deliver_heard; // a marker came back: the connection works (reset the backoff)

        bool kickOrClose(int ms)
        {
            kick.WaitOne(ms);
            lock (mu) return closed;
        }

        /// <summary>Starts again on a new connection: every channel again, every watch waits for a new marker.</summary>
        void Reset()
        {
            lock (mu)
            {
                broken = false;
                sent.Clear();
                acks.Clear();
                marked.Clear();
                unmarked.Clear();
                pongSeq = 0;
                foreach (var ch in watches.Keys) dirty.Add(ch);
                foreach (var w in all) { w.Live = false; w.Seq = 0; unmarked.Add(w); }
            }
        }

        /// <summary>Sends whatever the watches need: SUBSCRIBE, a marker PING, UNSUBSCRIBE, a probe.</summary>
        void Send(IPubSubConnection conn, Stopwatch silence, ref bool probing)
        {
            var subs = new List<string>();
            var unsubs = new List<string>();
            ulong marker = 0;
            bool probe = false;
            lock (mu)
            {
                foreach (var ch in dirty)
                {
                    bool want = watches.ContainsKey(ch), have = sent.Contains(ch);
                    if (want && !have) { subs.Add(ch); sent.Add(ch); }
                    else if (!want && have) { unsubs.Add(ch); sent.Remove(ch); }
                }
                dirty.Clear();
                if (subs.Count > 0) acks.Add(new SentCmd { Kind = "subscribe", Args = subs.ToArray() });
                foreach (var w in unmarked)
                {
                    if (w.Gone) continue;
                    if (marker == 0) marker = nextSeq++;
                    w.Seq = marker;
                    marked.Add(new KeyValuePair<Watch, ulong>(w, marker));
                }
                unmarked.Clear();
                if (marker != 0) acks.Add(new SentCmd { Kind = "pong", Args = new[] { MarkerPrefix + marker } });
                if (unsubs.Count > 0) acks.Add(new SentCmd { Kind = "unsubscribe", Args = unsubs.ToArray() });
                if (!probing && silence.ElapsedMilliseconds > HealthMs)
                {
                    probe = probing = true;
                    acks.Add(new SentCmd { Kind = "pong", Args = new[] { MarkerPrefix + "probe" } });
                }
            }
            if (subs.Count > 0) conn.Subscribe(subs.ConvertAll(Bytes.FromLatin1).ToArray());
            if (marker != 0) conn.Ping(Bytes.Utf8.GetBytes(MarkerPrefix + marker));
            if (unsubs.Count > 0) conn.Unsubscribe(unsubs.ConvertAll(Bytes.FromLatin1).ToArray());
            if (probe) conn.Ping(Bytes.Utf8.GetBytes(MarkerPrefix + "probe"));
        }

        /// <summary>Hands p to the watches; false if p shows the connection is not the one we think.</summary>
        bool Deliver(PubSubPush p)
        {
            var poke = new List<Watch>();
            var onValue = new List<Action<byte[]>>();
            lock (mu)
            {
                if (closed) return true;
                switch (p.Kind)
                {
                    case "message":
                        {
                            string ch = Bytes.Latin1(p.Channel);
                            HashSet<Watch> ws;
                            if (!watches.TryGetValue(ch, out ws)) break;
                            foreach (var w in ws)
                            {
                                w.Messages.Add(new KeyValuePair<string, byte[]>(ch, p.Payload));
                                poke.Add(w);
                                if (w.OnValue != null && Bytes.Equal(p.Channel, w.Channels[0])) onValue.Add(w.OnValue);
                            }
                            break;
                        }
                    case "pong":
                        {
                            string arg = Bytes.Latin1(p.Payload);
                            if (!Due("pong", arg)) return false;
                            MarkerBack(arg, poke);
                            break;
                        }
                    case "subscribe":
                    case "unsubscribe":
                        if (!Due(p.Kind, p.Channel == null ? "" : Bytes.Latin1(p.Channel))) return false;
                        break;
                    case "error":
                        if (!Refused(p.Error, poke)) return false;
                        break;
                }
            }
            foreach (var f in onValue) f(p.Payload);
            foreach (var w in poke) w.Signal.Set();
            return true;
        }

        // Under mu: checks a reply against the oldest command owed one.
        bool Due(string kind, string arg)
        {
            if (acks.Count == 0) return false;
            var cmd = acks[0];
            if (cmd.Kind != kind || cmd.Args[cmd.Acked] != arg) return false;
            if (++cmd.Acked == cmd.Args.Length) acks.RemoveAt(0);
            return true;
        }

        // Under mu: marks live the watches that marker payload covers.
        void MarkerBack(string payload, List<Watch> poke)
        {
            if (!payload.StartsWith(MarkerPrefix, StringComparison.Ordinal)) return;
            ulong seq;
            if (!ulong.TryParse(payload.Substring(MarkerPrefix.Length), out seq) || seq <= pongSeq) return;
            pongSeq = seq;
            Deliver_heard = true;
            int n = 0;
            foreach (var m in marked)
            {
                if (m.Value > seq) break;
                n++;
                var w = m.Key;
                if (w.Seq == m.Value && !w.Gone && !w.Closed) { w.Live = true; w.Reread = true; poke.Add(w); }
            }
            marked.RemoveRange(0, n);
        }

        // Under mu: an error reply answers the oldest command owed a reply. A
        // refused PING still marks its watches live; a refused SUBSCRIBE ends
        // the waits of its channels with the error (unlike Go, channels
        // refused together are not retried one by one).
        bool Refused(string err, List<Watch> poke)
        {
            if (acks.Count == 0 || acks[0].Acked != 0) return false;
            var cmd = acks[0];
            acks.RemoveAt(0);
            if (cmd.Kind == "pong") MarkerBack(cmd.Args[0], poke);
            else if (cmd.Kind == "subscribe")
            {
                foreach (var ch in cmd.Args)
                {
                    sent.Remove(ch);
                    HashSet<Watch> ws;
                    if (!watches.TryGetValue(ch, out ws)) continue;
                    foreach (var w in ws) if (w.Err == null) { w.Err = err; poke.Add(w); }
                }
            }
            return true;
        }

        /// <summary>Stops the thread, closes the connection and wakes every watch; waits up to ms.</summary>
        public void Close(int ms)
        {
            Thread t;
            lock (mu)
            {
                if (closed) return;
                closed = true;
                foreach (var w in all) { w.Closed = true; w.Signal.Set(); }
                t = thread;
            }
            kick.Set();
            if (t != null) t.Join(ms);
        }
    }
}
