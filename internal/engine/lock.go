package engine

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/memolock/memolock/internal/wire"
	"github.com/redis/go-redis/v9"
)

// ctxOf is the context of a flight's writes: its values, never cancelled.
func ctxOf(f *flight) context.Context {
	if f.ctx == nil {
		return context.Background()
	}
	return context.WithoutCancel(f.ctx)
}

// holderCtx is the context of a holder's last write: its flight's values,
// and bounded once Close has begun: by closeWait if it had (closing) when
// the write began, else by half of closeWait after it begins, which leaves
// telling waiters of a write that failed (storeFailed) the rest. A write
// begun before Close may otherwise sit in go-redis's timeouts against a
// stalled server well past Close.
func (e *Engine) holderCtx(f *flight, closing bool) (context.Context, context.CancelFunc) {
	if closing {
		return context.WithTimeout(ctxOf(f), closeWait)
	}
	return e.untilClosed(ctxOf(f), closeWait/2)
}

// store writes the value if the lease still holds. It returns the error of
// a store that failed; a lost lease is only counted. Either way the callers
// have their value.
func (e *Engine) store(p *pursuit, val []byte, ttl time.Duration, closing bool) error {
	f := p.f
	ctx, cancel := e.holderCtx(f, closing)
	defer cancel()
	if _, down := e.nodes.check(ctx, f.key); down != nil && !closing {
		// A node known to be down (or whose master cannot be found): the
		// callers get their value now, not after go-redis's dial
		// retries, and the store is tried after. It is not failed
		// unsent: the node may be back already, its probe not yet
		// answered, and waiters elsewhere, to whom it is fine, would be
		// told that a value that could be stored failed.
		p.after = func() { e.storeMigrating(f, val, ttl) }
		return nil
	}
	own := e.expectOwn(f.key)
	stored, err := e.proto.Store(ctx, f.key, f.lookupKeys(), f.token, val, ttl)
	err = cutIf(ctx, err)
	if err != nil && passing(err) && e.cfg.Cluster != nil && !closing {
		// The slot is being migrated, or its master failed over: the
		// callers here have their value now, and the store waits for the
		// slot afterwards.
		if own != nil {
			own.cancel()
		}
		p.after = func() { e.storeMigrating(f, val, ttl) }
		return nil
	}
	switch {
	case err != nil:
		e.storeError(f, err)
	case !stored:
		e.leaseLost(f)
	}
	if own == nil {
		return err
	}
	if err != nil || !stored || ttl == 0 || closing {
		own.cancel()
		return err
	}
	p.after = func() { e.adoptOwn(own, f.key) }
	return nil
}

// storeMigrating stores a value whose store met a slot migration, once the
// migration lets it, within the lease; waiters elsewhere are told if it
// cannot. It is also the store, after the callers have their value, of a
// value whose node was known to be down (see store).
//
// Close waits for it, as for any work, and ends it: the store gets until
// half of closeWait after Close begins to wait for the work under way, and
// telling waiters of its failure until closeWait (see untilClosed). Without that bound a store deferred before Close, riding
// out go-redis's dial retries to a node that is down, would outlive Close,
// and write through a client its owner may be closing.
func (e *Engine) storeMigrating(f *flight, val []byte, ttl time.Duration) {
	ctx, cancel := e.untilClosed(ctxOf(f), closeWait/2)
	defer cancel()
	var stored bool
	err := e.throughMigration(ctx, func() (err error) {
		stored, err = e.proto.Store(ctx, f.key, f.lookupKeys(), f.token, val, ttl)
		return err
	})
	err = cutIf(ctx, err)
	switch {
	case err != nil:
		e.storeError(f, err)
		e.storeFailed(f, err)
	case !stored:
		e.leaseLost(f)
	}
}

