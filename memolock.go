// Package memolock computes a value once across processes and shares it
// through Redis: the caller that wins a lock runs fetch, and every other
// caller, in any process, waits for the value it publishes.
//
// It speaks the key scheme of the original redis-memolock (see KeyScheme and
// interop/PROTOCOL.md), so Go, C# and Python peers can share values.
//
// Within one process, concurrent calls for one id share a single flight, the
// way x/sync/singleflight does: N goroutines cost what one costs. Across
// processes, the flight that misses runs one script that returns the value or
// takes the lock. The winner runs fetch while a watchdog renews its lock, then
// one more script stores the value, publishes it and marks the lock done,
// but only if the lock still holds its token. Everyone else subscribes to
// the value's channel and waits, without polling, until the value arrives,
// the holder reports a failure, or the holder's lock expires, at which point
// a waiter takes over.
package memolock

import (
	"context"
	"fmt"
	"time"

	"github.com/memolock/memolock/internal/engine"
	"github.com/memolock/memolock/internal/wire"
	"github.com/redis/go-redis/v9"
)

// FetchFunc computes a value on a miss. It returns the value, how long Redis
// keeps it (0 keeps it forever; a negative TTL hands the value to this
// flight's callers, and publishes it to the waiters elsewhere whose
// subscriptions are live, without storing it: a waiter that subscribes
// too late computes it again), and an error.
//
// ctx carries the values of the first caller's context but not its deadline:
// fetch serves every caller of the flight, and waiters in other processes
// too, so callers that leave never cancel it. ctx is cancelled when the
// Client is closed.
//
// lease is the lock that fetch holds. The Client renews it while fetch runs;
// fetch may check it or extend it. lease is nil when Options.FailOpen runs
// fetch without a lock.
type FetchFunc func(ctx context.Context, lease *Lease) (value []byte, ttl time.Duration, err error)

// StartFunc starts work that another program finishes: that program SETs
// the value and PUBLISHes it on the value's channel (see KeyScheme). Used
// with GetExternal. The lease is not renewed automatically; StartFunc, or the
// program through Lease.Token, may extend it.
type StartFunc func(ctx context.Context, lease *Lease) error

// A Client computes values of one tag once across processes. It is safe for
// concurrent use. Make one with New; the zero value is not usable.
//
// Once it first waits for a value, a Client holds one pub/sub connection
// (one per master on a cluster), made through the redis client, and two
// goroutines that tend it; under load, a few short-lived goroutines send
// overlapping lookups as pipelines; while a Redis node is unreachable, one
// goroutine probes it. Close stops them. The README's Architecture section
// says which goroutine owns what.
type Client struct {
	e        *engine.Engine
	rdb      redis.UniversalClient
	keys     KeyScheme
	proto    *wire.Protocol // for TryLock's leases
	hashIDs  bool
	hashTags bool // Options.HashTags, or a cluster client
	l1       bool // Options.L1Size: Get looks in the L1 before anything else
}

// New returns a Client for the values of tag, stored through rdb: a
// *redis.Client (a single node, or a Sentinel failover client) or a
// *redis.ClusterClient; memolock refuses clients whose routing of keys it
// cannot know, such as a *redis.Ring. It makes no connection itself, unless
// Options.L1Size asks for an L1: the first Get uses rdb, and the pub/sub
// connection is made when the client first waits for a value.
func New(rdb redis.UniversalClient, tag string, opts *Options) (*Client, error) {
	return newClient(rdb, tag, opts, nil)
}

