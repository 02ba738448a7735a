// The takeover rule (PROTOCOL.md, issue 15 defect 1): a holder's failure
// must not be lost when a waiter's timer takes the lock in the millisecond
// the failing holder released it.
using System;
using System.Collections.Generic;
using System.Diagnostics;
using System.Linq;
using System.Reflection;
using System.Text;
using System.Threading;
using MemoLockNet;

namespace MemoLockTests
{
    static class TakeoverTests
    {
        const long LockTtlMs = 3000;
        const long FailAtMs = 5000;
        const string Message = "upstream timed out after 5s";

        /// <summary>
        /// A holder that runs the protocol's holder side on an exact
        /// schedule, as Go's renewal ticker does: it takes the lock at t0,
        /// renews it at t0 + k * lockTTL/3, and at t0 + failAt releases it
        /// with a fail event instead of renewing. A waiter that looked up
        /// between two renewals times its next lookup to a renewal moment
        /// + 1 ms, the millisecond the failure lands in.
        /// </summary>
        sealed class ScheduledHolder
        {
            readonly Protocol proto;
            readonly byte[] id;
            public readonly string Token = Tokens.New();
            public readonly Stopwatch Clock = new Stopwatch();
            public readonly ManualResetEvent Acquired = new ManualResetEvent(false);
            public Exception Err;

            public ScheduledHolder(IRedisTransport rdb, string tag, string id) { proto = new Protocol(rdb, new KeyScheme(tag)); this.id = Encoding.UTF8.GetBytes(id); }

            public void Run()
            {
                try
                {
                    var r = proto.Acquire(id, Token, LockTtlMs);
                    Clock.Start();
                    if (r.Kind != ReplyKind.Locked) throw new Exception("the scheduled holder did not get the lock: " + r.Kind);
                    Acquired.Set();
                    for (long at = LockTtlMs / 3; at < FailAtMs; at += LockTtlMs / 3)
                    {
                        SleepUntil(Clock, at);
                        if (!proto.Renew(id, Token, LockTtlMs)) throw new Exception("the scheduled holder lost its lock at " + at + " ms");
                    }
                    SleepUntil(Clock, FailAtMs);
                    proto.Release(id, Token, Tokens.FailEvent(Token, Message), 0);
                }
                catch (Exception e) { Err = e; Acquired.Set(); }
            }
        }

        /// <summary>Sleeps until clock reads ms, to the millisecond: the last few are spun.</summary>
        static void SleepUntil(Stopwatch clock, double ms)
        {
            while (true)
            {
                double left = ms - clock.Elapsed.TotalMilliseconds;
                if (left <= 0) return;
                if (left > 3) Thread.Sleep((int)(left - 2));
                else Thread.SpinWait(50);
            }
        }

        static void SetSpread(MemoLock c, bool on)
        {
            var engine = typeof(MemoLock).GetField("Engine", BindingFlags.NonPublic | BindingFlags.Instance).GetValue(c);
            engine.GetType().GetField("SpreadTimers", BindingFlags.NonPublic | BindingFlags.Instance).SetValue(engine, on);
        }

        const string H = "0123456789abcdef0123456789abcdef@holder:1";

