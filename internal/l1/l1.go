// Package l1 is memolock's in-process cache in front of Redis, kept coherent
// by Redis itself: server-assisted client-side caching (CLIENT TRACKING) in
// broadcasting mode for the tag's keys, whose invalidations arrive on a
// pub/sub connection (package pubsub). Any write to such a key, by anyone,
// sends an invalidation there, and the entry goes.
//
// Entries come only from Redis reads, and enter only if nothing could have
// been missed since before the read: the connection that tracks the key's
// node was live throughout (same epoch), and no invalidation of that key,
// and no flush, arrived since (Snap, then Put).
package l1

import (
	"hash/maphash"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/maypok86/otter/v2"

	"github.com/memolock/memolock/internal/mono"
)

// Tracker tells whether the connection that tracks a node receives its
// invalidations, and the epoch of that state: the same epoch and live
// before and after a read prove that no invalidation was missed between.
// Heard returns when (mono time), in that epoch, the connection last
// proved that it had delivered every invalidation sent until then.
type Tracker interface {
	Tracking() (epoch uint64, live bool)
	Heard(epoch uint64) (at time.Duration, ok bool)
}

// FreshFor bounds how old a value the cache serves may be: an entry is
// served only while its tracking connection proved, less than FreshFor
// ago, that no invalidation is waiting unread (a PONG after them). A
// process that was frozen, or a connection that went silent, serves
// nothing from the cache until its connection catches up.
const FreshFor = time.Second

// A Cache holds values and cached "not found" answers, by id as sent to
// Redis.
type Cache struct {
	cache   *otter.Cache[string, entry]
	prefix  string        // "<tag>:": value keys, as invalidations name them
	neg     string        // "<tag>/lock-notfound:": the not-found markers
	flushes atomic.Uint64 // bumped by every flush
	stripes [64]atomic.Uint64
	seed    maphash.Seed

	// Writes of this process whose invalidation it awaits (see Expect).
	expecting atomic.Int64
	waitMu    sync.Mutex
	waiting   map[string][]chan struct{}
}

type entry struct {
	val     []byte
	ttl     time.Duration // as asked: negative for no expiry
	expires time.Duration // mono time; 0: none
	kind    Kind
	t       Tracker // the connection whose invalidations keep it
	epoch   uint64  // of t's tracking when it was read
}

// Kind tells what an entry holds.
type Kind uint8

const (
	Value    Kind = iota // a value
	NotFound             // a cached "not found" (NegTTL)
	Stale                // a stale copy put back after a failed fetch (StaleTTL)
)

// New returns a cache of at most size entries for the keys of tag, whose
// value keys start with valuePrefix and not-found markers with notFoundPrefix.
func New(size int, valuePrefix, notFoundPrefix string) *Cache {
	return &Cache{
		// Expiry is the cache's own (entry.expires), checked with the
		// same clock reading as freshness: otter's would read the clock
		// once more on every hit.
		cache:   otter.Must(&otter.Options[string, entry]{MaximumSize: size}),
		prefix:  valuePrefix,
		neg:     notFoundPrefix,
		seed:    maphash.MakeSeed(),
		waiting: make(map[string][]chan struct{}),
	}
}

// Get returns the entry of id: a value, a stale value, or a cached "not
// found". An entry whose connection has not proved itself fresh within
// FreshFor is not served (it stays, and serves again once it has).
func (c *Cache) Get(id string) (val []byte, kind Kind, ok bool) {
	e, ok := c.cache.GetIfPresent(id)
	if !ok {
		return nil, 0, false
	}
	now := mono.Now()
	if e.expires != 0 && now >= e.expires {
		c.cache.Invalidate(id) // at worst, a newer entry put meanwhile goes too
		return nil, 0, false
	}
	if heard, ok := e.t.Heard(e.epoch); !ok || now-heard > FreshFor {
		return nil, 0, false
	}
	return e.val, e.kind, true
}

// A Snap is the state of the invalidations of one id before a read from
// Redis.
type Snap struct {
	t                    Tracker
	ok                   bool // tracking was live
	epoch, flush, stripe uint64
}

// Live reports whether the snap was taken while tracking was live: only
// then may what is read next enter the cache.
func (s Snap) Live() bool { return s.ok }

func (c *Cache) stripe(id string) *atomic.Uint64 {
	return &c.stripes[maphash.String(c.seed, id)%uint64(len(c.stripes))]
}

// Snap records the state of id's invalidations, on the connection t, before
// a read.
func (c *Cache) Snap(t Tracker, id string) Snap {
	epoch, live := t.Tracking()
	return Snap{t: t, ok: live, epoch: epoch, flush: c.flushes.Load(), stripe: c.stripe(id).Load()}
}