// forCloseWait is parent, ended closeWait from now or closeWait after Close
// begins to wait for the work under way (see untilClosed), whichever comes
// first: a write that Close may have to wait for.
// Bounded by closeWait alone, one begun before Close would outlive it.
func (e *Engine) forCloseWait(parent context.Context) (context.Context, context.CancelFunc) {
	timed, cancelTimed := context.WithTimeout(parent, closeWait)
	ctx, cancel := e.untilClosed(timed, closeWait)
	return ctx, func() {
		cancel()
		cancelTimed()
	}
}

// untilClosed is parent, ended d after Close begins to wait for the work
// under way (at once if that has passed): once the callbacks that Close
// cancelled returned, however long that took (see shutdown), as Close
// waits closeWait from then. It bounds work that may begin before Close
// and that Close waits for, and work begun after Close began, each step of
// which would otherwise get d of its own.
func (e *Engine) untilClosed(parent context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(parent)
	stop := context.AfterFunc(e.draining, func() {
		t := time.NewTimer(time.Until(e.drainFrom.Load().Add(d)))
		defer t.Stop()
		select {
		case <-t.C:
			cancel()
		case <-ctx.Done():
		}
	})
	return ctx, func() {
		stop()
		cancel()
	}
}

// ownWrite is a value this process is storing, which its own L1 reads back
// once the invalidation of that write has come (see l1.Expect). Keeping
// the value written instead, without a read, would be wrong: Redis sends
// one invalidation for all the writes of a key in one pass of its event
// loop, so that ours may also stand for a write by someone else right
// after it.
type ownWrite struct {
	arrived <-chan struct{}
	cancel  func()
}

// expectOwn prepares key's value, about to be stored, for the L1: nil
// without an L1.
func (e *Engine) expectOwn(key string) *ownWrite {
	if e.l1 == nil {
		return nil
	}
	arrived, cancel := e.l1.Expect(key)
	return &ownWrite{arrived: arrived, cancel: cancel}
}

// adoptOwn waits, boundedly, for the invalidation of this process's store
// of key, and then reads key into the L1, as a lookup would, so that the
// next reader here finds it there.
func (e *Engine) adoptOwn(own *ownWrite, key string) {
	t := time.NewTimer(closeWait)
	defer t.Stop()
	select {
	case <-own.arrived:
	case <-t.C:
		own.cancel()
		return
	case <-e.lifetime.Done():
		own.cancel()
		return
	}
	ctx, cancel := context.WithTimeout(e.lifetime, closeWait)
	defer cancel()
	n, err := e.nodes.check(ctx, key)
	if err != nil {
		return
	}
	snap := e.snap(n, key)
	if !snap.Live() {
		return
	}
	var val *redis.StringCmd
	var ttl *redis.DurationCmd
	if _, err := n.client.Pipelined(ctx, func(p redis.Pipeliner) error {
		val = p.Get(ctx, e.keys.Value(key))
		ttl = p.PTTL(ctx, e.keys.Value(key))
		return nil
	}); err != nil {
		return // gone, or moved: the next lookup reads it
	}
	if d := ttl.Val(); d > 0 || d == -1 {
		e.l1.Put(key, []byte(val.Val()), e.l1TTL(d), snap)
	}
}

// storeFailed tells waiters elsewhere that the store failed, now rather
// than when the lock expires: with a fail event if the lock is still ours
// (nothing was stored), or else with an abandon event, so that they look
// again (the script may have stored the value and stopped before its
// PUBLISH). A store that Close cut (its context ended: nothing else ends
// it; see cutByClose) failed for this process's shutdown, not for the
// value: waiters are told with an abandon event either way, and take
// over, as for a fetch that Close cancelled ([C9]). It may run after the
// callers have their value, as Close begins: both writes together get
// until closeWait after Close begins to wait for the work under way.
func (e *Engine) storeFailed(f *flight, err error) {
	ctx, cancel := e.untilClosed(ctxOf(f), closeWait)
	defer cancel()
	event := wire.FailEvent(f.token, err)
	if errors.As(err, new(cutByClose)) {
		event = wire.AbandonEvent(f.token)
	}
	if e.releaseIn(ctx, f, event, 0) {
		return
	}
	e.abandoned(ctx, f)
}