        /// <summary>
        /// What the holder waited on published just before the lookup that
        /// takes its lock decides the flight: the lookup that fires at the
        /// lock's expiry first runs, in one step as a holder's script would,
        /// "DEL the lock and PUBLISH" the given message.
        /// </summary>
        static void TakeOverRightAfter(string channelSuffix, string payload, Action<RedisServer, MemoLock, Func<byte[]>, List<string>> check, bool holdMessages = false)
        {
            using (var srv = new RedisServer())
            using (var spy = new SpyTransport(srv.Url()))
            using (var c = new MemoLock(spy, "to", TimeSpan.FromSeconds(10)))
            using (var listener = RespConnection.Open(srv.Url(), 5000))
            {
                listener.Call("SUBSCRIBE", "to/lock-event:k");
                srv.Call("SET", "to/lock:k", H, "PX", "1000");
                spy.BeforeLookup = n =>
                {
                    if (n == 3) // the timer's: the first two found H, before and after the subscription was live
                        srv.Call("EVAL", "redis.call('DEL', KEYS[1]) redis.call('PUBLISH', ARGV[1], ARGV[2]) return 1", "1", "to/lock:k", "to/" + channelSuffix + ":k", payload);
                };
                // Messages may reach this process after the lookup's reply:
                // held back until the flight either makes its marker round
                // trip (the liveness marker was the first PING) or computes.
                if (holdMessages) spy.HoldMessagesUntil = () => Volatile.Read(ref spy.Pings) >= 2 || c.Fetches >= 1;
                var events = new List<string>();
                Func<byte[]> get = () => c.Get("k", l => (Encoding.UTF8.GetBytes("computed"), TimeSpan.Zero), TimeSpan.FromSeconds(20));
                check(srv, c, get, events);
                while (listener.Poll(500)) events.Add(Encoding.UTF8.GetString((byte[])((object[])listener.Read())[2]));
            }
        }

        static bool IsOwnToken(string t) { return t != H && System.Text.RegularExpressions.Regex.IsMatch(t, "^[0-9a-f]{32}@"); }

        /// <summary>H's failure, published in the millisecond before our lookup took its lock: HolderFailedException, no fetch, and the news passed on under our token.</summary>
        [Test]
        static void Takeover_FailJustBeforeTheLookupFailsTheFlight()
        {
            List<string> events = null;
            TakeOverRightAfter("lock-event", "fail\n" + H + "\nbackend down", (srv, c, get, ev) =>
            {
                events = ev;
                var e = Assert.Throws<HolderFailedException>(() => get(), "waiter");
                Assert.Equal("backend down", e.HolderMessage, "H's message");
                Assert.Equal(0L, c.Fetches, "fetches");
                Assert.Equal(null, srv.Call("GET", "to/lock:k"), "our lock released");
                Assert.Equal(null, srv.Call("GET", "to:k"), "nothing stored");
            });
            Assert.Equal(2, events.Count, "events: " + string.Join(" | ", events));
            var parts = events[1].Split('\n');
            Assert.True(parts.Length == 3 && parts[0] == "fail" && IsOwnToken(parts[1]) && parts[2] == "backend down", "passed on: " + events[1]);
        }

        /// <summary>H's notfound just before the lookup: NotFoundException, no fetch, notfound passed on under our token.</summary>
        [Test]
        static void Takeover_NotFoundJustBeforeTheLookupEndsTheFlight()
        {
            List<string> events = null;
            TakeOverRightAfter("lock-event", "notfound\n" + H + "\n", (srv, c, get, ev) =>
            {
                events = ev;
                Assert.Throws<NotFoundException>(() => get(), "waiter");
                Assert.Equal(0L, c.Fetches, "fetches");
                Assert.Equal(null, srv.Call("GET", "to/lock:k"), "our lock released");
            });
            Assert.Equal(2, events.Count, "events: " + string.Join(" | ", events));
            var parts = events[1].Split('\n');
            Assert.True(parts.Length == 3 && parts[0] == "notfound" && IsOwnToken(parts[1]) && parts[2] == "", "passed on: " + events[1]);
        }

        /// <summary>A value H published without storing it, just before the lookup: the value, no fetch, and an abandon under our token.</summary>
        [Test]
        static void Takeover_ValuePublishedJustBeforeTheLookupIsTheValue()
        {
            List<string> events = null;
            TakeOverRightAfter("notif", "handed out", (srv, c, get, ev) =>
            {
                events = ev;
                Assert.Equal("handed out", Encoding.UTF8.GetString(get()), "value");
                Assert.Equal(0L, c.Fetches, "fetches");
                Assert.Eventually(() => srv.Call("GET", "to/lock:k") == null, 10, "our lock released");
                Assert.Equal(null, srv.Call("GET", "to:k"), "nothing stored");
            }, holdMessages: true);
            Assert.Equal(1, events.Count, "events: " + string.Join(" | ", events));
            var parts = events[0].Split('\n');
            Assert.True(parts.Length == 3 && parts[0] == "abandon" && IsOwnToken(parts[1]) && parts[2] == "", "abandon: " + events[0]);
        }

