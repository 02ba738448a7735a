package engine

import (
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/memolock/memolock/internal/pubsub"
	"github.com/memolock/memolock/internal/wire"
)

// next is what a wait decided.
type next struct {
	val   []byte
	err   error
	again bool // look the value up again
}

// wait waits on the busy reply r until the value, an error, or a reason to
// look again.
func (p *pursuit) wait(r wire.Reply) next {
	if err := p.busy(r); err != nil {
		return next{err: err}
	}
	for {
		select {
		case <-p.watch.Signal():
			if n, ok := p.onEvents(p.watch.Take()); ok {
				return n
			}
		case <-p.timer.C:
			return next{again: true} // the holder's lock expired without news
		case <-p.f.ctx.Done():
			return next{err: p.e.ended()}
		case <-p.f.done:
			return p.onFinished()
		}
	}
}

// busy takes in a busy reply: whom to wait for, and until when. It fails
// only if OnWait, told of a new holder, called runtime.Goexit.
func (p *pursuit) busy(r wire.Reply) error {
	e, f := p.e, p.f
	p.own = r.Holder == f.token
	if r.Holder != p.holder {
		p.holder = r.Holder
		if !p.own {
			f.waitsOn(r.Holder)
			if err := e.notifyWait(f, r.Holder); err != nil {
				return err
			}
		}
	}
	if !p.waited {
		p.waited = true
		e.stats.waits.Add(1)
		if e.meters.timing(p.ctx) {
			p.since = time.Now()
		}
	}
	if !p.parked {
		p.parked = true
		e.stats.waiting.Add(1)
	}
	if e.cfg.StaleTTL > 0 {
		// For callers that give up waiting: the copy as of this reply.
		e.flights.offer(f, r.Value)
	}
	if p.watch == nil {
		var onValue func(string)
		if f.start == nil {
			// The fast path: the value reaches the callers from the
			// subscriber's reader. A flight that may hold its own lock
			// (external mode) must release it first, so it takes values
			// on its own goroutine.
			onValue = p.onValue
		}
		notif, events := p.channels()
		p.watch = e.subs.Watch(onValue, notif, events)
	}
	d := waitFor(r.PTTL, e.cfg.LockTTL)
	if !p.movedAt.IsZero() && time.Since(p.movedAt) < afterMove {
		// The cluster changed under this wait: the slot map go-redis
		// holds may still name a node that no longer serves the slot
		// (after a failover, for a while), where our subscription hears
		// nothing. Look again soon, rather than when the lock would
		// expire, until the topology has settled.
		d = min(d, lookAfterMove)
	}
	if p.timer == nil {
		p.timer = time.NewTimer(d)
	} else {
		p.timer.Reset(d)
	}
	return nil
}

// waitFor is how long a waiter waits before it looks again, when nothing
// arrives: a uniform draw between the bounds of waitBounds.
func waitFor(pttl, lockTTL time.Duration) time.Duration {
	earliest, latest := waitBounds(pttl, lockTTL)
	if latest > earliest {
		return earliest + rand.N(latest-earliest)
	}
	return earliest
}

// waitBounds bounds the wait before a waiter looks again (PROTOCOL.md,
// [W7]-[W9]): until the holder's lock would expire (pttl), plus a
// millisecond, plus a random part of up to a tenth of pttl (at most a
// second), so that waiters do not all look at the moment the holder renews
// its lock. A lock without expiry, set by somebody else, is looked at again
// after lockTTL.
func waitBounds(pttl, lockTTL time.Duration) (earliest, latest time.Duration) {
	if pttl < 0 {
		return lockTTL, lockTTL
	}
	// The original Go peer renews with nanoseconds as seconds: a PTTL of
	// centuries must not overflow into a negative Duration.
	pttl = min(pttl, maxWait)
	earliest = pttl + time.Millisecond
	return earliest, earliest + min(pttl/10, time.Second)
}

// afterMove is how long after its watch moved a wait looks again every
// lookAfterMove, whatever the holder's lock says.
const (
	afterMove     = 5 * time.Second
	lookAfterMove = 250 * time.Millisecond
)

// maxWait bounds a waiter's timer (about a century): room is left for what
// waitFor adds.
const maxWait = 100 * 365 * 24 * time.Hour

// onValue runs on the subscriber's reader when the value is published, and
// hands it to the callers at once, unless the flight has moved on.
func (p *pursuit) onValue(payload string) {
	p.e.deliver(p.f, answer{val: []byte(payload), served: ServedWaited})
}

