"""The sync Client against a real redis-server."""

import threading
import time

import pytest
import redis

import memolock
from conftest import key_misses
from memolock import protocol as P

WAIT = 20  # generous: a noisy 2-core VM


def run_thread(fn, *args):
    box = {}

    def target():
        try:
            box["val"] = fn(*args)
        except BaseException as e:  # noqa: BLE001
            box["err"] = e

    t = threading.Thread(target=target, daemon=True)
    t.start()
    return t, box


def until(cond, timeout=WAIT, what="condition"):
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


@pytest.fixture
def client(rdb, tag):
    c = memolock.Client(rdb, tag, lock_ttl=2)
    yield c
    c.close()


def test_miss_then_hit(client, rdb, tag):
    calls = []

    def fetch(lease):
        calls.append(lease.token())
        assert lease.held()
        return b"value\x00\xff", 0

    assert client.get("k", fetch) == b"value\x00\xff"
    assert client.get("k", fetch) == b"value\x00\xff"
    assert len(calls) == 1
    assert rdb.get(f"{tag}:k") == b"value\x00\xff"
    assert rdb.ttl(f"{tag}:k") == -1
    lock = rdb.get(f"{tag}/lock:k")
    assert lock == b"done:" + calls[0].encode()  # lingers after the store
    assert 0 < rdb.pttl(f"{tag}/lock:k") <= P.LINGER_MS


def test_value_ttl_and_linger(client, rdb, tag):
    assert client.get("t", lambda lease: (b"v", 0.5)) == b"v"
    # Both read at one instant (MULTI); on a loaded machine both may be gone.
    with rdb.pipeline(transaction=True) as p:
        value, lock = p.pttl(f"{tag}:t").pttl(f"{tag}/lock:t").execute()
    assert value <= 500, value
    # The lock lingers, and never outlives the value (read first: a late
    # read may find the lock gone and the value in its last millisecond).
    assert (0 < lock <= value) or (lock == -2 and (value == -2 or value >= 0)), (value, lock)
    assert client.get("u", lambda lease: (b"v", 0.0001)) is not None  # rounded up to 1 ms


def test_bulk_one_is_a_value(client, rdb, tag):
    rdb.set(f"{tag}:one", b"1")
    assert client.get("one", lambda lease: (b"other", 0)) == b"1"


def test_coalescing(client):
    calls = []
    gate = threading.Event()

    def fetch(lease):
        calls.append(1)
        gate.wait(WAIT)
        return b"shared", 0

    threads = [run_thread(client.get, "c", fetch) for _ in range(8)]
    until(lambda: calls, what="fetch")
    time.sleep(0.1)
    gate.set()
    for t, box in threads:
        t.join(WAIT)
        assert box.get("val") == b"shared", box
    assert len(calls) == 1


def test_waiter_in_other_client(server, tag):
    r1, r2 = server.client(), server.client()
    c1 = memolock.Client(r1, tag, lock_ttl=5)
    waits = []
    waiting = threading.Event()
    c2 = memolock.Client(r2, tag, lock_ttl=5, on_wait=lambda id, holder: (waits.append(holder), waiting.set()))
    try:
        started = threading.Event()

        def slow(lease):
            started.set()
            waiting.wait(WAIT)  # c2 found the lock held, however late it came
            return b"from c1", 60

        t, box = run_thread(c1.get, "w", slow)
        started.wait(WAIT)
        assert c2.get("w", lambda lease: (b"from c2", 60)) == b"from c1"
        t.join(WAIT)
        assert box["val"] == b"from c1"
        assert c2.get("w", lambda lease: (b"from c2", 60)) == b"from c1"
        assert waits and "@" in waits[0]
    finally:
        c1.close()
        c2.close()
        r1.close()
        r2.close()


