package engine

import (
	"context"
	"sync"
)

// A group holds the flights of one engine: the coalescing layer, which
// knows nothing of Redis. Its mutex guards every flight's membership (its
// callers, its phase, the stale copy offered to callers who leave); the
// rest of a flight's state belongs to the flight's own goroutine.
type group struct {
	mu       sync.Mutex
	closed   bool
	keys     map[string]keyState  // by key: its joinable flight, and its wake-ups (see keyState)
	joinable int                  // the keys with a flight
	detached map[*flight]struct{} // running, but no longer joined: see detach
	// coalesced is counted under mu, which every join takes anyway.
	coalesced int64
	// answers counts the answers that finish gives, before the callers
	// can see them (a caller may read the counters as soon as it wakes).
	answers *counters
}

// A keyState is what the group knows of one key, in one map, so that a
// call finds both in one lookup: the flight that new callers of the key
// join (nil: none), and the flights of the key that left it and are
// waking their callers (see settle). wakers is a channel that the first
// caller to wait for the key's wake-ups makes, and that is closed when
// they are over (or at close): a key's wake-up ending wakes no other
// key's callers, and one with nobody waiting allocates nothing. A key
// with none of the three has no entry.
type keyState struct {
	f      *flight
	waking int
	wakers chan struct{}
}

// put stores s as key's state, or forgets the key if s holds nothing.
// Under mu.
func (g *group) put(key string, s keyState) {
	if s.f == nil && s.waking == 0 && s.wakers == nil {
		delete(g.keys, key)
		return
	}
	if g.keys == nil {
		g.keys = make(map[string]keyState)
	}
	g.keys[key] = s
}

// find joins the flight for key, if one is running; otherwise it only
// counts the call. It fails once the group is closed.
func (g *group) find(key string) (*flight, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	s := g.keys[key]
	if s.waking > 0 {
		s = g.awaitWoken(key)
	}
	if g.closed {
		return nil, ErrClosed
	}
	if f := s.f; f != nil {
		f.refs++
		g.coalesced++
		return f, nil
	}
	return nil, nil
}

// awaitWoken waits, under mu, until no flight for key is waking its
// callers, or the group is closed, and returns the key's state then. A
// caller who answers again at once then starts the key's next flight
// only once the callers it answered with are all runnable, and they can
// join it.
func (g *group) awaitWoken(key string) keyState {
	for {
		s := g.keys[key]
		if s.waking <= 0 || g.closed {
			return s
		}
		if s.wakers == nil {
			s.wakers = make(chan struct{})
			g.keys[key] = s
		}
		g.mu.Unlock()
		<-s.wakers
		g.mu.Lock()
	}
}

// woke counts one flight of key less waking its callers, and wakes those
// who wait for the key once none is. Under mu.
func (g *group) woke(key string) {
	s := g.keys[key]
	if s.waking--; s.waking == 0 && s.wakers != nil {
		close(s.wakers)
		s.wakers = nil
	}
	g.put(key, s)
}

// lead makes f, built outside the lock, the flight for its key, and
// reports true; or, if another caller made one meanwhile, joins that one
// and returns it. When it makes f the flight, it adds one to w, for f's
// work, which Close waits for.
func (g *group) lead(f *flight, w *work) (*flight, bool, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	s := g.awaitWoken(f.key)
	if g.closed {
		return nil, false, ErrClosed
	}
	if other := s.f; other != nil {
		other.refs++
		g.coalesced++
		return other, false, nil
	}
	f.refs = 1
	s.f = f
	g.put(f.key, s)
	g.joinable++
	w.add() // under mu: Close waits for work only after closing the group
	return f, true, nil
}

// launch gives f the context its work runs under: ctx's values, without its
// deadline or cancellation, since the work serves every caller (and waiters
// in other processes).
func (g *group) launch(f *flight, ctx context.Context) {
	fctx, stop := context.WithCancel(context.WithoutCancel(ctx)) // outside the lock
	g.mu.Lock()
	f.ctx, f.stop = fctx, stop
	ended := g.closed || f.phase == abandoned
	g.mu.Unlock()
	if ended {
		stop()
	}
}

