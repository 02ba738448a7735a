// NotFoundException, NegTtl, the not-found marker and stale copy keys, and
// the notfound / stale / unknown-kind events, against real redis-servers.
using System;
using System.Collections.Generic;
using System.Diagnostics;
using System.Linq;
using System.Text;
using System.Threading;
using MemoLockNet;

namespace MemoLockTests
{
    /// <summary>A transport whose not_found script fails while FailNotFound is set.</summary>
    sealed class NotFoundFailingTransport : IRedisTransport
    {
        readonly RespTransport inner;
        public volatile bool FailNotFound;
        public NotFoundFailingTransport(RedisUrl url) { inner = new RespTransport(url); }
        public object Eval(string script, string sha1, byte[][] keys, object[] args)
        {
            if (FailNotFound && sha1 == Scripts.NotFound.Sha1) throw new RedisReplyException("ERR injected failure");
            return inner.Eval(script, sha1, keys, args);
        }
        public byte[] Get(byte[] key) { return inner.Get(key); }
        public long Publish(byte[] channel, byte[] message) { return inner.Publish(channel, message); }
        public IPubSubConnection OpenPubSub() { return inner.OpenPubSub(); }
        public void Dispose() { inner.Dispose(); }
    }

    sealed class MissingUserException : NotFoundException { public MissingUserException() : base("no such user") { } }

    static class NotFoundTests
    {
        const double Prompt = 5; // seconds: far below the fake holder's 30 s lock
        const string Holder = "0123456789abcdef0123456789abcdef@elsewhere:1";

        static byte[] B(string s) { return Encoding.UTF8.GetBytes(s); }
        static string S(byte[] b) { return b == null ? null : Encoding.UTF8.GetString(b); }

        static ValueTuple<byte[], TimeSpan> Never(Lease l) { throw new InvalidOperationException("fetch must not be called"); }

        static void With(Action<RedisServer, MemoLock> body, TimeSpan? negTtl = null, TimeSpan? lockTtl = null)
        {
            With((srv, c, spy) => body(srv, c), negTtl, lockTtl);
        }

        static void With(Action<RedisServer, MemoLock, SpyTransport> body, TimeSpan? negTtl = null, TimeSpan? lockTtl = null)
        {
            using (var srv = new RedisServer())
            using (var t = new SpyTransport(srv.Url()))
            using (var c = new MemoLock(t, "t", lockTtl ?? TimeSpan.FromSeconds(2), negTtl: negTtl))
                body(srv, c, t);
        }

        static bool Exists(RedisServer srv, params string[] keys) { return (long)srv.Call(new object[] { "EXISTS" }.Concat(keys).ToArray()) > 0; }

        /// <summary>Runs get on a thread; returns it and a box for its value or exception.</summary>
        static Thread Start(Func<byte[]> get, object[] box)
        {
            var t = new Thread(() => { try { box[0] = get(); } catch (Exception e) { box[1] = e; } }) { IsBackground = true };
            t.Start();
            return t;
        }


        [Test]
        static void NotFound_CachedMarkerFailsWithoutCallingFetch()
        {
            With((srv, c) =>
            {
                srv.Call("SET", "t/lock-notfound:m", "", "PX", "60000");
                var e = Assert.Throws<NotFoundException>(() => c.Get("m", Never), "marker");
                Assert.True(e.Message.Contains("\"m\""), "message names the id: " + e.Message);
                Assert.Throws<NotFoundException>(() => c.Get("m", Never, TimeSpan.FromSeconds(20)), "marker, on a flight thread");
                Assert.True(!Exists(srv, "t/lock:m"), "no lock taken");
                srv.Call("SET", "t:m", "there");
                Assert.Equal("there", S(c.Get("m", Never)), "a value wins over the marker");
            }, TimeSpan.FromSeconds(5));
        }

        [Test]
        static void NotFound_FetchRecordsTheMarkerForNegTtl()
        {
            With((srv, c) =>
            {
                int fetches = 0;
                Func<Lease, ValueTuple<byte[], TimeSpan>> fetch = l => { fetches++; throw new MissingUserException(); };
                var e = Assert.Throws<MissingUserException>(() => c.Get("u", fetch), "fetch's own exception");
                Assert.Equal("no such user", e.Message, "message");
                Assert.Equal(1, fetches, "fetches");
                long pttl = (long)srv.Call("PTTL", "t/lock-notfound:u");
                Assert.True(pttl > 4000 && pttl <= 5000, "marker PTTL " + pttl);
                Assert.Equal("", S((byte[])srv.Call("GET", "t/lock-notfound:u")), "marker is empty");
                Assert.True(!Exists(srv, "t/lock:u", "t:u", "t/lock-stale:u"), "lock, value and stale copy gone");
                Assert.Throws<NotFoundException>(() => c.Get("u", fetch), "cached");
                Assert.Equal(1, fetches, "fetch not called again");
            }, TimeSpan.FromSeconds(5));
        }

