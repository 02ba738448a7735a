// memolock run: memoizes a command's standard output through Redis, with
// the semantics and exit codes of the Go CLI (cmd/memolock/runcmd.go), plus
// one of its own: 3 when the id is recorded as "not found" (a library
// client's fetch found nothing for it; Go's run exits 1 then).
//
//   memolock.exe run --tag T --id ID --ttl D [--redis URL] [--lock-ttl D] [--wait D] -- CMD [ARGS...]
using System;
using System.Collections.Generic;
using System.Diagnostics;
using System.Globalization;
using System.IO;
using System.Threading;
using MemoLockNet;

namespace MemoLockCli
{
    static class Program
    {
        const int ExitFailure = 1, ExitUsage = 2, ExitNoValue = 3, ExitWaitLimit = 124, ExitSignalBase = 128;
        const string DefaultRedisUrl = "redis://127.0.0.1:6379";
        const string Usage = "usage:\n  memolock run --tag T --id ID --ttl D [--redis URL] [--lock-ttl D] [--wait D] -- CMD [ARGS...]\n";

        static int Main(string[] args)
        {
            var stderr = Console.Error;
            if (args.Length == 0) { stderr.Write(Usage); return ExitUsage; }
            switch (args[0])
            {
                case "run": return RunCmd(args, 1, stderr);
                case "-h": case "--help": case "help": Console.Out.Write(Usage); return 0;
            }
            stderr.Write("memolock: unknown command \"" + args[0] + "\"\n" + Usage);
            return ExitUsage;
        }

        static string F(double s) { return s.ToString("0.0", CultureInfo.InvariantCulture); }

