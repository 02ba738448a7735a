// Tests that need no Redis: the scripts against internal/wire/scripts.go, the JSON
// codec, tokens, URLs and bad input.
using System;
using System.Collections.Generic;
using System.IO;
using System.Linq;
using System.Text;
using System.Text.RegularExpressions;
using MemoLockNet;

namespace MemoLockTests
{
    static class UnitTests
    {
        [Test]
        static void Scripts_AreByteForByteTheGoSource()
        {
            // The committed internal/wire/scripts.go (others may be editing the working
            // copy), or else the working copy (a protocol change not yet
            // committed, which vectors.json already pins by SHA-1); the file
            // itself where git is not available. Every script must match,
            // byte for byte, in one and the same version.
            string file = Path.Combine(Runner.Root, "..", "..", "internal", "wire", "scripts.go");
            var versions = new List<string>();
            string head = Git("show", "HEAD:internal/wire/scripts.go");
            if (head != null) versions.Add(head);
            if (File.Exists(file)) versions.Add(File.ReadAllText(file));
            Assert.True(versions.Count > 0, "internal/wire/scripts.go found");
            var scripts = new Dictionary<string, Script> { { "AcquireSrc", Scripts.Acquire }, { "StoreSrc", Scripts.Store }, { "ReleaseSrc", Scripts.Release }, { "RenewSrc", Scripts.Renew }, { "NotFoundSrc", Scripts.NotFound } };
            string why = null;
            foreach (var src in versions)
            {
                why = null;
                foreach (var kv in scripts)
                {
                    var m = Regex.Match(src, "const " + kv.Key + " = `([^`]*)`");
                    if (!m.Success) { why = kv.Key + " not found in internal/wire/scripts.go"; break; }
                    if (m.Groups[1].Value != kv.Value.Source) { why = kv.Key + " differs from internal/wire/scripts.go"; break; }
                }
                if (why == null) return;
            }
            throw new AssertionException(why + (versions.Count > 1 ? " (both the committed and the working copy)" : ""));
        }

        [Test]
        static void AcquireReply_DecodesEveryShape()
        {
            Assert.Equal(ReplyKind.Hit, AcquireReply.Decode(new byte[] { (byte)'1' }).Kind, "a bulk \"1\" is a value");
            Assert.Equal(ReplyKind.Locked, AcquireReply.Decode(1L).Kind, "integer 1");
            var r = AcquireReply.Decode(new object[] { 1234L });
            Assert.Equal(ReplyKind.NotFound, r.Kind, "{pttl}");
            Assert.Equal(1234L, r.Pttl, "{pttl}: the marker's PTTL");
            Assert.Equal(ReplyKind.NotFound, AcquireReply.Decode(new object[] { -1L }).Kind, "{-1}: a marker without TTL");
            foreach (long flag in new[] { 1L, 2L })
            {
                r = AcquireReply.Decode(new object[] { Encoding.UTF8.GetBytes("v"), flag });
                Assert.Equal(ReplyKind.Hit, r.Kind, "{value, " + flag + "} is a plain hit");
                Assert.Equal("v", Encoding.UTF8.GetString(r.Value), "{value, " + flag + "}: the value");
            }
            r = AcquireReply.Decode(new object[] { 500L, Encoding.UTF8.GetBytes("other@h:2"), Encoding.UTF8.GetBytes("stale copy") });
            Assert.Equal(ReplyKind.Busy, r.Kind, "busy with a stale copy");
            Assert.Equal("other@h:2", r.Holder, "busy holder");
            Assert.Equal(500L, r.Pttl, "busy PTTL");
            Assert.True(r.Value == null, "the stale copy is ignored");
            Assert.Equal(ReplyKind.Busy, AcquireReply.Decode(new object[] { 500L, Encoding.UTF8.GetBytes("o"), null }).Kind, "busy, no stale copy");
            foreach (var bad in new object[] { 0L, 2L, null, new object[0], new object[] { Encoding.UTF8.GetBytes("v") }, new object[] { Encoding.UTF8.GetBytes("v"), 3L }, new object[] { null, null } })
                Assert.Throws<RedisException>(() => AcquireReply.Decode(bad), "bad reply rejected");
        }

