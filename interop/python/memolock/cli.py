"""`memolock-py run` (or `python3 -m memolock run`): memoize a command's
standard output through Redis.

The Go CLI's `memolock run` (cmd/memolock/runcmd.go), and its conventions
(cmd/memolock/cli.go): the same flags (but --cluster), semantics, exit codes,
help pages, usage errors and status line, so that a script or a person can
use one CLI in place of another. The command's stdout is the value; the
invocation that ran a failing command passes its output and status through
and waiters fail at once; 124 when --wait runs out; 126/127 cannot execute /
not found; 128+N for signals; 2 for bad usage; 1 for other errors, "not
found" (a memolock client's fetch found nothing for the id) included.
"""

import base64
import ctypes
import errno
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.parse

import redis

from . import clipages
from .client import Client
from .durations import go_duration, parse_duration_ns
from .errors import Closed, HolderFailed, NotFound, Timeout
from .protocol import DEFAULT_LOCK_TTL
from .status import Status, relay_stream

EXIT_FAILURE, EXIT_USAGE, EXIT_WAIT_LIMIT, EXIT_CANNOT_EXEC, EXIT_NOT_FOUND, EXIT_SIGNAL_BASE = 1, 2, 124, 126, 127, 128
DEFAULT_REDIS_URL = clipages.DEFAULT_REDIS_URL
KILL_GRACE = 2.0
#: Bound on one Redis reply (go-redis's default ReadTimeout).
COMMAND_TIMEOUT = 3.0
#: The wait without --wait: for ever, in practice.
NO_LIMIT = 10.0 ** 9
WITHHELD = "(URL withheld)"
VERSION = "0.1.0"  # pyproject.toml's
#: The name of the installed command; `python3 -m memolock` passes its own.
PROG = "memolock-py"

# Signals as Go names them (syscall.Signal.String on Linux), for the texts
# that waiters elsewhere read (PROTOCOL.md, [A6]).
SIGNAL_NAMES = {
    1: "hangup", 2: "interrupt", 3: "quit", 4: "illegal instruction", 5: "trace/breakpoint trap", 6: "aborted",
    7: "bus error", 8: "floating point exception", 9: "killed", 10: "user defined signal 1",
    11: "segmentation fault", 12: "user defined signal 2", 13: "broken pipe", 14: "alarm clock", 15: "terminated",
    16: "stack fault", 17: "child exited", 18: "continued", 19: "stopped (signal)", 20: "stopped",
    21: "stopped (tty input)", 22: "stopped (tty output)", 23: "urgent I/O condition",
    24: "CPU time limit exceeded", 25: "file size limit exceeded", 26: "virtual timer expired",
    27: "profiling timer expired", 28: "window changed", 29: "I/O possible", 30: "power failure",
    31: "bad system call",
}


def signal_name(n):
    return SIGNAL_NAMES.get(n, f"signal {n}")


class ExitError(Exception):
    """The command failed where it ran."""

    def __init__(self, code=0, sig=0):
        self.code, self.sig = code, sig
        if sig:
            super().__init__(f"command killed by signal {sig} ({signal_name(sig)})")
        else:
            super().__init__(f"command exited with status {code}")


class StartError(Exception):
    def __init__(self, code, msg):
        self.code = code
        super().__init__(msg)


class Interrupted(Exception):
    pass


class UsageError(Exception):
    """Bad usage: the message names the flag."""


class HelpWanted(Exception):
    """-h or --help among the flags."""


# --- words for messages ------------------------------------------------------

