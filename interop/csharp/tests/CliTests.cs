// memolock.exe run, as separate processes against a real redis-server.
using System;
using System.Collections.Generic;
using System.Diagnostics;
using System.IO;
using System.Linq;
using System.Text;
using System.Threading;
using MemoLockNet;

namespace MemoLockTests
{
    static class CliTests
    {
        static string[] Run(RedisServer srv, string id, params string[] rest)
        {
            var a = new List<string> { "run", "--redis", srv.UrlText, "--tag", "cli", "--id", id };
            a.AddRange(rest);
            return a.ToArray();
        }

        static string Tmp(string name) { return Path.Combine(Path.GetTempPath(), "memolock-cs-" + Guid.NewGuid().ToString("N").Substring(0, 8) + "-" + name); }

        static List<int> Descendants(int root) { return Cli.Descendants(root); }

        [Test(TimeoutSeconds = 90)]
        static void Run_StampedeRunsTheCommandOnceAndPrintsTheSameBytes()
        {
            using (var srv = new RedisServer())
            {
                string count = Tmp("count"), go = Tmp("go");
                // Binary output, NUL and invalid UTF-8 included. The command
                // ends only once the test has seen the four others wait, however
                // slowly their runtimes start.
                string script = "echo run >> " + count + "; while [ ! -e " + go + " ]; do sleep 0.05; done; printf 'line1\\n\\000\\377\\376 end'";
                var procs = Enumerable.Range(0, 5).Select(_ => new Cli(Run(srv, "stampede", "--ttl", "1m", "--", "sh", "-c", script))).ToList();
                Assert.Eventually(() => (long)((object[])srv.Call("PUBSUB", "NUMSUB", "cli/lock-event:stampede"))[1] == 4, 60, "four invocations waiting");
                File.WriteAllText(go, "x");
                var results = procs.Select(p => p.Wait()).ToList();
                File.Delete(go);
                procs.ForEach(p => p.Dispose());
                var want = new byte[] { (byte)'l', (byte)'i', (byte)'n', (byte)'e', (byte)'1', 10, 0, 0xff, 0xfe, (byte)' ', (byte)'e', (byte)'n', (byte)'d' };
                foreach (var r in results)
                {
                    Assert.Equal(0, r.Code, "exit code: " + r);
                    Assert.Bytes(want, r.Stdout, "stdout");
                }
                Assert.Equal(1, File.ReadAllLines(count).Length, "command runs");
                Assert.True(results.Any(r => r.Stderr.Contains("memolock run: waiting for cli:stampede, computed by ")), "waiters say on whom they wait: " + string.Join("|", results.Select(r => r.Stderr)));
                File.Delete(count);
                var hit = Cli.Run(Run(srv, "stampede", "--ttl", "1m", "--", "false"));
                Assert.Equal(0, hit.Code, "hit: " + hit);
                Assert.Bytes(want, hit.Stdout, "cached stdout");
            }
        }

        [Test(TimeoutSeconds = 90)]
        static void Run_FailingHolderPassesItsStatusAndWaitersFailAtOnce()
        {
            // The holder fails only once the waiter listens for holder events, so
            // a slow runtime start cannot make the waiter find the lock already
            // free and run the command itself.
            var go = Path.Combine(Path.GetTempPath(), "memolock-go-" + Guid.NewGuid().ToString("N"));
            using (var srv = new RedisServer())
            using (var holder = new Cli(Run(srv, "fail", "--ttl", "1m", "--lock-ttl", "60s", "--", "sh", "-c",
                "while [ ! -e '" + go + "' ]; do sleep 0.05; done; echo partial; echo oops >&2; exit 7")))
            {
                try
                {
                    Assert.Eventually(() => srv.Call("GET", "cli/lock:fail") != null, 20, "the holder took the lock");
                    using (var waiter = new Cli(Run(srv, "fail", "--ttl", "1m", "--lock-ttl", "60s", "--", "echo", "never")))
                    {
                        Assert.Eventually(() => (long)((object[])srv.Call("PUBSUB", "NUMSUB", "cli/lock-event:fail"))[1] >= 1, 20, "the waiter listens for holder events");
                        File.WriteAllText(go, "x");
                        var w = waiter.Wait();
                        var h = holder.Wait();
                        Assert.Equal(7, h.Code, "holder's exit: " + h);
                        Assert.Equal("partial\n", Encoding.UTF8.GetString(h.Stdout), "holder passes the output through");
                        Assert.Equal(1, w.Code, "waiter's exit: " + w);
                        Assert.True(w.Stderr.Contains("command exited with status 7"), "waiter reports the holder's error: " + w.Stderr);
                        Assert.True(w.Seconds < 20, "waiter failed at once, not after the lock TTL");
                        Assert.Equal(null, srv.Call("GET", "cli:fail"), "nothing cached");
                    }
                }
                finally { File.Delete(go); }
            }
        }

