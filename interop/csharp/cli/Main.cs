// memolock run (the C# peer): memoizes a command's standard output through
// Redis, as the Go CLI's `memolock run` (cmd/memolock/runcmd.go) does, and
// with its conventions (cmd/memolock/cli.go): the same flags (but
// --cluster), semantics, exit codes, help pages, usage errors and status
// line, so that a script or a person can use one CLI in place of another.
//
//   memolock run --tag T (--id ID | --id-hex HEX | --id-base64 B64) --ttl D [--redis URL] [--lock-ttl D] [--wait D] [--quiet] -- CMD [ARGS...]
//   memolock version | --version
//   memolock help [COMMAND] | COMMAND --help
//
// Run it through the launcher (bin/memolock) for ids that are not UTF-8:
// see Argv.cs.
using System;
using System.Collections.Generic;
using System.Diagnostics;
using System.Globalization;
using System.IO;
using System.Text;
using System.Text.RegularExpressions;
using System.Threading;
using MemoLockNet;

namespace MemoLockCli
{
    /// <summary>Bad usage: the message names the flag.</summary>
    sealed class UsageException : Exception { public UsageException(string m) : base(m) { } }

    /// <summary>-h or --help among the flags.</summary>
    sealed class HelpException : Exception { }

    static class Program
    {
        const int ExitFailure = 1, ExitUsage = 2, ExitWaitLimit = 124, ExitSignalBase = 128;
        /// <summary>The launcher's name, bin/memolock: the name in every page and message.</summary>
        const string Prog = "memolock";
        const string Version = "0.1.0";

        static int Main(string[] args)
        {
            if (args.Length == 0) { Err(Page.Overview(Prog)); return ExitUsage; }
            switch (args[0])
            {
                case "-h": case "--help": case "-help": Out(Page.Overview(Prog)); return 0;
                case "--version": case "-version": return VersionCmd(args, 1);
            }
            if (Page.Find(args[0]) != null) return Dispatch(args[0], args, 1);
            Err(Prog + ": unknown command " + QuoteArg(RedactArg(Argv.Show(args[0]))) + "\nRun '" + Prog + " --help' for the list of commands.\n");
            return ExitUsage;
        }

        static int Dispatch(string name, string[] args, int at)
        {
            switch (name)
            {
                case "run": return RunCmd(args, at);
                case "version": return VersionCmd(args, at);
                default: return HelpCmd(args, at);
            }
        }

        static void Out(string text) { using (var o = Console.OpenStandardOutput()) { var b = Encoding.UTF8.GetBytes(text); o.Write(b, 0, b.Length); } }
        static void Err(string text) { new ErrOut("").Write(text); }

        static int Usage(string cmd, string msg)
        {
            Err(Prog + " " + cmd + ": " + msg + "\nRun '" + Prog + " " + cmd + " --help' for usage.\n");
            return ExitUsage;
        }

        static int HelpCmd(string[] args, int at)
        {
            if (args.Length <= at) { Out(Page.Overview(Prog)); return 0; }
            string a = args[at];
            if (a == "-h" || a == "--help" || a == "-help" || a == "help") { Out(Page.Help.Render(Prog)); return 0; }
            if (Page.Find(a) == null)
            {
                Err(Prog + " help: unknown command " + QuoteArg(RedactArg(Argv.Show(a))) + "\nRun '" + Prog + " --help' for the list.\n");
                return ExitUsage;
            }
            return Dispatch(a, new[] { a, "--help" }, 1);
        }

        static int VersionCmd(string[] args, int at)
        {
            try
            {
                var rest = ParseFlags(new Dictionary<string, string>(), args, at, new Dictionary<string, string>(), new List<string[]>());
                if (rest < args.Length) throw new UsageException("unexpected argument " + QuoteArg(RedactArg(Argv.Show(args[rest]))));
            }
            catch (HelpException) { Out(Page.Version.Render(Prog)); return 0; }
            catch (UsageException e) { return Usage("version", e.Message); }
            string mono = "Mono";
            var display = Type.GetType("Mono.Runtime")?.GetMethod("GetDisplayName", System.Reflection.BindingFlags.NonPublic | System.Reflection.BindingFlags.Static);
            if (display != null) mono = "Mono " + ((string)display.Invoke(null, null)).Split(' ')[0];
            Out(Prog + " " + Version + " (the C# peer) " + mono + " " + (File.Exists("/proc/version") ? "linux" : Environment.OSVersion.Platform.ToString().ToLowerInvariant()) + "/" + (IntPtr.Size == 8 ? "64-bit" : "32-bit") + "\n");
            return 0;
        }

