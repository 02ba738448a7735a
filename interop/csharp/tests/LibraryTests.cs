// Library tests against real redis-servers: hits, misses, coalescing,
// stampedes across clients, failures, takeover, reconnects, external mode.
using System;
using System.Collections.Generic;
using System.Diagnostics;
using System.Linq;
using System.Text;
using System.Threading;
using MemoLockNet;

namespace MemoLockTests
{
    static class LibraryTests
    {
        /// <summary>A thread for body that never throws: an unhandled exception would end the runner.</summary>
        static Thread Safe(Action body) { return new Thread(() => { try { body(); } catch (Exception) { } }) { IsBackground = true }; }

        static byte[] B(string s) { return Encoding.UTF8.GetBytes(s); }
        static string S(byte[] b) { return b == null ? null : Encoding.UTF8.GetString(b); }

        /// <summary>Runs body with n clients of one tag on a fresh server.</summary>
        static void With(int n, Action<RedisServer, MemoLock[]> body, TimeSpan? lockTtl = null, string tag = "t")
        {
            With(n, (srv, cs, spies) => body(srv, cs), lockTtl, tag);
        }

        /// <summary>Runs body with n clients of one tag on a fresh server, and the transports that count their calls.</summary>
        static void With(int n, Action<RedisServer, MemoLock[], SpyTransport[]> body, TimeSpan? lockTtl = null, string tag = "t")
        {
            using (var srv = new RedisServer())
            {
                var ts = Enumerable.Range(0, n).Select(_ => new SpyTransport(srv.Url())).ToArray();
                var cs = ts.Select(t => new MemoLock(t, tag, lockTtl)).ToArray();
                try { body(srv, cs, ts); }
                finally
                {
                    foreach (var c in cs) c.Close();
                    foreach (var t in ts) t.Dispose();
                }
            }
        }

        [Test]
        static void Get_MissComputesStoresAndLingersThenHits()
        {
            With(1, (srv, c) =>
            {
                // The linger lasts a second: on a loaded machine the test may
                // look after it ended, which shows nothing either way, and
                // tries again on another id (at most five).
                for (int round = 0; ; round++)
                {
                    string id = "k" + round;
                    int fetches = 0;
                    string token = null;
                    var since = Stopwatch.StartNew(); // before the store, so at least the linger's age
                    byte[] v = c[0].Get(id, l => { fetches++; token = l.Token; return (B("v1"), TimeSpan.FromSeconds(30)); });
                    string lockv = S((byte[])srv.Call("GET", "t/lock:" + id));
                    long lp = (long)srv.Call("PTTL", "t/lock:" + id);
                    long looked = since.ElapsedMilliseconds;
                    if (looked >= 900 && round < 4) continue;
                    Assert.Equal("v1", S(v), "value");
                    Assert.Equal("v1", S((byte[])srv.Call("GET", "t:" + id)), "stored value");
                    long pttl = (long)srv.Call("PTTL", "t:" + id);
                    Assert.True(pttl > 20000 && pttl <= 30000, "value TTL " + pttl);
                    Assert.Equal("done:" + token, lockv, "lock lingers as done:<token> (looked within " + looked + " ms of the Get's start)");
                    Assert.True(lp > 0 && lp <= 1000, "linger PTTL " + lp);
                    v = c[0].Get(id, l => { fetches++; return (B("v2"), TimeSpan.Zero); });
                    Assert.Equal("v1", S(v), "hit");
                    Assert.Equal(1, fetches, "fetches");
                    return;
                }
            });
        }

        [Test]
        static void Get_ValueTtlRoundsUpAndZeroMeansForever()
        {
            With(1, (srv, c) =>
            {
                c[0].Get("forever", l => (B("x"), TimeSpan.Zero));
                Assert.Equal(-1L, (long)srv.Call("PTTL", "t:forever"), "no expiry");
                c[0].Get("short", l => (B("x"), TimeSpan.FromTicks(3000))); // 0.3 ms
                long lp = (long)srv.Call("PTTL", "t/lock:short");
                Assert.True(lp <= 1, "linger at most the value's TTL: " + lp);
            });
        }