        /// <summary>H abandoned its lock just before the lookup: a genuine takeover, the flight computes.</summary>
        [Test]
        static void Takeover_AbandonJustBeforeTheLookupIsAGenuineTakeover()
        {
            TakeOverRightAfter("lock-event", "abandon\n" + H + "\n", (srv, c, get, ev) =>
            {
                Assert.Equal("computed", Encoding.UTF8.GetString(get()), "value");
                Assert.Equal(1L, c.Fetches, "fetches");
                Assert.Equal(1L, c.Takeovers, "takeovers");
                Assert.Equal("computed", Encoding.UTF8.GetString((byte[])srv.Call("GET", "to:k")), "stored");
            });
        }

        /// <summary>Another holder's failure just before the lookup is not ours to report: the flight computes.</summary>
        [Test]
        static void Takeover_FailOfAnotherHolderIsAGenuineTakeover()
        {
            TakeOverRightAfter("lock-event", "fail\nsomebody-else\nnot ours", (srv, c, get, ev) =>
            {
                Assert.Equal("computed", Encoding.UTF8.GetString(get()), "value");
                Assert.Equal(1L, c.Fetches, "fetches");
            });
        }

        /// <summary>The pub/sub connection breaks as the lookup takes the lock: nothing can be known of what was lost, so the flight computes.</summary>
        [Test]
        static void Takeover_BrokenConnectionDuringTheCheckComputes()
        {
            using (var srv = new RedisServer())
            using (var spy = new SpyTransport(srv.Url()))
            using (var c = new MemoLock(spy, "to", TimeSpan.FromSeconds(10)))
            {
                srv.Call("SET", "to/lock:k", H, "PX", "1000");
                spy.BeforeLookup = n => { if (n == 3) { srv.Call("DEL", "to/lock:k"); srv.Call("CLIENT", "KILL", "TYPE", "pubsub"); } };
                Assert.Equal("computed", Encoding.UTF8.GetString(c.Get("k", l => (Encoding.UTF8.GetBytes("computed"), TimeSpan.Zero), TimeSpan.FromSeconds(20))), "value");
                Assert.Equal(1L, c.Fetches, "fetches");
                Assert.True(c.Reconnects >= 1, "the connection was replaced");
            }
        }

        /// <summary>
        /// Waiters spread their timers: six waiters whose lock expires 5 s
        /// from now look again between its expiry and 1 ms + 500 ms (a tenth
        /// of the PTTL) after it, not all in the same millisecond. A loaded
        /// machine that stalls every thread across the spread bunches the
        /// looks (seen under .ci/under-load: all six within 5 ms, at 5.43 s),
        /// so the spread gets three tries; timers that are not spread at all
        /// fail every one.
        /// </summary>
        [Test(TimeoutSeconds = 120)]
        static void Takeover_WaitersSpreadTheirTimers()
        {
            for (int attempt = 1; ; attempt++)
            {
                var after = WaitersLookAgainAfter();
                string shown = string.Join(", ", after.Select(ms => ms.ToString("0")));
                Assert.True(after.All(ms => ms >= 5000), "no timer fired before the lock expired: " + shown);
                Assert.True(after.All(ms => ms <= 5000 + 1 + 500 + 1500), "each within the spread (and a loaded machine's 1.5 s): " + shown);
                // Six uniform draws from 0-500 ms span less than 50 ms about once in 18000 runs.
                if (after.Max() - after.Min() >= 50) return;
                Assert.True(attempt < 3, "the timers are spread, in one of three tries; the last: " + shown);
                Console.WriteLine("        the looks bunched (" + shown + "): trying again");
            }
        }

