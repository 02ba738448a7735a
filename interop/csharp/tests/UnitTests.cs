// Tests that need no Redis: the scripts against protocol.go, the JSON
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
            // The committed protocol.go (others may be editing the working
            // copy); the file itself where git is not available.
            string src = Git("show", "HEAD:protocol.go") ?? File.ReadAllText(Path.Combine(Runner.Root, "..", "..", "protocol.go"));
            foreach (var kv in new Dictionary<string, Script> { { "acquireSrc", Scripts.Acquire }, { "storeSrc", Scripts.Store }, { "releaseSrc", Scripts.Release }, { "renewSrc", Scripts.Renew } })
            {
                var m = Regex.Match(src, "const " + kv.Key + " = `([^`]*)`");
                Assert.True(m.Success, kv.Key + " found in protocol.go");
                Assert.Equal(m.Groups[1].Value, kv.Value.Source, kv.Key);
            }
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
                using (var c = new MemoLock(t, "t"))
                {
                    Assert.Throws<ArgumentNullException>(() => c.Get("x", null), "null fetch");
                    Assert.Throws<ArgumentNullException>(() => c.Get((string)null, l => (new byte[0], TimeSpan.Zero)), "null id");
                    Assert.Throws<ArgumentOutOfRangeException>(() => c.Get("x", l => (new byte[0], TimeSpan.Zero), TimeSpan.FromSeconds(-1)), "negative timeout");
                }
            }
        }
    }
}
