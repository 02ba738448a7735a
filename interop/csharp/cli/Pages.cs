// The CLI's help pages, laid out as the Go CLI's (cmd/memolock/cli.go): a
// one-line summary, usage lines, what the command does, its flags with
// their defaults, the environment, the exit status and examples, so that a
// reader (or a script) finds the same parts in the same places in every
// memolock CLI.
using System;
using System.Collections.Generic;
using System.Text;

namespace MemoLockCli
{
    sealed class Page
    {
        public string Name, Summary, About = "";
        public string[] Usage;
        public string[][] Flags;    // name, argument, usage, default; null: no Flags section
        public bool Env;
        public string[][] Exits = new string[0][];
        public string[][] Examples = new string[0][]; // a comment, then a command line (PROG: the program)

        const int FlagColumn = 26, ExitColumn = 11, Width = 80;

        public static string Wrap(string text, string indent)
        {
            var b = new StringBuilder();
            string line = indent;
            foreach (var word in text.Split(new[] { ' ', '\n', '\t' }, StringSplitOptions.RemoveEmptyEntries))
            {
                if (line.Length > indent.Length && line.Length + 1 + word.Length > Width) { b.Append(line).Append('\n'); line = indent; }
                if (line.Length > indent.Length) line += " ";
                line += word;
            }
            return b.Append(line).Append('\n').ToString();
        }

        public static string Column(string term, string text, int at = FlagColumn)
        {
            string body = Wrap(text, new string(' ', at));
            return term.Length < at - 1 ? term + body.Substring(term.Length) : term + "\n" + body;
        }

        public string Render(string prog)
        {
            var b = new StringBuilder();
            b.Append(prog).Append(' ').Append(Name).Append(": ").Append(Summary).Append("\n\nUsage:\n");
            foreach (var u in Usage) b.Append("  ").Append(prog).Append(' ').Append(u).Append('\n');
            foreach (var p in About.Trim().Split(new[] { "\n\n" }, StringSplitOptions.RemoveEmptyEntries))
                b.Append('\n').Append(Wrap(p.Replace("PROG", prog), ""));
            if (Flags != null)
            {
                b.Append("\nFlags:\n");
                foreach (var f in Flags)
                {
                    string left = "  --" + f[0] + (f[1] != "" ? " " + f[1] : "");
                    string usage = f[2] + (f[3] != "" && f[3] != "0" && f[3] != "0s" && f[3] != "false" ? " (default " + f[3] + ")" : "");
                    b.Append(Column(left, usage));
                }
                b.Append(Column("  -h, --help", "show this help"));
            }
            if (Env)
                b.Append("\nEnvironment:\n").Append(Column("  MEMOLOCK_REDIS", "the Redis URL when --redis is not given (never printed: it may hold a password)"));
            if (Exits.Length > 0)
            {
                b.Append("\nExit status:\n");
                foreach (var e in Exits) b.Append(Column("  " + e[0], e[1].Replace("PROG", prog), ExitColumn));
            }
            if (Examples.Length > 0)
            {
                b.Append("\nExamples:\n");
                for (int i = 0; i < Examples.Length; i++)
                {
                    if (i > 0) b.Append('\n');
                    b.Append(Wrap(Examples[i][0], "  # ")).Append("  ").Append(Examples[i][1].Replace("PROG", prog)).Append('\n');
                }
            }
            return b.ToString();
        }

        public const string DefaultRedisUrl = "redis://127.0.0.1:6379";