// leave drops one caller, and returns the stale copy it may serve. A
// flight that is looking and has no caller left is abandoned: new callers
// start a new one. It reports false if the flight finished first: the
// caller then takes its answer.
func (g *group) leave(f *flight) ([]byte, bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if f.phase == finished {
		return nil, false
	}
	f.refs--
	if f.refs == 0 && f.phase == looking {
		f.phase = abandoned
		g.drop(f)
		if f.stop != nil {
			f.stop()
		}
	}
	return f.fallback, true
}

// offer sets the stale copy that callers who give up waiting get (nil:
// none).
func (g *group) offer(f *flight, copy []byte) {
	g.mu.Lock()
	defer g.mu.Unlock()
	f.fallback = copy
}

// hold moves f to holding, and adds one to w for the user function the
// flight is about to run. It reports false if every caller left, or Close
// began, before that.
func (g *group) hold(f *flight, w *work) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed || (f.phase != looking && f.phase != holding) {
		return false
	}
	f.phase = holding
	w.add() // under mu: Close waits for callbacks only after closing the group
	return true
}

// retire ends a holding flight that no caller waits for: it reports true,
// and no new caller joins it, if f has no callers, or if Close finished it
// already (a holding flight outlives its callers, and Close finishes every
// flight it finds), whose answer must not be given twice.
func (g *group) retire(f *flight) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if f.phase == finished {
		return true // Close finished it meanwhile: it ends, and finishes nothing again
	}
	if f.refs > 0 {
		return false
	}
	f.phase = abandoned
	g.drop(f)
	return true
}

// finish hands the flight's answer to its callers. Only the first call
// counts (Close finishes flights early with ErrClosed); it returns the
// number of callers it answered, or -1 if it was not the first.
func (g *group) finish(f *flight, a answer) int { return g.settle(f, a, false) }

// deliver finishes f with a value pushed by its holder, unless f has moved
// on: a flight that holds the lock, computing or waiting for its external
// producer, is finished by its own goroutine alone.
func (g *group) deliver(f *flight, a answer) int { return g.settle(f, a, true) }

// settle answers f's callers, unless f finished already. It wakes them
// after letting go of the group's mutex, which every key's callers take.
// A flight with two callers or more, when no other flight of its key is
// joinable (it was the key's, or it was sealed or detached and none has
// started since), counts in waking meanwhile: a caller of the key waits
// until they are all woken (see awaitWoken). Otherwise a caller woken
// first, which calls again at once, led the key's next flight alone
// whenever the thread waking the others lost its core midway: on a hot
// key over 4 processes, 5.6% of memolock's flights served one caller
// (2.0% of singleflight's, which wakes its callers under its mutex), and
// it sent 3-4% more GETs per call (see bench/README.md, "Why memolock's
// hot key sent more GETs").
func (g *group) settle(f *flight, a answer, onlyLooking bool) int {
	g.mu.Lock()
	if f.phase == finished || (onlyLooking && f.phase != looking) {
		g.mu.Unlock()
		return -1
	}
	f.phase = finished
	callers := f.refs
	delete(g.detached, f)
	s := g.keys[f.key]
	if s.f == f {
		s.f = nil
		g.joinable--
	}
	held := callers > 1 && s.f == nil // else its callers join the key's flight
	if held {
		s.waking++
	}
	g.put(f.key, s)
	if held {
		defer func() { // after close(f.done), even if outcomeOf panics
			g.mu.Lock()
			g.woke(f.key)
			g.mu.Unlock()
		}()
	}
	g.mu.Unlock()
	defer close(f.done) // the callers are not left waiting if outcomeOf panics
	f.val, f.err, f.revealed, f.served = a.val, a.err, reveal(a.err), a.served
	if callers > 0 && g.answers != nil {
		served, o := outcomeOf(a.served, a.err) // a callback's error is its calledError here (see tame)
		g.answers.answers[served][o].Add(int64(callers))
	}
	return callers
}

