"""The asyncio client (redis.asyncio), with the sync client's semantics.

A thin driver of core.py, which holds the flight state machine: it awaits
each operation the core yields. One listener task per client owns the
pub/sub connection (see subscriber.py for the rules); a reader task reads
it. Every flight is a task, so that callers can leave (timeout,
cancellation) without stopping it. fetch may be a coroutine function, or a
plain function, which then runs in a worker thread (asyncio.to_thread) so
that it does not block the loop and the lease renewal.
"""

import asyncio
import inspect
import time

import redis
import redis.asyncio  # noqa: F401

from . import core
from . import protocol as P
from .base import ClientBase, LeaseBase
from .errors import Closed, InvalidArgument, LeaseLost
from .subscriber import DEFAULT_HEALTH, MAX_BACKOFF, SOCKET_TIMEOUT, SubState, connection_kwargs


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


class AsyncLease(LeaseBase):
    """The right to compute one value (asyncio)."""

    async def held(self):
        return await self._c._drive(self._renewal(0))

    async def extend(self, ttl):
        ms = P.duration_ms(ttl, "lease extension", allow_zero=False)
        if not await self._c._drive(self._renewal(ms)):
            raise LeaseLost("memolock: lease lost")


class _Flight(core.Flight):
    def __init__(self, *args):
        super().__init__(*args)
        self.done = asyncio.Event()
        self.wake = asyncio.Event()
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


class AsyncClient(ClientBase):
    """The asyncio Client: `await client.get(id, fetch)`. See Client."""

    def __init__(self, redis_client, tag, lock_ttl=P.DEFAULT_LOCK_TTL, hash_ids=False, on_wait=None, neg_ttl=0):
        super().__init__(redis_client, "redis.asyncio.Redis", tag, lock_ttl, hash_ids, on_wait, neg_ttl)
        self._sub = AsyncSubscriber(redis_client)
        self._tasks = set()
        self._callbacks = set()  # flight tasks running user functions
        self._user_tasks = {}  # task running a coroutine fetch/start -> its flight task
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
        first, flights = self._core.close()
        if not first:
            if flight not in self._callbacks:
                await self._closed_done.wait()
            return
        self._closing.set()
        for f in flights:
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
        f, leader = self._core.join(id, fetch, start, timeout, _Flight)
        if leader:
            f.task = asyncio.get_running_loop().create_task(self._resolve(f))
            self._tasks.add(f.task)
            f.task.add_done_callback(self._tasks.discard)
        try:
            await asyncio.wait_for(f.done.wait(), timeout)
        except asyncio.TimeoutError:
            self._leave(f)
            raise core.timeout_error(timeout) from None
        except asyncio.CancelledError:
            self._leave(f)
            raise
        if f.err is not None:
            raise f.err
        return f.val

    async def _resolve(self, f):
        try:
            try:
                val, err = await self._drive(self._core.pursue(f), f.wake), None
            except asyncio.CancelledError:
                val, err = None, Closed("memolock: client closed")
            except Exception as e:  # noqa: BLE001 - handed to callers
                val, err = None, e
            self._finish(f, val, err)
            await self._drive(self._core.end(f), f.wake)
        finally:
            self._core.flight_done()

    async def _drive(self, gen, signal=None):
        """Runs one of the core's generators to its end, awaiting each
        operation it yields; signal is what Sleep waits on and Watch sets
        (None: Sleep just sleeps)."""
        send, throw = None, None
        while True:
            try:
                op = gen.send(send) if throw is None else gen.throw(throw)
            except StopIteration as stop:
                return stop.value
            send, throw = None, None
            try:
                send = await self._ops[type(op)](op, signal)
            except BaseException as e:  # noqa: BLE001 - the core decides
                throw = e

    # --- the operations ----------------------------------------------------

    async def _script(self, op, _signal):
        call = self._scripts[op.name](keys=op.keys, args=op.args)
        if op.bounded:
            return await asyncio.wait_for(call, P.CLOSE_WAIT * 5)
        return await call

    async def _publish(self, op, _signal):
        return await self._rdb.publish(op.channel, op.payload)

    async def _watch(self, op, signal):
        return self._sub.watch(signal, *op.channels)

    async def _unwatch(self, op, _signal):
        self._sub.unwatch(op.watch)

    async def _take(self, op, _signal):
        return self._sub.take(op.watch)

    async def _mark(self, op, _signal):
        self._sub.mark(op.watch)

    async def _sleep(self, op, signal):
        if signal is None:
            await asyncio.sleep(op.seconds)
            return False
        try:
            await asyncio.wait_for(signal.wait(), op.seconds)
            return True
        except asyncio.TimeoutError:
            return False

    async def _notify(self, op, _signal):
        if self._on_wait is not None:
            try:
                self._on_wait(op.id, op.holder)
            except Exception:
                pass

    async def _fetch(self, op, _signal):
        f = op.flight
        me = asyncio.current_task()
        self._callbacks.add(me)
        dog = asyncio.get_running_loop().create_task(self._drive(self._core.renewals(f, op.first)))
        try:
            return core.Outcome(result=await _call(self, f.fetch, AsyncLease(self, f.key, f.token)))
        except BaseException as e:  # noqa: BLE001 - the core decides
            return core.Outcome(err=e)
        finally:
            dog.cancel()
            try:
                await dog
            except BaseException:
                pass
            self._callbacks.discard(me)
            self._core.callback_done()

    async def _start(self, op, _signal):
        f = op.flight
        me = asyncio.current_task()
        self._callbacks.add(me)
        try:
            await _call(self, f.start, AsyncLease(self, f.key, f.token))
        finally:
            self._callbacks.discard(me)
            self._core.callback_done()
