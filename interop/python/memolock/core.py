"""The flight state machine of Client and AsyncClient, without I/O.

A flight is one process's pursuit of one value: every concurrent get() of
one id shares it. Its life is written here once, as generators that yield
the operations they need (a script, a PUBLISH, a subscription, a wait, a
call of the user's function) and are sent each one's result, or have its
exception thrown into them. The sync client performs the operations on its
threads, the asyncio client awaits them; what a lookup reply means, what to
do on each event, when to look again, what to release and publish and how
errors map are decided here, and tests/test_core.py drives it by hand.
"""

import asyncio
import random
import threading
import time

import redis

from . import protocol as P
from .errors import Abandoned, Closed, HolderFailed, InvalidArgument, NotFound, RedisError, Timeout

LOOKING, HOLDING, ABANDONED, FINISHED = "looking", "holding", "abandoned", "finished"

#: What wait() returns when the flight must look again.
AGAIN = object()
#: Bound on the random extra delay of a waiter's timer (PROTOCOL.md: min(pttl/10, 1 s)).
MAX_JITTER_MS = 1000
MAX_WAIT_MS = 100 * 365 * 24 * 3600 * 1000  # a century


# --- the operations a driver performs ---------------------------------------

class Script:
    """Run the named script (protocol.SCRIPTS); the result is its raw reply.
    bounded: a release, which the asyncio driver bounds in time."""

    __slots__ = ("name", "keys", "args", "bounded")

    def __init__(self, name, keys, args, bounded=False):
        self.name, self.keys, self.args, self.bounded = name, keys, args, bounded

    def __repr__(self):
        return f"Script({self.name}, {self.args!r})"


class Publish:
    """PUBLISH payload on channel."""

    __slots__ = ("channel", "payload")

    def __init__(self, channel, payload):
        self.channel, self.payload = channel, payload


class Watch:
    """Subscribe the channels for this flight (subscriber.watch with the
    flight's wake-up signal); the result is the watch."""

    __slots__ = ("channels",)

    def __init__(self, *channels):
        self.channels = channels


class Unwatch:
    __slots__ = ("watch",)

    def __init__(self, watch):
        self.watch = watch


class Take:
    """What the watch collected (subscriber.take): a subscriber.Events."""

    __slots__ = ("watch",)

    def __init__(self, watch):
        self.watch = watch


class Mark:
    """A marker round trip for the watch (subscriber.mark): once its reply
    is back, a Take shows reread, and everything published before it was
    sent has been read from the connection."""

    __slots__ = ("watch",)

    def __init__(self, watch):
        self.watch = watch


class Sleep:
    """Wait up to seconds, or until the signal the driver was given (the
    flight's wake-up) is set; the result is whether it was set."""

    __slots__ = ("seconds",)

    def __init__(self, seconds):
        self.seconds = seconds


class OnWait:
    """Call the client's on_wait(id, holder) if it has one; errors ignored."""

    __slots__ = ("id", "holder")

    def __init__(self, id, holder):
        self.id, self.holder = id, holder


class Fetch:
    """Run the flight's fetch(lease) while renewing the lock (renewals(),
    first after `first` seconds); the result is an Outcome. The driver ends
    the callback that begin_hold counted."""

    __slots__ = ("flight", "first")

    def __init__(self, flight, first):
        self.flight, self.first = flight, first


class Start:
    """Run the flight's start(lease) (external mode); its exception is
    thrown in. The driver ends the callback that begin_hold counted."""

    __slots__ = ("flight",)

    def __init__(self, flight):
        self.flight = flight


class Outcome:
    """What fetch did: returned result, or raised err (any BaseException)."""

    __slots__ = ("result", "err")

    def __init__(self, result=None, err=None):
        self.result, self.err = result, err


# --- the state ---------------------------------------------------------------