// newClient is New, with tweak given the engine's configuration last (tests
// set what no Option offers).
func newClient(rdb redis.UniversalClient, tag string, opts *Options, tweak func(*engine.Config)) (*Client, error) {
	if rdb == nil || isNilPointer(rdb) {
		return nil, fmt.Errorf("%w: redis client is nil", ErrInvalid)
	}
	keys, err := NewKeyScheme(tag)
	if err != nil {
		return nil, err
	}
	cfg, err := opts.config(rdb, keys)
	if err != nil {
		return nil, err
	}
	if tweak != nil {
		tweak(&cfg)
	}
	e, err := engine.New(cfg)
	if err != nil {
		return nil, err
	}
	if opts != nil && opts.L1Wait > 0 {
		ctx, cancel := context.WithTimeout(context.Background(), opts.L1Wait)
		err := e.WaitL1(ctx)
		cancel()
		if err != nil {
			e.Close()
			return nil, err
		}
	}
	return &Client{
		e:        e,
		rdb:      rdb,
		keys:     keys,
		proto:    wire.New(rdb, cfg.Keys, cfg.Cluster != nil, cfg.StaleTTL, cfg.RefreshAhead),
		hashIDs:  opts != nil && opts.HashIDs,
		hashTags: cfg.Placed,
		l1:       e.HasL1(),
	}, nil
}

// errNilClient answers calls on a nil or zero-value Client.
var errNilClient = fmt.Errorf("%w: memolock client is nil or not made by New", ErrInvalid)

var errNilFetch = fmt.Errorf("%w: fetch is nil", ErrInvalid)

// usable reports errNilClient for a nil or zero-value Client.
func (c *Client) usable() error {
	if c == nil || c.e == nil {
		return errNilClient
	}
	return nil
}

// refused counts a call refused for its arguments, as every call answered
// (Stats.Gets), and returns err.
func (c *Client) refused(err error) error {
	if c.usable() == nil {
		c.e.Count(0, err)
	}
	return err
}

// Keys returns the client's key scheme; the zero KeyScheme for a nil Client.
func (c *Client) Keys() KeyScheme {
	if c == nil {
		return KeyScheme{}
	}
	return c.keys
}

// Stats returns a copy of the client's counters; zero for a nil Client.
func (c *Client) Stats() Stats {
	if c.usable() != nil {
		return Stats{}
	}
	return Stats(c.e.Stats())
}

// Get returns the value of id. If Redis holds it, that is the answer.
// Otherwise exactly one caller across all processes, the lock winner, runs
// fetch and stores its value, and every other caller waits for it.
//
// Concurrent calls for one id in this process share one flight and get the
// same slice, which callers must not modify. If ctx ends first, Get returns
// at once, whatever Redis is doing, with an error matching both ErrTimeout
// and ctx.Err(); the flight goes on for the other callers, and a fetch
// already running is never cancelled by its callers.
//
// If fetch fails or panics, the lock is released, the callers of this flight
// get the error (a panic wraps ErrFetchPanicked), waiters in other processes
// get an error wrapping ErrHolderFailed within milliseconds, and nothing is
// stored; with Options.StaleTTL, an error (not a panic) serves the stale
// copy instead, if there is one. If fetch reports ErrNotFound, every caller
// and waiter gets an error wrapping ErrNotFound, which Options.NegTTL
// caches. If the lock was lost while fetch ran, the value is returned but not
// stored, and waiters elsewhere look again at once. If storing fails, the
// value is returned and waiters elsewhere take over when the lock expires.
//
// While Redis is unreachable, Get fails at once with an error wrapping
// ErrRedis (or runs fetch locally under Options.FailOpen), and a probe
// notices within a second when Redis answers again.
func (c *Client) Get(ctx context.Context, id string, fetch FetchFunc) ([]byte, error) {
	if fetch == nil {
		return nil, c.refused(errNilFetch)
	}
	if c != nil && c.l1 { // a nil Client: get refuses it
		if val, _, ok, err := c.cached(ctx, id); ok {
			return val, err
		}
	}
	var w engine.Wait
	val, _, err := c.get(&w, ctx, id, userFetch(fetch), nil)
	if w.Pending() {
		<-w.Done() // here, not in a frame below: see engine.Wait.Done
		val, _, err = w.Answer()
	}
	return val, err
}