def redact(raw):
    """A Redis URL fit for output: no password, user or query value."""
    try:
        u = urllib.parse.urlsplit(raw)
        if u.fragment or u.scheme not in ("redis", "rediss", "unix") or (not u.netloc and u.scheme != "unix"):
            return WITHHELD
        if u.scheme != "unix" and not raw.startswith(u.scheme + "://"):
            return WITHHELD
        host = u.hostname or ""
        if ":" in host:
            host = "[" + host + "]"
        if u.port:
            host += f":{u.port}"
        if u.username is not None or u.password is not None or "@" in u.netloc:
            host = "xxxxx@" + host
        path = u.path
        if u.scheme != "unix" and path.strip("/0123456789") != "":
            path = "/xxxxx"
        out = f"{u.scheme}://{host}{path}"
        if u.query:
            q = urllib.parse.parse_qs(u.query, keep_blank_values=True, strict_parsing=True)
            out += "?" + urllib.parse.urlencode(sorted((k, "xxxxx") for k in q))
        return out
    except ValueError:
        return WITHHELD


def may_hold_password(arg):
    return "://" in arg or "@" in arg


def redact_arg(arg):
    """A command-line argument fit for an error message: as it is, or, if it
    may be a URL with a password in it, redacted as URLs are."""
    return redact(arg) if may_hold_password(arg) else arg


def _printable(ch):
    return ch.isprintable() and not 0xDC80 <= ord(ch) <= 0xDCFF