        [Test]
        static void Get_BulkOneIsAValueNotALock()
        {
            With(1, (srv, c) =>
            {
                srv.Call("SET", "t:one", "1");
                Assert.Equal("1", S(c[0].Get("one", l => { throw new Exception("fetch must not run"); })), "value \"1\"");
                srv.Call("SET", "t:empty", "");
                Assert.Equal(0, c[0].Get("empty", l => { throw new Exception("fetch must not run"); }).Length, "empty value");
            });
        }

        [Test]
        static void Get_CoalescesConcurrentCallersInOneProcess()
        {
            With(1, (srv, c) =>
            {
                int fetches = 0;
                var results = new byte[20][];
                var threads = Enumerable.Range(0, 20).Select(i => Safe(() =>
                {
                    try
                    {
                        results[i] = c[0].Get("k", l =>
                        {
                            Interlocked.Increment(ref fetches);
                            // Runs until every other caller joined it, however slowly they start.
                            Assert.Eventually(() => c[0].Coalesced == 19, 20, "the 19 other callers to join the flight");
                            return (B("shared"), TimeSpan.Zero);
                        });
                    }
                    catch (Exception) { }
                })).ToList();
                threads.ForEach(t => t.Start());
                threads.ForEach(t => t.Join());
                Assert.Equal(1, fetches, "fetches");
                Assert.True(results.All(r => S(r) == "shared"), "every caller got the value");
                Assert.Equal(19L, c[0].Coalesced, "calls coalesced");
            });
        }

        [Test]
        static void Get_StampedeAcrossClientsComputesOnce()
        {
            With(5, (srv, cs) =>
            {
                int fetches = 0;
                var results = new List<byte[]>();
                var threads = new List<Thread>();
                foreach (var c in cs)
                    for (int k = 0; k < 4; k++)
                        threads.Add(Safe(() =>
                        {
                            try
                            {
                                var v = c.Get("hot", l => { Interlocked.Increment(ref fetches); Thread.Sleep(500); return (B("computed once"), TimeSpan.FromMinutes(1)); });
                                lock (results) results.Add(v);
                            }
                            catch (Exception) { }
                        }));
                threads.ForEach(t => t.Start());
                threads.ForEach(t => t.Join());
                Assert.Equal(1, fetches, "fetches across 5 clients");
                Assert.Equal(20, results.Count(r => S(r) == "computed once"), "callers with the value");
            });
        }

        [Test]
        static void Get_WaitersFailWhenTheHolderFails()
        {
            With(2, (srv, cs, spies) =>
            {
                var started = new ManualResetEvent(false);
                Exception holderErr = null;
                var holder = Safe(() =>
                {
                    try
                    {
                        cs[0].Get("f", l =>
                        {
                            started.Set();
                            spies[1].AwaitWaiting(); // fails only once the waiter listens
                            throw new InvalidOperationException("backend down\nstack trace here");
                        });
                    }
                    catch (Exception e) { holderErr = e; }
                });
                holder.Start();
                started.WaitOne();
                var sw = Stopwatch.StartNew();
                var e2 = Assert.Throws<HolderFailedException>(() => cs[1].Get("f", l => (B("never"), TimeSpan.Zero)), "waiter");
                Assert.Equal("backend down", e2.HolderMessage, "holder's first line");
                Assert.True(sw.Elapsed.TotalSeconds < 10, "waiter failed at once, not after the 30 s lock: " + sw.Elapsed);
                holder.Join();
                Assert.True(holderErr is InvalidOperationException, "holder's caller gets its own exception: " + holderErr);
                Assert.Equal(null, srv.Call("GET", "t/lock:f"), "lock released");
            }, TimeSpan.FromSeconds(30));
        }

        [Test]
        static void Get_FetchErrorsPublishFailEvents()
        {
            With(1, (srv, cs) =>
            {
                Assert.Throws<ArgumentNullException>(() => cs[0].Get("n", l => (null, TimeSpan.Zero)), "null value");
                Assert.Throws<ArgumentOutOfRangeException>(() => cs[0].Get("neg", l => (B("x"), TimeSpan.FromSeconds(-1))), "negative TTL");
                Assert.Equal(null, srv.Call("GET", "t:neg"), "nothing stored");
                Assert.Equal(null, srv.Call("GET", "t/lock:neg"), "lock released");
            });
        }

