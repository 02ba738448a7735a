package pubsub

import (
	"sync"

	"github.com/redis/go-redis/v9"
)

// A Watch is one waiter's interest in a few channels. What happens to it
// collects in its mailbox, and Signal is poked (without blocking) after
// each change: a waiter selects on Signal, then calls Take.
type Watch struct {
	channels []string
	onValue  func(payload string) // called by the reader; see Watcher
	signal   chan struct{}        // capacity 1
	sub      *Subscriber          // nil if it was never placed (Err says why)

	state watchState // guarded by sub.mu

	mu  sync.Mutex
	box Events // guarded by mu
}

// watchState is a watch's part of the protocol state.
type watchState struct {
	attached bool   // the subscriber serves it: not stopped, moved or closed
	live     bool   // a marker sent after its subscription came back
	seq      uint64 // the marker that makes it live; 0 until planned
}

// Events is what a watch collected since the last Take.
type Events struct {
	// Reread: the subscription is live now, on a new connection or for the
	// first time; whatever was published before is lost, so look again.
	Reread bool
	// Moved: the node serving the watch does not serve its slot any more
	// (a Router's watch). The watch is stopped; watch again through the
	// Router, after looking again.
	Moved bool
	// Synced: a Sync's marker came back; every message published before
	// Sync was called is in Messages now or was in an earlier Take.
	Synced bool
	// Closed: the subscriber was closed. It stays set.
	Closed bool
	// Messages published on the watch's channels, in order.
	Messages []*redis.Message
	// Err: Redis refused to subscribe a channel of the watch (NOPERM), or
	// the watch could not be placed on a node. It stays set.
	Err error
}

func newWatch(onValue func(string), channels []string) *Watch {
	return &Watch{channels: channels, onValue: onValue, signal: make(chan struct{}, 1)}
}

// Signal is poked whenever events arrive; it holds at most one wake-up.
func (w *Watch) Signal() <-chan struct{} { return w.signal }

// Take returns what the watch collected since the last Take, and clears
// it; Closed and Err stay set.
func (w *Watch) Take() Events {
	w.mu.Lock()
	defer w.mu.Unlock()
	ev := w.box
	w.box = Events{Closed: ev.Closed, Err: ev.Err}
	return ev
}

// Sync asks for a marker round trip on the watch's connection. Once it is
// back, the watch gets Synced, and every message published before Sync
// was called has reached the mailbox. If the subscription is not live
// meanwhile (a new connection, a moved slot), the watch gets Reread or
// Moved instead, and no Synced.
func (w *Watch) Sync() {
	if w.sub != nil {
		w.sub.sync(w)
	}
}

// Stop ends the watch. Channels nobody watches any more are unsubscribed,
// a few milliseconds later, together with those of other watches that
// stop meanwhile. It is safe to call more than once.
func (w *Watch) Stop() {
	if w.sub != nil {
		w.sub.unwatch(w)
	}
}

func (w *Watch) poke() {
	select {
	case w.signal <- struct{}{}:
	default:
	}
}

// note records one event in the mailbox.
func (w *Watch) note(n note) {
	w.mu.Lock()
	defer w.mu.Unlock()
	switch n.kind {
	case noteMessage:
		w.box.Messages = append(w.box.Messages, n.msg)
	case noteReread:
		w.box.Reread = true
	case noteMoved:
		w.box.Moved = true
	case noteSynced:
		w.box.Synced = true
	case noteClosed:
		w.box.Closed = true
	case noteErr:
		if w.box.Err == nil {
			w.box.Err = n.err
		}
	}
}
