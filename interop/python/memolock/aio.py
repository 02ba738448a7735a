"""The asyncio client (redis.asyncio), with the sync client's semantics.

One listener task per client owns the pub/sub connection (see
subscriber.py for the rules); a reader task reads it. Every flight is a
task, so that callers can leave (timeout, cancellation) without stopping it.
fetch may be a coroutine function, or a plain function, which then runs in
a worker thread (asyncio.to_thread) so that it does not block the loop and
the lease renewal.
"""

import asyncio
import inspect
import time

import redis
import redis.asyncio  # noqa: F401

from . import protocol as P
from .client import _not_found_error, check_redis
from .errors import Abandoned, Closed, HolderFailed, InvalidArgument, LeaseLost, NotFound, RedisError, Timeout
from .subscriber import DEFAULT_HEALTH, MAX_BACKOFF, SOCKET_TIMEOUT, SubState, connection_kwargs

_AGAIN = object()


class AsyncSubscriber(SubState):
    def __init__(self, redis_client, health=DEFAULT_HEALTH):
        super().__init__(redis_client, health)
        self._kick = asyncio.Event()
        self._task = None

    def _start(self):
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())

    def _poke(self, watches):
        for w in watches:
            w.signal.set()

    def _wake(self):
        self._kick.set()

    async def close(self, timeout=1.0):
        with self._mu:
            if self._closed:
                return
            self._closed = True
            for w in self._all:
                w.closed = True
                w.signal.set()
            t = self._task
        self._kick.set()
        if t is not None:
            try:
                await asyncio.wait_for(asyncio.shield(t), timeout)
            except (asyncio.TimeoutError, Exception):
                t.cancel()
                try:
                    await t
                except BaseException:
                    pass

    def _make_conn(self):
        pool = self._rdb.connection_pool
        # socket_timeout None: the reader blocks; health probes catch dead connections.
        return pool.connection_class(**connection_kwargs(pool, None))

    async def _read(self, conn, gen):
        """Reads conn until it fails; marks it broken then."""
        try:
            while True:
                try:
                    msg = await conn.read_response()
                except redis.exceptions.ResponseError as e:
                    if not self._refused(e):
                        raise
                    self._heard_at = time.monotonic()
                    continue
                self._poke(self._handle(msg))
                self._heard_at = time.monotonic()
        except asyncio.CancelledError:
            raise
        except Exception:
            with self._mu:
                if gen == self._gen:
                    self._broken = True
            self._kick.set()

    async def _run(self):
        conn, reader = None, None
        backoff = 0.0
        self._heard_at = time.monotonic()
        probe_at = None
        connected_at = 0.0
        try:
            while True:
                with self._mu:
                    if self._closed:
                        return
                    replace = self._broken
                    if replace:
                        self._reset()
                    gen = self._gen
                if replace:
                    if reader is not None:
                        reader.cancel()
                        try:
                            await reader
                        except BaseException:
                            pass
                        reader = None
                    if conn is not None:
                        await conn.disconnect()
                        conn = None
                    if backoff:
                        try:
                            await asyncio.wait_for(self._closed_wait(), backoff)
                            return
                        except asyncio.TimeoutError:
                            pass
                    backoff = min(max(2 * backoff, 0.005), MAX_BACKOFF)
                    conn = self._make_conn()
                    try:
                        await asyncio.wait_for(conn.connect(), SOCKET_TIMEOUT)
                    except Exception:
                        self._fail()
                        continue
                    self.reconnects += 1
                    self._heard_at, probe_at = time.monotonic(), None
                    connected_at = self._heard_at
                    reader = asyncio.get_running_loop().create_task(self._read(conn, gen))
                self._kick.clear()
                with self._mu:
                    cmds = self._plan()
                    now = time.monotonic()
                    if probe_at is not None and self._heard_at > probe_at:
                        probe_at = None
                    if probe_at is None and now - self._heard_at >= self.health:
                        probe_at = now
                        probe = ("ping", [P.MARKER_PREFIX + b"probe"])
                        self._acks.append([probe[0], probe[1], 0])
                        cmds.append(probe)
                try:
                    for kind, args in cmds:
                        if kind == "subscribe":
                            self.subscribes += 1
                        await asyncio.wait_for(conn.send_command(kind.upper(), *args), SOCKET_TIMEOUT)
                except Exception:
                    self._fail()
                    continue
                if self._heard_at > connected_at:
                    backoff = 0.0  # the connection works
                now = time.monotonic()
                if probe_at is not None:
                    if now - probe_at >= self.health and self._heard_at <= probe_at:
                        self._fail()
                        continue
                    timeout = probe_at + self.health - now
                else:
                    timeout = self._heard_at + self.health - now
                try:
                    await asyncio.wait_for(self._kick.wait(), max(timeout, 0.01))
                except asyncio.TimeoutError:
                    pass
        finally:
            if reader is not None:
                reader.cancel()
                try:
                    await reader
                except BaseException:
                    pass
            if conn is not None:
                try:
                    await conn.disconnect()
                except Exception:
                    pass

    async def _closed_wait(self):
        while True:
            await self._kick.wait()
            self._kick.clear()
            with self._mu:
                if self._closed:
                    return


