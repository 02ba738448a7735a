"""NotFound, neg_ttl, the not-found marker and stale copy keys, and the
notfound / stale / unknown-kind events (sync and asyncio clients)."""

import asyncio
import datetime
import threading
import time

import pytest
import redis.asyncio as aredis

import memolock
from memolock import protocol as P

from test_cli import WAIT as CLI_WAIT, Procs
from test_client import WAIT, run_thread, until

PROMPT = 5  # seconds: far below the fake holder's 30 s lock
HOLDER = b"0123456789abcdef0123456789abcdef@elsewhere:1"


def never(lease):
    raise AssertionError("fetch must not be called")


@pytest.fixture
def client(rdb, tag):
    c = memolock.Client(rdb, tag, lock_ttl=2, neg_ttl=5)
    yield c
    c.close()


def test_not_found_is_exported():
    assert issubclass(memolock.NotFound, memolock.MemolockError)
    assert memolock.NotFound in (getattr(memolock, n) for n in memolock.__all__)


def test_neg_ttl_validation(rdb, tag):
    # 1e16 s would overflow Redis's expiry and make the not_found script fail.
    for bad in (-1, 0.0001, float("nan"), "5s", 1e16, P.MAX_SECONDS + 1):
        with pytest.raises(memolock.InvalidArgument):
            memolock.Client(rdb, tag, neg_ttl=bad)
    assert memolock.Client(rdb, tag).neg_ttl_ms == 0
    assert memolock.Client(rdb, tag, neg_ttl=datetime.timedelta(seconds=2)).neg_ttl_ms == 2000
    assert memolock.Client(rdb, tag, neg_ttl=0.0015).neg_ttl_ms == 1


def test_cached_not_found_marker(client, rdb, tag):
    rdb.set(f"{tag}/lock-notfound:m", b"", px=60000)
    with pytest.raises(memolock.NotFound) as ei:
        client.get("m", never)
    assert '"m"' in str(ei.value)
    with pytest.raises(memolock.NotFound):
        client.get("m", never, timeout=WAIT)  # on a flight thread too
    assert rdb.get(f"{tag}/lock:m") is None  # no lock taken
    # A value wins over the marker (it is read first).
    rdb.set(f"{tag}:m", b"there")
    assert client.get("m", never) == b"there"


def test_fetch_not_found_with_neg_ttl(client, rdb, tag):
    calls = []

    class Missing(memolock.NotFound):
        pass

    def fetch(lease):
        calls.append(lease.token())
        raise Missing("no such user")

    with pytest.raises(Missing) as ei:
        client.get("u", fetch)
    assert str(ei.value) == "no such user"  # the holder's callers get fetch's own exception
    assert len(calls) == 1
    pttl = rdb.pttl(f"{tag}/lock-notfound:u")
    assert 4000 < pttl <= 5000, pttl
    assert rdb.get(f"{tag}/lock-notfound:u") == b""
    assert rdb.exists(f"{tag}/lock:u", f"{tag}:u", f"{tag}/lock-stale:u") == 0
    with pytest.raises(memolock.NotFound):
        client.get("u", fetch)
    assert len(calls) == 1


def test_fetch_not_found_without_neg_ttl(rdb, tag):
    calls = []

    def fetch(lease):
        calls.append(1)
        if len(calls) == 1:
            raise memolock.NotFound("not yet")
        return b"now it exists", 0

    with memolock.Client(rdb, tag, lock_ttl=2) as c:
        with pytest.raises(memolock.NotFound):
            c.get("n", fetch)
        assert rdb.exists(f"{tag}/lock-notfound:n", f"{tag}/lock:n", f"{tag}:n") == 0
        assert c.get("n", fetch) == b"now it exists"
        assert len(calls) == 2


