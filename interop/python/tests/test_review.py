"""Regression tests from a hostile review: each failed before its fix."""

import asyncio
import os
import signal
import socket
import subprocess
import threading
import time

import pytest
import redis.asyncio as aredis

import memolock
from memolock import protocol as P
from conftest import PKG_ROOT, PYTHON
from test_async import arun, until as auntil
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


def _collected(c, channel):
    """Whether the client's subscriber has read a message on channel into a watch."""
    with c._sub._mu:
        return any(w.messages for w in c._sub._watches.get(channel, ()))


def _lingers(rdb, lock, token, since):
    """Whether lock is done:token for at most the linger, or (a loaded
    machine) gone when the linger since `since` is over."""
    val, pttl = rdb.pipeline().get(lock).pttl(lock).execute()
    if val is None:
        return time.monotonic() - since >= P.LINGER_MS / 1000
    return val == b"done:" + token and 0 < pttl <= P.LINGER_MS


def _events_of(listener, token=None):
    """The events naming token (None: every event) that listener (a
    subscribed PubSub) has received: a PING behind them returns only after
    all published before."""
    listener.ping(b"drained")
    out = []
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        m = listener.get_message(timeout=1)
        if m is None:
            continue
        if m["type"] == "pong":
            return out
        if m["type"] == "message" and (token is None or P.parse_event(m["data"])[1] == token):
            out.append(m["data"])
    raise AssertionError("the listener's PING did not come back")


@pytest.mark.parametrize("what", ["value", "fail"])
def test_external_message_during_start_waits_for_the_release(rdb, tag, what):
    # The C# peer's race (7ed5381): a value its producer published while
    # start ran, on a subscription already live (the flight waited on
    # another holder first), answered the callers from the subscriber
    # thread, and the lock then went with an abandon event. Here the
    # subscriber only collects messages; the flight reads them after start,
    # in its wait, on a lock that busy() marks as its own: a value releases
    # it with the linger ([E2]), a fail event deletes it with no event ([E3]).
    lock, notif, events = f"{tag}/lock:fz", f"{tag}/notif:fz", f"{tag}/lock-event:fz"
    rdb.set(lock, b"someone")  # no expiry: the flight waits until we free it
    listener = rdb.pubsub()
    listener.subscribe(events)
    waited = threading.Event()
    seen = {}
    with memolock.Client(rdb, tag, lock_ttl=20, on_wait=lambda id, holder: waited.set()) as c:
        def start(lease):
            token = seen["token"] = lease.token().encode()
            if what == "value":
                rdb.set(f"{tag}:fz", b"fast")
                rdb.publish(notif, b"fast")
            else:
                rdb.publish(events, P.fail_event(token, b"producer failed"))
            until(lambda: _collected(c, c.keys.notif(b"fz") if what == "value" else c.keys.events(b"fz")),
                  what="the subscriber to read the message")
            # The subscriber has it: give a wrong hand-over time to show.
            t.join(0.5)
            seen["answered during start"] = not t.is_alive()
            seen["returned"] = time.monotonic()

        t, box = run_thread(c.get_external, "fz", start, WAIT)
        until(lambda: waited.is_set() and c._sub.live_watches(c.keys.notif(b"fz")) == 1,
              what="the flight to wait on the other holder")
        rdb.delete(lock)
        rdb.publish(events, P.abandon_event(b"someone"))  # the flight takes the lock over, then starts
        t.join(WAIT)
        assert not t.is_alive()
        until(lambda: "answered during start" in seen, what="start to return")
        assert seen["answered during start"] is False
        token = seen["token"]
        if what == "value":
            assert box == {"val": b"fast"}
            assert _lingers(rdb, lock, token, seen["returned"])  # released with the linger, before the answer
            assert _events_of(listener, token) == []  # no abandon event
        else:
            assert isinstance(box.get("err"), memolock.HolderFailed) and "producer failed" in str(box["err"])
            assert rdb.get(lock) is None
            assert _events_of(listener, token) == [P.fail_event(token, b"producer failed")]  # only the producer's
    listener.close()