def test_waiter_gets_published_value(server, tag):
    r1, r2 = server.client(), server.client()
    c1, c2 = memolock.Client(r1, tag, lock_ttl=5), memolock.Client(r2, tag, lock_ttl=5)
    try:
        started = threading.Event()

        def slow(lease):
            started.set()
            time.sleep(0.5)
            return b"published", 60

        t, box = run_thread(c1.get, "p", slow)
        started.wait(WAIT)
        other = []
        assert c2.get("p", lambda lease: other.append(1) or (b"wrong", 60)) == b"published"
        assert not other
        t.join(WAIT)
    finally:
        c1.close()
        c2.close()
        r1.close()
        r2.close()


def test_holder_failure_reaches_waiters_fast(server, tag):
    r1, r2 = server.client(), server.client()
    c1, c2 = memolock.Client(r1, tag, lock_ttl=30), memolock.Client(r2, tag, lock_ttl=30)
    try:
        started, fail = threading.Event(), threading.Event()

        def bad(lease):
            started.set()
            fail.wait(WAIT)
            raise RuntimeError("backend down\nstack trace")

        before = key_misses(r1)
        t, box = run_thread(c1.get, "f", bad)
        started.wait(WAIT)
        lookup = key_misses(r1) - before
        assert lookup > 0, "the holder's lookup missed no key"
        w, wbox = run_thread(c2.get, "f", lambda lease: (b"x", 0))
        # The holder fails only after the waiter's lookup once its
        # subscription is live: a failure released before it leaves the
        # lock free, and the waiter computes instead (PROTOCOL.md, step 2).
        until(lambda: key_misses(r1) >= before + 3 * lookup, what="the waiter's lookups")
        t0 = time.monotonic()
        fail.set()
        w.join(WAIT)
        assert time.monotonic() - t0 < 10  # far less than the 30 s lock TTL
        err = wbox.get("err")
        assert isinstance(err, memolock.HolderFailed), wbox
        assert err.message == "backend down"
        t.join(WAIT)
        assert isinstance(box["err"], RuntimeError)
        assert r1.get(f"{tag}/lock:f") is None
    finally:
        c1.close()
        c2.close()
        r1.close()
        r2.close()


def test_takeover_on_expiry(client, rdb, tag):
    t0 = time.monotonic()  # before the lock: it lives 800 ms from later on
    rdb.set(f"{tag}/lock:dead", b"deadbeef@gone:1", px=800)
    assert client.get("dead", lambda lease: (b"taken over", 0)) == b"taken over"
    assert time.monotonic() - t0 >= 0.5


def _scripts_run(rdb):
    stats = rdb.info("commandstats")
    return sum(stats.get(k, {}).get("calls", 0) for k in ("cmdstat_evalsha", "cmdstat_eval"))


def test_abandon_event_wakes_waiter(client, rdb, tag):
    token = b"0123@elsewhere:1"
    rdb.set(f"{tag}/lock:ab", token, px=60000)
    before = _scripts_run(rdb)
    t, box = run_thread(client.get, "ab", lambda lease: (b"after abandon", 0))
    until(lambda: client._sub.live_watches(client.keys.notif(b"ab")) == 1, what="live watch")
    # The lookup, then the look again once the watch is live: only then may
    # the lock go (a look again after it would simply take the lock; seen
    # under load).
    until(lambda: _scripts_run(rdb) >= before + 2, what="the look again after the watch went live")
    rdb.publish(f"{tag}/lock-event:ab", b"abandon\nsomebody-else\n")  # not our holder: ignored
    rdb.delete(f"{tag}/lock:ab")
    time.sleep(0.2)
    assert t.is_alive()
    rdb.publish(f"{tag}/lock-event:ab", P.abandon_event(token))
    t.join(WAIT)
    assert box["val"] == b"after abandon"


def test_fail_event_from_other_peer(client, rdb, tag):
    token = b"0123@elsewhere:1"
    rdb.set(f"{tag}/lock:fe", token, px=60000)
    t, box = run_thread(client.get, "fe", lambda lease: (b"x", 0))
    until(lambda: client._sub.live_watches(client.keys.notif(b"fe")) == 1, what="live watch")
    rdb.publish(f"{tag}/lock-event:fe", P.fail_event(token, b"it broke"))
    t.join(WAIT)
    assert isinstance(box["err"], memolock.HolderFailed) and box["err"].message == "it broke"


