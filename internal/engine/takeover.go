package engine

import (
	"time"

	"github.com/memolock/memolock/internal/pubsub"
	"github.com/memolock/memolock/internal/wire"
)

// heard is asked before a flight that waited on another holder computes
// under the lock it just took (or, in external mode, starts the work). That
// holder may have failed, found nothing, or published its value without
// storing it, and released its lock in the very moment this flight looked:
// a renewing holder resets its lock every LockTTL/3, so waiters' timers
// cluster on those moments, and so do fetches that time out after round
// durations. Its news may then already sit on the flight's connection,
// unread. So the flight makes a marker round trip on its subscription
// (PROTOCOL.md, Takeover), bounded by the time before its lock's first
// renewal is due, and honours what came before the marker: the holder's
// failure or "not found" ends the flight as it would a waiter, and is
// passed on under this flight's token, so that nobody computes; a value
// published without being stored is the answer. It reports false when the
// flight should compute: nothing came, the holder abandoned its lock, or the
// round trip could not tell (a connection replaced, a subscription never
// live). pttl is the lock's remaining time when it was found already ours,
// else negative; it returns it less the time the round trip took.
func (p *pursuit) heard(pttl time.Duration) (next, time.Duration, bool) {
	if !p.waited || !p.live || p.watch == nil {
		return next{}, pttl, false
	}
	t0 := time.Now()
	left := pttl
	if left < 0 {
		left = p.e.cfg.LockTTL
	}
	bound := time.NewTimer(min(p.e.cfg.LockTTL/3, left/2))
	defer bound.Stop()
	p.watch.Sync()
	for {
		select {
		case <-p.watch.Signal():
			n, decided, synced := p.onTakeoverEvents(p.watch.Take())
			if decided || synced {
				return n, left - time.Since(t0), decided
			}
		case <-p.f.done:
			// A value pushed on the fast path (published without being
			// stored), or Close: the callers have their answer.
			p.release(wire.AbandonEvent(p.f.token))
			return p.onFinished(), 0, true
		case <-bound.C:
			return next{}, left - time.Since(t0), false
		}
	}
}

// onTakeoverEvents reads what came during the round trip: decided when it
// ends the flight, synced when the round trip is over with nothing to
// honour.
func (p *pursuit) onTakeoverEvents(ev pubsub.Events) (n next, decided, synced bool) {
	e, f := p.e, p.f
	if ev.Closed {
		p.release(wire.AbandonEvent(f.token))
		return next{err: ErrClosed}, true, false
	}
	notif, _ := p.channels()
	for _, m := range ev.Messages {
		if m.Channel == notif {
			if p.holder == f.token {
				// External mode, its own lock taken again: its producer's
				// value came after all ([E2]).
				e.releaseDone(f)
				p.own = false
				p.served = ServedComputed // the work this flight started
			} else {
				p.served = ServedWaited
				// The holder published its value without storing it.
				p.release(wire.AbandonEvent(f.token))
			}
			e.stats.wakeups.Add(1)
			return next{val: []byte(m.Payload)}, true, false
		}
		kind, token, text := wire.ParseEvent(m.Payload)
		if token == f.token {
			// External mode: its earlier producer's late word. The holder
			// waited on decides first (another holder's word, or at a
			// re-take of its own lock a value, wherever either comes in
			// this read); start acts on the word kept if nothing else
			// decides ([E1a]).
			p.keepLate(m.Payload)
			continue
		}
		if token != p.holder {
			continue
		}
		switch kind {
		case wire.EventFail:
			e.flights.seal(f) // decided: see group.seal
			e.release(f, wire.FailText(f.token, text))
			return p.onFail(text), true, false
		case wire.EventNotFound:
			p.release(wire.NotFoundEvent(f.token))
			p.served = ServedWaited
			return next{err: e.notFoundErr(f.id)}, true, false
		}
	}
	if ev.Moved || ev.Err != nil {
		// The watch hears nothing any more (the router dropped it, or Redis
		// refused it): drop it, so that a flight that needs one (external
		// mode, goLive) watches again instead of trusting it.
		if ev.Moved {
			p.movedAt = time.Now()
		}
		p.unwatch()
	}
	// A replaced connection (Reread) or a moved slot may have lost the
	// holder's news: nothing to honour, as before this rule.
	return next{}, false, ev.Synced || ev.Reread || ev.Moved || ev.Err != nil
}