class AsyncLease:
    """The right to compute one value (asyncio)."""

    def __init__(self, client, key, token):
        self._c, self._key, self._token = client, key, token
        #: Set when the client is closing: a long fetch should stop.
        self.cancelled = client._closing

    def id(self):
        return self._key

    def token(self):
        return self._token.decode()

    async def held(self):
        return await self._c._renew(self._key, self._token, 0)

    async def extend(self, ttl):
        ms = P.duration_ms(ttl, "lease extension", allow_zero=False)
        if not await self._c._renew(self._key, self._token, ms):
            raise LeaseLost("memolock: lease lost")


class _Flight:
    def __init__(self, id, key, fetch, start):
        self.id, self.key = id, key
        self.token = P.new_token()
        self.fetch, self.start = fetch, start
        self.done = asyncio.Event()
        self.wake = asyncio.Event()
        self.stopped = False
        self.val = None
        self.err = None
        self.refs = 1
        self.state = "looking"
        self.task = None


async def _call(c, fn, *args):
    """Calls a user function: awaited if async, else in a worker thread.

    A coroutine runs as a task of its own, which close() cancels (as Go's
    Close cancels a fetch's context) without cancelling the flight, which
    then hands the lock over. A thread cannot be cancelled: it sees
    lease.cancelled, and close() waits for it."""
    if inspect.iscoroutinefunction(fn):
        aw = fn(*args)
    else:
        aw = await asyncio.to_thread(fn, *args)
        if not inspect.isawaitable(aw):
            return aw
    t = asyncio.ensure_future(aw)
    c._user_tasks[t] = asyncio.current_task()
    if c._closing.is_set():
        t.cancel()
    try:
        return await t
    finally:
        c._user_tasks.pop(t, None)


