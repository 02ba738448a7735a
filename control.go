package memolock

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
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
	var n int
	err = c.bounded(ctx, func(ctx context.Context) error {
		var err error
		n, err = c.proto.sc.del.Run(ctx, c.rdb, c.proto.idKeys(key), c.keys.Events(key)).Int()
		return err
	})
	c.forget(key) // whatever happened, as the write may have run
	if err != nil {
		return false, fmt.Errorf("%w: deleting %s: %w", ErrRedis, quote(c.keys.Value(key)), err)
	}
	return n == 1, nil
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
	err = c.bounded(ctx, func(ctx context.Context) error {
		return c.proto.sc.set.Run(ctx, c.rdb, c.proto.idKeys(key),
			newToken(), value, ttlMillis(ttl), c.keys.Notif(key), c.proto.linger(ttl).Milliseconds(), c.staleTTL.Milliseconds()).Err()
	})
	c.forget(key)
	if err != nil {
		return fmt.Errorf("%w: setting %s: %w", ErrRedis, quote(c.keys.Value(key)), err)
	}
	return nil
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
	return c.peek(ctx, key)
}

func (c *Client) peek(ctx context.Context, key string) (Peeked, error) {
	var res []any
	err := c.bounded(ctx, func(ctx context.Context) error {
		var err error
		res, err = peekScript.Run(ctx, c.rdb, c.proto.idKeys(key)).Slice()
		return err
	})
	if err == nil && len(res) != 7 {
		err = fmt.Errorf("unexpected script reply %v", res)
	}
	if err != nil {
		return Peeked{}, fmt.Errorf("%w: peeking at %s: %w", ErrRedis, quote(c.keys.Value(key)), err)
	}
	var p Peeked
	if v, ok := res[0].(string); ok {
		p.Value, p.Found = []byte(v), true
		p.TTL = pttl(res[1])
	}
	if h, ok := res[2].(string); ok {
		p.Holder = h
		p.HolderTTL = pttl(res[3])
		p.Stale = p.Found && strings.HasPrefix(h, "stale:")
	}
	if ms, _ := res[4].(int64); ms != -2 && !p.Found {
		p.NotFound, p.NotFoundTTL = true, pttl(res[4])
	}
	if _, ok := res[5].(string); ok {
		p.StaleCopyTTL = pttl(res[6])
	}
	return p, nil
}

// Lookup returns what the L1, then Redis, holds for id, and never computes
// or waits: the value, served from the L1, from Redis or stale; or an
// error matching ErrNotFound for a cached "not found" (Options.NegTTL); or
// one matching ErrMiss when nothing is cached. A value read from Redis
// enters the L1 as a Get's would.
func (c *Client) Lookup(ctx context.Context, id string) (Result, error) {
	r, err := c.lookupOnly(ctx, id)
	if c.usable() == nil {
		c.stats.count(r.Served, err)
	}
	return r, err
}

func (c *Client) lookupOnly(ctx context.Context, id string) (Result, error) {
	key, err := c.control(ctx, id)
	if err != nil {
		return Result{}, err
	}
	if c.l1 != nil {
		if v, notFound, ok := c.l1.get(key); ok {
			if notFound {
				return Result{Served: ServedL1}, c.notFoundErr(id)
			}
			return Result{Value: v, Served: ServedL1}, nil
		}
	}
	if err := c.outage.err(); err != nil {
		return Result{}, err
	}
	var snap l1Snap
	if c.l1 != nil {
		snap = c.l1.snap(key)
	}
	p, err := c.peek(ctx, key)
	if err != nil {
		c.outage.report(err)
		return Result{}, err
	}
	switch {
	case p.Found && p.Stale:
		c.stats.stale.Add(1)
		return Result{Value: p.Value, Served: ServedStale}, nil
	case p.Found:
		c.stats.hits.Add(1)
		if c.l1 != nil {
			c.l1.promote(key, p.Value, c.l1TTL(p.TTL), snap)
		}
		return Result{Value: p.Value, Served: ServedRedis}, nil
	case p.NotFound:
		if c.l1 != nil {
			c.l1.promoteNotFound(key, p.NotFoundTTL, snap)
		}
		return Result{Served: ServedRedis}, c.notFoundErr(id)
	}
	return Result{}, fmt.Errorf("%w: id %s", ErrMiss, quote(id))
}

