package memolock

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"go.opentelemetry.io/otel/trace"
)

// A flight is one process's pursuit of one value. Every caller of Get for
// that id in this process shares it, as with x/sync/singleflight: N callers
// cost what one costs.
type flight struct {
	id    string     // as the caller gave it
	key   string     // as sent to Redis (hashed with Options.HashIDs)
	token string     // the lock token of every attempt this flight makes
	span  trace.Span // the leader's Get span; nil for GetMany's batches and refreshes
	// claim is the span token names, when the leader's Get is traced:
	// started before the first lookup, it becomes the fetch span if the
	// flight computes, or ends as "memolock.lookup" (see claimSpan). Only
	// the flight's own goroutine touches it.
	claim trace.Span
	fetch FetchFunc
	start StartFunc // external-producer mode when set

	ctx    context.Context    // set by launch: the first caller's values, no deadline
	stop   context.CancelFunc // cancels ctx
	done   chan struct{}      // closed by finish
	val    []byte
	err    error
	served Served // how val came, set by finish
	l1     l1Snap // the L1's invalidations before the first lookup
	// batched is set for GetMany's flights, whose fetch serves a batch.
	batched bool
	// refreshing is set for a flight that refreshes a value ahead of its
	// expiry, in the background, for no caller.
	refreshing bool
	// stale is the stale copy of the value that a busy reply carried
	// (Options.StaleTTL), for callers that give up waiting.
	stale atomic.Pointer[[]byte]

	// Guarded by group.mu.
	refs  int
	state flightState
}

// flightState is where a flight stands with its callers.
type flightState uint8

const (
	// looking up the value or waiting for another holder: the flight ends
	// when its last caller leaves.
	looking flightState = iota
	// holding the lock (computing, or waiting for an external producer), or
	// computing without one under FailOpen: others, perhaps in other
	// processes, wait for this flight, so it outlives its callers.
	holding
	// abandoned by every caller while looking: its ctx is cancelled.
	abandoned
	// finished: done is closed and val, err are set.
	finished
)

// errAbandoned ends a flight that every caller left; nobody reads it.
var errAbandoned = errors.New("memolock: flight abandoned")

// A group holds the flights of one Client: the coalescing layer, which
// knows nothing of Redis.
type group struct {
	mu        sync.Mutex
	closed    bool
	flights   map[string]*flight
	detached  map[*flight]struct{} // running, but no longer joined: see detach
	gets      int64                // counted under mu, which every call takes anyway
	coalesced int64
	stale     *atomic.Int64 // Stats.Stale, for callers that give up and get a stale copy
	// calls, if set, counts every caller's answer: those still joined
	// when a flight finishes at once, in finish (a thousand callers woken
	// together must not contend on one counter), and those that leave
	// early in await.
	calls *counters
}

// join adds a caller to the flight for key, making one with mk if none is
// running, which the caller then leads. It fails once the group is closed.
// When it makes a flight it also adds one to wg, for the flight's work.
func (g *group) join(key string, mk func() *flight, wg *sync.WaitGroup) (f *flight, leader bool, err error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.gets++
	if g.closed {
		return nil, false, ErrClosed
	}
	if f := g.flights[key]; f != nil {
		f.refs++
		g.coalesced++
		return f, false, nil
	}
	if g.flights == nil {
		g.flights = make(map[string]*flight)
	}
	f = mk()
	f.refs = 1
	g.flights[key] = f
	wg.Add(1) // under mu: Close waits on wg only after closing the group
	return f, true, nil
}

// running returns the number of flights in progress, joined or detached.
func (g *group) running() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.flights) + len(g.detached)
}

// launch gives f the context its work runs under: ctx's values, without its
// deadline or cancellation, since the work serves every caller (and waiters
// in other processes).
func (g *group) launch(f *flight, ctx context.Context) {
	g.mu.Lock()
	defer g.mu.Unlock()
	f.ctx, f.stop = context.WithCancel(context.WithoutCancel(ctx))
	if g.closed || f.state == abandoned {
		f.stop()
	}
}

// await waits for f on behalf of one caller. A caller that gives up
// waiting gets the stale copy of the value, if the flight has one.
func (g *group) await(ctx context.Context, f *flight) ([]byte, Served, error) {
	cancelled := ctx.Done()
	if cancelled == nil {
		<-f.done // a plain receive: many callers of a hot key contend less
		return f.val, f.served, f.err
	}
	select {
	case <-f.done:
		return f.val, f.served, f.err
	case <-cancelled:
		if !g.leave(f) {
			// Finished meanwhile, and counted with this caller.
			<-f.done
			return f.val, f.served, f.err
		}
		if s := f.stale.Load(); s != nil {
			if g.stale != nil {
				g.stale.Add(1)
			}
			g.count(ServedStale, nil, 1)
			return *s, ServedStale, nil
		}
		err := fmt.Errorf("%w: %w", ErrTimeout, ctx.Err())
		g.count(0, err, 1)
		return nil, 0, err
	}
}

