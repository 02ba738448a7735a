"""The sans-I/O core (memolock/core.py), driven by hand: no Redis, no
threads, no clock but a fake one. Each test feeds a flight the replies and
events a driver would, and checks the operations it asks for."""

import pytest
import redis

import memolock
from memolock import core
from memolock import protocol as P
from memolock.subscriber import Events

HOLDER = b"0123456789abcdef0123456789abcdef@elsewhere:1"
OTHER = b"fedcba9876543210fedcba9876543210@elsewhere:2"


class Run:
    """One of the core's generators, stepped by hand."""

    def __init__(self, gen):
        self.gen = gen
        self.done, self.value, self.error = False, None, None
        self.op = self._step(lambda: next(gen))

    def _step(self, fn):
        try:
            return fn()
        except StopIteration as stop:
            self.done, self.value = True, stop.value
        except BaseException as e:  # noqa: BLE001 - the test looks at it
            self.done, self.error = True, e
        return None

    def send(self, v=None):
        assert not self.done, "the generator has ended"
        self.op = self._step(lambda: self.gen.send(v))
        return self.op

    def throw(self, e):
        assert not self.done, "the generator has ended"
        self.op = self._step(lambda: self.gen.throw(e))
        return self.op

    def expect(self, cls, name=None):
        assert isinstance(self.op, cls), f"expected {cls.__name__}, got {self.op!r} (error {self.error!r})"
        if name is not None:
            assert self.op.name == name, self.op
        return self.op

    def result(self):
        assert self.done, f"still running: {self.op!r}"
        if self.error is not None:
            raise self.error
        return self.value


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def events(messages=(), reread=False, err=None, closed=False, live=True):
    return Events(reread, list(messages), err, closed, live)


@pytest.fixture
def clock():
    return Clock()


class Rand:
    """The timer jitter's random source: a fixed fraction of the bound."""

    def __init__(self, x=0.0):
        self.x = x

    def __call__(self):
        return self.x


@pytest.fixture
def rand():
    return Rand()


@pytest.fixture
def c(clock, rand):
    return core.Core("t", 3.0, False, 0, clock=clock, rand=rand)


def flight(c, id=b"k", fetch=None, start=None):
    f, leader = c.join(id, fetch or (lambda lease: (b"v", 0)), start, None, core.Flight)
    assert leader
    return f


def until_waiting(run, f, holder=HOLDER, pttl=2000):
    """Steps a fresh flight to its first Take on a busy reply naming holder."""
    run.expect(core.Script, "acquire")
    run.send([pttl, holder])
    if holder != f.token:
        assert run.expect(core.OnWait).holder == holder.decode()
        run.send()
    assert run.expect(core.Watch).channels == (b"t/notif:k", b"t/lock-event:k")
    run.send("watch")
    assert run.expect(core.Take).watch == "watch"


# --- lookups ---------------------------------------------------------------

def test_hit_on_first_lookup(c):
    f = flight(c)
    run = Run(c.pursue(f))
    op = run.expect(core.Script, "acquire")
    assert op.keys == [b"t:k", b"t/lock:k", b"t/lock-notfound:k", b"t/lock-stale:k"]
    assert op.args == [f.token, 3000]
    run.send(b"1")  # a bulk string "1" is a value
    assert run.result() == b"1"


def test_cached_not_found(c):
    run = Run(c.pursue(flight(c)))
    run.send([5000])
    with pytest.raises(memolock.NotFound, match='"k"'):
        run.result()


def test_lock_taken_runs_fetch_and_stores(c):
    f = flight(c)
    run = Run(c.pursue(f))
    run.send(1)
    op = run.expect(core.Fetch)
    assert op.flight is f and op.first == pytest.approx(1.0)  # lock TTL / 3
    assert f.state == core.HOLDING and c.callbacks == 1
    run.send(core.Outcome(result=(b"val", 1.9)))
    op = run.expect(core.Script, "store")
    assert op.args == [f.token, b"val", 1900, b"t/notif:k", b"t/lock-event:k", P.LINGER_MS]
    run.send(1)
    assert run.result() == b"val"


def test_own_token_in_busy_reply_is_our_lock_renewed_sooner(c):
    # A retried acquire whose first reply was lost: the lock is ours with
    # 600 ms left, so the first renewal is due within 300 ms.
    f = flight(c)
    run = Run(c.pursue(f))
    run.send([600, f.token])
    assert run.expect(core.Fetch).first == pytest.approx(0.3)


def test_lookup_error_may_have_locked_so_end_releases(c):
    f = flight(c)
    run = Run(c.pursue(f))
    run.throw(redis.exceptions.ConnectionError("reset"))
    with pytest.raises(memolock.RedisError, match='reading "t:k": reset'):
        run.result()
    end = Run(c.end(f))
    op = end.expect(core.Script, "release")
    assert op.keys == [b"t/lock:k", b"t:k"] and op.bounded
    assert op.args == [f.token, b"t/lock-event:k", P.abandon_event(f.token), 0]
    end.send(0)
    end.result()


def test_error_reply_did_not_lock(c):
    f = flight(c)
    run = Run(c.pursue(f))
    run.throw(redis.exceptions.ResponseError("NOSCRIPT"))
    with pytest.raises(memolock.RedisError):
        run.result()
    end = Run(c.end(f))
    assert end.done  # nothing to release


def test_unexpected_reply(c):
    run = Run(c.pursue(flight(c)))
    run.send(7)
    with pytest.raises(memolock.RedisError, match="unexpected acquire reply 7"):
        run.result()


# --- waiting -----------------------------------------------------------------

def test_wait_sleeps_until_the_lock_expires_then_looks_again(c, clock):
    f = flight(c)
    run = Run(c.pursue(f))
    until_waiting(run, f, pttl=2000)
    run.send(events())
    assert run.expect(core.Sleep).seconds == pytest.approx(2.001)
    clock.now += 2.001
    run.send(False)
    run.expect(core.Take)
    run.send(events())
    run.expect(core.Script, "acquire")  # the timer ran out: look again
    run.send(b"late value")
    assert run.result() == b"late value"


