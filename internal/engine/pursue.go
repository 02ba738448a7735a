package engine

import (
	"context"
	"fmt"
	"time"

	"github.com/memolock/memolock/internal/pubsub"
	"github.com/memolock/memolock/internal/wire"
)

// A pursuit is what a flight's own goroutine knows while it pursues the
// value: the holder it waits for, its subscription and timer, whether the
// lock is its own, and how the value came. Nothing else touches it.
type pursuit struct {
	e   *Engine
	f   *flight
	ctx context.Context // the flight's (or, for a first lookup made inline, the caller's)

	watch  *pubsub.Watch // the value and events channels; nil until the first wait
	timer  *time.Timer   // fires when the holder's lock would expire
	holder string        // token of the holder waited for
	waited bool          // counted in Stats.Waits
	since  time.Time     // the first busy reply, when waited and timed
	parked bool          // counted in the waiting gauge
	live   bool          // the watch's subscription is known live (it was told to re-read)
	// tookOverFrom is the holder whose lock the flight took over after
	// waiting on it: its waiters hear of a failure too (see relay).
	tookOverFrom string
	// movedAt is when the watch last moved to another node (a cluster's
	// slot changed hands): lookups come often for a while after.
	movedAt time.Time
	own     bool // the lock is the flight's own (external-producer mode)
	// started is set once the flight called its start function: its token
	// is out, and a producer may answer under it, late.
	started bool
	// late is its earlier producer's failure or "not found" event, heard
	// while the flight waited on another holder: acted on if the flight
	// takes the lock again, before it calls start again ([E1]).
	late string

	notif, events string // the flight's channels, once channels has made them

	served Served // how the value came, for the flight's callers
	// resurrected is set when the value looked up is a stale copy put
	// back after a failed fetch.
	resurrected bool
	// valueTTL is the time the value looked up has left, when the lookup
	// brought it (hasTTL): with an L1.
	valueTTL time.Duration
	hasTTL   bool
	// refresh is set when the lookup took the lock to refresh the value
	// it found: the flight refreshes once its callers have the value.
	refresh bool
	// notFound is set when the lookup found a cached "not found", with
	// notFoundTTL left, for the L1.
	notFound    bool
	notFoundTTL time.Duration
	// maybeLocked is set when a lookup failed after it may have taken the
	// lock: end releases the flight's token.
	maybeLocked bool
	// after, if set, is run by end: work that can wait until the callers
	// have their answer.
	after func()
	// inline is set while the flight's leader pursues on its own goroutine
	// (see pursueHere): the pursuit stops before it calls back into the
	// user's code.
	inline bool
}

// pursue looks the value up until it has it, computes it, or fails,
// starting from the outcome of the flight's first lookup.
func (p *pursuit) pursue(a attempt) ([]byte, error) {
	val, err, _ := p.pursueFrom(&a)
	return val, err
}

// pursueFrom is pursue, from *a. An inline pursuit (see pursueHere) stops
// before an outcome that calls back into the user's code, which it leaves
// in *a, and reports rest: the leader must not wait for a callback, which
// Close waits for, but need not.
func (p *pursuit) pursueFrom(a *attempt) (val []byte, err error, rest bool) {
	e, f := p.e, p.f
	for {
		if p.inline && p.callsBack(a) {
			return nil, nil, true
		}
		if a.err != nil {
			p.maybeLocked = p.maybeLocked || a.sent
			p.served = ServedComputed // if FailOpen computes
			val, err = e.lookupFailed(f, a.err)
			return val, err, false
		}
		r := a.r
		switch {
		case r.Kind == wire.Hit || r.Kind == wire.Refresh:
			val, err = p.found(r)
			return val, err, false
		case r.Kind == wire.NotFound:
			p.served = ServedRedis
			if p.waited {
				p.served = ServedWaited
			}
			p.notFound, p.notFoundTTL = true, r.PTTL
			if p.own {
				// External mode: its own lock goes before the callers
				// have their answer, with no linger ([L4]).
				p.release(wire.AbandonEvent(f.token))
			}
			return nil, e.notFoundErr(f.id), false
		case r.Kind == wire.Locked && f.start == nil:
			n, pttl, decided := p.heard(r.PTTL)
			if decided {
				return n.val, n.err, false
			}
			val, err = p.compute(pttl)
			return val, err, false
		case r.Kind == wire.Locked && p.own && r.PTTL >= 0:
			// External-producer mode: the lock we took is still ours, and
			// the producer still at work, unless it said otherwise in a
			// read that sent the flight to look ([E1a]).
			if late := p.late; late != "" {
				p.late = ""
				if n, decided := p.ownLateEnd(late); decided {
					return n.val, n.err, false
				}
			}
			r = wire.Reply{Kind: wire.Busy, PTTL: r.PTTL, Holder: f.token}
		case r.Kind == wire.Locked:
			won := time.Now() // about when Redis took the lock
			left := e.cfg.LockTTL
			if r.PTTL >= 0 {
				// Found already ours (a retried lookup whose first reply
				// was lost): the lock has what the reply says left.
				left = r.PTTL
			}
			if n, _, decided := p.heard(r.PTTL); decided {
				return n.val, n.err, false
			}
			if n, decided := p.startExternal(); decided {
				return n.val, n.err, false
			}
			// Its timer runs from what is left of the lock: the takeover
			// check, going live and start took some of it ([E1]).
			r = wire.Reply{Kind: wire.Busy, PTTL: max(left-time.Since(won), 0), Holder: f.token}
		}
		n := p.wait(r)
		if !n.again {
			return n.val, n.err, false
		}
		*a = e.lookup(p.ctx, f)
	}
}