        /// <summary>When each of six waiters looked again, in ms after their holder's lock was set (PX 5000).</summary>
        static List<double> WaitersLookAgainAfter()
        {
            using (var srv = new RedisServer())
            {
                var spies = Enumerable.Range(0, 6).Select(_ => new SpyTransport(srv.Url())).ToList();
                var clients = spies.Select(t => new MemoLock(t, "sp", TimeSpan.FromSeconds(5))).ToList();
                try
                {
                    long set = Stopwatch.GetTimestamp();
                    srv.Call("SET", "sp/lock:k", "someone", "PX", "5000"); // dies without a word
                    var threads = clients.Select(c => new Thread(() =>
                    {
                        try
                        {
                            // The first to look after the expiry computes until every waiter has looked a third time.
                            c.Get("k", l =>
                            {
                                Assert.Eventually(() => spies.All(t => Volatile.Read(ref t.Lookups) >= 3), 20, "every waiter's timer fired");
                                return (Encoding.UTF8.GetBytes("v"), TimeSpan.Zero);
                            });
                        }
                        catch (Exception) { }
                    }) { IsBackground = true }).ToList();
                    threads.ForEach(t => t.Start());
                    foreach (var t in threads) Assert.True(t.Join(30000), "a waiter returned");
                    return spies.Select(t => { lock (t.LookupTimes) return (t.LookupTimes[2] - set) * 1000.0 / Stopwatch.Frequency; }).ToList();
                }
                finally
                {
                    clients.ForEach(c => c.Close());
                    spies.ForEach(t => t.Dispose());
                }
            }
        }

        /// <summary>
        /// A holder (lock TTL 3 s, renewed every second) whose fetch fails
        /// 5.0 s after it took the lock, and two waiters in other clients that
        /// started 2.2 s in, so that their timers fire at 5.001 s: 20 runs
        /// with the waiters' timers unspread, where only the takeover check
        /// keeps the failure from being lost, and 20 as shipped (spread).
        /// Nobody computes again, and every waiter gets the holder's failure.
        /// </summary>
        [Test(TimeoutSeconds = 120)]
        static void Takeover_HolderFailureAtARenewalMomentIsNotLost()
        {
            const int runs = 20;
            using (var srv = new RedisServer())
            {
                int recomputed = 0;
                var outcomes = new List<string>();
                var threads = new List<Thread>();
                var clients = new List<MemoLock>();
                var transports = new List<IRedisTransport>();
                for (int k = 0; k < 2 * runs; k++)
                {
                    bool spread = k >= runs;
                    string id = (spread ? "spread" : "unspread") + k;
                    int stagger = k * 150; // one holder's critical millisecond at a time
                    var holderRdb = srv.Transport();
                    transports.Add(holderRdb);
                    var holder = new ScheduledHolder(holderRdb, "tk", id);
                    var waiters = new MemoLock[2];
                    for (int i = 0; i < waiters.Length; i++)
                    {
                        var rdb = srv.Transport();
                        transports.Add(rdb);
                        waiters[i] = new MemoLock(rdb, "tk", TimeSpan.FromMilliseconds(LockTtlMs));
                        SetSpread(waiters[i], spread);
                        clients.Add(waiters[i]);
                    }
                    var t = new Thread(() =>
                    {
                        Thread.Sleep(stagger);
                        var ht = new Thread(holder.Run) { IsBackground = true, Priority = ThreadPriority.Highest };
                        ht.Start();
                        holder.Acquired.WaitOne();
                        // Between the second and the third renewal: the waiters' timers
                        // are set from the second, and fire at 5.001 s.
                        SleepUntil(holder.Clock, 2 * LockTtlMs / 3 + 200);
                        var wts = waiters.Select(c => new Thread(() =>
                        {
                            string outcome;
                            try
                            {
                                c.Get(id, l => { Interlocked.Increment(ref recomputed); return (Encoding.UTF8.GetBytes("recomputed"), TimeSpan.FromMinutes(1)); },
                                    TimeSpan.FromSeconds(30));
                                outcome = id + ": computed again";
                            }
                            catch (HolderFailedException e) { outcome = e.HolderMessage == Message ? null : id + ": holder message " + e.HolderMessage; }
                            catch (Exception e) { outcome = id + ": " + e.GetType().Name + ": " + e.Message; }
                            if (outcome != null) lock (outcomes) outcomes.Add(outcome);
                        }) { IsBackground = true }).ToList();
                        wts.ForEach(w => w.Start());
                        wts.ForEach(w => w.Join());
                        ht.Join();
                        if (holder.Err != null) lock (outcomes) outcomes.Add(id + ": holder: " + holder.Err.Message);
                    }) { IsBackground = true };
                    threads.Add(t);
                }
                try
                {
                    threads.ForEach(t => t.Start());
                    foreach (var t in threads) Assert.True(t.Join(90000), "a run ended");
                    lock (outcomes) Assert.True(outcomes.Count == 0, outcomes.Count + " waiters did not get the holder's failure: " + string.Join("; ", outcomes));
                    Assert.Equal(0, recomputed, "recomputations");
                    Assert.Equal(0, ((object[])srv.Call("KEYS", "tk/lock:*")).Length, "locks left behind");
                }
                finally
                {
                    foreach (var c in clients) c.Close();
                    foreach (var t in transports) t.Dispose();
                }
            }
        }