def go_quote(s):
    """s in double quotes, with Go's escapes (strconv.Quote); bytes that are
    not UTF-8 (surrogate escapes in argv) as \\xNN."""
    named = {"\a": "\\a", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t", "\v": "\\v"}
    out = []
    for ch in s:
        o = ord(ch)
        if ch in '"\\':
            out.append("\\" + ch)
        elif 0xDC80 <= o <= 0xDCFF:
            out.append(f"\\x{o - 0xDC00:02x}")
        elif ch.isprintable():
            out.append(ch)
        elif ch in named:
            out.append(named[ch])
        elif o < 0x80:
            out.append(f"\\x{o:02x}")
        elif o <= 0xFFFF:
            out.append(f"\\u{o:04x}")
        else:
            out.append(f"\\U{o:08x}")
    return '"' + "".join(out) + '"'


def quote_arg(s):
    """An argument in double quotes: as it is if it prints plainly."""
    if all(_printable(c) and c not in '"\\' for c in s):
        return '"' + s + '"'
    return go_quote(s)


def quote_char(c):
    if 0xDC80 <= ord(c) <= 0xDCFF:
        c = "\ufffd"  # a byte that is not UTF-8: Go reads it as U+FFFD
    if c.isprintable() and c not in "'\\":
        return "'" + c + "'"
    return "'" + go_quote(c)[1:-1].replace("'", "\\'") + "'"


# --- ids -----------------------------------------------------------------------

ID_FLAGS = ("id", "id-hex", "id-base64")
_B64 = set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/")


def _from_hex(s):
    for i, c in enumerate(s):
        if c not in "0123456789abcdefABCDEF":
            return None, f"{quote_char(c)} at {i} is not a hex digit"
    if len(s) % 2:
        return None, f"odd length: {len(s)} hex digits (two per byte)"
    return bytes.fromhex(s), None


def _from_base64(s):
    end = len(s.rstrip("="))
    pad = len(s) - end
    for i, c in enumerate(s[:end]):
        if c not in _B64:
            return None, (f"{quote_char(c)} at {i} is not in the standard base64 alphabet "
                          "(A-Z a-z 0-9 + /, then = padding)")
    if end % 4 == 1:
        return None, f"a length of {end} base64 characters cannot be decoded"
    want = -end % 4
    if pad and pad != want:
        return None, f"wrong padding: {pad} '=' after {end} characters (want {want})"
    # Bits left over in the last character are ignored, as Go's and .NET's
    # decoders ignore them.
    return base64.b64decode(s[:end] + "=" * want), None


def one_id(given):
    """The id from the id flags given, [(name, value)] in order: None if none
    was given. An id flag given twice counts once, its last value winning,
    as for any other flag; two different ones are a usage error. --id is the
    argument's own bytes, as Go sees argv (os.fsencode undoes Python's
    decoding of argv, surrogateescape included)."""
    last, names = {}, []
    for name, v in given:
        if name not in last:
            names.append("--" + name)
        last[name] = v
    if not names:
        return None
    if len(names) > 1:
        raise UsageError(f"give one of --id, --id-hex and --id-base64, not {' and '.join(names)}")
    (name, v), = last.items()
    if name == "id":
        return os.fsencode(v)
    b, why = (_from_hex if name == "id-hex" else _from_base64)(v)
    if why:
        raise UsageError(f"--{name} {quote_arg(v)}: {why}")
    return b


# --- flags ---------------------------------------------------------------------

RUN_FLAGS = {"tag": "string", "id": "id", "id-hex": "id", "id-base64": "id", "ttl": "duration",
             "lock-ttl": "duration", "wait": "duration", "redis": "string", "quiet": "bool"}
_FLOAT = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?|[+-]?(inf|infinity|nan)", re.I)


def _duration(name, v):
    try:
        return parse_duration_ns(v)
    except ValueError:
        pass
    shown = go_quote(redact_arg(v))
    if _FLOAT.fullmatch(v):
        raise UsageError(f"--{name} {shown}: a duration needs a unit: {v}s, {v}ms, {v}m or {v}h")
    raise UsageError(f"--{name} {shown}: not a duration: write it as 500ms, 30s, 10m or 1h30m")


def parse_flags(defs, args):
    """Parses args as Go's flag package does (-name or --name, then =value or
    the next argument; a switch takes =true or =false; the flags end at
    "--" or the first argument that is not one), with its errors worded
    with --name. Returns (values, id flags in order, the rest); raises
    UsageError, or HelpWanted for -h and --help."""
    vals, ids = {}, []
    i = 0
    while i < len(args):
        a = args[i]
        if len(a) < 2 or a[0] != "-":
            break
        if a == "--":
            i += 1
            break
        name = a[2:] if a[1] == "-" else a[1:]
        if not name or name[0] in "-=":
            raise UsageError(f"bad flag syntax: {redact_arg(a)}")
        value = None
        if "=" in name:
            name, value = name.split("=", 1)
        kind = defs.get(name)
        if kind is None:
            if name in ("h", "help"):
                raise HelpWanted()
            raise UsageError(f"unknown flag --{redact_arg(name)}")
        i += 1
        if kind == "bool":
            if value is None:
                vals[name] = True
            elif value.lower() in ("1", "t", "true"):
                vals[name] = True
            elif value.lower() in ("0", "f", "false"):
                vals[name] = False
            else:
                raise UsageError(f"--{name} {go_quote(redact_arg(value))}: a switch takes no value (or =true, =false)")
            continue
        if value is None:
            if i >= len(args):
                raise UsageError(f"--{name} needs a value")
            value = args[i]
            i += 1
        if kind == "id":
            ids.append((name, value))
        elif kind == "duration":
            vals[name] = _duration(name, value)
        else:
            vals[name] = value
    return vals, ids, args[i:]


def stray_before_dashes(args, argv):
    """Whether the flags ended at an argument that is not a flag, with a "--"
    after it: argv, the arguments left, is then not the command."""
    j = len(args) - len(argv) - 1
    if j >= 0 and args[j] == "--":
        return False
    return "--" in argv


# --- Redis ---------------------------------------------------------------------

#: The query parameters redis-py takes from a URL (and those of TLS).
URL_PARAMS = {"db", "socket_timeout", "socket_connect_timeout", "socket_keepalive", "retry_on_timeout",
              "retry_on_error", "max_connections", "health_check_interval", "client_name"}
TLS_PARAMS = {"ssl_check_hostname", "ssl_cert_reqs", "ssl_ca_certs", "ssl_ca_path", "ssl_certfile", "ssl_keyfile"}


def _why_withheld(raw):
    try:
        u = urllib.parse.urlsplit(raw)
    except ValueError:
        return ": it does not parse as a URL"
    if not u.scheme:
        return ": it has no scheme"
    if not raw.startswith(u.scheme + "://") and u.scheme != "unix":
        return ": it has no // after its scheme"
    if u.scheme not in ("redis", "rediss", "unix"):
        return ": its scheme is not redis://, rediss:// (TLS) or unix://"
    if not u.netloc and u.scheme != "unix":
        return ": it has no host"
    return ""


def url_problem(raw):
    """What is wrong with a --redis URL, naming the part and never quoting a
    value (any of them may be a password); None if nothing is."""
    if redact(raw) == WITHHELD:
        return f"{WITHHELD} is not of the form redis://[[user]:password@]host:port[/db]{_why_withheld(raw)}"
    shown = redact(raw)
    u = urllib.parse.urlsplit(raw)
    if re.search(r"%(?![0-9A-Fa-f]{2})", raw):
        return (f"{shown} is not a valid Redis URL: it has a bad %-escape (a % must be followed by two hex "
                "digits: write a % in a password as %25)")
    try:
        u.port
    except ValueError:
        return f"{shown} is not a valid Redis URL: its port is not a number"
    if u.scheme == "unix" and not u.path:
        return f"{shown} is not a valid Redis URL: it names no socket: unix:///path/to/redis.sock"
    if u.scheme != "unix" and u.path.strip("/") and not u.path.strip("/").isdigit():
        return f"{shown} is not a valid Redis URL: the database (its path) is not a number: redis://host:port/0"
    q = urllib.parse.parse_qs(u.query, keep_blank_values=True)
    allowed = URL_PARAMS | (TLS_PARAMS if u.scheme == "rediss" else set())
    unknown = [k for k in q if k not in allowed]
    if unknown:
        hint = ""
        if "password" in unknown:
            hint = ("; a password goes in the URL itself: redis://:PASSWORD@host:port, or "
                    "redis://USER:PASSWORD@host:port")
        elif "username" in unknown or "user" in unknown:
            hint = "; a user goes in the URL itself: redis://USER:PASSWORD@host:port"
        names = ", ".join(go_quote(redact_arg(k)) for k in unknown)
        return f"{shown} is not a valid Redis URL: unknown parameter {names}{hint}"
    try:
        redis.connection.parse_url(raw)
    except ValueError as e:
        m = re.search(r"`(\w+)`", str(e))
        what = f"parameter {go_quote(m.group(1))} has a value redis-py cannot read" if m else "redis-py cannot read it"
        return f"{shown} is not a valid Redis URL: {what}"
    return None


def _causes(err):
    while err is not None:
        yield err
        err = err.__cause__ or err.__context__


def redis_hint(err, raw):
    """What an operator may do about err, a failure talking to the Redis
    server at raw, as "; ...", or ""."""
    text = " ".join(str(e) for e in _causes(err))
    kinds = {type(e).__name__ for e in _causes(err)}
    u = urllib.parse.urlsplit(raw)
    user_only = u.username is not None and u.password is None
    noauth = "Authentication required" in text or "NOAUTH" in text
    wrongpass = "invalid username-password pair" in text or "WRONGPASS" in text or "invalid password" in text
    if (noauth or wrongpass) and user_only:
        return ("; the URL has a user name but no password: if that name is the password (redis-cli's "
                "redis://PASSWORD@host), write redis://:PASSWORD@host")
    if noauth:
        return "; the server wants a password: redis://:PASSWORD@host, or redis://USER:PASSWORD@host for an ACL user"
    if wrongpass:
        return "; the user name or the password is wrong, or the user is disabled"
    if "NoPermissionError" in kinds or "NOPERM" in text or "no permissions" in text or \
            "user executing the script can't run" in text:
        return "; the Redis user lacks a permission: 'memolock check' (Go's CLI) names the ACL rules to add"
    if "MOVED " in text or "CROSSSLOT" in text:
        return "; this is a Redis Cluster, which this CLI does not support: Go's memolock run --cluster does"
    return ""


def lib_error(err):
    """The text of a library error without its "memolock: " prefixes: the
    CLI's own prefix says where it comes from."""
    msg = str(err)
    while msg.startswith("memolock: "):
        msg = msg[len("memolock: "):]
    return msg.replace(": memolock: ", ": ")


# --- the command's processes -------------------------------------------------

def _descendants():
    """Processes descended from this one (not zombies), from /proc."""
    me = os.getpid()
    parent = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat", "rb") as fh:
                st = fh.read()
        except OSError:
            continue
        rest = st[st.rfind(b")") + 2:].split()
        if rest[0] == b"Z":
            continue
        parent[int(d)] = int(rest[1])
    out = []
    for pid in parent:
        p, seen = pid, 0
        while p in parent and seen < 64:
            p = parent[p]
            seen += 1
            if p == me:
                out.append(pid)
                break
    return out


def _reap_orphans(leader):
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid <= 0:
            return


def _set_subreaper():
    try:
        ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
    except Exception:
        pass


def stop_all(proc, force):
    """SIGTERM every process of the command, SIGKILL after KILL_GRACE (or
    once force is set); returns once the leader and all others are gone."""
    sig = signal.SIGTERM
    deadline = time.monotonic() + KILL_GRACE
    sent = None
    while True:
        if time.monotonic() >= deadline or force.is_set():
            sig = signal.SIGKILL
        leader_done = proc.poll() is not None
        if leader_done:
            _reap_orphans(proc.pid)
        procs = _descendants()
        if leader_done and not procs:
            return
        if sent != sig or True:
            for p in procs:
                try:
                    os.kill(p, sig)
                except OSError:
                    pass
            sent = sig
        time.sleep(0.02)


class Signals:
    """SIGINT, SIGTERM, SIGHUP, SIGQUIT: the first sets `first`, a second `second`."""

    SIGS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)

    def __init__(self):
        self.got = 0
        self.first = threading.Event()
        self.second = threading.Event()
        self._old = {s: signal.signal(s, self._handle) for s in self.SIGS}

    def _handle(self, signum, frame):
        if self.got:
            self.second.set()
            return
        self.got = signum
        self.first.set()

    def restore(self):
        for s, h in self._old.items():
            signal.signal(s, h)


