package engine

import (
	"context"
	"fmt"
	"sync/atomic"

	"github.com/memolock/memolock/internal/l1"
	"go.opentelemetry.io/otel/trace"
)

// A flight is one process's pursuit of one value. Every caller of Get for
// that id in this process shares it, as with x/sync/singleflight: N callers
// cost what one costs.
//
// Who owns what: the fields set when the flight is made never change; its
// membership (refs, phase, fallback) belongs to the group's mutex; answer is
// written once, by the group's finish, before done is closed; everything
// else a flight knows while it runs (the holder it waits for, its timer and
// subscription, its lock) belongs to its own goroutine, in a pursuit: one
// started for it, or, up to a user callback, its first caller's when that
// caller cannot leave (see Engine.pursueHere).
type flight struct {
	id    string     // as the caller gave it
	key   string     // as sent to Redis (hashed with HashIDs, placed with HashTags)
	token string     // the lock token of every attempt this flight makes: made at its first script (see lookup), or at its start if traced
	kind  flightKind // what the flight is for
	// looked is set by the flight's first lookup: only that one may be a
	// plain GET (see hints.go). Only the lookups touch it.
	looked bool
	// phase is guarded by group.mu; served is set with val and err (see
	// below). Both sit here, beside kind and looked, in what would be
	// padding.
	phase  phase
	served Served
	// inCallback counts the flight's callbacks running now (see
	// Engine.reentered). It sits beside kind and looked, in what would be
	// padding: the flight then fits a 256-byte allocation.
	inCallback atomic.Int32
	fetch      Fetcher
	start      StartFunc  // external-producer mode when set
	span       trace.Span // the leader's Get span; nil when not traced
	// claim is the span token names, when the leader's Get is traced:
	// started before the first lookup, it becomes the fetch span if the
	// flight computes, or ends as "memolock.lookup" (see claimSpan). Only
	// the flight's own goroutine touches it.
	claim trace.Span
	// member, for a flight of a GetMany batch, is its place in the batch:
	// told of the flight's launch, its first lookup's outcome and its end.
	member batchPart
	// look is what the flight's lookups keep, made when one needs it: on
	// a client without an L1, a hit read first with GET (a hot key's
	// common flight) needs none of it, and its flight stays small. Only
	// the flight's pursuit touches it.
	look *lookupState

	ctx  context.Context    // set by launch: the first caller's values, no deadline
	stop context.CancelFunc // cancels ctx
	done chan struct{}      // closed by finish, once the answer is set
	// The answer (val, err and served above), set by group.settle: err
	// as the engine keeps it (a callback's error is its calledError) and
	// revealed as the callers get it (see reveal).
	val      []byte
	err      error
	revealed error

	// Guarded by group.mu (and phase, above).
	refs     int
	fallback []byte // a stale copy for callers who give up waiting (StaleTTL)
}

// answer is what a flight's callers get.
type answer struct {
	val    []byte
	err    error
	served Served
}

// flightKind tells what a flight is for.
type flightKind uint8

const (
	forGet     flightKind = iota // Get, GetResult, GetExternal
	forMember                    // one id of a GetMany batch
	forRefresh                   // a refresh ahead of expiry, for no caller
)

// phase is where a flight stands with its callers.
type phase uint8

const (
	// looking up the value or waiting for another holder: the flight ends
	// when its last caller leaves.
	looking phase = iota
	// holding the lock (computing, or waiting for an external producer), or
	// computing without one under FailOpen: others, perhaps in other
	// processes, wait for this flight, so it outlives its callers.
	holding
	// abandoned by every caller while looking: its ctx is cancelled.
	abandoned
	// finished: done is closed and answer is set.
	finished
)

// batchPart is a flight's place in a GetMany batch (see collector).
type batchPart interface {
	launched(f *flight) // the flight is about to look up
	looked(won bool)    // its first lookup answered: won, it will fetch
	settled()           // the flight has ended
}

// awaitOrLeave is await for a caller that may leave (its context has a
// Done channel), in a frame of its own: see Join.
//
//go:noinline
func (e *Engine) awaitOrLeave(ctx context.Context, f *flight) ([]byte, Served, error) {
	a := e.await(ctx, f)
	return a.val, a.served, a.err
}

// answer is f's answer, once f.done is closed, with err as the engine
// keeps it.
func (f *flight) answer() answer { return answer{val: f.val, err: f.err, served: f.served} }

// await waits for f on behalf of one caller. A caller that gives up waiting
// gets the stale copy of the value, if the flight has one.
func (e *Engine) await(ctx context.Context, f *flight) answer {
	cancelled := ctx.Done()
	if cancelled == nil {
		<-f.done // a plain receive: many callers of a hot key contend less
		return f.answer()
	}
	select {
	case <-f.done:
		return f.answer()
	case <-cancelled:
	}
	fallback, left := e.flights.leave(f)
	switch {
	case !left:
		// Finished meanwhile, and counted with this caller.
		<-f.done
		return f.answer()
	case fallback != nil:
		e.stats.servedStale.Add(1)
		e.stats.answered(ServedStale, nil)
		return answer{val: fallback, served: ServedStale}
	}
	err := fmt.Errorf("%w: %w", ErrTimeout, ctx.Err())
	e.stats.answered(0, err)
	return answer{err: err}
}

// lookupState is what a flight's lookups keep: the L1's invalidations
// before the first (on a client with an L1), and the acquire script's keys
// and arguments, made at the first script for all of them; the flight's
// store and lease read them after.
type lookupState struct {
	l1     l1.Snap // the L1's invalidations before the first lookup
	l1From *node   // the node whose tracking l1 follows; only its replies may enter the L1
	keys   []string
	args   []any
}

// looks returns f's lookupState, making it if f has none yet.
func (f *flight) looks() *lookupState {
	if f.look == nil {
		f.look = new(lookupState)
	}
	return f.look
}

// lookupKeys is the acquire script's keys, nil until the first script.
func (f *flight) lookupKeys() []string {
	if f.look == nil {
		return nil
	}
	return f.look.keys
}

// l1Snap is the L1's invalidations before the first lookup: the zero Snap,
// which is not live and lets nothing into the L1, if none was taken or a
// reply came from a node the snap did not follow (see lookup).
func (f *flight) l1Snap() l1.Snap {
	if f.look == nil {
		return l1.Snap{}
	}
	return f.look.l1
}

// lockKey is the key of f's lock if its lookups have made it, else "".
func (f *flight) lockKey() string {
	if keys := f.lookupKeys(); keys != nil {
		return keys[1]
	}
	return ""
}
