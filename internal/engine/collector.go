package engine

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/memolock/memolock/internal/wire"
)

// startMembers starts or joins the flights of the items at places, whose
// fetches go through the call's collector.
func (ms *misses) startMembers(places []int) {
	// Counted as pending while members start, so that a member that wins
	// and reaches fetch at once does not run a batch of its own before the
	// others have even looked.
	ms.col.add()
	for _, i := range places {
		f, err := ms.e.startMember(ms.ctx, ms.items[i], ms.col)
		if f == nil {
			ms.items[i].Err = err
			ms.e.stats.answered(0, err) // no flight to count it
			continue
		}
		ms.flights = append(ms.flights, memberFlight{place: i, f: f})
	}
	ms.col.started()
}

// startMember starts or joins the flight for it. A flight it starts
// fetches through col, and tells col what its first lookup found, so that
// col knows which of its flights will enter fetch soon.
func (e *Engine) startMember(ctx context.Context, it Item, col *collector) (*flight, error) {
	m := &member{col: col, id: it.ID, run: make(chan []*member, 1), answer: make(chan memberAnswer, 1)}
	cl := callSpan{ctx: ctx}
	return e.join(&cl, &flightSpec{id: it.ID, key: it.Key, kind: forMember, fetch: FetchFunc(m.fetch), member: m})
}

// A collector gathers the fetches of the flights that one GetMany call
// started, and runs its batch function for them together. It waits for
// nothing but those flights' first lookups and the fetches of the flights
// that won their locks, neither of which waits on anyone: a batch never
// waits for a flight that waits for another holder, which might itself be
// waiting in a batch for one of ours. A flight that wins its lock later
// joins a later batch.
//
// The member whose fetch heads a batch runs it, through the engine's
// callback runner, so that however the batch function ends (a return, a
// panic, runtime.Goexit), every member of the batch gets an answer.
type collector struct {
	e     *Engine
	batch BatchFunc

	mu      sync.Mutex
	pending int       // members looking up, or won and not yet in fetch
	queue   []*member // members in fetch, waiting for a batch
	running bool      // a batch is running
}

// A member is one flight that a collector serves.
type member struct {
	col    *collector
	id     string
	f      *flight           // its flight, from launched on
	run    chan []*member    // capacity 1: run the batch for these members
	answer chan memberAnswer // capacity 1: this member's answer

	// Guarded by col.mu.
	state memberState
	ctx   context.Context // its fetch's, once in fetch
}

// memberState is where a member stands with its collector.
type memberState uint8

const (
	memberLooking  memberState = iota // its first lookup is under way
	memberWon                         // it won the lock: fetch is due
	memberAway                        // another holder computes, or it failed
	memberFetching                    // in fetch, queued or in a batch
	memberSettled                     // its flight ended without fetching
)

func (col *collector) add() {
	col.mu.Lock()
	defer col.mu.Unlock()
	col.pending++
}

// started ends the count that add made while members were starting.
func (col *collector) started() {
	col.mu.Lock()
	defer col.mu.Unlock()
	col.pending--
	col.startLocked()
}

// launched counts a member as pending until its first lookup answers.
func (m *member) launched(f *flight) {
	m.f = f
	m.col.add()
}

// looked records the outcome of a member's first lookup.
func (m *member) looked(won bool) {
	col := m.col
	col.mu.Lock()
	defer col.mu.Unlock()
	if m.state != memberLooking {
		return
	}
	if won {
		m.state = memberWon
		return
	}
	m.state = memberAway
	col.pending--
	col.startLocked()
}

// settled records that a member's flight has ended.
func (m *member) settled() {
	col := m.col
	col.mu.Lock()
	defer col.mu.Unlock()
	switch m.state {
	case memberWon:
		col.pending--
	case memberFetching, memberSettled:
		return
	}
	m.state = memberSettled
	col.startLocked()
}

// enter queues a member whose fetch was called.
func (col *collector) enter(m *member, ctx context.Context) {
	col.mu.Lock()
	defer col.mu.Unlock()
	if m.state == memberWon {
		col.pending--
	}
	m.state, m.ctx = memberFetching, ctx
	col.queue = append(col.queue, m)
	col.startLocked()
}