        [Test]
        static void NotFound_WithoutNegTtlNothingIsRecorded()
        {
            With((srv, c) =>
            {
                int fetches = 0;
                Func<Lease, ValueTuple<byte[], TimeSpan>> fetch = l =>
                {
                    if (++fetches == 1) throw new NotFoundException("not yet");
                    return (B("now it exists"), TimeSpan.Zero);
                };
                Assert.Throws<NotFoundException>(() => c.Get("n", fetch), "first");
                Assert.True(!Exists(srv, "t/lock-notfound:n", "t/lock:n", "t:n"), "no marker, no lock, no value");
                Assert.Equal("now it exists", S(c.Get("n", fetch)), "fetch runs again");
                Assert.Equal(2, fetches, "fetches");
            });
        }

        [Test]
        static void NotFound_ScriptFailureReleasesWithAbandon()
        {
            using (var srv = new RedisServer())
            using (var t = new NotFoundFailingTransport(srv.Url()))
            using (var c = new MemoLock(t, "t", TimeSpan.FromSeconds(30), negTtl: TimeSpan.FromSeconds(5)))
            using (var sub = srv.Transport().OpenPubSub())
            {
                t.FailNotFound = true;
                sub.Subscribe(B("t/lock-event:x"));
                Assert.Equal("subscribe", sub.Receive(5000).Kind, "subscribed");
                string token = null;
                Assert.Throws<NotFoundException>(() => c.Get("x", l => { token = l.Token; throw new NotFoundException("gone"); }), "not found");
                Assert.True(!Exists(srv, "t/lock:x", "t/lock-notfound:x"), "lock released, nothing recorded");
                var m = sub.Receive(5000);
                Assert.True(m != null && m.Kind == "message", "an event");
                Assert.Equal("abandon\n" + token + "\n", S(m.Payload), "abandon event");
            }
        }

        [Test]
        static void Store_DeletesTheMarkerAndTheStaleCopy()
        {
            With((srv, c) =>
            {
                var v = c.Get("s", l =>
                {
                    // Written while we hold the lock (by another writer, say).
                    srv.Call("SET", "t/lock-notfound:s", "", "PX", "60000");
                    srv.Call("SET", "t/lock-stale:s", "old copy", "PX", "60000");
                    return (B("fresh"), TimeSpan.FromMinutes(1));
                });
                Assert.Equal("fresh", S(v), "value");
                Assert.Equal("fresh", S((byte[])srv.Call("GET", "t:s")), "stored");
                Assert.True(!Exists(srv, "t/lock-notfound:s", "t/lock-stale:s"), "marker and stale copy gone");
            }, TimeSpan.FromSeconds(5));
        }

        [Test]
        static void Events_NotFoundFailsTheWaiterPromptly()
        {
            With((srv, c, spy) =>
            {
                srv.Call("SET", "t/lock:w", Holder, "PX", "30000");
                var sw = Stopwatch.StartNew();
                var box = new object[2];
                var th = Start(() => c.Get("w", Never), box);
                spy.AwaitWaiting();
                srv.Call("PUBLISH", "t/lock-event:w", Tokens.Event(Tokens.EventNotFound, Holder));
                Assert.True(th.Join(TimeSpan.FromSeconds(Prompt)), "the waiter returned promptly");
                Assert.True(sw.Elapsed.TotalSeconds < Prompt, "within " + Prompt + "s: " + sw.Elapsed);
                Assert.True(box[1] is NotFoundException, "NotFoundException, got " + (box[1] ?? S((byte[])box[0])));
            }, lockTtl: TimeSpan.FromSeconds(30));
        }

        /// <summary>A notfound event about another holder is ignored: the waiter goes on to the value its own holder's abandon leads it to.</summary>
        [Test]
        static void Events_NotFoundOfAnotherHolderIsIgnored()
        {
            With((srv, c, spy) =>
            {
                srv.Call("SET", "t/lock:w", Holder, "PX", "30000");
                var box = new object[2];
                var th = Start(() => c.Get("w", Never), box);
                spy.AwaitWaiting();
                srv.Call("PUBLISH", "t/lock-event:w", "notfound\nsomebody-else\n");
                srv.Call("SET", "t:w", "put there"); // no notification: only the abandon below makes it look
                srv.Call("PUBLISH", "t/lock-event:w", Tokens.AbandonEvent(Holder));
                Assert.True(th.Join(TimeSpan.FromSeconds(Prompt)), "the waiter returned promptly");
                Assert.Equal("put there", S(box[0] as byte[]), "value (error: " + box[1] + ")");
            }, lockTtl: TimeSpan.FromSeconds(30));
        }