// GetExternal is Get for values that another program produces: the lock
// winner calls start, which starts the work elsewhere, and then waits like
// everybody else for the value to be SET and PUBLISHed on KeyScheme.Notif.
// The winner subscribes before it calls start, so a producer may publish
// its value, or its failure ("fail\n<token>\n<message>") or "not found"
// ("notfound\n<token>\n") on KeyScheme.Events under Lease.Token, as soon
// as it is started, even before start returns. The winner keeps its lock
// until the value arrives, even if its callers leave, and Close releases
// it. If the lock expires first, the next caller starts the work again,
// unless the earlier producer's failure or "not found" came meanwhile.
// This is the original redis-memolock's GetResourceExternal.
func (c *Client) GetExternal(ctx context.Context, id string, start StartFunc) ([]byte, error) {
	if start == nil {
		return nil, c.refused(fmt.Errorf("%w: start is nil", ErrInvalid))
	}
	var w engine.Wait
	val, _, err := c.get(&w, ctx, id, nil, func(ctx context.Context, l *wire.Lease) error { return start(ctx, leaseOf(l)) })
	if w.Pending() {
		val, _, err = w.Wait()
	}
	return val, err
}

// get checks a Get's arguments and hands it to the engine's Join: it
// returns the answer, or leaves w pending, and the caller waits on w in its
// own frame (see engine.Wait.Done).
func (c *Client) get(w *engine.Wait, ctx context.Context, id string, fetch engine.Fetcher, start engine.StartFunc) ([]byte, Served, error) {
	key, err := c.admit(ctx, id)
	if err != nil {
		return nil, 0, err
	}
	val, served, err := c.e.Join(w, ctx, id, key, fetch, start)
	return val, Served(served), err
}

// admit checks a Get's client, context and id, counts a refusal, and
// returns the id's key. It has a frame of its own, which a waiting caller
// does not keep on its stack (see engine.Join and engine.Wait.Done).
//
//go:noinline
func (c *Client) admit(ctx context.Context, id string) (string, error) {
	if err := c.usable(); err != nil {
		return "", err
	}
	key, err := c.wireID(id)
	switch {
	case ctx == nil:
		err = fmt.Errorf("%w: context is nil", ErrInvalid)
	case ctx.Err() != nil:
		err = fmt.Errorf("%w: %w", ErrTimeout, ctx.Err())
	}
	if err != nil {
		c.e.Count(0, err)
		return "", err
	}
	return key, nil
}

// cached answers a Get from the L1, before anything is made for a flight:
// an L1 hit allocates nothing.
func (c *Client) cached(ctx context.Context, id string) ([]byte, Served, bool, error) {
	if c.usable() != nil || ctx == nil || ctx.Err() != nil {
		return nil, 0, false, nil // get reports it
	}
	key, err := c.wireID(id)
	if err != nil {
		return nil, 0, false, nil
	}
	val, served, ok, err := c.e.Cached(id, key)
	return val, Served(served), ok, err
}

// userFetch is a FetchFunc as the engine's Fetcher, handing it a Lease.
// The conversion allocates nothing, where a closure would on every Get.
type userFetch FetchFunc

func (f userFetch) Fetch(ctx context.Context, l *wire.Lease) ([]byte, time.Duration, error) {
	return f(ctx, leaseOf(l))
}

// Close releases the locks this client holds, so waiters elsewhere take over
// at once, cancels the context of running fetches and waits for them to
// return, and closes the pub/sub connection. Callers still waiting get
// ErrClosed at once; a caller whose context has no Done channel may be in
// a lookup of its flight, on its own goroutine, and returns when that
// lookup does. Close does not close the redis client.
//
// Calls to Redis that Close makes or waits for are bounded: if Redis does
// not answer, Close returns after about a second, and calls still blocked
// in go-redis end with go-redis's own timeouts (or when the redis client is
// closed).
//
// Close is safe to call more than once and concurrently; every call returns
// when the client is closed. Called from inside fetch, start, a batch or OnWait of this
// Client, it starts closing and returns at once, without waiting, and the client
// finishes closing once that callback has returned.
func (c *Client) Close() error {
	if err := c.usable(); err != nil {
		return err
	}
	c.e.Close()
	return nil
}
