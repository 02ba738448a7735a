// The Go CLI's conventions in the C# CLI (issue 16): help pages, the
// version, usage errors, error prefixes and Redis hints, the status line on
// a terminal and off it, and the fail texts waiters read ([A6]). Go's own
// tests of them: cmd/memolock/cli_test.go, status_linux_test.go.
using System;
using System.Collections.Generic;
using System.Diagnostics;
using System.IO;
using System.Linq;
using System.Net;
using System.Net.Sockets;
using System.Text;
using System.Text.RegularExpressions;
using System.Threading;
using MemoLockNet;

namespace MemoLockTests
{
    static class CliConventionTests
    {
        /// <summary>A flag written -name, as Go's flag package writes them, where the pages write --name.</summary>
        static readonly Regex singleDash = new Regex(@"(^|[\s""'(\[])-[a-z][a-z-]+", RegexOptions.Multiline);

        static CliResult Run(IDictionary<string, string> env, params string[] args) { using (var c = new Cli(env, args)) return c.Wait(); }

        static string Out(CliResult r) { return Encoding.UTF8.GetString(r.Stdout); }

        [Test]
        static void Cli_EveryCommandHasAPage()
        {
            var env = new Dictionary<string, string> { { "MEMOLOCK_REDIS", "redis://u:s3cret-pw@127.0.0.1:1" } };
            var pages = new Dictionary<string, string[]>
            {
                { "run", new[] { "-- CMD [ARGS...]", "Only standard output is cached", "not the command", "--ttl DURATION", "--lock-ttl DURATION", "(default 10s)",
                    "--id-hex HEX", "--id-base64 BASE64", "--quiet", "MEMOLOCK_REDIS", "124", "127", "128+N", "the run command alone",
                    "memolock run --tag reports --id 2026-11 --ttl 1h -- ./build-report 2026-11" } },
                { "version", new[] { "--version" } },
                { "help", new[] { "help [COMMAND]" } },
            };
            foreach (var kv in pages)
            {
                string name = kv.Key;
                foreach (var args in new[] { new[] { name, "--help" }, new[] { name, "-h" }, new[] { "help", name } })
                {
                    string what = string.Join(" ", args);
                    var r = Run(env, args);
                    Assert.Equal(0, r.Code, what + ": " + r);
                    Assert.Equal("", r.Stderr, what + ": stderr");
                    string page = Out(r);
                    var parts = new List<string> { "memolock " + name + ": ", "\nUsage:\n  memolock " + name };
                    if (name != "help") parts.AddRange(new[] { "\nFlags:\n", "  -h, --help " });
                    if (name == "run") parts.Add("\nEnvironment:\n  MEMOLOCK_REDIS");
                    parts.Add("\nExit status:\n");
                    if (name == "run") parts.Add("\nExamples:\n  # ");
                    int last = -1;
                    foreach (var p in parts)
                    {
                        int i = page.IndexOf(p, StringComparison.Ordinal);
                        Assert.True(i > last, what + ": part " + p + " missing or out of order:\n" + page);
                        last = i;
                    }
                    string flat = Regex.Replace(page, @"\s+", " ");
                    foreach (var w in kv.Value) Assert.True(flat.Contains(w), what + ": no " + w + " in:\n" + page);
                    var m = singleDash.Match(page);
                    Assert.True(!m.Success, what + ": a flag written " + m.Value + ":\n" + page);
                    Assert.True(!page.Contains("s3cret"), what + " printed the password of $MEMOLOCK_REDIS");
                    foreach (var line in page.Split('\n')) Assert.True(line.Length <= 100, what + ": a line of " + line.Length + " columns: " + line);
                    if (name == "run")
                    {
                        Assert.True(page.Contains("\n  --lock-ttl DURATION     how long others wait"), "the flags' column:\n" + page);
                        Assert.True(page.Contains("\n  124      --wait ran out"), "the exit statuses' column:\n" + page);
                    }
                }
            }
        }