        /// <summary>[L4], while waiting on another holder: its notfound event was lost (here its lock went with an abandon), and the lookup finds the marker: "not found", no fetch, no lock taken.</summary>
        [Test]
        static void Events_WaiterThatFindsTheMarkerAfterAnAbandonEndsNotFound()
        {
            With((srv, c, spy) =>
            {
                srv.Call("SET", "t/lock:w", Holder, "PX", "30000");
                var box = new object[2];
                var th = Start(() => c.Get("w", Never), box);
                spy.AwaitWaiting();
                srv.Call("DEL", "t/lock:w");
                srv.Call("SET", "t/lock-notfound:w", "", "PX", "10000");
                srv.Call("PUBLISH", "t/lock-event:w", Tokens.AbandonEvent(Holder));
                Assert.True(th.Join(TimeSpan.FromSeconds(Prompt)), "the waiter returned promptly");
                Assert.True(box[1] is NotFoundException, "NotFoundException, got " + (box[1] ?? S((byte[])box[0])));
                Assert.True(!Exists(srv, "t/lock:w"), "no lock taken");
            }, lockTtl: TimeSpan.FromSeconds(30));
        }

        [Test]
        static void Events_StaleAndUnknownKindsMakeTheWaiterLookAgain()
        {
            foreach (var payload in new[] { "stale\n" + Holder + "\n", "future-kind\n" + Holder + "\nwhatever" })
                With((srv, c, spy) =>
                {
                    srv.Call("SET", "t/lock:v", Holder, "PX", "30000");
                    var sw = Stopwatch.StartNew();
                    var box = new object[2];
                    var th = Start(() => c.Get("v", Never), box);
                    spy.AwaitWaiting();
                    srv.Call("SET", "t:v", "put back"); // no notification: only the event makes it look
                    Thread.Sleep(300); // a window in which nothing may make it look again
                    Assert.Equal(2, Volatile.Read(ref spy.Lookups), "lookups before the event");
                    srv.Call("PUBLISH", "t/lock-event:v", payload);
                    Assert.True(th.Join(TimeSpan.FromSeconds(Prompt)), "the waiter returned promptly after " + payload.Split('\n')[0]);
                    Assert.True(sw.Elapsed.TotalSeconds < Prompt, "within " + Prompt + "s: " + sw.Elapsed);
                    Assert.Equal("put back", S(box[0] as byte[]), payload.Split('\n')[0] + ": value (error: " + box[1] + ")");
                }, lockTtl: TimeSpan.FromSeconds(30));
        }

        [Test]
        static void NotFound_ReachesWaitersInOtherClients()
        {
            using (var srv = new RedisServer())
            using (var t1 = srv.Transport())
            using (var t2 = new SpyTransport(srv.Url()))
            using (var holder = new MemoLock(t1, "t", TimeSpan.FromSeconds(30), negTtl: TimeSpan.FromSeconds(5)))
            using (var waiter = new MemoLock(t2, "t", TimeSpan.FromSeconds(30)))
            {
                var gate = new ManualResetEvent(false);
                var hbox = new object[2];
                var ht = Start(() => holder.Get("e", l => { gate.WaitOne(20000); throw new NotFoundException("nothing there"); }), hbox);
                Assert.Eventually(() => srv.Call("GET", "t/lock:e") != null, 20, "the holder's lock");
                var wbox = new object[2];
                var wt = Start(() => waiter.Get("e", Never), wbox);
                t2.AwaitWaiting();
                var sw = Stopwatch.StartNew();
                gate.Set();
                Assert.True(wt.Join(TimeSpan.FromSeconds(Prompt)) && ht.Join(TimeSpan.FromSeconds(Prompt)), "both returned promptly");
                Assert.True(sw.Elapsed.TotalSeconds < Prompt, "within " + Prompt + "s");
                Assert.True(hbox[1] is NotFoundException && ((Exception)hbox[1]).Message == "nothing there", "holder: fetch's exception, got " + hbox[1]);
                Assert.True(wbox[1] is NotFoundException, "waiter: NotFoundException, got " + (wbox[1] ?? S((byte[])wbox[0])));
            }
        }

        [Test(TimeoutSeconds = 90)]
        static void Run_NotFoundExitsOne()
        {
            using (var srv = new RedisServer())
            {
                srv.Call("SET", "cli/lock-notfound:c", "", "PX", "60000");
                var r = Cli.Run("run", "--redis", srv.UrlText, "--tag", "cli", "--id", "c", "--ttl", "1m", "--", "echo", "ran");
                Assert.Equal(1, r.Code, "exit status, as Go's: " + r);
                Assert.Equal(0, r.Stdout.Length, "no output: " + r);
                Assert.True(r.Stderr.Contains("not found"), "says not found: " + r);
            }
        }
    }
}
