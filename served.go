package memolock

import (
	"context"
	"errors"
	"time"

	"github.com/memolock/memolock/internal/engine"
)

// Served tells how a Get was answered.
type Served uint8

const (
	// ServedRedis: the value was in Redis.
	ServedRedis Served = iota + 1
	// ServedL1: the value was in this process's L1 (Options.L1Size).
	ServedL1
	// ServedComputed: this process ran fetch (or, with GetExternal, started
	// the work) for it.
	ServedComputed
	// ServedWaited: the value came from a holder elsewhere, pushed while
	// this process waited, or found in Redis after waiting.
	ServedWaited
	// ServedStale: the value is a stale copy, kept past its TTL, served
	// because fetch failed or the wait for it ended (Options.StaleTTL).
	ServedStale
)

func (s Served) String() string {
	switch s {
	case ServedRedis:
		return "redis"
	case ServedL1:
		return "l1"
	case ServedComputed:
		return "computed"
	case ServedWaited:
		return "waited"
	case ServedStale:
		return "stale"
	}
	return "none"
}

// Result is a value and how it was served.
type Result struct {
	Value  []byte
	Served Served
}

// GetResult is Get that also reports how the value was served. Callers
// that joined a flight of this process get the flight's answer: a value
// this process computed is ServedComputed for all of them. An error
// matching ErrNotFound comes with how that answer was served.
func (c *Client) GetResult(ctx context.Context, id string, fetch FetchFunc) (Result, error) {
	if fetch == nil {
		return Result{}, c.refused(errNilFetch)
	}
	var val []byte
	var served Served
	var ok bool
	var err error
	if c != nil && c.l1 { // a nil Client: get refuses it
		val, served, ok, err = c.cached(ctx, id)
	}
	notFound := ok && errors.Is(err, ErrNotFound) // the L1's answer: an error of memolock's
	if !ok {
		var w engine.Wait
		// The answer's error is asked ErrNotFound from what the engine
		// knows of it: a fetch's error is not asked anything again.
		w.Unrevealed()
		val, served, err = c.get(&w, ctx, id, userFetch(fetch), nil)
		if w.Pending() {
			<-w.Done() // here, not in a frame below: see engine.Wait.Done
			var s engine.Served
			val, s, err = w.AnswerKept()
			served = Served(s)
		}
		err, notFound = engine.Reveal(err)
	}
	switch {
	case notFound:
		return Result{Served: served}, err
	case err != nil:
		return Result{}, err
	}
	return Result{Value: val, Served: served}, nil
}

// WithFetchTimeout returns a context that makes Get bound fetch by d,
// overriding Options.FetchTimeout (0 or less: no limit). It applies to the
// flight that the call starts; a call that joins a flight already running
// in this process shares that flight's limit.
func WithFetchTimeout(ctx context.Context, d time.Duration) context.Context {
	return engine.WithFetchTimeout(ctx, d)
}
