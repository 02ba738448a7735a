package engine

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/memolock/memolock/internal/wire"
)

// hold runs fetch under the lock that p's flight holds with its token. pttl
// is the lock's remaining time when the lock was found already ours (a
// retried lookup whose first reply was lost), or negative when just taken.
func (e *Engine) hold(p *pursuit, pttl time.Duration) ([]byte, error) {
	if err := e.take(p.f); err != nil {
		return nil, err
	}
	return e.computeLocked(p, pttl)
}

// take makes f a holder of the lock it took, about to run a user function
// under it. If every caller left, or Close began, it hands the lock over
// instead: somebody elsewhere may already wait on it.
func (e *Engine) take(f *flight) error {
	if !e.flights.hold(f, &e.callbacks.pending) {
		e.release(f, wire.AbandonEvent(f.token))
		return e.ended()
	}
	return nil
}

// fetched is what fetch returned.
type fetched struct {
	val []byte
	ttl time.Duration
}

type fetchResult struct {
	fetched
	err      error
	timedOut bool // err is the fetch time limit's
}

// runFetch runs fetch through the callback runner, under lease (nil: no
// lock, FailOpen), while a watchdog renews the lease. It reports whether
// Close had cancelled the flight before fetch returned. Its caller has
// added one to e.callbacks.pending.
func (e *Engine) runFetch(f *flight, lease *wire.Lease, pttl time.Duration) (fetchResult, bool) {
	e.stats.fetches.Add(1)
	fctx, cancel := context.WithCancel(f.ctx)
	defer cancel()
	t0 := time.Now()
	fctx, span := e.fetchSpan(fctx, f)
	results := invoke(&e.callbacks, "fetch", []*flight{f}, func() (fetched, error) {
		v, ttl, err := f.fetch.Fetch(fctx, lease)
		return fetched{v, ttl}, err
	})
	stopRenewing := func() {}
	if lease != nil {
		stopRenewing = e.watchdog(f, lease, pttl)
	}
	res := e.fetchLimited(f, results, cancel) // Close cancels f.ctx, and waits for fetch too
	closedFirst := f.ctx.Err() != nil
	e.fetchDone(fctx, span, t0, res.err)
	stopRenewing()
	return res, closedFirst
}

// fetchLimited returns fetch's result, or, once the fetch time limit
// passes, cancels fetch's context and returns an error wrapping ErrTimeout
// without waiting for fetch (its goroutine ends when fetch returns).
func (e *Engine) fetchLimited(f *flight, results <-chan result[fetched], cancel context.CancelFunc) fetchResult {
	limit := e.cfg.FetchTimeout
	if d, ok := f.ctx.Value(fetchTimeoutKey{}).(time.Duration); ok {
		limit = d
	}
	if limit <= 0 {
		res := <-results
		return fetchResult{fetched: res.val, err: res.err}
	}
	t := time.NewTimer(limit)
	defer t.Stop()
	select {
	case res := <-results:
		return fetchResult{fetched: res.val, err: res.err}
	case <-t.C:
		cancel()
		return fetchResult{timedOut: true, err: fmt.Errorf("%w: fetch of id %s ran past its time limit of %v", ErrTimeout, wire.Quote(f.id), limit)}
	}
}

// fetchTimeoutKey carries a per-call fetch time limit in a context (see
// WithFetchTimeout in package memolock).
type fetchTimeoutKey struct{}

// WithFetchTimeout returns a context that bounds the fetch of the flight
// that a call with it starts by d (0: no limit).
func WithFetchTimeout(ctx context.Context, d time.Duration) context.Context {
	return context.WithValue(ctx, fetchTimeoutKey{}, max(d, 0))
}

// computeLocked runs fetch under the flight's lock and settles its result:
// store the value, or record "not found", or report the failure. What can
// wait until the callers have their answer is left to p.after.
func (e *Engine) computeLocked(p *pursuit, pttl time.Duration) ([]byte, error) {
	f := p.f
	res, closedFirst := e.runFetch(f, e.proto.Lease(f.key, f.lockKey(), f.token), pttl)
	// Before the writes of whatever fetch returned (a value, "not found",
	// or a failure, whose release or resurrection may take as long as a
	// store): see group.seal.
	e.flights.seal(f)
	closing := e.closing.Load()
	switch {
	case closedFirst && errors.Is(res.err, context.Canceled):
		// Close cancelled fetch, which failed for that: let a waiter
		// elsewhere take over rather than fail. A failure of its own is
		// reported as any other.
		e.release(f, wire.AbandonEvent(f.token))
		return nil, ErrClosed
	case errors.Is(res.err, ErrNotFound):
		e.stats.notFound.Add(1)
		e.recordNotFound(f, closing)
		e.relay(p, wire.NotFoundEvent)
		return nil, e.namedNotFound(f, res.err)
	case res.err != nil:
		return e.fetchFailed(p, res)
	case res.ttl < 0:
		e.uncached(f, res.val, closing)
		return res.val, nil
	}
	if err := e.store(p, res.val, res.ttl, closing); err != nil {
		p.after = func() { e.storeFailed(f, err) }
	}
	return res.val, nil
}

