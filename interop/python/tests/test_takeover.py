"""No holder failure lost at a takeover (PROTOCOL.md, the takeover rule;
issue 15, defect 1).

A holder renews its lock every lock TTL/3, so waiters that time the lock's
expiry look again at the renewal moments + 1 ms, and a fetch that fails
after a whole number of renewal periods (5.0 s with a 3 s lock) releases the
lock in that same millisecond. A waiter whose lookup lands just after the
release takes the free lock; before the rule it dropped its subscription,
with the failure event queued on it, and ran the failing fetch again.

The waiters here are Python clients (sync and asyncio). In the timed test
the holder is a Python client too; in the others a holder scripted with the
protocol's own scripts ends between a waiter's last look at its events and
its lookup, which makes the race certain. Go and C# holders are for the
cross-language tests of interop/interop_test.go.
"""

import asyncio
import threading
import time

import pytest
import redis.asyncio as aredis

import memolock
from memolock import protocol as P
from test_client import until

LOCK_TTL = 3.0
FAIL_AT = 5.0
RUNS = 20
SYNC_WAITERS, ASYNC_WAITERS = 3, 2  # clients per run, each with its own pub/sub connection
BATCH = 5  # runs at a time
MESSAGE = "backend down at 5.0s"

# Go's publish script (PROTOCOL.md): hands a value out without storing it.
PUBLISH_SRC = r"""if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  redis.call('PUBLISH', ARGV[4], 'abandon\n' .. ARGV[1] .. '\n')
  return 0
end
redis.call('DEL', KEYS[1])
redis.call('PUBLISH', ARGV[3], ARGV[2])
return 1
"""


class Holder:
    """A holder speaking the protocol with its scripts, on its own connection."""

    def __init__(self, r, tag, id):
        self.r, self.keys, self.id = r, P.KeyScheme(tag), id.encode()
        self.token = P.new_token()
        self.scripts = {name: r.register_script(src) for name, src in P.SCRIPTS.items()}
        self.scripts["publish"] = r.register_script(PUBLISH_SRC)
        self.lock, self.events = self.keys.lock(self.id), self.keys.events(self.id)

    def take(self, ttl_ms):
        assert self.scripts["acquire"](keys=self.keys.id_keys(self.id), args=[self.token, ttl_ms]) == 1

    def renew(self, ttl_ms):
        assert self.scripts["renew"](keys=[self.lock], args=[self.token, ttl_ms, self.events]) == 1

    def release(self, event):
        return self.scripts["release"](keys=[self.lock, self.keys.value(self.id)],
                                       args=[self.token, self.events, event, 0])

    def end(self, how):
        """Ends the hold as a holder does: fail, notfound, value (published,
        not stored), or abandon."""
        if how == "fail":
            assert self.release(P.fail_event(self.token, MESSAGE)) == 1
        elif how == "abandon":
            assert self.release(P.abandon_event(self.token)) == 1
        elif how == "notfound":
            assert self.scripts["not_found"](keys=self.keys.id_keys(self.id), args=[self.token, 0, self.events]) == 1
        else:
            assert self.scripts["publish"](keys=[self.lock], args=[
                self.token, b"handed out", self.keys.notif(self.id), self.events]) == 1


def one_run(server, tag, id, jitter):
    """A Python holder whose fetch fails FAIL_AT s after it took the lock,
    SYNC_WAITERS Clients and ASYNC_WAITERS AsyncClients waiting; returns
    (the tokens of waiters that computed, the waiters' outcomes)."""
    rh = server.client()
    holder = memolock.Client(rh, tag, lock_ttl=LOCK_TTL)
    rws = [server.client() for _ in range(SYNC_WAITERS)]
    waiters = [memolock.Client(r, tag, lock_ttl=LOCK_TTL) for r in rws]
    locked = threading.Event()
    computed = []
    outcomes = []

    def no_jitter(c):
        if not jitter:
            c._core.rand = lambda: 0.0
        return c

    def failing(lease):
        taken = time.monotonic()  # the acquire reply came just before
        locked.set()
        time.sleep(max(taken + FAIL_AT - time.monotonic(), 0))
        raise RuntimeError(MESSAGE)

    def again(lease):
        computed.append(lease.token())
        raise RuntimeError("computed again by a waiter")

    def hold():
        try:
            holder.get(id, failing)
        except RuntimeError:
            pass

    def wait(c):
        try:
            outcomes.append(no_jitter(c).get(id, again, timeout=30))
        except BaseException as e:  # noqa: BLE001 - checked by the caller
            outcomes.append(e)

    async def wait_async():
        rs = [aredis.Redis(port=server.port) for _ in range(ASYNC_WAITERS)]
        cs = [no_jitter(memolock.AsyncClient(r, tag, lock_ttl=LOCK_TTL)) for r in rs]
        try:
            outcomes.extend(await asyncio.gather(*[c.get(id, again, timeout=30) for c in cs],
                                                 return_exceptions=True))
        finally:
            for c in cs:
                await c.close()
            for r in rs:
                await r.close()

    threads = [threading.Thread(target=hold, daemon=True)]
    threads[0].start()
    try:
        assert locked.wait(20), "the holder did not take the lock"
        threads += [threading.Thread(target=wait, args=(c,), daemon=True) for c in waiters]
        threads.append(threading.Thread(target=asyncio.run, args=(wait_async(),), daemon=True))
        for t in threads[1:]:
            t.start()
        for t in threads:
            t.join(40)
            assert not t.is_alive(), "a client did not finish"
    finally:
        for c in [holder] + waiters:
            c.close()
        for r in [rh] + rws:
            r.close()
    assert len(outcomes) == SYNC_WAITERS + ASYNC_WAITERS
    return computed, outcomes