def test_one_pubsub_connection_refcounted(client, rdb, tag):
    for i in range(5):
        rdb.set(f"{tag}/lock:m{i}", b"other@x:1", px=60000)
    threads = [run_thread(client.get, f"m{i}", lambda lease: (b"x", 0)) for i in range(5)]
    threads += [run_thread(client.get, "m0", lambda lease: (b"x", 0)) for _ in range(3)]
    until(lambda: all(client._sub.live_watches(client.keys.notif(f"m{i}".encode())) == 1 for i in range(5)),
          what="live watches")
    subs = [c for c in rdb.client_list(_type="pubsub")]
    mine = [c for c in subs if int(c.get("sub", 0)) > 0]
    assert len(mine) == 1 and int(mine[0]["sub"]) == 10, subs
    numsub = dict(rdb.pubsub_numsub(f"{tag}/notif:m0"))
    assert numsub[f"{tag}/notif:m0".encode()] == 1
    for i in range(5):
        rdb.set(f"{tag}:m{i}", b"v%d" % i)
        rdb.publish(f"{tag}/notif:m{i}", b"v%d" % i)
    for t, box in threads:
        t.join(WAIT)
        assert box["val"].startswith(b"v"), box
    until(lambda: not client._sub.subscribed(), what="unsubscribe")


def test_reconnect_rereads(client, rdb, tag):
    rdb.set(f"{tag}/lock:rc", b"other@x:1", px=60000)
    t, box = run_thread(client.get, "rc", lambda lease: (b"computed", 0))
    notif = client.keys.notif(b"rc")
    until(lambda: client._sub.live_watches(notif) == 1, what="live watch")
    before = client._sub.reconnects
    old = {c["id"] for c in rdb.client_list(_type="pubsub")}
    rdb.client_kill_filter(_type="pubsub")
    # Redis may close a killed client asynchronously: until it is gone, a
    # PUBLISH could still reach it, and nothing would have been missed.
    until(lambda: not old & {c["id"] for c in rdb.client_list(_type="pubsub")}, what="the killed connection to go")
    # Stored while the subscriber is down: the PUBLISH reaches nobody.
    rdb.set(f"{tag}:rc", b"stored during the gap")
    rdb.publish(f"{tag}/notif:rc", b"stored during the gap")
    t.join(WAIT)
    assert box.get("val") == b"stored during the gap", box
    assert client._sub.reconnects > before


def test_server_restart_rereads(own_server, tag):
    r = own_server.client()
    c = memolock.Client(r, tag, lock_ttl=60)
    try:
        r.set(f"{tag}/lock:rs", b"other@x:1", px=60000)
        t, box = run_thread(c.get, "rs", lambda lease: (b"computed", 0))
        until(lambda: c._sub.live_watches(c.keys.notif(b"rs")) == 1, what="live watch")
        r.save()  # the lock survives the restart
        own_server.stop()
        own_server.start()
        assert r.get(f"{tag}/lock:rs") == b"other@x:1"
        r.set(f"{tag}:rs", b"after restart")
        r.publish(f"{tag}/notif:rs", b"after restart")
        t.join(WAIT)
        # The re-read (or the message) brings the value; a lookup may also
        # have met the dead connection of the main client.
        assert box.get("val") == b"after restart" or isinstance(box.get("err"), memolock.RedisError), box
    finally:
        c.close()
        r.close()


def test_external_mode(client, rdb, tag):
    tokens = []

    def start(lease):
        tokens.append(lease.token())

        def produce():
            time.sleep(0.3)
            rdb.set(f"{tag}:ext", b"produced")
            rdb.publish(f"{tag}/notif:ext", b"produced")

        threading.Thread(target=produce, daemon=True).start()

    assert client.get_external("ext", start) == b"produced"
    assert rdb.get(f"{tag}/lock:ext") == b"done:" + tokens[0].encode()
    assert client.get_external("ext", start) == b"produced"
    assert len(tokens) == 1