        [Test]
        static void Get_TakesOverWhenTheHolderDies()
        {
            With(1, (srv, cs) =>
            {
                // A holder that died: its lock expires in 1 s, and nobody publishes.
                srv.Call("SET", "t/lock:d", "deadbeef@gone:1", "PX", "1000");
                string seen = null;
                var sw = Stopwatch.StartNew();
                var v = cs[0].Get("d", l => (B("mine"), TimeSpan.Zero));
                Assert.Equal("mine", S(v), "value after takeover");
                Assert.True(sw.Elapsed.TotalSeconds >= 0.8 && sw.Elapsed.TotalSeconds < 10, "took over after the lock expired: " + sw.Elapsed);
                Assert.Equal(1L, cs[0].Takeovers, "takeovers");
                Assert.Equal(null, seen, "no holder callback configured");
            });
        }

        [Test]
        static void Get_DoneLockWithoutItsValueIsTakenOverAtOnce()
        {
            With(1, (srv, cs) =>
            {
                srv.Call("SET", "t/lock:gone", "done:oldtoken", "PX", "60000"); // the value was deleted since
                var sw = Stopwatch.StartNew();
                Assert.Equal("recomputed", S(cs[0].Get("gone", l => (B("recomputed"), TimeSpan.Zero))), "value");
                Assert.True(sw.Elapsed.TotalSeconds < 5, "did not wait for the done lock: " + sw.Elapsed);
            });
        }

        [Test]
        static void Get_LockWithoutTtlIsLookedAtAgainAfterOurLockTtl()
        {
            With(1, (srv, cs, spies) =>
            {
                srv.Call("SET", "t/lock:nottl", "someone");
                var t = Safe(() =>
                {
                    // Nothing is published: only the waiter's own timer makes it look a third time.
                    spies[0].AwaitWaiting(3);
                    srv.Call("DEL", "t/lock:nottl");
                });
                t.Start();
                var v = cs[0].Get("nottl", l => (B("v"), TimeSpan.Zero));
                Assert.Equal("v", S(v), "value");
                t.Join();
            }, TimeSpan.FromSeconds(1));
        }

        [Test]
        static void Get_AbandonEventWakesWaitersAtOnce()
        {
            With(1, (srv, cs, spies) =>
            {
                srv.Call("SET", "t/lock:a", "tok1", "PX", "60000");
                var sw = Stopwatch.StartNew();
                var t = Safe(() =>
                {
                    spies[0].AwaitWaiting(); // only the event can make it look again
                    srv.Call("DEL", "t/lock:a");
                    srv.Call("PUBLISH", "t/lock-event:a", "abandon\ntok1\n");
                });
                t.Start();
                var v = cs[0].Get("a", l => (B("after abandon"), TimeSpan.Zero));
                Assert.Equal("after abandon", S(v), "value");
                Assert.True(sw.Elapsed.TotalSeconds < 10, "did not wait out the 60 s lock: " + sw.Elapsed);
                t.Join();
            });
        }

        [Test]
        static void Get_EventsOfOtherHoldersAreIgnored()
        {
            With(1, (srv, cs, spies) =>
            {
                srv.Call("SET", "t/lock:o", "tok1", "PX", "60000");
                var t = Safe(() =>
                {
                    spies[0].AwaitWaiting();
                    // Events arrive in order: the failure of somebody else, then
                    // the holder's abandon, which makes the waiter look again and compute.
                    srv.Call("PUBLISH", "t/lock-event:o", "fail\nsomebody-else\nnot ours");
                    srv.Call("DEL", "t/lock:o");
                    srv.Call("PUBLISH", "t/lock-event:o", "abandon\ntok1\n");
                });
                t.Start();
                Assert.Equal("computed", S(cs[0].Get("o", l => (B("computed"), TimeSpan.Zero))), "value: the other holder's failure was ignored");
                t.Join();
            });
        }