class WaitState:
    """What a flight knows of the lock it waits on."""

    __slots__ = ("watch", "holder", "deadline", "own", "maybe_locked", "live", "pending", "late")

    def __init__(self):
        self.watch = None
        self.holder = None  # the token of the last busy reply
        self.deadline = 0.0
        self.own = False  # the flight holds the lock while it waits (external mode, a takeover's check)
        self.maybe_locked = False  # a lookup failed after the script may have run
        self.live = False  # the subscription was live at the last take
        # Messages taken before the external start function ran, for the
        # wait after it (live_before_start).
        self.pending = []
        # External mode: a fail or notfound event under the flight's own
        # token that it received and has not acted on, ("fail", text) or
        # ("notfound", b""): its earlier producer's, late (note_late). It
        # is acted on before start is called again, and on a lookup that
        # finds the lock still ours (act_on_late, [E1a]).
        self.late = None


class Flight:
    """One flight's state; drivers subclass it to add their signals: `done`
    (callers wait on it) and `wake` (the watch's signal)."""

    def __init__(self, id, key, fetch, start):
        self.id, self.key = id, key
        self.token = P.new_token()
        self.fetch, self.start = fetch, start
        self.val = None
        self.err = None
        self.refs = 1
        self.state = LOOKING
        self.stopped = False  # every caller left, or close
        self.wait = WaitState()
        # The holder whose lock the flight took over after waiting on it:
        # its waiters hear of a failure or "not found" too (Core.relay).
        self.took_over_from = None


def check_redis(redis_client, kind):
    if redis_client is None:
        raise InvalidArgument("redis client is None")
    pool = getattr(redis_client, "connection_pool", None)
    if pool is None or not hasattr(redis_client, "register_script"):
        raise InvalidArgument(f"expected a {kind} client, got {type(redis_client).__name__}")
    if pool.connection_kwargs.get("decode_responses"):
        raise InvalidArgument("the redis client decodes responses; memolock needs raw bytes (decode_responses=False)")


def check_timeout(timeout):
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout < 0):
        raise InvalidArgument(f"timeout {timeout!r} must be a non-negative number of seconds")


def timeout_error(timeout):
    return Timeout(f"memolock: gave up waiting for the value after {timeout}s")


def not_found_error(f):
    return NotFound(f"memolock: not found: id {P.quote(f.id)}")


def own_verdict(messages, token):
    """The first fail or notfound event under token among messages:
    ("fail", text), ("notfound", b"") or None."""
    return takeover_verdict(messages, None, token)


def takeover_verdict(messages, notif, holder):
    """What arrived for a flight that took the lock over from holder, in
    order: the first value on notif ("value", payload), fail event of holder
    ("fail", text) or notfound event of holder ("notfound", b""); None when
    nothing says that the holder finished (abandon, stale, unknown kinds,
    other tokens, nothing): a genuine takeover. A notif of None looks at
    events alone."""
    for ch, payload in messages:
        if notif is not None and ch == notif:
            return "value", payload
        kind, token, text = P.parse_event(payload)
        if token != holder:
            continue
        if kind == P.EVENT_FAIL:
            return "fail", text
        if kind == P.EVENT_NOTFOUND:
            return "notfound", b""
    return None