@pytest.mark.parametrize("jitter", [True, False], ids=["rule", "no-jitter"])
def test_waiters_never_recompute_a_failure_at_a_renewal_moment(server, rdb, tag, jitter):
    # "rule" is the protocol's test: 20 runs, no recomputation. "no-jitter"
    # takes the random extra delay out of the waiters' timers, so that their
    # lookups land on the release: the marker round trip alone must then
    # keep every failure.
    results = {}

    def run(i):
        results[i] = one_run(server, tag, f"fails-at-5s-{i}", jitter)

    for first in range(0, RUNS, BATCH):
        ts = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(first, first + BATCH)]
        for t in ts:
            t.start()
        for t in ts:
            t.join(60)
    assert len(results) == RUNS
    computed = {i: r for i, (r, _) in results.items() if r}
    assert not computed, f"{len(computed)} of {RUNS} runs computed the failing value again"
    for i, (_, outcomes) in results.items():
        for o in outcomes:
            assert isinstance(o, memolock.HolderFailed) and o.message == MESSAGE, (i, o)
        assert rdb.get(f"{tag}/lock:fails-at-5s-{i}") is None  # nobody kept the lock


# --- the race made certain: the holder ends between a waiter's last look at
# its events and its lookup --------------------------------------------------

ENDINGS = ["fail", "notfound", "value", "abandon"]


def check_outcome(how, outcome, computed):
    if how == "fail":
        assert isinstance(outcome, memolock.HolderFailed) and outcome.message == MESSAGE, outcome
    elif how == "notfound":
        assert isinstance(outcome, memolock.NotFound), outcome
    elif how == "value":
        assert outcome == b"handed out"
    else:  # a genuine takeover: this waiter computes
        assert outcome == b"computed"
        assert len(computed) == 1
        return
    assert not computed


# What a waiter elsewhere gets when it already waits on the flight that took
# the lock over: that flight's own event (fail, notfound), a look that finds
# the lock free after abandon (it computes: the value was not stored), or
# the stored value.
SECOND = {"notfound": memolock.NotFound, "value": b"second computed", "abandon": b"computed"}


@pytest.mark.parametrize("how", ENDINGS)
def test_sync_takeover_reads_the_holders_last_event(server, rdb, tag, how):
    h = Holder(rdb, tag, "k")
    h.take(30000)
    rc, rs = server.client(), server.client()
    c = memolock.Client(rc, tag, lock_ttl=30)
    second = memolock.Client(rs, tag, lock_ttl=30)
    notif = c.keys.notif(b"k")
    computed, box, calls = [], {}, []
    orig = c._scripts["acquire"]

    def fetch(lease):
        computed.append(1)
        return b"computed", 60

    def second_waits():
        try:
            box["second"] = second.get("k", lambda lease: (b"second computed", 60), timeout=20)
        except memolock.MemolockError as e:
            box["second"] = e

    def acquire(*args, **kw):
        # The second run is the lookup once c's wait is live: the holder
        # ends first, so that it finds the lock free with the holder's event
        # published but not taken. Before the reply reaches c, another
        # client starts waiting on c as the holder.
        calls.append(1)
        if len(calls) != 2:
            return orig(*args, **kw)
        h.end(how)
        reply = orig(*args, **kw)
        assert reply == 1
        box["thread"] = threading.Thread(target=second_waits, daemon=True)
        box["thread"].start()
        until(lambda: second._sub.live_watches(notif) == 1, what="the second waiter's live subscription")
        return reply

    c._scripts["acquire"] = acquire
    try:
        try:
            box["first"] = c.get("k", fetch, timeout=20)
        except memolock.MemolockError as e:
            box["first"] = e
        check_outcome(how, box["first"], computed)
        assert len(calls) == 2
        box["thread"].join(25)
        want = SECOND.get(how)
        if how == "fail":
            assert isinstance(box["second"], memolock.HolderFailed) and box["second"].message == MESSAGE
        elif isinstance(want, type):
            assert isinstance(box["second"], want), box["second"]
        else:
            assert box["second"] == want
        lock = rdb.get(f"{tag}/lock:k")
        assert lock is None or lock.startswith(b"done:")  # nobody holds it
    finally:
        c.close()
        second.close()
        rc.close()
        rs.close()


