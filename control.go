package memolock

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Delete removes the value of id and its lock, with its stale copy and a
// cached "not found", in one step. A computation
// already under way for id, here or in any other memolock process, can
// never store its value afterwards: its store finds its token gone (the
// rule of memcache leases against stale sets). Its own callers still get
// the value it computed; waiters of that holder look again at once and
// compute afresh. Delete reports whether a value was there.
//
// Original redis-memolock peers store without checking the lock, so a
// computation of theirs still under way stores its value after a Delete,
// and so does the producer of a GetExternal value (it stores with a plain
// SET). In this process, a Get after Delete never joins a flight that
// started before it.
func (c *Client) Delete(ctx context.Context, id string) (bool, error) {
	key, err := c.control(ctx, id)
	if err != nil {
		return false, err
	}
	return c.e.Delete(ctx, key)
}

// Set stores value for id with ttl (0 keeps it for ever), whoever holds
// the lock, and publishes it (a cached "not found" goes, and with
// Options.StaleTTL a stale copy is kept as a store keeps one): callers waiting for id, in any process and
// language, get it at once. A computation under way for id will not
// overwrite it: Set leaves the lock done, as a store does, so that the
// holder's lease is lost.
func (c *Client) Set(ctx context.Context, id string, value []byte, ttl time.Duration) error {
	key, err := c.control(ctx, id)
	if err != nil {
		return err
	}
	if ttl < 0 {
		return fmt.Errorf("%w: TTL %v is negative; use 0 to keep the value for ever", ErrInvalid, ttl)
	}
	if value == nil {
		value = []byte{}
	}
	return c.e.Set(ctx, key, value, ttl)
}

// Peeked is what Peek found for one id.
type Peeked struct {
	Value []byte        // the value; nil if there is none
	Found bool          // whether there is a value (an empty one counts)
	TTL   time.Duration // the value's remaining time; -1 if it never expires
	// Stale is set when the value is a stale copy put back after a fetch
	// failed (Options.StaleTTL): it is served flagged stale until TTL.
	Stale bool
	// NotFound is set when fetch found nothing and that is cached
	// (Options.NegTTL), for NotFoundTTL more.
	NotFound    bool
	NotFoundTTL time.Duration
	// StaleCopyTTL is how long the stale copy of the value has left
	// (Options.StaleTTL); 0 when there is none.
	StaleCopyTTL time.Duration
	// Holder is the token of the lock's holder, if the lock is held: a
	// computation is under way (or, prefixed "done:", the lock outlives a
	// stored value for a moment, or, prefixed "stale:", a stale value is
	// served).
	Holder    string
	HolderTTL time.Duration // the lock's remaining time
}

// Peek reads what Redis holds for id: the value, its remaining TTL,
// whether it is stale or a cached "not found", and who holds the lock, if
// anyone. It never computes, never waits and never fills the L1.
func (c *Client) Peek(ctx context.Context, id string) (Peeked, error) {
	key, err := c.control(ctx, id)
	if err != nil {
		return Peeked{}, err
	}
	p, err := c.e.Peek(ctx, key)
	if err != nil {
		return Peeked{}, err
	}
	return Peeked{Value: p.Value, Found: p.Found, TTL: p.TTL, Stale: p.Resurrected, NotFound: p.NotFound,
		NotFoundTTL: p.NotFoundTTL, StaleCopyTTL: p.StaleCopyTTL, Holder: p.Holder, HolderTTL: p.HolderTTL}, nil
}

// Lookup returns what the L1, then Redis, holds for id, and never computes
// or waits: the value, served from the L1, from Redis or stale; or an
// error matching ErrNotFound for a cached "not found" (Options.NegTTL); or
// one matching ErrMiss when nothing is cached. A value read from Redis
// enters the L1 as a Get's would.
func (c *Client) Lookup(ctx context.Context, id string) (Result, error) {
	key, err := c.control(ctx, id)
	if err != nil {
		if c.usable() == nil {
			c.e.Count(0, err)
		}
		return Result{}, err
	}
	val, served, err := c.e.Lookup(ctx, id, key)
	if err != nil && !errors.Is(err, ErrNotFound) {
		return Result{}, err
	}
	return Result{Value: val, Served: Served(served)}, err
}

// Purge removes every value and lock of the client's tag, with SCAN and
// UNLINK in batches (never KEYS, which blocks the server), on every master
// of a cluster. It reports how many keys it removed. Computations under
// way lose their leases, as with Delete, but their waiters elsewhere are
// not told: they look again when the holder's next renewal or store finds
// its lock gone (within LockTTL/3), or when the lock would have expired.
// Close stops a Purge under way.
//
// Keys of a tag nested in this one go too: tag "app" purges the values of
// tag "app:x", whose keys all start "app:".
func (c *Client) Purge(ctx context.Context) (int64, error) {
	if err := c.ready(ctx); err != nil {
		return 0, err
	}
	return c.e.Purge(ctx)
}

// control checks a control call's arguments and returns the id as sent to
// Redis.
func (c *Client) control(ctx context.Context, id string) (string, error) {
	if err := c.ready(ctx); err != nil {
		return "", err
	}
	return c.wireID(id)
}

// ready checks the client and the context of a call.
func (c *Client) ready(ctx context.Context) error {
	if err := c.usable(); err != nil {
		return err
	}
	if c.e.Closing() {
		return ErrClosed
	}
	if ctx == nil {
		return fmt.Errorf("%w: context is nil", ErrInvalid)
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("%w: %w", ErrTimeout, err)
	}
	return nil
}
