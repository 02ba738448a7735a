"""The CLI's help pages, laid out as the Go CLI's (cmd/memolock/cli.go): a
one-line summary, usage lines, what the command does, its flags with their
defaults, the environment, the exit status and examples, so that a reader
(or a script) finds the same parts in the same places in every memolock
CLI."""

FLAG_COLUMN = 26
EXIT_COLUMN = 11
WIDTH = 80


def wrap(text, indent, width=WIDTH):
    """text filled into lines of at most width columns, each after indent."""
    out, line = [], indent
    for word in text.split():
        if len(line) > len(indent) and len(line) + 1 + len(word) > width:
            out.append(line)
            line = indent
        if len(line) > len(indent):
            line += " "
        line += word
    out.append(line)
    return "\n".join(out) + "\n"


def column(term, text, at=FLAG_COLUMN):
    """A term and its text, the text wrapped in a column of its own."""
    body = wrap(text, " " * at)
    if len(term) < at - 1:
        return term + body[len(term):]
    return term + "\n" + body


class Flag:
    """One flag of a page: --name ARG, what it does, its default as shown."""

    def __init__(self, name, arg, usage, default=""):
        self.name, self.arg, self.usage, self.default = name, arg, usage, default


class Page:
    def __init__(self, name, summary, usage, about="", flags=None, env=False, exits=(), examples=()):
        self.name, self.summary, self.usage, self.about = name, summary, usage, about
        self.flags, self.env, self.exits, self.examples = flags, env, exits, examples

    def render(self, prog):
        b = [f"{prog} {self.name}: {self.summary}\n\nUsage:\n"]
        for u in self.usage:
            b.append(f"  {prog} {u}\n")
        for p in self.about.strip().split("\n\n") if self.about else ():
            b.append("\n")
            b.append(wrap(p.replace("PROG", prog), ""))
        if self.flags is not None:
            b.append("\nFlags:\n")
            for f in self.flags:
                left = "  --" + f.name + (" " + f.arg if f.arg else "")
                usage = f.usage + (f" (default {f.default})" if f.default not in ("", "0", "0s", "false") else "")
                b.append(column(left, usage))
            b.append(column("  -h, --help", "show this help"))
        if self.env:
            b.append("\nEnvironment:\n")
            b.append(column("  MEMOLOCK_REDIS",
                            "the Redis URL when --redis is not given (never printed: it may hold a password)"))
        if self.exits:
            b.append("\nExit status:\n")
            for code, text in self.exits:
                b.append(column("  " + code, text.replace("PROG", prog), EXIT_COLUMN))
        if self.examples:
            b.append("\nExamples:\n")
            for i, (comment, line) in enumerate(self.examples):
                if i:
                    b.append("\n")
                b.append(wrap(comment, "  # "))
                b.append(f"  {line.replace('PROG', prog)}\n")
        return "".join(b)


DEFAULT_REDIS_URL = "redis://127.0.0.1:6379"