// callsBack reports whether pursuing a calls back into the user's code
// next: a fetch or start under the lock a took, a fetch without one under
// FailOpen, or OnWait for a new holder to wait on.
func (p *pursuit) callsBack(a *attempt) bool {
	if a.err != nil {
		return p.e.cfg.FailOpen && p.f.fetch != nil && isOutage(a.err)
	}
	switch a.r.Kind {
	case wire.Hit, wire.Refresh, wire.NotFound:
		return false
	case wire.Locked:
		return true
	}
	return p.e.cfg.OnWait != nil && a.r.Holder != p.holder && a.r.Holder != p.f.token
}

// found ends the pursuit with a value found in Redis.
func (p *pursuit) found(r wire.Reply) ([]byte, error) {
	p.resurrected = r.Resurrected
	p.valueTTL, p.hasTTL = r.ValueTTL, r.HasTTL
	p.refresh = r.Kind == wire.Refresh
	n := p.value(r.Value)
	return n.val, n.err
}

// compute runs fetch under the lock the flight just took (pttl is the
// lock's remaining time when it was found already ours, else negative).
func (p *pursuit) compute(pttl time.Duration) ([]byte, error) {
	p.e.flights.offer(p.f, nil) // ours to compute now: a copy seen before may be gone
	p.takeover()
	p.recordWait(gotNothing)
	p.end() // our own value needs no notification
	p.served = ServedComputed
	return p.e.hold(p, pttl)
}

// startExternal starts the external work under the lock the flight took,
// or took again after it expired, unless nobody wants it any more; the
// flight then waits for the value like any waiter, holding its lock. It
// reports decided when the flight ended before the work started, or
// because it could not start.
func (p *pursuit) startExternal() (next, bool) {
	e, f := p.e, p.f
	p.own = true // from here on, end releases it
	if late := p.late; late != "" {
		p.late = ""
		if n, decided := p.ownLateEnd(late); decided {
			return n, true
		}
	}
	if e.flights.retire(f) {
		return next{err: errAbandoned}, true
	}
	p.takeover()
	if n, decided := p.goLive(); decided {
		return n, true
	}
	if e.flights.retire(f) {
		return next{err: errAbandoned}, true
	}
	// The wait got nothing after all: the work starts (again). Until now
	// a value, or its producer's word, could still end it.
	p.recordWait(gotNothing)
	p.started = true
	if err := e.startExternal(p); err != nil {
		p.own = false // startExternal released it
		return next{err: err}, true
	}
	return next{}, false
}

// goLive subscribes before the external work starts, and waits until the
// subscription is live (PROTOCOL.md [E1]): the producer may publish its
// value or its failure the moment it is started, and what is published
// before a subscription takes effect is lost. A flight that waited before
// it took the lock over is usually live already. The wait is bounded by a
// third of the lock TTL: past it, the work starts anyway, and the wait
// after it looks again once live. It reports decided, with the flight's
// answer, when something ended the flight first: a value published
// meanwhile, a refused subscription, Close, or, for a flight that took its
// own expired lock again, its earlier producer's late failure or "not
// found". The lock is the flight's own: end releases it, and value and
// onFail release it for a value and a failure.
func (p *pursuit) goLive() (next, bool) {
	e, f := p.e, p.f
	notif, events := p.channels()
	bound := time.NewTimer(e.cfg.LockTTL / 3)
	defer bound.Stop()
	var again <-chan time.Time // after a move: when to watch again
	if since := time.Since(p.movedAt); p.watch == nil && since < lookAfterMove {
		// The takeover check's watch moved a moment ago: the router
		// would name the old node again.
		again = time.After(min(lookAfterMove-since, e.cfg.LockTTL/3))
	}
	for {
		if p.watch == nil && again == nil {
			// No fast path: a value must release the lock first (see busy).
			p.watch = e.subs.Watch(nil, notif, events)
		}
		var signal <-chan struct{}
		if p.watch != nil {
			signal = p.watch.Signal()
		}
		if p.live && p.watch != nil {
			// Live: what the subscription has delivered already is read
			// before start ([E1a]), and then the work starts.
			select {
			case <-signal:
				if n, decided := p.beforeStart(p.watch.Take(), notif, &again); decided {
					return n, true
				}
				continue
			default:
				return next{}, false
			}
		}
		select {
		case <-signal:
			if n, decided := p.beforeStart(p.watch.Take(), notif, &again); decided {
				return n, true
			}
		case <-again:
			again = nil
		case <-bound.C:
			return next{}, false
		case <-f.ctx.Done():
			return next{err: e.ended()}, true
		case <-f.done:
			return p.onFinished(), true
		}
	}
}