def _go_errno(e):
    """An OSError's reason as Go words it: the C library's, lower case first."""
    s = e.strerror or str(e)
    return s[:1].lower() + s[1:]


def _start(argv, stdout_fd, stderr_fd=None):
    path = argv[0]
    if "/" not in path:
        # As Go's exec.LookPath: only an executable file on $PATH counts
        # (a match without the x bit is "not found", 127, not 126).
        found = shutil.which(path)
        if found is None:
            raise StartError(EXIT_NOT_FOUND, f'exec: "{path}": executable file not found in $PATH')
        path = found
    try:
        return subprocess.Popen(argv, executable=path, stdout=stdout_fd, stderr=stderr_fd, close_fds=True)
    except OSError as e:
        if e.errno == errno.ENOEXEC:
            # As Go: /bin/sh runs the file found, not a name it would look up itself.
            return _start(["/bin/sh", path] + argv[1:], stdout_fd, stderr_fd)
        # Go's words, so that a waiter elsewhere reads the same failure
        # whichever CLI ran the command (PROTOCOL.md, [A6]).
        why = f"fork/exec {path}: {_go_errno(e)}"
        if isinstance(e, FileNotFoundError):
            if os.path.exists(path):
                raise StartError(EXIT_CANNOT_EXEC, f"{path}: bad interpreter: {why}")
            raise StartError(EXIT_NOT_FOUND, why)
        raise StartError(EXIT_CANNOT_EXEC, why)