        static string Git(params string[] args)
        {
            try
            {
                var psi = new System.Diagnostics.ProcessStartInfo("git", "-C '" + Runner.Root + "' " + string.Join(" ", args))
                { UseShellExecute = false, RedirectStandardOutput = true, RedirectStandardError = true };
                using (var p = System.Diagnostics.Process.Start(psi))
                {
                    string o = p.StandardOutput.ReadToEnd();
                    p.StandardError.ReadToEnd();
                    p.WaitForExit();
                    return p.ExitCode == 0 && o != "" ? o : null;
                }
            }
            catch { return null; }
        }

        [Test]
        static void Json_MatchesGoOutputs()
        {
            // Checked against Go 1.26's encoding/json.
            var cases = new Dictionary<double, string>
            {
                { 1.5e-7, "1.5e-7" }, { 1e21, "1e+21" }, { 1e20, "100000000000000000000" }, { 123456789, "123456789" },
                { 0.1, "0.1" }, { 1e-6, "0.000001" }, { 1e-7, "1e-7" }, { 3.0, "3" }, { 1.7976931348623157e308, "1.7976931348623157e+308" },
                { 5e-324, "5e-324" }, { 0.000001234, "0.000001234" }, { 100, "100" }, { 12345678901234567890.0, "12345678901234567000" },
            };
            foreach (var kv in cases) Assert.Equal(kv.Value, GoJson.FormatFloat(kv.Key), "float " + kv.Value);
            Assert.Equal("-0", GoJson.FormatFloat(-0.0), "negative zero");
            var obj = GoJson.Parse("{\"b\":\"<>&\\u2028\\u2029\\u0000\\u0001\\b\\f\\n\\r\\t\\u007f\\\"\\\\é😀\",\"a\":[null,true,1.0]}");
            Assert.Equal("{\"a\":[null,true,1],\"b\":\"\\u003c\\u003e\\u0026\\u2028\\u2029\\u0000\\u0001\\b\\f\\n\\r\\t\u007f\\\"\\\\é😀\"}",
                Encoding.UTF8.GetString(GoJson.Encode(obj)), "object");
        }

        [Test]
        static void Tokens_AreHexAtHostPid()
        {
            string t = Tokens.New();
            Assert.True(Regex.IsMatch(t, "^[0-9a-f]{32}@[A-Za-z0-9._-]+:[0-9]+$"), "token format: " + t);
            Assert.True(t != Tokens.New(), "tokens differ");
            Assert.Equal("@unknown:7", Tokens.HolderSuffix("", 7), "empty host");
        }

        [Test]
        static void Urls_ParseAndRedact()
        {
            var u = RedisUrl.Parse("redis://user:s3cret@example.com:6380/2");
            Assert.Equal("example.com", u.Host, "host");
            Assert.Equal(6380, u.Port, "port");
            Assert.Equal(2, u.Db, "db");
            Assert.Equal("user", u.User, "user");
            Assert.Equal("s3cret", u.Password, "password");
            Assert.Equal("s3cret", RedisUrl.Parse("redis://s3cret@h").Password, "redis-cli password form");
            Assert.Equal("/tmp/r.sock", RedisUrl.Parse("unix:///tmp/r.sock?db=3").UnixPath, "unix path");
            foreach (var raw in new[] { "redis://user:s3cret@example.com:6380/2", "redis://s3cret@h", "redis://h/?password=s3cret", "unix://:s3cret@/tmp/x.sock", "s3cret", "user:s3cret@host" })
            {
                string r = RedisUrl.Redact(raw);
                Assert.True(!r.Contains("s3cret"), "redacted " + r);
            }
            Assert.Throws<ArgumentException>(() => RedisUrl.Parse("rediss://h"), "TLS is refused");
            var e = Assert.Throws<ArgumentException>(() => RedisUrl.Parse("user:s3cret@host"), "no scheme");
            Assert.True(!e.Message.Contains("s3cret"), "error withholds the URL");
        }