@pytest.mark.parametrize("what", ["value", "fail"])
def test_async_external_message_during_start_waits_for_the_release(server, rdb, tag, what):
    # The asyncio client, as above: its subscriber task too only collects.
    lock, notif, events = f"{tag}/lock:fz", f"{tag}/notif:fz", f"{tag}/lock-event:fz"
    rdb.set(lock, b"someone")
    listener = rdb.pubsub()
    listener.subscribe(events)
    seen = {}

    async def main():
        r = aredis.Redis(port=server.port)
        waited = asyncio.Event()
        c = memolock.AsyncClient(r, tag, lock_ttl=20, on_wait=lambda id, holder: waited.set())
        try:
            async def start(lease):
                token = seen["token"] = lease.token().encode()
                if what == "value":
                    await r.set(f"{tag}:fz", b"fast")
                    await r.publish(notif, b"fast")
                else:
                    await r.publish(events, P.fail_event(token, b"producer failed"))
                await auntil(lambda: _collected(c, c.keys.notif(b"fz") if what == "value" else c.keys.events(b"fz")))
                done, _ = await asyncio.wait({t}, timeout=0.5)  # a wrong hand-over gets time to show
                seen["answered during start"] = bool(done)
                seen["returned"] = time.monotonic()

            t = asyncio.get_running_loop().create_task(c.get_external("fz", start, WAIT))
            await auntil(lambda: waited.is_set() and c._sub.live_watches(c.keys.notif(b"fz")) == 1)
            await r.delete(lock)
            await r.publish(events, P.abandon_event(b"someone"))
            (res,) = await asyncio.gather(t, return_exceptions=True)
            await auntil(lambda: "answered during start" in seen)
            seen["lingers"] = _lingers(rdb, lock, seen["token"], seen["returned"])
            return res
        finally:
            await c.close()
            await r.close()

    res = arun(main())
    assert seen["answered during start"] is False
    token = seen["token"]
    if what == "value":
        assert res == b"fast"
        assert seen["lingers"]
        assert _events_of(listener, token) == []
    else:
        assert isinstance(res, memolock.HolderFailed) and "producer failed" in str(res)
        assert rdb.get(lock) is None
        assert _events_of(listener, token) == [P.fail_event(token, b"producer failed")]
    listener.close()


#: A coarse bound on an answer that must come at once: far below the 30 s
#: lock TTL that a lost event made the winner wait out.
PROMPT = 5


def _subscribed(rdb, channel):
    """A PubSub on channel whose subscription has taken effect."""
    listener = rdb.pubsub()
    listener.subscribe(channel)
    m = listener.get_message(timeout=WAIT)
    assert m is not None and m["type"] == "subscribe", m
    return listener


def _check_done_during_start(rdb, listener, lock, what, res, seen):
    token = seen["token"]
    if what == "value":
        assert res == b"fast"
        assert seen["lingers"]  # released with the linger ([E2])
        assert _events_of(listener, token) == []
    else:
        assert isinstance(res, memolock.HolderFailed) and res.message == "producer failed at once", res
        assert rdb.get(lock) is None  # deleted ([E3])
        assert _events_of(listener, token) == [P.fail_event(token, b"producer failed at once")]  # only the producer's


@pytest.mark.parametrize("what", ["value", "fail"])
def test_external_producer_done_during_start(rdb, tag, what):
    # [E1]: the winner's producer finishes, or fails, before start has
    # returned (here start itself publishes). The winner subscribed only
    # after start, so a fail event was lost and it waited out its whole
    # lock TTL (then started the work again); it is live before start now.
    # (A value was found by the lookup made once live, even then.)
    lock, notif, events = f"{tag}/lock:fs", f"{tag}/notif:fs", f"{tag}/lock-event:fs"
    listener = _subscribed(rdb, events)
    seen = {}
    with memolock.Client(rdb, tag, lock_ttl=30) as c:
        def start(lease):
            token = seen["token"] = lease.token().encode()
            if what == "value":
                rdb.set(f"{tag}:fs", b"fast")
                rdb.publish(notif, b"fast")
            else:
                rdb.publish(events, P.fail_event(token, b"producer failed at once"))
            seen["returned"] = time.monotonic()

        try:
            res = c.get_external("fs", start, timeout=PROMPT)
        except memolock.MemolockError as e:  # Timeout: the event was lost
            res = e
        if what == "value":
            seen["lingers"] = _lingers(rdb, lock, seen["token"], seen["returned"])
    _check_done_during_start(rdb, listener, lock, what, res, seen)
    listener.close()


