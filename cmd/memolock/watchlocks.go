package main

import (
	"container/list"
	"strings"
	"time"
)

// lockKind is what a lock held when watch read it.
type lockKind int

const (
	lockUnknown lockKind = iota // not read: set before watch started, or gone (or changed) by the time it was read
	lockHeld                    // a holder's token: a computation under way
	lockDone                    // "done:<token>": lingering after a store
	lockStale                   // "stale:<token>": a stale value put back, served until the lock expires
)

// kindOf returns the kind of a lock that holds v.
func kindOf(v string) lockKind {
	switch {
	case strings.HasPrefix(v, "done:"):
		return lockDone
	case strings.HasPrefix(v, "stale:"):
		return lockStale
	}
	return lockHeld
}

// reading is what one read of a lock found.
type reading struct {
	kind lockKind
	sent time.Time     // when the read was sent
	pttl time.Duration // the lock's PTTL then; negative if it has no TTL or was gone
}

// outlives reports whether the lock that r read was still there at t. A
// key expires no sooner than its PTTL says, so a lock expiry heard before
// sent+pttl was that of an earlier lock, one that the read came too late
// to see.
func (r reading) outlives(t time.Time) bool {
	return r.kind != lockUnknown && r.pttl >= 0 && t.Before(r.sent.Add(r.pttl))
}

// lockBook remembers, per id, what watch read in its lock after the
// lock's last keyspace "set" event, so that its "expired" event can be
// told apart: a holder's lock (a takeover), a stale value's (a refetch),
// or one lingering after a store (nothing). It is bounded: past max ids
// it forgets the ones set longest ago. It belongs to the feed goroutine.
type lockBook struct {
	max   int
	gen   uint64
	order *list.List // of *lockEntry, the least recently set first
	byID  map[string]*list.Element
}

type lockEntry struct {
	wire    string
	gen     uint64 // the set event the entry stands for; reads of an earlier one are ignored
	pending bool   // its read is under way
	read    reading
	expired time.Time // when an expiry came while the read was pending; zero if none did
}

func newLockBook(max int) *lockBook {
	return &lockBook{max: max, order: list.New(), byID: map[string]*list.Element{}}
}

// set records that the lock of wire was set, and returns the generation
// that the read of it must carry. It reports true if an expiry of the
// lock's earlier value still waited for its read: that lock's kind is
// unknown.
func (b *lockBook) set(wire string) (gen uint64, undecided bool) {
	if el, ok := b.byID[wire]; ok {
		undecided = !el.Value.(*lockEntry).expired.IsZero()
		b.order.Remove(el)
	}
	b.gen++
	b.byID[wire] = b.order.PushBack(&lockEntry{wire: wire, gen: b.gen, pending: true})
	for b.order.Len() > b.max {
		b.remove(b.order.Front())
	}
	return b.gen, undecided
}

// answer records what the read of generation gen found. If the lock's
// expiry came first, it returns what that lock was, and true.
func (b *lockBook) answer(wire string, gen uint64, r reading) (lockKind, bool) {
	el, ok := b.byID[wire]
	if !ok {
		return lockUnknown, false
	}
	e := el.Value.(*lockEntry)
	if e.gen != gen || !e.pending {
		return lockUnknown, false
	}
	e.pending, e.read = false, r
	if e.expired.IsZero() {
		return lockUnknown, false
	}
	b.remove(el)
	return e.judge(e.expired), true
}

// expire returns what the lock of wire was, now that it expired at t, and
// true; or false if that is known only once the read of its last set
// comes back (answer then returns it).
func (b *lockBook) expire(wire string, t time.Time) (lockKind, bool) {
	el, ok := b.byID[wire]
	if !ok {
		return lockUnknown, true
	}
	e := el.Value.(*lockEntry)
	if e.pending {
		if e.expired.IsZero() {
			e.expired = t
		}
		return lockUnknown, false
	}
	b.remove(el)
	return e.judge(t), true
}

// forget drops what is known of the lock of wire: it was deleted.
func (b *lockBook) forget(wire string) {
	if el, ok := b.byID[wire]; ok {
		b.remove(el)
	}
}

// reset forgets every lock, as events may have been missed, and returns
// the ids whose expiry waited for a read: their kind is unknown.
func (b *lockBook) reset() []string {
	var undecided []string
	for el := b.order.Front(); el != nil; el = el.Next() {
		if e := el.Value.(*lockEntry); !e.expired.IsZero() {
			undecided = append(undecided, e.wire)
		}
	}
	b.order.Init()
	clear(b.byID)
	return undecided
}

func (b *lockBook) remove(el *list.Element) {
	b.order.Remove(el)
	delete(b.byID, el.Value.(*lockEntry).wire)
}

// judge returns the kind of the lock that expired at t.
func (e *lockEntry) judge(t time.Time) lockKind {
	if e.read.outlives(t) {
		return lockUnknown
	}
	return e.read.kind
}
