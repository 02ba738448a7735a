package memolock

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"
)

// A wait is a flight's wait for a lock that somebody else holds or, in
// external-producer mode, that the flight holds while another program
// works. It owns the flight's subscription, its timer and what it knows of
// the holder. pursue hands it each busy reply; wait answers with the value,
// an error, or "look again", and each thing that can happen meanwhile has a
// method of its own.
type wait struct {
	c *Client
	f *flight

	w      *watch      // the value and event channels; nil until the first wait
	timer  *time.Timer // fires when the holder's lock would expire
	holder string      // token of the holder waited for
	waited bool        // counted in Stats.Waits
	since  time.Time   // the first busy reply, when waited
	parked bool        // counted in counters.waiting
	own    atomic.Bool // the lock is the flight's own (external-producer mode)
	served Served      // how the value came, for the flight's callers
	stale  bool        // the value looked up was flagged stale
	// refresh is set when the lookup took the lock to refresh the value
	// it found: resolve starts the refresh once the callers have it.
	refresh bool
	// notFound is set when the lookup found a cached "not found", with
	// notFoundTTL left, for the L1.
	notFound    bool
	notFoundTTL time.Duration

	// maybeLocked is set when a lookup failed after it may have taken the
	// lock: end releases the flight's token.
	maybeLocked bool

	// after, if set, is run by end: work that can wait until the callers
	// have their answer.
	after func()
}

// next is what wait decided.
type next struct {
	val   []byte
	err   error
	again bool // look the value up again
}

// wait waits on the busy reply r until the value, an error, or a reason to
// look again.
func (w *wait) wait(r reply) next {
	w.busy(r)
	for {
		select {
		case <-w.w.signal:
			if n, ok := w.onEvents(w.w.s.take(w.w)); ok {
				return n
			}
		case <-w.timer.C:
			return w.onExpiry()
		case <-w.f.ctx.Done():
			return next{err: w.c.ended()}
		case <-w.f.done:
			return w.onFinished()
		}
	}
}

// busy takes in a busy reply: whom to wait for, and until when.
func (w *wait) busy(r reply) {
	w.own.Store(r.holder == w.f.token)
	if r.holder != w.holder {
		w.holder = r.holder
		if !w.own.Load() {
			w.f.waitsOn(r.holder)
			w.c.notifyWait(w.f, r.holder)
		}
	}
	if !w.waited {
		w.waited, w.since = true, time.Now()
		w.c.stats.waits.Add(1)
	}
	if !w.parked {
		w.parked = true
		w.c.stats.waiting.Add(1)
	}
	if w.c.staleTTL > 0 {
		// For callers that give up waiting: the copy as of this reply.
		if v := r.value; v != nil {
			w.f.stale.Store(&v)
		} else {
			w.f.stale.Store(nil)
		}
	}
	if w.w == nil {
		w.w = w.c.watch(w.onValue, w.c.keys.Notif(w.f.key), w.c.keys.Events(w.f.key))
	}
	d := r.pttl + time.Millisecond
	if r.pttl < 0 {
		d = w.c.lockTTL // a lock without expiry, set by somebody else: look again later
	}
	if w.timer == nil {
		w.timer = time.NewTimer(d)
	} else {
		w.timer.Reset(d)
	}
}

// onValue runs on the subscriber's reader when the value is published, and
// hands it to the callers at once. With a lock of our own, the flight
// releases it first, so it is left to the flight.
func (w *wait) onValue(payload string) {
	if !w.own.Load() {
		w.c.flights.finish(w.f, []byte(payload), nil, ServedWaited)
	}
}

// onEvents handles what the subscription delivered. It reports false to
// keep waiting.
func (w *wait) onEvents(ev events) (next, bool) {
	if ev.closed {
		return next{err: ErrClosed}, true
	}
	if ev.moved {
		// Sharded: the node no longer serves the key's slot. Whatever was
		// published meanwhile is lost: watch where the slot is now, and
		// look again.
		w.w.s.unwatch(w.w)
		w.w = nil
		w.c.shards.moved()
		return w.again(), true
	}
	if ev.err != nil {
		// Redis refused the subscription (NOPERM, say): no value will
		// come this way.
		return next{err: fmt.Errorf("%w: subscribing to %s: %w", ErrRedis, quote(w.c.keys.Notif(w.f.key)), ev.err)}, true
	}
	notif := w.c.keys.Notif(w.f.key)
	for _, m := range ev.messages {
		if m.Channel == notif {
			return w.value([]byte(m.Payload)), true
		}
		kind, token, text := parseEvent(m.Payload)
		if token != w.holder {
			continue // about an earlier holder
		}
		switch kind {
		case eventFail:
			return w.onFail(text), true
		case eventNotFound:
			w.served = ServedWaited
			return next{err: w.c.notFound(w.f)}, true
		default:
			// abandon, stale (the holder put a stale value back), or a
			// kind this version does not know: look.
			return w.again(), true
		}
	}
	if ev.reread {
		// Live now: whatever was published before is lost, so look.
		return w.again(), true
	}
	return next{}, false
}