// cutByClose is the error of a store whose context ended: only Close ends
// it (holderCtx, untilClosed). The error itself does not say so: Go's net
// package makes a dial timeout, a failure of Redis's, an error that
// errors.Is takes for context.DeadlineExceeded.
type cutByClose struct{ error }

func (c cutByClose) Unwrap() error { return c.error }

// cutIf is err, marked cutByClose if ctx, its write's context, has ended.
func cutIf(ctx context.Context, err error) error {
	if err != nil && ctx.Err() != nil {
		return cutByClose{err}
	}
	return err
}

// abandoned publishes an abandon event for f's token, boundedly, within
// parent (ctxOf(f), or less).
func (e *Engine) abandoned(parent context.Context, f *flight) {
	ctx, cancel := e.forCloseWait(parent)
	defer cancel()
	_ = e.throughMigration(ctx, func() error { return e.proto.Abandoned(ctx, f.key, f.token) })
}

// recordNotFound records that fetch found nothing, for NegTTL, and tells
// the waiters elsewhere. If that fails, the lock is released with an
// abandon event, so that waiters look again at once.
func (e *Engine) recordNotFound(f *flight, closing bool) {
	ctx, cancel := e.holderCtx(f, closing)
	defer cancel()
	var done bool
	err := e.throughMigration(ctx, func() (err error) {
		done, err = e.proto.NotFound(ctx, f.key, f.token, e.cfg.NegTTL)
		return err
	})
	switch {
	case err != nil:
		e.storeError(f, err)
		if !e.release(f, wire.AbandonEvent(f.token)) {
			// The script may have run in part, or the lock expired: tell
			// waiters anyway.
			e.abandoned(ctxOf(f), f)
		}
	case !done:
		e.leaseLost(f)
	}
}

// uncached hands a value that fetch asked not to cache (a negative TTL) to
// the waiters elsewhere, and frees the lock. If that fails, the lock is
// released with an abandon event, so that waiters look again (and compute
// for themselves) at once.
func (e *Engine) uncached(f *flight, val []byte, closing bool) {
	ctx, cancel := e.holderCtx(f, closing)
	defer cancel()
	var published bool
	err := e.throughMigration(ctx, func() (err error) {
		published, err = e.proto.Publish(ctx, f.key, f.token, val)
		return err
	})
	switch {
	case err != nil:
		e.storeError(f, err)
		e.release(f, wire.AbandonEvent(f.token))
	case !published:
		e.leaseLost(f)
	}
}

// resurrect puts the stale copy of f's value back for ResurrectTTL, after
// fetch failed with cause, and returns it; false if there is none (or the
// lease was lost, or Redis failed).
func (e *Engine) resurrect(f *flight, cause error) ([]byte, bool) {
	ctx, cancel := e.forCloseWait(ctxOf(f))
	defer cancel()
	var v []byte
	var ok bool
	err := e.throughMigration(ctx, func() (err error) {
		v, ok, err = e.proto.Resurrect(ctx, f.key, f.token, e.cfg.ResurrectTTL)
		return err
	})
	if err != nil {
		return nil, false
	}
	if ok {
		e.stats.servedStale.Add(1)
		e.staleServed(f, cause)
	}
	return v, ok
}

// release deletes f's lock if it still holds f's token, and publishes event;
// it reports whether it did. A failure is harmless: the lock expires by
// itself. It is bounded, as it may run while Close waits.
func (e *Engine) release(f *flight, event string) bool {
	return e.releaseIn(ctxOf(f), f, event, 0)
}