        [Test]
        static void Get_OriginalPeerValueWakesWaiters()
        {
            With(1, (srv, cs, spies) =>
            {
                srv.Call("SET", "t/lock:p", "b7a5e3f0-uuid", "PX", "60000");
                var t = Safe(() => { spies[0].AwaitWaiting(); srv.Call("SET", "t:p", "from peer"); srv.Call("PUBLISH", "t/notif:p", "from peer"); });
                t.Start();
                Assert.Equal("from peer", S(cs[0].Get("p", l => (B("x"), TimeSpan.Zero), TimeSpan.FromSeconds(20))), "value");
                t.Join();
            });
        }

        [Test]
        static void Get_ReReadsAfterThePubSubConnectionIsKilled()
        {
            With(1, (srv, cs) =>
            {
                srv.Call("SET", "t/lock:r", "tok1", "PX", "60000");
                byte[] got = null;
                Exception err = null;
                var waiter = Safe(() => { try { got = cs[0].Get("r", l => (B("x"), TimeSpan.Zero)); } catch (Exception e) { err = e; } });
                waiter.Start();
                Assert.Eventually(() => (long)((object[])srv.Call("PUBSUB", "NUMSUB", "t/notif:r"))[1] == 1, 10, "the waiter subscribed");
                // The value is stored and published while the connection is dead:
                // the publish is lost, and only the re-read finds it. Redis may
                // close a killed client asynchronously: until it is gone, a
                // PUBLISH could still reach it.
                Func<HashSet<string>> pubsubIds = () =>
                {
                    var ids = new HashSet<string>();
                    foreach (var line in Encoding.UTF8.GetString((byte[])srv.Call("CLIENT", "LIST", "TYPE", "pubsub")).Split('\n'))
                        if (line.StartsWith("id=")) ids.Add(line.Split(' ')[0]);
                    return ids;
                };
                var old = pubsubIds();
                srv.Call("CLIENT", "KILL", "TYPE", "pubsub");
                Assert.Eventually(() => { var now = pubsubIds(); now.IntersectWith(old); return now.Count == 0; }, 10, "the killed connection gone");
                srv.Call("SET", "t:r", "stored during the gap");
                srv.Call("PUBLISH", "t/notif:r", "stored during the gap");
                Assert.True(waiter.Join(15000), "waiter woke");
                Assert.Equal(null, err, "error");
                Assert.Equal("stored during the gap", S(got), "value");
                Assert.True(cs[0].Reconnects >= 1, "reconnected");
            });
        }

        [Test]
        static void Get_ValuePublishedAfterReconnectArrives()
        {
            With(1, (srv, cs) =>
            {
                srv.Call("SET", "t/lock:q", "tok1", "PX", "60000");
                byte[] got = null;
                var waiter = Safe(() => { try { got = cs[0].Get("q", l => (B("x"), TimeSpan.Zero)); } catch (Exception) { } });
                waiter.Start();
                Assert.Eventually(() => (long)((object[])srv.Call("PUBSUB", "NUMSUB", "t/notif:q"))[1] == 1, 10, "the waiter subscribed");
                srv.Call("CLIENT", "KILL", "TYPE", "pubsub");
                Assert.Eventually(() => cs[0].Reconnects >= 1 && (long)((object[])srv.Call("PUBSUB", "NUMSUB", "t/notif:q"))[1] == 1, 10, "resubscribed");
                srv.Call("PUBLISH", "t/notif:q", "published later");
                Assert.True(waiter.Join(15000), "waiter woke");
                Assert.Equal("published later", S(got), "value");
            });
        }

        [Test]
        static void Get_SilentConnectionIsProbedAndReplaced()
        {
            With(1, (srv, cs) =>
            {
                srv.Call("SET", "t/lock:s", "tok1", "PX", "120000");
                byte[] got = null;
                var waiter = Safe(() => { try { got = cs[0].Get("s", l => (B("x"), TimeSpan.Zero)); } catch (Exception) { } });
                waiter.Start();
                Assert.Eventually(() => (long)((object[])srv.Call("PUBSUB", "NUMSUB", "t/notif:s"))[1] == 1, 10, "the waiter subscribed");
                // A stopped server answers nothing and resets nothing: only the
                // probe PING (after 3 s of silence, given 3 s more) notices.
                srv.Signal("STOP");
                try { Assert.Eventually(() => cs[0].Reconnects >= 1, 15, "the silent connection was replaced"); }
                finally { srv.Signal("CONT"); }
                // The new connection's marker may come back before or after
                // this: the re-read or the message brings the value.
                srv.Call("SET", "t:s", "after the silence");
                srv.Call("PUBLISH", "t/notif:s", "after the silence");
                Assert.True(waiter.Join(15000), "waiter woke");
                Assert.Equal("after the silence", S(got), "value");
            });
        }