def test_wait_on_a_lock_without_ttl_uses_our_lock_ttl(c):
    f = flight(c)
    run = Run(c.pursue(f))
    until_waiting(run, f, pttl=-1)
    run.send(events())
    assert run.expect(core.Sleep).seconds == pytest.approx(3.0)


def test_live_subscription_looks_again(c):
    f = flight(c)
    run = Run(c.pursue(f))
    until_waiting(run, f)
    run.send(events(reread=True))
    run.expect(core.Script, "acquire")
    run.send([1500, OTHER])  # the holder changed: on_wait again, same watch
    assert run.expect(core.OnWait).holder == OTHER.decode()
    run.send()
    run.expect(core.Take)
    assert f.wait.holder == OTHER


def test_value_published(c):
    f = flight(c)
    run = Run(c.pursue(f))
    until_waiting(run, f)
    run.send(events([(b"t/lock-event:k", b"fail\n" + OTHER + b"\nnot ours"), (b"t/notif:k", b"pushed")]))
    assert run.result() == b"pushed"


def test_holder_failure(c):
    f = flight(c)
    run = Run(c.pursue(f))
    until_waiting(run, f)
    run.send(events([(b"t/lock-event:k", b"fail\n" + HOLDER + b"\nbackend down")]))
    with pytest.raises(memolock.HolderFailed) as ei:
        run.result()
    assert ei.value.message == "backend down"


def test_holder_not_found(c):
    f = flight(c)
    run = Run(c.pursue(f))
    until_waiting(run, f)
    run.send(events([(b"t/lock-event:k", b"notfound\n" + HOLDER + b"\n")]))
    with pytest.raises(memolock.NotFound):
        run.result()


@pytest.mark.parametrize("kind", [b"abandon", b"stale", b"future-kind"])
def test_other_events_of_the_holder_look_again(c, kind):
    f = flight(c)
    run = Run(c.pursue(f))
    until_waiting(run, f)
    run.send(events([(b"t/lock-event:k", kind + b"\n" + HOLDER + b"\n")]))
    run.expect(core.Script, "acquire")


def test_waiter_that_finds_the_not_found_marker_after_an_abandon_ends_not_found(c):
    # [L4], while waiting on another holder: its notfound event was lost
    # (here it went with an abandon), and the lookup finds the marker.
    f = flight(c)
    run = Run(c.pursue(f))
    until_waiting(run, f)
    run.send(events([(b"t/lock-event:k", b"abandon\n" + HOLDER + b"\n")]))
    run.expect(core.Script, "acquire")
    run.send([5000])
    with pytest.raises(memolock.NotFound, match='"k"'):
        run.result()


def test_events_of_other_tokens_are_ignored(c):
    f = flight(c)
    run = Run(c.pursue(f))
    until_waiting(run, f)
    run.send(events([(b"t/lock-event:k", b"abandon\n" + OTHER + b"\n")]))
    run.expect(core.Sleep)


def test_subscription_refused(c):
    f = flight(c)
    run = Run(c.pursue(f))
    until_waiting(run, f)
    run.send(events(err=redis.exceptions.ResponseError("NOPERM")))
    with pytest.raises(memolock.RedisError, match='subscribing to "t/notif:k": NOPERM'):
        run.result()


def test_subscriber_closed(c):
    f = flight(c)
    run = Run(c.pursue(f))
    until_waiting(run, f)
    run.send(events(closed=True))
    with pytest.raises(memolock.Closed):
        run.result()


def test_last_caller_leaving_stops_the_wait(c):
    f = flight(c)
    run = Run(c.pursue(f))
    until_waiting(run, f)
    assert c.leave(f) and f.stopped and f.state == core.ABANDONED
    assert c.flights == {}
    run.send(events())
    with pytest.raises(core.Abandoned):
        run.result()


def test_close_finishes_a_waiting_flight(c):
    f = flight(c)
    run = Run(c.pursue(f))
    until_waiting(run, f)
    first, flights = c.close()
    assert first and flights == [f] and f.stopped
    assert c.finish(f, None, memolock.Closed("memolock: client closed"))
    assert not c.finish(f, b"late", None)  # one result only
    run.send(events())
    with pytest.raises(memolock.Closed):
        run.result()
    with pytest.raises(memolock.Closed):
        c.join(b"other", None, None, None, core.Flight)


def test_end_unwatches(c):
    f = flight(c)
    run = Run(c.pursue(f))
    until_waiting(run, f)
    end = Run(c.end(f))
    assert end.expect(core.Unwatch).watch == "watch"
    end.send()
    end.result()


# --- holding -------------------------------------------------------------------

def test_fetch_failure_releases_with_its_first_line(c):
    f = flight(c)
    run = Run(c.pursue(f))
    run.send(1)
    run.send(core.Outcome(err=RuntimeError("db down\nstack...")))
    op = run.expect(core.Script, "release")
    assert op.args == [f.token, b"t/lock-event:k", b"fail\n" + f.token + b"\ndb down", 0]
    run.send(1)
    with pytest.raises(RuntimeError, match="db down"):
        run.result()


def test_fetch_returning_no_bytes_is_its_failure(c):
    run = Run(c.pursue(flight(c)))
    run.send(1)
    run.send(core.Outcome(result=("text", 0)))
    assert b"not bytes" in run.expect(core.Script, "release").args[2]
    run.send(1)
    with pytest.raises(memolock.InvalidArgument):
        run.result()


def test_fetch_not_found_runs_the_script_then_falls_back(c):
    f = flight(c)
    run = Run(c.pursue(f))
    run.send(1)
    run.send(core.Outcome(err=memolock.NotFound("no row")))
    assert run.expect(core.Script, "not_found").args == [f.token, 0, b"t/lock-event:k"]
    run.throw(redis.exceptions.ConnectionError("down"))
    assert run.expect(core.Script, "release").args[2] == P.abandon_event(f.token)
    run.send(0)  # the script may have deleted the lock before it failed
    op = run.expect(core.Publish)
    assert (op.channel, op.payload) == (b"t/lock-event:k", P.abandon_event(f.token))
    run.throw(redis.exceptions.ConnectionError("still down"))
    with pytest.raises(memolock.NotFound, match="no row"):
        run.result()