        [Test(TimeoutSeconds = 90)]
        static void Run_TakesOverAfterTheHolderIsKilled()
        {
            using (var srv = new RedisServer())
            using (var holder = new Cli(Run(srv, "kill", "--ttl", "1m", "--lock-ttl", "1s", "--", "sh", "-c", "sleep 30; echo first")))
            {
                Assert.Eventually(() => srv.Call("GET", "cli/lock:kill") != null, 20, "the holder took the lock");
                using (var waiter = new Cli(Run(srv, "kill", "--ttl", "1m", "--lock-ttl", "1s", "--", "echo", "second")))
                {
                    Assert.Eventually(() => waiter.StderrSoFar.Contains("waiting for"), 20, "the waiter waits");
                    var sw = Stopwatch.StartNew();
                    Assert.Eventually(() => Descendants(holder.Proc.Id).Count >= 2, 20, "the holder's command (sh and sleep) runs");
                    var orphans = Descendants(holder.Proc.Id);
                    holder.Proc.Kill(); // SIGKILL: no release, the lock must expire
                    foreach (var pid in orphans) { try { Process.GetProcessById(pid).Kill(); } catch { } } // its command, left behind
                    var r = waiter.Wait();
                    Assert.Equal(0, r.Code, "waiter: " + r);
                    Assert.Equal("second\n", Encoding.UTF8.GetString(r.Stdout), "the waiter ran the command itself");
                    Assert.True(sw.Elapsed.TotalSeconds < 15, "took over soon after the 1 s lock expired: " + sw.Elapsed);
                }
            }
        }

        [Test(TimeoutSeconds = 90)]
        static void Run_SigtermStopsTheCommandAndHandsTheLockOver()
        {
            // A 60 s lock: only the abandon event can make the waiter take over within 20 s.
            using (var srv = new RedisServer())
            using (var holder = new Cli(Run(srv, "term", "--ttl", "1m", "--lock-ttl", "60s", "--", "sh", "-c", "sleep 30; echo first")))
            {
                Assert.Eventually(() => srv.Call("GET", "cli/lock:term") != null, 20, "the holder took the lock");
                using (var waiter = new Cli(Run(srv, "term", "--ttl", "1m", "--lock-ttl", "60s", "--", "echo", "second")))
                {
                    Assert.Eventually(() => waiter.StderrSoFar.Contains("waiting for"), 20, "the waiter waits");
                    var sw = Stopwatch.StartNew();
                    Process.Start("kill", "-TERM " + holder.Proc.Id).WaitForExit();
                    var h = holder.Wait();
                    Assert.Equal(143, h.Code, "holder interrupted by SIGTERM: " + h);
                    var r = waiter.Wait();
                    Assert.Equal(0, r.Code, "waiter: " + r);
                    Assert.Equal("second\n", Encoding.UTF8.GetString(r.Stdout), "the waiter took over");
                    Assert.True(sw.Elapsed.TotalSeconds < 20, "at once, not after the 60 s lock TTL: " + sw.Elapsed);
                }
            }
        }

