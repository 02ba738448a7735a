"""The asyncio AsyncClient against a real redis-server."""

import asyncio
import time

import pytest
import redis.asyncio as aredis

import memolock
from conftest import key_misses
from memolock import protocol as P

WAIT = 20


def arun(coro):
    return asyncio.run(asyncio.wait_for(coro, 60))


async def until(cond, timeout=WAIT):
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.01)


def test_async_miss_hit_coalescing(server, tag):
    async def main():
        r = aredis.Redis(port=server.port)
        async with memolock.AsyncClient(r, tag, lock_ttl=2) as c:
            calls = []

            async def fetch(lease):
                calls.append(lease.token())
                assert await lease.held()
                await asyncio.sleep(0.3)
                return b"av", 0

            res = await asyncio.gather(*[c.get("a", fetch) for _ in range(6)])
            assert res == [b"av"] * 6 and len(calls) == 1
            assert await c.get("a", fetch) == b"av"
            assert await r.get(f"{tag}/lock:a") == b"done:" + calls[0].encode()

            def sync_fetch(lease):  # runs in a worker thread
                time.sleep(0.1)
                return b"from sync", 0

            assert await c.get("s", sync_fetch) == b"from sync"
        await r.close()

    arun(main())


def test_async_waiter_and_failure(server, tag):
    async def main():
        r1, r2 = aredis.Redis(port=server.port), aredis.Redis(port=server.port)
        sync = server.client()  # INFO from the loop is quick; no await needed
        c1 = memolock.AsyncClient(r1, tag, lock_ttl=30)
        c2 = memolock.AsyncClient(r2, tag, lock_ttl=30)
        try:
            async def slow(lease):
                await asyncio.sleep(0.5)
                return b"published", 10

            t = asyncio.create_task(c1.get("p", slow))
            await asyncio.sleep(0.1)
            assert await c2.get("p", slow) == b"published"
            assert await t == b"published"

            fail = asyncio.Event()
            started = asyncio.Event()

            async def bad(lease):
                started.set()
                await fail.wait()
                raise RuntimeError("async boom\nmore")

            before = key_misses(sync)
            t = asyncio.create_task(c1.get("f", bad))
            await started.wait()
            lookup = key_misses(sync) - before
            assert lookup > 0, "the holder's lookup missed no key"
            w = asyncio.create_task(c2.get("f", bad))
            # The holder fails only after the waiter's lookup once its
            # subscription is live: a failure released before it leaves the
            # lock free, and the waiter computes instead (PROTOCOL.md, step 2).
            await until(lambda: key_misses(sync) >= before + 3 * lookup)
            t0 = time.monotonic()
            fail.set()
            with pytest.raises(memolock.HolderFailed) as ei:
                await w
            assert ei.value.message == "async boom"
            assert time.monotonic() - t0 < 10
            with pytest.raises(RuntimeError):
                await t
        finally:
            await c1.close()
            await c2.close()
            await r1.close()
            await r2.close()
            sync.close()

    arun(main())