def test_store_failure_tells_waiters(c):
    f = flight(c)
    run = Run(c.pursue(f))
    run.send(1)
    run.send(core.Outcome(result=(b"v", 0)))
    run.expect(core.Script, "store")
    run.throw(redis.exceptions.TimeoutError("slow"))
    event = run.expect(core.Script, "release").args[2]
    assert event == b"fail\n" + f.token + b'\nmemolock: redis: storing "t:k": slow'
    run.send(0)  # the store may have run: abandon makes waiters look
    assert run.expect(core.Publish).payload == P.abandon_event(f.token)
    run.send(1)
    assert run.result() == b"v"  # the callers get the value either way


def test_close_during_fetch_hands_over(c):
    f = flight(c)
    run = Run(c.pursue(f))
    run.send(1)
    c.close()
    run.send(core.Outcome(err=RuntimeError("cancelled by close")))
    assert run.expect(core.Script, "release").args[2] == P.abandon_event(f.token)
    run.send(1)
    with pytest.raises(memolock.Closed):
        run.result()


def test_interrupted_fetch_hands_over_and_reraises(c):
    run = Run(c.pursue(flight(c)))
    run.send(1)
    run.send(core.Outcome(err=KeyboardInterrupt()))
    run.expect(core.Script, "release")
    run.send(1)
    with pytest.raises(KeyboardInterrupt):
        run.result()


def test_closed_before_fetch_releases(c):
    f = flight(c)
    run = Run(c.pursue(f))
    c.close()
    run.send(1)
    assert run.expect(core.Script, "release").args[2] == P.abandon_event(f.token)
    run.send(1)
    with pytest.raises(memolock.Closed):
        run.result()
    assert c.callbacks == 0


def test_renewals(c, clock):
    f = flight(c)
    run = Run(c.renewals(f, 0.25))
    assert run.expect(core.Sleep).seconds == 0.25
    run.send(False)
    assert run.expect(core.Script, "renew").args == [f.token, 3000, b"t/lock-event:k"]
    run.throw(redis.exceptions.ConnectionError("blip"))  # a failed renewal: try again later
    assert run.expect(core.Sleep).seconds == pytest.approx(1.0)
    run.send(False)
    run.send(0)  # lost: stop
    run.result()
    run = Run(c.renewals(f, 1.0))
    run.send(True)  # the fetch ended
    run.result()


def test_lease_renew_error(c):
    run = Run(c.renew(b"k", b"tok", 0))
    run.throw(redis.exceptions.ConnectionError("gone"))
    with pytest.raises(memolock.RedisError, match='renewing lock "t/lock:k": gone'):
        run.result()


# --- external mode -------------------------------------------------------------

def until_external_live(run, f):
    """Steps a fresh external flight that takes the lock to its Start: it
    subscribes first, and waits until the subscription is live ([E1])."""
    run.expect(core.Script, "acquire")
    run.send(1)
    assert run.expect(core.Watch).channels == (b"t/notif:k", b"t/lock-event:k")  # no on_wait for our own lock
    run.send("watch")
    run.expect(core.Take)
    run.send(events(live=False))
    assert run.expect(core.Sleep).seconds == pytest.approx(1.0)  # lock TTL / 3
    run.send(True)
    run.send(events(reread=True))
    assert run.expect(core.Start).flight is f
    assert f.state == core.HOLDING


def test_external_winner_is_live_before_it_starts_then_waits_on_its_own_lock(c):
    f = flight(c, fetch=None, start=lambda lease: None)
    f.fetch = None
    run = Run(c.pursue(f))
    until_external_live(run, f)
    run.send()
    run.expect(core.Take)  # live before start: no lookup after it
    run.send(events())
    run.expect(core.Sleep)
    run.send(True)
    run.send(events([(b"t/notif:k", b"made elsewhere")]))
    op = run.expect(core.Script, "release")
    assert op.args == [f.token, b"t/lock-event:k", b"", P.LINGER_MS]
    run.send(1)
    assert run.result() == b"made elsewhere"


@pytest.mark.parametrize("reply, left", [
    # Taken now: the lock TTL (3 s) is left.
    (lambda f: 1, 3.0),
    # A retried acquire whose first reply was lost finds the lock already
    # ours with 2.8 s left, exactly as if it had answered 1 then.
    (lambda f: [2800, f.token], 2.8),
])
def test_external_winner_waits_on_what_is_left_of_its_lock(c, clock, reply, left):
    # The lock was taken before going live and start: the winner's timer
    # runs from what is left of it when start returns ([E1]), not from a
    # full lock TTL, and a start that outlasts the lock looks again at once.
    f = flight(c, start=lambda lease: None)
    run = Run(c.pursue(f))
    run.expect(core.Script, "acquire")
    run.send(reply(f))
    run.expect(core.Watch)
    run.send("watch")
    run.expect(core.Take)
    clock.now += 0.5  # going live took half a second
    run.send(events(reread=True))
    run.expect(core.Start)
    clock.now += 2.0  # and start two seconds
    run.send()
    run.expect(core.Take)
    assert f.wait.deadline == pytest.approx(clock.now + left - 2.5 + 0.001)


def test_external_failure_published_during_start_is_heard(c):
    # The producer failed while start ran: its event, read by the
    # subscription live since before start, ends the flight at once.
    f = flight(c, start=lambda lease: None)
    run = Run(c.pursue(f))
    until_external_live(run, f)
    run.send()
    run.expect(core.Take)
    run.send(events([(b"t/lock-event:k", b"fail\n" + f.token + b"\nproducer failed")]))
    op = run.expect(core.Script, "release")
    assert op.args == [f.token, b"t/lock-event:k", b"", 0]  # [E3]: no event, no linger
    run.send(1)
    with pytest.raises(memolock.HolderFailed, match="producer failed"):
        run.result()


