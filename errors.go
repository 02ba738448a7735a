package memolock

import "errors"

var (
	// ErrClosed is returned by calls on a closed Client, and to callers
	// still waiting when Close is called.
	ErrClosed = errors.New("memolock: client closed")

	// ErrTimeout is returned when a caller's context ends before its value
	// arrives. The error also matches the context's error, so
	// errors.Is(err, context.DeadlineExceeded) holds for a deadline.
	ErrTimeout = errors.New("memolock: gave up waiting for the value")

	// ErrLeaseLost is returned by Lease methods once the lock is no longer
	// held with the lease's token: it expired, or somebody deleted it.
	ErrLeaseLost = errors.New("memolock: lease lost")

	// ErrHolderFailed is returned to callers that waited on a holder in
	// another process whose fetch failed. The error text carries the
	// holder's message. Callers in the holder's own process get the fetch
	// error itself.
	ErrHolderFailed = errors.New("memolock: the lock holder's fetch failed")

	// ErrFetchPanicked wraps a panic raised by a fetch function.
	ErrFetchPanicked = errors.New("memolock: fetch panicked")

	// ErrRedis wraps errors talking to Redis.
	ErrRedis = errors.New("memolock: redis")

	// ErrBusy is returned by TryLock when somebody holds the lock, this
	// process and this very Client included: the lock is not re-entrant.
	ErrBusy = errors.New("memolock: lock is busy")

	// ErrNotFound is what fetch returns (or wraps) to say that the id has
	// no value; Get then returns an error wrapping it, which Redis
	// remembers for Options.NegTTL. A cached "not found" is not an empty
	// value: that is a value like any other.
	ErrNotFound = errors.New("memolock: not found")

	// ErrMiss is returned by Lookup when neither the L1 nor Redis holds a
	// value, or a "not found", for the id.
	ErrMiss = errors.New("memolock: not cached")

	// ErrInvalid wraps every rejected argument or option.
	ErrInvalid = errors.New("memolock: invalid argument")
)