RUN = Page(
    "run", "run a command once across machines, and print its output, cached in Redis",
    ["run --tag T --id ID --ttl DURATION [flags] -- CMD [ARGS...]",
     "run --tag T --id-hex HEX --ttl DURATION [flags] -- CMD [ARGS...]",
     "run --tag T --id-base64 B64 --ttl DURATION [flags] -- CMD [ARGS...]"],
    about="""Runs CMD at most once at a time per key across every process and machine that shares the Redis server, and prints its standard output. An invocation that comes while another one runs CMD waits for it, then prints the same bytes; one that comes later, within --ttl, prints them from Redis without running anything. Invocations of the Go, Python and C# memolock CLIs share keys: any of them may compute what another prints.

The key is --tag and --id, not the command: invocations with the same tag and id share one output whatever their commands are, so put in the id whatever the output depends on. Only standard output is cached. Standard error passes through, and the exit status is that of the run that computed; if CMD fails, nothing is cached, the invocation that ran it passes its output and status through, and the waiting ones exit 1 at once.

On a terminal, a status line on stderr shows whom the invocation waits for, or how long CMD has run here, updated in place; CMD's stderr then reaches the terminal through PROG, so that the line stays below it (--quiet hands CMD the terminal itself). Off a terminal, a waiting invocation says so once when the wait starts, then at most once every 30s, and once more if the lock came free and CMD runs here after all.

On a signal (SIGINT, SIGTERM, SIGHUP, SIGQUIT) PROG stops every process of CMD, SIGTERM first and SIGKILL 2s later (at once on a second signal), then releases the lock: a waiting invocation takes over at once.

This is the Python peer: it has the run command alone, and no --cluster (Go's memolock has both).""",
    flags=[
        Flag("tag", "TAG", "the key's TAG, which every key and channel of the id starts with (required)"),
        Flag("id", "ID", "the key's ID: the argument's bytes as they are"),
        Flag("id-hex", "HEX", "the id as HEX digits, two per byte, either case"),
        Flag("id-base64", "BASE64", "the id in standard BASE64 (A-Z a-z 0-9 + /), padding optional"),
        Flag("ttl", "DURATION",
             "how long the output stays cached: a DURATION such as 30s, 10m or 1h; 0 keeps it for ever (required)"),
        Flag("lock-ttl", "DURATION", "how long others wait (a DURATION) before they take over from an invocation "
             "that died without a word; renewed while CMD runs", "10s"),
        Flag("wait", "DURATION", "give up waiting after this long (a DURATION) and exit 124; 0 waits as long as "
             "it takes"),
        Flag("redis", "URL", "URL of the Redis server: redis://[[user]:password@]host:port[/db], rediss:// for "
             f"TLS, unix:///path/to.sock (default $MEMOLOCK_REDIS, then {DEFAULT_REDIS_URL})"),
        Flag("quiet", "", "print no status line (errors only)"),
    ],
    env=True,
    exits=[
        ("0", "the output was printed: computed here, by another invocation, or from Redis"),
        ("N", "CMD's own status, when it ran here and failed (its output is printed too)"),
        ("1", "CMD failed where it ran, in another invocation; or Redis could not be reached, or refused; or "
              "a memolock client recorded that the id has no value (\"not found\")"),
        ("2", "bad usage"),
        ("124", "--wait ran out (as timeout(1) exits)"),
        ("126", "CMD cannot be executed (or its #! interpreter is missing)"),
        ("127", "CMD was not found"),
        ("128+N", "CMD was killed by signal N, or signal N interrupted PROG: 130 for SIGINT, 143 for SIGTERM"),
    ],
    examples=[
        ("Build a report once, whichever machine asks first; the others print the same bytes.",
         "PROG run --tag reports --id 2026-11 --ttl 1h -- ./build-report 2026-11"),
        ("Give up after 30s of waiting for another machine (exit 124).",
         "PROG run --tag reports --id 2026-11 --ttl 1h --wait 30s -- ./build-report 2026-11"),
        ("An id that is not text.", "PROG run --tag blobs --id-hex 00ff17 --ttl 10m -- ./fetch-blob 00ff17"),
        ("A server with a password: the colon before it matters.",
         "MEMOLOCK_REDIS=redis://:PASSWORD@cache PROG run --tag t --id x --ttl 1m -- date"),
    ],
)
VERSION = Page("version", "print this CLI's version, and the Python and redis-py that run it",
               ["version", "--version"], flags=[], exits=[("0", "always")])

HELP = Page("help", "show the help page of a command", ["help [COMMAND]", "COMMAND --help"],
            exits=[("0", "the page was printed"), ("2", "no such command")])

PAGES = {p.name: p for p in (RUN, VERSION, HELP)}


def render(page, prog):
    return page.render(prog).replace("PROG", prog)


def main_page(prog):
    """The page of `PROG --help`."""
    b = ["The Python peer of memolock: it shares the result of an expensive computation between processes and "
         "machines through Redis, with the Go and C# memolock CLIs and libraries: the first caller computes, every "
         "other one waits for its value, which Redis then keeps for a while.\n\n"]
    b[0] = wrap(b[0], "") + "\n"
    b.append(f"Usage:\n  {prog} COMMAND [flags]\n\nCommands:\n")
    for p in PAGES.values():
        b.append(f"  {p.name:<9} {p.summary}\n")
    b.append("\n")
    b.append(wrap(f"Run '{prog} COMMAND --help' (or '{prog} help COMMAND') for the flags, exit status and examples "
                  "of a command. This CLI has the run command alone; Go's memolock also has demo, inspect, watch "
                  "and check.", ""))
    b.append("\nRedis:\n")
    b.append(wrap("run takes --redis URL: redis://[[user]:password@]host:port[/db], rediss:// for TLS, or "
                  f"unix:///path/to.sock. Without --redis it uses $MEMOLOCK_REDIS, then {DEFAULT_REDIS_URL}. "
                  "A password goes before the @, after a colon: redis://:PASSWORD@host. Passwords are never "
                  "printed.", "  "))
    b.append("\nExit status:\n")
    b.append("  0    done\n  1    failed: Redis unreachable or refusing\n  2    bad usage\n")
    b.append(f"  run passes its command's own status through: see '{prog} run --help'.\n")
    b.append("\nExamples:\n")
    b.append(f"  {prog} run --tag reports --id 2026-11 --ttl 1h -- ./build-report 2026-11\n")
    b.append(f"  {prog} help run\n")
    return "".join(b)
