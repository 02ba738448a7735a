"""The synchronous client: threads, redis-py's sync Redis client.

A thin driver of core.py, which holds the flight state machine: the first
caller of a flight runs it on its own thread (on a new thread if it gave a
timeout, so that it can leave), performing each operation the core yields
(scripts, PUBLISH, the shared subscriber, waits on the flight's signal, the
user's fetch with a renewal thread beside it).
"""

import threading

from . import core
from . import protocol as P
from .base import ClientBase, LeaseBase
from .core import check_redis  # noqa: F401 - its old home
from .errors import Closed, LeaseLost
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


class Lease(LeaseBase):
    """The right to compute one value: the lock key holding our token."""

    def held(self):
        """Whether the lock still holds our token (a lost lease is reported to waiters)."""
        return self._c._drive(self._renewal(0))

    def extend(self, ttl):
        """Makes the lock live at least ttl seconds from now; never shortens it."""
        ms = P.duration_ms(ttl, "lease extension", allow_zero=False)
        if not self._c._drive(self._renewal(ms)):
            raise LeaseLost("memolock: lease lost")


class _Flight(core.Flight):
    def __init__(self, *args):
        super().__init__(*args)
        self.done = threading.Event()
        self.wake = threading.Event()  # the watch's signal; also set by finish and leave


class Client(ClientBase):
    """Computes values of one tag once across processes. Thread-safe.

    redis_client: a redis.Redis with decode_responses=False.
    lock_ttl: seconds a lock lives unrenewed (how long waiters wait for a
    holder that died). hash_ids: send sha256(id) hex instead of the id.
    on_wait(id, holder_token): called when a flight starts waiting.
    neg_ttl: seconds Redis remembers that fetch raised NotFound (0, the
    default: not at all, and the next get() calls fetch again).
    """

    def __init__(self, redis_client, tag, lock_ttl=P.DEFAULT_LOCK_TTL, hash_ids=False, on_wait=None, neg_ttl=0):
        super().__init__(redis_client, "redis.Redis", tag, lock_ttl, hash_ids, on_wait, neg_ttl)
        self._sub = Subscriber(redis_client)
        self._closing = threading.Event()
        self._closed_done = threading.Event()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    @property
    def _active(self):
        """Flights running (for tests)."""
        return self._core.active

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
            raise core.InvalidArgument("fetch must be callable")
        return self._get(id, fetch, None, timeout)

    def get_external(self, id, start, timeout=None):
        """get() for values another program produces: the lock winner
        subscribes (and waits until that is live, so that a producer that
        finishes or fails at once is heard), calls start(lease), then waits
        like everybody else for the value to be SET and PUBLISHed on the
        value channel."""
        if not callable(start):
            raise core.InvalidArgument("start must be callable")
        return self._get(id, None, start, timeout)

    def close(self):
        """Releases the locks held (with abandon events), wakes every waiter
        with Closed, waits for running fetches, stops the listener thread."""
        first, flights = self._core.close()
        if not first:
            if not _in_callback():
                self._closed_done.wait()
            return
        self._closing.set()
        for f in flights:
            self._finish(f, None, Closed("memolock: client closed"))
        if _in_callback():
            threading.Thread(target=self._shutdown, daemon=True).start()
            return
        self._shutdown()

    # --- flights ---------------------------------------------------------

    def _get(self, id, fetch, start, timeout):
        f, leader = self._core.join(id, fetch, start, timeout, _Flight)
        if leader:
            if timeout is None:
                self._resolve(f)
            else:
                threading.Thread(target=self._resolve, args=(f,), name="memolock-flight", daemon=True).start()
        if not f.done.wait(timeout):
            self._leave(f)
            raise core.timeout_error(timeout)
        if f.err is not None:
            raise f.err
        return f.val

    def _resolve(self, f):
        try:
            try:
                val, err = self._drive(self._core.pursue(f), f.wake), None
            except BaseException as e:  # noqa: BLE001 - handed to callers
                val, err = None, e
            self._finish(f, val, err)
            self._drive(self._core.end(f), f.wake)
        finally:
            self._core.flight_done()

    def _drive(self, gen, signal=None):
        """Runs one of the core's generators to its end, performing each
        operation it yields; signal is what Sleep waits on and Watch sets."""
        send, throw = None, None
        while True:
            try:
                op = gen.send(send) if throw is None else gen.throw(throw)
            except StopIteration as stop:
                return stop.value
            send, throw = None, None
            try:
                send = self._ops[type(op)](op, signal)
            except BaseException as e:  # noqa: BLE001 - the core decides
                throw = e

    # --- the operations ----------------------------------------------------

    def _script(self, op, _signal):
        return self._scripts[op.name](keys=op.keys, args=op.args)

    def _publish(self, op, _signal):
        return self._rdb.publish(op.channel, op.payload)

    def _watch(self, op, signal):
        return self._sub.watch(signal, *op.channels)

    def _unwatch(self, op, _signal):
        self._sub.unwatch(op.watch)

    def _take(self, op, _signal):
        return self._sub.take(op.watch)

    def _mark(self, op, _signal):
        self._sub.mark(op.watch)

    def _sleep(self, op, signal):
        return signal.wait(op.seconds)

    def _notify(self, op, _signal):
        if self._on_wait is not None:
            try:
                _call_user(self._on_wait, op.id, op.holder)
            except Exception:
                pass

    def _fetch(self, op, _signal):
        f = op.flight
        stop = threading.Event()
        dog = threading.Thread(target=self._drive, args=(self._core.renewals(f, op.first), stop),
                               name="memolock-watchdog", daemon=True)
        dog.start()
        try:
            return core.Outcome(result=_call_user(f.fetch, Lease(self, f.key, f.token)))
        except BaseException as e:  # noqa: BLE001 - the core decides
            return core.Outcome(err=e)
        finally:
            stop.set()
            dog.join()
            self._core.callback_done()

    def _start(self, op, _signal):
        f = op.flight
        try:
            _call_user(f.start, Lease(self, f.key, f.token))
        finally:
            self._core.callback_done()

    def _shutdown(self):
        c = self._core
        with c.mu:
            while c.callbacks:
                c.mu.wait()
            deadline = c.clock() + P.CLOSE_WAIT
            while c.active and c.clock() < deadline:
                c.mu.wait(deadline - c.clock())
        self._sub.close(max(deadline - c.clock(), 0.1))
        self._closed_done.set()
