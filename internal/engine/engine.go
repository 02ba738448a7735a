// Package engine is memolock's flight engine: it coalesces the calls for
// one id in this process into a flight, pursues each flight's value across
// processes (look up, wait for the holder's push, take over, compute, store
// and publish), runs the user's callbacks, and keeps the L1 filled. Package
// memolock is a thin façade over it.
//
// Goroutines and who owns what:
//   - A caller's goroutine joins a flight (the group's mutex guards
//     membership) and waits on the flight's done channel. A caller that
//     cannot leave makes the first lookup itself, so a hit costs no
//     goroutine.
//   - Each flight has one goroutine (run) that owns everything the flight
//     knows while it pursues the value (a pursuit): the holder, the timer,
//     the subscription, its own lock. It answers the callers through the
//     group's finish, once.
//   - The subscriber (package pubsub) owns the pub/sub connections; its
//     reader may answer a waiting flight's callers directly with a pushed
//     value (group.deliver), never a flight that holds the lock.
//   - User callbacks run on goroutines of their own (runner), so that a
//     panic or runtime.Goexit becomes an error for the flight.
//   - Per node: a batcher pipelines concurrent lookups, and an outage
//     probe watches a node found unreachable.
package engine

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/memolock/memolock/internal/l1"
	"github.com/memolock/memolock/internal/pubsub"
	"github.com/memolock/memolock/internal/wire"
	"go.opentelemetry.io/otel/trace"
)

// closeWait bounds every call to Redis that Close makes or waits for:
// releasing held locks, a holder's last writes once Close has begun, and
// closing the pub/sub connections.
const closeWait = time.Second

// trackingHealth is the silence after which a tracking connection is
// probed: the L1 serves nothing older than 2 × trackingHealth on a
// connection that died without a reset.
const trackingHealth = time.Second

// An Engine serves the values of one tag.
type Engine struct {
	cfg    Config
	keys   wire.Keys
	log    *slog.Logger
	proto  *wire.Protocol
	nodes  *nodes
	subs   pubsub.Watcher
	single *pubsub.Subscriber // the single node's subscriber; nil on a cluster
	router *pubsub.Router     // on a cluster
	l1     *l1.Cache          // nil without an L1

	flights   group
	callbacks runner
	hints     hints // ids found lately: see hints.go
	work      work  // flights' goroutines and other work Close waits for, boundedly
	stats     counters
	staleLog  quiet // stale values served, logged at most every quietEvery
	onWaitLog quiet // OnWait's panics, the same

	meters *meters
	tracer trace.Tracer
	// unset is the global provider as it was before any SDK was set, when
	// that is the provider: its spans record nothing until
	// otel.SetTracerProvider, so a Get need not start one (see trace).
	unset trace.TracerProvider
	// unsetRecords is set once a Get or fetch span of the unset global
	// provider recorded: it records without an SDK set, when OpenTelemetry's
	// auto-instrumentation agent attached, or when a provider set once
	// was set back to it (it still delegates). unsetProbe is when the
	// next Get or fetch may start a span to find that out (Unix ns).
	unsetRecords atomic.Bool
	unsetProbe   atomic.Int64
	// spanOpts and fetchSpanOpts start the Get and fetch spans: made
	// once, so that a call with a no-op tracer allocates nothing for them.
	spanOpts, fetchSpanOpts []trace.SpanStartOption

	// lifetime lasts as long as the engine: Close cancels it, and the
	// control calls under way (a long Purge) and GetMany reads stop.
	lifetime    context.Context
	endLifetime context.CancelFunc
	// draining ends when Close, the callbacks it cancelled returned (it
	// waits for them however long they take), begins to wait closeWait
	// for the work under way; drainFrom is when. See untilClosed.
	draining  context.Context
	endDrain  context.CancelFunc
	drainFrom atomic.Pointer[time.Time]
	closed    chan struct{} // closed when Close has finished
	closing   atomic.Bool   // Close has begun: the L1 answers no more
}