def test_external_producer_failure(client, rdb, tag):
    def start(lease):
        token = lease.token().encode()

        def produce():
            # Once the winner listens: an event published before its
            # subscription is live is lost.
            until(lambda: client._sub.live_watches(client.keys.notif(b"exf")) == 1, what="live watch")
            rdb.publish(f"{tag}/lock-event:exf", P.fail_event(token, b"producer failed"))

        threading.Thread(target=produce, daemon=True).start()

    with pytest.raises(memolock.HolderFailed, match="producer failed"):
        client.get_external("exf", start)
    assert rdb.get(f"{tag}/lock:exf") is None


def test_lease(client, rdb, tag):
    seen = {}

    def fetch(lease):
        seen["token"] = lease.token()
        seen["held"] = lease.held()
        lease.extend(30)
        seen["pttl"] = rdb.pttl(f"{tag}/lock:l")
        with pytest.raises(ValueError):
            lease.extend(0)
        rdb.set(f"{tag}/lock:l", b"stolen")
        seen["held2"] = lease.held()
        with pytest.raises(memolock.LeaseLost):
            lease.extend(1)
        return b"v", 0

    assert client.get("l", fetch) == b"v"
    assert seen["held"] and not seen["held2"] and seen["pttl"] > 20000
    assert rdb.get(f"{tag}:l") is None  # lease lost: not stored


def test_watchdog_renews(server, tag):
    r = server.client()
    # Renewed every lock_ttl/3: a second leaves the watchdog 600 ms of
    # delay on a loaded machine before the lock could lapse.
    c = memolock.Client(r, tag, lock_ttl=1)
    try:
        def fetch(lease):
            time.sleep(3.2)  # over three lock TTLs
            return b"long", 0

        assert c.get("wd", fetch) == b"long"
        assert r.get(f"{tag}:wd") == b"long"  # still held at store time
    finally:
        c.close()
        r.close()


def test_timeout(client, rdb, tag):
    rdb.set(f"{tag}/lock:to", b"other@x:1", px=60000)
    with pytest.raises(memolock.Timeout):
        client.get("to", lambda lease: (b"x", 0), timeout=0.3)


def test_close_wakes_waiters_and_stops_threads(server, tag):
    before = set(threading.enumerate())
    r = server.client()
    c = memolock.Client(r, tag)
    r.set(f"{tag}/lock:cl", b"other@x:1", px=60000)
    t, box = run_thread(c.get, "cl", lambda lease: (b"x", 0))
    until(lambda: c._sub.live_watches(c.keys.notif(b"cl")) == 1, what="live watch")
    c.close()
    t.join(WAIT)
    assert isinstance(box["err"], memolock.Closed)
    with pytest.raises(memolock.Closed):
        c.get("cl", lambda lease: (b"x", 0))
    c.close()  # twice is fine
    until(lambda: set(threading.enumerate()) <= before, what="threads to end")
    r.close()


def test_close_releases_with_abandon(server, tag):
    r = server.client()
    c = memolock.Client(r, tag, lock_ttl=30)
    started = threading.Event()

    def fetch(lease):
        started.set()
        lease.cancelled.wait(WAIT)
        raise RuntimeError("cancelled")

    t, box = run_thread(c.get, "ca", fetch)
    started.wait(WAIT)
    ps = r.pubsub()
    ps.subscribe(f"{tag}/lock-event:ca")
    ps.get_message(timeout=2)
    c.close()
    t.join(WAIT)
    assert isinstance(box["err"], memolock.Closed)
    msg = None
    deadline = time.monotonic() + WAIT
    while msg is None and time.monotonic() < deadline:
        msg = ps.get_message(timeout=1)
    assert msg and msg["data"].startswith(b"abandon\n")
    assert r.get(f"{tag}/lock:ca") is None
    ps.close()
    r.close()