        [Test]
        static void BadInput_IsRejectedWithClearErrors()
        {
            using (var t = new RespTransport(RedisUrl.Parse("redis://127.0.0.1:1")))
            {
                Assert.True(Assert.Throws<ArgumentException>(() => new MemoLock(t, ""), "empty tag").Message.Contains("empty"), "message names the empty tag");
                Assert.True(Assert.Throws<ArgumentException>(() => new MemoLock(t, "a/lock"), "tag with /lock").Message.Contains("/lock"), "message names /lock");
                Assert.True(Assert.Throws<ArgumentException>(() => new MemoLock(t, "x/notify"), "tag with /notif").Message.Contains("/notif"), "message names /notif");
                Assert.Throws<ArgumentNullException>(() => new MemoLock(t, null), "null tag");
                Assert.Throws<ArgumentNullException>(() => new MemoLock(null, "t"), "null transport");
                Assert.Throws<ArgumentOutOfRangeException>(() => new MemoLock(t, "t", TimeSpan.FromTicks(5000)), "lock TTL under 1 ms");
                Assert.Throws<ArgumentOutOfRangeException>(() => new MemoLock(t, "t", negTtl: TimeSpan.FromSeconds(-1)), "negative NegTtl");
                Assert.Throws<ArgumentOutOfRangeException>(() => new MemoLock(t, "t", negTtl: TimeSpan.FromTicks(5000)), "NegTtl under 1 ms");
                using (var c = new MemoLock(t, "t", negTtl: TimeSpan.FromTicks(15007000))) Assert.Equal(TimeSpan.FromMilliseconds(1500), c.NegTtl, "NegTtl in whole ms");
                using (var c = new MemoLock(t, "t")) Assert.Equal(TimeSpan.Zero, c.NegTtl, "NegTtl defaults to zero");
                using (var c = new MemoLock(t, "t"))
                {
                    Assert.Throws<ArgumentNullException>(() => c.Get("x", null), "null fetch");
                    Assert.Throws<ArgumentNullException>(() => c.Get((string)null, l => (new byte[0], TimeSpan.Zero)), "null id");
                    Assert.Throws<ArgumentOutOfRangeException>(() => c.Get("x", l => (new byte[0], TimeSpan.Zero), TimeSpan.FromSeconds(-1)), "negative timeout");
                }
            }
        }

        [System.Runtime.InteropServices.DllImport("libc", EntryPoint = "kill")]
        static extern int SysKill(int pid, int sig);

        /// <summary>
        /// A signal that comes between two of Mono's WaitAny calls, when no
        /// pipe is set up to report it, still reaches the CLI. The hook runs in
        /// that window: it sends SIGTERM and returns only once the native
        /// handler has counted it there.
        /// </summary>
        [Test(TimeoutSeconds = 30)]
        static void Signals_ASignalBetweenTwoWaitsIsNotLost()
        {
            var sig = new MemoLockCli.Signals();
            int sent = 0;
            sig.AfterWait = () =>
            {
                if (System.Threading.Interlocked.Exchange(ref sent, 1) != 0) return;
                SysKill(System.Diagnostics.Process.GetCurrentProcess().Id, 15);
                var sw = System.Diagnostics.Stopwatch.StartNew();
                while (sig.Count(15) == 0 && sw.ElapsedMilliseconds < 5000) System.Threading.Thread.Sleep(1);
            };
            Assert.True(sig.Start(), "the signal handlers are installed");
            try
            {
                Assert.True(sig.First.WaitOne(5000), "the SIGTERM counted between two waits was seen within 5 s");
                Assert.Equal(15, sig.Caught, "the signal caught");
                Assert.Equal(1, sig.Count(15), "counted once");
                Assert.True(!sig.Second.WaitOne(0), "one signal, seen once");
            }
            finally { sig.Uninstall(); }
        }
    }
}