// releaseIn is release within parent (ctxOf(f), or less), with a linger
// (see wire.ReleaseSrc).
func (e *Engine) releaseIn(parent context.Context, f *flight, event string, linger time.Duration) bool {
	ctx, cancel := e.forCloseWait(parent)
	defer cancel()
	var released bool
	_ = e.throughMigration(ctx, func() (err error) {
		released, err = e.proto.Release(ctx, f.key, f.token, event, linger)
		return err
	})
	return released
}

// releaseDone releases f's lock once somebody else stored the value, keeping
// it for the linger the store script keeps (see wire.StoreSrc). f's callers
// get that value next: from now on, as after a fetch, new callers look
// afresh rather than wait for the release (see group.seal).
func (e *Engine) releaseDone(f *flight) {
	e.flights.seal(f)
	e.releaseIn(ctxOf(f), f, "", wire.LockLinger)
}

// storeError counts and logs a value (or "not found") that Redis failed to
// store. It does not start an outage: a reset connection may be this value's
// doing (a value over proto-max-bulk-len), and lookups find out soon enough
// whether the node is down.
func (e *Engine) storeError(f *flight, err error) {
	e.stats.storeErrors.Add(1)
	e.log.Warn("memolock: storing a fetched value failed; waiters elsewhere are told",
		"tag", e.keys.Tag(), "id", f.id, "error", err)
}

// leaseLost counts and logs a value (or "not found") that was not stored
// because the lock no longer held the flight's token.
func (e *Engine) leaseLost(f *flight) {
	e.stats.leaseLost.Add(1)
	e.log.Warn("memolock: the lease was lost while fetch ran (the lock expired, or was deleted); the value was not stored",
		"tag", e.keys.Tag(), "id", f.id)
}

// maxRenewals bounds the renewals of one lease in flight at once.
const maxRenewals = 3

// watchdog renews lease every LockTTL/3 (the first time after first, when
// the lock was found with pttl left) until stop is called or a renewal
// finds the lease lost (the renew script has told waiters so). Each renewal
// runs on a goroutine of its own, and the next one does not wait for it:
// with go-redis's defaults a renewal whose reply is lost blocks for its
// ReadTimeout (3 s), longer than a short lock lives, and the next renewal
// must still go out on time. A renewal that ends after the value is stored
// finds the lock done and publishes an abandon event, on which waiters look
// again and find the value: harmless.
//
// The schedule is a timer's function, not a goroutine: most fetches end
// long before their first renewal is due, and then the watchdog has cost
// one timer. Once stop returns, no renewal starts.
func (e *Engine) watchdog(f *flight, lease *wire.Lease, pttl time.Duration) (stop func()) {
	first := e.cfg.LockTTL / 3
	if pttl >= 0 {
		first = min(first, pttl/2)
	}
	w := &renewals{}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.t = time.AfterFunc(first, func() {
		w.mu.Lock()
		defer w.mu.Unlock()
		if w.ended {
			return
		}
		if w.running < maxRenewals {
			w.running++
			e.work.add()
			go func() {
				defer e.work.done()
				// Close waits for it, and ends it: see holderCtx.
				ctx, cancel := e.untilClosed(ctxOf(f), closeWait/2)
				defer cancel()
				held, err := lease.Renew(ctx, e.cfg.LockTTL)
				w.mu.Lock()
				defer w.mu.Unlock()
				w.running--
				if err == nil && !held {
					w.end() // the store script will refuse; nothing left to renew
				}
			}()
		}
		w.t.Reset(e.cfg.LockTTL / 3)
	})
	return func() {
		w.mu.Lock()
		defer w.mu.Unlock()
		w.end()
	}
}

// renewals is a watchdog's state.
type renewals struct {
	mu      sync.Mutex
	t       *time.Timer // the next renewal
	running int         // renewals under way
	ended   bool        // stopped, or the lease was found lost
}

// end stops the renewals; w.mu is held.
func (w *renewals) end() {
	w.ended = true
	w.t.Stop()
}