// onFail handles the holder's failure event.
func (w *wait) onFail(text string) next {
	w.c.stats.holderFails.Add(1)
	if w.own.Load() {
		// Our external producer reported its failure itself: the event is
		// out, the lock must go.
		w.release("")
	}
	err := fmt.Errorf("%w: %s", ErrHolderFailed, text)
	if s := w.f.stale.Load(); s != nil {
		w.c.log.Warn("memolock: the holder's fetch failed; serving a stale value",
			"tag", w.c.keys.Tag(), "id", w.f.id, "error", err)
		w.served = ServedStale
		w.c.stats.stale.Add(1)
		return next{val: *s}
	}
	return next{err: err}
}

// onExpiry handles the holder's lock expiring without news.
func (w *wait) onExpiry() next {
	return w.again()
}

// onFinished handles a flight finished while waiting: by onValue with the
// value, or by Close.
func (w *wait) onFinished() next {
	if w.f.err != nil {
		return next{err: w.f.err}
	}
	w.c.stats.wakeups.Add(1)
	return next{val: w.f.val}
}

// value ends the wait with the value, looked up or received.
func (w *wait) value(v []byte) next {
	switch {
	case w.own.Load():
		w.served = ServedComputed // the external work this flight started
	case w.stale:
		w.served = ServedStale
		w.c.stats.stale.Add(1)
	case w.waited:
		w.served = ServedWaited
	default:
		w.served = ServedRedis
	}
	if w.waited {
		w.c.stats.wakeups.Add(1)
	} else {
		w.c.stats.hits.Add(1)
	}
	if w.own.Load() {
		// Released before the callers have the value, and so before they
		// can look at Redis again: onValue leaves the flight alone while
		// own is set.
		w.c.releaseDone(w.f)
		w.own.Store(false)
	}
	return next{val: v}
}

// again asks for another lookup.
func (w *wait) again() next {
	return next{again: true}
}

// takeover counts a lock taken after waiting for another holder.
func (w *wait) takeover() {
	if w.waited {
		w.c.stats.takeovers.Add(1)
		w.c.log.Info("memolock: took over a lock whose holder went silent",
			"tag", w.c.keys.Tag(), "id", w.f.id, "previous_holder", w.holder)
		w.f.endClaim() // it covered the wait: the fetch gets a span of its own
		w.done(gotNothing)
	}
}

// done records how long the flight waited, once, with what it got.
func (w *wait) done(o outcome) {
	if w.waited && !w.since.IsZero() {
		w.c.meters.waited(w.f.ctx, time.Since(w.since), o)
		w.since = time.Time{}
	}
}

// release deletes the flight's own lock, publishing event.
func (w *wait) release(event string) {
	w.own.Store(false)
	w.c.release(w.f, event)
}

// end stops the wait. A lock the flight may hold goes, with an abandon
// event so that waiters elsewhere take over at once. It is safe to call
// more than once.
func (w *wait) end() {
	if w.parked {
		w.parked = false
		w.c.stats.waiting.Add(-1)
	}
	if w.w != nil {
		w.w.s.unwatch(w.w)
		w.w = nil
	}
	if w.timer != nil {
		w.timer.Stop()
	}
	if w.own.Load() || w.maybeLocked {
		w.maybeLocked = false
		w.release(abandonEvent(w.f.token))
	}
	if after := w.after; after != nil {
		w.after = nil
		after()
	}
}

// release deletes f's lock if it still holds f's token, and publishes event;
// it reports whether it did. A failure is harmless: the lock expires by
// itself. It is bounded, as it may run while Close waits.
func (c *Client) release(f *flight, event string) bool {
	return c.releaseWith(f, event, 0)
}

// releaseWith is release with a linger (see releaseSrc).
func (c *Client) releaseWith(f *flight, event string, linger time.Duration) bool {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(f.ctx), closeWait)
	defer cancel()
	released, _ := c.proto.release(ctx, f.key, f.token, event, linger)
	return released
}

// releaseDone releases f's lock once somebody else stored the value, keeping
// it for lockLinger as the store script does (see storeSrc).
func (c *Client) releaseDone(f *flight) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(f.ctx), closeWait)
	defer cancel()
	_, _ = c.proto.release(ctx, f.key, f.token, "", lockLinger)
}