class AsyncClient:
    """The asyncio Client: `await client.get(id, fetch)`. See Client."""

    def __init__(self, redis_client, tag, lock_ttl=P.DEFAULT_LOCK_TTL, hash_ids=False, on_wait=None, neg_ttl=0):
        check_redis(redis_client, "redis.asyncio.Redis")
        self._rdb = redis_client
        self.keys = P.KeyScheme(tag)
        self.lock_ttl_ms = P.duration_ms(lock_ttl, "lock_ttl", allow_zero=False)
        self.lock_ttl = self.lock_ttl_ms / 1000
        self.neg_ttl_ms = P.optional_ms(neg_ttl, "neg_ttl")
        self.hash_ids = bool(hash_ids)
        self._on_wait = on_wait
        self._scripts = {name: redis_client.register_script(src) for name, src in P.SCRIPTS.items()}
        self._sub = AsyncSubscriber(redis_client)
        self._flights = {}
        self._tasks = set()
        self._callbacks = set()  # flight tasks running user functions
        self._user_tasks = {}  # task running a coroutine fetch/start -> its flight task
        self._closed = False
        self._closing = asyncio.Event()
        self._closed_done = asyncio.Event()

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        await self.close()

    async def get(self, id, fetch, timeout=None):
        """See Client.get; fetch(lease) may be async or sync."""
        if not callable(fetch):
            raise InvalidArgument("fetch must be callable")
        return await self._get(id, fetch, None, timeout)

    async def get_external(self, id, start, timeout=None):
        """See Client.get_external; start(lease) may be async or sync."""
        if not callable(start):
            raise InvalidArgument("start must be callable")
        return await self._get(id, None, start, timeout)

    async def close(self):
        """Releases held locks, wakes waiters with Closed, waits for running
        fetches, stops the listener task."""
        me = asyncio.current_task()
        flight = self._user_tasks.get(me, me)  # the flight running this callback, if any
        if self._closed:
            if flight not in self._callbacks:
                await self._closed_done.wait()
            return
        self._closed = True
        self._closing.set()
        for f in list(self._flights.values()):
            f.stopped = True
            self._finish(f, None, Closed("memolock: client closed"))
        for t in list(self._user_tasks):
            if t is not me:
                t.cancel()
        if flight in self._callbacks:
            t = asyncio.get_running_loop().create_task(self._shutdown(flight))
            self._tasks.add(t)
            return
        await self._shutdown(None)

    async def _shutdown(self, skip):
        cbs = [t for t in self._callbacks if t is not skip]
        if cbs:
            await asyncio.wait(cbs)
        if skip is not None:
            await asyncio.wait([skip])
        pending = [t for t in self._tasks if t is not asyncio.current_task() and not t.done()]
        if pending:
            await asyncio.wait(pending, timeout=P.CLOSE_WAIT)
        await self._sub.close()
        self._closed_done.set()

    async def _get(self, id, fetch, start, timeout):
        idb = P.to_bytes(id, "id")
        if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout < 0):
            raise InvalidArgument(f"timeout {timeout!r} must be a non-negative number of seconds")
        key = P.hash_id(idb) if self.hash_ids else idb
        if self._closed:
            raise Closed("memolock: client closed")
        f = self._flights.get(key)
        if f is None:
            f = _Flight(idb, key, fetch, start)
            self._flights[key] = f
            f.task = asyncio.get_running_loop().create_task(self._resolve(f))
            self._tasks.add(f.task)
            f.task.add_done_callback(self._tasks.discard)
        else:
            f.refs += 1
        try:
            await asyncio.wait_for(f.done.wait(), timeout)
        except asyncio.TimeoutError:
            self._leave(f)
            raise Timeout(f"memolock: gave up waiting for the value after {timeout}s") from None
        except asyncio.CancelledError:
            self._leave(f)
            raise
        if f.err is not None:
            raise f.err
        return f.val

    def _leave(self, f):
        f.refs -= 1
        if f.refs == 0 and f.state == "looking":
            f.state = "abandoned"
            if self._flights.get(f.key) is f:
                del self._flights[f.key]
            f.stopped = True
            f.wake.set()

    def _finish(self, f, val, err):
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
        if self._closed or f.state not in ("looking", "holding"):
            return False
        f.state = "holding"
        return True

    def _retire(self, f):
        if f.refs > 0:
            return False
        f.state = "abandoned"
        if self._flights.get(f.key) is f:
            del self._flights[f.key]
        return True

    def _ended(self):
        if self._closing.is_set():
            return Closed("memolock: client closed")
        return Abandoned("memolock: flight abandoned")

    async def _resolve(self, f):
        w = _AsyncWait(self, f)
        try:
            val, err = await self._pursue(f, w), None
        except asyncio.CancelledError:
            val, err = None, Closed("memolock: client closed")
        except Exception as e:  # noqa: BLE001 - handed to callers
            val, err = None, e
        self._finish(f, val, err)
        await w.end()

    async def _pursue(self, f, w):
        while True:
            if f.stopped:
                raise self._ended()
            r = await self._acquire(f, w)
            if r.kind == P.HIT:
                return await w.value(r.value)
            if r.kind == P.NOT_FOUND:
                await w.value(None)  # ends the wait as a value would (external mode: our lock goes)
                raise _not_found_error(f)
            if r.kind == P.LOCKED and f.start is None:
                await w.end()
                return await self._hold(f, r.pttl)
            if r.kind == P.LOCKED and w.own and r.pttl >= 0:
                r = P.Reply(P.BUSY, pttl=r.pttl, holder=f.token)
            elif r.kind == P.LOCKED:
                if self._retire(f):
                    w.own = True
                    raise Abandoned("memolock: flight abandoned")
                await self._start_external(f)
                r = P.Reply(P.BUSY, pttl=self.lock_ttl_ms, holder=f.token)
            n = await w.wait(r)
            if n is not _AGAIN:
                return n

    async def _acquire(self, f, w):
        keys = self.keys.id_keys(f.key)
        try:
            res = await self._scripts["acquire"](keys=keys, args=[f.token, self.lock_ttl_ms])
        except redis.exceptions.ResponseError as e:
            raise RedisError(f"memolock: redis: reading {P.quote(keys[0])}: {e}") from e
        except Exception as e:
            w.maybe_locked = True
            raise RedisError(f"memolock: redis: reading {P.quote(keys[0])}: {e}") from e
        try:
            return P.decode_acquire(res, f.token)
        except ValueError as e:
            raise RedisError(f"memolock: redis: reading {P.quote(keys[0])}: {e}") from e

    async def _release(self, f, event, linger_ms=0):
        try:
            return await asyncio.wait_for(self._scripts["release"](
                keys=[self.keys.lock(f.key), self.keys.value(f.key)],
                args=[f.token, self.keys.events(f.key), event, linger_ms]),
                P.CLOSE_WAIT * 5) == 1
        except Exception:
            return False

    async def _renew(self, key, token, ms):
        try:
            return await self._scripts["renew"](keys=[self.keys.lock(key)], args=[token, ms, self.keys.events(key)]) == 1
        except Exception as e:
            raise RedisError(f"memolock: redis: renewing lock {P.quote(self.keys.lock(key))}: {e}") from e

    async def _store(self, f, val, ttl_ms):
        keys = self.keys.id_keys(f.key)
        try:
            # No ARGV[7] (Go's StaleTTL): the script drops any stale copy.
            return await self._scripts["store"](keys=keys, args=[
                f.token, val, ttl_ms, self.keys.notif(f.key), self.keys.events(f.key), P.LINGER_MS]) == 1
        except Exception as e:
            raise RedisError(f"memolock: redis: storing {P.quote(keys[0])}: {e}") from e

    async def _not_found(self, f):
        """See Client._not_found."""
        keys = self.keys.id_keys(f.key)
        try:
            await self._scripts["not_found"](keys=keys, args=[f.token, self.neg_ttl_ms, self.keys.events(f.key)])
        except Exception:
            if not await self._release(f, P.abandon_event(f.token)):
                # See Client._not_found.
                try:
                    await self._rdb.publish(self.keys.events(f.key), P.abandon_event(f.token))
                except Exception:
                    pass

    async def _hold(self, f, pttl):
        if not self._hold_state(f):
            await self._release(f, P.abandon_event(f.token))
            raise self._ended()
        lease = AsyncLease(self, f.key, f.token)
        first = self.lock_ttl / 3
        if pttl >= 0:
            first = min(first, pttl / 2000)
        me = asyncio.current_task()
        self._callbacks.add(me)
        dog = asyncio.get_running_loop().create_task(self._watchdog(f, first))
        err = None
        try:
            val, ttl = await _call(self, f.fetch, lease)
            val, ttl_ms = P.check_value(val, ttl)
        except BaseException as e:  # noqa: BLE001
            err = e
        finally:
            dog.cancel()
            try:
                await dog
            except BaseException:
                pass
            self._callbacks.discard(me)
        if err is not None and (self._closing.is_set() or not isinstance(err, Exception)):
            await self._release(f, P.abandon_event(f.token))
            if isinstance(err, (Exception, asyncio.CancelledError)) and self._closing.is_set():
                raise Closed("memolock: client closed") from err
            raise err
        if isinstance(err, NotFound):
            # Not a failure: no fail event; the callers get fetch's NotFound.
            await self._not_found(f)
            raise err
        if err is not None:
            await self._release(f, P.fail_event(f.token, err))
            raise err
        try:
            await self._store(f, val, ttl_ms)
        except RedisError as e:
            if not await self._release(f, P.fail_event(f.token, e)):
                try:
                    await self._rdb.publish(self.keys.events(f.key), P.abandon_event(f.token))
                except Exception:
                    pass
        return val

    async def _watchdog(self, f, first):
        d = first
        while True:
            await asyncio.sleep(d)
            try:
                if not await self._renew(f.key, f.token, self.lock_ttl_ms):
                    return
            except RedisError:
                pass
            d = self.lock_ttl / 3

    async def _start_external(self, f):
        if not self._hold_state(f):
            await self._release(f, P.abandon_event(f.token))
            raise self._ended()
        me = asyncio.current_task()
        self._callbacks.add(me)
        try:
            await _call(self, f.start, AsyncLease(self, f.key, f.token))
        except BaseException as e:
            await self._release(f, P.fail_event(f.token, e))
            raise
        finally:
            self._callbacks.discard(me)