// computeUnlocked runs fetch without a lock (FailOpen), storing nothing.
func (e *Engine) computeUnlocked(f *flight) ([]byte, error) {
	res, _ := e.runFetch(f, nil, -1)
	switch {
	case errors.Is(res.err, ErrNotFound):
		e.stats.notFound.Add(1)
		return nil, e.namedNotFound(f, res.err)
	case res.err != nil:
		e.countFailure(res)
	}
	return res.val, res.err
}

// namedNotFound is fetch's "not found" answer for f's callers: ErrNotFound
// itself gets the id, as the answers read from Redis or the L1 have it; an
// error of fetch's own that wraps it is passed on as it is.
func (e *Engine) namedNotFound(f *flight, err error) error {
	if err == ErrNotFound {
		return fmt.Errorf("%w: id %s", ErrNotFound, wire.Quote(f.id))
	}
	return err
}

// fetchFailed tells the waiters elsewhere that fetch failed, and answers the
// callers: with the stale copy, if StaleTTL keeps one (for an error, not a
// panic), or with the error.
func (e *Engine) fetchFailed(p *pursuit, res fetchResult) ([]byte, error) {
	f := p.f
	e.countFailure(res)
	switch {
	case f.kind == forRefresh:
		// The value is most likely still there. The lock stays done until
		// it expires, so that nobody refreshes it again meanwhile: its next
		// fetch is at the miss after it expires. Waiters (the value expired
		// during the refresh) get the failure, or their stale copy.
		e.log.Warn("memolock: refreshing a value ahead of its expiry failed",
			"tag", e.keys.Tag(), "id", f.id, "error", res.err)
		e.releaseIn(ctxOf(f), f, wire.FailEvent(f.token, res.err), e.cfg.RefreshAhead)
		return nil, res.err
	case e.cfg.StaleTTL > 0 && !errors.Is(res.err, ErrPanicked):
		if v, ok := e.resurrect(f, res.err); ok {
			p.served = ServedStale
			return v, nil
		}
	}
	e.release(f, wire.FailEvent(f.token, res.err))
	e.relay(p, func(token string) string { return wire.FailEvent(token, res.err) })
	return nil, res.err
}

// relay tells the waiters of the holder that p's flight took the lock over
// from what became of its work: the event that event makes for a token, sent
// under that holder's token too. A holder that died leaves its waiters
// looking again one by one, as their timers fire (they are spread on
// purpose); without this, each would take the lock in turn after the one
// before failed, and run a failing fetch again (PROTOCOL.md, [X5]).
func (e *Engine) relay(p *pursuit, event func(token string) string) {
	if p == nil || p.tookOverFrom == "" {
		return
	}
	e.publish(p.f, event(p.tookOverFrom))
}

// publish publishes event on f's events channel, as far as it can within
// closeWait.
func (e *Engine) publish(f *flight, event string) {
	ctx, cancel := e.forCloseWait(ctxOf(f))
	defer cancel()
	_ = e.throughMigration(ctx, func() error { return e.proto.Event(ctx, f.key, event) })
}

// countFailure counts a fetch that failed, once, by reason: every reason is
// also a FetchError.
func (e *Engine) countFailure(res fetchResult) {
	e.stats.fetchErrors.Add(1)
	switch {
	case res.timedOut:
		e.stats.fetchTimeouts.Add(1)
	case errors.Is(res.err, ErrPanicked):
		e.stats.fetchPanics.Add(1)
	default:
		e.stats.fetchOther.Add(1)
	}
}

// startExternal runs start under the flight's lock. The flight then holds
// the lock: its callers leaving cancel neither start nor the wait.
func (e *Engine) startExternal(p *pursuit) error {
	f := p.f
	if err := e.take(f); err != nil {
		return err
	}
	e.stats.fetches.Add(1)
	lease := e.proto.Lease(f.key, f.lockKey(), f.token)
	err := e.callbacks.callErr("start", f, func() error { return f.start(f.ctx, lease) })
	if err != nil && f.ctx.Err() != nil && errors.Is(err, context.Canceled) {
		// Close cancelled start, which failed for that: a shutdown, not a
		// failure of the work (PROTOCOL.md [E4]). Hand the lock over, as
		// computeLocked does for a cancelled fetch.
		e.release(f, wire.AbandonEvent(f.token))
		return ErrClosed
	}
	if err != nil {
		e.countFailure(fetchResult{err: err})
		e.flights.seal(f) // decided: see group.seal
		e.release(f, wire.FailEvent(f.token, err))
		e.relay(p, func(token string) string { return wire.FailEvent(token, err) })
	}
	return err
}

// refresh runs fetch in the background for the value that f found close to
// its expiry, under the lock that f's lookup took for it (RefreshAhead),
// and stores the next value. Close cancels it, and waits for it, as for
// any fetch.
func (e *Engine) refresh(f *flight, ctx context.Context) {
	rf := &flight{id: f.id, key: f.key, token: f.token, kind: forRefresh, fetch: f.fetch, done: make(chan struct{})}
	if !e.flights.background(rf, ctx, &e.work, &e.callbacks.pending) {
		e.release(rf, wire.AbandonEvent(rf.token)) // Close began: hand the lock over
		return
	}
	go func() {
		defer e.work.done()
		p := &pursuit{e: e, f: rf, ctx: rf.ctx}
		val, err := e.computeLocked(p, -1)
		if err == nil {
			e.stats.refreshes.Add(1)
		}
		e.flights.finish(rf, answer{val: val, err: err, served: ServedComputed})
		p.end()
	}()
}
