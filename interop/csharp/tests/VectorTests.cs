// VectorTests: every entry of interop/vectors.json (../vectors.json from
// here), the machine-readable part of PROTOCOL.md generated from Go.
using System;
using System.Collections.Generic;
using System.IO;
using System.Linq;
using System.Reflection;
using System.Text;
using MemoLockNet;

namespace MemoLockTests
{
    static class VectorTests
    {
        static Dictionary<string, object> vectors;
        static Dictionary<string, object> Vectors()
        {
            if (vectors == null)
            {
                string path = Path.Combine(Runner.Root, "..", "vectors.json");
                Assert.True(File.Exists(path), "the test vectors at " + path + " exist");
                vectors = (Dictionary<string, object>)GoJson.Parse(File.ReadAllText(path, Encoding.UTF8));
            }
            return vectors;
        }
        static List<Dictionary<string, object>> List(string name) { return ((List<object>)Vectors()[name]).Cast<Dictionary<string, object>>().ToList(); }
        static byte[] B64(object s) { return Convert.FromBase64String((string)s); }

        static Dictionary<string, object> Section(string name) { return (Dictionary<string, object>)Vectors()[name]; }

        /// <summary>A JSON number (a double here) as a long, 2^63 - 1 included.</summary>
        static long Long(object n) { double d = Convert.ToDouble(n); return d >= (double)long.MaxValue ? long.MaxValue : (long)d; }

        /// <summary>
        /// Every script of vectors.json is its text with its final newline
        /// (PROTOCOL.md [S1]), whose SHA-1 the vector holds, and so is its
        /// sharded form ([Q1]); this peer's five scripts are those texts.
        /// </summary>
        [Test]
        static void Vectors_Scripts()
        {
            var s = Section("scripts");
            var ours = new Dictionary<string, Script> { { "acquire", Scripts.Acquire }, { "store", Scripts.Store }, { "release", Scripts.Release }, { "renew", Scripts.Renew }, { "not_found", Scripts.NotFound } };
            foreach (var kv in s)
            {
                var v = (Dictionary<string, object>)kv.Value;
                string src = (string)v["src"];
                Assert.True(src.EndsWith("\n") && !src.EndsWith("\n\n") && src == src.TrimStart(), kv.Key + ": the text ends with exactly one newline");
                Assert.Equal((string)v["sha1"], new Script(src).Sha1, kv.Key + " sha1 of its text");
                string sharded = src.Replace("redis.call('PUBLISH', ", "redis.call('SPUBLISH', ");
                if (sharded != src) Assert.Equal((string)v["sharded_sha1"], new Script(sharded).Sha1, kv.Key + " sha1 of its sharded text");
                else Assert.True(!v.ContainsKey("sharded_sha1"), kv.Key + " publishes nothing: no sharded form");
            }
            foreach (var kv in ours)
            {
                Assert.True(s.ContainsKey(kv.Key), "vectors.json has the " + kv.Key + " script");
                var v = (Dictionary<string, object>)s[kv.Key];
                Assert.Equal((string)v["src"], kv.Value.Source, kv.Key + " text");
                Assert.Equal((string)v["sha1"], kv.Value.Sha1, kv.Key + " sha1");
            }
            Assert.Equal(Convert.ToInt64(Vectors()["linger_ms"]), Scripts.LingerMs, "linger_ms");
            Assert.Equal(Convert.ToInt32(Vectors()["max_event_text"]), Tokens.MaxEventText, "max_event_text");
        }

        /// <summary>[S4]: this peer cannot send a duration over the limit (a TimeSpan is shorter).</summary>
        [Test]
        static void Vectors_Limits()
        {
            var lim = Section("limits");
            Assert.True((long)TimeSpan.MaxValue.TotalMilliseconds <= Long(lim["max_duration_ms"]), "the longest TimeSpan is within max_duration_ms");
            Assert.Equal(100L * 365 * 24 * 3600 * 1000, Long(lim["century_ms"]), "century_ms");
            Assert.Equal(1000L, Long(lim["max_spread_ms"]), "max_spread_ms");
        }