@pytest.mark.parametrize("what", ["value", "fail"])
def test_async_external_producer_done_during_start(server, rdb, tag, what):
    # The asyncio client, as above.
    lock, notif, events = f"{tag}/lock:fs", f"{tag}/notif:fs", f"{tag}/lock-event:fs"
    listener = _subscribed(rdb, events)
    seen = {}

    async def main():
        r = aredis.Redis(port=server.port)
        c = memolock.AsyncClient(r, tag, lock_ttl=30)
        try:
            async def start(lease):
                token = seen["token"] = lease.token().encode()
                if what == "value":
                    await r.set(f"{tag}:fs", b"fast")
                    await r.publish(notif, b"fast")
                else:
                    await r.publish(events, P.fail_event(token, b"producer failed at once"))
                seen["returned"] = time.monotonic()

            try:
                res = await c.get_external("fs", start, timeout=PROMPT)
            except memolock.MemolockError as e:
                res = e
            if what == "value":
                seen["lingers"] = _lingers(rdb, lock, seen["token"], seen["returned"])
            return res
        finally:
            await c.close()
            await r.close()

    res = arun(main())
    _check_done_during_start(rdb, listener, lock, what, res, seen)
    listener.close()


def test_async_close_during_start_hands_the_lock_over(server, rdb, tag):
    # [E4]: a winner that shuts down releases its lock with an abandon
    # event. close() cancels a coroutine start; that is a shutdown, not a
    # failure of the work, so waiters elsewhere take over rather than fail
    # (as the Go client does since it hands over a start cancelled by Close).
    lock, events = f"{tag}/lock:fc", f"{tag}/lock-event:fc"
    listener = rdb.pubsub()
    listener.subscribe(events)
    seen = {}

    async def main():
        r = aredis.Redis(port=server.port)
        c = memolock.AsyncClient(r, tag, lock_ttl=30)
        started = asyncio.Event()

        async def start(lease):
            seen["token"] = lease.token().encode()
            started.set()
            await asyncio.sleep(3600)

        t = asyncio.get_running_loop().create_task(c.get_external("fc", start, WAIT))
        try:
            await asyncio.wait_for(started.wait(), WAIT)
        finally:
            await c.close()
            await r.close()
        (res,) = await asyncio.gather(t, return_exceptions=True)
        return res

    res = arun(main())
    assert isinstance(res, memolock.Closed), res
    token = seen["token"]
    assert rdb.get(lock) is None
    assert _events_of(listener, token) == [P.abandon_event(token)]
    listener.close()


def _check_late_fail_at_the_retake(rdb, listener, lock, res, seen):
    token = seen["token"]
    assert isinstance(res, memolock.HolderFailed) and res.message == "producer failed late", res
    assert seen["starts"] == 1  # not started again ([X4], [E1])
    assert seen["answered"] - seen["published"] < PROMPT
    assert rdb.get(lock) is None  # deleted, no linger ([E1a])
    # The producer's, then the flight's: published again under its token ([E1a]).
    assert _events_of(listener, token) == [P.fail_event(token, b"producer failed late")] * 2


def test_external_late_fail_before_the_own_retake_starts_nothing_again(rdb, tag):
    # [X4] as amended: the winner's lock (1 s, nobody renews it) expires
    # before its producer answers; its producer's fail comes just before
    # the winner's lookup takes the lock again, and is still on the pub/sub
    # connection when the reply comes. The marker round trip of the
    # takeover check reads it: the flight fails with the producer's
    # message and does not call start again. Without the check, start ran
    # a second time (and the fail was read only in the wait after it).
    lock, events = f"{tag}/lock:fl", f"{tag}/lock-event:fl"
    listener = _subscribed(rdb, events)
    seen = {"starts": 0}
    with memolock.Client(rdb, tag, lock_ttl=1) as c:
        orig = c._scripts["acquire"]

        def acquire(keys, args):
            # The re-take's lookup: the producer's late fail goes out first.
            if seen["starts"] and "published" not in seen and not rdb.exists(lock):
                rdb.publish(events, P.fail_event(seen["token"], b"producer failed late"))
                seen["published"] = time.monotonic()
            return orig(keys=keys, args=args)

        c._scripts["acquire"] = acquire

        def start(lease):  # the producer does nothing yet
            seen["token"] = lease.token().encode()
            seen["starts"] += 1

        try:
            res = c.get_external("fl", start, timeout=WAIT)
        except memolock.MemolockError as e:
            res = e
        seen["answered"] = time.monotonic()
    _check_late_fail_at_the_retake(rdb, listener, lock, res, seen)
    listener.close()


