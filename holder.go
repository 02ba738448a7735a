package memolock

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"runtime"
	"runtime/debug"
	"time"
)

// hold runs fetch under the lock that f holds with its token. pttl is the
// lock's remaining time when the lock was found already ours (a retried
// lookup whose first reply was lost), or negative when just taken.
func (c *Client) hold(f *flight, w *wait, pttl time.Duration) ([]byte, error) {
	if err := c.take(f); err != nil {
		return nil, err
	}
	return c.compute(f, w, c.lease(f), pttl)
}

// take makes f a holder of the lock it took, about to run a user function
// under it. If every caller left, or Close began, it hands the lock over
// instead: somebody elsewhere may already wait on it.
func (c *Client) take(f *flight) error {
	if !c.flights.hold(f, &c.callbacks) {
		c.release(f, abandonEvent(f.token))
		return c.ended()
	}
	return nil
}

func (c *Client) lease(f *flight) *Lease {
	return &Lease{sc: c.proto.sc, rdb: c.rdb, id: f.key, lock: c.keys.Lock(f.key), events: c.keys.Events(f.key), token: f.token}
}

type fetchResult struct {
	val      []byte
	ttl      time.Duration
	err      error
	timedOut bool // err is the fetch time limit's
}

// fetchFailed counts a fetch that failed, once, by reason: every reason
// is also a FetchError.
func (c *Client) fetchFailed(res fetchResult) {
	c.stats.fetchErrors.Add(1)
	switch {
	case res.timedOut:
		c.stats.fetchTimeouts.Add(1)
	case errors.Is(res.err, ErrFetchPanicked): // fetch's, or its batch's
		c.stats.fetchPanics.Add(1)
	default:
		c.stats.fetchOther.Add(1)
	}
}

var errGoexit = errors.New("memolock: fetch called runtime.Goexit")

// compute runs fetch on a goroutine of its own, so that a panic or Goexit in
// fetch becomes an error, while a watchdog renews the lock. With a nil lease
// (FailOpen) it only runs fetch. Its caller has added to c.callbacks.
// Whatever can wait until the callers have their value is left to w.
func (c *Client) compute(f *flight, w *wait, lease *Lease, pttl time.Duration) ([]byte, error) {
	c.stats.fetches.Add(1)
	fctx, cancel := context.WithCancel(f.ctx)
	defer cancel()
	t0 := time.Now()
	fctx, span := c.fetchSpan(fctx, f)
	results := make(chan fetchResult, 1)
	go func() {
		res := fetchResult{err: errGoexit}
		defer c.callbacks.Done()
		defer func() { results <- res }()
		if p := callUser(func() {
			val, ttl, err := f.fetch(fctx, lease)
			res = fetchResult{val: val, ttl: ttl, err: err}
		}); p != nil {
			res = fetchResult{err: fmt.Errorf("%w: %v\n%s", ErrFetchPanicked, p, debug.Stack())}
		}
	}()

	if lease == nil {
		res := c.fetched(f, results, cancel)
		c.fetchDone(fctx, span, t0, res.err)
		switch {
		case errors.Is(res.err, ErrNotFound):
			c.stats.notFound.Add(1)
		case res.err != nil:
			c.fetchFailed(res)
		}
		return res.val, res.err
	}

	stop, stopped := make(chan struct{}), make(chan struct{})
	first := c.lockTTL / 3
	if pttl >= 0 {
		first = min(first, pttl/2)
	}
	go c.watchdog(f, lease, first, stop, stopped)
	res := c.fetched(f, results, cancel) // Close cancels f.ctx, and waits for fetch too
	c.fetchDone(fctx, span, t0, res.err)
	close(stop)
	<-stopped // a late renewal must not find the lock gone and report it lost

	closing := c.closingNow()
	switch {
	case res.err != nil && closing:
		// fetch most likely failed because Close cancelled it: let a
		// waiter elsewhere take over rather than fail.
		c.release(f, abandonEvent(f.token))
		return nil, ErrClosed
	case errors.Is(res.err, ErrNotFound):
		c.stats.notFound.Add(1)
		c.recordNotFound(f, closing)
		return nil, res.err
	case res.err != nil:
		c.fetchFailed(res)
		if f.refreshing {
			// The value is most likely still there. The lock stays done
			// until it expires, so that nobody refreshes it again
			// meanwhile: its next fetch is at the miss after it expires.
			// Waiters (the value expired during the refresh) get the
			// failure, or their stale copy.
			c.log.Warn("memolock: refreshing a value ahead of its expiry failed",
				"tag", c.keys.Tag(), "id", f.id, "error", res.err)
			c.releaseWith(f, failEvent(f.token, res.err), c.early)
			return nil, res.err
		} else if c.staleTTL > 0 && !errors.Is(res.err, ErrFetchPanicked) {
			if v, ok := c.resurrect(f, res.err); ok {
				w.served = ServedStale
				return v, nil
			}
		}
		c.release(f, failEvent(f.token, res.err))
		return nil, res.err
	}
	if res.ttl < 0 {
		c.uncached(f, res.val, closing)
		return res.val, nil
	}
	if err := c.store(f, res.val, res.ttl, closing); err != nil {
		w.after = func() { c.storeFailed(f, err) }
	}
	return res.val, nil
}