// onEvents handles what the subscription delivered. It reports false to
// keep waiting.
func (p *pursuit) onEvents(ev pubsub.Events) (next, bool) {
	notif, _ := p.channels()
	for _, m := range ev.Messages {
		if m.Channel != notif {
			// Before anything below returns with the batch half read: an
			// event of its earlier producer, late, is acted on if the lock
			// becomes the flight's own again ([E1]).
			p.keepLate(m.Payload)
		}
	}
	switch {
	case ev.Closed:
		return next{err: ErrClosed}, true
	case ev.Moved:
		// Sharded: the node no longer serves the key's slot (the router
		// has dropped the watch and reloads the slot map). Whatever was
		// published meanwhile is lost: look again, and watch where the
		// slot is now.
		p.unwatch()
		p.movedAt = time.Now()
		return next{again: true}, true
	case ev.Err != nil:
		// Redis refused the subscription (NOPERM, say): no value will
		// come this way.
		return next{err: fmt.Errorf("%w: subscribing to %s: %w", ErrRedis, wire.Quote(notif), ev.Err)}, true
	}
	if ev.Reread {
		// Live now, even if a message below ends the wait: the takeover
		// check (heard) and an external start (goLive) rely on knowing it.
		p.live = true
	}
	for _, m := range ev.Messages {
		if m.Channel == notif {
			return p.value([]byte(m.Payload)), true
		}
		if n, ok := p.onEvent(m.Payload); ok {
			return n, true
		}
	}
	if ev.Reread {
		// Whatever was published before is lost, so look.
		return next{again: true}, true
	}
	return next{}, false
}

// onEvent handles one event of the holder waited for; it reports false for
// an event about another holder.
func (p *pursuit) onEvent(payload string) (next, bool) {
	kind, token, text := wire.ParseEvent(payload)
	if token != p.holder {
		return next{}, false // about an earlier holder
	}
	switch kind {
	case wire.EventFail:
		return p.onFail(text), true
	case wire.EventNotFound:
		p.served = ServedWaited
		if p.own {
			// Our external producer found nothing: its event is out,
			// the lock must go, with no other ([E3]).
			p.release("")
			p.served = ServedComputed // the work this flight started
		}
		return next{err: p.e.notFoundErr(p.f.id)}, true
	}
	// abandon, stale (the holder put a stale copy back), or a kind this
	// version does not know: look.
	return next{again: true}, true
}

// onFail handles the holder's failure event.
func (p *pursuit) onFail(text string) next {
	e := p.e
	e.stats.holderFails.Add(1)
	if p.own {
		// Our external producer reported its failure itself: the event is
		// out, the lock must go.
		p.release("")
	}
	err := fmt.Errorf("%w: %s", ErrHolderFailed, text)
	if copy := e.flights.fallbackOf(p.f); copy != nil {
		e.staleServed(p.f, err)
		p.served = ServedStale
		e.stats.servedStale.Add(1)
		return next{val: copy}
	}
	return next{err: err}
}

// onFinished handles a flight finished while waiting: by onValue with the
// value, or by Close.
func (p *pursuit) onFinished() next {
	if p.f.err != nil {
		return next{err: p.f.err}
	}
	p.e.stats.wakeups.Add(1)
	p.served = ServedWaited
	return next{val: p.f.val}
}

// value ends the wait with the value, looked up or received.
func (p *pursuit) value(v []byte) next {
	e := p.e
	switch {
	case p.own:
		p.served = ServedComputed // the external work this flight started
	case p.resurrected:
		p.served = ServedStale
		e.stats.servedStale.Add(1)
	case p.waited:
		p.served = ServedWaited
	default:
		p.served = ServedRedis
	}
	if p.waited {
		e.stats.wakeups.Add(1)
	} else {
		e.stats.hits.Add(1)
	}
	if p.own {
		// Released before the callers have the value, and so before they
		// can look at Redis again.
		e.releaseDone(p.f)
		p.own = false
	}
	return next{val: v}
}

// takeover counts a lock taken after waiting for another holder.
func (p *pursuit) takeover() {
	if !p.waited {
		return
	}
	e := p.e
	if p.holder == p.f.token {
		// External mode: its own lock, taken again after its producer
		// went silent. Nobody else's waiters to tell of a failure.
		e.log.Info("memolock: an external producer went silent; its lock is taken again",
			"tag", e.keys.Tag(), "id", p.f.id)
		p.f.endClaim()
		return
	}
	p.tookOverFrom = p.holder
	e.stats.takeovers.Add(1)
	e.log.Info("memolock: took over a lock whose holder went silent",
		"tag", e.keys.Tag(), "id", p.f.id, "previous_holder", p.holder)
	p.f.endClaim() // it covered the wait: the fetch gets a span of its own
}

// recordWait records how long the flight waited, once, with what it got.
func (p *pursuit) recordWait(o outcome) {
	if !p.since.IsZero() {
		p.e.meters.recordWait(p.ctx, time.Since(p.since), o)
		p.since = time.Time{}
	}
}

// release deletes the flight's own lock, publishing event. The flight's
// answer is decided (release is called only then, or at its end): from now
// on new callers look afresh rather than wait for the write (see
// group.seal).
func (p *pursuit) release(event string) {
	p.own = false
	p.e.flights.seal(p.f)
	p.e.release(p.f, event)
}

// unwatch drops the subscription.
func (p *pursuit) unwatch() {
	if p.watch != nil {
		p.watch.Stop()
		p.watch = nil
		p.live = false
	}
}

// end stops the wait. A lock the flight may hold goes, with an abandon
// event so that waiters elsewhere take over at once. It is safe to call
// more than once.
func (p *pursuit) end() {
	if p.parked {
		p.parked = false
		p.e.stats.waiting.Add(-1)
	}
	p.unwatch()
	if p.timer != nil {
		p.timer.Stop()
	}
	if p.own || p.maybeLocked {
		p.maybeLocked = false
		p.release(wire.AbandonEvent(p.f.token))
	}
	if after := p.after; after != nil {
		p.after = nil
		after()
	}
}