        [Test]
        static void Cli_MainHelpAndVersion()
        {
            foreach (var a in new[] { "--help", "-h", "help" })
            {
                var r = Cli.Run(a);
                Assert.True(r.Code == 0 && r.Stderr == "", a + ": " + r);
                string flat = Regex.Replace(Out(r), @"\s+", " ");
                foreach (var w in new[] { " run run a command once", " version print", " help show", "MEMOLOCK_REDIS", "redis://:PASSWORD@host", "Exit status:", "Examples:", "memolock help COMMAND", "the run command alone" })
                    Assert.True(flat.Contains(w), a + ": no " + w + " in:\n" + Out(r));
            }
            var none = Cli.Run();
            Assert.True(none.Code == 2 && none.Stdout.Length == 0 && none.Stderr.Contains("Commands:"), "no command: " + none);
            foreach (var args in new[] { new[] { "frobnicate" }, new[] { "help", "frobnicate" } })
            {
                var r = Cli.Run(args);
                Assert.True(r.Code == 2 && r.Stderr.Contains("unknown command \"frobnicate\"") && r.Stderr.Contains("memolock --help"), string.Join(" ", args) + ": " + r);
            }
            foreach (var a in new[] { "--version", "version" })
            {
                var r = Cli.Run(a);
                Assert.True(r.Code == 0 && Out(r).StartsWith("memolock 0.1.0 ") && Out(r).Contains("Mono"), a + ": " + r);
            }
            var x = Cli.Run("version", "x");
            Assert.Equal("memolock version: unexpected argument \"x\"\nRun 'memolock version --help' for usage.\n", x.Stderr, "version x");
            Assert.Equal(2, x.Code, "version x");
        }

        [Test]
        static void Cli_UsageErrorsInGosWords()
        {
            var run = new[] { "run", "--redis", "redis://127.0.0.1:1", "--tag", "t", "--id", "i" };
            Func<string[], string[]> with = more => run.Concat(more).ToArray();
            var cases = new[]
            {
                Tuple.Create(with(new[] { "--ttl", "5", "--", "true" }), "--ttl \"5\": a duration needs a unit: 5s, 5ms, 5m or 5h"),
                Tuple.Create(with(new[] { "--ttl", "1m", "--wait", "soon", "--", "true" }), "--wait \"soon\": not a duration: write it as 500ms, 30s, 10m or 1h30m"),
                Tuple.Create(with(new[] { "--ttl", "1m", "--bogus", "--", "true" }), "unknown flag --bogus"),
                Tuple.Create(with(new[] { "--ttl" }), "--ttl needs a value"),
                Tuple.Create(with(new[] { "--ttl", "1m", "--quiet=maybe", "--", "true" }), "--quiet \"maybe\": a switch takes no value (or =true, =false)"),
                Tuple.Create(with(new[] { "--ttl", "-1s", "--", "true" }), "--ttl -1s is negative; give how long the output stays cached, or 0 for ever"),
                Tuple.Create(with(new[] { "--ttl", "1s", "--wait", "-2m", "--", "true" }), "--wait -2m0s is negative; give a limit, or 0 for none"),
                Tuple.Create(with(new[] { "--ttl", "1s", "--lock-ttl", "500us", "--", "true" }), "--lock-ttl 500\u00b5s is under 1ms"),
                Tuple.Create(with(new[] { "--ttl", "1s" }), "no command given; put it after --"),
                Tuple.Create(new[] { "run", "--tag", "t", "--ttl", "1s", "--", "true" }, "--tag and --id (or --id-hex, --id-base64) are required"),
                Tuple.Create(new[] { "run", "--tag", "t", "--id", "", "--id-hex", "00", "--ttl", "1s", "--", "true" }, "give one of --id, --id-hex and --id-base64, not --id and --id-hex"),
                Tuple.Create(with(new[] { "--ttl", "1s", "--quiet", "redis://:s3cret-pw@h:1", "--", "true" }), "unexpected argument \"redis://xxxxx@h:1\" before the command"),
                Tuple.Create(new[] { "run", "--tag", "t", "--id", "i", "--ttl", "1s", "--redis", "s3cret-pw@h:1", "--", "true" }, "--redis (URL withheld) is not of the form redis://[[user]:password@]host:port[/db]"),
                Tuple.Create(new[] { "run", "--tag", "a/lock", "--id", "i", "--ttl", "1s", "--redis", "redis://127.0.0.1:1", "--", "true" }, "tag \"a/lock\" contains \"/lock\""),
            };
            foreach (var c in cases)
            {
                string what = string.Join(" ", c.Item1);
                var r = Cli.Run(c.Item1);
                Assert.True(r.Code == 2 && r.Stdout.Length == 0 && r.Stderr.StartsWith("memolock run: " + c.Item2), what + ": want 2 and " + c.Item2 + "; " + r);
                Assert.True(r.Stderr.EndsWith("Run 'memolock run --help' for usage.\n") && !r.Stderr.Contains("Flags:"), what + ": " + r.Stderr);
                Assert.True(!r.Stderr.Contains("memolock: ") && !r.Stderr.Contains("s3cret"), what + ": " + r.Stderr);
                var m = singleDash.Match(r.Stderr);
                Assert.True(!m.Success, what + ": a flag written " + m.Value);
            }
        }