        [Test]
        static void Get_TimeoutGivesUpAndLeavesTheFlight()
        {
            With(1, (srv, cs) =>
            {
                srv.Call("SET", "t/lock:w", "tok1", "PX", "60000");
                var sw = Stopwatch.StartNew();
                Assert.Throws<MemoLockTimeoutException>(() => cs[0].Get("w", l => (B("x"), TimeSpan.Zero), TimeSpan.FromMilliseconds(300)), "timeout");
                Assert.True(sw.Elapsed.TotalSeconds < 5, "gave up in time");
                Assert.Eventually(() => (long)((object[])srv.Call("PUBSUB", "NUMSUB", "t/notif:w"))[1] == 0, 10, "unsubscribed after the flight ended");
            });
        }

        [Test]
        static void Get_OwnTokenBusyReplyMeansTheLockIsOurs()
        {
            using (var srv = new RedisServer())
            using (var t = srv.Transport())
            {
                var p = new Protocol(t, new KeyScheme("t"));
                string tok = Tokens.New();
                Assert.Equal(ReplyKind.Locked, p.Acquire(B("x"), tok, 5000).Kind, "first acquire");
                var r = p.Acquire(B("x"), tok, 5000);
                Assert.Equal(ReplyKind.Locked, r.Kind, "retried acquire with our token");
                Assert.True(r.Pttl > 0 && r.Pttl <= 5000, "pttl of our lock " + r.Pttl);
                var other = p.Acquire(B("x"), Tokens.New(), 5000);
                Assert.Equal(ReplyKind.Busy, other.Kind, "another token");
                Assert.Equal(tok, other.Holder, "holder");
            }
        }

        [Test]
        static void Scripts_FallBackToEvalOnNoScript()
        {
            using (var srv = new RedisServer())
            using (var t = srv.Transport())
            {
                srv.Call("SCRIPT", "FLUSH");
                var p = new Protocol(t, new KeyScheme("t"));
                Assert.Equal(ReplyKind.Locked, p.Acquire(B("s"), "tok", 1000).Kind, "acquire through EVAL");
                Assert.Equal(1L, ((object[])srv.Call("SCRIPT", "EXISTS", Scripts.Acquire.Sha1))[0], "script loaded under the vector's sha1");
            }
        }

        /// <summary>
        /// A fetch that outlives its lock TTL keeps the lock: renewed every
        /// TTL/3, a renewal may come up to 2/3 of the TTL (1.3 s here) late
        /// on a loaded machine before anyone could take the lock over.
        /// </summary>
        [Test]
        static void Lease_IsRenewedWhileFetchRuns()
        {
            var lockTtl = TimeSpan.FromSeconds(2);
            With(2, (srv, cs, spies) =>
            {
                byte[] other = null;
                var v = cs[0].Get("long", l =>
                {
                    var sw = Stopwatch.StartNew();
                    Assert.Eventually(() => sw.Elapsed > lockTtl + lockTtl && Volatile.Read(ref spies[0].Renews) >= 3, 30, "two lock TTLs and three renewals");
                    Assert.True(l.Held(), "lease still held after two lock TTLs");
                    var t = Safe(() => { try { other = cs[1].Get("long", l2 => (B("second fetch"), TimeSpan.Zero)); } catch (Exception) { } });
                    t.Start();
                    spies[1].AwaitWaiting(); // the other client found the lock held
                    return (B("first"), TimeSpan.Zero);
                });
                Assert.Equal("first", S(v), "holder's value");
                Assert.Eventually(() => other != null, 10, "the other client's value");
                Assert.Equal("first", S(other), "nobody took over a renewed lease");
            }, lockTtl);
        }

