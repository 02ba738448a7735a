package memolock

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/memolock/memolock/internal/wire"
	"github.com/redis/go-redis/v9"
)

// The standalone lock, for work that must run on one machine at a time,
// such as a nightly job. It is one key per name:
//
//	<tag>/lock-mutex:<HashID(name)>   the holder's token, expiring after the TTL
//
// taken with SET NX PX GET and released with the release script (see
// internal/wire/scripts.go), so that a holder never deletes a lock that has passed to
// somebody else. The key stays out of "<tag>/lock:<id>", which a Get for
// any id could name, and tags cannot contain "/lock" (see NewKeyScheme),
// so no key of another tag can name it either, nested tags aside.

// TryLock takes the lock called name for ttl, without waiting: it returns
// a lease, or an error wrapping ErrBusy that names the holder's token when
// somebody else holds it, the caller's own process included. It costs one
// round trip to Redis.
//
// name may be any non-empty UTF-8 string; Redis gets its SHA-256 (see
// HashID), so its length does not matter. ttl goes to Redis in whole
// milliseconds and must be at least 1ms. The lock expires after ttl unless
// the lease renews it (Renew, KeepAlive); release it with Release. The
// lease's ID is HashID(name). Close does not release it: the lease needs
// only the redis client.
//
// A ctx already done fails at once with an error matching ErrTimeout and
// ctx.Err(). Otherwise TryLock waits for Redis on the caller's goroutine:
// unless the redis client sets ContextTimeoutEnabled, go-redis bounds the
// call by its own ReadTimeout and WriteTimeout (3 seconds by default), not
// by ctx's deadline. If the call fails with an error wrapping ErrRedis
// after Redis may have run it (a timeout), the lock may be held by a token
// nobody has; it is free again after ttl. A reply lost and retried by
// go-redis is recognised: the lock holds our own token, and is ours.
//
// While the Client knows Redis to be unreachable (see Get), TryLock fails at
// once with an error wrapping ErrRedis. A nil, zero-value or closed Client
// returns the error that Get returns.
//
// TryLock needs Redis 7.0 or later (SET with both NX and GET).
func (c *Client) TryLock(ctx context.Context, name string, ttl time.Duration) (*Lease, error) {
	if err := c.usable(); err != nil {
		return nil, err
	}
	switch {
	case ctx == nil:
		return nil, fmt.Errorf("%w: context is nil", ErrInvalid)
	case name == "":
		return nil, fmt.Errorf("%w: lock name is empty; pass a name such as \"nightly-report\"", ErrInvalid)
	case !utf8.ValidString(name):
		return nil, fmt.Errorf("%w: lock name %s is not valid UTF-8", ErrInvalid, wire.Quote(name))
	case ttl < time.Millisecond:
		return nil, fmt.Errorf("%w: lock TTL %v is under 1ms; Redis locks are set in whole milliseconds", ErrInvalid, ttl)
	}
	if c.e.Closing() {
		return nil, ErrClosed
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("%w: lock %s: %w", ErrTimeout, wire.Quote(name), err)
	}
	key, token, ttl := c.proto.Keys().Mutex(name), wire.NewToken(), ttl.Truncate(time.Millisecond)
	if err := c.e.Down(ctx, key); err != nil {
		return nil, err
	}
	// GET makes the reply name the holder, with no second round trip.
	holder, err := c.rdb.Do(ctx, "set", key, token, "nx", "px", ttl.Milliseconds(), "get").Text()
	switch {
	case errors.Is(err, redis.Nil) || err == nil && holder == token:
		// Set, or set by an attempt whose reply was lost and that go-redis
		// retried.
	case err != nil:
		c.e.Report(ctx, key, err)
		return nil, fmt.Errorf("%w: taking lock %s (%s): %w", ErrRedis, wire.Quote(name), key, err)
	default:
		return nil, fmt.Errorf("%w: %s is held by %s", ErrBusy, wire.Quote(name), wire.Quote(holder))
	}
	return &Lease{w: c.proto.Mutex(HashID(name), key, token), mutexTTL: ttl}, nil
}

// Release deletes the lock if it still holds the lease's token, so that the
// next TryLock succeeds at once. If the lock has expired, or has passed to
// another holder, Release deletes nothing and returns nil: the lock is not
// ours any more, whatever else happened to it. Calling it again is
// harmless. Errors talking to Redis wrap ErrRedis; the lock then expires
// after its TTL.
//
// A ctx already done fails at once with an error matching ErrTimeout and
// ctx.Err(), and the lock lives until its TTL: in a defer, pass a context
// that outlives the job's, such as context.WithoutCancel(ctx).
//
// Only leases from TryLock can be released; a nil lease, or the lease of a
// fetch or start function, which its Client releases, returns an error
// wrapping ErrInvalid.
func (l *Lease) Release(ctx context.Context) error {
	if l == nil || l.w == nil {
		return fmt.Errorf("%w: lease is nil or zero; release the lease that TryLock returned", ErrInvalid)
	}
	if l.mutexTTL == 0 {
		return fmt.Errorf("%w: lease of %s is not from TryLock; its Client releases it when fetch returns", ErrInvalid, wire.Quote(l.w.ID))
	}
	if ctx == nil {
		return fmt.Errorf("%w: context is nil", ErrInvalid)
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("%w: releasing lock %s: %w", ErrTimeout, l.w.Lock, err)
	}
	return l.w.ReleaseMutex(ctx)
}

// Renew makes the lock live at least ttl from now, as Extend does: it never
// shortens the lock, and returns ErrLeaseLost if the lock no longer holds
// the lease's token. ttl must be at least 1ms.
func (l *Lease) Renew(ctx context.Context, ttl time.Duration) error {
	return l.Extend(ctx, ttl)
}

// KeepAlive starts a watchdog that renews a lease from TryLock to the TTL
// it was taken with, every third of that TTL, until stop is called, ctx is
// done, or a renewal finds the lease lost. A renewal that fails to reach
// Redis is tried again at the next tick; the lock survives as long as one
// of them gets through in time.
//
// The watchdog does not say when it ends by itself: check Held, or Renew,
// before work that must not run without the lock. Client.Close does not
// stop it.
//
// stop ends the watchdog and waits for it to return; a renewal under way
// is bounded by go-redis's timeouts. stop does not release the lock, and is
// safe to call more than once and from several goroutines.
//
// On a nil lease, or the lease of a fetch or start function (whose Client
// renews it, or whose TTL the lease does not know), KeepAlive does nothing.
func (l *Lease) KeepAlive(ctx context.Context) (stop func()) {
	if l == nil || l.w == nil || l.mutexTTL == 0 || ctx == nil {
		return func() {}
	}
	ttl := l.mutexTTL
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(max(ttl/3, time.Millisecond))
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			if err := l.Extend(ctx, ttl); errors.Is(err, ErrLeaseLost) {
				return
			}
		}
	}()
	var once sync.Once
	return func() {
		once.Do(cancel)
		<-done
	}
}