// New returns an engine for cfg, which package memolock has validated.
func New(cfg Config) (*Engine, error) {
	e := &Engine{cfg: cfg, keys: cfg.Keys, log: cfg.Log, closed: make(chan struct{})}
	e.hints.seed = maphash.MakeSeed()
	e.lifetime, e.endLifetime = context.WithCancel(context.Background())
	e.draining, e.endDrain = context.WithCancel(context.Background())
	e.flights.answers = &e.stats
	e.proto = wire.New(cfg.rdb(), cfg.Keys, cfg.Cluster != nil, cfg.StaleTTL, cfg.RefreshAhead)
	e.nodes = newNodes(&e.cfg, &e.stats, &e.work)
	psc := pubsub.Config{Log: cfg.Log.With("tag", cfg.Keys.Tag()), Stats: &e.stats.pubsub, Health: cfg.PubSubHealth}
	if cfg.L1Size > 0 {
		e.l1 = l1.New(cfg.L1Size, cfg.Keys.Value(""), cfg.Keys.NotFound(""))
		psc.Track = []string{cfg.Keys.Value(""), cfg.Keys.NotFound("")}
		psc.OnInvalidate = e.l1.Invalidate
		// A broken or redialled connection may have lost invalidations.
		psc.OnBreak = e.l1.Flush
		// A tracking connection that dies silently is found out (and the
		// L1 flushed) within two of these: a probe after one of silence,
		// unanswered for one more.
		if psc.Health == 0 {
			psc.Health = trackingHealth
		}
	}
	if cfg.Cluster != nil {
		e.router = pubsub.NewRouter(cfg.Cluster, psc)
		e.subs = e.router
		e.nodes.moved = e.router.Redirected
		if e.l1 != nil {
			e.work.add()
			go e.trackMasters()
		}
	} else {
		e.single = pubsub.New(cfg.Single, psc)
		e.subs = e.single
	}
	tag := e.keys.Tag()
	e.tracer = cfg.TracerProvider.Tracer(Scope, trace.WithInstrumentationVersion(Version))
	if isUnsetGlobal(cfg.TracerProvider) {
		e.unset = cfg.TracerProvider
	}
	var err error
	if e.meters, err = newMeters(cfg.MeterProvider, e); err != nil {
		// A provider that cannot make the instruments costs the metrics,
		// not the client.
		e.log.Warn("memolock: the MeterProvider could not make memolock's instruments; no metrics",
			"tag", tag, "error", err)
	}
	e.spanOpts = []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindClient), trace.WithAttributes(e.meters.tagAttr)}
	e.fetchSpanOpts = []trace.SpanStartOption{trace.WithAttributes(e.meters.tagAttr)}
	return e, nil
}

// snap records the state of key's invalidations before a read from node
// n, and from no other: on a cluster, the tracking of n's own connection.
// A value read elsewhere (a redirection followed to a master that nothing
// here may track yet) must not enter the L1 on this snap.
func (e *Engine) snap(n *node, key string) l1.Snap {
	if e.single != nil {
		return e.l1.Snap(e.single, key)
	}
	if s, err := e.router.SubscriberOf(n.client); err == nil {
		return e.l1.Snap(s, key)
	}
	return l1.Snap{}
}

// mastersEvery is how often a cluster client with an L1 makes sure that
// every master tracks the tag's keys for it.
const mastersEvery = time.Second

// trackMasters keeps a tracking subscriber on every master of the cluster
// until Close: a master that appears (a replica promoted, a node added by
// resharding) owns keys that the L1 may hold, and no invalidation of them
// would come until it tracks. Its subscriber's first dial flushes the L1.
func (e *Engine) trackMasters() {
	defer e.work.done()
	t := time.NewTicker(mastersEvery)
	defer t.Stop()
	for {
		ctx, cancel := context.WithTimeout(e.lifetime, mastersEvery)
		_ = e.router.TrackMasters(ctx) // a master not tracking yet is tried again next time
		cancel()
		select {
		case <-t.C:
		case <-e.lifetime.Done():
			return
		}
	}
}

// notifyWait calls OnWait for a flight that starts waiting on holder. A
// panic in it is logged and ignored; a runtime.Goexit fails the flight.
func (e *Engine) notifyWait(f *flight, holder string) error {
	if e.cfg.OnWait == nil || !e.flights.admit(&e.callbacks.pending) {
		return nil
	}
	err := e.callbacks.callErr("OnWait", f, func() error {
		e.cfg.OnWait(f.id, holder)
		return nil
	})
	if errors.Is(err, errGoexit) {
		return err
	}
	if err == nil {
		return nil
	}
	if ok, skipped := e.onWaitLog.allow(); ok {
		e.log.Warn("memolock: OnWait panicked; the wait goes on", "tag", e.keys.Tag(), "id", f.id,
			"error", firstLine(err.Error()), "panics_not_logged", skipped)
	}
	return nil
}