        [Test]
        static void External_WinnerStartsWorkAndReleasesWhenTheValueArrives()
        {
            With(2, (srv, cs) =>
            {
                string token = null;
                int starts = 0;
                Action<Lease> start = l =>
                {
                    Interlocked.Increment(ref starts);
                    token = l.Token;
                    Safe(() => { Thread.Sleep(400); srv.Call("SET", "t:x", "produced"); srv.Call("PUBLISH", "t/notif:x", "produced"); }).Start();
                };
                byte[] b = null;
                var waiter = Safe(() => { try { Thread.Sleep(100); b = cs[1].GetExternal("x", start); } catch (Exception) { } });
                waiter.Start();
                var a = cs[0].GetExternal("x", start);
                waiter.Join();
                Assert.Equal("produced", S(a), "winner's value");
                Assert.Equal("produced", S(b), "waiter's value");
                Assert.Equal(1, starts, "started once");
                Assert.Eventually(() => S((byte[])srv.Call("GET", "t/lock:x")) != token, 5, "lock released");
                var l2 = (byte[])srv.Call("GET", "t/lock:x");
                Assert.True(l2 == null || S(l2) == "done:" + token, "lock released with linger: " + S(l2));
            });
        }

        [Test]
        static void External_WinnersTimerRunsFromWhenItTookTheLock()
        {
            // The lock was taken before start: the winner waits on what is
            // left of it ([E1]). A start that outlasts the lock, with no
            // word from its producer, is followed by a look at once (and a
            // start again), not a full lock TTL later.
            var lockTtl = TimeSpan.FromSeconds(3);
            With(1, (srv, cs) =>
            {
                long gapMs = StartAgainAfter(srv, cs[0], 3500); // a hand-off slower than the lock lives
                Assert.True(gapMs >= 0 && gapMs < 1500, "the second start came " + gapMs + " ms after the first returned; want it at once (the lock TTL is 3 s)");
            }, lockTtl);
        }

        /// <summary>
        /// Gets id w in external mode with a start whose first call returns
        /// after holdMs with no word from its producer, and whose second
        /// produces the value; returns the ms from the first call's return
        /// to the second call (-1: none).
        /// </summary>
        static long StartAgainAfter(RedisServer srv, MemoLock c, int holdMs)
        {
            int starts = 0;
            var firstEnded = new Stopwatch();
            long gapMs = -1;
            Action<Lease> start = l =>
            {
                if (Interlocked.Increment(ref starts) == 1)
                {
                    Thread.Sleep(holdMs);
                    firstEnded.Start();
                    return;
                }
                gapMs = firstEnded.ElapsedMilliseconds;
                srv.Call("SET", "t:w", "produced");
                srv.Call("PUBLISH", "t/notif:w", "produced");
            };
            Assert.Equal("produced", S(c.GetExternal("w", start)), "the second start's value");
            return gapMs;
        }

        [Test]
        static void External_WinnersTimerRunsFromALockFoundAlreadyOurs()
        {
            // A retried lookup whose first reply was lost finds the lock
            // already the flight's, with what is left of it, as if the
            // reply had been 1: the winner's timer runs from that, not from
            // a full lock TTL ([E1]). The first run took the lock 2.5 s
            // before the retry (set here as it left it: our token, 500 ms
            // left); start returns with no word from its producer, and the
            // second start comes once those 500 ms are out.
            var lockTtl = TimeSpan.FromSeconds(3);
            With(1, (srv, cs, spies) =>
            {
                spies[0].BeforeLookupArgs = (n, args) =>
                {
                    if (n == 1) srv.Call("SET", "t/lock:w", (byte[])args[0], "PX", "500");
                };
                long gapMs = StartAgainAfter(srv, cs[0], 0);
                Assert.True(gapMs >= 0 && gapMs < 1500, "the second start came " + gapMs + " ms after the first returned; want it once the 500 ms left of the lock found ours were out (the lock TTL is 3 s)");
            }, lockTtl);
        }

        [Test]
        static void External_ProducerFailureReachesWinnerAndWaiters()
        {
            With(1, (srv, cs) =>
            {
                var e = Assert.Throws<HolderFailedException>(() => cs[0].GetExternal("y", l =>
                {
                    var tok = l.Token;
                    Safe(() =>
                    {
                        // Once the winner listens for its producer's events.
                        Assert.Eventually(() => (long)((object[])srv.Call("PUBSUB", "NUMSUB", "t/lock-event:y"))[1] == 1, 20, "the winner subscribed");
                        srv.Call("PUBLISH", "t/lock-event:y", "fail\n" + tok + "\nproducer broke");
                    }).Start();
                }), "winner");
                Assert.Equal("producer broke", e.HolderMessage, "message");
                Assert.Equal(null, srv.Call("GET", "t/lock:y"), "lock released");
            });
        }

