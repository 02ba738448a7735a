package memolock

import "github.com/memolock/memolock/internal/engine"

var (
	// ErrClosed is returned by calls on a closed Client, and to callers
	// still waiting when Close is called.
	ErrClosed = engine.ErrClosed

	// ErrTimeout is returned when a caller's context ends before its value
	// arrives. The error also matches the context's error, so
	// errors.Is(err, context.DeadlineExceeded) holds for a deadline.
	ErrTimeout = engine.ErrTimeout

	// ErrLeaseLost is returned by Lease methods once the lock is no longer
	// held with the lease's token: it expired, or somebody deleted it.
	ErrLeaseLost = engine.ErrLeaseLost

	// ErrHolderFailed is returned to callers that waited on a holder in
	// another process whose fetch failed. The error text carries the
	// holder's message. Callers in the holder's own process get the fetch
	// error itself.
	ErrHolderFailed = engine.ErrHolderFailed

	// ErrFetchPanicked wraps a panic raised by a fetch function (or a
	// codec, or another callback). It also stands in for an error a
	// callback returned whose methods panic, most often a nil pointer
	// returned as an error: the error that wraps ErrFetchPanicked names its
	// type, and does not wrap it. Such an error counts as a panic: no stale
	// copy is served for it (StaleTTL serves one for an error), and
	// Stats.FetchPanics counts it.
	ErrFetchPanicked = engine.ErrPanicked

	// ErrRedis wraps errors talking to Redis.
	ErrRedis = engine.ErrRedis

	// ErrBusy is returned by TryLock when somebody holds the lock, this
	// process and this very Client included: the lock is not re-entrant.
	ErrBusy = engine.ErrBusy

	// ErrNotFound is what fetch returns (or wraps) to say that the id has
	// no value; Get then returns an error wrapping it, which Redis
	// remembers for Options.NegTTL. A cached "not found" is not an empty
	// value: that is a value like any other.
	ErrNotFound = engine.ErrNotFound

	// ErrMiss is returned by Lookup when neither the L1 nor Redis holds a
	// value, or a "not found", for the id.
	ErrMiss = engine.ErrMiss

	// ErrInvalid wraps every rejected argument or option.
	ErrInvalid = engine.ErrInvalid
)