        public static readonly Page Run = new Page
        {
            Name = "run",
            Summary = "run a command once across machines, and print its output, cached in Redis",
            Usage = new[]
            {
                "run --tag T --id ID --ttl DURATION [flags] -- CMD [ARGS...]",
                "run --tag T (--id-hex HEX | --id-base64 B64) --ttl DURATION [flags] -- CMD [ARGS...]",
            },
            About = @"Runs CMD at most once at a time per key across every process and machine that shares the Redis server, and prints its standard output. An invocation that comes while another one runs CMD waits for it, then prints the same bytes; one that comes later, within --ttl, prints them from Redis without running anything. Invocations of the Go, Python and C# memolock CLIs share keys: any of them may compute what another prints.

The key is --tag and --id, not the command: invocations with the same tag and id share one output whatever their commands are, so put in the id whatever the output depends on. Only standard output is cached. Standard error passes through, and the exit status is that of the run that computed; if CMD fails, nothing is cached, the invocation that ran it passes its output and status through, and the waiting ones exit 1 at once.

On a terminal, a status line on stderr shows whom the invocation waits for, or how long CMD has run here, updated in place; CMD's stderr then reaches the terminal through PROG, so that the line stays below it (--quiet hands CMD the terminal itself). Off a terminal, a waiting invocation says so once when the wait starts, then at most once every 30s, and once more if the lock came free and CMD runs here after all.

On a signal (SIGINT, SIGTERM, SIGHUP, SIGQUIT) PROG stops every process of CMD, SIGTERM first and SIGKILL 2s later (at once on a second signal), then releases the lock: a waiting invocation takes over at once.

This is the C# peer, run by Mono through its launcher (bin/memolock), which passes the arguments on as raw bytes: it has the run command alone, no --cluster, and no rediss:// (Go's memolock has all three).",
            Flags = new[]
            {
                new[] { "tag", "TAG", "the key's TAG, which every key and channel of the id starts with (required)", "" },
                new[] { "id", "ID", "the key's ID: the argument's bytes as they are", "" },
                new[] { "id-hex", "HEX", "the id as HEX digits, two per byte, either case", "" },
                new[] { "id-base64", "BASE64", "the id in standard BASE64 (A-Z a-z 0-9 + /), padding optional", "" },
                new[] { "ttl", "DURATION", "how long the output stays cached: a DURATION such as 30s, 10m or 1h; 0 keeps it for ever (required)", "" },
                new[] { "lock-ttl", "DURATION", "how long others wait (a DURATION) before they take over from an invocation that died without a word; renewed while CMD runs", "10s" },
                new[] { "wait", "DURATION", "give up waiting after this long (a DURATION) and exit 124; 0 waits as long as it takes", "" },
                new[] { "redis", "URL", "URL of the Redis server: redis://[[user]:password@]host:port[/db] or unix:///path/to.sock (default $MEMOLOCK_REDIS, then " + DefaultRedisUrl + ")", "" },
                new[] { "quiet", "", "print no status line (errors only)", "" },
            },
            Env = true,
            Exits = new[]
            {
                new[] { "0", "the output was printed: computed here, by another invocation, or from Redis" },
                new[] { "N", "CMD's own status, when it ran here and failed (its output is printed too)" },
                new[] { "1", "CMD failed where it ran, in another invocation; or Redis could not be reached, or refused; or a memolock client recorded that the id has no value (\"not found\")" },
                new[] { "2", "bad usage" },
                new[] { "124", "--wait ran out (as timeout(1) exits)" },
                new[] { "126", "CMD cannot be executed (or its #! interpreter is missing)" },
                new[] { "127", "CMD was not found" },
                new[] { "128+N", "CMD was killed by signal N, or signal N interrupted PROG: 130 for SIGINT, 143 for SIGTERM" },
            },
            Examples = new[]
            {
                new[] { "Build a report once, whichever machine asks first; the others print the same bytes.", "PROG run --tag reports --id 2026-11 --ttl 1h -- ./build-report 2026-11" },
                new[] { "Give up after 30s of waiting for another machine (exit 124).", "PROG run --tag reports --id 2026-11 --ttl 1h --wait 30s -- ./build-report 2026-11" },
                new[] { "An id that is not text.", "PROG run --tag blobs --id-hex 00ff17 --ttl 10m -- ./fetch-blob 00ff17" },
                new[] { "A server with a password: the colon before it matters.", "MEMOLOCK_REDIS=redis://:PASSWORD@cache:6379 PROG run --tag t --id x --ttl 1m -- date" },
            },
        };

        public static readonly Page Version = new Page
        {
            Name = "version",
            Summary = "print this CLI's version, and the Mono that runs it",
            Usage = new[] { "version", "--version" },
            Flags = new string[0][],
            Exits = new[] { new[] { "0", "always" } },
        };

        public static readonly Page Help = new Page
        {
            Name = "help",
            Summary = "show the help page of a command",
            Usage = new[] { "help [COMMAND]", "COMMAND --help" },
            Exits = new[] { new[] { "0", "the page was printed" }, new[] { "2", "no such command" } },
        };

        public static readonly Page[] All = { Run, Version, Help };

        public static Page Find(string name)
        {
            foreach (var p in All) if (p.Name == name) return p;
            return null;
        }

        /// <summary>The page of `PROG --help`.</summary>
        public static string Overview(string prog)
        {
            var b = new StringBuilder();
            b.Append(Wrap("The C# peer of memolock: it shares the result of an expensive computation between processes and machines through Redis, with the Go and Python memolock CLIs and libraries: the first caller computes, every other one waits for its value, which Redis then keeps for a while.", "")).Append('\n');
            b.Append("Usage:\n  ").Append(prog).Append(" COMMAND [flags]\n\nCommands:\n");
            foreach (var p in All) b.Append("  ").Append(p.Name.PadRight(9)).Append(' ').Append(p.Summary).Append('\n');
            b.Append('\n').Append(Wrap("Run '" + prog + " COMMAND --help' (or '" + prog + " help COMMAND') for the flags, exit status and examples of a command. This CLI has the run command alone; Go's memolock also has demo, inspect, watch and check.", ""));
            b.Append("\nRedis:\n").Append(Wrap("run takes --redis URL: redis://[[user]:password@]host:port[/db], or unix:///path/to.sock. Without --redis it uses $MEMOLOCK_REDIS, then " + DefaultRedisUrl + ". A password goes before the @, after a colon: redis://:PASSWORD@host. Passwords are never printed.", "  "));
            b.Append("\nExit status:\n  0    done\n  1    failed: Redis unreachable or refusing\n  2    bad usage\n");
            b.Append("  run passes its command's own status through: see '").Append(prog).Append(" run --help'.\n");
            b.Append("\nExamples:\n  ").Append(prog).Append(" run --tag reports --id 2026-11 --ttl 1h -- ./build-report 2026-11\n  ").Append(prog).Append(" help run\n");
            return b.ToString();
        }
    }
}