// recordNotFound records that fetch found nothing, for Options.NegTTL, and
// tells the waiters elsewhere. If that fails, the lock is released with an
// abandon event, so that waiters look again at once.
func (c *Client) recordNotFound(f *flight, closing bool) {
	ctx, cancel := c.holderCtx(f, closing)
	defer cancel()
	done, err := c.proto.notFound(ctx, f.key, f.token, c.negTTL)
	switch {
	case err != nil:
		c.storeError(f, err)
		if !c.release(f, abandonEvent(f.token)) {
			// The script may have run in part, or the lock expired:
			// tell waiters anyway.
			ctx, cancel := context.WithTimeout(context.WithoutCancel(f.ctx), closeWait)
			defer cancel()
			_ = c.proto.abandoned(ctx, f.key, f.token)
		}
	case !done:
		c.leaseLost(f)
	}
}

// resurrect puts the stale copy of f's value back for ResurrectTTL, after
// fetch failed with cause, and returns it; false if there is none (or the
// lease was lost, or Redis failed).
func (c *Client) resurrect(f *flight, cause error) ([]byte, bool) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(f.ctx), closeWait)
	defer cancel()
	v, ok, err := c.proto.resurrect(ctx, f.key, f.token, c.resurrectTTL)
	if err != nil {
		c.outage.report(err)
		return nil, false
	}
	if ok {
		c.stats.stale.Add(1)
		c.log.Warn("memolock: fetch failed; serving the stale value",
			"tag", c.keys.Tag(), "id", f.id, "for", c.resurrectTTL, "error", cause)
	}
	return v, ok
}

// holderCtx is the context of a holder's last write: its flight's values,
// and bounded once Close has begun.
func (c *Client) holderCtx(f *flight, closing bool) (context.Context, context.CancelFunc) {
	ctx := context.WithoutCancel(f.ctx)
	if closing {
		return context.WithTimeout(ctx, closeWait)
	}
	return ctx, func() {}
}

// refresh runs fetch in the background for the value that f found close to
// its expiry, under the lock that f's lookup took for it
// (Options.RefreshAhead), and stores the next value. Close cancels it, and
// waits for it, as for any fetch.
func (c *Client) refresh(f *flight, ctx context.Context) {
	rf := &flight{id: f.id, key: f.key, token: f.token, fetch: f.fetch, done: make(chan struct{}), refreshing: true}
	if !c.flights.background(rf, ctx, &c.wg, &c.callbacks) {
		c.release(rf, abandonEvent(rf.token)) // Close began: hand the lock over
		return
	}
	go func() {
		defer c.wg.Done()
		w := &wait{c: c, f: rf}
		val, err := c.compute(rf, w, c.lease(rf), -1)
		if err == nil {
			c.stats.refreshes.Add(1)
		}
		c.flights.finish(rf, val, err, ServedComputed)
		w.end()
	}()
}

// uncached hands a value that fetch asked not to cache (a negative TTL) to
// the waiters elsewhere, and frees the lock. If that fails, the lock is
// released with an abandon event, so that waiters look again (and compute
// for themselves) at once.
func (c *Client) uncached(f *flight, val []byte, closing bool) {
	ctx, cancel := c.holderCtx(f, closing)
	defer cancel()
	published, err := c.proto.publish(ctx, f.key, f.token, val)
	switch {
	case err != nil:
		c.storeError(f, err)
		c.release(f, abandonEvent(f.token))
	case !published:
		c.leaseLost(f)
	}
}

// fetched returns fetch's result, or, once the fetch time limit passes,
// cancels fetch's context and returns an error wrapping ErrTimeout without
// waiting for fetch (the goroutine running it ends when fetch returns).
func (c *Client) fetched(f *flight, results <-chan fetchResult, cancel context.CancelFunc) fetchResult {
	limit := c.fetchTimeout
	if d, ok := f.ctx.Value(fetchTimeoutKey{}).(time.Duration); ok {
		limit = d
	}
	if limit <= 0 {
		return <-results
	}
	t := time.NewTimer(limit)
	defer t.Stop()
	select {
	case res := <-results:
		return res
	case <-t.C:
		cancel()
		return fetchResult{timedOut: true, err: fmt.Errorf("%w: fetch of id %s ran past its time limit of %v", ErrTimeout, quote(f.id), limit)}
	}
}