def test_external_start_failure_releases(c):
    f = flight(c, start=lambda lease: None)
    run = Run(c.pursue(f))
    until_external_live(run, f)
    run.throw(OSError("cannot start"))
    assert run.expect(core.Script, "release").args[2] == b"fail\n" + f.token + b"\ncannot start"
    run.send(1)
    with pytest.raises(OSError):
        run.result()
    end = Run(c.end(f))
    end.expect(core.Unwatch)
    end.send()
    assert end.done  # released once, with the failure


def test_external_value_before_live_answers_without_starting(c):
    f = flight(c, start=lambda lease: None)
    run = Run(c.pursue(f))
    run.send(1)
    run.expect(core.Watch)
    run.send("watch")
    run.send(events([(b"t/lock-event:k", b"abandon\n" + HOLDER + b"\n"), (b"t/notif:k", b"there")], live=False))
    op = run.expect(core.Script, "release")
    assert op.args == [f.token, b"t/lock-event:k", b"", P.LINGER_MS]  # [E2]
    run.send(1)
    assert run.result() == b"there"
    assert c.callbacks == 0 and f.state == core.LOOKING  # start never ran
    end = Run(c.end(f))
    end.expect(core.Unwatch)
    end.send()
    assert end.done


@pytest.mark.parametrize("how", ["refused", "closed", "left"])
def test_external_no_start_if_the_wait_to_be_live_ends(c, how):
    f = flight(c, start=lambda lease: None)
    run = Run(c.pursue(f))
    run.send(1)
    run.expect(core.Watch)
    run.send("watch")
    if how == "refused":
        run.send(events(err=redis.exceptions.ResponseError("NOPERM"), live=False))
        with pytest.raises(memolock.RedisError, match="NOPERM"):
            run.result()
    elif how == "closed":
        c.close()
        c.finish(f, None, memolock.Closed("memolock: client closed"))
        run.send(events(closed=True, live=False))
        with pytest.raises(memolock.Closed):
            run.result()
    else:
        run.send(events(live=False))
        run.expect(core.Sleep)
        assert c.leave(f)  # the only caller leaves ([E4])
        run.send(True)
        run.send(events(reread=True))
        with pytest.raises(memolock.Abandoned):
            run.result()
    assert c.callbacks == 0  # start never ran
    end = Run(c.end(f))
    end.expect(core.Unwatch)
    end.send()
    assert end.expect(core.Script, "release").args[2] == P.abandon_event(f.token)


def test_external_slow_subscription_starts_anyway_and_looks_again_once_live(c, clock):
    f = flight(c, start=lambda lease: None)
    run = Run(c.pursue(f))
    run.send(1)
    run.expect(core.Watch)
    run.send("watch")
    run.send(events(live=False))
    run.expect(core.Sleep)
    clock.now += 1.0  # lock TTL / 3
    run.send(False)
    run.send(events([(b"t/lock-event:k", b"garbage")], live=False))
    run.expect(core.Start)
    run.send()
    run.expect(core.Take)
    run.send(events(reread=True))
    run.expect(core.Script, "acquire")  # the lookup once live ([W11])
    run.send([1500, f.token])
    run.expect(core.Take)


def own_lock_expired(run, f, clock):
    """Steps a fresh external flight through its start and the wait on its
    own lock until that lock expired: the next op is the lookup that finds
    it gone."""
    until_external_live(run, f)
    run.send()  # start returned
    run.expect(core.Take)
    run.send(events())
    run.expect(core.Sleep)
    clock.now += 4  # past the lock TTL: nobody renews an external lock
    run.send(False)
    run.expect(core.Take)


def late(kind, f, text=b"late"):
    """An event of the flight's earlier producer, under its own token."""
    return (b"t/lock-event:k", b"fail\n" + f.token + b"\n" + text if kind == "fail" else b"notfound\n" + f.token + b"\n")


def word(kind, token, text=b"late"):
    """The late word as published again under token ([E1a])."""
    return P.fail_event(token, text) if kind == "fail" else P.event(P.EVENT_NOTFOUND, token)


def ends_as_its_producer_said(run, f, c, kind, relay_to=None):
    """The flight ends on its earlier producer's late event without calling
    start again ([E1a]): the lock goes with no linger, the word published
    again under the flight's own token (and under relay_to, the holder it
    took the lock over from); the callers get the failure or NotFound."""
    op = run.expect(core.Script, "release")
    assert op.args == [f.token, b"t/lock-event:k", word(kind, f.token), 0]
    run.send(1)
    if relay_to is not None:
        op = run.expect(core.Publish)
        assert (op.channel, op.payload) == (b"t/lock-event:k", word(kind, relay_to))
        run.send()
    if kind == "fail":
        with pytest.raises(memolock.HolderFailed) as ei:
            run.result()
        assert ei.value.message == "late"
    else:
        with pytest.raises(memolock.NotFound):
            run.result()
    assert c.callbacks == 1  # the first start's alone (a driver ends it): no Start since
    assert not f.wait.own
    end = Run(c.end(f))
    end.expect(core.Unwatch)
    end.send()
    assert end.done  # and no second release


@pytest.mark.parametrize("kind", ["fail", "notfound"])
def test_external_late_event_taken_while_waiting_to_be_live_starts_nothing_again(c, clock, kind):
    # The lock expired and the flight took it again, its subscription no
    # longer live: its first producer's event, taken while it waits to be
    # live again, ends the flight before start is called again ([E1]).
    f = flight(c, start=lambda lease: None)
    run = Run(c.pursue(f))
    own_lock_expired(run, f, clock)
    run.send(events(live=False))  # the connection was replaced
    run.expect(core.Script, "acquire")
    run.send(1)  # expired: taken again
    run.expect(core.Take)
    run.send(events([late(kind, f)], live=False))
    ends_as_its_producer_said(run, f, c, kind)