        static int RunCmd(string[] args, int at, TextWriter stderr)
        {
            // Go's flag package: -name or --name, then =value or the next argument; stops at "--" or the first non-flag.
            var vals = new Dictionary<string, string>();
            var known = new HashSet<string> { "redis", "tag", "id", "ttl", "lock-ttl", "wait" };
            int i = at;
            for (; i < args.Length; i++)
            {
                string a = args[i];
                if (a == "--") { i++; break; }
                if (a.Length < 2 || a[0] != '-') break;
                string name = a.Substring(a[1] == '-' ? 2 : 1);
                if (name.Length == 0 || name[0] == '-' || name[0] == '=') { stderr.Write("bad flag syntax: " + a + "\n" + Usage); return ExitUsage; }
                string val = null;
                int eq = name.IndexOf('=');
                if (eq >= 0) { val = name.Substring(eq + 1); name = name.Substring(0, eq); }
                if (name == "h" || name == "help") { stderr.Write(Usage); return ExitUsage; }
                if (!known.Contains(name)) { stderr.Write("flag provided but not defined: -" + name + "\n" + Usage); return ExitUsage; }
                if (val == null)
                {
                    if (i + 1 >= args.Length) { stderr.Write("flag needs an argument: -" + name + "\n" + Usage); return ExitUsage; }
                    val = args[++i];
                }
                vals[name] = val;
            }
            var argv = new string[args.Length - i];
            Array.Copy(args, i, argv, 0, argv.Length);

            var durs = new Dictionary<string, TimeSpan> { { "ttl", TimeSpan.Zero }, { "lock-ttl", MemoLock.DefaultLockTtl }, { "wait", TimeSpan.Zero } };
            foreach (var k in new[] { "ttl", "lock-ttl", "wait" })
            {
                string v;
                if (!vals.TryGetValue(k, out v)) continue;
                long ns;
                if (!GoDuration.TryParseNanos(v, out ns))
                {
                    stderr.Write("invalid value \"" + v + "\" for flag -" + k + ": parse error\n" + Usage);
                    return ExitUsage;
                }
                durs[k] = TimeSpan.FromTicks(ns / 100);
            }
            string tag, id, redisUrl;
            vals.TryGetValue("tag", out tag);
            vals.TryGetValue("id", out id);
            vals.TryGetValue("redis", out redisUrl);
            TimeSpan ttl = durs["ttl"], lockTtl = durs["lock-ttl"], wait = durs["wait"];
            if (lockTtl == TimeSpan.Zero) lockTtl = MemoLock.DefaultLockTtl; // as Go's Options: 0 is the default
            if (string.IsNullOrEmpty(tag) || string.IsNullOrEmpty(id)) { stderr.WriteLine("memolock run: --tag and --id are required"); return ExitUsage; }
            if (!vals.ContainsKey("ttl")) { stderr.WriteLine("memolock run: --ttl is required (0 caches for ever)"); return ExitUsage; }
            if (ttl < TimeSpan.Zero) { stderr.WriteLine("memolock run: --ttl " + vals["ttl"] + " is negative; give how long the output stays cached, or 0 for ever"); return ExitUsage; }
            if (wait < TimeSpan.Zero) { stderr.WriteLine("memolock run: --wait " + vals["wait"] + " is negative; give a limit, or 0 for none"); return ExitUsage; }
            if (argv.Length == 0) { stderr.WriteLine("memolock run: no command given; put it after --"); return ExitUsage; }
            if (string.IsNullOrEmpty(redisUrl)) redisUrl = Environment.GetEnvironmentVariable("MEMOLOCK_REDIS");
            if (string.IsNullOrEmpty(redisUrl)) redisUrl = DefaultRedisUrl;

            RedisUrl url;
            try { url = RedisUrl.Parse(redisUrl); }
            catch (Exception e) { stderr.WriteLine("memolock run: --redis " + e.Message); return ExitUsage; }

            var started = Stopwatch.StartNew();
            var progress = new Progress(stderr, tag + ":" + id, started);
            var rdb = new RespTransport(url);
            MemoLock c;
            try { c = new MemoLock(rdb, tag, lockTtl, false, progress.Waiting); }
            catch (ArgumentException e) { stderr.WriteLine("memolock run: " + e.Message.Split('\n')[0]); return ExitUsage; } // not Mono's "Parameter name:" line

            var sig = new Signals();
            // The first signal closes the client: waiting callers return at
            // once, and a running command is stopped, then the lock released
            // with an abandon event so that a waiter elsewhere takes over.
            sig.OnFirst = () => new Thread(c.Close) { IsBackground = true }.Start();
            sig.Start();

            byte[] partial = null, output = null;
            Exception err = null;
            try
            {
                output = c.Get(id, lease =>
                {
                    try
                    {
                        return (Command.Run(argv, lease.Cancellation, sig, out partial), ttl);
                    }
                    catch (InterruptedException)
                    {
                        // Not a failure for waiters elsewhere to report:
                        // closing from inside fetch hands the lock over with
                        // an abandon event, so that one of them runs it.
                        c.Close();
                        throw;
                    }
                }, wait > TimeSpan.Zero ? wait : (TimeSpan?)null);
            }
            catch (Exception e) { err = e; }
            c.Close(); // releases our lock if we still hold one, once the command is gone
            progress.Stop();
            rdb.Dispose();
            sig.Stop();

            if (err == null)
            {
                try
                {
                    using (var o = Console.OpenStandardOutput()) o.Write(output, 0, output.Length);
                }
                catch (Exception e) { stderr.WriteLine("memolock run: writing output: " + e.Message); return ExitFailure; }
                return 0;
            }
            if (sig.Caught != 0)
            {
                stderr.WriteLine("memolock run: interrupted by signal " + sig.Caught);
                return ExitSignalBase + sig.Caught;
            }
            var ce = err as CommandExitException;
            if (ce != null)
            {
                if (partial != null) using (var o = Console.OpenStandardOutput()) o.Write(partial, 0, partial.Length);
                return ce.Code;
            }
            var se = err as StartException;
            if (se != null) { stderr.WriteLine("memolock run: " + se.Message); return se.Code; }
            if (err is HolderFailedException) { stderr.WriteLine("memolock run: the command failed where it ran: " + err.Message); return ExitFailure; }
            if (err is NotFoundException)
            {
                stderr.WriteLine("memolock run: not found: " + tag + ":" + id + " has no value (a memolock client's fetch found nothing for it)");
                return ExitNoValue;
            }
            if (err is MemoLockTimeoutException)
            {
                stderr.WriteLine("memolock run: gave up after " + F(started.Elapsed.TotalSeconds) + "s (--wait " + vals["wait"] + "): " + err.Message);
                return ExitWaitLimit;
            }
            stderr.WriteLine("memolock run: " + err.Message + " (redis " + RedisUrl.Redact(redisUrl) + ")");
            return ExitFailure;
        }
    }

    /// <summary>Says on stderr, once a second, that the invocation waits and on whom.</summary>
    sealed class Progress
    {
        readonly TextWriter stderr;
        readonly string name;
        readonly Stopwatch started;
        readonly ManualResetEvent quit = new ManualResetEvent(false);
        Thread thread;
        readonly object mu = new object();

        public Progress(TextWriter stderr, string name, Stopwatch started) { this.stderr = stderr; this.name = name; this.started = started; }

        public void Waiting(string id, string holder)
        {
            lock (mu)
            {
                if (thread != null) return;
                thread = new Thread(() =>
                {
                    do
                    {
                        stderr.WriteLine("memolock: waiting for " + name + ", computed by " + holder + " (" +
                            started.Elapsed.TotalSeconds.ToString("0.0", CultureInfo.InvariantCulture) + "s)");
                    } while (!quit.WaitOne(1000));
                }) { IsBackground = true };
                thread.Start();
            }
        }

        public void Stop()
        {
            quit.Set();
            lock (mu) if (thread != null) thread.Join();
        }
    }
}