// close closes the group and returns the flights in it. It reports false
// if the group was closed already.
func (g *group) close() ([]*flight, bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return nil, false
	}
	g.closed = true
	flights := make([]*flight, 0, g.joinable+len(g.detached))
	for key, s := range g.keys {
		if s.wakers != nil { // callers waiting for a flight to wake its own: closed
			close(s.wakers)
			s.wakers = nil
			g.put(key, s)
		}
		if s.f != nil {
			flights = append(flights, s.f)
		}
	}
	for f := range g.detached {
		flights = append(flights, f)
	}
	for _, f := range flights {
		if f.stop != nil {
			f.stop() // a flight launched after close is cancelled by launch
		}
	}
	return flights, true
}

// background registers f, a flight that serves no caller and that no caller
// joins, holding the lock it took: it runs under ctx's values, Close
// cancels it, and it adds one to w for its goroutine and one to callbacks
// for the user function it runs. It reports false once the group is closed.
func (g *group) background(f *flight, ctx context.Context, w, callbacks *work) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	f.ctx, f.stop = context.WithCancel(context.WithoutCancel(ctx))
	if g.closed {
		return false
	}
	f.phase = holding
	g.markDetached(f)
	w.add()
	callbacks.add()
	return true
}

// admit adds one to w, for work that Close waits for, unless the group is
// closed.
func (g *group) admit(w *work) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return false
	}
	w.add()
	return true
}

// drop forgets f, which is ending. Called under mu.
func (g *group) drop(f *flight) {
	g.unjoin(f)
	delete(g.detached, f)
}

// unjoin makes f, if it is its key's flight, one that no new caller
// joins. It reports false if f was not its key's flight. Under mu.
func (g *group) unjoin(f *flight) bool {
	s, ok := g.keys[f.key]
	if !ok || s.f != f {
		return false
	}
	s.f = nil
	g.joinable--
	g.put(f.key, s)
	return true
}

// markDetached adds f to the flights that run but are no longer joined.
// Under mu.
func (g *group) markDetached(f *flight) {
	if g.detached == nil {
		g.detached = make(map[*flight]struct{})
	}
	g.detached[f] = struct{}{}
}

// detach makes the flight for key, if any, one that new callers no longer
// join: it goes on for the callers it has, and the next caller starts a new
// flight. Delete and Set detach the flights of what they change, so that
// this process never hands out a value computed before them. An empty key
// detaches every flight (Purge).
func (g *group) detach(key string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	detach := func(f *flight) {
		if f != nil && g.unjoin(f) {
			f.fallback = nil // the copy may be deleted too
			g.markDetached(f)
		}
	}
	if key != "" {
		detach(g.keys[key].f)
	} else {
		for _, s := range g.keys {
			detach(s.f)
		}
	}
	// A flight detached or sealed before may still answer its callers
	// with a stale copy (a sealed one hears its holder's failure, then
	// releases its lock): the copy may be deleted too.
	for f := range g.detached {
		if key == "" || f.key == key {
			f.fallback = nil
		}
	}
}

// seal makes f, whose fetch has returned, a flight that new callers no
// longer join; it goes on for the callers it has. What fetch computed is
// not yet in Redis, and its store may take long (a master that just died
// holds it through go-redis's dial retries): a write elsewhere may land
// meanwhile, and a caller who begins after it must not get the older
// computation. The same holds for a fetch that failed: the release that
// tells waiters, or the resurrection of a stale copy, may take as long,
// and a caller who begins after a write must not get the failure, or the
// stale copy. So a caller who begins once the computation has ended
// looks afresh, as with singleflight, whose result goes only to the calls
// made while it ran. Such a caller finds the value stored, or the lock
// still held and the value on its way, or whatever was written since.
func (g *group) seal(f *flight) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.unjoin(f) { // else finished, or detached already
		g.markDetached(f)
	}
}

// counts returns the coalesced calls so far, and the flights in progress.
func (g *group) counts() (coalesced int64, running int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.coalesced, g.joinable + len(g.detached)
}

// fallbackOf returns the stale copy offered to f's callers, if any.
func (g *group) fallbackOf(f *flight) []byte {
	g.mu.Lock()
	defer g.mu.Unlock()
	return f.fallback
}