@pytest.mark.parametrize("kind", ["fail", "notfound"])
def test_external_late_event_in_the_takeover_check_starts_nothing_again(c, clock, kind):
    # The flight's own lock expired and another holder took it; the flight
    # waited on that holder and took the lock over. Its first producer's
    # event arrives during the takeover check ([X4]): not the holder's, so
    # no verdict of the check, but it ends the flight before start.
    f = flight(c, start=lambda lease: None)
    run = Run(c.pursue(f))
    own_lock_expired(run, f, clock)
    run.send(events())
    run.expect(core.Script, "acquire")
    run.send([2000, HOLDER])
    run.expect(core.OnWait)
    run.send()
    run.expect(core.Take)
    run.send(events(reread=True))
    run.expect(core.Script, "acquire")
    run.send(1)
    run.expect(core.Mark)
    run.send()
    run.expect(core.Take)
    run.send(events([late(kind, f)], reread=True))
    # The word again under its own token, and under the holder it took the
    # lock over from, whose waiters may not have heard it ([E1a]).
    ends_as_its_producer_said(run, f, c, kind, relay_to=HOLDER)


@pytest.mark.parametrize("kind", ["fail", "notfound"])
def test_external_late_event_heard_earlier_starts_nothing_again(c, clock, kind):
    # Heard while the flight waited on another holder (ignored there,
    # [W6]), its first producer's event is acted on once the lock is the
    # flight's again, before it subscribes anew or calls start.
    f = flight(c, start=lambda lease: None)
    run = Run(c.pursue(f))
    own_lock_expired(run, f, clock)
    run.send(events())
    run.expect(core.Script, "acquire")
    run.send([2000, HOLDER])
    run.expect(core.OnWait)
    run.send()
    run.expect(core.Take)
    run.send(events([late(kind, f)]))
    run.expect(core.Sleep)  # not the holder's: the wait goes on
    run.send(True)
    run.send(events([(b"t/lock-event:k", b"abandon\n" + HOLDER + b"\n")], live=False))
    run.expect(core.Script, "acquire")
    run.send(1)  # no takeover check (not live), no wait to be live
    ends_as_its_producer_said(run, f, c, kind, relay_to=HOLDER)  # it took the lock over from HOLDER


def own_retake_check(run, f, clock):
    """Steps an external flight whose own lock expired, its subscription
    live, to the takeover check of its re-take ([X4]): the lookup takes the
    lock again and a marker round trip starts (next op: its first Take)."""
    own_lock_expired(run, f, clock)
    run.send(events())  # live, nothing: the timer has run out
    run.expect(core.Script, "acquire")
    run.send(1)  # expired: taken again
    assert run.expect(core.Mark).watch == "watch"  # before start, not Start
    assert f.wait.own  # an early exit hands the lock over
    run.send()
    run.expect(core.Take)


@pytest.mark.parametrize("kind", ["fail", "notfound"])
def test_external_own_retake_makes_the_takeover_check(c, clock, kind):
    # The flight took its own expired lock again with a live subscription:
    # its first producer's fail or notfound, published just before that
    # lookup and read before the marker's reply, ends the flight; start is
    # not called again ([X4], [E1]).
    f = flight(c, start=lambda lease: None)
    run = Run(c.pursue(f))
    own_retake_check(run, f, clock)
    run.send(events([late(kind, f)]))  # the marker's reply not back yet
    assert run.expect(core.Sleep).seconds == pytest.approx(1.0)  # bounded by lock TTL / 3
    run.send(True)
    run.expect(core.Take)
    run.send(events(reread=True))
    ends_as_its_producer_said(run, f, c, kind)
    assert f.took_over_from is None  # its own lock: nobody to relay to ([X5])


def test_external_own_retake_value_in_the_takeover_check_is_the_answer(c, clock):
    # Its first producer's value, read in the check, is the answer: the lock
    # goes with an empty event and the linger ([E2]).
    f = flight(c, start=lambda lease: None)
    run = Run(c.pursue(f))
    own_retake_check(run, f, clock)
    run.send(events([(b"t/notif:k", b"v"), late("fail", f)], reread=True))
    assert run.expect(core.Script, "release").args == [f.token, b"t/lock-event:k", b"", P.LINGER_MS]
    run.send(1)
    assert run.result() == b"v"
    assert c.callbacks == 1 and not f.wait.own


@pytest.mark.parametrize("payload", [
    lambda f: b"abandon\n" + f.token + b"\n",
    lambda f: b"fail\n" + OTHER + b"\nsomebody else's",
    lambda f: None,
])
def test_external_own_retake_with_nothing_from_its_producer_starts_again(c, clock, payload):
    # The check finds no answer of its first producer (an abandon under its
    # own token, another token's event, nothing): start again, as before.
    f = flight(c, start=lambda lease: None)
    run = Run(c.pursue(f))
    own_retake_check(run, f, clock)
    p = payload(f)
    run.send(events([(b"t/lock-event:k", p)] if p else [], reread=True))
    run.expect(core.Take)  # live already: one read of what came since, no wait to be live
    run.send(events())
    assert run.expect(core.Start).flight is f
    assert c.callbacks == 2


@pytest.mark.parametrize("payload", [
    lambda f: b"abandon\n" + f.token + b"\n",
    lambda f: b"stale\n" + f.token + b"\n",
    lambda f: b"fail\n" + OTHER + b"\nsomebody else's",
    lambda f: b"notfound\n" + OTHER + b"\n",
])
def test_external_other_events_taken_before_start_are_acted_on_after_it(c, clock, payload):
    # Only a fail or notfound under the flight's own token ends it before
    # start: anything else taken while it waits to be live again is kept
    # for the wait after start, as before.
    f = flight(c, start=lambda lease: None)
    run = Run(c.pursue(f))
    own_lock_expired(run, f, clock)
    run.send(events(live=False))
    run.expect(core.Script, "acquire")
    run.send(1)
    run.expect(core.Take)
    run.send(events([(b"t/lock-event:k", payload(f))], live=False))
    run.expect(core.Sleep)
    run.send(True)
    run.send(events(reread=True))
    run.expect(core.Start)  # started again
    run.send()
    run.expect(core.Take)
    run.send(events())
    if payload(f).startswith(b"abandon") or payload(f).startswith(b"stale"):
        run.expect(core.Script, "acquire")  # the kept event: look again ([W5])
    else:
        run.expect(core.Sleep)  # another token's: ignored ([W6])