def test_async_external_late_fail_before_the_own_retake_starts_nothing_again(server, rdb, tag):
    # The asyncio client, as above.
    lock, events = f"{tag}/lock:fl", f"{tag}/lock-event:fl"
    listener = _subscribed(rdb, events)
    seen = {"starts": 0}

    async def main():
        r = aredis.Redis(port=server.port)
        c = memolock.AsyncClient(r, tag, lock_ttl=1)
        orig = c._scripts["acquire"]

        async def acquire(keys, args):
            if seen["starts"] and "published" not in seen and not await r.exists(lock):
                await r.publish(events, P.fail_event(seen["token"], b"producer failed late"))
                seen["published"] = time.monotonic()
            return await orig(keys=keys, args=args)

        c._scripts["acquire"] = acquire

        async def start(lease):
            seen["token"] = lease.token().encode()
            seen["starts"] += 1

        try:
            try:
                res = await c.get_external("fl", start, timeout=WAIT)
            except memolock.MemolockError as e:
                res = e
            seen["answered"] = time.monotonic()
            return res
        finally:
            await c.close()
            await r.close()

    res = arun(main())
    _check_late_fail_at_the_retake(rdb, listener, lock, res, seen)
    listener.close()


def _kept(c, id):
    """Whether the flight for id has kept its earlier producer's word."""
    f = c._core.flights.get(id)
    return f is not None and f.wait.late is not None


def _progress_then_word_start(rdb, c, seen, id, after=None):
    """A start function whose producer sends an event of a kind this peer
    does not know, then fails, both read before start returns: the flight
    takes them in one read, the first sending it to look again ([W5]); the
    fail is kept ([E1a]). after() runs before it returns."""
    events = c.keys.events(id)

    def count():
        with c._sub._mu:
            return sum(len(w.messages) for w in c._sub._watches.get(events, ()))

    def start(lease):
        token = seen["token"] = lease.token().encode()
        seen["starts"] += 1
        if seen["starts"] == 1:
            rdb.publish(events, b"progress\n" + token + b"\n")
            rdb.publish(events, P.fail_event(token, b"gave up"))
            until(lambda: count() >= 2, what="the subscriber to read both")
            if after is not None:
                after()
        seen["returned"] = time.monotonic()

    return start


def _check_acted_at_once(rdb, listener, lock, res, seen, lock_ttl):
    token = seen["token"]
    assert isinstance(res, memolock.HolderFailed) and res.message == "gave up", res
    assert seen["starts"] == 1
    assert seen["answered"] - seen["returned"] < lock_ttl / 2  # not after the lock expired
    assert rdb.get(lock) is None
    assert _events_of(listener, token) == [b"progress\n" + token + b"\n", P.fail_event(token, b"gave up"),
                                           P.fail_event(token, b"gave up")]  # published again ([E1a])


def test_external_word_after_a_look_again_event_ends_the_flight_while_the_lock_is_ours(rdb, tag):
    # [E1a], review 2: one read brings [progress T, fail T]. The unknown
    # kind sends the winner to look again; the lookup finds its lock still
    # its own. The kept fail must end the flight there: it waited a whole
    # lock TTL, took its lock again, and only then acted on it.
    lock_ttl = 6
    lock, events = f"{tag}/lock:pf", f"{tag}/lock-event:pf"
    listener = _subscribed(rdb, events)
    seen = {"starts": 0}
    with memolock.Client(rdb, tag, lock_ttl=lock_ttl) as c:
        start = _progress_then_word_start(rdb, c, seen, b"pf")
        try:
            res = c.get_external("pf", start, timeout=WAIT)
        except memolock.MemolockError as e:
            res = e
        seen["answered"] = time.monotonic()
    _check_acted_at_once(rdb, listener, lock, res, seen, lock_ttl)
    listener.close()


