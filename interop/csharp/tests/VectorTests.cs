// VectorTests: every entry of interop/vectors.json (../vectors.json from
// here), the machine-readable part of PROTOCOL.md generated from Go.
using System;
using System.Collections.Generic;
using System.IO;
using System.Linq;
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

        [Test]
        static void Vectors_Scripts()
        {
            var s = (Dictionary<string, object>)Vectors()["scripts"];
            var ours = new Dictionary<string, Script> { { "acquire", Scripts.Acquire }, { "store", Scripts.Store }, { "release", Scripts.Release }, { "renew", Scripts.Renew }, { "not_found", Scripts.NotFound } };
            Assert.Equal(string.Join(",", s.Keys.OrderBy(k => k, StringComparer.Ordinal)), string.Join(",", ours.Keys.OrderBy(k => k, StringComparer.Ordinal)), "the scripts in vectors.json");
            foreach (var kv in ours)
                Assert.Equal((string)((Dictionary<string, object>)s[kv.Key])["sha1"], kv.Value.Sha1, kv.Key + " sha1");
            Assert.Equal(Convert.ToInt64(Vectors()["linger_ms"]), Scripts.LingerMs, "linger_ms");
            Assert.Equal(Convert.ToInt32(Vectors()["max_event_text"]), Tokens.MaxEventText, "max_event_text");
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
                Assert.Bytes(B64(p["text_b64"]), Bytes.Utf8.GetBytes(text), what + ": text");
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