        [Test(TimeoutSeconds = 60)]
        static void Run_SigintInterruptsAWaiterWith130()
        {
            using (var srv = new RedisServer())
            {
                srv.Call("SET", "cli/lock:int", "someone", "PX", "60000");
                using (var waiter = new Cli(Run(srv, "int", "--ttl", "1m", "--", "echo", "x")))
                {
                    Assert.Eventually(() => waiter.StderrSoFar.Contains("computed by someone"), 20, "the waiter waits");
                    Process.Start("kill", "-INT " + waiter.Proc.Id).WaitForExit();
                    var r = waiter.Wait();
                    Assert.Equal(130, r.Code, "exit: " + r);
                    Assert.Equal("someone", S((byte[])srv.Call("GET", "cli/lock:int")), "somebody else's lock untouched");
                }
            }
        }

        static string S(byte[] b) { return b == null ? null : Encoding.UTF8.GetString(b); }

        [Test(TimeoutSeconds = 60)]
        static void Run_WaitLimitExits124()
        {
            using (var srv = new RedisServer())
            {
                srv.Call("SET", "cli/lock:w", "someone", "PX", "60000");
                var r = Cli.Run(Run(srv, "w", "--ttl", "1m", "--wait", "500ms", "--", "echo", "x"));
                Assert.Equal(124, r.Code, "exit: " + r);
                Assert.True(r.Stderr.Contains("memolock run: gave up waiting for cli:w after ") && r.Stderr.Contains("(--wait 500ms): someone computes it, and has not finished"), "message: " + r.Stderr);
            }
        }

        [Test(TimeoutSeconds = 60)]
        static void Run_ExitCodesForCommandsThatCannotRun()
        {
            using (var srv = new RedisServer())
            {
                string noexec = Tmp("noexec");
                File.WriteAllText(noexec, "echo hi\n"); // not executable
                string noshebang = Tmp("noshebang");
                File.WriteAllText(noshebang, "echo from sh\n");
                Process.Start("chmod", "+x " + noshebang).WaitForExit();
                try
                {
                    var r = Cli.Run(Run(srv, "nf", "--ttl", "1m", "--", "no-such-command-xyz"));
                    Assert.Equal(127, r.Code, "not found: " + r);
                    r = Cli.Run(Run(srv, "ne", "--ttl", "1m", "--", noexec));
                    Assert.Equal(126, r.Code, "not executable: " + r);
                    r = Cli.Run(Run(srv, "sh", "--ttl", "1m", "--", noshebang));
                    Assert.Equal(0, r.Code, "no #!: " + r);
                    Assert.Equal("from sh\n", Encoding.UTF8.GetString(r.Stdout), "ran with /bin/sh");
                    r = Cli.Run(Run(srv, "sig", "--ttl", "1m", "--", "sh", "-c", "kill -9 $$"));
                    Assert.Equal(137, r.Code, "killed by SIGKILL: " + r);
                }
                finally { File.Delete(noexec); File.Delete(noshebang); }
            }
        }

        [Test(TimeoutSeconds = 60)]
        static void Run_BadUsageExits2AndNeverPrintsThePassword()
        {
            var cases = new[]
            {
                new[] { "run", "--tag", "t", "--ttl", "1s", "--", "true" },                       // no --id
                new[] { "run", "--tag", "t", "--id", "i", "--", "true" },                         // no --ttl
                new[] { "run", "--tag", "t", "--id", "i", "--ttl", "10", "--", "true" },          // no unit
                new[] { "run", "--tag", "t", "--id", "i", "--ttl", "-1s", "--", "true" },         // negative
                new[] { "run", "--tag", "t", "--id", "i", "--ttl", "1s" },                        // no command
                new[] { "run", "--tag", "a/lock", "--id", "i", "--ttl", "1s", "--", "true" },    // bad tag
                new[] { "run", "--bogus", "--tag", "t", "--id", "i", "--ttl", "1s", "--", "true" },
                new[] { "run", "--redis", "user:s3cret@host", "--tag", "t", "--id", "i", "--ttl", "1s", "--", "true" },
                new[] { "frobnicate" },
            };
            foreach (var c in cases)
            {
                var r = Cli.Run(c);
                Assert.Equal(2, r.Code, string.Join(" ", c) + ": " + r);
                Assert.True(!r.Stderr.Contains("s3cret"), "password printed: " + r.Stderr);
            }
            // Unreachable Redis: exit 1, URL redacted.
            var u = Cli.Run("run", "--redis", "redis://:s3cret@127.0.0.1:1", "--tag", "t", "--id", "i", "--ttl", "1s", "--", "true");
            Assert.Equal(1, u.Code, "unreachable: " + u);
            Assert.True(!u.Stderr.Contains("s3cret") && u.Stderr.Contains("xxxxx@127.0.0.1:1"), "redacted: " + u.Stderr);
        }
    