def run_group(argv, sig, cancelled, result, status=None):
    """Runs argv; returns its stdout, raises ExitError / StartError, or
    Interrupted once the command's processes are stopped and gone. With a
    status line on a terminal, the command's stderr passes through it."""
    if sig.first.is_set() or cancelled.is_set():
        raise Interrupted()
    r, w = os.pipe()
    er = ew = None
    if status is not None and status.on_terminal():
        er, ew = os.pipe()
    try:
        proc = _start(argv, w, ew)
    except BaseException:
        if er is not None:
            os.close(er)
        raise
    finally:
        os.close(w)
        if ew is not None:
            os.close(ew)
    relayed = relay_stream(status, er) if er is not None else None
    try:
        return _collect(proc, r, sig, cancelled, result)
    finally:
        if relayed is not None:
            # The last of the command's stderr, before anything run says
            # about its end; a process it left behind that holds stderr
            # open does not hold run up for long.
            relayed.join(0.2)


def _collect(proc, r, sig, cancelled, result):
    """The output of proc, from r, once it and its output have ended."""
    chunks = []

    def reader():
        while True:
            try:
                b = os.read(r, 65536)
            except OSError:
                return
            if not b:
                return
            chunks.append(b)

    t = threading.Thread(target=reader, daemon=True)
    t.start()

    def stop():
        stop_all(proc, sig.second)
        os.close(r)
        t.join(1)
        result["partial"] = b"".join(chunks)
        raise Interrupted()

    try:
        while True:
            if sig.first.is_set() or cancelled.is_set():
                stop()
            if proc.poll() is not None:
                if _killed_like(proc.returncode) and sig.first.wait(0.1):
                    stop()
                t.join(0.02)
                if not t.is_alive():
                    break
                continue
            time.sleep(0.01)
    except BaseException:
        if proc.poll() is None:
            stop_all(proc, sig.second)
        raise
    os.close(r)
    out = b"".join(chunks)
    rc = proc.returncode
    if rc < 0:
        result["partial"] = out
        raise ExitError(sig=-rc)
    if rc != 0:
        result["partial"] = out
        raise ExitError(code=rc)
    return out


