package memolock

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"net"
	"strings"
	"sync/atomic"
	"time"

	"github.com/maypok86/otter/v2"
	"github.com/redis/go-redis/v9"
)

// The L1 is an in-process cache in front of Redis, kept coherent by Redis
// itself: server-assisted client-side caching (CLIENT TRACKING) in
// broadcasting mode, for every key that starts with "<tag>:", redirected
// to the connection that already reads the client's pub/sub. Any write to
// such a key, by anyone (another process, a Python or C# peer, an original
// peer, redis-cli), sends an invalidation there, and the entry goes.
//
// Entries come only from Redis, never from a computation here: a value
// read from Redis is promoted with the time Redis has left on it (one PTTL
// after the callers have it), and so is a cached "not found"
// (Options.NegTTL), whose marker key is tracked too, and only if no invalidation of that key, and
// no flush, happened since before the read. While the tracking connection
// is down, invalidations may be lost: the L1 is flushed when it goes down
// and stays empty until tracking is live again.
type l1 struct {
	sub     *subscriber // knows whether the connection tracks
	cache   *otter.Cache[string, l1Entry]
	prefix  string        // "<tag>:": keys of the tag, as invalidations name them
	neg     string        // "<tag>/lock-notfound:": the not-found markers
	flushes atomic.Uint64 // bumped by every flush
	stripes [64]atomic.Uint64
	seed    maphash.Seed
	refused atomic.Bool // the server refused tracking or its channel: the L1 stays empty
}

type l1Entry struct {
	val      []byte
	ttl      time.Duration
	notFound bool // a cached "not found", not a value
}

// l1Forever stands for "no expiry" in the L1: an entry without a TTL in
// Redis lives until it is invalidated or evicted.
const l1Forever = 100 * 365 * 24 * time.Hour

func newL1(tag string, size int) *l1 {
	return &l1{
		cache: otter.Must(&otter.Options[string, l1Entry]{
			MaximumSize: size,
			ExpiryCalculator: otter.ExpiryWritingFunc(func(e otter.Entry[string, l1Entry]) time.Duration {
				return e.Value.ttl
			}),
		}),
		prefix: tag + ":",
		neg:    tag + "/lock-notfound:",
		seed:   maphash.MakeSeed(),
	}
}

// get returns the L1's value for key (as sent to Redis), or reports a
// cached "not found".
func (l *l1) get(key string) (val []byte, notFound, ok bool) {
	e, ok := l.cache.GetIfPresent(key)
	return e.val, e.notFound, ok
}

// l1Snap is the state of the L1's invalidations for one key before a read
// from Redis.
type l1Snap struct {
	ok                   bool // tracking was live
	epoch, flush, stripe uint64
}

func (l *l1) stripe(key string) *atomic.Uint64 {
	return &l.stripes[maphash.String(l.seed, key)%uint64(len(l.stripes))]
}

func (l *l1) snap(key string) l1Snap {
	epoch, live := l.sub.tracking()
	return l1Snap{ok: live && !l.refused.Load(), epoch: epoch, flush: l.flushes.Load(), stripe: l.stripe(key).Load()}
}

// unchanged reports whether tracking has been live throughout since s, and
// no invalidation of key, and no flush, happened since.
func (l *l1) unchanged(key string, s l1Snap) bool {
	if !s.ok || l.refused.Load() || l.flushes.Load() != s.flush || l.stripe(key).Load() != s.stripe {
		return false
	}
	epoch, live := l.sub.tracking()
	return live && epoch == s.epoch
}

// live reports whether the L1 can take values now.
func (l *l1) live() bool {
	_, live := l.sub.tracking()
	return live && !l.refused.Load()
}

// promote puts val in the L1 for ttl if nothing invalidated key since s.
// An invalidation that lands during the Set is seen by the second check.
func (l *l1) promote(key string, val []byte, ttl time.Duration, s l1Snap) {
	l.put(key, l1Entry{val: val, ttl: ttl}, s)
}

// promoteNotFound records a cached "not found" for ttl, as promote does.
func (l *l1) promoteNotFound(key string, ttl time.Duration, s l1Snap) {
	l.put(key, l1Entry{notFound: true, ttl: ttl}, s)
}

func (l *l1) put(key string, e l1Entry, s l1Snap) {
	if e.ttl == 0 || !l.unchanged(key, s) {
		return
	}
	if e.ttl < 0 {
		e.ttl = l1Forever
	}
	l.cache.Set(key, e)
	if !l.unchanged(key, s) {
		l.cache.Invalidate(key)
	}
}

