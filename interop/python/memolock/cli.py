"""`python3 -m memolock run`: memoize a command's standard output.

Same flags, semantics and exit codes as the Go `memolock run`
(cmd/memolock/runcmd.go): the command's stdout is the value; the invocation
that ran a failing command passes its output and status through and waiters
fail at once; 124 when --wait runs out; 126/127 cannot execute / not found;
128+N for signals; 2 for bad usage; 1 for other errors. One addition: 3
when the id is recorded as "not found" (memolock.NotFound, from a library
client elsewhere whose fetch found nothing); Go's run exits 1 then.
"""

import ctypes
import errno
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.parse

import redis

from .client import Client
from .durations import parse_duration_ns
from .errors import Closed, HolderFailed, NotFound, Timeout
from .protocol import DEFAULT_LOCK_TTL

EXIT_FAILURE, EXIT_USAGE, EXIT_WAIT_LIMIT, EXIT_CANNOT_EXEC, EXIT_NOT_FOUND, EXIT_SIGNAL_BASE = 1, 2, 124, 126, 127, 128
#: The id has no value (memolock.NotFound): a peer-only addition, Go exits 1.
EXIT_NO_VALUE = 3
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379"
KILL_GRACE = 2.0
#: Bound on one Redis reply (go-redis's default ReadTimeout).
COMMAND_TIMEOUT = 3.0
#: The wait without --wait: for ever, in practice.
NO_LIMIT = 10.0 ** 9
WITHHELD = "(URL withheld)"

USAGE = """usage: python3 -m memolock run --tag T --id ID --ttl D [--redis URL] [--lock-ttl D] [--wait D] -- CMD [ARGS...]
  --redis URL     Redis URL (default $MEMOLOCK_REDIS, then redis://127.0.0.1:6379)
  --tag T         key tag (required)
  --id ID         key id (required)
  --ttl D         how long the output stays cached, 0 for ever (required)
  --lock-ttl D    lock TTL: how soon others take over if this process dies (default 10s)
  --wait D        give up waiting after this long, exit 124 (0: no limit)
"""


class ExitError(Exception):
    """The command failed where it ran."""

    def __init__(self, code=0, sig=0):
        self.code, self.sig = code, sig
        if sig:
            super().__init__(f"command killed by signal {sig} ({signal.Signals(sig).name})")
        else:
            super().__init__(f"command exited with status {code}")


class StartError(Exception):
    def __init__(self, code, msg):
        self.code = code
        super().__init__(msg)


class Interrupted(Exception):
    pass


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


def parse_args(args, stderr):
    """Go flag-style parsing. Returns (opts dict, argv) or an exit code."""
    opts = {}
    names = {"redis", "tag", "id", "ttl", "lock-ttl", "wait"}
    i = 0
    while i < len(args):
        a = args[i]
        if a == "--":
            i += 1
            break
        if not a.startswith("-") or a == "-":
            break
        name = a.lstrip("-")
        if a.startswith("---"):
            print(f"bad flag syntax: {a}", file=stderr)
            return EXIT_USAGE
        value = None
        if "=" in name:
            name, value = name.split("=", 1)
        if name in ("h", "help"):
            stderr.write(USAGE)
            return EXIT_USAGE
        if name not in names:
            print(f"flag provided but not defined: -{name}", file=stderr)
            stderr.write(USAGE)
            return EXIT_USAGE
        if value is None:
            if i + 1 >= len(args):
                print(f"flag needs an argument: -{name}", file=stderr)
                stderr.write(USAGE)
                return EXIT_USAGE
            i += 1
            value = args[i]
        if name in ("ttl", "lock-ttl", "wait"):
            try:
                value = parse_duration_ns(value)
            except ValueError:
                print(f'invalid value "{value}" for flag -{name}: parse error', file=stderr)
                stderr.write(USAGE)
                return EXIT_USAGE
        opts[name] = value
        i += 1
    return opts, args[i:]


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


def _start(argv, stdout_fd):
    path = argv[0]
    if "/" not in path:
        # As Go's exec.LookPath: only an executable file on $PATH counts
        # (a match without the x bit is "not found", 127, not 126).
        found = shutil.which(path)
        if found is None:
            raise StartError(EXIT_NOT_FOUND, f'exec: "{path}": executable file not found in $PATH')
        path = found
    try:
        return subprocess.Popen(argv, executable=path, stdout=stdout_fd, close_fds=True)
    except OSError as e:
        if e.errno == errno.ENOEXEC:
            # As Go: /bin/sh runs the file found, not a name it would look up itself.
            return _start(["/bin/sh", path] + argv[1:], stdout_fd)
        if isinstance(e, FileNotFoundError):
            if os.path.exists(path):
                raise StartError(EXIT_CANNOT_EXEC, f"{path}: bad interpreter: {e.strerror}")
            raise StartError(EXIT_NOT_FOUND, f"{path}: {e.strerror}")
        raise StartError(EXIT_CANNOT_EXEC, f"{path}: {e.strerror}")


def run_group(argv, sig, cancelled, result):
    """Runs argv; returns its stdout, raises ExitError / StartError, or
    Interrupted once the command's processes are stopped and gone."""
    if sig.first.is_set() or cancelled.is_set():
        raise Interrupted()
    r, w = os.pipe()
    try:
        proc = _start(argv, w)
    finally:
        os.close(w)
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