        [Test]
        static void Cli_RedisRefusalsSayWhatToDo()
        {
            using (var srv = new RedisServer(password: "s3cretPW"))
            {
                var cases = new[]
                {
                    Tuple.Create("redis://127.0.0.1:" + srv.Port, "the server wants a password: redis://:PASSWORD@host"),
                    Tuple.Create("redis://:wrong@127.0.0.1:" + srv.Port, "the user name or the password is wrong"),
                };
                foreach (var c in cases)
                {
                    var r = Cli.Run("run", "--redis", c.Item1, "--tag", "t", "--id", "i", "--ttl", "1s", "--", "echo", "never");
                    Assert.True(r.Code == 1 && r.Stderr.Contains(c.Item2) && !r.Stderr.Contains("wrong@"), c.Item1 + ": " + r);
                    Assert.True(r.Stderr.StartsWith("memolock run: ") && !r.Stderr.Contains("memolock: ") && r.Stderr.Contains("(redis redis://"), c.Item1 + ": " + r);
                    Assert.Equal(1, r.Stderr.TrimEnd('\n').Split('\n').Length, "one line: " + r.Stderr);
                }
            }
        }

        [Test(TimeoutSeconds = 60)]
        static void Cli_WaitLimitSaysWhatItWaitedFor()
        {
            var silent = new TcpListener(IPAddress.Loopback, 0); // accepts connections, never answers
            silent.Start();
            try
            {
                string url = "redis://127.0.0.1:" + ((IPEndPoint)silent.LocalEndpoint).Port;
                var r = Cli.Run("run", "--redis", url, "--tag", "t", "--id", "i", "--ttl", "1m", "--wait", "1s", "--", "echo", "x");
                Assert.True(r.Code == 124 && r.Stderr.Contains("memolock run: Redis (" + url + ") did not answer within --wait 1s") && !r.Stderr.Contains("gave up"), "silent Redis: " + r);
            }
            finally { silent.Stop(); }
            using (var srv = new RedisServer())
            {
                // A limit long enough for the lookup on a loaded machine, short against the command.
                var r = Cli.Run("run", "--redis", srv.UrlText, "--tag", "t", "--id", "here", "--ttl", "1m", "--wait", "2s", "--", "sleep", "30");
                Assert.True(r.Code == 124 && r.Stderr.Contains("memolock run: --wait 2s ran out while the command ran here"), "holding: " + r);
            }
        }

        /// <summary>Off a terminal, a waiter says so when the wait starts, then at most once every 30 s; the holder says nothing; --quiet nothing at all.</summary>
        [Test(TimeoutSeconds = 90)]
        static void Cli_OffATerminalAWaitIsALineNotAStream()
        {
            using (var srv = new RedisServer())
            {
                string gate = Path.Combine(Path.GetTempPath(), "memolock-gate-" + Guid.NewGuid().ToString("N"));
                try
                {
                    using (var holder = new Cli("run", "--redis", srv.UrlText, "--tag", "log", "--id", "k", "--ttl", "1m", "--lock-ttl", "30s", "--", "sh", "-c", "while [ ! -e '" + gate + "' ]; do sleep 0.05; done; echo v"))
                    {
                        Assert.Eventually(() => (long)srv.Call("EXISTS", "log/lock:k") == 1, 20, "the holder's lock");
                        var t0 = Stopwatch.StartNew();
                        using (var waiter = new Cli("run", "--redis", srv.UrlText, "--tag", "log", "--id", "k", "--ttl", "1m", "--", "echo", "never"))
                        {
                            Assert.Eventually(() => waiter.StderrSoFar.Contains("waiting for log:k"), 20, "the waiter to wait");
                            // Long enough for a line a second to show (the peers printed one), short against 30 s.
                            while (t0.ElapsedMilliseconds < 3500) Thread.Sleep(50);
                            File.WriteAllText(gate, "");
                            var w = waiter.Wait();
                            var h = holder.Wait();
                            Assert.True(w.Code == 0 && Out(w) == "v\n" && h.Code == 0 && Out(h) == "v\n", "waiter " + w + "; holder " + h);
                            var lines = w.Stderr.Trim().Split('\n');
                            int allowed = 1 + (int)(t0.Elapsed.TotalSeconds / 30);
                            Assert.True(lines.Length <= allowed && lines[0].StartsWith("memolock run: waiting for log:k, computed by "), lines.Length + " lines, " + allowed + " allowed: " + w.Stderr);
                            Assert.True(!w.Stderr.Contains("\r") && !w.Stderr.Contains("\x1b"), "terminal controls in a log: " + w.Stderr);
                            Assert.Equal("", h.Stderr, "the holder off a terminal");
                        }
                    }
                    srv.Call("SET", "log/lock:q", "someone", "PX", "300");
                    var q = Cli.Run("run", "--redis", srv.UrlText, "--tag", "log", "--id", "q", "--ttl", "1m", "--quiet", "--", "echo", "q");
                    Assert.True(q.Code == 0 && Out(q) == "q\n" && q.Stderr == "", "--quiet: " + q);
                }
                finally { File.Delete(gate); }
            }
        }