def _killed_like(rc):
    return rc < 0 or rc > EXIT_SIGNAL_BASE


def _in_thread(fn):
    """Runs fn on another thread, waiting for it in short steps so that the
    signal handlers, which run on this (the main) thread, are not held up."""
    t = threading.Thread(target=fn, daemon=True)
    t.start()
    while t.is_alive():
        t.join(0.05)


class Out:
    """stdout and stderr of a command of the CLI: bytes, and lines on stderr
    that start with "PROG CMD: " exactly once."""

    def __init__(self, prog, cmd, stdout=None, stderr=None):
        self.prog, self.cmd = prog, cmd
        self.stdout = stdout or sys.stdout.buffer
        self.stderr = stderr or sys.stderr.buffer
        self.prefix = f"{prog} {cmd}: "

    def _put(self, stream, text):
        stream.write(text.encode("utf-8", "surrogateescape"))
        stream.flush()

    def page(self, text):
        self._put(self.stdout, text)
        return 0

    def say(self, line):
        self._put(self.stderr, self.prefix + line + "\n")

    def usage(self, msg):
        self._put(self.stderr, f"{self.prefix}{msg}\nRun '{self.prog} {self.cmd} --help' for usage.\n")
        return EXIT_USAGE


def run(args, stdout=None, stderr=None, prog=PROG):
    o = Out(prog, "run", stdout, stderr)
    try:
        vals, ids, argv = parse_flags(RUN_FLAGS, args)
        tag = vals.get("tag", "")
        id = one_id(ids)
        if not tag or id is None or id == b"":
            raise UsageError("--tag and --id (or --id-hex, --id-base64) are required")
        ttl, wait, lock_ttl = vals.get("ttl"), vals.get("wait", 0), vals.get("lock-ttl", 0)
        if ttl is None:
            raise UsageError("--ttl is required (0 caches for ever)")
        if ttl < 0:
            raise UsageError(f"--ttl {go_duration(ttl)} is negative; give how long the output stays cached, or 0 "
                             "for ever")
        if wait < 0:
            raise UsageError(f"--wait {go_duration(wait)} is negative; give a limit, or 0 for none")
        if lock_ttl < 0 or 0 < lock_ttl < 10**6:
            raise UsageError(f"--lock-ttl {go_duration(lock_ttl)} is under 1ms; Redis locks are set in whole "
                             "milliseconds (0: the default, 10s)")
        if not argv:
            raise UsageError("no command given; put it after --")
        if "://" in argv[0] or may_hold_password(argv[0]) and stray_before_dashes(args, argv):
            # A URL after --quiet, which takes none, would otherwise run as
            # the command, and be printed if it failed to start.
            raise UsageError(f"unexpected argument {quote_arg(redact_arg(argv[0]))} before the command; give the "
                             "URL with --redis, and the command after --")
        url = vals.get("redis") or os.environ.get("MEMOLOCK_REDIS") or DEFAULT_REDIS_URL
        problem = url_problem(url)
        if problem:
            raise UsageError(f"--redis {problem}")
    except HelpWanted:
        return o.page(clipages.render(clipages.RUN, prog))
    except UsageError as e:
        return o.usage(str(e))
    lock_ttl = lock_ttl or int(DEFAULT_LOCK_TTL * 1e9)  # 0: the default, as Go's
    # As shown to people: --id as given, other ids as UTF-8 where they are.
    shown = f"{tag}:" + (id.decode("utf-8", "backslashreplace") if not ids or ids[-1][0] != "id" else ids[-1][1])
    extra = {} if url.startswith("unix:") else {"socket_connect_timeout": 5}
    try:
        # go-redis's default read timeout: a stalled Redis fails the run, it does not hang it.
        rdb = redis.Redis.from_url(url, socket_timeout=COMMAND_TIMEOUT, **extra)
    except (ValueError, TypeError):
        return o.usage(f"--redis {redact(url)} is not a valid Redis URL: redis-py cannot read it")
    holder = {}
    fetched = threading.Event()
    status = None

    def on_wait(id_, h):
        holder["last"] = h
        if status is not None:
            status.waiting(id_, h)

    try:
        # The tag's bytes as given too, as Go's.
        client = Client(rdb, os.fsencode(tag), lock_ttl=lock_ttl / 1e9, on_wait=on_wait)
    except ValueError as e:
        rdb.close()
        return o.usage(lib_error(e))
    if not vals.get("quiet"):
        status = Status(o.stderr, o.prefix, shown)
    _set_subreaper()
    sig = Signals()
    closer_stop = threading.Event()

    def closer():
        # A signal closes the client: waiters return Closed at once; a fetch
        # stops the command and hands the lock over.
        while not closer_stop.is_set():
            if sig.first.wait(0.05):
                client.close()
                return

    ct = threading.Thread(target=closer, daemon=True)
    ct.start()
    result = {}

    def fetch(lease):
        fetched.set()
        if status is not None:
            status.computing()
        try:
            out = run_group(argv, sig, lease.cancelled, result, status)
        except Interrupted:
            client.close()  # from inside fetch: hands the lock over with abandon
            raise
        return out, ttl / 1e9

    box = {}
    started = time.monotonic()

    def call():
        try:
            # Always with a timeout, so that the flight runs on a thread of
            # its own and close() ends this wait at once, even while a Redis
            # call hangs.
            box["out"] = client.get(id, fetch, timeout=(wait / 1e9) if wait > 0 else NO_LIMIT)
        except BaseException as e:  # noqa: BLE001
            box["err"] = e

    # The main thread only polls: Python runs signal handlers on it, and a
    # blocking wait there (Event.wait with a timeout) is not interrupted by
    # a signal, so that a handler could run only once the wait ends.
    _in_thread(call)
    _in_thread(client.close)
    closer_stop.set()
    _in_thread(ct.join)
    out, err = box.get("out"), box.get("err")
    if status is not None:
        status.done()
    sig.restore()
    rdb.close()

    if err is None:
        try:
            o.stdout.write(out)
            o.stdout.flush()
        except Exception as e:  # noqa: BLE001
            o.say(f"writing output: {e}")
            return EXIT_FAILURE
        return 0
    if sig.got:
        o.say(f"interrupted by {signal_name(sig.got)}")
        return EXIT_SIGNAL_BASE + sig.got
    if isinstance(err, ExitError):
        try:
            o.stdout.write(result.get("partial", b""))
            o.stdout.flush()
        except Exception:  # noqa: BLE001
            pass
        return EXIT_SIGNAL_BASE + err.sig if err.sig else err.code
    if isinstance(err, StartError):
        o.say(str(err))
        return err.code
    if isinstance(err, HolderFailed):
        o.say(f"the command failed where it ran: {lib_error(err)}")
        return EXIT_FAILURE
    if isinstance(err, NotFound):
        o.say(f"not found: {shown} has no value (a memolock client's fetch found nothing for it)")
        return EXIT_FAILURE
    if isinstance(err, Timeout):
        w = go_duration(wait)
        if fetched.is_set():
            o.say(f"--wait {w} ran out while the command ran here")
        elif holder.get("last"):
            o.say(f"gave up waiting for {shown} after {time.monotonic() - started:.1f}s (--wait {w}): "
                  f"{holder['last']} computes it, and has not finished")
        else:
            # Nobody was seen holding the lock: Redis never answered.
            o.say(f"Redis ({redact(url)}) did not answer within --wait {w}{redis_hint(err, url)}")
        return EXIT_WAIT_LIMIT
    if isinstance(err, Closed) and isinstance(err.__cause__, Interrupted):
        return EXIT_FAILURE
    o.say(f"{lib_error(err)} (redis {redact(url)}){redis_hint(err, url)}")
    return EXIT_FAILURE