        /// <summary>
        /// A command that ignores SIGTERM: a second signal sends SIGKILL at
        /// once, without the grace. The grace is stretched to 30 s here
        /// (MEMOLOCK_KILL_GRACE), so that "at once" has a wide margin.
        /// </summary>
        [Test(TimeoutSeconds = 90)]
        static void Run_SecondSignalKillsAtOnce()
        {
            string started = Tmp("started"), termed = Tmp("termed");
            var env = new Dictionary<string, string> { { "MEMOLOCK_KILL_GRACE", "30s" } };
            // The command shrugs SIGTERM off, noting that it came.
            string script = "trap 'touch " + termed + "' TERM; touch " + started + "; while :; do sleep 0.05; done";
            using (var srv = new RedisServer())
            using (var holder = new Cli(env, Run(srv, "stubborn", "--ttl", "1m", "--", "sh", "-c", script)))
            {
                Assert.Eventually(() => File.Exists(started), 20, "the command runs");
                var below = Descendants(holder.Proc.Id);
                Process.Start("kill", "-TERM " + holder.Proc.Id).WaitForExit();
                Assert.Eventually(() => File.Exists(termed), 20, "the command got SIGTERM");
                Assert.True(!holder.Proc.HasExited, "the command ignores SIGTERM: memolock waits out the grace");
                var sw = Stopwatch.StartNew();
                Process.Start("kill", "-TERM " + holder.Proc.Id).WaitForExit();
                var h = holder.Wait(60);
                Assert.True(sw.Elapsed.TotalSeconds < 15, "killed at the second signal, long before the 30 s grace: " + sw.Elapsed);
                Assert.Equal(143, h.Code, "exit: " + h);
                Assert.Equal(0, h.Stdout.Length, "no output");
                Assert.Eventually(() => below.All(pid => { try { return File.ReadAllText("/proc/" + pid + "/stat").Split(')').Last().Trim()[0] == 'Z'; } catch { return true; } }), 2, "the command's processes are gone");
                Assert.Equal(null, srv.Call("GET", "cli/lock:stubborn"), "lock released");
            }
            File.Delete(started);
            File.Delete(termed);
        }

        static readonly byte[] RawId = { 0xff, 0xfe, 0xc3, (byte)'(', (byte)'-', 0x80 }; // $'\xff\xfe\xc3(-\x80': not UTF-8

        static byte[] Key(string prefix, byte[] id) { return Bytes.Concat(Encoding.UTF8.GetBytes(prefix), id); }