        // --- words for messages ------------------------------------------------

        static bool MayHoldPassword(string a) { return a.Contains("://") || a.Contains("@"); }

        /// <summary>An argument fit for an error message: as it is, or redacted as URLs are if it may hold a password.</summary>
        static string RedactArg(string a) { return MayHoldPassword(a) ? RedisUrl.Redact(a) : a; }

        /// <summary>s in double quotes, with Go's escapes for what does not print.</summary>
        static string GoQuote(string s)
        {
            var b = new StringBuilder("\"");
            foreach (char c in s)
            {
                if (c == '"' || c == '\\') b.Append('\\').Append(c);
                else if (c == '\n') b.Append("\\n");
                else if (c == '\t') b.Append("\\t");
                else if (c == '\r') b.Append("\\r");
                else if (c < 0x20 || c == 0x7f) b.Append("\\x").Append(((int)c).ToString("x2"));
                else b.Append(c);
            }
            return b.Append('"').ToString();
        }

        static string QuoteArg(string s)
        {
            foreach (char c in s) if (c < 0x20 || c == 0x7f || c == '"' || c == '\\') return GoQuote(s);
            return "\"" + s + "\"";
        }

        /// <summary>ns as Go's time.Duration.String writes it: "1.5s", "2m0s", "300ms".</summary>
        static string GoDur(long ns)
        {
            if (ns == 0) return "0s";
            string sign = ns < 0 ? "-" : "";
            ulong u = ns < 0 ? (ulong)(-(ns + 1)) + 1 : (ulong)ns;
            Func<ulong, int, string> frac = (v, prec) =>
            {
                ulong p = 1;
                for (int i = 0; i < prec; i++) p *= 10;
                string d = (v % p).ToString(CultureInfo.InvariantCulture).PadLeft(prec, '0').TrimEnd('0');
                return (v / p).ToString(CultureInfo.InvariantCulture) + (d == "" ? "" : "." + d);
            };
            if (u < 1000000000UL)
            {
                if (u < 1000) return sign + u + "ns";
                return sign + (u < 1000000 ? frac(u, 3) + "\u00b5s" : frac(u, 6) + "ms");
            }
            ulong secs = u / 1000000000UL;
            string sec = frac(u, 9);
            string secPart = (secs % 60).ToString(CultureInfo.InvariantCulture) + sec.Substring(secs.ToString(CultureInfo.InvariantCulture).Length) + "s";
            ulong mins = secs / 60;
            if (mins == 0) return sign + secPart;
            string m = (mins % 60) + "m";
            ulong hours = mins / 60;
            return sign + (hours > 0 ? hours + "h" : "") + m + secPart;
        }

        static readonly Regex number = new Regex(@"^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$|^[+-]?(inf|infinity|nan)$", RegexOptions.IgnoreCase);

        static long Duration(string name, string v)
        {
            long ns;
            if (GoDuration.TryParseNanos(v, out ns)) return ns;
            string shown = GoQuote(RedactArg(v));
            if (number.IsMatch(v)) throw new UsageException("--" + name + " " + shown + ": a duration needs a unit: " + v + "s, " + v + "ms, " + v + "m or " + v + "h");
            throw new UsageException("--" + name + " " + shown + ": not a duration: write it as 500ms, 30s, 10m or 1h30m");
        }

        // --- flags ---------------------------------------------------------------

        static readonly Dictionary<string, string> runFlags = new Dictionary<string, string>
        {
            { "tag", "string" }, { "id", "id" }, { "id-hex", "id" }, { "id-base64", "id" }, { "ttl", "duration" },
            { "lock-ttl", "duration" }, { "wait", "duration" }, { "redis", "string" }, { "quiet", "bool" },
        };