class _AsyncWait:
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
                    self.c._on_wait(self.f.id, r.holder.decode("utf-8", "replace"))
                except Exception:
                    pass
        if self.w is None:
            self.w = self.c._sub.watch(self.f.wake, self.c.keys.notif(self.f.key), self.c.keys.events(self.f.key))
        d = (r.pttl + 1) / 1000 if r.pttl >= 0 else self.c.lock_ttl
        self.deadline = time.monotonic() + d

    async def wait(self, r):
        self.busy(r)
        f = self.f
        notif = self.c.keys.notif(f.key)
        while True:
            if f.done.is_set():
                if f.err is not None:
                    raise f.err
                return f.val
            if f.stopped:
                raise self.c._ended()
            ev = self.c._sub.take(self.w)
            if ev.closed:
                raise Closed("memolock: client closed")
            if ev.err is not None:
                raise RedisError(f"memolock: redis: subscribing to {P.quote(notif)}: {ev.err}")
            for ch, payload in ev.messages:
                if ch == notif:
                    return await self.value(payload)
                kind, token, text = P.parse_event(payload)
                if token != self.holder:
                    continue
                if kind == P.EVENT_FAIL:
                    if self.own:
                        self.own = False
                        await self.c._release(f, b"")
                    raise HolderFailed(text)
                if kind == P.EVENT_NOTFOUND:
                    await self.value(None)
                    raise _not_found_error(f)
                # abandon, stale (the holder put a stale value back), or a
                # kind this version does not know: look again.
                return _AGAIN
            if ev.reread:
                return _AGAIN
            left = self.deadline - time.monotonic()
            if left <= 0:
                return _AGAIN
            try:
                await asyncio.wait_for(f.wake.wait(), min(left, P.MAX_SLEEP))
            except asyncio.TimeoutError:
                pass

    async def value(self, v):
        if self.own:
            self.own = False
            await self.c._release(self.f, b"", P.LINGER_MS)
        return v

    async def end(self):
        if self.w is not None:
            self.c._sub.unwatch(self.w)
            self.w = None
        if self.own or self.maybe_locked:
            self.own = self.maybe_locked = False
            await self.c._release(self.f, P.abandon_event(self.f.token))
