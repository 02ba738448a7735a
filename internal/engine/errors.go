package engine

import (
	"errors"
	"fmt"

	"github.com/memolock/memolock/internal/wire"
)

// The sentinel errors; package memolock exports them under the same names
// and documents them.
var (
	ErrClosed       = errors.New("memolock: client closed")
	ErrTimeout      = errors.New("memolock: gave up waiting for the value")
	ErrLeaseLost    = errors.New("memolock: lease lost")
	ErrHolderFailed = errors.New("memolock: the lock holder's fetch failed")
	ErrPanicked     = errors.New("memolock: fetch panicked")
	ErrRedis        = wire.ErrRedis
	ErrBusy         = errors.New("memolock: lock is busy")
	ErrNotFound     = errors.New("memolock: not found")
	ErrMiss         = errors.New("memolock: not cached")
	ErrInvalid      = errors.New("memolock: invalid argument")
)

// errAbandoned ends a flight that every caller left; nobody reads it.
var errAbandoned = errors.New("memolock: flight abandoned")

func isNotFound(err error) bool { return errors.Is(err, ErrNotFound) }

// notFoundErr is the error for an id whose fetch found nothing.
func (e *Engine) notFoundErr(id string) error {
	e.stats.notFound.Add(1)
	return fmt.Errorf("%w: id %s", ErrNotFound, wire.Quote(id))
}

// ended returns the error for a flight whose context is done.
func (e *Engine) ended() error {
	if e.closing.Load() {
		return ErrClosed
	}
	return errAbandoned
}