def test_async_external_word_after_a_look_again_event_ends_the_flight_while_the_lock_is_ours(server, rdb, tag):
    # The asyncio client, as above.
    lock_ttl = 6
    lock, events = f"{tag}/lock:pf", f"{tag}/lock-event:pf"
    listener = _subscribed(rdb, events)
    seen = {"starts": 0}

    async def main():
        r = aredis.Redis(port=server.port)
        c = memolock.AsyncClient(r, tag, lock_ttl=lock_ttl)
        ev = c.keys.events(b"pf")

        def count():
            with c._sub._mu:
                return sum(len(w.messages) for w in c._sub._watches.get(ev, ()))

        async def start(lease):
            token = seen["token"] = lease.token().encode()
            seen["starts"] += 1
            await r.publish(events, b"progress\n" + token + b"\n")
            await r.publish(events, P.fail_event(token, b"gave up"))
            await auntil(lambda: count() >= 2)
            seen["returned"] = time.monotonic()

        try:
            try:
                res = await c.get_external("pf", start, timeout=WAIT)
            except memolock.MemolockError as e:
                res = e
            seen["answered"] = time.monotonic()
            return res
        finally:
            await c.close()
            await r.close()

    res = arun(main())
    _check_acted_at_once(rdb, listener, lock, res, seen, lock_ttl)
    listener.close()


OTHER_HOLDER = b"another-holder"


def _check_published_again_for_both(rdb, listener, lock, res, seen, caller):
    token = seen["token"]
    late = b"producer failed late"
    if caller == "waits":
        assert isinstance(res, memolock.HolderFailed) and res.message == late.decode(), res
    else:
        assert isinstance(res, memolock.Timeout), res
    assert seen["starts"] == 1
    assert rdb.get(lock) is None  # no linger
    # The producer's word, the other holder's abandon (the test's), then the
    # flight's word again under its own token and the other holder's; no
    # abandon of its own ([E1a] before [E4]).
    assert _events_of(listener) == [P.fail_event(token, late), P.abandon_event(OTHER_HOLDER),
                                    P.fail_event(token, late), P.fail_event(OTHER_HOLDER, late)]


@pytest.mark.parametrize("caller", ["waits", "left"])
def test_external_late_word_kept_while_waiting_on_another_holder_is_published_again(rdb, tag, caller):
    # [E1a], review 2: the winner's lock (1 s) expires, another holder takes
    # it before the winner's lookup, and the winner waits on it. Its
    # producer's fail comes then (ignored for that holder, [W6], and kept).
    # The other holder leaves, the winner takes the lock over and acts on
    # the word: released publishing it again under its own token and the
    # other holder's (its waiters may wait on either), with no linger. Its
    # only caller may have left meanwhile ("left"): the word still comes
    # before [E4]'s abandon (which the flight published).
    lock, events = f"{tag}/lock:fh", f"{tag}/lock-event:fh"
    listener = _subscribed(rdb, events)
    seen = {"starts": 0}
    waited = threading.Event()

    def on_wait(id, holder):
        if holder == OTHER_HOLDER.decode():
            waited.set()

    with memolock.Client(rdb, tag, lock_ttl=1, on_wait=on_wait) as c:
        orig = c._scripts["acquire"]

        def acquire(keys, args):
            # The lookup after the winner's lock expired: another holder
            # took it first (no expiry: it holds until the test frees it).
            if seen["starts"] and "other" not in seen and not rdb.exists(lock):
                rdb.set(lock, OTHER_HOLDER)
                seen["other"] = True
            return orig(keys=keys, args=args)

        c._scripts["acquire"] = acquire

        def start(lease):  # the producer answers late
            seen["token"] = lease.token().encode()
            seen["starts"] += 1

        t, box = run_thread(c.get_external, "fh", start, WAIT if caller == "waits" else 1.5)
        until(waited.is_set, what="the flight to wait on the other holder")
        if caller == "left":
            t.join(WAIT)
            assert "err" in box
        rdb.publish(events, P.fail_event(seen["token"], b"producer failed late"))
        until(lambda: _kept(c, b"fh"), what="the flight to keep the word")
        rdb.delete(lock)
        rdb.publish(events, P.abandon_event(OTHER_HOLDER))
        until(lambda: c._core.active == 0, what="the flight to end")
        t.join(WAIT)
        res = box.get("err", box.get("val"))
    _check_published_again_for_both(rdb, listener, lock, res, seen, caller)
    listener.close()