def progress(f):
    """An event of a kind this peer does not know, under the flight's own
    token: it sends the flight to look again ([W5])."""
    return (b"t/lock-event:k", b"progress\n" + f.token + b"\n")


@pytest.mark.parametrize("kind", ["fail", "notfound"])
def test_external_word_kept_is_acted_on_when_a_lookup_finds_the_lock_still_ours(c, kind):
    # One read brings an unknown kind, then its producer's word: the first
    # sends the flight to look again, the word is kept. The lookup finds
    # the lock still its own: the word ends the flight there, not after a
    # whole lock TTL and a re-take ([E1a]).
    f = flight(c, start=lambda lease: None)
    run = Run(c.pursue(f))
    until_external_live(run, f)
    run.send()  # start returned
    run.expect(core.Take)
    run.send(events([progress(f), late(kind, f)]))
    run.expect(core.Script, "acquire")
    run.send([2500, f.token])  # still ours
    ends_as_its_producer_said(run, f, c, kind)


@pytest.mark.parametrize("kind", ["fail", "notfound"])
def test_external_word_kept_at_a_takeover_is_published_again_also_when_every_caller_left(c, clock, kind):
    # Its producer's word came while the flight waited on another holder
    # and its only caller has left; the flight then takes the lock over.
    # The word ends it, published again under its own token and HOLDER's,
    # not an abandon ([E1a] comes before [E4]).
    f = flight(c, start=lambda lease: None)
    run = Run(c.pursue(f))
    own_lock_expired(run, f, clock)
    run.send(events())
    run.expect(core.Script, "acquire")
    run.send([2000, HOLDER])
    run.expect(core.OnWait)
    run.send()
    run.expect(core.Take)
    run.send(events([late(kind, f)]))
    run.expect(core.Sleep)  # not the holder's: kept ([W6])
    assert f.wait.late is not None
    assert not c.leave(f)  # started: the flight goes on ([E4])
    run.send(True)
    run.expect(core.Take)
    run.send(events([(b"t/lock-event:k", b"abandon\n" + HOLDER + b"\n")]))
    run.expect(core.Script, "acquire")
    run.send(1)
    run.expect(core.Mark)
    run.send()
    run.expect(core.Take)
    run.send(events(reread=True))  # nothing of HOLDER's: a genuine takeover
    ends_as_its_producer_said(run, f, c, kind, relay_to=HOLDER)


def kept_then_own_retake_check(run, f, clock, kind):
    """An external flight whose own lock expired reads an unknown kind and
    its producer's word in one read (the word kept), looks again and takes
    its lock again: the takeover check starts (next op: its first Take)."""
    own_lock_expired(run, f, clock)
    run.send(events([progress(f), late(kind, f)]))
    run.expect(core.Script, "acquire")
    run.send(1)  # expired: taken again
    assert f.wait.late is not None
    run.expect(core.Mark)  # the check, even with a word kept ([X4])
    run.send()
    run.expect(core.Take)


@pytest.mark.parametrize("kind", ["fail", "notfound"])
def test_external_own_retake_value_in_the_check_decides_before_a_word_kept(c, clock, kind):
    # At a re-take of its own lock a value decides first ([E1a]).
    f = flight(c, start=lambda lease: None)
    run = Run(c.pursue(f))
    kept_then_own_retake_check(run, f, clock, kind)
    run.send(events([(b"t/notif:k", b"v")], reread=True))
    assert run.expect(core.Script, "release").args == [f.token, b"t/lock-event:k", b"", P.LINGER_MS]  # [E2]
    run.send(1)
    assert run.result() == b"v"
    assert c.callbacks == 1 and not f.wait.own


@pytest.mark.parametrize("kind", ["fail", "notfound"])
def test_external_own_retake_value_decides_before_a_word_read_first_in_the_check(c, clock, kind):
    # A word read in the check is kept as any other: at a re-take of its
    # own lock, a value read after it in the same check still decides
    # first ([E1a]); in order, as [X3] reads another holder's, the word won.
    f = flight(c, start=lambda lease: None)
    run = Run(c.pursue(f))
    own_retake_check(run, f, clock)
    run.send(events([late(kind, f), (b"t/notif:k", b"v")], reread=True))
    assert run.expect(core.Script, "release").args == [f.token, b"t/lock-event:k", b"", P.LINGER_MS]  # [E2]
    run.send(1)
    assert run.result() == b"v"
    assert c.callbacks == 1


@pytest.mark.parametrize("kind", ["fail", "notfound"])
def test_external_own_retake_acts_on_a_word_kept_if_the_check_finds_no_value(c, clock, kind):
    f = flight(c, start=lambda lease: None)
    run = Run(c.pursue(f))
    kept_then_own_retake_check(run, f, clock, kind)
    run.send(events([(b"t/lock-event:k", b"abandon\n" + OTHER + b"\n")], reread=True))
    ends_as_its_producer_said(run, f, c, kind)
    assert f.took_over_from is None  # its own lock: no relay ([E1a])


def test_external_own_producers_notfound_deletes_the_lock_without_linger(c):
    # [E3]: heard while the winner holds its lock, its producer's notfound
    # deletes it with no event and no linger, as a fail does.
    f = flight(c, start=lambda lease: None)
    run = Run(c.pursue(f))
    until_external_live(run, f)
    run.send()
    run.expect(core.Take)
    run.send(events([late("notfound", f)]))
    assert run.expect(core.Script, "release").args == [f.token, b"t/lock-event:k", b"", 0]
    run.send(1)
    with pytest.raises(memolock.NotFound):
        run.result()


def test_fetch_mode_ignores_events_under_its_own_token(c):
    # Nobody publishes under a fetching flight's token: nothing is kept.
    f = flight(c)
    c.note_late(f, [late("fail", f)])
    assert f.wait.late is None


# --- the registry ----------------------------------------------------------

