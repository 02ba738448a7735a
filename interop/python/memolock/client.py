"""The synchronous client: threads, redis-py's sync Redis client.

A flight is one process's pursuit of one value: every concurrent get() of
one id shares it (like Go's x/sync/singleflight). The first caller runs the
flight on its own thread (on a new thread if it gave a timeout, so that it
can leave), looks the value up with the acquire script, and then either has
the value, holds the lock and runs fetch (see _hold), or waits (see _Wait).
"""

import threading
import time

import redis

from . import protocol as P
from .errors import Abandoned, Closed, HolderFailed, InvalidArgument, LeaseLost, NotFound, RedisError, Timeout
from .subscriber import Subscriber

_local = threading.local()  # .callback is set while a user function runs


def _in_callback():
    return getattr(_local, "callback", 0) > 0


def _call_user(fn, *args):
    _local.callback = getattr(_local, "callback", 0) + 1
    try:
        return fn(*args)
    finally:
        _local.callback -= 1


def check_redis(redis_client, kind):
    if redis_client is None:
        raise InvalidArgument("redis client is None")
    pool = getattr(redis_client, "connection_pool", None)
    if pool is None or not hasattr(redis_client, "register_script"):
        raise InvalidArgument(f"expected a {kind} client, got {type(redis_client).__name__}")
    if pool.connection_kwargs.get("decode_responses"):
        raise InvalidArgument("the redis client decodes responses; memolock needs raw bytes (decode_responses=False)")


class Lease:
    """The right to compute one value: the lock key holding our token."""

    def __init__(self, client, key, token):
        self._c = client
        self._key = key
        self._token = token
        #: Set when the client is closing: a long fetch should stop.
        self.cancelled = client._closing

    def id(self):
        """The id as sent to Redis (bytes)."""
        return self._key

    def token(self):
        """The token stored in the lock (str)."""
        return self._token.decode()

    def held(self):
        """Whether the lock still holds our token (a lost lease is reported to waiters)."""
        return self._c._renew(self._key, self._token, 0)

    def extend(self, ttl):
        """Makes the lock live at least ttl seconds from now; never shortens it."""
        ms = P.duration_ms(ttl, "lease extension", allow_zero=False)
        if not self._c._renew(self._key, self._token, ms):
            raise LeaseLost("memolock: lease lost")


class _Flight:
    def __init__(self, id, key, fetch, start):
        self.id, self.key = id, key
        self.token = P.new_token()
        self.fetch, self.start = fetch, start
        self.done = threading.Event()
        self.wake = threading.Event()  # the watch's signal; also set by finish and stop
        self.stopped = threading.Event()  # every caller left, or close
        self.val = None
        self.err = None
        self.refs = 1
        self.state = "looking"  # looking | holding | abandoned | finished