def test_not_found_script_failure_releases_with_abandon(rdb, tag):
    with memolock.Client(rdb, tag, lock_ttl=30, neg_ttl=5) as c:
        c._scripts["not_found"] = lambda **kw: (_ for _ in ()).throw(RuntimeError("redis down"))
        ps = rdb.pubsub()
        ps.subscribe(f"{tag}/lock-event:x")
        ps.get_message(timeout=1)
        tokens = []

        def fetch(lease):
            tokens.append(lease.token())
            raise memolock.NotFound("gone")

        with pytest.raises(memolock.NotFound):
            c.get("x", fetch)
        assert rdb.exists(f"{tag}/lock:x", f"{tag}/lock-notfound:x") == 0
        msg = ps.get_message(timeout=2)
        assert msg and msg["data"] == b"abandon\n" + tokens[0].encode() + b"\n"
        ps.close()


def test_store_deletes_marker_and_stale_copy(client, rdb, tag):
    def fetch(lease):
        # Written while we hold the lock (by another writer, say).
        rdb.set(f"{tag}/lock-notfound:s", b"", px=60000)
        rdb.set(f"{tag}/lock-stale:s", b"old copy", px=60000)
        return b"fresh", 60

    assert client.get("s", fetch) == b"fresh"
    assert rdb.get(f"{tag}:s") == b"fresh"
    assert rdb.exists(f"{tag}/lock-notfound:s", f"{tag}/lock-stale:s") == 0


def _hold_fake_lock(rdb, tag, id):
    rdb.set(f"{tag}/lock:{id}", HOLDER, px=30000)


def _waiting(client, id):
    until(lambda: client._sub.live_watches(client.keys.notif(id.encode())) == 1, what="live watch")
    time.sleep(0.2)  # the re-read after the subscription went live is over


def test_notfound_event_fails_waiter(client, rdb, tag):
    _hold_fake_lock(rdb, tag, "w")
    t0 = time.monotonic()
    t, box = run_thread(client.get, "w", never)
    _waiting(client, "w")
    rdb.publish(f"{tag}/lock-event:w", b"notfound\nsomebody-else\n")  # not our holder: ignored
    time.sleep(0.2)
    assert t.is_alive()
    rdb.publish(f"{tag}/lock-event:w", P.event(P.EVENT_NOTFOUND, HOLDER))
    t.join(PROMPT)
    assert not t.is_alive() and time.monotonic() - t0 < PROMPT
    assert isinstance(box.get("err"), memolock.NotFound), box


@pytest.mark.parametrize("payload", [b"stale\n%s\n", b"future-kind\n%s\nwhatever"])
def test_stale_or_unknown_event_makes_waiter_look_again(client, rdb, tag, payload):
    _hold_fake_lock(rdb, tag, "v")
    t0 = time.monotonic()
    t, box = run_thread(client.get, "v", never)
    _waiting(client, "v")
    rdb.set(f"{tag}:v", b"put back")  # no notification: the event must make it look
    time.sleep(0.3)
    assert t.is_alive()
    rdb.publish(f"{tag}/lock-event:v", payload.replace(b"%s", HOLDER))
    t.join(PROMPT)
    assert not t.is_alive() and time.monotonic() - t0 < PROMPT
    assert box.get("val") == b"put back", box


def test_waiter_elsewhere_gets_not_found(server, tag):
    r1, r2 = server.client(), server.client()
    gate = threading.Event()
    with memolock.Client(r1, tag, lock_ttl=30, neg_ttl=5) as holder, memolock.Client(r2, tag, lock_ttl=30) as waiter:
        def fetch(lease):
            gate.wait(WAIT)
            raise memolock.NotFound("nothing there")

        th, hbox = run_thread(holder.get, "e", fetch)
        until(lambda: r1.get(f"{tag}/lock:e") is not None, what="holder's lock")
        tw, wbox = run_thread(waiter.get, "e", never)
        _waiting(waiter, "e")
        t0 = time.monotonic()
        gate.set()
        tw.join(PROMPT)
        th.join(PROMPT)
        assert time.monotonic() - t0 < PROMPT
        assert isinstance(hbox.get("err"), memolock.NotFound) and str(hbox["err"]) == "nothing there"
        assert isinstance(wbox.get("err"), memolock.NotFound), wbox
        assert not isinstance(wbox["err"], memolock.HolderFailed)
    r1.close()
    r2.close()


