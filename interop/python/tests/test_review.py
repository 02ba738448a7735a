"""Regression tests from a hostile review: each failed before its fix."""

import os
import signal
import socket
import subprocess
import threading
import time

import pytest

import memolock
from memolock import protocol as P
from conftest import PKG_ROOT, PYTHON
from test_client import run_thread, until

WAIT = 20


def test_centuries_pttl_does_not_overflow_the_wait(rdb, tag):
    # The original Go peer renews with nanoseconds as seconds: a lock of
    # centuries. Waiting on it must time out, not raise OverflowError.
    rdb.set(f"{tag}/lock:x", b"original-holder", ex=10 ** 10)
    with memolock.Client(rdb, tag, lock_ttl=1) as c:
        with pytest.raises(memolock.Timeout):
            c.get("x", lambda lease: (b"v", 0), timeout=0.3)
    r = P.decode_acquire([2 ** 62, b"h"], b"me")
    assert r.pttl == P.MAX_PTTL_MS


def test_flight_ends_when_last_caller_leaves_during_take(rdb, tag):
    # The last caller leaves (stopped + wake set) between the waiter's
    # checks and its take(), which clears the wake-up: the flight must see
    # it at once, not after the holder's whole PTTL.
    rdb.set(f"{tag}/lock:x", b"somebody", px=30000)
    c = memolock.Client(rdb, tag, lock_ttl=30)
    try:
        orig = c._sub.take
        first = threading.Event()

        def slow_take(w):
            if w.live and not w.reread and not first.is_set():  # after the re-read
                first.set()
                time.sleep(0.6)  # the caller's timeout (0.2 s) runs out here
            return orig(w)

        c._sub.take = slow_take
        with pytest.raises(memolock.Timeout):
            c.get("x", lambda lease: (b"v", 0), timeout=0.2)
        until(lambda: c._active == 0, timeout=3, what="the abandoned flight to end")
    finally:
        c.close()


def test_holder_failed_text_like_go():
    assert str(memolock.HolderFailed(b"boom")) == "memolock: the lock holder's fetch failed: boom"


def _run(url, tag, id, *cmd, extra=(), env=None, cwd=PKG_ROOT):
    env = dict(env or os.environ)
    env["PYTHONPATH"] = PKG_ROOT
    args = [PYTHON, "-m", "memolock", "run", "--redis", url, "--tag", tag, "--id", id, "--ttl", "10s", *extra,
            "--", *cmd]
    return subprocess.Popen(args, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)


def test_cli_lock_ttl_zero_is_the_default(server, tag):
    # Go's Options.LockTTL 0 means the default; --lock-ttl 0 is no usage error.
    p = _run(server.url, tag, "z", "printf", "ok", extra=["--lock-ttl", "0"])
    out, err = p.communicate(timeout=WAIT)
    assert p.returncode == 0 and out == b"ok", err


def test_cli_script_without_shebang_found_on_path(server, tag, tmp_path):
    # Go runs an executable that is no binary with /bin/sh <the path found>.
    bindir = tmp_path / "bin"
    bindir.mkdir()
    script = bindir / "noshebang"
    script.write_text('printf "from-script %s" "$1"\n')
    script.chmod(0o755)
    env = dict(os.environ, PATH=f"{bindir}:{os.environ.get('PATH', '/usr/bin:/bin')}")
    p = _run(server.url, tag, "ns", "noshebang", "arg", env=env, cwd=str(tmp_path))
    out, err = p.communicate(timeout=WAIT)
    assert p.returncode == 0 and out == b"from-script arg", err