        /// <summary>A shell line run on a pseudo-terminal by script(1), its input a pipe kept open (script ends the session when its input ends).</summary>
        sealed class Terminal : IDisposable
        {
            readonly Process p;
            readonly MemoryStream buf = new MemoryStream();
            readonly Thread reader;

            public Terminal(string line)
            {
                var psi = new ProcessStartInfo("script", "-qec '" + line.Replace("'", "'\\''") + "' /dev/null")
                {
                    UseShellExecute = false,
                    RedirectStandardInput = true,
                    RedirectStandardOutput = true,
                };
                psi.EnvironmentVariables["MEMOLOCK"] = Cli.Launcher;
                p = Process.Start(psi);
                reader = new Thread(() =>
                {
                    var b = new byte[4096];
                    int n;
                    try { while ((n = p.StandardOutput.BaseStream.Read(b, 0, b.Length)) > 0) lock (buf) buf.Write(b, 0, n); } catch { }
                }) { IsBackground = true };
                reader.Start();
            }

            public string Text { get { lock (buf) return Encoding.UTF8.GetString(buf.ToArray()); } }

            public string Done()
            {
                Assert.True(p.WaitForExit(30000), "the terminal session ended: " + Text);
                reader.Join(5000);
                return Text;
            }

            public void Dispose() { try { if (!p.HasExited) p.Kill(); } catch { } }
        }

        static bool HaveScript()
        {
            foreach (var dir in (Environment.GetEnvironmentVariable("PATH") ?? "").Split(':'))
                if (File.Exists(Path.Combine(dir, "script"))) return true;
            Assert.True(Environment.GetEnvironmentVariable("CI") != "true", "script(1) (util-linux) is not installed, and CI=true");
            return false;
        }

        [Test(TimeoutSeconds = 90)]
        static void Cli_OnATerminalTheWaitIsOneLineInPlace()
        {
            if (!HaveScript()) return;
            using (var srv = new RedisServer())
            {
                string gate = Path.Combine(Path.GetTempPath(), "memolock-gate-" + Guid.NewGuid().ToString("N"));
                try
                {
                    using (var holder = new Cli("run", "--redis", srv.UrlText, "--tag", "tty4", "--id", "k", "--ttl", "1m", "--lock-ttl", "30s", "--", "sh", "-c", "while [ ! -e '" + gate + "' ]; do sleep 0.05; done; echo v"))
                    {
                        Assert.Eventually(() => (long)srv.Call("EXISTS", "tty4/lock:k") == 1, 20, "the holder's lock");
                        using (var t = new Terminal("\"$MEMOLOCK\" run --redis " + srv.UrlText + " --tag tty4 --id k --ttl 1m -- echo never; echo exit:$?"))
                        {
                            Assert.Eventually(() => Regex.Matches(t.Text, "memolock run: waiting for tty4:k, computed by ").Count >= 3, 20, "three drawings of the status line");
                            File.WriteAllText(gate, "");
                            string o = t.Done();
                            holder.Wait();
                            int first = o.IndexOf("memolock run: waiting for", StringComparison.Ordinal), last = o.LastIndexOf("memolock run: waiting for", StringComparison.Ordinal);
                            Assert.True(!o.Substring(first, last - first).Contains("\n") && o.Substring(first, last - first).Contains("\r"), "drawn in place: " + o);
                            Assert.True(Regex.IsMatch(o, @"\(\d+\.\ds\)\x1b\[K"), "the elapsed time: " + o);
                            Assert.True(o.Contains("\r\x1b[Kv\r\n") && o.Contains("exit:0"), "erased before the output: " + o);
                        }
                    }
                }
                finally { File.Delete(gate); }
            }
        }