class Client:
    """Computes values of one tag once across processes. Thread-safe.

    redis_client: a redis.Redis with decode_responses=False.
    lock_ttl: seconds a lock lives unrenewed (how long waiters wait for a
    holder that died). hash_ids: send sha256(id) hex instead of the id.
    on_wait(id, holder_token): called when a flight starts waiting.
    neg_ttl: seconds Redis remembers that fetch raised NotFound (0, the
    default: not at all, and the next get() calls fetch again).
    """

    def __init__(self, redis_client, tag, lock_ttl=P.DEFAULT_LOCK_TTL, hash_ids=False, on_wait=None, neg_ttl=0):
        check_redis(redis_client, "redis.Redis")
        self._rdb = redis_client
        self.keys = P.KeyScheme(tag)
        self.lock_ttl_ms = P.duration_ms(lock_ttl, "lock_ttl", allow_zero=False)
        self.lock_ttl = self.lock_ttl_ms / 1000
        self.neg_ttl_ms = P.optional_ms(neg_ttl, "neg_ttl")
        self.hash_ids = bool(hash_ids)
        self._on_wait = on_wait
        self._scripts = {name: redis_client.register_script(src) for name, src in P.SCRIPTS.items()}
        self._sub = Subscriber(redis_client)
        self._mu = threading.Lock()
        self._cond = threading.Condition(self._mu)
        self._flights = {}
        self._active = 0  # flights running
        self._callbacks = 0  # fetch/start functions running
        self._closed = False
        self._closing = threading.Event()
        self._closed_done = threading.Event()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # --- public API ------------------------------------------------------

    def get(self, id, fetch, timeout=None):
        """Returns the value of id (bytes). On a miss exactly one caller
        across all processes runs fetch(lease) -> (bytes, ttl_seconds), ttl 0
        keeping the value for ever, and stores it; everybody else waits.
        fetch raises NotFound if the id has no value: every caller, here and
        elsewhere, then gets NotFound, remembered for neg_ttl.
        Raises what fetch raised (in this process), HolderFailed (a holder
        elsewhere failed), NotFound (fetch found nothing, here or elsewhere,
        or Redis remembers so), Timeout, Closed, RedisError, or ValueError."""
        if not callable(fetch):
            raise InvalidArgument("fetch must be callable")
        return self._get(id, fetch, None, timeout)

    def get_external(self, id, start, timeout=None):
        """get() for values another program produces: the lock winner calls
        start(lease), then waits like everybody else for the value to be SET
        and PUBLISHed on the value channel."""
        if not callable(start):
            raise InvalidArgument("start must be callable")
        return self._get(id, None, start, timeout)

    def close(self):
        """Releases the locks held (with abandon events), wakes every waiter
        with Closed, waits for running fetches, stops the listener thread."""
        with self._mu:
            first = not self._closed
            self._closed = True
            flights = list(self._flights.values())
        if not first:
            if not _in_callback():
                self._closed_done.wait()
            return
        self._closing.set()
        for f in flights:
            f.stopped.set()
            self._finish(f, None, Closed("memolock: client closed"))
        if _in_callback():
            threading.Thread(target=self._shutdown, daemon=True).start()
            return
        self._shutdown()

    # --- flights ---------------------------------------------------------

    def _get(self, id, fetch, start, timeout):
        idb = P.to_bytes(id, "id")
        if timeout is not None:
            if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout < 0:
                raise InvalidArgument(f"timeout {timeout!r} must be a non-negative number of seconds")
        key = P.hash_id(idb) if self.hash_ids else idb
        with self._mu:
            if self._closed:
                raise Closed("memolock: client closed")
            f = self._flights.get(key)
            leader = f is None
            if leader:
                f = _Flight(idb, key, fetch, start)
                self._flights[key] = f
                self._active += 1
            else:
                f.refs += 1
        if leader:
            if timeout is None:
                self._resolve(f)
            else:
                threading.Thread(target=self._resolve, args=(f,), name="memolock-flight", daemon=True).start()
        if not f.done.wait(timeout):
            self._leave(f)
            raise Timeout(f"memolock: gave up waiting for the value after {timeout}s")
        if f.err is not None:
            raise f.err
        return f.val

    def _leave(self, f):
        with self._mu:
            f.refs -= 1
            if f.refs == 0 and f.state == "looking":
                f.state = "abandoned"
                if self._flights.get(f.key) is f:
                    del self._flights[f.key]
                f.stopped.set()
                f.wake.set()

    def _finish(self, f, val, err):
        with self._mu:
            if f.state == "finished":
                return False
            f.state = "finished"
            if self._flights.get(f.key) is f:
                del self._flights[f.key]
        f.val, f.err = val, err
        f.done.set()
        f.wake.set()
        return True

    def _hold_state(self, f):
        """Moves f to holding before a user function runs under its lock."""
        with self._mu:
            if self._closed or f.state not in ("looking", "holding"):
                return False
            f.state = "holding"
            self._callbacks += 1
            return True

    def _callback_done(self):
        with self._mu:
            self._callbacks -= 1
            self._cond.notify_all()

    def _retire(self, f):
        with self._mu:
            if f.refs > 0:
                return False
            f.state = "abandoned"
            if self._flights.get(f.key) is f:
                del self._flights[f.key]
            return True

    def _resolve(self, f):
        w = _Wait(self, f)
        try:
            try:
                val, err = self._pursue(f, w), None
            except BaseException as e:  # noqa: BLE001 - handed to callers
                val, err = None, e
            self._finish(f, val, err)
            w.end()
        finally:
            with self._mu:
                self._active -= 1
                self._cond.notify_all()

    def _ended(self):
        if self._closing.is_set():
            return Closed("memolock: client closed")
        return Abandoned("memolock: flight abandoned")

    def _pursue(self, f, w):
        while True:
            if f.stopped.is_set():
                raise self._ended()
            r = self._acquire(f, w)
            if r.kind == P.HIT:
                return w.value(r.value)
            if r.kind == P.NOT_FOUND:
                w.value(None)  # ends the wait as a value would (external mode: our lock goes)
                raise _not_found_error(f)
            if r.kind == P.LOCKED and f.start is None:
                w.end()
                return self._hold(f, r.pttl)
            if r.kind == P.LOCKED and w.own and r.pttl >= 0:
                r = P.Reply(P.BUSY, pttl=r.pttl, holder=f.token)
            elif r.kind == P.LOCKED:
                if self._retire(f):
                    w.own = True  # end() releases it
                    raise Abandoned("memolock: flight abandoned")
                self._start_external(f)
                r = P.Reply(P.BUSY, pttl=self.lock_ttl_ms, holder=f.token)
            n = w.wait(r)
            if n is not _AGAIN:
                return n

    # --- Redis calls -----------------------------------------------------

    def _acquire(self, f, w):
        keys = self.keys.id_keys(f.key)
        try:
            res = self._scripts["acquire"](keys=keys, args=[f.token, self.lock_ttl_ms])
        except redis.exceptions.ResponseError as e:
            raise RedisError(f"memolock: redis: reading {P.quote(keys[0])}: {e}") from e
        except Exception as e:
            w.maybe_locked = True  # the script may have run
            raise RedisError(f"memolock: redis: reading {P.quote(keys[0])}: {e}") from e
        try:
            return P.decode_acquire(res, f.token)
        except ValueError as e:
            raise RedisError(f"memolock: redis: reading {P.quote(keys[0])}: {e}") from e

    def _release(self, f, event, linger_ms=0):
        """Deletes f's lock (or keeps it linger_ms as done) if still ours,
        publishing event; reports whether it did. Failures are harmless."""
        try:
            return self._scripts["release"](
                keys=[self.keys.lock(f.key), self.keys.value(f.key)],
                args=[f.token, self.keys.events(f.key), event, linger_ms]) == 1
        except Exception:
            return False

    def _renew(self, key, token, ms):
        try:
            return self._scripts["renew"](keys=[self.keys.lock(key)], args=[token, ms, self.keys.events(key)]) == 1
        except Exception as e:
            raise RedisError(f"memolock: redis: renewing lock {P.quote(self.keys.lock(key))}: {e}") from e

    def _store(self, f, val, ttl_ms):
        keys = self.keys.id_keys(f.key)
        try:
            # No ARGV[7] (Go's StaleTTL): the script drops any stale copy.
            return self._scripts["store"](keys=keys, args=[
                f.token, val, ttl_ms, self.keys.notif(f.key), self.keys.events(f.key), P.LINGER_MS]) == 1
        except Exception as e:
            raise RedisError(f"memolock: redis: storing {P.quote(keys[0])}: {e}") from e

    def _not_found(self, f):
        """Runs not_found: records for neg_ttl that fetch found nothing and
        tells waiters. If it fails, releases the lock with an abandon event."""
        keys = self.keys.id_keys(f.key)
        try:
            self._scripts["not_found"](keys=keys, args=[f.token, self.neg_ttl_ms, self.keys.events(f.key)])
        except Exception:
            if not self._release(f, P.abandon_event(f.token)):
                # The script may have run in part, or the lock expired:
                # tell waiters anyway.
                try:
                    self._rdb.publish(self.keys.events(f.key), P.abandon_event(f.token))
                except Exception:
                    pass

    # --- holding the lock ------------------------------------------------

    def _hold(self, f, pttl):
        if not self._hold_state(f):
            self._release(f, P.abandon_event(f.token))
            raise self._ended()
        lease = Lease(self, f.key, f.token)
        stop = threading.Event()
        first = self.lock_ttl / 3
        if pttl >= 0:
            first = min(first, pttl / 2000)
        dog = threading.Thread(target=self._watchdog, args=(f, stop, first), name="memolock-watchdog", daemon=True)
        dog.start()
        err = None
        try:
            val, ttl = _call_user(f.fetch, lease)
            val, ttl_ms = P.check_value(val, ttl)
        except BaseException as e:  # noqa: BLE001
            err = e
        finally:
            stop.set()
            dog.join()
            self._callback_done()
        if err is not None and (self._closing.is_set() or not isinstance(err, Exception)):
            # Most likely cancelled by close (or interrupted): hand over.
            self._release(f, P.abandon_event(f.token))
            if isinstance(err, Exception):
                raise Closed("memolock: client closed") from err
            raise err
        if isinstance(err, NotFound):
            # Not a failure: no fail event; the callers get fetch's NotFound.
            self._not_found(f)
            raise err
        if err is not None:
            self._release(f, P.fail_event(f.token, err))
            raise err
        try:
            self._store(f, val, ttl_ms)
        except RedisError as e:
            # Tell waiters now: fail if the lock is still ours, else abandon
            # (the script may have stored and been refused its PUBLISH).
            if not self._release(f, P.fail_event(f.token, e)):
                try:
                    self._rdb.publish(self.keys.events(f.key), P.abandon_event(f.token))
                except Exception:
                    pass
        return val

    def _watchdog(self, f, stop, first):
        d = first
        while not stop.wait(d):
            try:
                if not self._renew(f.key, f.token, self.lock_ttl_ms):
                    return  # lost; the store script will refuse
            except RedisError:
                pass
            d = self.lock_ttl / 3

    def _start_external(self, f):
        if not self._hold_state(f):
            self._release(f, P.abandon_event(f.token))
            raise self._ended()
        try:
            _call_user(f.start, Lease(self, f.key, f.token))
        except BaseException as e:
            self._release(f, P.fail_event(f.token, e))
            raise
        finally:
            self._callback_done()

    def _shutdown(self):
        with self._cond:
            while self._callbacks:
                self._cond.wait()
            deadline = time.monotonic() + P.CLOSE_WAIT
            while self._active and time.monotonic() < deadline:
                self._cond.wait(deadline - time.monotonic())
        self._sub.close(max(deadline - time.monotonic(), 0.1))
        self._closed_done.set()