def test_join_coalesces_and_validates(c):
    f, leader = c.join("k", None, None, None, core.Flight)
    g, second = c.join(b"k", None, None, 5, core.Flight)
    assert leader and not second and f is g and f.refs == 2 and c.active == 1
    assert not c.leave(f)
    with pytest.raises(memolock.InvalidArgument):
        c.join("k", None, None, -1, core.Flight)
    with pytest.raises(memolock.InvalidArgument):
        c.join(3, None, None, None, core.Flight)
    h = core.Core("t", 3.0, True, 0)
    f, _ = h.join("k", None, None, None, core.Flight)
    assert f.key == P.hash_id(b"k") and f.id == b"k"


# --- the waiters' timer jitter (PROTOCOL.md: pttl + 1 ms + U[0, min(pttl/10, 1 s)]) -----

def test_timer_jitter_bounds(c, rand):
    rand.x = 0.0
    assert c.timer(2000) == pytest.approx(2.001)
    rand.x = 0.999
    assert c.timer(2000) == pytest.approx(2.001 + 0.1998)  # pttl/10
    assert c.timer(60000) == pytest.approx(60.001 + 0.999)  # at most 1 s
    assert c.timer(0) == pytest.approx(0.001)
    assert c.timer(-1) == c.lock_ttl  # no TTL: no renewal moments to avoid


def test_default_jitter_spreads_waiters():
    c = core.Core("t", 3.0, False, 0)
    delays = [c.timer(2000) - 2.001 for _ in range(200)]
    assert all(0 <= d <= 0.2 for d in delays)
    assert max(delays) - min(delays) > 0.05


def test_waiter_sleeps_with_jitter(c, rand, clock):
    rand.x = 0.5
    f = flight(c)
    run = Run(c.pursue(f))
    until_waiting(run, f, pttl=2000)
    run.send(events())
    assert run.expect(core.Sleep).seconds == pytest.approx(2.101)


# --- the takeover rule (PROTOCOL.md; issue 15, defect 1) ------------------------

def until_takeover(c, f, run, reply=1):
    """A flight that waited on HOLDER with a live subscription looks again
    and takes the lock: it must first make a marker round trip."""
    until_waiting(run, f)
    run.send(events(reread=True, live=True))
    run.expect(core.Script, "acquire")
    run.send(reply)
    assert run.expect(core.Mark).watch == "watch"
    run.send()
    run.expect(core.Take)


def test_takeover_after_holder_failed_fails_and_releases_with_its_message(c):
    f = flight(c)
    run = Run(c.pursue(f))
    until_takeover(c, f, run)
    run.send(events([(b"t/lock-event:k", b"fail\n" + HOLDER + b"\nbackend down")], reread=True))
    op = run.expect(core.Script, "release")
    assert op.args == [f.token, b"t/lock-event:k", b"fail\n" + f.token + b"\nbackend down", 0]
    run.send(1)
    with pytest.raises(memolock.HolderFailed) as ei:
        run.result()
    assert ei.value.message == "backend down"
    assert f.state == core.LOOKING and c.callbacks == 0  # no fetch ran
    end = Run(c.end(f))
    end.expect(core.Unwatch)
    end.send()
    end.result()  # and no second release


def test_takeover_waits_for_the_marker(c, clock):
    # The event arrives in a later take than the first: the round trip is
    # what the flight waits for, not the first wake-up.
    f = flight(c)
    run = Run(c.pursue(f))
    until_takeover(c, f, run)
    run.send(events([(b"t/lock-event:k", b"abandon\n" + OTHER + b"\n")]))
    assert run.expect(core.Sleep).seconds <= 1.0  # bounded by the first renewal
    run.send(True)
    run.expect(core.Take)
    run.send(events([(b"t/lock-event:k", b"fail\n" + HOLDER + b"\nlate")]))
    run.expect(core.Sleep)  # the marker is not back yet
    run.send(True)
    run.send(events(reread=True))
    assert b"\nlate" in run.expect(core.Script, "release").args[2]


def test_takeover_after_holder_not_found(c):
    f = flight(c)
    run = Run(c.pursue(f))
    until_takeover(c, f, run)
    run.send(events([(b"t/lock-event:k", b"notfound\n" + HOLDER + b"\n")], reread=True))
    assert run.expect(core.Script, "release").args[2] == b"notfound\n" + f.token + b"\n"
    run.send(1)
    with pytest.raises(memolock.NotFound):
        run.result()


def test_takeover_after_value_published_without_storing(c):
    f = flight(c)
    run = Run(c.pursue(f))
    until_takeover(c, f, run)
    run.send(events([(b"t/notif:k", b"handed out")], reread=True))
    op = run.expect(core.Script, "release")
    assert op.args == [f.token, b"t/lock-event:k", P.abandon_event(f.token), 0]
    run.send(1)
    assert run.result() == b"handed out"


@pytest.mark.parametrize("payload", [
    b"abandon\n" + HOLDER + b"\n",
    b"stale\n" + HOLDER + b"\n",
    b"future-kind\n" + HOLDER + b"\nwhatever",
    b"fail\n" + OTHER + b"\nsomebody else's",
    None,
])
def test_genuine_takeover_computes(c, clock, payload):
    f = flight(c)
    run = Run(c.pursue(f))
    until_takeover(c, f, run)
    clock.now += 0.01
    run.send(events([(b"t/lock-event:k", payload)] if payload else [], reread=True))
    run.expect(core.Unwatch)
    run.send()
    op = run.expect(core.Fetch)  # the lock is ours: compute
    assert op.first == pytest.approx(1.0)
    assert not f.wait.own
    run.send(core.Outcome(result=(b"computed", 0)))
    run.expect(core.Script, "store")
    run.send(1)
    assert run.result() == b"computed"


def test_takeover_of_a_lock_found_ours_counts_its_time(c, clock):
    # A busy reply naming our own token, 900 ms left: the round trip took
    # 100 ms, so the first renewal is due within (900 - 100) / 2 ms.
    f = flight(c)
    run = Run(c.pursue(f))
    until_takeover(c, f, run, reply=[900, f.token])
    clock.now += 0.1
    run.send(events(reread=True))
    run.send()  # Unwatch
    assert run.expect(core.Fetch).first == pytest.approx(0.4)