// beforeStart reads what the subscription delivered while the flight gets
// live before it calls start: decided, with the flight's answer, when that
// ends the flight (see goLive). After a move it drops the watch, and sets
// again to when to watch again.
func (p *pursuit) beforeStart(ev pubsub.Events, notif string, again *<-chan time.Time) (next, bool) {
	e, f := p.e, p.f
	switch {
	case ev.Closed:
		return next{err: ErrClosed}, true
	case ev.Err != nil:
		return next{err: fmt.Errorf("%w: subscribing to %s: %w", ErrRedis, wire.Quote(notif), ev.Err)}, true
	}
	for _, m := range ev.Messages {
		if m.Channel == notif {
			// A value: no work was started this time. After a start, most
			// likely that work's, as in the wait.
			p.served = ServedWaited
			if p.started {
				p.served = ServedComputed
			}
			e.stats.wakeups.Add(1)
			e.releaseDone(f)
			p.own = false
			return next{val: []byte(m.Payload)}, true
		}
		if n, ok := p.ownLateEnd(m.Payload); ok {
			return n, true
		}
	}
	if ev.Moved {
		// The slot moved: watch where it is now, once go-redis has had a
		// moment to learn the new map (at once, the router would name the
		// old node again).
		p.unwatch()
		p.movedAt = time.Now()
		*again = time.After(min(lookAfterMove, e.cfg.LockTTL/3))
		return next{}, false
	}
	if ev.Reread {
		p.live = true
	}
	return next{}, false
}

// ownLateEnd acts on its earlier producer's late word (PROTOCOL.md [E1a]):
// a failure or "not found" under the flight's own token, heard after its
// lock expired, acted on while the flight holds its lock again before it
// calls start again (or finds its lock still its own). The flight ends as
// the word says, and the lock goes with the word published again under the
// flight's token: waiters elsewhere may have been waiting on another holder
// when the producer published it, and those that found the lock under this
// token since wait on it. Having taken the lock over from another holder,
// it says it under that holder's token too, as relay does for a failed
// start. Before the first start nobody has the token; other events are not
// the flight's business before start.
func (p *pursuit) ownLateEnd(payload string) (next, bool) {
	if !p.started {
		return next{}, false
	}
	e, f := p.e, p.f
	kind, token, text := wire.ParseEvent(payload)
	if token != f.token {
		return next{}, false
	}
	var event func(token string) string
	switch kind {
	case wire.EventFail:
		event = func(token string) string { return wire.FailText(token, text) }
	case wire.EventNotFound:
		event = wire.NotFoundEvent
	default:
		return next{}, false
	}
	p.release(event(f.token))
	if h := p.previousHolder(); h != "" {
		e.publish(f, event(h))
	}
	if kind == wire.EventFail {
		return p.onFail(text), true // the lock is gone: onFail releases nothing
	}
	p.served = ServedComputed // the answer of the work it started
	return next{err: e.notFoundErr(f.id)}, true
}

// previousHolder is the holder whose lock the flight took over after
// waiting on it, whose waiters ownLateEnd tells too: the other holder last
// waited on, whose lock it just took (takeover having run or not), or, once
// a lookup found the lock still its own (the holder is then its own
// token), the one it took over from (none: "").
func (p *pursuit) previousHolder() string {
	if p.waited && p.holder != "" && p.holder != p.f.token {
		return p.holder
	}
	return p.tookOverFrom
}

// keepLate keeps, for ownLateEnd, the first failure or "not found" that the
// flight's earlier producer published under the flight's token, heard
// where the flight does not act on it at once: while it waits on another
// holder, or in the takeover check, where a value read after it still
// decides first.
func (p *pursuit) keepLate(payload string) {
	if !p.started || p.late != "" {
		return
	}
	switch kind, token, _ := wire.ParseEvent(payload); {
	case token != p.f.token:
	case kind == wire.EventFail, kind == wire.EventNotFound:
		p.late = payload
	}
}

// lookupFailed ends a flight whose lookup failed.
func (e *Engine) lookupFailed(f *flight, err error) ([]byte, error) {
	if f.ctx != nil && f.ctx.Err() != nil {
		return nil, e.ended()
	}
	if e.cfg.FailOpen && f.fetch != nil && isOutage(err) && e.flights.hold(f, &e.callbacks.pending) {
		e.stats.failOpen.Add(1)
		return e.computeUnlocked(f)
	}
	return nil, err
}

// channels returns the flight's value and events channels, made once for
// all of the pursuit's waits. Only the flight's goroutine calls it.
func (p *pursuit) channels() (notif, events string) {
	if p.notif == "" {
		p.notif, p.events = p.e.keys.Notif(p.f.key), p.e.keys.Events(p.f.key)
	}
	return p.notif, p.events
}