func pttl(v any) time.Duration {
	ms, _ := v.(int64)
	if ms < 0 {
		return -1
	}
	return time.Duration(min(ms, int64(maxPTTL/time.Millisecond))) * time.Millisecond
}

// purgeBatch is how many keys Purge asks SCAN for, and unlinks, at a time.
const purgeBatch = 500

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
	var n atomic.Int64
	purge := func(ctx context.Context, node redis.Cmdable) error {
		for _, prefix := range []string{c.keys.Value(""), c.keys.Lock(""), c.keys.NotFound(""), c.keys.Stale("")} {
			pattern := globEscape(prefix) + "*"
			if err := purgeNode(ctx, node, pattern, &n); err != nil {
				return err
			}
		}
		return nil
	}
	err := c.bounded(ctx, func(ctx context.Context) error {
		if cc, ok := c.rdb.(*redis.ClusterClient); ok {
			return cc.ForEachMaster(ctx, func(ctx context.Context, node *redis.Client) error { return purge(ctx, node) })
		}
		return purge(ctx, c.rdb)
	})
	c.flights.detach("")
	if c.l1 != nil {
		c.l1.flush()
	}
	if err != nil {
		return n.Load(), fmt.Errorf("%w: purging tag %s: %w", ErrRedis, quote(c.keys.Tag()), err)
	}
	return n.Load(), nil
}

// purgeNode unlinks the keys matching pattern on one node, adding their
// number to n.
func purgeNode(ctx context.Context, node redis.Cmdable, pattern string, n *atomic.Int64) error {
	var cursor uint64
	for {
		keys, next, err := node.Scan(ctx, cursor, pattern, purgeBatch).Result()
		if err != nil {
			return err
		}
		if len(keys) > 0 {
			// One UNLINK per key, in one pipeline: on a cluster the keys of
			// one node span slots, and a multi-key UNLINK across slots is
			// refused (CROSSSLOT).
			cmds, err := node.Pipelined(ctx, func(p redis.Pipeliner) error {
				for _, k := range keys {
					p.Unlink(ctx, k)
				}
				return nil
			})
			for _, cmd := range cmds {
				if m, ok := cmd.(*redis.IntCmd); ok {
					n.Add(m.Val())
				}
			}
			if err != nil {
				return err
			}
		}
		if next == 0 {
			return nil
		}
		cursor = next
		if err := ctx.Err(); err != nil {
			return err
		}
	}
}

// globEscape escapes the characters that SCAN MATCH patterns treat
// specially.
func globEscape(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case '*', '?', '[', ']', '\\', '^', '-':
			b.WriteByte('\\')
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// forget drops key from the L1 at once, for this process's own writes:
// the invalidation Redis sends may come a moment later.
func (c *Client) forget(key string) {
	c.flights.detach(key)
	if c.l1 != nil {
		c.l1.invalidate([]string{c.keys.Value(key)})
	}
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
	if c.closingNow() {
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

// bounded runs fn, a call to Redis, and returns when it does or when ctx
// ends, whichever comes first: go-redis ignores context deadlines on reads
// unless ContextTimeoutEnabled is set, and callers' deadlines must hold. A
// call left behind ends with go-redis's own timeouts; Close waits for it
// (boundedly).
func (c *Client) bounded(ctx context.Context, fn func(context.Context) error) error {
	// Close cancels the call too, so that a long Purge stops.
	fctx, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(c.calls, cancel)
	if ctx.Done() == nil {
		defer stop()
		defer cancel()
		return fn(fctx)
	}
	done := make(chan error, 1)
	if !c.flights.track(&c.wg) {
		stop()
		cancel()
		return ErrClosed
	}
	go func() {
		defer c.wg.Done()
		defer stop()
		defer cancel()
		done <- fn(fctx)
	}()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return fmt.Errorf("%w: %w", ErrTimeout, ctx.Err())
	}
}

// ttlMillis is a value TTL as the scripts take it: whole milliseconds, at
// least 1, or "0" for none.
func ttlMillis(ttl time.Duration) string {
	if ttl <= 0 {
		return "0"
	}
	return strconv.FormatInt(max(ttl.Milliseconds(), 1), 10)
}