type fetchTimeoutKey struct{}

// WithFetchTimeout returns a context that makes Get bound fetch by d,
// overriding Options.FetchTimeout (0 or less: no limit). It applies to the flight
// that the call starts; a call that joins a flight already running in
// this process shares that flight's limit.
func WithFetchTimeout(ctx context.Context, d time.Duration) context.Context {
	return context.WithValue(ctx, fetchTimeoutKey{}, max(d, 0))
}

// storeFailed tells waiters elsewhere that the store failed, now rather
// than when the lock expires: with a fail event if the lock is still ours
// (nothing was stored), or else with an abandon event, so that they look
// again (the script may have stored the value and stopped before its
// PUBLISH).
func (c *Client) storeFailed(f *flight, err error) {
	if c.release(f, failEvent(f.token, err)) {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(f.ctx), closeWait)
	defer cancel()
	_ = c.proto.abandoned(ctx, f.key, f.token)
}

// watchdog renews the lease every LockTTL/3 until stop is closed, or the
// lease is found lost (the renew script has told waiters so).
func (c *Client) watchdog(f *flight, lease *Lease, first time.Duration, stop <-chan struct{}, stopped chan<- struct{}) {
	defer close(stopped)
	t := time.NewTimer(first)
	defer t.Stop()
	for {
		select {
		case <-t.C:
		case <-stop:
			return
		}
		held, err := renew(f.ctx, lease.sc, lease.rdb, lease.lock, lease.events, lease.token, c.lockTTL)
		if err == nil && !held {
			return // the store script will refuse; nothing left to renew
		}
		t.Reset(c.lockTTL / 3)
	}
}

// store writes the value if the lease still holds. It returns the error of
// a store that failed; a lost lease is only counted. Either way the callers
// have their value.
func (c *Client) store(f *flight, val []byte, ttl time.Duration, closing bool) error {
	ctx, cancel := c.holderCtx(f, closing)
	defer cancel()
	stored, err := c.proto.store(ctx, f.key, f.token, val, ttl)
	switch {
	case err != nil:
		c.storeError(f, err)
	case !stored:
		c.leaseLost(f)
	}
	return err
}

// startExternal runs start under the flight's lock. The flight then holds
// the lock: its callers leaving cancel neither start nor the wait.
func (c *Client) startExternal(f *flight) error {
	if err := c.take(f); err != nil {
		return err
	}
	c.stats.fetches.Add(1)
	var err error
	p := callUser(func() { err = f.start(f.ctx, c.lease(f)) })
	c.callbacks.Done()
	if p != nil {
		err = fmt.Errorf("%w: %v\n%s", ErrFetchPanicked, p, debug.Stack())
	}
	if err != nil {
		c.fetchFailed(fetchResult{err: err})
		c.release(f, failEvent(f.token, err))
	}
	return err
}

// callUser calls fn, a function of the user's, and returns what it
// panicked with, if it did. inCallback looks for its frame.
//
//go:noinline
func callUser(fn func()) (panicked any) {
	defer func() { panicked = recover() }()
	fn()
	return nil
}

var callUserName = runtime.FuncForPC(reflect.ValueOf(callUser).Pointer()).Name()

// inCallback reports whether the calling goroutine runs inside callUser:
// a fetch, start or OnWait function.
func inCallback() bool {
	pcs := make([]uintptr, 64)
	for {
		n := runtime.Callers(2, pcs)
		if n < len(pcs) {
			pcs = pcs[:n]
			break
		}
		pcs = make([]uintptr, 2*len(pcs))
	}
	frames := runtime.CallersFrames(pcs)
	for {
		fr, more := frames.Next()
		if fr.Function == callUserName {
			return true
		}
		if !more {
			return false
		}
	}
}

// storeError counts and logs a value (or "not found") that Redis failed to
// store; an unreachable Redis also starts an outage.
func (c *Client) storeError(f *flight, err error) {
	c.stats.storeErrors.Add(1)
	c.log.Warn("memolock: storing a fetched value failed; waiters elsewhere are told",
		"tag", c.keys.Tag(), "id", f.id, "error", err)
	c.outage.report(err)
}

// leaseLost counts and logs a value (or "not found") that was not stored
// because the lock no longer held the flight's token.
func (c *Client) leaseLost(f *flight) {
	c.stats.leaseLost.Add(1)
	c.log.Warn("memolock: the lease was lost while fetch ran (the lock expired, or was deleted); the value was not stored",
		"tag", c.keys.Tag(), "id", f.id)
}