@pytest.mark.parametrize("how", ENDINGS)
def test_async_takeover_reads_the_holders_last_event(server, rdb, tag, how):
    h = Holder(rdb, tag, "k")
    h.take(30000)

    async def main():
        r = aredis.Redis(port=server.port)
        c = memolock.AsyncClient(r, tag, lock_ttl=30)
        orig = c._scripts["acquire"]
        calls, computed = [], []

        async def acquire(*args, **kw):
            calls.append(1)
            if len(calls) == 2:
                h.end(how)  # blocks the loop: the subscriber reads nothing in between
            return await orig(*args, **kw)

        async def fetch(lease):
            computed.append(1)
            return b"computed", 60

        c._scripts["acquire"] = acquire
        try:
            try:
                outcome = await c.get("k", fetch, timeout=20)
            except memolock.MemolockError as e:
                outcome = e
            check_outcome(how, outcome, computed)
            assert len(calls) == 2
        finally:
            await c.close()
            await r.close()

    asyncio.run(asyncio.wait_for(main(), 60))
    if how != "abandon":
        assert rdb.get(f"{tag}/lock:k") is None  # the lock taken over was released


# --- [X5]: a failed takeover reaches the dead holder's waiters ---------------

DEAD_WAITERS = 4
REFUSAL = "the database refuses"


def _dead_holder_outcomes(server, rdb, tag, driver):
    """DEAD_WAITERS clients (each its own pub/sub connection) wait on a lock
    whose holder died; their fetch fails at once. Returns (how many times
    it ran, the outcomes)."""
    rdb.set(f"{tag}/lock:k", b"dead-holder", px=3000)
    notif = P.KeyScheme(tag).notif(b"k")
    calls = []

    def fetch(lease):
        calls.append(1)
        raise RuntimeError(REFUSAL)

    if driver == "sync":
        rs = [server.client() for _ in range(DEAD_WAITERS)]
        cs = [memolock.Client(r, tag, lock_ttl=3) for r in rs]
        outcomes = []

        def wait(c):
            try:
                outcomes.append(c.get("k", fetch, timeout=30))
            except BaseException as e:  # noqa: BLE001 - checked by the caller
                outcomes.append(e)

        threads = []
        try:
            for c in cs:
                threads.append(threading.Thread(target=wait, args=(c,), daemon=True))
                threads[-1].start()
                until(lambda: c._sub.live_watches(notif) == 1, what="the waiter to listen")
            for t in threads:
                t.join(25)
                assert not t.is_alive(), "a waiter had no answer 20s after the dead holder's lock expired"
        finally:
            for c in cs:
                c.close()
            for r in rs:
                r.close()
        return len(calls), outcomes

    async def fetch_async(lease):
        return fetch(lease)

    async def main():
        rs = [aredis.Redis(port=server.port) for _ in range(DEAD_WAITERS)]
        cs = [memolock.AsyncClient(r, tag, lock_ttl=3) for r in rs]
        try:
            tasks = []
            for c in cs:
                tasks.append(asyncio.ensure_future(c.get("k", fetch_async, timeout=30)))
                deadline = time.monotonic() + 10
                while c._sub.live_watches(notif) != 1:
                    assert time.monotonic() < deadline, "the waiter never listened"
                    await asyncio.sleep(0.01)
            return await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 25)
        finally:
            for c in cs:
                await c.close()
            for r in rs:
                await r.close()

    outcomes = asyncio.run(main())
    return len(calls), outcomes


@pytest.mark.parametrize("driver", ["sync", "async"])
def test_takeover_failure_reaches_the_dead_holders_waiters(server, rdb, tag, driver):
    # The waiters look again one after the other as their spread timers
    # fire. The first takes the lock over and fails; without [X5] each of
    # the others, still waiting on the dead holder, ignores that failure,
    # takes the lock in turn and runs the failing fetch again.
    runs, outcomes = _dead_holder_outcomes(server, rdb, tag, driver)
    assert len(outcomes) == DEAD_WAITERS
    for o in outcomes:
        assert isinstance(o, Exception) and REFUSAL in str(o), outcomes
    assert runs == 1, f"the failing fetch ran {runs} times among {DEAD_WAITERS} waiters of a dead holder; want once"