def test_close_waits_for_the_release_after_a_slow_fetch(server, tag):
    """Close waits its 1 s for the work under way from when the fetches it
    cancelled have returned: a fetch that ignores its cancellation past that
    second still has its lock released (slowly here) before close returns."""
    r = server.client()
    c = memolock.Client(r, tag, lock_ttl=30)
    started = threading.Event()
    inner = c._scripts["release"]
    releases = []

    def slow_release(**kw):
        releases.append(1)
        time.sleep(0.3)  # a slow round trip
        return inner(**kw)

    c._scripts["release"] = slow_release

    def fetch(lease):
        started.set()
        lease.cancelled.wait(WAIT)
        time.sleep(1.5)  # past the 1 s from when close began
        raise RuntimeError("cancelled")

    t, box = run_thread(c.get, "cs", fetch)
    assert started.wait(WAIT)
    c.close()
    assert releases == [1]
    assert r.get(f"{tag}/lock:cs") is None, "lock released before close returned"
    t.join(WAIT)
    assert isinstance(box["err"], memolock.Closed)
    r.close()


def test_hash_ids(server, tag):
    r = server.client()
    with memolock.Client(r, tag, hash_ids=True) as c:
        assert c.get("user 42", lambda lease: (b"h", 0)) == b"h"
        assert r.get(f"{tag}:" + P.hash_id(b"user 42").decode()) == b"h"
    r.close()


def test_bad_input(rdb, client):
    for bad in ("", b"", "a/lock", "x/notif", "a/lockb"):
        with pytest.raises(ValueError):
            memolock.Client(rdb, bad)
    with pytest.raises(ValueError):
        memolock.Client(rdb, "t", lock_ttl=0)
    with pytest.raises(ValueError):
        memolock.Client(rdb, "t", lock_ttl=-1)
    with pytest.raises(ValueError):
        memolock.Client(rdb, "t", lock_ttl=0.0001)
    with pytest.raises(ValueError):
        memolock.Client(None, "t")
    dec = redis.Redis(port=rdb.connection_pool.connection_kwargs["port"], decode_responses=True)
    with pytest.raises(ValueError, match="decode"):
        memolock.Client(dec, "t")
    dec.close()
    with pytest.raises(ValueError):
        client.get(42, lambda lease: (b"x", 0))
    with pytest.raises(ValueError):
        client.get("x", None)
    with pytest.raises(ValueError, match="not bytes"):
        client.get("str", lambda lease: ("a str", 0))
    with pytest.raises(ValueError, match="negative"):
        client.get("neg", lambda lease: (b"x", -1))
    with pytest.raises(ValueError):
        client.get("nan", lambda lease: (b"x", float("nan")))
    with pytest.raises(ValueError):
        client.get("x", lambda lease: (b"x", 0), timeout=-1)


def test_silent_connection_is_probed_and_replaced(own_server, tag):
    r = own_server.client()
    c = memolock.Client(r, tag, lock_ttl=60)
    c._sub.health = 0.5
    try:
        r.set(f"{tag}/lock:hp", b"other@x:1", px=60000)
        t, box = run_thread(c.get, "hp", lambda lease: (b"computed", 0))
        until(lambda: c._sub.live_watches(c.keys.notif(b"hp")) == 1, what="live watch")
        before = c._sub.reconnects
        r.execute_command("CLIENT", "PAUSE", "2500", "ALL")  # nothing answers: the probe goes unanswered
        until(lambda: c._sub.reconnects > before, what="replacement")
        r.set(f"{tag}:hp", b"after pause")
        t.join(WAIT)
        assert box.get("val") == b"after pause", box
    finally:
        c.close()
        r.close()


def test_subscribe_refused_by_acl(own_server, tag):
    admin = own_server.client()
    admin.execute_command("ACL", "SETUSER", "nosub", "on", ">pw", "~*", "+@all", "resetchannels")
    r = redis.Redis(port=own_server.port, username="nosub", password="pw")
    c = memolock.Client(r, tag, lock_ttl=60)
    try:
        admin.set(f"{tag}/lock:acl", b"other@x:1", px=60000)
        with pytest.raises(memolock.RedisError, match="subscrib"):
            c.get("acl", lambda lease: (b"x", 0), timeout=WAIT)
        # The connection is kept: a value still arrives for a permitted client.
        assert c.get("hit", lambda lease: (b"fine", 0)) == b"fine"
    finally:
        c.close()
        r.close()
        admin.close()