def test_cli_not_found_exit_status(server, rdb, tag):
    rdb.set(f"{tag}/lock-notfound:c", b"", px=60000)
    procs = Procs()
    try:
        p = procs.run(server.url, tag, "c", "sh", "-c", "echo ran")
        out, err = p.communicate(timeout=CLI_WAIT)
    finally:
        procs.kill_all()
    assert p.returncode == 1, err
    assert out == b"" and b"not found" in err


# --- asyncio ---------------------------------------------------------------

def arun(coro):
    return asyncio.run(asyncio.wait_for(coro, 60))


async def anever(lease):
    raise AssertionError("fetch must not be called")


def test_async_marker_and_neg_ttl(server, tag):
    async def main():
        r = aredis.Redis(port=server.port)
        async with memolock.AsyncClient(r, tag, lock_ttl=2, neg_ttl=5) as c:
            await r.set(f"{tag}/lock-notfound:m", b"", px=60000)
            with pytest.raises(memolock.NotFound):
                await c.get("m", anever)

            calls = []

            async def fetch(lease):
                calls.append(1)
                raise memolock.NotFound("async nothing")

            with pytest.raises(memolock.NotFound) as ei:
                await c.get("u", fetch)
            assert str(ei.value) == "async nothing"
            pttl = await r.pttl(f"{tag}/lock-notfound:u")
            assert 4000 < pttl <= 5000, pttl
            assert await r.exists(f"{tag}/lock:u", f"{tag}:u") == 0
            with pytest.raises(memolock.NotFound):
                await c.get("u", fetch)
            assert len(calls) == 1

            async def fresh(lease):
                await r.set(f"{tag}/lock-notfound:s", b"", px=60000)
                await r.set(f"{tag}/lock-stale:s", b"old", px=60000)
                return b"fresh", 60

            assert await c.get("s", fresh) == b"fresh"
            assert await r.exists(f"{tag}/lock-notfound:s", f"{tag}/lock-stale:s") == 0

        async with memolock.AsyncClient(r, tag, lock_ttl=2) as c0:  # neg_ttl 0: nothing recorded
            n = []

            def sync_fetch(lease):  # in a worker thread
                n.append(1)
                if len(n) == 1:
                    raise memolock.NotFound("not yet")
                return b"later", 0

            with pytest.raises(memolock.NotFound):
                await c0.get("z", sync_fetch)
            assert await r.exists(f"{tag}/lock-notfound:z", f"{tag}/lock:z") == 0
            assert await c0.get("z", sync_fetch) == b"later" and len(n) == 2
        await r.close()

    arun(main())


def test_async_events(server, rdb, tag):
    async def main():
        r = aredis.Redis(port=server.port)
        async with memolock.AsyncClient(r, tag, lock_ttl=30) as c:
            async def waiting(id):
                while c._sub.live_watches(c.keys.notif(id.encode())) != 1:
                    await asyncio.sleep(0.01)
                await asyncio.sleep(0.2)

            for id, payload, value in [("nf", b"notfound\n%s\n", None), ("st", b"stale\n%s\n", b"stale value"),
                                       ("uk", b"future-kind\n%s\n", b"other value")]:
                rdb.set(f"{tag}/lock:{id}", HOLDER, px=30000)
                t0 = time.monotonic()
                task = asyncio.ensure_future(c.get(id, anever))
                await asyncio.wait_for(waiting(id), WAIT)
                if value is not None:
                    rdb.set(f"{tag}:{id}", value)
                    await asyncio.sleep(0.3)
                    assert not task.done()
                rdb.publish(f"{tag}/lock-event:{id}", payload.replace(b"%s", HOLDER))
                if value is None:
                    with pytest.raises(memolock.NotFound):
                        await asyncio.wait_for(task, PROMPT)
                else:
                    assert await asyncio.wait_for(task, PROMPT) == value
                assert time.monotonic() - t0 < PROMPT
        await r.close()

    arun(main())
