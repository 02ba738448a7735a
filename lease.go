package memolock

import (
	"context"
	"fmt"
	"time"

	"github.com/memolock/memolock/internal/wire"
)

// A Lease is the right to compute one value: the lock key holding our token.
// The Client renews it while fetch runs; fetch may also check or extend it,
// for example before a long step or in external-producer mode.
//
// Methods on a nil *Lease, which fetch receives when Options.FailOpen ran it
// without a lock, report ErrLeaseLost; so do those of a zero Lease, which
// only a Client makes.
type Lease struct {
	w        *wire.Lease
	mutexTTL time.Duration // the TTL of a standalone lock (TryLock); 0 for any other lease
}

// leaseOf is the Lease of w (nil for nil).
func leaseOf(w *wire.Lease) *Lease {
	if w == nil {
		return nil
	}
	return &Lease{w: w}
}

// ID returns the id the lease is for, as sent to Redis.
func (l *Lease) ID() string {
	if l == nil || l.w == nil {
		return ""
	}
	return l.w.ID
}

// Token returns the value stored in the lock: 128 random bits in hex, then
// "@host:pid" of the holder for diagnostics, then, when the flight's Get is
// traced, "/" and its fetch span's W3C traceparent (interop/PROTOCOL.md,
// Token).
func (l *Lease) Token() string {
	if l == nil || l.w == nil {
		return ""
	}
	return l.w.Token
}

// Held reports whether the lock still holds the lease's token. A lease
// found lost is reported to the lock's waiters, who wait for this lease's
// token, so that they look again at once.
func (l *Lease) Held(ctx context.Context) (bool, error) {
	if l == nil || l.w == nil {
		return false, nil
	}
	if ctx == nil {
		return false, fmt.Errorf("%w: context is nil", ErrInvalid)
	}
	return l.w.Held(ctx)
}

// Extend makes the lock live at least ttl from now. It never shortens the
// lock. It returns ErrLeaseLost if the lock no longer holds our token, and
// then tells the lock's waiters to look again.
func (l *Lease) Extend(ctx context.Context, ttl time.Duration) error {
	switch {
	case ttl < time.Millisecond:
		return fmt.Errorf("%w: lease extension %v is under 1ms", ErrInvalid, ttl)
	case l == nil || l.w == nil:
		return ErrLeaseLost
	case ctx == nil:
		return fmt.Errorf("%w: context is nil", ErrInvalid)
	}
	held, err := l.w.Renew(ctx, ttl)
	if err == nil && !held {
		err = ErrLeaseLost
	}
	return err
}