// invalidate drops the entries of the Redis keys named.
func (l *l1) invalidate(keys []string) {
	for _, k := range keys {
		id, ok := strings.CutPrefix(k, l.prefix)
		if !ok {
			if id, ok = strings.CutPrefix(k, l.neg); !ok {
				continue
			}
		}
		l.stripe(id).Add(1)
		l.cache.Invalidate(id)
	}
}

// flush drops every entry.
func (l *l1) flush() {
	l.flushes.Add(1)
	l.cache.InvalidateAll()
}

// down is called when the tracking connection fails or is replaced:
// invalidations may be lost from now until it is live again (the
// subscriber's tracking state, which snap and unchanged read).
func (l *l1) down() {
	l.flush()
}

// invalidationChannel is where Redis sends the invalidations of a tracking
// connection in RESP2, redirected to a connection that subscribes to it.
const invalidationChannel = "__redis__:invalidate"

// trackingClient returns a client for the subscriber alone: RESP2, so that
// invalidations arrive as pub/sub messages, and every connection it makes
// turns tracking on for the tag's keys, redirected to itself, before it
// subscribes. A server that refuses CLIENT TRACKING (miniredis) leaves the
// L1 empty rather than the waits without pub/sub.
func (l *l1) trackingClient(rdb redis.UniversalClient) (*redis.Client, error) {
	base, ok := rdb.(*redis.Client)
	if !ok {
		return nil, fmt.Errorf("%w: Options.L1Size needs a *redis.Client (or a failover client): client-side caching is per connection", ErrInvalid)
	}
	o := *base.Options()
	o.Protocol = 2
	o.PoolSize = 1
	o.MinIdleConns, o.MaxIdleConns = 0, 0
	userConnect := o.OnConnect
	o.OnConnect = func(ctx context.Context, cn *redis.Conn) error {
		if userConnect != nil {
			if err := userConnect(ctx, cn); err != nil {
				return err
			}
		}
		id, err := cn.ClientID(ctx).Result()
		if err == nil {
			err = cn.Do(ctx, "CLIENT", "TRACKING", "on", "REDIRECT", id, "BCAST", "PREFIX", l.prefix, "PREFIX", l.neg).Err()
		}
		var reply redis.Error
		if errors.As(err, &reply) {
			l.refused.Store(true)
			l.flush()
			return nil
		}
		return err
	}
	tc := redis.NewClient(&o)
	tc.AddHook(dialHook{l})
	return tc, nil
}

// dialHook tells the subscriber of every dial of its client, before it
// happens: the previous connection, if any, is gone.
type dialHook struct{ l *l1 }

func (h dialHook) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		if h.l.sub != nil {
			h.l.sub.dialled()
		}
		return next(ctx, network, addr)
	}
}
func (dialHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (dialHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// track follows the invalidation channel until the subscriber closes.
func (c *Client) track(w *watch) {
	for range w.signal {
		ev := c.sub.take(w)
		if ev.closed {
			return
		}
		if ev.err != nil {
			// Redis refused the invalidation channel (an ACL user without
			// it): no invalidation will come, so no value may enter.
			c.l1.refused.Store(true)
			c.l1.flush()
		}
		// Liveness is the subscriber's (see subscriber.tracking): a
		// reread here may be an old connection's.
		for _, m := range ev.messages {
			c.l1.invalidate(m.PayloadSlice)
		}
	}
}

// promoteFromRedis promotes val, read from Redis for key since s, with the
// time Redis has left on it.
func (c *Client) promoteFromRedis(key string, val []byte, s l1Snap) {
	if !s.ok {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), closeWait)
	defer cancel()
	ttl, err := c.rdb.PTTL(ctx, c.keys.Value(key)).Result()
	if err != nil || ttl == -2*time.Nanosecond || ttl == 0 {
		return
	}
	c.l1.promote(key, val, c.l1TTL(ttl), s)
}

// l1TTL is how long a value with ttl left in Redis (negative: no expiry)
// may live in the L1: as long, or RefreshAhead less, so that a reader
// reaches Redis while the value can be refreshed. 0: not at all.
func (c *Client) l1TTL(ttl time.Duration) time.Duration {
	if ttl < 0 || c.early == 0 {
		return ttl
	}
	return max(ttl-c.early, 0)
}