        /// <summary>
        /// An id that is not UTF-8 reaches Redis byte for byte through the
        /// launcher, as Go's CLI sends its raw argv; --id-hex and --id-base64
        /// name the same key. The command gets its own argv bytes, the
        /// caller's environment (UTF-8 values and MONO_EXTERNAL_ENCODINGS) as it was.
        /// </summary>
        [Test(TimeoutSeconds = 90)]
        static void Run_IdIsTheArgumentsRawBytes()
        {
            using (var srv = new RedisServer())
            {
                string url = srv.UrlText;
                var env = new Dictionary<string, string> { { "X", "caf\u00e9" }, { "MONO_EXTERNAL_ENCODINGS", null } };
                var r = Cli.Shell("exec \"$MEMOLOCK\" run --redis " + url + " --tag cli --id \"$(printf '\\377\\376\\303(-\\200')\" --ttl 1m -- " +
                    "sh -c 'printf \"%s|%s|%s\" \"${MONO_EXTERNAL_ENCODINGS-unset}\" \"$X\" \"$1\"' sh \"$(printf '\\377\\001')\"", env);
                Assert.Equal(0, r.Code, "raw id: " + r);
                var want = Bytes.Concat(Encoding.UTF8.GetBytes("unset|caf\u00e9|"), new byte[] { 0xff, 1 });
                Assert.Bytes(want, r.Stdout, "the command's argv and environment, byte for byte");
                Assert.Bytes(want, (byte[])srv.Call("GET", Key("cli:", RawId)), "stored under the id's own bytes");

                foreach (var flag in new[] { new[] { "--id-hex", "FFfec3282D80" }, new[] { "--id-base64", "//7DKC2A" } })
                {
                    var h = Cli.Run("run", "--redis", url, "--tag", "cli", flag[0], flag[1], "--ttl", "1m", "--", "false");
                    Assert.Equal(0, h.Code, flag[0] + ": " + h);
                    Assert.Bytes(want, h.Stdout, flag[0] + " names the same key: a hit");
                }
                // Padding is optional; a UTF-8 id through the launcher is its UTF-8 bytes, not twice encoded.
                Assert.Equal(0, Cli.Run("run", "--redis", url, "--tag", "cli", "--id", "h\u00e9", "--ttl", "1m", "--", "printf", "first").Code, "--id h\u00e9");
                foreach (var flag in new[] { new[] { "--id-hex", "68c3a9" }, new[] { "--id-hex", "68C3A9" }, new[] { "--id-base64", "aMOp" } })
                {
                    var h = Cli.Run("run", "--redis", url, "--tag", "cli", flag[0], flag[1], "--ttl", "1m", "--", "false");
                    Assert.Equal("first", Encoding.UTF8.GetString(h.Stdout), flag[0] + " " + flag[1] + ": " + h);
                }
                Assert.Equal(0, Cli.Run("run", "--redis", url, "--tag", "cli", "--id-base64", "aGk=", "--ttl", "1m", "--", "printf", "hi").Code, "padded");
                Assert.Equal("hi", Encoding.UTF8.GetString(Cli.Run("run", "--redis", url, "--tag", "cli", "--id-base64", "aGk", "--ttl", "1m", "--", "false").Stdout), "unpadded, same id");
                Assert.Equal("hi", Encoding.UTF8.GetString((byte[])srv.Call("GET", "cli:hi")), "--id-base64 aGk= is the id \"hi\"");

                // The caller's own MONO_EXTERNAL_ENCODINGS comes back for the command.
                env["MONO_EXTERNAL_ENCODINGS"] = "UTF-8";
                r = Cli.Shell("exec \"$MEMOLOCK\" run --redis " + url + " --tag cli --id menc --ttl 1m -- sh -c 'printf %s \"$MONO_EXTERNAL_ENCODINGS\"'", env);
                Assert.Equal("UTF-8", Encoding.UTF8.GetString(r.Stdout), "the caller's setting: " + r);

                // A variable Mono cannot read (not UTF-8) reaches the command as
                // its bytes, and the launcher's latin1 setting does not.
                r = Cli.Shell("BAD=\"$(printf '\\377')\" exec \"$MEMOLOCK\" run --redis " + url + " --tag cli --id badenv --ttl 1m -- sh -c 'printf %s \"$BAD\" \"${MONO_EXTERNAL_ENCODINGS-unset}\"'");
                Assert.Equal(0, r.Code, "an environment that is not UTF-8: " + r);
                Assert.Bytes(new byte[] { 0xff, (byte)'u', (byte)'n', (byte)'s', (byte)'e', (byte)'t' }, r.Stdout, "the variable reached the command, the launcher's did not");
                Assert.Equal("", r.Stderr, "nothing to say");

                // Without the launcher, mono decodes argv as UTF-8: the hex and base64 forms still reach any bytes.
                var m = Cli.RunMono("run", "--redis", url, "--tag", "cli", "--id-hex", "fffec3282d80", "--ttl", "1m", "--", "false");
                Assert.Bytes(want, m.Stdout, "mono memolock.exe --id-hex: " + m);
            }
        }