        /// <summary>
        /// Parses args from at as Go's flag package does (-name or --name, then
        /// =value or the next argument; a switch takes =true or =false; the
        /// flags end at "--" or the first argument that is not one), into vals
        /// and ids (name, value, in order), with Go's errors worded with
        /// --name. Returns where the command's arguments start.
        /// </summary>
        static int ParseFlags(Dictionary<string, string> defs, string[] args, int at, Dictionary<string, string> vals, List<string[]> ids)
        {
            int i = at;
            while (i < args.Length)
            {
                string a = args[i];
                if (a.Length < 2 || a[0] != '-') break;
                if (a == "--") { i++; break; }
                string name = a.Substring(a[1] == '-' ? 2 : 1);
                if (name.Length == 0 || name[0] == '-' || name[0] == '=') throw new UsageException("bad flag syntax: " + RedactArg(Argv.Show(a)));
                string val = null;
                int eq = name.IndexOf('=');
                if (eq >= 0) { val = name.Substring(eq + 1); name = name.Substring(0, eq); }
                string kind;
                if (!defs.TryGetValue(name, out kind))
                {
                    if (name == "h" || name == "help") throw new HelpException();
                    throw new UsageException("unknown flag --" + RedactArg(Argv.Show(name)));
                }
                i++;
                if (kind == "bool")
                {
                    string v = val == null ? "true" : val.ToLowerInvariant();
                    if (v == "1" || v == "t" || v == "true") vals[name] = "true";
                    else if (v == "0" || v == "f" || v == "false") vals.Remove(name);
                    else throw new UsageException("--" + name + " " + GoQuote(RedactArg(Argv.Show(val))) + ": a switch takes no value (or =true, =false)");
                    continue;
                }
                if (val == null)
                {
                    if (i >= args.Length) throw new UsageException("--" + name + " needs a value");
                    val = args[i++];
                }
                if (kind == "id") ids.Add(new[] { name, val });
                else if (kind == "duration") vals[name] = Duration(name, Argv.Show(val)).ToString(CultureInfo.InvariantCulture);
                else vals[name] = val;
            }
            return i;
        }

        /// <summary>
        /// The id from the id flags given, in order; null if none was. An id
        /// flag given twice counts once, its last value winning, as for any
        /// other flag; two different ones are a usage error.
        /// </summary>
        static byte[] OneId(List<string[]> ids)
        {
            var last = new Dictionary<string, string>();
            var names = new List<string>();
            foreach (var kv in ids)
            {
                if (!last.ContainsKey(kv[0])) names.Add("--" + kv[0]);
                last[kv[0]] = kv[1];
            }
            if (names.Count == 0) return null;
            if (names.Count > 1) throw new UsageException("give one of --id, --id-hex and --id-base64, not " + string.Join(" and ", names));
            foreach (var kv in last)
            {
                if (kv.Key == "id") return Argv.Bytes(kv.Value);
                byte[] id;
                string shown = Argv.Show(kv.Value);
                string err = kv.Key == "id-hex" ? IdCodec.FromHex(shown, out id) : IdCodec.FromBase64(shown, out id);
                if (err != null) throw new UsageException("--" + kv.Key + " " + QuoteArg(shown) + ": " + err);
                return id;
            }
            return null;
        }

        /// <summary>Whether the flags ended at an argument that is not a flag, with a "--" after it: the arguments left are then not the command.</summary>
        static bool StrayBeforeDashes(string[] args, int cmdAt)
        {
            if (cmdAt > 0 && args[cmdAt - 1] == "--") return false;
            for (int i = cmdAt; i < args.Length; i++) if (args[i] == "--") return true;
            return false;
        }

        // --- Redis ------------------------------------------------------------------

        /// <summary>What an operator may do about err, a failure talking to Redis, as "; ...", or "".</summary>
        static string RedisHint(Exception err)
        {
            string msg = "";
            for (var e = err; e != null; e = e.InnerException) msg += " " + e.Message;
            if (msg.Contains("NOAUTH")) return "; the server wants a password: redis://:PASSWORD@host, or redis://USER:PASSWORD@host for an ACL user";
            if (msg.Contains("WRONGPASS") || msg.Contains("invalid password")) return "; the user name or the password is wrong, or the user is disabled";
            if (msg.Contains("NOPERM") || msg.Contains("user executing the script can't run"))
                return "; the Redis user lacks a permission: 'memolock check' (Go's CLI) names the ACL rules to add";
            if (msg.Contains("MOVED ") || msg.Contains("CROSSSLOT")) return "; this is a Redis Cluster, which this CLI does not support: Go's memolock run --cluster does";
            return "";
        }