// l1TTL is how long a value with ttl left in Redis (negative: no expiry)
// may live in the L1: as long, or RefreshAhead less, so that a reader
// reaches Redis while the value can be refreshed. 0: not at all.
func (e *Engine) l1TTL(ttl time.Duration) time.Duration {
	if ttl < 0 || e.cfg.RefreshAhead == 0 {
		return ttl
	}
	return max(ttl-e.cfg.RefreshAhead, 0)
}

// staleServed logs that a stale value was served after a fetch failed
// with cause, here or in the holder's process: a line per tag at most every
// quietEvery, with the count of those not logged since, as a dependency
// that fails takes every id with it.
func (e *Engine) staleServed(f *flight, cause error) {
	if ok, skipped := e.staleLog.allow(); ok {
		e.log.Warn("memolock: fetch failed; serving stale values",
			"tag", e.keys.Tag(), "id", f.id, "for", e.cfg.ResurrectTTL.String(), "error", cause,
			"stale_not_logged", skipped)
	}
}

// WaitL1 waits until the L1 can take values: tracking is live on the
// connection (on every master's, on a cluster). It fails at once if Redis
// refused tracking.
func (e *Engine) WaitL1(ctx context.Context) error {
	if e.l1 == nil {
		return nil
	}
	var err error
	if e.single != nil {
		err = e.single.WaitTracking(ctx)
	} else {
		err = e.router.TrackMasters(ctx)
	}
	switch {
	case err == nil:
		return nil
	case ctx.Err() != nil:
		return fmt.Errorf("%w: the L1's tracking was not live in time: %w", ErrTimeout, ctx.Err())
	}
	return fmt.Errorf("%w: the L1 cannot work: %w", ErrRedis, err)
}

// Stats returns a copy of the engine's counters.
func (e *Engine) Stats() Stats {
	s := e.stats.snapshot()
	s.Coalesced, _ = e.flights.counts()
	return s
}

// Count counts an answer that package memolock gave a caller itself (bad
// input, say).
func (e *Engine) Count(served Served, err error) { e.stats.answered(served, err) }

// Closing reports whether Close has begun.
func (e *Engine) Closing() bool { return e.closing.Load() }

// Channels returns the number of channels subscribed.
func (e *Engine) Channels() int { return e.subs.Channels() }

// Close closes the engine: see Client.Close in package memolock. It reports
// whether the caller must wait for the engine to close (false when called
// from inside one of the engine's callbacks).
func (e *Engine) Close() {
	// First: work that Close ends (a cancelled fetch, a lookup) must find
	// the engine closing.
	e.closing.Store(true)
	flights, first := e.flights.close()
	inside := e.callbacks.inside()
	if !first {
		if !inside {
			<-e.closed
		}
		return
	}
	e.endLifetime()
	if e.l1 != nil {
		// Nothing invalidates the L1 once its connection is closed.
		e.l1.Flush()
	}
	for _, f := range flights {
		e.flights.finish(f, answer{err: ErrClosed})
	}
	if inside {
		go e.shutdown()
		return
	}
	e.shutdown()
}

// shutdown waits for the work Close started to end.
func (e *Engine) shutdown() {
	e.callbacks.pending.wait(-1) // fetches see their cancelled context and return
	now := time.Now()
	deadline := now.Add(closeWait)
	// From here Close waits closeWait for the work under way: the writes
	// it waits for are bounded from now (untilClosed), not from when it
	// began, or those after a fetch slow to return (the release that
	// hands its lock over) would be cut before they are sent.
	e.drainFrom.Store(&now)
	e.endDrain()
	// Every flight: those that hold a lock release it, and a lookup under
	// way may take one, which its flight then releases.
	e.nodes.close()
	e.work.wait(time.Until(deadline))
	e.subs.Close(max(time.Until(deadline), 0))
	if e.l1 != nil {
		e.l1.Close()
	}
	e.meters.close()
	close(e.closed)
}

// HasL1 reports whether the engine has an L1 (Config.L1Size).
func (e *Engine) HasL1() bool { return e.l1 != nil }