        /// <summary>Bad --id-hex / --id-base64 input, or more than one id flag: exit 2 with an error naming the flag.</summary>
        [Test(TimeoutSeconds = 60)]
        static void Run_IdFlagsRejectBadInput()
        {
            var cases = new[]
            {
                new[] { "--id-hex", "zz", "--id-hex \"zz\": 'z' at 0 is not a hex digit" },
                new[] { "--id-hex", "abc", "--id-hex \"abc\": odd length" },
                new[] { "--id-base64", "a", "--id-base64 \"a\": a length of 1" },
                new[] { "--id-base64", "ab=c", "--id-base64 \"ab=c\": '=' at 2" },
                new[] { "--id-base64", "-_-_", "--id-base64 \"-_-_\": '-' at 0 is not in the standard base64 alphabet" },
                new[] { "--id-base64", "aGk==", "--id-base64 \"aGk==\": wrong padding" },
                new[] { "--id-base64", "aGk=\n", "--id-base64 \"aGk=\\n\": '=' at 3" }, // quoted as Go quotes it
                new[] { "--id-hex", "", "--tag and --id (or --id-hex, --id-base64) are required" },
            };
            foreach (var c in cases)
            {
                var r = Cli.Run("run", "--redis", "redis://127.0.0.1:1", "--tag", "t", c[0], c[1], "--ttl", "1s", "--", "true");
                Assert.Equal(2, r.Code, c[0] + " " + c[1] + ": " + r);
                Assert.True(r.Stderr.Contains(c[2]), c[0] + " " + c[1] + ": want \"" + c[2] + "\" in " + r.Stderr);
            }
            var both = Cli.Run("run", "--redis", "redis://127.0.0.1:1", "--tag", "t", "--id", "x", "--id-hex", "78", "--ttl", "1s", "--", "true");
            Assert.Equal(2, both.Code, "--id and --id-hex: " + both);
            Assert.True(both.Stderr.Contains("give one of --id, --id-hex and --id-base64, not --id and --id-hex"), "message: " + both.Stderr);
            var tag = Cli.Shell("exec \"$MEMOLOCK\" run --redis redis://127.0.0.1:1 --tag \"$(printf 't\\377')\" --id i --ttl 1s -- true");
            Assert.Equal(2, tag.Code, "a tag that is not UTF-8: " + tag);
            Assert.True(tag.Stderr.Contains("memolock run: --tag \"t\ufffd\" is not valid UTF-8"), "message: " + tag.Stderr);
        }

        /// <summary>Go's flag syntax: "---x" and "--=x" are bad syntax; --lock-ttl 0 is the default, as in Go.</summary>
        [Test(TimeoutSeconds = 60)]
        static void Run_FlagSyntaxAsGo()
        {
            foreach (var bad in new[] { "---tag", "--=x", "-=x" })
            {
                var r = Cli.Run("run", bad, "--tag", "t", "--id", "i", "--ttl", "1s", "--redis", "redis://127.0.0.1:1", "--", "true");
                Assert.Equal(2, r.Code, bad + ": " + r);
                Assert.Equal("memolock run: bad flag syntax: " + bad + "\nRun 'memolock run --help' for usage.\n", r.Stderr, bad);
            }
            using (var srv = new RedisServer())
            {
                var r = Cli.Run(Run(srv, "lt0", "--ttl", "1m", "--lock-ttl", "0", "--", "echo", "ok"));
                Assert.Equal(0, r.Code, "--lock-ttl 0: " + r);
                Assert.Equal("ok\n", Encoding.UTF8.GetString(r.Stdout), "output");
                r = Cli.Run(Run(srv, "lt1", "--ttl", "1m", "--lock-ttl", "-1s", "--", "echo", "ok"));
                Assert.Equal(2, r.Code, "--lock-ttl -1s: " + r);
                Assert.True(!r.Stderr.Contains("Parameter name"), "one line: " + r.Stderr);
                r = Cli.Run(Run(srv, "lt2", "--ttl", "1m", "--lock-ttl", "2000h", "--wait", "800h", "--", "echo", "long"));
                Assert.Equal(0, r.Code, "long lock TTL and wait: " + r);
                Assert.Equal("long\n", Encoding.UTF8.GetString(r.Stdout), "output");
            }
        }
    }
}