_AGAIN = object()


def _not_found_error(f):
    return NotFound(f"memolock: not found: id {P.quote(f.id)}")


class _Wait:
    """A flight's wait on a lock held by somebody else (or, in external
    mode, by the flight while another program works)."""

    def __init__(self, c, f):
        self.c, self.f = c, f
        self.w = None
        self.holder = None
        self.deadline = 0.0
        self.own = False
        self.maybe_locked = False

    def busy(self, r):
        self.own = r.holder == self.f.token
        if r.holder != self.holder:
            self.holder = r.holder
            if not self.own and self.c._on_wait is not None:
                try:
                    _call_user(self.c._on_wait, self.f.id, r.holder.decode("utf-8", "replace"))
                except Exception:
                    pass
        if self.w is None:
            self.w = self.c._sub.watch(self.f.wake, self.c.keys.notif(self.f.key), self.c.keys.events(self.f.key))
        d = (r.pttl + 1) / 1000 if r.pttl >= 0 else self.c.lock_ttl
        self.deadline = time.monotonic() + d

    def wait(self, r):
        self.busy(r)
        f = self.f
        notif = self.c.keys.notif(f.key)
        while True:
            # take() clears the wake-up signal: read the flags after it, so
            # that a close or a last caller's leaving just before is seen.
            ev = self.c._sub.take(self.w)
            if f.done.is_set():
                if f.err is not None:
                    raise f.err
                return f.val
            if f.stopped.is_set():
                raise self.c._ended()
            if ev.closed:
                raise Closed("memolock: client closed")
            if ev.err is not None:
                raise RedisError(f"memolock: redis: subscribing to {P.quote(notif)}: {ev.err}")
            for ch, payload in ev.messages:
                if ch == notif:
                    return self.value(payload)
                kind, token, text = P.parse_event(payload)
                if token != self.holder:
                    continue
                if kind == P.EVENT_FAIL:
                    if self.own:
                        self.own = False
                        self.c._release(f, b"")
                    raise HolderFailed(text)
                if kind == P.EVENT_NOTFOUND:
                    self.value(None)
                    raise _not_found_error(f)
                # abandon, stale (the holder put a stale value back), or a
                # kind this version does not know: look again.
                return _AGAIN
            if ev.reread:
                return _AGAIN
            left = self.deadline - time.monotonic()
            if left <= 0:
                return _AGAIN
            f.wake.wait(min(left, P.MAX_SLEEP))

    def value(self, v):
        if self.own:
            self.own = False
            self.c._release(self.f, b"", P.LINGER_MS)
        return v

    def end(self):
        if self.w is not None:
            self.c._sub.unwatch(self.w)
            self.w = None
        if self.own or self.maybe_locked:
            self.own = self.maybe_locked = False
            self.c._release(self.f, P.abandon_event(self.f.token))