class Progress:
    """Says on stderr, once a second, that the invocation waits, and on whom."""

    def __init__(self, stderr, name):
        self.stderr, self.name, self.started = stderr, name, time.monotonic()
        self.quit = None
        self.thread = None
        self.mu = threading.Lock()

    def waiting(self, _id, holder):
        with self.mu:
            if self.quit is not None:
                return
            self.quit = threading.Event()
            self.thread = threading.Thread(target=self._loop, args=(holder, self.quit), daemon=True)
            self.thread.start()

    def _loop(self, holder, quit):
        while True:
            try:
                self.stderr.write(f"memolock: waiting for {self.name}, computed by {holder} "
                                  f"({time.monotonic() - self.started:.1f}s)\n")
                self.stderr.flush()
            except Exception:
                pass
            if quit.wait(1.0):
                return

    def stop(self):
        with self.mu:
            if self.quit is not None:
                self.quit.set()
        if self.thread is not None:
            self.thread.join()


def _in_thread(fn):
    """Runs fn on another thread, waiting for it in short steps so that the
    signal handlers, which run on this (the main) thread, are not held up."""
    t = threading.Thread(target=fn, daemon=True)
    t.start()
    while t.is_alive():
        t.join(0.05)


def run(args, stdout=None, stderr=None):
    stdout = stdout or sys.stdout.buffer
    stderr = stderr or sys.stderr
    parsed = parse_args(args, stderr)
    if isinstance(parsed, int):
        return parsed
    opts, argv = parsed
    tag, id = opts.get("tag", ""), opts.get("id", "")
    ttl, wait = opts.get("ttl"), opts.get("wait", 0)
    lock_ttl = opts.get("lock-ttl", 0) or int(DEFAULT_LOCK_TTL * 1e9)  # 0: the default, as Go
    if not tag or not id:
        print("memolock run: --tag and --id are required", file=stderr)
        return EXIT_USAGE
    if ttl is None:
        print("memolock run: --ttl is required (0 caches for ever)", file=stderr)
        return EXIT_USAGE
    if ttl < 0:
        print(f"memolock run: --ttl {ttl / 1e9}s is negative; give how long the output stays cached, or 0 for ever",
              file=stderr)
        return EXIT_USAGE
    if wait < 0:
        print(f"memolock run: --wait {wait / 1e9}s is negative; give a limit, or 0 for none", file=stderr)
        return EXIT_USAGE
    if not argv:
        print("memolock run: no command given; put it after --", file=stderr)
        return EXIT_USAGE
    url = opts.get("redis") or os.environ.get("MEMOLOCK_REDIS") or DEFAULT_REDIS_URL
    if redact(url) == WITHHELD:
        print(f"memolock run: --redis {WITHHELD} is not of the form redis://[user:password@]host:port/db", file=stderr)
        return EXIT_USAGE
    try:
        extra = {} if url.startswith("unix:") else {"socket_connect_timeout": 5}
        # go-redis's default read timeout: a stalled Redis fails the run, it does not hang it.
        rdb = redis.Redis.from_url(url, socket_timeout=COMMAND_TIMEOUT, **extra)
    except Exception:
        print(f"memolock run: --redis {redact(url)} is not a valid Redis URL", file=stderr)
        return EXIT_USAGE
    progress = Progress(stderr, f"{tag}:{id}")
    try:
        client = Client(rdb, tag, lock_ttl=lock_ttl / 1e9, on_wait=progress.waiting)
    except ValueError as e:
        print(f"memolock run: {e}", file=stderr)
        rdb.close()
        return EXIT_USAGE

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
        try:
            out = run_group(argv, sig, lease.cancelled, result)
        except Interrupted:
            client.close()  # from inside fetch: hands the lock over with abandon
            raise
        return out, ttl / 1e9

    box = {}

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
    progress.stop()
    sig.restore()
    rdb.close()

    if err is None:
        try:
            stdout.write(out)
            stdout.flush()
        except Exception as e:
            print(f"memolock run: writing output: {e}", file=stderr)
            return EXIT_FAILURE
        return 0
    if sig.got:
        print(f"memolock run: interrupted by {signal.Signals(sig.got).name}", file=stderr)
        return EXIT_SIGNAL_BASE + sig.got
    if isinstance(err, ExitError):
        try:
            stdout.write(result.get("partial", b""))
            stdout.flush()
        except Exception:
            pass
        return EXIT_SIGNAL_BASE + err.sig if err.sig else err.code
    if isinstance(err, StartError):
        print(f"memolock run: {err}", file=stderr)
        return err.code
    if isinstance(err, HolderFailed):
        print(f"memolock run: the command failed where it ran: {err}", file=stderr)
        return EXIT_FAILURE
    if isinstance(err, NotFound):
        print(f"memolock run: not found: {tag}:{id} has no value (a memolock client's fetch found nothing for it)",
              file=stderr)
        return EXIT_NO_VALUE
    if isinstance(err, Timeout):
        print(f"memolock run: gave up after {wait / 1e9}s (--wait): {err}", file=stderr)
        return EXIT_WAIT_LIMIT
    if isinstance(err, Closed) and isinstance(err.__cause__, Interrupted):
        return EXIT_FAILURE
    print(f"memolock run: {err} (redis {redact(url)})", file=stderr)
    return EXIT_FAILURE


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] != "run":
        sys.stderr.write("usage: python3 -m memolock run [flags] -- CMD [ARGS...]\n\n" + USAGE)
        return EXIT_USAGE
    return run(argv[1:])