        /// <summary>
        /// [E1]: the winner is live before it calls start, so a producer that
        /// fails at once (here: start itself, before it returns) reaches it.
        /// Subscribed only after start, the winner lost the event, waited out
        /// its whole lock TTL (30 s) and then started the work again.
        /// </summary>
        [Test]
        static void External_ProducerFailingDuringStartReachesTheWinner()
        {
            With(1, (srv, cs) =>
            {
                int starts = 0;
                string token = null;
                var sw = Stopwatch.StartNew();
                var e = Assert.Throws<HolderFailedException>(() => cs[0].GetExternal("ef", l =>
                {
                    Interlocked.Increment(ref starts);
                    token = l.Token;
                    srv.Call("PUBLISH", "t/lock-event:ef", "fail\n" + l.Token + "\nproducer broke at once");
                }, TimeSpan.FromSeconds(15)), "winner");
                Assert.True(sw.Elapsed < TimeSpan.FromSeconds(5), "failed promptly, not after the 30 s lock TTL: " + sw.Elapsed);
                Assert.Equal("producer broke at once", e.HolderMessage, "message");
                Assert.Equal(1, starts, "started once");
                Assert.Equal(null, srv.Call("GET", "t/lock:ef"), "lock released (no linger)");
            }, TimeSpan.FromSeconds(30));
        }

        /// <summary>
        /// [E1], [E2]: start stores and publishes the value before it returns.
        /// The winner, live before it called start, has the value from its
        /// channel: no lookup after start, the lock released with its linger.
        /// </summary>
        [Test]
        static void External_ValuePublishedDuringStartNeedsNoLookup()
        {
            With(1, (srv, cs, spies) =>
            {
                int starts = 0;
                string token = null;
                var sw = Stopwatch.StartNew();
                var v = cs[0].GetExternal("ev", l =>
                {
                    Interlocked.Increment(ref starts);
                    token = l.Token;
                    srv.Call("SET", "t:ev", "produced at once");
                    srv.Call("PUBLISH", "t/notif:ev", "produced at once");
                }, TimeSpan.FromSeconds(15));
                Assert.True(sw.Elapsed < TimeSpan.FromSeconds(5), "promptly: " + sw.Elapsed);
                Assert.Equal("produced at once", S(v), "value");
                Assert.Equal(1, starts, "started once");
                Assert.Equal(1, Volatile.Read(ref spies[0].Lookups), "one lookup: the value came on the channel, live before start");
                var lk = S((byte[])srv.Call("GET", "t/lock:ev"));
                Assert.True(lk == null || lk == "done:" + token, "lock released with its linger: " + lk);
            }, TimeSpan.FromSeconds(30));
        }

        /// <summary>
        /// Client a wins id and runs winner (which sets entered, then blocks until
        /// a closes); client b waits on id. Then a closes: b must take over at once
        /// (an abandon event, not a fail event, nor the 30 s lock TTL). Then b
        /// closes, and after runs.
        /// </summary>
        static void CloseWhileTheWinnerRuns(string id, Action<MemoLock, string, ManualResetEvent> winner, Action<RedisServer, MemoLock> after)
        {
            using (var srv = new RedisServer())
            using (var t1 = srv.Transport())
            using (var t2 = srv.Transport())
            {
                var a = new MemoLock(t1, "t", TimeSpan.FromSeconds(30));
                var b = new MemoLock(t2, "t", TimeSpan.FromSeconds(30));
                var entered = new ManualResetEvent(false);
                Exception aErr = null, bErr = null;
                var ta = Safe(() => { try { winner(a, id, entered); } catch (Exception e) { aErr = e; } });
                ta.Start();
                entered.WaitOne();
                byte[] bv = null;
                var tb = Safe(() => { try { bv = b.Get(id, l => (B("b took over"), TimeSpan.Zero)); } catch (Exception e) { bErr = e; } });
                tb.Start();
                Assert.Eventually(() => (long)((object[])srv.Call("PUBSUB", "NUMSUB", "t/notif:" + id))[1] == 1, 10, "b waits");
                var sw = Stopwatch.StartNew();
                a.Close();
                ta.Join();
                Assert.True(aErr is MemoLockClosedException, "a's caller gets closed: " + aErr);
                Assert.True(tb.Join(10000), "b woke");
                Assert.Equal("b took over", S(bv), "b took over after the abandon event, not failed: " + bErr);
                Assert.True(sw.Elapsed.TotalSeconds < 10, "at once, not after the 30 s lock TTL: " + sw.Elapsed);
                b.Close();
                after(srv, a);
            }
        }