@pytest.fixture
def blackhole():
    """A TCP server that accepts and never answers: a stalled Redis."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(64)
    conns, stop = [], threading.Event()

    def accept():
        while not stop.is_set():
            try:
                c, _ = s.accept()
                conns.append(c)
            except OSError:
                return

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    yield f"redis://127.0.0.1:{s.getsockname()[1]}", conns
    stop.set()
    s.close()
    for c in conns:
        c.close()


def test_cli_stalled_redis_signal_and_timeout(blackhole, tag):
    # A signal ends a run stuck on an unanswered Redis call at once.
    url, conns = blackhole
    p = _run(url, tag, "s", "echo", "x")
    # Once it has connected, its signal handlers are in place (they go in
    # before any Redis call); a slow start must not make it die of SIGTERM.
    deadline = time.monotonic() + WAIT
    while not conns and time.monotonic() < deadline:
        time.sleep(0.01)
    assert conns, "the run never connected"
    t0 = time.monotonic()
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=WAIT)
    assert p.returncode == 143, err
    assert time.monotonic() - t0 < 5, err
    # Without a signal it fails like Go's (read timeout), it does not hang.
    t0 = time.monotonic()
    p = _run(url, tag, "s", "echo", "x")
    _, err = p.communicate(timeout=WAIT)
    assert p.returncode == 1 and b"redis" in err, err
    assert time.monotonic() - t0 < 12, err


def test_async_close_cancels_a_coroutine_fetch(server, tag):
    # Go's Close cancels the fetch's context; an async fetch is cancelled
    # (not its flight), the lock is handed over with abandon at once.
    import asyncio
    import redis.asyncio as aredis

    async def main():
        base = asyncio.all_tasks()
        a = memolock.AsyncClient(aredis.Redis(port=server.port), tag, lock_ttl=30)
        b = memolock.AsyncClient(aredis.Redis(port=server.port), tag, lock_ttl=30)
        started, cancelled = asyncio.Event(), []

        async def hang(lease):
            started.set()
            try:
                await asyncio.sleep(60)
            except asyncio.CancelledError:
                cancelled.append(True)
                raise
            return b"never", 0

        async def fetch_b(lease):
            return b"from-b", 0

        holder = asyncio.create_task(a.get("x", hang))
        await started.wait()
        waiter = asyncio.create_task(b.get("x", fetch_b, timeout=10))
        await asyncio.sleep(0.3)
        t0 = time.monotonic()
        await asyncio.wait_for(a.close(), 5)
        with pytest.raises(memolock.Closed):
            await holder
        assert await waiter == b"from-b"
        assert time.monotonic() - t0 < 3 and cancelled == [True]

        # close() from inside a coroutine fetch neither deadlocks nor cancels it.
        c = memolock.AsyncClient(aredis.Redis(port=server.port), tag, lock_ttl=30)

        async def closes(lease):
            await c.close()
            await asyncio.sleep(0.1)
            return b"own", 0

        with pytest.raises(memolock.Closed):
            await asyncio.wait_for(c.get("y", closes), 5)
        await asyncio.wait_for(c.close(), 5)
        await b.close()
        await asyncio.sleep(0.05)
        assert asyncio.all_tasks() - base == set()

    asyncio.run(asyncio.wait_for(main(), 30))


def test_cli_non_executable_on_path_is_not_found(server, tag, tmp_path):
    # Go's exec.LookPath skips files without the x bit: 127, as for a
    # missing command (Python's execvp would say EACCES, 126).
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "notexec").write_text("echo hi\n")
    env = dict(os.environ, PATH=f"{bindir}:{os.environ.get('PATH', '/usr/bin:/bin')}")
    p = _run(server.url, tag, "ne", "notexec", env=env)
    _, err = p.communicate(timeout=WAIT)
    assert p.returncode == 127 and b"not found" in err, err


def test_external_release_linger_bounded_by_value(rdb, tag):
    # The release script (Go, 751a65b) takes the value key too: the external
    # winner's done lock lives no longer than the value.
    def start(lease):
        def produce():
            time.sleep(0.2)
            rdb.set(f"{tag}:e", b"ext", px=300)
            rdb.publish(f"{tag}/notif:e", b"ext")
        threading.Thread(target=produce, daemon=True).start()

    with memolock.Client(rdb, tag, lock_ttl=20) as c:
        assert c.get_external("e", start, timeout=WAIT) == b"ext"
        until(lambda: (rdb.get(f"{tag}/lock:e") or b"").startswith(b"done:") or rdb.get(f"{tag}/lock:e") is None,
              timeout=3, what="the release")
        assert 0 < rdb.pttl(f"{tag}/lock:e") <= 300 or rdb.get(f"{tag}/lock:e") is None
        # Once the value is gone, a done lock is taken over at once (acquire).
        rdb.delete(f"{tag}:e")
        rdb.set(f"{tag}/lock:e", b"done:somebody", px=20000)
        assert c.get("e", lambda lease: (b"fresh", 0), timeout=2) == b"fresh"
