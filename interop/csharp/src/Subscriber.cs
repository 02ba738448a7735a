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
// Two threads share the work, as Go's run and read goroutines do: the
// writer sends what the watches need as soon as it is kicked, and a reader
// per connection blocks on the socket (no polling: an idle client costs no
// CPU and a reply is handled as soon as it arrives). Both check the
// connection's generation, so that a reader of a replaced connection
// changes nothing.
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
        const int MaxBackoffMs = 1000;

        readonly IRedisTransport rdb;
        readonly object mu = new object();
        readonly AutoResetEvent kick = new AutoResetEvent(false);
        readonly ManualResetEvent stop = new ManualResetEvent(false);
        Thread thread;
        readonly List<Thread> readers = new List<Thread>();

        // Guarded by mu.
        bool closed;
        readonly HashSet<Watch> all = new HashSet<Watch>();
        readonly Dictionary<string, HashSet<Watch>> watches = new Dictionary<string, HashSet<Watch>>(); // channel (Latin1): its watches
        readonly HashSet<string> dirty = new HashSet<string>();
        readonly HashSet<string> sent = new HashSet<string>();    // subscribed on the current connection
        readonly HashSet<string> solo = new HashSet<string>();    // subscribe one per command: a SUBSCRIBE of several was refused
        readonly List<Watch> unmarked = new List<Watch>();
        readonly List<KeyValuePair<Watch, ulong>> marked = new List<KeyValuePair<Watch, ulong>>();
        readonly List<SentCmd> acks = new List<SentCmd>();       // replies owed, in order
        bool broken, probe, heard;
        ulong gen, nextSeq = 1, pongSeq;

        /// <summary>Connections replaced so far (for tests).</summary>
        public int Reconnects;

        sealed class SentCmd { public string Kind; public string[] Args; public int Acked; }

        /// <summary>What the writer sends next.</summary>
        sealed class Plan
        {
            public ulong Gen;
            public bool Replace, Heard, Probe;
            public List<string[]> Subs = new List<string[]>();
            public ulong Marker;
            public List<string> Unsubs = new List<string>();
            public bool Empty { get { return Subs.Count == 0 && Marker == 0 && Unsubs.Count == 0 && !Probe; } }
        }

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
                    if (ws.Count == 0) { watches.Remove(ch); solo.Remove(ch); dirty.Add(ch); }
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

        /// <summary>Whether w's channels are subscribed on the current connection and its marker has come back.</summary>
        public bool IsLive(Watch w) { lock (mu) return w.Live && !w.Gone && !w.Closed; }

        /// <summary>
        /// Sends a new marker for w, keeping its subscription: once it comes
        /// back (w.Reread, as for liveness), everything published before the
        /// request has reached w. A connection replaced meanwhile also ends
        /// in w.Reread, once its own marker is back. False if w is gone.
        /// </summary>
        public bool RoundTrip(Watch w)
        {
            lock (mu)
            {
                if (closed || w.Gone || w.Closed) return false;
                w.Reread = false;
                if (w.Seq != 0 || w.Live) { w.Seq = 0; unmarked.Add(w); } // else a marker for it is due already
            }
            kick.Set();
            return true;
        }

        /// <summary>Breaks the current connection as if it had failed (for tests).</summary>
        public void Break() { lock (mu) broken = true; kick.Set(); }

        /// <summary>Live reader threads (for tests).</summary>
        public int Readers { get { lock (readers) { readers.RemoveAll(t => !t.IsAlive); return readers.Count; } } }

        // The writer: sends what the watches need, and replaces the connection when it fails.
        void Run()
        {
            IPubSubConnection conn = null;
            bool reading = false;
            int backoff = 0;
            try
            {
                while (true)
                {
                    kick.WaitOne();
                    while (true)
                    {
                        Plan p = MakePlan();
                        if (p == null) return; // closed
                        if (p.Heard) backoff = 0;
                        if (p.Replace)
                        {
                            if (conn != null) { conn.Dispose(); conn = null; reading = false; }
                            Interlocked.Increment(ref Reconnects);
                            int d = backoff;
                            backoff = Math.Min(Math.Max(2 * backoff, 5), MaxBackoffMs);
                            if (d > 0 && stop.WaitOne(d)) return;
                        }
                        if (p.Empty) break;
                        try
                        {
                            if (conn == null) conn = rdb.OpenPubSub();
                            Send(conn, p);
                        }
                        catch (Exception) { Fail(p.Gen); continue; }
                        if (!reading)
                        {
                            reading = true;
                            var c = conn;
                            ulong g = p.Gen;
                            var t = new Thread(() => Read(c, g)) { IsBackground = true, Name = "memolock-subscriber-read" };
                            lock (readers) { readers.RemoveAll(x => !x.IsAlive); readers.Add(t); }
                            t.Start();
                        }
                    }
                }
            }
            finally
            {
                if (conn != null) conn.Dispose(); // ends its reader
            }
        }

        /// <summary>Decides, under mu, what the writer sends next, and records it as sent; null once closed.</summary>
        Plan MakePlan()
        {
            lock (mu)
            {
                if (closed) return null;
                var p = new Plan();
                if (broken)
                {
                    // Start again on a new connection: every channel again,
                    // every watch waits for a new marker.
                    broken = probe = false;
                    gen++;
                    p.Replace = true;
                    sent.Clear();
                    acks.Clear();
                    marked.Clear();
                    unmarked.Clear();
                    pongSeq = 0;
                    foreach (var ch in watches.Keys) dirty.Add(ch);
                    foreach (var w in all) { w.Live = false; w.Seq = 0; unmarked.Add(w); }
                }
                p.Gen = gen;
                p.Heard = heard;
                heard = false;
                var batch = new List<string>();
                foreach (var ch in dirty)
                {
                    bool want = watches.ContainsKey(ch), have = sent.Contains(ch);
                    if (want && !have && solo.Contains(ch)) { p.Subs.Add(new[] { ch }); sent.Add(ch); }
                    else if (want && !have) { batch.Add(ch); sent.Add(ch); }
                    else if (!want && have) { p.Unsubs.Add(ch); sent.Remove(ch); }
                }
                dirty.Clear();
                if (batch.Count > 0) p.Subs.Insert(0, batch.ToArray());
                foreach (var chans in p.Subs) acks.Add(new SentCmd { Kind = "subscribe", Args = chans });
                foreach (var w in unmarked)
                {
                    if (w.Gone) continue;
                    if (p.Marker == 0) p.Marker = nextSeq++;
                    w.Seq = p.Marker;
                    marked.Add(new KeyValuePair<Watch, ulong>(w, p.Marker));
                }
                unmarked.Clear();
                if (p.Marker != 0) acks.Add(new SentCmd { Kind = "pong", Args = new[] { MarkerPrefix + p.Marker } });
                if (p.Unsubs.Count > 0) acks.Add(new SentCmd { Kind = "unsubscribe", Args = p.Unsubs.ToArray() });
                p.Probe = probe;
                probe = false;
                if (p.Probe) acks.Add(new SentCmd { Kind = "pong", Args = new[] { MarkerPrefix + "probe" } });
                return p;
            }
        }

        /// <summary>Writes p on conn. Any error means the connection is no longer the one our state describes.</summary>
        static void Send(IPubSubConnection conn, Plan p)
        {
            foreach (var chans in p.Subs) conn.Subscribe(Array.ConvertAll(chans, Bytes.FromLatin1));
            if (p.Marker != 0) conn.Ping(Bytes.Utf8.GetBytes(MarkerPrefix + p.Marker));
            if (p.Unsubs.Count > 0) conn.Unsubscribe(p.Unsubs.ConvertAll(Bytes.FromLatin1).ToArray());
            if (p.Probe) conn.Ping(Bytes.Utf8.GetBytes(MarkerPrefix + "probe"));
        }

        /// <summary>Marks connection g broken, if it is still the current one.</summary>
        void Fail(ulong g)
        {
            lock (mu) if (g == gen) broken = true;
            kick.Set();
        }

        // A reader: blocks on connection g until it fails or is replaced.
        void Read(IPubSubConnection conn, ulong g)
        {
            bool probing = false; // a probe is out and nothing has arrived since
            try
            {
                while (true)
                {
                    PubSubPush p = conn.Receive(HealthMs);
                    if (p == null)
                    {
                        if (probing) break; // silent after a probe: replace it
                        probing = true;
                        lock (mu)
                        {
                            if (closed || g != gen) return;
                            probe = true;
                        }
                        kick.Set();
                        continue;
                    }
                    probing = false;
                    if (!Deliver(g, p)) break;
                }
            }
            catch (Exception) { }
            Fail(g);
        }

        /// <summary>Hands p to the watches; false if g is not current, or p shows the connection is not the one we think.</summary>
        bool Deliver(ulong g, PubSubPush p)
        {
            var poke = new List<Watch>();
            var onValue = new List<Action<byte[]>>();
            bool wake = false;
            lock (mu)
            {
                if (closed || g != gen) return false;
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
                        wake = true;
                        break;
                }
            }
            // The value's callers first: waking the waits' own threads can wait.
            foreach (var f in onValue) f(p.Payload);
            foreach (var w in poke) w.Signal.Set();
            if (wake) kick.Set();
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
            if (!ulong.TryParse(payload.Substring(MarkerPrefix.Length), System.Globalization.NumberStyles.None,
                    System.Globalization.CultureInfo.InvariantCulture, out seq) || seq <= pongSeq) return;
            pongSeq = seq;
            heard = true;
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
        // refused PING still marks its watches live; a refused SUBSCRIBE of
        // several channels (an ACL may allow some and not others) has them
        // subscribed again one per command; one of a single channel ends the
        // waits of that channel with the error, keeping the connection.
        bool Refused(string err, List<Watch> poke)
        {
            if (acks.Count == 0 || acks[0].Acked != 0) return false;
            var cmd = acks[0];
            acks.RemoveAt(0);
            if (cmd.Kind == "pong") MarkerBack(cmd.Args[0], poke);
            else if (cmd.Kind == "subscribe" && cmd.Args.Length > 1)
            {
                foreach (var ch in cmd.Args)
                {
                    sent.Remove(ch);
                    HashSet<Watch> ws;
                    if (!watches.TryGetValue(ch, out ws)) continue; // nobody wants it any more
                    solo.Add(ch);
                    dirty.Add(ch);
                    // Not live until a marker sent after the retry comes back.
                    foreach (var w in ws)
                        if (w.Seq != 0 || w.Live) { w.Live = false; w.Seq = 0; unmarked.Add(w); }
                }
            }
            else if (cmd.Kind == "subscribe")
            {
                string ch = cmd.Args[0];
                sent.Remove(ch);
                HashSet<Watch> ws;
                if (watches.TryGetValue(ch, out ws))
                    foreach (var w in ws) if (w.Err == null) { w.Err = err; poke.Add(w); }
            }
            return true; // an UNSUBSCRIBE refused (Redis never does): nothing to undo, as in Go
        }

        /// <summary>Stops the threads, closes the connection and wakes every watch; waits up to ms.</summary>
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
            stop.Set();
            kick.Set();
            var sw = Stopwatch.StartNew();
            if (t != null) t.Join(ms);
            List<Thread> rs;
            lock (readers) rs = new List<Thread>(readers);
            foreach (var r in rs) r.Join(Math.Max(ms - (int)sw.ElapsedMilliseconds, 0));
        }
    }
}