def test_takeover_round_trip_that_never_returns_computes(c, clock):
    # A connection that answers nothing is replaced after seconds; the lock
    # needs its first renewal after lock TTL/3: compute then.
    f = flight(c)
    run = Run(c.pursue(f))
    until_takeover(c, f, run)
    run.send(events())
    assert run.expect(core.Sleep).seconds == pytest.approx(1.0)
    clock.now += 1.0
    run.send(False)
    run.send(events())
    run.expect(core.Unwatch)
    run.send()
    run.expect(core.Fetch)


def test_takeover_acts_on_what_arrived_before_a_replacement(c):
    # The connection was replaced during the round trip (the reread comes
    # from the new connection's marker): a failure that did arrive is true.
    f = flight(c)
    run = Run(c.pursue(f))
    until_takeover(c, f, run)
    run.send(events([(b"t/lock-event:k", b"fail\n" + HOLDER + b"\ngone")], live=False))
    run.expect(core.Sleep)
    run.send(True)
    run.send(events(reread=True))
    assert run.expect(core.Script, "release").args[2] == b"fail\n" + f.token + b"\ngone"


def test_no_round_trip_without_a_live_subscription(c, clock):
    # The timer fired before the subscription was live: events published
    # before it took effect may be lost anyway, so the flight computes.
    f = flight(c)
    run = Run(c.pursue(f))
    until_waiting(run, f, pttl=5)
    run.send(events(live=False))
    clock.now += 0.006
    run.send(False)  # Sleep
    run.send(events(live=False))
    run.expect(core.Script, "acquire")
    run.send(1)
    run.expect(core.Unwatch)
    run.send()
    run.expect(core.Fetch)


def test_no_round_trip_on_a_first_lookup(c):
    f = flight(c)
    run = Run(c.pursue(f))
    run.send(1)
    run.expect(core.Fetch)


def test_close_during_takeover_hands_the_lock_over(c):
    f = flight(c)
    run = Run(c.pursue(f))
    until_takeover(c, f, run)
    c.close()
    c.finish(f, None, memolock.Closed("memolock: client closed"))
    run.send(events())
    with pytest.raises(memolock.Closed):
        run.result()
    end = Run(c.end(f))
    end.send()  # Unwatch
    assert end.expect(core.Script, "release").args[2] == P.abandon_event(f.token)


def test_external_mode_takeover_fails_without_starting(c):
    f = flight(c, start=lambda lease: None)
    run = Run(c.pursue(f))
    until_takeover(c, f, run)
    run.send(events([(b"t/lock-event:k", b"fail\n" + HOLDER + b"\nno")], reread=True))
    run.expect(core.Script, "release")
    run.send(1)
    with pytest.raises(memolock.HolderFailed):
        run.result()


def test_external_mode_takeover_is_live_already(c):
    # A genuine takeover: the subscription it waited with was live at the
    # marker round trip, so start runs after one read of what came since
    # ([E1a]), with no wait to be live, and no lookup follows it.
    f = flight(c, start=lambda lease: None)
    run = Run(c.pursue(f))
    until_takeover(c, f, run)
    run.send(events(reread=True))
    run.expect(core.Take)
    run.send(events())
    run.expect(core.Start)
    run.send()
    run.expect(core.Take)
    run.send(events())
    run.expect(core.Sleep)


def test_takeover_verdict_order():
    notif = b"t/notif:k"
    ev = b"t/lock-event:k"
    assert core.takeover_verdict([], notif, HOLDER) is None
    assert core.takeover_verdict([(ev, b"abandon\n" + HOLDER + b"\n"), (ev, b"fail\n" + HOLDER + b"\nx")],
                                 notif, HOLDER) == ("fail", b"x")
    assert core.takeover_verdict([(notif, b"v"), (ev, b"fail\n" + HOLDER + b"\nx")], notif, HOLDER) == ("value", b"v")
    assert core.takeover_verdict([(ev, b"garbage")], notif, HOLDER) is None


def test_own_verdict():
    ev = b"t/lock-event:k"
    own = b"ownownownownownownownownownownow@here:1"
    assert core.own_verdict([], own) is None
    assert core.own_verdict([(ev, b"abandon\n" + own + b"\n"), (ev, b"fail\n" + OTHER + b"\nx")], own) is None
    assert core.own_verdict([(ev, b"stale\n" + own + b"\n"), (ev, b"notfound\n" + own + b"\n"),
                             (ev, b"fail\n" + own + b"\nx")], own) == ("notfound", b"")
    assert core.own_verdict([(ev, b"fail\n" + own + b"\nx")], own) == ("fail", b"x")


@pytest.mark.parametrize("kind", ["fail", "notfound"])
def test_external_own_retake_reads_what_was_delivered_before_it_starts_again(c, clock, kind):
    # [E1a]: "Before calling start again, a winner that is already live
    # SHOULD first read what its subscription has already delivered", as Go
    # (goLive) and C# (EndedBeforeStart) do: a word delivered after the
    # check's marker stops the second start.
    f = flight(c, start=lambda lease: None)
    run = Run(c.pursue(f))
    own_retake_check(run, f, clock)
    run.send(events(reread=True))  # the marker is back: nothing from the first producer
    run.expect(core.Take)  # what the subscription delivered since, before Start
    run.send(events([late(kind, f)]))
    ends_as_its_producer_said(run, f, c, kind)


def test_external_own_lock_released_with_no_linger_on_a_pttl_reply(c):
    # A lookup that answers {pttl} ([L4]) while the winner holds its own
    # lock releases it with no linger ([L4]: "A winner in external mode
    # that holds its own lock MUST release it first (release, any event, no
    # linger)"), not with a value's 1000 ms, as Go does (abandon).
    f = flight(c, start=lambda lease: None)
    run = Run(c.pursue(f))
    until_external_live(run, f)
    run.send()  # start returned
    run.expect(core.Take)
    run.send(events([progress(f)]))  # an unknown kind: look again
    run.expect(core.Script, "acquire")
    run.send([5000])  # a cached "not found"
    op = run.expect(core.Script, "release")
    assert op.args[0] == f.token
    assert op.args[3] == 0, f"released with linger {op.args[3]} ms"