def version_line(prog):
    return (f"{prog} {VERSION} (the Python peer) Python {platform.python_version()} redis-py {redis.__version__} "
            f"{sys.platform}/{platform.machine()}")


def version(args, stdout=None, stderr=None, prog=PROG):
    o = Out(prog, "version", stdout, stderr)
    try:
        _, _, rest = parse_flags({}, args)
        if rest:
            raise UsageError(f"unexpected argument {quote_arg(redact_arg(rest[0]))}")
    except HelpWanted:
        return o.page(clipages.render(clipages.VERSION, prog))
    except UsageError as e:
        return o.usage(str(e))
    return o.page(version_line(prog) + "\n")


def help_(args, stdout=None, stderr=None, prog=PROG):
    o = Out(prog, "help", stdout, stderr)
    if not args:
        return o.page(clipages.main_page(prog))
    if args[0] in ("-h", "--help", "-help", "help"):
        return o.page(clipages.render(clipages.HELP, prog))
    if args[0] not in COMMANDS:
        o._put(o.stderr, f"{prog} help: unknown command {quote_arg(redact_arg(args[0]))}\n"
                         f"Run '{prog} --help' for the list.\n")
        return EXIT_USAGE
    return COMMANDS[args[0]](["--help"], stdout, stderr, prog)


COMMANDS = {"run": run, "version": version, "help": help_}


def main(argv=None, prog=None):
    argv = sys.argv[1:] if argv is None else argv
    prog = prog or PROG
    out = Out(prog, "", None, None)
    if not argv:
        out._put(out.stderr, clipages.main_page(prog))
        return EXIT_USAGE
    if argv[0] in ("-h", "--help", "-help"):
        return out.page(clipages.main_page(prog))
    if argv[0] in ("--version", "-version"):
        return version(argv[1:], prog=prog)
    if argv[0] in COMMANDS:
        return COMMANDS[argv[0]](argv[1:], prog=prog)
    out._put(out.stderr, f"{prog}: unknown command {quote_arg(redact_arg(argv[0]))}\n"
                         f"Run '{prog} --help' for the list of commands.\n")
    return EXIT_USAGE