        [Test(TimeoutSeconds = 90)]
        static void Cli_OnATerminalTheHolderShowsItsCommand()
        {
            if (!HaveScript()) return;
            using (var srv = new RedisServer())
            {
                string gate = Path.Combine(Path.GetTempPath(), "memolock-gate-" + Guid.NewGuid().ToString("N"));
                try
                {
                    using (var t = new Terminal("\"$MEMOLOCK\" run --redis " + srv.UrlText + " --tag tty5 --id k --ttl 1m -- sh -c \"echo to-stderr >&2; while [ ! -e " + gate + " ]; do sleep 0.05; done; echo v\"; echo exit:$?"))
                    {
                        Assert.Eventually(() =>
                        {
                            string s = t.Text;
                            int i = s.IndexOf("to-stderr", StringComparison.Ordinal);
                            return i >= 0 && s.IndexOf("memolock run: computing tty5:k (", i, StringComparison.Ordinal) >= 0;
                        }, 20, "the status line after the command's stderr");
                        File.WriteAllText(gate, "");
                        string o = t.Done();
                        Assert.True(o.Contains("\r\x1b[Kto-stderr\r\n") && o.Contains("exit:0"), "the command's stderr on a line of its own: " + o);
                    }
                    using (var t = new Terminal("\"$MEMOLOCK\" run --quiet --redis " + srv.UrlText + " --tag tty5 --id q --ttl 1m -- sh -c 'test -t 2 && echo stderr-is-a-terminal'; echo exit:$?"))
                    {
                        string q = t.Done();
                        Assert.True(!q.Contains("memolock run:") && q.Contains("stderr-is-a-terminal") && q.Contains("exit:0"), "--quiet: " + q);
                    }
                }
                finally { File.Delete(gate); }
            }
        }

        /// <summary>What a waiter elsewhere prints is what the holder published: Go's words whichever CLI ran the command ([A6]).</summary>
        [Test(TimeoutSeconds = 90)]
        static void Cli_FailTextsAreGos()
        {
            string noexec = Path.Combine(Path.GetTempPath(), "memolock-noexec-" + Guid.NewGuid().ToString("N"));
            File.WriteAllText(noexec, "echo hi\n");
            try
            {
                using (var srv = new RedisServer())
                {
                    var cases = new[]
                    {
                        Tuple.Create(new[] { "sh", "-c", "kill -9 $$" }, "command killed by signal 9 (killed)", 137),
                        Tuple.Create(new[] { "sh", "-c", "kill -TERM $$" }, "command killed by signal 15 (terminated)", 143),
                        Tuple.Create(new[] { "sh", "-c", "exit 7" }, "command exited with status 7", 7),
                        Tuple.Create(new[] { "no-such-command-memolock" }, "exec: \"no-such-command-memolock\": executable file not found in $PATH", 127),
                        Tuple.Create(new[] { "/nonexistent/x" }, "fork/exec /nonexistent/x: no such file or directory", 127),
                        Tuple.Create(new[] { noexec }, "fork/exec " + noexec + ": permission denied", 126),
                        Tuple.Create(new[] { "/tmp" }, "fork/exec /tmp: permission denied", 126),
                    };
                    int n = 0;
                    foreach (var c in cases)
                    {
                        string id = "f" + n++;
                        using (var listener = RespConnection.Open(srv.Url(), 5000))
                        {
                            listener.Call("SUBSCRIBE", "fx/lock-event:" + id);
                            var r = Cli.Run(new[] { "run", "--redis", srv.UrlText, "--tag", "fx", "--id", id, "--ttl", "1m", "--" }.Concat(c.Item1).ToArray());
                            Assert.Equal(c.Item3, r.Code, string.Join(" ", c.Item1) + ": " + r);
                            string text = null;
                            while (text == null && listener.Poll(5000))
                            {
                                var m = (object[])listener.Read();
                                var parts = Encoding.UTF8.GetString((byte[])m[2]).Split(new[] { '\n' }, 3);
                                if (parts[0] == "fail") text = parts[2];
                            }
                            Assert.Equal(c.Item2, text, string.Join(" ", c.Item1) + ": the fail event's text");
                        }
                    }
                }
            }
            finally { File.Delete(noexec); }
        }
    }
}