class Core:
    """One client's flights and the rules they follow.

    The registry (flights by key, callers, states, the counts close() waits
    for) is guarded by `mu`, a Condition that the sync driver also waits
    on; the asyncio driver, on one thread, takes it uncontended."""

    def __init__(self, tag, lock_ttl, hash_ids, neg_ttl, clock=time.monotonic, rand=random.random):
        self.keys = P.KeyScheme(tag)
        self.lock_ttl_ms = P.duration_ms(lock_ttl, "lock_ttl", allow_zero=False)
        self.lock_ttl = self.lock_ttl_ms / 1000
        self.neg_ttl_ms = P.optional_ms(neg_ttl, "neg_ttl")
        self.hash_ids = bool(hash_ids)
        self.clock = clock
        self.rand = rand  # [0, 1): the waiters' timer jitter
        self.mu = threading.Condition()
        self.flights = {}
        self.closed = False
        self.active = 0  # flights running
        self.callbacks = 0  # fetch/start functions running

    # --- the registry --------------------------------------------------

    def join(self, id, fetch, start, timeout, make):
        """The flight for id, made with make(id, key, fetch, start) if there
        is none; returns (flight, whether this caller must run it)."""
        idb = P.to_bytes(id, "id")
        check_timeout(timeout)
        key = P.hash_id(idb) if self.hash_ids else idb
        with self.mu:
            if self.closed:
                raise Closed("memolock: client closed")
            f = self.flights.get(key)
            if f is not None:
                f.refs += 1
                return f, False
            f = make(idb, key, fetch, start)
            self.flights[key] = f
            self.active += 1
            return f, True

    def leave(self, f):
        """A caller left; returns True if it was the last and the flight,
        still looking, must stop (the driver wakes it)."""
        with self.mu:
            f.refs -= 1
            if f.refs == 0 and f.state == LOOKING:
                f.state = ABANDONED
                self._forget(f)
                f.stopped = True
                return True
            return False

    def finish(self, f, val, err):
        """Records the flight's result; False if it already had one."""
        with self.mu:
            if f.state == FINISHED:
                return False
            f.val, f.err = val, err
            f.state = FINISHED
            self._forget(f)
            return True

    def close(self):
        """Marks the client closed; returns (whether this call did, the flights then running)."""
        with self.mu:
            first = not self.closed
            self.closed = True
            flights = list(self.flights.values())
        for f in flights:
            f.stopped = True
        return first, flights

    def flight_done(self):
        with self.mu:
            self.active -= 1
            self.mu.notify_all()

    def callback_done(self):
        with self.mu:
            self.callbacks -= 1
            self.mu.notify_all()

    def _begin_hold(self, f):
        """Moves f to holding before a user function runs under its lock."""
        with self.mu:
            if self.closed or f.state not in (LOOKING, HOLDING):
                return False
            f.state = HOLDING
            self.callbacks += 1
            return True

    def _retire(self, f):
        with self.mu:
            if f.refs > 0:
                return False
            f.state = ABANDONED
            self._forget(f)
            return True

    def _forget(self, f):
        if self.flights.get(f.key) is f:
            del self.flights[f.key]

    def ended(self):
        if self.closed:
            return Closed("memolock: client closed")
        return Abandoned("memolock: flight abandoned")

    # --- a flight --------------------------------------------------------

    def pursue(self, f):
        """The flight until it has a value (returned) or an error (raised);
        end() runs after it."""
        w = f.wait
        while True:
            if f.stopped:
                raise self.ended()
            r = yield from self.acquire(f)
            if r.kind == P.HIT:
                return (yield from self.got_value(f, r.value))
            if r.kind == P.NOT_FOUND:
                if w.own:
                    # External mode: our lock goes first, with no linger
                    # ([L4]): nothing of ours was stored to keep it for.
                    w.own = False
                    yield from self.release(f, P.abandon_event(f.token))
                raise not_found_error(f)
            if r.kind == P.LOCKED and f.start is not None and w.own and r.pttl >= 0:
                # External mode: our own lock, taken earlier; the work goes on
                # elsewhere. A word of our producer kept meanwhile (one read
                # brought it after a message that sent us here) ends the
                # flight now, not after the lock expired ([E1a]).
                yield from self.act_on_late(f)
                r = P.Reply(P.BUSY, pttl=r.pttl, holder=f.token)
            elif r.kind == P.LOCKED:
                won = self.clock()  # about when Redis took the lock
                # Found already ours (a retried acquire whose first reply
                # was lost): the lock has what the reply says left.
                held_ms = r.pttl if r.pttl >= 0 else self.lock_ttl_ms
                pttl = r.pttl
                retake = w.holder == f.token and f.start is not None
                if w.holder is not None and w.live and (w.holder != f.token or retake):
                    # We waited on another holder with a live subscription:
                    # it may have released in this instant (PROTOCOL.md, takeover
                    # rule). Or, external mode, we took our own expired lock
                    # again: our earlier producer's value or failure may be on
                    # its way ([X4]; a value there decides before a word
                    # already kept, [E1a]).
                    compute, got = yield from self.takeover(f, r.pttl)
                    if not compute:
                        return got
                    pttl = got
                if w.holder is not None and w.holder != f.token:
                    f.took_over_from = w.holder
                if f.start is None:
                    yield from self.end(f)
                    return (yield from self.hold(f, pttl))
                w.own = True  # until start: an early exit hands it over in end()
                # Our lock taken again after it expired: our earlier
                # producer's failure, heard meanwhile, ends the flight, also
                # when every caller has left: the word comes before [E4]'s
                # abandon ([E1a]).
                yield from self.act_on_late(f)
                if self._retire(f):
                    raise Abandoned("memolock: flight abandoned")
                answered, got = yield from self.live_before_start(f)
                if answered:
                    return got
                if self._retire(f):  # every caller left while it subscribed ([E4])
                    raise Abandoned("memolock: flight abandoned")
                w.own = False  # start_external releases it if start fails; busy() takes it back after
                yield from self.start_external(f)
                # Our timer runs from what is left of the lock: the takeover
                # check, going live and start took some of it ([E1]).
                left = held_ms - int((self.clock() - won) * 1000)
                r = P.Reply(P.BUSY, pttl=max(left, 0), holder=f.token)
            n = yield from self.wait_for(f, r)
            if n is not AGAIN:
                return n

    def acquire(self, f):
        keys = self.keys.id_keys(f.key)
        try:
            res = yield Script("acquire", keys, [f.token, self.lock_ttl_ms])
        except redis.exceptions.ResponseError as e:
            raise RedisError(f"memolock: redis: reading {P.quote(keys[0])}: {e}") from e
        except Exception as e:
            f.wait.maybe_locked = True  # the script may have run
            raise RedisError(f"memolock: redis: reading {P.quote(keys[0])}: {e}") from e
        try:
            return P.decode_acquire(res, f.token)
        except ValueError as e:
            raise RedisError(f"memolock: redis: reading {P.quote(keys[0])}: {e}") from e

    def timer(self, pttl):
        """Seconds a waiter waits before looking again, for a busy reply's
        pttl: the lock's expiry + 1 ms, plus a random extra delay of up to
        min(pttl/10, 1 s), so that waiters do not all look again at the
        holder's renewal moments, when a failing fetch may release the lock
        (PROTOCOL.md). pttl -1 (no TTL): our own lock TTL."""
        if pttl < 0:
            return self.lock_ttl
        # The original Go peer renews with nanoseconds as seconds: a PTTL
        # of centuries counts as a century (PROTOCOL.md, [W9]).
        pttl = min(pttl, MAX_WAIT_MS)
        return (pttl + 1 + self.rand() * min(pttl / 10, MAX_JITTER_MS)) / 1000

    def busy(self, f, r):
        """Takes in a busy reply: the holder, the timer, the subscription."""
        w = f.wait
        w.own = r.holder == f.token
        if r.holder != w.holder:
            w.holder = r.holder
            if not w.own:
                yield OnWait(f.id, r.holder.decode("utf-8", "replace"))
        if w.watch is None:
            w.watch = yield Watch(self.keys.notif(f.key), self.keys.events(f.key))
        w.deadline = self.clock() + self.timer(r.pttl)

    def _taken(self, f, ev):
        """Raises if the flight or the subscription ended; notes liveness."""
        if f.state == FINISHED:  # only close() finishes a flight that still runs: f.err is Closed
            raise f.err
        if f.stopped:
            raise self.ended()
        if ev.closed:
            raise Closed("memolock: client closed")
        if ev.err is not None:
            raise RedisError(f"memolock: redis: subscribing to {P.quote(self.keys.notif(f.key))}: {ev.err}")
        f.wait.live = ev.live

    def wait_for(self, f, r):
        """Waits on the holder of busy reply r: returns the value, raises, or
        returns AGAIN to look again."""
        yield from self.busy(f, r)
        w = f.wait
        notif = self.keys.notif(f.key)
        while True:
            # Take first: it clears the wake-up signal, so that a close or a
            # last caller's leaving just before is seen in the checks after it.
            ev = yield Take(w.watch)
            self._taken(f, ev)
            messages, w.pending = w.pending + ev.messages, []
            # An event of our earlier producer that this wait does not act
            # on (we wait on another holder, or look again first) waits for
            # the lock to be ours again.
            self.note_late(f, messages)
            for ch, payload in messages:
                if ch == notif:
                    return (yield from self.got_value(f, payload))
                kind, token, text = P.parse_event(payload)
                if token != w.holder:
                    continue
                if kind == P.EVENT_FAIL:
                    if w.own:
                        w.own = False
                        yield from self.release(f, b"")
                    raise HolderFailed(text)
                if kind == P.EVENT_NOTFOUND:
                    if w.own:
                        # Our own producer's ([E3]): no event, no linger.
                        w.own = False
                        yield from self.release(f, b"")
                    raise not_found_error(f)
                # abandon, stale (the holder put a stale value back), or a
                # kind this version does not know: look again.
                return AGAIN
            if ev.reread:
                return AGAIN
            left = w.deadline - self.clock()
            if left <= 0:
                return AGAIN
            yield Sleep(min(left, P.MAX_SLEEP))

    def takeover(self, f, pttl):
        """The flight's lookup took the lock (found with pttl ms left, -1 for
        a whole lock TTL) after it waited on holder H with a live
        subscription. H may have released it in the same instant, its event
        still on the way: a marker round trip on the subscription reads
        everything published before the lookup (PROTOCOL.md, the takeover
        rule). Returns (True, ms left on the lock) to compute, or (False,
        the value H published); raises H's failure or NotFound. A lock we do
        not compute under is released with an event that makes those who
        already wait on us end as H's waiters do.

        External mode, H our own token (we took our own expired lock again,
        [X4]): the same round trip looks for our earlier producer's late
        answer. A value, anywhere in what it read, is the answer ([E2]:
        released with the linger); else a fail or notfound, read here or
        kept before, ends the flight as [E1a] says (act_on_late); start is
        not called again. After waiting on another holder H, H's word
        decides first; a kept word is acted on in pursue if nothing did."""
        w = f.wait
        own = w.holder == f.token
        held_ms = pttl if pttl >= 0 else self.lock_ttl_ms
        started = self.clock()
        bound = min(self.lock_ttl / 3, held_ms / 2000)  # the first renewal is due then
        w.own = True  # an early exit (close, every caller gone) hands the lock over in end()
        yield Mark(w.watch)
        messages = []
        while True:
            ev = yield Take(w.watch)
            messages.extend(ev.messages)
            self._taken(f, ev)
            if ev.reread:
                # Back on the same connection: nothing before the lookup was
                # lost. On a new one, what the gap lost is unknown.
                break
            left = started + bound - self.clock()
            if left <= 0:
                break  # too slow to tell before the lock needs renewing
            yield Sleep(min(left, P.MAX_SLEEP))
        # What arrived is true even if the connection broke: only the
        # absence of an event is unknown then, and computing is the answer.
        self.note_late(f, messages)  # acted on before start ([E1a])
        notif = self.keys.notif(f.key)
        if own:
            # The lock stays ours (w.own) for got_value or act_on_late. A
            # value decides first, then the word kept ([E1a]).
            for ch, payload in messages:
                if ch == notif:
                    return False, (yield from self.got_value(f, payload))
            yield from self.act_on_late(f)  # raises if a word is kept
            w.own = False
            return True, max(round(held_ms - (self.clock() - started) * 1000), 0)
        verdict = takeover_verdict(messages, notif, w.holder)
        if verdict is None:
            w.own = False
            return True, max(round(held_ms - (self.clock() - started) * 1000), 0)
        kind, payload = verdict
        w.own = False
        if kind == "value":
            yield from self.release(f, P.abandon_event(f.token))
            return False, payload
        if kind == "fail":
            yield from self.release(f, P.fail_event(f.token, payload))
            raise HolderFailed(payload)
        yield from self.release(f, P.event(P.EVENT_NOTFOUND, f.token))
        raise not_found_error(f)

    def got_value(self, f, v):
        """The wait is over with v; a lock the flight held while it waited
        (external mode) lingers as done."""
        w = f.wait
        if w.own:
            w.own = False
            yield from self.release(f, b"", P.LINGER_MS)
        return v

    def end(self, f):
        """Ends the wait: unsubscribes, and hands over a lock the flight
        holds (or may hold) with an abandon event."""
        w = f.wait
        if w.watch is not None:
            watch, w.watch = w.watch, None
            yield Unwatch(watch)
        if w.own or w.maybe_locked:
            w.own = w.maybe_locked = False
            yield from self.release(f, P.abandon_event(f.token))

    # --- holding the lock ------------------------------------------------

    def hold(self, f, pttl):
        """Runs fetch under the lock (found with pttl ms left, -1 for a full
        lock TTL) and stores, records "not found" or releases."""
        if not self._begin_hold(f):
            yield from self.release(f, P.abandon_event(f.token))
            raise self.ended()
        first = self.lock_ttl / 3
        if pttl >= 0:
            first = min(first, pttl / 2000)
        out = yield Fetch(f, first)
        err = out.err
        if err is None:
            try:
                val, ttl = out.result
                val, ttl_ms = P.check_value(val, ttl)
            except Exception as e:  # noqa: BLE001 - a bad return is fetch's failure
                err = e
        if err is not None and (self.closed or not isinstance(err, Exception)):
            # Most likely cancelled by close (or interrupted): hand over.
            yield from self.release(f, P.abandon_event(f.token))
            if self.closed and isinstance(err, (Exception, asyncio.CancelledError)):
                raise Closed("memolock: client closed") from err
            raise err
        if isinstance(err, NotFound):
            # Not a failure: no fail event; the callers get fetch's NotFound.
            yield from self.not_found(f)
            yield from self.relay(f, lambda token: P.event(P.EVENT_NOTFOUND, token))
            raise err
        if err is not None:
            yield from self.release(f, P.fail_event(f.token, err))
            yield from self.relay(f, lambda token: P.fail_event(token, err))
            raise err
        keys = self.keys.id_keys(f.key)
        try:
            # No ARGV[7] (Go's StaleTTL): the script drops any stale copy.
            yield Script("store", keys, [f.token, val, ttl_ms, self.keys.notif(f.key), self.keys.events(f.key),
                                         P.LINGER_MS])
        except Exception as e:
            # Tell waiters now: fail if the lock is still ours, else abandon
            # (the script may have stored and been refused its PUBLISH).
            failed = RedisError(f"memolock: redis: storing {P.quote(keys[0])}: {e}")
            if not (yield from self.release(f, P.fail_event(f.token, failed))):
                yield from self.publish_abandon(f)
        return val

    def renewals(self, f, first):
        """The holder's lock renewal, every lock TTL/3 (first after `first`
        s) until the driver's signal is set or renew answers 0 (the lock is
        lost; the store script will refuse)."""
        d = first
        while True:
            if (yield Sleep(d)):
                return
            try:
                if not (yield from self.renew(f.key, f.token, self.lock_ttl_ms)):
                    return
            except RedisError:
                pass
            d = self.lock_ttl / 3

    def renew(self, key, token, ms):
        """Whether the lock still holds token, extending it to ms if shorter."""
        lock = self.keys.lock(key)
        try:
            return (yield Script("renew", [lock], [token, ms, self.keys.events(key)])) == 1
        except Exception as e:
            raise RedisError(f"memolock: redis: renewing lock {P.quote(lock)}: {e}") from e

    def live_before_start(self, f):
        """External mode, the lock just taken ([E1]): subscribes and waits
        until the subscription is live before the start function runs, so
        that a producer that finishes or fails at once is heard (what is
        published before a subscription takes effect is lost). A flight
        that took the lock over is live already. Returns (True, value) if a
        value came meanwhile (the lock released with the linger, [E2]), else
        (False, None): call start. A flight live already reads once what
        its subscription delivered. A refused subscription, close or every
        caller leaving raise (end() releases the lock with abandon). Past a
        third of the lock TTL it gives up waiting: the wait after start
        looks again once live ([W11]). A fail or notfound event under the
        flight's own token (its earlier producer's, when it took its own
        expired lock again) ends the flight here, start not called
        (act_on_late, [E1a]). Other events taken here are kept for the wait
        after start, which acts on them as on anything else."""
        w = f.wait
        # Live already (it took the lock over after a wait): one read of
        # what the subscription delivered, then start ([E1a]: a late word
        # delivered since the check is acted on before start again).
        live = w.watch is not None and w.live
        notif = self.keys.notif(f.key)
        if w.watch is None:
            w.watch = yield Watch(notif, self.keys.events(f.key))
        bound = self.clock() + self.lock_ttl / 3
        while True:
            ev = yield Take(w.watch)
            self._taken(f, ev)
            for ch, payload in ev.messages:
                if ch == notif:
                    w.pending = []
                    return True, (yield from self.got_value(f, payload))
                w.pending.append((ch, payload))
                self.note_late(f, [(ch, payload)])
                yield from self.act_on_late(f)
            if live or ev.live:
                # Its marker is back (the reread, taken here, needs no
                # lookup: the lock is ours and nobody else publishes yet).
                return False, None
            left = bound - self.clock()
            if left <= 0:
                return False, None
            yield Sleep(min(left, P.MAX_SLEEP))

    def note_late(self, f, messages):
        """External mode: keeps the first fail or notfound event under the
        flight's own token among messages, unless one is kept already. Only
        its own producer publishes under its token while it runs: an event
        that the flight does not act on where it reads it (it waits on
        another holder, or an earlier message of the same read sent it to
        look again) is kept for act_on_late ([E1a])."""
        w = f.wait
        if f.start is not None and w.late is None:
            w.late = own_verdict(messages, f.token)

    def act_on_late(self, f):
        """External mode, the lock ours (w.own), before start is called
        again or on a lookup that finds the lock still ours: a kept word of
        the flight's earlier producer (note_late) ends the flight, and start
        is not called again ([E1a]). The lock goes with no linger, the word
        published again under the flight's own token (waiters that found the
        lock under it since the producer spoke wait on it), and under the
        holder it took the lock over from, if any ([X5]'s relay). A fail
        raises HolderFailed with its message, a notfound NotFound ([E3]).
        This comes before [E4]'s abandon. Nothing kept: returns."""
        w = f.wait
        if w.late is None:
            return
        kind, text = w.late
        w.pending = []
        w.own = False
        if kind == "fail":
            def word(token):
                return P.fail_event(token, text)
        else:
            def word(token):
                return P.event(P.EVENT_NOTFOUND, token)
        yield from self.release(f, word(f.token))
        yield from self.relay(f, word)
        if kind == "fail":
            raise HolderFailed(text)
        raise not_found_error(f)

    def start_external(self, f):
        if not self._begin_hold(f):
            yield from self.release(f, P.abandon_event(f.token))
            raise self.ended()
        try:
            yield Start(f)
        except GeneratorExit:
            raise
        except BaseException as e:
            if self.closed or not isinstance(e, Exception):
                # Most likely cancelled by close (or interrupted): a shutdown,
                # not a failure of the work ([E4]). Hand over, as hold does.
                yield from self.release(f, P.abandon_event(f.token))
                if self.closed and isinstance(e, (Exception, asyncio.CancelledError)):
                    raise Closed("memolock: client closed") from e
                raise
            yield from self.release(f, P.fail_event(f.token, e))
            yield from self.relay(f, lambda token: P.fail_event(token, e))
            raise

    def not_found(self, f):
        """Runs not_found: records for neg_ttl that fetch found nothing and
        tells waiters. If it fails, releases the lock with an abandon event."""
        keys = self.keys.id_keys(f.key)
        try:
            yield Script("not_found", keys, [f.token, self.neg_ttl_ms, self.keys.events(f.key)])
        except Exception:
            if not (yield from self.release(f, P.abandon_event(f.token))):
                # The script may have run in part, or the lock expired:
                # tell waiters anyway.
                yield from self.publish_abandon(f)

    def release(self, f, event, linger_ms=0):
        """Deletes f's lock (or keeps it linger_ms as done) if still ours,
        publishing event; returns whether it did. Failures are harmless."""
        try:
            return (yield Script("release", [self.keys.lock(f.key), self.keys.value(f.key)],
                                 [f.token, self.keys.events(f.key), event, linger_ms], bounded=True)) == 1
        except Exception:
            return False

    def relay(self, f, event):
        """Publishes event(token) for the holder f took the lock over from,
        if it did: that holder died, and its other waiters would otherwise
        look again one by one as their (spread) timers fire, each take the
        lock in turn, and run the failing fetch again (PROTOCOL.md, [X5])."""
        if f.took_over_from is None:
            return
        try:
            yield Publish(self.keys.events(f.key), event(f.took_over_from))
        except Exception:
            pass

    def publish_abandon(self, f):
        try:
            yield Publish(self.keys.events(f.key), P.abandon_event(f.token))
        except Exception:
            pass