        /// <summary>The text of a library error without its "memolock: " prefixes: the CLI's own prefix says where it comes from.</summary>
        static string LibError(Exception e)
        {
            string m = e.Message;
            while (m.StartsWith("memolock: ", StringComparison.Ordinal)) m = m.Substring("memolock: ".Length);
            return m.Replace(": memolock: ", ": ");
        }

        // --- run -----------------------------------------------------------------------

        static int RunCmd(string[] args, int at)
        {
            var vals = new Dictionary<string, string>();
            var ids = new List<string[]>();
            string[] argv;
            byte[] id;
            string tag, redisUrl;
            long ttl, lockTtl, wait;
            RedisUrl url;
            try
            {
                int cmdAt = ParseFlags(runFlags, args, at, vals, ids);
                // The command's arguments stay as they came: they go to exec byte for byte.
                argv = new string[args.Length - cmdAt];
                Array.Copy(args, cmdAt, argv, 0, argv.Length);
                id = OneId(ids);
                foreach (var k in new[] { "tag", "redis" })
                {
                    string v, text;
                    if (!vals.TryGetValue(k, out v)) continue;
                    if (!Argv.TryText(v, out text)) throw new UsageException("--" + k + " \"" + Argv.Show(v) + "\" is not valid UTF-8");
                    vals[k] = text;
                }
                vals.TryGetValue("tag", out tag);
                if (string.IsNullOrEmpty(tag) || id == null || id.Length == 0) throw new UsageException("--tag and --id (or --id-hex, --id-base64) are required");
                if (!vals.ContainsKey("ttl")) throw new UsageException("--ttl is required (0 caches for ever)");
                ttl = long.Parse(vals["ttl"], CultureInfo.InvariantCulture);
                wait = vals.ContainsKey("wait") ? long.Parse(vals["wait"], CultureInfo.InvariantCulture) : 0;
                lockTtl = vals.ContainsKey("lock-ttl") ? long.Parse(vals["lock-ttl"], CultureInfo.InvariantCulture) : 0;
                if (ttl < 0) throw new UsageException("--ttl " + GoDur(ttl) + " is negative; give how long the output stays cached, or 0 for ever");
                if (wait < 0) throw new UsageException("--wait " + GoDur(wait) + " is negative; give a limit, or 0 for none");
                if (lockTtl < 0 || lockTtl > 0 && lockTtl < 1000000)
                    throw new UsageException("--lock-ttl " + GoDur(lockTtl) + " is under 1ms; Redis locks are set in whole milliseconds (0: the default, 10s)");
                if (argv.Length == 0) throw new UsageException("no command given; put it after --");
                string first = Argv.Show(argv[0]);
                if (first.Contains("://") || MayHoldPassword(first) && StrayBeforeDashes(args, cmdAt))
                    // A URL after --quiet, which takes none, would otherwise
                    // run as the command, and be printed if it failed to start.
                    throw new UsageException("unexpected argument " + QuoteArg(RedactArg(first)) + " before the command; give the URL with --redis, and the command after --");
                vals.TryGetValue("redis", out redisUrl);
                if (string.IsNullOrEmpty(redisUrl)) redisUrl = Environment.GetEnvironmentVariable("MEMOLOCK_REDIS");
                if (string.IsNullOrEmpty(redisUrl)) redisUrl = Page.DefaultRedisUrl;
                try { url = RedisUrl.Parse(redisUrl); }
                catch (Exception e) { throw new UsageException("--redis " + e.Message); }
                string grace = Environment.GetEnvironmentVariable("MEMOLOCK_KILL_GRACE");
                if (!string.IsNullOrEmpty(grace))
                {
                    // Not in Go's CLI: tests stretch the grace so that a second signal's "at once" stands out.
                    long ns;
                    if (!GoDuration.TryParseNanos(grace, out ns) || ns < 0)
                        throw new UsageException("MEMOLOCK_KILL_GRACE \"" + grace + "\" is not a duration such as 2s");
                    Command.KillGraceMs = (int)Math.Min(ns / 1000000, int.MaxValue);
                }
            }
            catch (HelpException) { Out(Page.Run.Render(Prog)); return 0; }
            catch (UsageException e) { return Usage("run", e.Message); }

            var err = new ErrOut(Prog + " run: ");
            var started = Stopwatch.StartNew();
            // As shown to people: --id as given, other ids as UTF-8 where they are.
            string shown = tag + ":" + Bytes.Utf8.GetString(id);
            var status = vals.ContainsKey("quiet") ? null : new Status(err, shown);
            string holder = null;
            bool fetched = false;
            var rdb = new RespTransport(url);
            MemoLock c;
            try
            {
                c = new MemoLock(rdb, tag, lockTtl == 0 ? MemoLock.DefaultLockTtl : TimeSpan.FromTicks(lockTtl / 100), false, (i, h) =>
                {
                    Volatile.Write(ref holder, h);
                    if (status != null) status.Waiting(i, h);
                });
            }
            catch (ArgumentException e)
            {
                if (status != null) status.Done();
                rdb.Dispose();
                return Usage("run", LibError(e).Split('\n')[0]); // not Mono's "Parameter name:" line
            }

            var sig = new Signals();
            // The first signal closes the client: waiting callers return at
            // once, and a running command is stopped, then the lock released
            // with an abandon event so that a waiter elsewhere takes over.
            sig.OnFirst = () => new Thread(c.Close) { IsBackground = true }.Start();
            sig.Start();

            byte[] partial = null, output = null;
            Exception failure = null;
            try
            {
                output = c.Get(id, lease =>
                {
                    Volatile.Write(ref fetched, true);
                    if (status != null) status.Computing();
                    try
                    {
                        return (Command.Run(argv, lease.Cancellation, sig, status, out partial), TimeSpan.FromTicks(ttl / 100));
                    }
                    catch (InterruptedException)
                    {
                        // Not a failure for waiters elsewhere to report:
                        // closing from inside fetch hands the lock over with
                        // an abandon event, so that one of them runs it.
                        c.Close();
                        throw;
                    }
                }, wait > 0 ? TimeSpan.FromTicks(wait / 100) : (TimeSpan?)null);
            }
            catch (Exception e) { failure = e; }
            c.Close(); // releases our lock if we still hold one, once the command is gone
            if (status != null) status.Done();
            rdb.Dispose();
            sig.Stop();

            if (failure == null)
            {
                try
                {
                    using (var o = Console.OpenStandardOutput()) o.Write(output, 0, output.Length);
                }
                catch (Exception e) { err.Line("writing output: " + e.Message); return ExitFailure; }
                return 0;
            }
            if (sig.Caught != 0)
            {
                err.Line("interrupted by " + Signals.GoName(sig.Caught));
                return ExitSignalBase + sig.Caught;
            }
            var ce = failure as CommandExitException;
            if (ce != null)
            {
                if (partial != null) using (var o = Console.OpenStandardOutput()) o.Write(partial, 0, partial.Length);
                return ce.Code;
            }
            var se = failure as StartException;
            if (se != null) { err.Line(se.Message); return se.Code; }
            if (failure is HolderFailedException) { err.Line("the command failed where it ran: " + LibError(failure)); return ExitFailure; }
            if (failure is NotFoundException)
            {
                err.Line("not found: " + shown + " has no value (a memolock client's fetch found nothing for it)");
                return ExitFailure;
            }
            if (failure is MemoLockTimeoutException)
            {
                string w = GoDur(wait), h = Volatile.Read(ref holder);
                if (Volatile.Read(ref fetched)) err.Line("--wait " + w + " ran out while the command ran here");
                else if (h != null)
                    err.Line("gave up waiting for " + shown + " after " + started.Elapsed.TotalSeconds.ToString("0.0", CultureInfo.InvariantCulture) + "s (--wait " + w + "): " + h + " computes it, and has not finished");
                else err.Line("Redis (" + RedisUrl.Redact(redisUrl) + ") did not answer within --wait " + w + RedisHint(failure));
                return ExitWaitLimit;
            }
            err.Line(LibError(failure) + " (redis " + RedisUrl.Redact(redisUrl) + ")" + RedisHint(failure));
            return ExitFailure;
        }
    }
}