        /// <summary>
        /// [X5]: a holder that died leaves its waiters to look again as their
        /// (spread) timers fire, one after the other. The first takes the
        /// lock over and its fetch fails at once: it tells the dead holder's
        /// waiters too, so that they fail with it instead of each taking the
        /// lock in turn and running the failing fetch again (4 runs among 4
        /// waiters without the relay, 1 with it).
        /// </summary>
        [Test(TimeoutSeconds = 60)]
        static void Takeover_FailureReachesTheDeadHoldersWaiters()
        {
            const int n = 4;
            using (var srv = new RedisServer())
            {
                srv.Call("SET", "dh/lock:k", "dead-holder", "PX", "3000");
                var transports = Enumerable.Range(0, n).Select(_ => srv.Transport()).ToList();
                var clients = transports.Select(t => new MemoLock(t, "dh", TimeSpan.FromSeconds(3))).ToList();
                int runs = 0;
                var outcomes = new List<Exception>();
                try
                {
                    var threads = new List<Thread>();
                    foreach (var c in clients)
                    {
                        var t = new Thread(() =>
                        {
                            Exception got = null;
                            try
                            {
                                c.Get("k", l =>
                                {
                                    Interlocked.Increment(ref runs);
                                    throw new InvalidOperationException("the database refuses");
                                }, TimeSpan.FromSeconds(30));
                            }
                            catch (Exception e) { got = e; }
                            lock (outcomes) outcomes.Add(got);
                        }) { IsBackground = true };
                        t.Start();
                        threads.Add(t);
                        int listening = threads.Count;
                        Assert.Eventually(() => (long)((object[])srv.Call("PUBSUB", "NUMSUB", "dh/notif:k"))[1] >= listening, 10, "the waiter to listen");
                    }
                    foreach (var t in threads) Assert.True(t.Join(25000), "a waiter had an answer within 20 s of the dead holder's lock expiring");
                    lock (outcomes)
                        foreach (var e in outcomes)
                            Assert.True(e != null && e.Message.Contains("the database refuses"), "a waiter got the failure: " + e);
                    Assert.Equal(1, Volatile.Read(ref runs), "runs of the failing fetch among " + n + " waiters of a dead holder");
                }
                finally
                {
                    clients.ForEach(c => c.Close());
                    transports.ForEach(t => t.Dispose());
                }
            }
        }
    }
}
