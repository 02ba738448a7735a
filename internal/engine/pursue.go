package engine

import (
	"time"

	"context"

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
}

// pursue looks the value up until it has it, computes it, or fails,
// starting from the outcome of the flight's first lookup.
func (p *pursuit) pursue(a attempt) ([]byte, error) {
	e, f := p.e, p.f
	for {
		if a.err != nil {
			p.maybeLocked = p.maybeLocked || a.sent
			p.served = ServedComputed // if FailOpen computes
			return e.lookupFailed(f, a.err)
		}
		r := a.r
		switch {
		case r.Kind == wire.Hit || r.Kind == wire.Refresh:
			return p.found(r)
		case r.Kind == wire.NotFound:
			p.served = ServedRedis
			if p.waited {
				p.served = ServedWaited
			}
			p.notFound, p.notFoundTTL = true, r.PTTL
			return nil, e.notFoundErr(f.id)
		case r.Kind == wire.Locked && f.start == nil:
			n, pttl, decided := p.heard(r.PTTL)
			if decided {
				return n.val, n.err
			}
			return p.compute(pttl)
		case r.Kind == wire.Locked && p.own && r.PTTL >= 0:
			// External-producer mode: the lock we took is still ours, and
			// the producer still at work.
			r = wire.Reply{Kind: wire.Busy, PTTL: r.PTTL, Holder: f.token}
		case r.Kind == wire.Locked:
			if n, _, decided := p.heard(r.PTTL); decided {
				return n.val, n.err
			}
			var err error
			if r, err = p.startExternal(); err != nil {
				return nil, err
			}
		}
		n := p.wait(r)
		if !n.again {
			return n.val, n.err
		}
		a = e.lookup(p.ctx, f)
	}
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
	p.end() // our own value needs no notification
	p.served = ServedComputed
	return p.e.hold(p, pttl)
}

// startExternal starts the external work under the lock the flight took,
// or took again after it expired, unless nobody wants it any more; the
// flight then waits for the value like any waiter, holding its lock.
func (p *pursuit) startExternal() (wire.Reply, error) {
	e, f := p.e, p.f
	if e.flights.retire(f) {
		p.own = true // end releases it
		return wire.Reply{}, errAbandoned
	}
	p.takeover()
	if err := e.startExternal(p); err != nil {
		return wire.Reply{}, err
	}
	return wire.Reply{Kind: wire.Busy, PTTL: e.cfg.LockTTL, Holder: f.token}, nil
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