// count counts n callers' answer, if the group counts them.
func (g *group) count(served Served, err error, n int) {
	if g.calls != nil && n > 0 {
		served, o := outcomeOf(served, err)
		g.calls.calls[served][o].Add(int64(n))
	}
}

// leave drops one caller. A flight that is looking and has no caller left
// is abandoned: new callers start a new one. It reports false if the
// flight finished first: the caller then takes its answer.
func (g *group) leave(f *flight) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if f.state == finished {
		return false
	}
	f.refs--
	if f.refs == 0 && f.state == looking {
		f.state = abandoned
		g.drop(f)
		if f.stop != nil {
			f.stop()
		}
	}
	return true
}

// hold moves f to holding, and adds one to callbacks for the user function
// the flight is about to run. It reports false if every caller left, or
// Close began, before that.
func (g *group) hold(f *flight, callbacks *sync.WaitGroup) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed || (f.state != looking && f.state != holding) {
		return false
	}
	f.state = holding
	callbacks.Add(1) // under mu: Close waits on callbacks only after closing the group
	return true
}

// retire ends a holding flight that no caller waits for: it reports true,
// and no new caller joins it, if f has no callers.
func (g *group) retire(f *flight) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if f.refs > 0 {
		return false
	}
	f.state = abandoned
	g.drop(f)
	return true
}

// finish hands the flight's result to its callers. Only the first call
// counts (Close finishes flights early with ErrClosed); it reports whether
// this one did.
func (g *group) finish(f *flight, val []byte, err error, served Served) bool {
	g.mu.Lock()
	if f.state == finished {
		g.mu.Unlock()
		return false
	}
	f.state = finished
	g.drop(f)
	callers := f.refs
	g.mu.Unlock()
	f.val, f.err, f.served = val, err, served
	g.count(served, err, callers)
	close(f.done)
	return true
}

// close closes the group and returns the flights in it, for cancel. It
// reports false if the group was closed already.
func (g *group) close() ([]*flight, bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return nil, false
	}
	g.closed = true
	flights := make([]*flight, 0, len(g.flights)+len(g.detached))
	for _, f := range g.flights {
		flights = append(flights, f)
	}
	for f := range g.detached {
		flights = append(flights, f)
	}
	return flights, true
}

// background starts f, a flight that serves no caller and that no caller
// joins, holding the lock it took: it runs under ctx's values, Close
// cancels it, and it adds one to wg for its goroutine and one to callbacks
// for the user function it runs. It reports false, with f.ctx set but
// nothing added, once the group is closed.
func (g *group) background(f *flight, ctx context.Context, wg, callbacks *sync.WaitGroup) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	f.ctx, f.stop = context.WithCancel(context.WithoutCancel(ctx))
	if g.closed {
		return false
	}
	f.state = holding
	if g.detached == nil {
		g.detached = make(map[*flight]struct{})
	}
	g.detached[f] = struct{}{}
	wg.Add(1)
	callbacks.Add(1)
	return true
}

// track adds one to wg, for work that Close waits for, unless the group is
// closed.
func (g *group) track(wg *sync.WaitGroup) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return false
	}
	wg.Add(1)
	return true
}

// drop forgets f, which is ending. Called under mu.
func (g *group) drop(f *flight) {
	if g.flights[f.key] == f {
		delete(g.flights, f.key)
	}
	delete(g.detached, f)
}

// detach makes the flight for key, if any, one that new callers no longer
// join: it goes on for the callers it has, and the next caller starts a
// new flight. Delete and Set detach the flights of what they change, so
// that this process never hands out a value computed before them. An
// empty key detaches every flight (Purge).
func (g *group) detach(key string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for k, f := range g.flights {
		if key != "" && k != key {
			continue
		}
		delete(g.flights, k)
		f.stale.Store(nil) // the copy may be deleted too
		if g.detached == nil {
			g.detached = make(map[*flight]struct{})
		}
		g.detached[f] = struct{}{}
	}
}

// isClosed reports whether close has been called.
func (g *group) isClosed() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.closed
}

// cancel cancels the contexts of flights, which close returned. A flight
// launched after close is cancelled by launch.
func (g *group) cancel(flights []*flight) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, f := range flights {
		if f.stop != nil {
			f.stop()
		}
	}
}

// counts returns the calls and the coalesced calls so far.
func (g *group) counts() (gets, coalesced int64) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.gets, g.coalesced
}
