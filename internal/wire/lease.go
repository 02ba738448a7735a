package wire

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// A Lease is one lock held with a token: the lock of an id, or a
// standalone lock.
type Lease struct {
	sc     *Scripts
	rdb    redis.UniversalClient
	ID     string // the id as sent to Redis
	Lock   string // the lock key
	Events string // the channel told when a renewal finds the lease lost
	Token  string
}

// Lease returns the lease of token on id. lock is the id's lock key, if
// the caller has it ("": made here).
func (p *Protocol) Lease(id, lock, token string) *Lease {
	if lock == "" {
		lock = p.keys.Lock(id)
	}
	return &Lease{sc: p.sc, rdb: p.rdb, ID: id, Lock: lock, Events: p.keys.Events(id), Token: token}
}

// Mutex returns the lease of token on the standalone lock key. Its events go
// to a channel nobody reads (the key itself).
func (p *Protocol) Mutex(id, key, token string) *Lease {
	return &Lease{sc: p.sc, rdb: p.rdb, ID: id, Lock: key, Events: key, Token: token}
}

// Renew runs the renew script: the lock lives at least ttl more if it still
// holds the token. A lease found lost is reported to waiters.
func (l *Lease) Renew(ctx context.Context, ttl time.Duration) (bool, error) {
	n, err := l.sc.Renew.Run(ctx, l.rdb, []string{l.Lock}, l.Token, ttl.Milliseconds(), l.Events).Int()
	if err != nil {
		return false, fmt.Errorf("%w: renewing lock %s: %w", ErrRedis, Quote(l.Lock), err)
	}
	return n == 1, nil
}

// Held reports whether the lock holds the token: the renew script with no
// time to add. A lease found lost is reported to the waiters of its token,
// as a renewal does: their holder has lost the lock, and looking again at
// once is what they must do (a lock purged without an event would otherwise
// keep them until their timers fire).
func (l *Lease) Held(ctx context.Context) (bool, error) {
	return l.Renew(ctx, 0)
}

// ReleaseMutex deletes a standalone lock if it holds the token. The lock
// stands in for the value key, as a script's keys must share a slot.
func (l *Lease) ReleaseMutex(ctx context.Context) error {
	if err := l.sc.Release.Run(ctx, l.rdb, []string{l.Lock, l.Lock}, l.Token, l.Events, "", 0).Err(); err != nil {
		return fmt.Errorf("%w: releasing lock %s: %w", ErrRedis, Quote(l.Lock), err)
	}
	return nil
}