def test_async_takeover_reconnect_timeout(server, tag):
    async def main():
        r = aredis.Redis(port=server.port)
        c = memolock.AsyncClient(r, tag, lock_ttl=5)
        try:
            await r.set(f"{tag}/lock:d", b"dead@x:1", px=700)
            assert await c.get("d", lambda lease: (b"taken", 0)) == b"taken"

            await r.set(f"{tag}/lock:rc", b"other@x:1", px=60000)
            t = asyncio.create_task(c.get("rc", lambda lease: (b"computed", 0)))
            await until(lambda: c._sub.live_watches(c.keys.notif(b"rc")) == 1)
            before = c._sub.reconnects
            old = {x["id"] for x in await r.client_list(_type="pubsub")}
            await r.client_kill_filter(_type="pubsub")
            # Redis may close a killed client asynchronously (see test_client).
            for _ in range(1000):
                if not old & {x["id"] for x in await r.client_list(_type="pubsub")}:
                    break
                await asyncio.sleep(0.005)
            await r.set(f"{tag}:rc", b"gap value")
            await r.publish(f"{tag}/notif:rc", b"gap value")
            assert await t == b"gap value"
            assert c._sub.reconnects > before

            await r.set(f"{tag}/lock:to", b"other@x:1", px=60000)
            with pytest.raises(memolock.Timeout):
                await c.get("to", lambda lease: (b"x", 0), timeout=0.3)

            token = b"tok@x:1"
            await r.set(f"{tag}/lock:ev", token, px=60000)
            t = asyncio.create_task(c.get("ev", lambda lease: (b"after abandon", 0)))
            await until(lambda: c._sub.live_watches(c.keys.notif(b"ev")) == 1)
            await r.delete(f"{tag}/lock:ev")
            await r.publish(f"{tag}/lock-event:ev", P.abandon_event(token))
            assert await t == b"after abandon"
        finally:
            await c.close()
            await r.close()

    arun(main())


def test_async_external_and_close(server, tag):
    async def main():
        r = aredis.Redis(port=server.port)
        c = memolock.AsyncClient(r, tag, lock_ttl=5)
        tokens = []

        async def start(lease):
            tokens.append(lease.token())

            async def produce():
                await asyncio.sleep(0.3)
                await r.set(f"{tag}:ext", b"produced")
                await r.publish(f"{tag}/notif:ext", b"produced")

            asyncio.get_running_loop().create_task(produce())

        assert await c.get_external("ext", start) == b"produced"
        assert await r.get(f"{tag}/lock:ext") == b"done:" + tokens[0].encode()

        await r.set(f"{tag}/lock:cl", b"other@x:1", px=60000)
        t = asyncio.create_task(c.get("cl", lambda lease: (b"x", 0)))
        await until(lambda: c._sub.live_watches(c.keys.notif(b"cl")) == 1)
        await c.close()
        with pytest.raises(memolock.Closed):
            await t
        with pytest.raises(memolock.Closed):
            await c.get("cl", lambda lease: (b"x", 0))
        assert c._sub._task.done()
        await r.close()

    arun(main())


def test_async_bad_input(server, tag):
    async def main():
        r = aredis.Redis(port=server.port)
        with pytest.raises(ValueError):
            memolock.AsyncClient(r, "a/notif")
        with pytest.raises(ValueError):
            memolock.AsyncClient(r, "")
        dec = aredis.Redis(port=server.port, decode_responses=True)
        with pytest.raises(ValueError):
            memolock.AsyncClient(dec, "t")
        async with memolock.AsyncClient(r, tag) as c:
            with pytest.raises(ValueError, match="not bytes"):
                await c.get("x", lambda lease: ("str", 0))
            with pytest.raises(ValueError, match="negative"):
                await c.get("y", lambda lease: (b"v", -5))
            with pytest.raises(ValueError):
                await c.get(None, lambda lease: (b"v", 0))
        await r.close()
        await dec.close()

    arun(main())


def test_async_silent_connection_is_probed_and_replaced(own_server, tag):
    async def main():
        r = aredis.Redis(port=own_server.port)
        c = memolock.AsyncClient(r, tag, lock_ttl=60)
        c._sub.health = 0.5
        try:
            await r.set(f"{tag}/lock:hp", b"other@x:1", px=60000)
            t = asyncio.create_task(c.get("hp", lambda lease: (b"computed", 0)))
            await until(lambda: c._sub.live_watches(c.keys.notif(b"hp")) == 1)
            before = c._sub.reconnects
            await r.execute_command("CLIENT", "PAUSE", "2500", "ALL")
            await until(lambda: c._sub.reconnects > before)
            await r.set(f"{tag}:hp", b"after pause")
            assert await t == b"after pause"
        finally:
            await c.close()
            await r.close()

    arun(main())