        [Test]
        static void Close_ReleasesHeldLocksAndStopsWaiters()
        {
            CloseWhileTheWinnerRuns("c",
                (a, id, entered) => a.Get(id, l => { entered.Set(); l.Cancellation.WaitHandle.WaitOne(); throw new OperationCanceledException(); }),
                (srv, a) =>
                {
                    Assert.Throws<MemoLockClosedException>(() => a.Get("c", l => (B("x"), TimeSpan.Zero)), "Get after Close");
                    Assert.Eventually(() => ((byte[])srv.Call("CLIENT", "LIST", "TYPE", "pubsub")).Length == 0, 5, "no pub/sub connection left");
                });
        }

        /// <summary>
        /// [E4]: Close while an external producer's start runs is a shutdown,
        /// not a failure of the work: the lock goes with an abandon event, and
        /// a waiter elsewhere takes over instead of failing.
        /// </summary>
        [Test]
        static void Close_DuringExternalStartHandsTheLockOver()
        {
            CloseWhileTheWinnerRuns("e",
                (a, id, entered) => a.GetExternal(id, l => { entered.Set(); l.Cancellation.WaitHandle.WaitOne(); throw new OperationCanceledException(); }),
                (srv, a) => { });
        }

        [Test]
        static void Transport_UnixSocketAndAuth()
        {
            using (var srv = new RedisServer("s3cret", true))
            {
                foreach (var url in new[] { "unix://:s3cret@" + srv.Socket, "redis://default:s3cret@127.0.0.1:" + srv.Port + "/3", "redis://s3cret@127.0.0.1:" + srv.Port })
                    using (var t = new RespTransport(url))
                    using (var c = new MemoLock(t, "u"))
                        Assert.Equal("via " + url.Substring(0, 5), S(c.Get("k" + url.Length, l => (B("via " + url.Substring(0, 5)), TimeSpan.Zero))), url);
                Assert.Equal(null, srv.Call("GET", "u:k" + ("redis://default:s3cret@127.0.0.1:" + srv.Port + "/3").Length), "db 3 is not db 0");
                using (var t = new RespTransport("redis://:wrong@127.0.0.1:" + srv.Port))
                    Assert.Throws<RedisReplyException>(() => t.Get(B("x")), "wrong password");
            }
        }

        [Test]
        static void GetJson_StoresGoEncoding()
        {
            With(1, (srv, cs) =>
            {
                var v = cs[0].GetJson("j", l => (new Dictionary<string, object> { { "b", 1.5 }, { "a", new List<object> { "<x>", null, true } } }, TimeSpan.Zero));
                Assert.Equal("{\"a\":[\"\\u003cx\\u003e\",null,true],\"b\":1.5}", S((byte[])srv.Call("GET", "t:j")), "stored JSON");
                Assert.Equal(1.5, (double)((Dictionary<string, object>)v)["b"], "parsed back");
            });
        }

        [Test]
        static void Get_HashIdsSendsTheSha256()
        {
            using (var srv = new RedisServer())
            using (var t = srv.Transport())
            using (var c = new MemoLock(t, "h", null, true))
            {
                c.Get("kristoff", l => (B("v"), TimeSpan.Zero));
                Assert.Equal("v", S((byte[])srv.Call("GET", "h:3a0bb1ac850df99bc67149763ee4fef4f16b24d57426ce751516e0853f9595d6")), "hashed key");
            }
        }
    }
}