@pytest.mark.parametrize("caller", ["waits", "left"])
def test_async_external_late_word_kept_while_waiting_on_another_holder_is_published_again(server, rdb, tag, caller):
    # The asyncio client, as above.
    lock, events = f"{tag}/lock:fh", f"{tag}/lock-event:fh"
    listener = _subscribed(rdb, events)
    seen = {"starts": 0}

    async def main():
        r = aredis.Redis(port=server.port)
        waited = asyncio.Event()

        def on_wait(id, holder):
            if holder == OTHER_HOLDER.decode():
                waited.set()

        c = memolock.AsyncClient(r, tag, lock_ttl=1, on_wait=on_wait)
        orig = c._scripts["acquire"]

        async def acquire(keys, args):
            if seen["starts"] and "other" not in seen and not await r.exists(lock):
                await r.set(lock, OTHER_HOLDER)
                seen["other"] = True
            return await orig(keys=keys, args=args)

        c._scripts["acquire"] = acquire

        async def start(lease):
            seen["token"] = lease.token().encode()
            seen["starts"] += 1

        try:
            t = asyncio.get_running_loop().create_task(
                c.get_external("fh", start, WAIT if caller == "waits" else 1.5))
            await asyncio.wait_for(waited.wait(), WAIT)
            if caller == "left":
                await asyncio.wait({t}, timeout=WAIT)
                assert t.done()
            await r.publish(events, P.fail_event(seen["token"], b"producer failed late"))
            await auntil(lambda: _kept(c, b"fh"))
            await r.delete(lock)
            await r.publish(events, P.abandon_event(OTHER_HOLDER))
            await auntil(lambda: c._core.active == 0)
            (res,) = await asyncio.gather(t, return_exceptions=True)
            return res
        finally:
            await c.close()
            await r.close()

    res = arun(main())
    _check_published_again_for_both(rdb, listener, lock, res, seen, caller)
    listener.close()


def _check_value_before_the_word(rdb, lock, res, seen):
    assert res == b"late value", res
    assert seen["starts"] == 1
    assert rdb.get(lock) is None  # released (the linger goes with no value)


def test_external_own_retake_value_decides_before_a_word_kept(rdb, tag):
    # [E1a], review 2: the winner's lock (1 s, nobody renews it) expires
    # while one read brings [progress T, fail T]: the fail is kept, and the
    # lookup that follows takes the lock again. Its producer's value,
    # published (not stored) just before that lookup, is read in the
    # takeover check and decides first. Python skipped the check with a
    # word kept and failed with the word.
    lock, notif = f"{tag}/lock:rv", f"{tag}/notif:rv"
    seen = {"starts": 0}
    with memolock.Client(rdb, tag, lock_ttl=1) as c:
        orig = c._scripts["acquire"]

        def acquire(keys, args):
            if seen["starts"] and "published" not in seen and not rdb.exists(lock):
                rdb.publish(notif, b"late value")
                seen["published"] = True
            return orig(keys=keys, args=args)

        c._scripts["acquire"] = acquire

        def expired():
            until(lambda: not rdb.exists(lock), what="the lock to expire")

        start = _progress_then_word_start(rdb, c, seen, b"rv", after=expired)
        try:
            res = c.get_external("rv", start, timeout=WAIT)
        except memolock.MemolockError as e:
            res = e
    _check_value_before_the_word(rdb, lock, res, seen)


def test_async_external_own_retake_value_decides_before_a_word_kept(server, rdb, tag):
    # The asyncio client, as above.
    lock, notif, events = f"{tag}/lock:rv", f"{tag}/notif:rv", f"{tag}/lock-event:rv"
    seen = {"starts": 0}

    async def main():
        r = aredis.Redis(port=server.port)
        c = memolock.AsyncClient(r, tag, lock_ttl=1)
        ev = c.keys.events(b"rv")
        orig = c._scripts["acquire"]

        async def acquire(keys, args):
            if seen["starts"] and "published" not in seen and not await r.exists(lock):
                await r.publish(notif, b"late value")
                seen["published"] = True
            return await orig(keys=keys, args=args)

        c._scripts["acquire"] = acquire

        def count():
            with c._sub._mu:
                return sum(len(w.messages) for w in c._sub._watches.get(ev, ()))

        async def start(lease):
            token = lease.token().encode()
            seen["starts"] += 1
            await r.publish(events, b"progress\n" + token + b"\n")
            await r.publish(events, P.fail_event(token, b"gave up"))
            await auntil(lambda: count() >= 2)
            await auntil(lambda: not rdb.exists(lock))  # expired

        try:
            try:
                return await c.get_external("rv", start, timeout=WAIT)
            except memolock.MemolockError as e:
                return e
        finally:
            await c.close()
            await r.close()

    res = arun(main())
    _check_value_before_the_word(rdb, lock, res, seen)