// unchanged reports whether tracking has been live throughout since s, and
// no invalidation of id, and no flush, happened since.
func (c *Cache) unchanged(id string, s Snap) bool {
	if !s.ok || c.flushes.Load() != s.flush || c.stripe(id).Load() != s.stripe {
		return false
	}
	epoch, live := s.t.Tracking()
	return live && epoch == s.epoch
}

// Put keeps val for id for ttl (negative: no expiry; 0: not at all) if
// nothing invalidated id since s. An invalidation that lands during the
// write is seen by the second check.
func (c *Cache) Put(id string, val []byte, ttl time.Duration, s Snap) {
	c.put(id, entry{val: val, ttl: ttl}, s)
}

// PutNotFound keeps a "not found" for id, as Put does.
func (c *Cache) PutNotFound(id string, ttl time.Duration, s Snap) {
	c.put(id, entry{kind: NotFound, ttl: ttl}, s)
}

// PutStale keeps a stale value for id, as Put does: it is served flagged
// stale.
func (c *Cache) PutStale(id string, val []byte, ttl time.Duration, s Snap) {
	c.put(id, entry{val: val, kind: Stale, ttl: ttl}, s)
}

func (c *Cache) put(id string, e entry, s Snap) {
	if e.ttl == 0 || !c.unchanged(id, s) {
		return
	}
	if now := mono.Now(); e.ttl > 0 && e.ttl < math.MaxInt64-now {
		e.expires = now + e.ttl
	} // else none: a PTTL of centuries (wire.MaxPTTL) must not wrap
	e.t, e.epoch = s.t, s.epoch
	c.cache.Set(id, e)
	if !c.unchanged(id, s) {
		c.cache.Invalidate(id)
	}
}

// Invalidate drops the entries of the Redis keys named (an invalidation
// message); nil drops every entry.
func (c *Cache) Invalidate(keys []string) {
	if keys == nil {
		c.Flush()
		return
	}
	for _, k := range keys {
		id, ok := strings.CutPrefix(k, c.prefix)
		if !ok {
			if id, ok = strings.CutPrefix(k, c.neg); !ok {
				continue
			}
		}
		c.Forget(id)
	}
}

// Forget drops the entry of id: this process's own writes, whose
// invalidation Redis sends a moment later.
func (c *Cache) Forget(id string) {
	c.stripe(id).Add(1)
	c.cache.Invalidate(id)
	if c.expecting.Load() > 0 {
		c.arrived(id)
	}
}

// Flush drops every entry.
func (c *Cache) Flush() {
	c.flushes.Add(1)
	c.cache.InvalidateAll()
	if c.expecting.Load() > 0 {
		c.arrived("")
	}
}

// Expect returns a channel closed by the next invalidation of id (or a
// flush): a write this process is about to make will send one. cancel
// stops waiting for it.
func (c *Cache) Expect(id string) (arrived <-chan struct{}, cancel func()) {
	ch := make(chan struct{})
	c.waitMu.Lock()
	c.waiting[id] = append(c.waiting[id], ch)
	c.expecting.Add(1)
	c.waitMu.Unlock()
	return ch, func() {
		c.waitMu.Lock()
		defer c.waitMu.Unlock()
		chans := c.waiting[id]
		for i, w := range chans {
			if w == ch {
				c.waiting[id] = append(chans[:i], chans[i+1:]...)
				c.expecting.Add(-1)
				if len(c.waiting[id]) == 0 {
					delete(c.waiting, id)
				}
				return
			}
		}
	}
}

// arrived closes the channels that await id's invalidation ("": all).
func (c *Cache) arrived(id string) {
	c.waitMu.Lock()
	defer c.waitMu.Unlock()
	for k, chans := range c.waiting {
		if id != "" && k != id {
			continue
		}
		for _, ch := range chans {
			close(ch)
		}
		c.expecting.Add(-int64(len(chans)))
		delete(c.waiting, k)
	}
}

// Close stops the cache's goroutines.
func (c *Cache) Close() { c.cache.StopAllGoroutines() }

// Entry returns the entry of id, fresh or not, and how long it has left
// (negative: no expiry), for tests.
func (c *Cache) Entry(id string) (val []byte, kind Kind, ttl time.Duration, ok bool) {
	e, ok := c.cache.GetIfPresent(id)
	if !ok {
		return nil, 0, 0, false
	}
	ttl = e.ttl // negative: no expiry
	if e.expires != 0 {
		if ttl = e.expires - mono.Now(); ttl <= 0 {
			return nil, 0, 0, false
		}
	}
	return e.val, e.kind, ttl, true
}