        /// <summary>
        /// [W7], [W9]: the random extra delay a waiter adds to pttl + 1 ms
        /// stays within the vectors' bounds (latest - earliest) and is drawn
        /// at random. (The rest of the timer, pttl + 1 ms, is computed inline
        /// in Wait.Busy, which no vector reaches.)
        /// </summary>
        [Test]
        static void Vectors_Timers()
        {
            var asm = typeof(MemoLock).Assembly;
            var engineType = asm.GetType("MemoLockNet.FlightEngine", true);
            var waitType = asm.GetType("MemoLockNet.Wait", true);
            var spread = waitType.GetMethod("Spread", BindingFlags.NonPublic | BindingFlags.Instance);
            Assert.True(spread != null, "Wait.Spread exists");
            foreach (var t in List("timers"))
            {
                long pttl = Long(t["pttl_ms"]), lockTtl = Long(t["lock_ttl_ms"]);
                if (pttl < 0) continue; // a lock without TTL: no spread
                var engine = Activator.CreateInstance(engineType, BindingFlags.Public | BindingFlags.Instance, null, new object[] { null, null, lockTtl, 0L, null }, null);
                var wait = Activator.CreateInstance(waitType, BindingFlags.Public | BindingFlags.Instance, null, new object[] { engine, null }, null);
                long widest = (Long(t["latest_us"]) - Long(t["earliest_us"])) / 1000; // ms
                long most = 0;
                for (int i = 0; i < 400; i++)
                {
                    long extra = (long)spread.Invoke(wait, new object[] { pttl });
                    Assert.True(extra >= 0 && extra <= widest, "pttl " + pttl + ": extra delay " + extra + " ms within [0, " + widest + "]");
                    most = Math.Max(most, extra);
                }
                if (widest >= 100) Assert.True(most > 0, "pttl " + pttl + ": the extra delay is drawn at random");
            }
        }

        /// <summary>
        /// [L5]: the lock TTL that acquire and renew get (FlightEngine.LockTtlMs),
        /// in whole ms, truncated; a lock TTL under 1 ms is refused, never sent
        /// as 0 or rounded up. No connection is made: a client dials lazily.
        /// </summary>
        [Test]
        static void Vectors_LockTtls()
        {
            var engineField = typeof(MemoLock).GetField("Engine", BindingFlags.NonPublic | BindingFlags.Instance);
            Assert.True(engineField != null, "MemoLock.Engine exists");
            int checkedCount = 0;
            foreach (var v in List("lock_ttls"))
            {
                long ns = Long(v["ns"]);
                string what = "lock TTL " + ns + " ns";
                using (var rdb = new RespTransport("redis://127.0.0.1:1"))
                {
                    MemoLock c = null;
                    try { c = new MemoLock(rdb, "t", TimeSpan.FromTicks(ns / 100)); }
                    catch (ArgumentException) { }
                    try
                    {
                        if (v["arg"] == null)
                        {
                            Assert.True(c == null, what + " is refused");
                            continue;
                        }
                        Assert.True(c != null, what + " is accepted");
                        var engine = engineField.GetValue(c);
                        var ms = (long)engine.GetType().GetField("LockTtlMs", BindingFlags.NonPublic | BindingFlags.Public | BindingFlags.Instance).GetValue(engine);
                        Assert.Equal((string)v["arg"], ms.ToString(System.Globalization.CultureInfo.InvariantCulture), what + ": the argument sent");
                    }
                    finally
                    {
                        if (c != null) c.Close();
                        checkedCount++;
                    }
                }
            }
            Assert.True(checkedCount >= 10, "lock_ttls entries checked: " + checkedCount);
        }

        /// <summary>
        /// [A1], [A2]: the CLI's reading of --id, --id-hex and --id-base64
        /// (MemoLockCli.Program.OneId in bin/memolock.exe). An --id that is
        /// not UTF-8 needs the launcher's latin1 argv: Run_IdIsTheArgumentsRawBytes.
        /// </summary>
        [Test]
        static void Vectors_CliIds()
        {
            var program = Assembly.LoadFrom(Cli.Exe).GetType("MemoLockCli.Program", true);
            var oneId = program.GetMethod("OneId", BindingFlags.NonPublic | BindingFlags.Static);
            Assert.True(oneId != null, "Program.OneId exists");
            var strict = new UTF8Encoding(false, true);
            int checkedCount = 0;
            foreach (var c in List("cli_ids"))
            {
                string flag = (string)c["flag"];
                byte[] raw = B64(c["arg_b64"]);
                string arg;
                try { arg = strict.GetString(raw); }
                catch (DecoderFallbackException) { continue; }
                string err = null;
                byte[] id = null;
                try { id = (byte[])oneId.Invoke(null, new object[] { new List<string[]> { new[] { flag.Substring(2), arg } } }); }
                catch (TargetInvocationException e) { err = e.InnerException.Message; }
                string what = flag + " " + Assert.Show(raw);
                if (c["id_b64"] == null)
                {
                    Assert.True(err != null, what + " is refused");
                    Assert.True(err.StartsWith(flag + " "), what + ": the error names the flag: " + err);
                }
                else
                {
                    Assert.True(err == null, what + " is accepted: " + err);
                    Assert.Bytes(B64(c["id_b64"]), id, what);
                }
                checkedCount++;
            }
            Assert.True(checkedCount >= 30, "cli_ids entries checked: " + checkedCount);
        }