// startLocked hands the queue to its first member to run as a batch, if no
// batch runs and no member is still due.
func (col *collector) startLocked() {
	if col.running || col.pending > 0 || len(col.queue) == 0 {
		return
	}
	col.running = true
	round := col.queue
	col.queue = nil
	round[0].run <- round // never blocks: a member heads one batch at most
}

// fetch is a member flight's FetchFunc: it waits in the collector for its
// answer, and runs the batch if it heads one.
func (m *member) fetch(ctx context.Context, _ *wire.Lease) ([]byte, time.Duration, error) {
	m.col.enter(m, ctx)
	for {
		select {
		case round := <-m.run:
			m.col.runBatch(round)
		case a := <-m.answer:
			// Tamed here, on this member's own callback goroutine: the
			// error's methods are user code, and must not run in runBatch's
			// loop, which answers the other members.
			return a.Value, a.TTL, a.tames.tame(a.Err)
		}
	}
}

// runBatch runs the batch function for round and answers each member, then
// starts the next batch if one is due.
func (col *collector) runBatch(round []*member) {
	ids := make([]string, len(round))
	flights := make([]*flight, len(round)) // the batch serves them: see reentered
	for i, m := range round {
		ids[i], flights[i] = m.id, m.f
	}
	// The batch serves its members: it ends when all of their fetch
	// contexts have (Close, or each one's time limit).
	ctx, cancel := context.WithCancel(context.WithoutCancel(round[0].ctx))
	defer cancel()
	left := int64(len(round))
	for _, m := range round {
		stop := context.AfterFunc(m.ctx, func() {
			if atomic.AddInt64(&left, -1) == 0 {
				cancel()
			}
		})
		defer stop()
	}
	res := result[map[string]BatchValue]{err: ErrClosed}
	if col.e.flights.admit(&col.e.callbacks.pending) {
		res = <-invoke(&col.e.callbacks, "batch fetch", flights, func() (map[string]BatchValue, error) { return col.batch(ctx, ids) })
	}
	tames := &sharedTames{}
	for _, m := range round {
		a, ok := res.val[m.id]
		switch {
		case res.err != nil:
			a = BatchValue{Err: res.err}
		case !ok:
			a = BatchValue{Err: fmt.Errorf("%w: batch fetch returned no value for id %s; answer every id it is given, with Err set to fail one", ErrInvalid, wire.Quote(m.id))}
		}
		m.answer <- memberAnswer{a, tames}
	}
	col.mu.Lock()
	defer col.mu.Unlock()
	col.running = false
	col.startLocked()
}

// memberAnswer is what a batch gives one of its members.
type memberAnswer struct {
	BatchValue
	tames *sharedTames // the batch's: see sharedTames
}

// sharedTames tames the errors that one batch gives its members, for
// each member's callback goroutine, and asks an error that the batch gave
// several ids only once, as tame asks a fetch's error once: the first
// member to take it has it tamed, and the others wait for that and get the
// same answer. Errors are matched with ==, as map keys, which asks nothing
// of them; one whose value cannot be a key (a struct holding a slice) is
// tamed for each member that takes it.
type sharedTames struct {
	mu sync.Mutex
	m  map[error]*sharedTame
}

type sharedTame struct {
	done chan struct{} // closed once err is set
	err  error
}

func (s *sharedTames) tame(err error) error {
	if err == nil {
		return nil
	}
	t, first, ok := s.entry(err)
	if !ok {
		return tame("batch fetch", err)
	}
	if first {
		// On a goroutine of its own, which the member waits for: if the
		// error's methods end the goroutine that asks them
		// (runtime.Goexit), every member of the error gets the same
		// answer, as a Get's caller would (see invoke).
		t.err = &panickedError{text: fmt.Sprintf("memolock: batch fetch returned an error of type %T whose methods call runtime.Goexit", err)}
		go func() {
			defer close(t.done)
			t.err = tame("batch fetch", err)
		}()
	}
	<-t.done
	return t.err
}

// entry returns err's entry, made if it is the first to take err; ok is
// false if err cannot be a map key.
func (s *sharedTames) entry(err error) (t *sharedTame, first, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	defer func() {
		if recover() != nil { // hashing an unhashable value panics before the map changes
			t, first, ok = nil, false, false
		}
	}()
	if t = s.m[err]; t != nil {
		return t, false, true
	}
	if s.m == nil {
		s.m = make(map[error]*sharedTame)
	}
	t = &sharedTame{done: make(chan struct{})}
	s.m[err] = t
	return t, true, true
}
