package engine

import (
	"context"
	"fmt"
	"hash/maphash"
	"sync/atomic"
	"time"

	"github.com/memolock/memolock/internal/wire"
)

// Hits of one id tend to follow each other: a hot key is read again and
// again. A flight's first lookup of an id found in Redis within the last
// hintFor reads it with a plain GET instead of the acquire script, which
// Redis runs more slowly (the script's call, and its reply's decoding,
// cost a hot key about a fifth of its throughput against singleflight
// around GET; see bench/). A GET that finds nothing costs one round trip
// more: the acquire script runs then, as it would have at once, and the
// hint goes. A value found by a GET is the same value the script would
// have returned: the script only reads on a hit, unless asked for more.
//
// So only lookups that ask the script for nothing but the value read
// first: a Get (not GetExternal, GetMany or TryLock) on a client without
// an L1 (which needs the value's PTTL), without RefreshAhead (which may
// take the lock on a hit) and without StaleTTL (which flags a value a
// resurrection put back, read from the lock).
//
// The hints are a direct-mapped table: ids that share a slot take it from
// each other, so it holds at most hintSlots ids whatever the key space,
// and costs nothing to keep.
const (
	hintSlots = 1024
	hintFor   = time.Second
)

type hint struct {
	key   string
	value string       // key's value key, made once for every read first
	until atomic.Int64 // Unix ns
}

type hints struct {
	seed  maphash.Seed
	slots [hintSlots]atomic.Pointer[hint]
}

func (h *hints) slot(key string) *atomic.Pointer[hint] {
	return &h.slots[maphash.String(h.seed, key)%hintSlots]
}

// fresh reports whether key was found in Redis within hintFor, and
// returns its value key.
func (h *hints) fresh(key string, now int64) (string, bool) {
	p := h.slot(key).Load()
	if p != nil && p.key == key && now < p.until.Load() {
		return p.value, true
	}
	return "", false
}

// found records that key, whose value key is value(key), was just found in
// Redis. A hint still current for key is extended without an allocation.
func (h *hints) found(key string, value func(string) string, now int64) {
	s := h.slot(key)
	if p := s.Load(); p != nil && p.key == key {
		if p.until.Load()-now < int64(hintFor/2) {
			p.until.Store(now + int64(hintFor))
		}
		return
	}
	p := &hint{key: key, value: value(key)}
	p.until.Store(now + int64(hintFor))
	s.Store(p)
}

// missed drops key's hint: a GET found nothing.
func (h *hints) missed(key string) {
	s := h.slot(key)
	if p := s.Load(); p != nil && p.key == key {
		s.CompareAndSwap(p, nil)
	}
}

// readsFirst reports whether f's first lookup may be a plain GET: see
// hints.
func (e *Engine) readsFirst(f *flight) bool {
	return f.kind == forGet && f.start == nil && e.l1 == nil && e.cfg.RefreshAhead == 0 && e.cfg.StaleTTL == 0
}

// readFirst reads f's value with a GET on n if f's id was found lately.
// It reports false when the acquire script must run: no hint, or nothing
// found.
func (e *Engine) readFirst(ctx context.Context, f *flight, n *node) (attempt, bool) {
	now := time.Now().UnixNano()
	key, fresh := e.hints.fresh(f.key, now)
	if !fresh {
		return attempt{}, false
	}
	v, ok, elsewhere, err := n.batch.get(ctx, key)
	if err != nil && slotMoving(err) {
		// A slot being resharded: the script's lookup knows how to wait
		// for it (lookupMigrating).
		return attempt{}, false
	}
	if err != nil {
		n.down.report(err)
		return attempt{err: fmt.Errorf("%w: reading %s: %w", wire.ErrRedis, wire.Quote(key), err)}, true
	}
	if !ok {
		e.hints.missed(f.key)
		return attempt{}, false
	}
	e.hints.found(f.key, e.keys.Value, now)
	return attempt{r: wire.Reply{Kind: wire.Hit, Value: []byte(v), Elsewhere: elsewhere}}, true
}