        [Test]
        static void Vectors_Keys()
        {
            foreach (var k in List("keys"))
            {
                var ks = new KeyScheme((string)k["tag"]);
                byte[] id = B64(k["id_b64"]);
                if ((bool)k["hash_ids"]) id = KeyScheme.HashID(id);
                string n = (string)k["name"];
                Assert.Bytes(B64(k["value_b64"]), ks.Value(id), n + ": value key");
                Assert.Bytes(B64(k["lock_b64"]), ks.Lock(id), n + ": lock key");
                Assert.Bytes(B64(k["notif_b64"]), ks.Notif(id), n + ": notif channel");
                Assert.Bytes(B64(k["events_b64"]), ks.Events(id), n + ": events channel");
                Assert.Bytes(B64(k["not_found_b64"]), ks.NotFound(id), n + ": not-found marker key");
                Assert.Bytes(B64(k["stale_b64"]), ks.Stale(id), n + ": stale copy key");
                var four = ks.IdKeys(id);
                Assert.Equal(4, four.Length, n + ": IdKeys");
                Assert.Bytes(ks.Value(id), four[0], n + ": IdKeys[0]");
                Assert.Bytes(ks.Lock(id), four[1], n + ": IdKeys[1]");
                Assert.Bytes(ks.NotFound(id), four[2], n + ": IdKeys[2]");
                Assert.Bytes(ks.Stale(id), four[3], n + ": IdKeys[3]");
            }
            if (Vectors().ContainsKey("hashed_ids"))
                foreach (var h in List("hashed_ids"))
                    Assert.Equal((string)h["hashed"], Encoding.ASCII.GetString(KeyScheme.HashID(B64(h["id_b64"]))), "HashID");
        }

        [Test]
        static void Vectors_Tags()
        {
            foreach (var t in List("tags"))
            {
                string tag = (string)t["tag"];
                bool ok;
                try { new KeyScheme(tag); ok = true; } catch (ArgumentException) { ok = false; }
                Assert.Equal((bool)t["valid"], ok, "tag \"" + tag + "\" accepted");
            }
        }

        [Test]
        static void Vectors_Events()
        {
            var kinds = new HashSet<string>();
            foreach (var e in List("events"))
            {
                string token = (string)e["token"], kind = (string)e["kind"];
                kinds.Add(kind);
                byte[] got;
                if (kind == Tokens.EventFail) got = Tokens.FailEvent(token, B64(e["message_b64"]));
                else if (kind == Tokens.EventAbandon) got = Tokens.AbandonEvent(token);
                else
                {
                    Assert.True(kind == Tokens.EventNotFound || kind == Tokens.EventStale, "known event kind " + kind);
                    Assert.Equal(0, B64(e["message_b64"]).Length, (string)e["name"] + ": no message");
                    got = Tokens.Event(kind, token);
                }
                Assert.Bytes(B64(e["payload_b64"]), got, (string)e["name"]);
            }
            foreach (var k in new[] { "fail", "abandon", "notfound", "stale" }) Assert.True(kinds.Contains(k), "vectors have a " + k + " event");
        }

        [Test]
        static void Vectors_Parse()
        {
            foreach (var p in List("parse"))
            {
                string kind, token, text;
                byte[] payload = B64(p["payload_b64"]);
                Tokens.ParseEvent(payload, out kind, out token, out text);
                string what = "parse " + Assert.Show(payload);
                Assert.Equal((string)p["kind"], kind, what + ": kind");
                Assert.Equal((string)p["token"], token, what + ": token");
                // The message as bytes, which need not be UTF-8 ([EV3]); as text, decoded.
                Assert.Bytes(B64(p["text_b64"]), Tokens.EventMessage(payload), what + ": message bytes");
                Assert.Equal(Bytes.Utf8.GetString(B64(p["text_b64"])), text, what + ": message text");
            }
        }

        [Test]
        static void Vectors_Hosts()
        {
            foreach (var h in List("hosts"))
                Assert.Equal((string)h["suffix"], "@" + Tokens.SanitizeHost(B64(h["host_b64"])) + ":", "host suffix");
        }

        [Test]
        static void Vectors_Json()
        {
            foreach (var j in List("json"))
                Assert.Bytes(B64(j["encoded_b64"]), GoJson.Encode(j["value"]), "json " + j["name"]);
        }

        [Test]
        static void Vectors_Durations()
        {
            foreach (var d in List("durations"))
            {
                long ns;
                bool ok = GoDuration.TryParseNanos((string)d["text"], out ns);
                if (d["ms"] == null) Assert.True(!ok, "duration \"" + d["text"] + "\" is invalid");
                else
                {
                    Assert.True(ok, "duration \"" + d["text"] + "\" parses");
                    Assert.Equal(Convert.ToInt64(d["ms"]), ns / 1000000, "duration \"" + d["text"] + "\" in ms");
                    if (d.ContainsKey("ns")) Assert.Equal(Convert.ToInt64(d["ns"]), ns, "duration \"" + d["text"] + "\" in ns");
                }
            }
        }

    }
}
