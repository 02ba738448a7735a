// Package memolock computes a value once across processes and shares it
// through Redis: the caller that wins a lock runs fetch, and every other
// caller, in any process, waits for the value it publishes.
//
// It speaks the key scheme of the original redis-memolock (see KeyScheme and
// interop/PROTOCOL.md), so Go, C# and Python peers can share values.
//
// Within one process, concurrent calls for one id share a single flight, the
// way x/sync/singleflight does: N goroutines cost what one costs. Across
// processes, the flight that misses runs one script that returns the value or
// takes the lock. The winner runs fetch while a watchdog renews its lock, then
// one more script stores the value, publishes it and marks the lock done,
// but only if the lock still holds its token. Everyone else subscribes to
// the value's channel and waits, without polling, until the value arrives,
// the holder reports a failure, or the holder's lock expires, at which point
// a waiter takes over.
package memolock

import (
	"context"
	"fmt"
	"log/slog"
	"reflect"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
)

// FetchFunc computes a value on a miss. It returns the value, how long Redis
// keeps it (0 keeps it forever; a negative TTL hands the value to this
// flight's callers, and publishes it to the waiters elsewhere whose
// subscriptions are live, without storing it: a waiter that subscribes
// too late computes it again), and an error.
//
// ctx carries the values of the first caller's context but not its deadline:
// fetch serves every caller of the flight, and waiters in other processes
// too, so callers that leave never cancel it. ctx is cancelled when the
// Client is closed.
//
// lease is the lock that fetch holds. The Client renews it while fetch runs;
// fetch may check it or extend it. lease is nil when Options.FailOpen runs
// fetch without a lock.
type FetchFunc func(ctx context.Context, lease *Lease) (value []byte, ttl time.Duration, err error)

// StartFunc starts work that another program finishes: that program SETs
// the value and PUBLISHes it on the value's channel (see KeyScheme). Used
// with GetExternal. The lease is not renewed automatically; StartFunc, or the
// program through Lease.Token, may extend it.
type StartFunc func(ctx context.Context, lease *Lease) error

// Options configure a Client. A nil *Options means all defaults.
type Options struct {
	// LockTTL is how long a lock lives when nobody renews it: how long
	// waiters wait for a holder that died before they take over. While fetch
	// runs, the lock is renewed every LockTTL/3. Redis gets it in whole
	// milliseconds. Default is 10 seconds; anything under 1ms is rejected.
	LockTTL time.Duration

	// FailOpen makes Get run fetch locally, without a lock and without
	// storing the value, when Redis cannot be reached (a network error, a
	// timeout, an exhausted pool). Callers in this process still share one
	// fetch, but every process computes on its own, so an outage turns into
	// a stampede on whatever fetch calls. Error replies from Redis (WRONGTYPE,
	// CROSSSLOT, OOM, ...) are never outages: they are returned. By default
	// (false) Get returns an error wrapping ErrRedis instead.
	FailOpen bool

	// HashIDs replaces every id by its SHA-256 in hex (see HashID) before it
	// reaches Redis, which bounds key length at 64 bytes plus the tag. Peers
	// must hash the same way to share values.
	HashIDs bool

	// HashTags places the keys and channels of each id in one Redis
	// Cluster slot by wrapping the id (hashed, with HashIDs) in braces:
	// T:{I}, T/lock:{I}, T/notif:{I} and so on (see PlaceID). It is on by
	// itself when rdb is a *redis.ClusterClient; set it for another client
	// in front of a cluster (a proxy). Ids with braces of their own are
	// wrapped too ("{user-42}" goes as "{{user-42}}"), so that no two ids
	// share keys. The empty id and ids that start with "}" cannot be placed
	// (use HashIDs), and the tag must not contain braces. Original
	// redis-memolock peers know nothing of it: they cannot share a tag
	// with a client that places ids.
	HashTags bool

	// FetchTimeout, if set, bounds how long fetch may hold the lock. When
	// it passes, fetch's context is cancelled, the lock is released with a
	// failure event (waiters elsewhere get ErrHolderFailed at once), and
	// the callers get an error wrapping ErrTimeout, so that a hung
	// dependency cannot freeze a key in every process while its watchdog
	// renews the lock. fetch may go on running until it returns; Close
	// waits for it. With StaleTTL and a stale copy, the time-out is a
	// failure like any other: the copy is served instead. WithFetchTimeout
	// overrides it per call. Default: none.
	FetchTimeout time.Duration

	// L1Size, if positive, puts an in-process cache of at most that many
	// values in front of Redis, kept coherent by Redis's client-side
	// caching: CLIENT TRACKING in broadcasting mode for the tag's keys, on
	// the connection that reads the client's pub/sub. Any write to a
	// value's key, by anyone, drops it from every L1 within milliseconds
	// while that connection is healthy, and the whole L1 is dropped when it
	// fails or is redialled (a silent failure is noticed within about 6 s).
	// A server without tracking, or an ACL user refused the invalidation
	// channel, leaves the L1 empty. Values
	// enter the L1 from Redis, with the time Redis has left on them. It
	// needs a *redis.Client (a failover client is one) on a server with
	// CLIENT TRACKING (Redis 6 or later); on a server without it the L1
	// stays empty. The client then keeps its pub/sub connection open from
	// New on.
	L1Size int

	// NegTTL is how long Redis remembers that fetch found nothing: fetch
	// reports it by returning an error that matches ErrNotFound, and
	// callers here and waiters elsewhere get an error wrapping ErrNotFound.
	// For NegTTL, every lookup of the id answers so at once, without
	// calling fetch, until a value is stored, Set or Delete. The record is
	// a side key of its own (KeyScheme.NotFound), so a cached "not found"
	// is never confused with an empty value. Default 0: nothing is
	// recorded, and the next lookup calls fetch again.
	NegTTL time.Duration

	// StaleTTL, if set, keeps a copy of every value this client stores
	// for that much longer than the value itself (KeyScheme.Stale; values
	// stored for ever get none). When fetch then fails with an error (not
	// a panic), the callers get the stale copy, served as ServedStale,
	// instead of the error, which goes to Logger; the copy is put back in
	// Redis for ResurrectTTL, during which every Get, Lookup and GetMany of
	// a client with StaleTTL, in any process, gets it flagged stale, and
	// nobody calls fetch. (A client without StaleTTL, and the Python and C#
	// peers, read it as an ordinary value, and may keep it in their L1 for
	// that long.) A waiter whose context ends, or whose holder fails, also
	// gets the stale copy when its last lookup saw one. The copy doubles
	// the memory a value takes in Redis.
	StaleTTL time.Duration

	// ResurrectTTL is how long a stale value is served after a failed
	// fetch before fetch is tried again. Default DefaultResurrectTTL.
	ResurrectTTL time.Duration

	// RefreshAhead, if set, refreshes values before they expire: the
	// first lookup that finds a value with less than RefreshAhead left
	// takes the lock (one caller across all processes, as for a miss),
	// returns the current value at once, and runs fetch in the background
	// to store the next one, while every caller keeps reading the current
	// value. A hot key then never misses, as long as fetch takes less
	// than RefreshAhead. Values stored with a TTL under twice RefreshAhead
	// are not refreshed (they would be born inside the window): they
	// expire as usual. A refresh that fails leaves the value alone until
	// it expires, and the failure goes to Logger. Only Get refreshes;
	// GetMany and Lookup read the value as it is. L1 entries expire
	// RefreshAhead early, so that their readers reach Redis in the window.
	RefreshAhead time.Duration

	// Logger, if set, gets what goes wrong out of the callers' sight, and
	// never a line per call: warnings when Redis becomes unreachable and
	// when it answers again, when a lease is lost or a store fails, when
	// a stale value is served because fetch failed, and when a background
	// refresh fails; information on a takeover; debug lines on pub/sub
	// reconnects. Lines carry the tag (and the id, where one is concerned),
	// never a value or a
	// password. Default: nothing is logged.
	Logger *slog.Logger

	// MeterProvider makes the client's OpenTelemetry instruments (see
	// the README's Observability section for the list): counters of how
	// calls were served, fetches, failures, takeovers and outages;
	// histograms of fetch, wait and Get durations; gauges of waiting
	// flights, flights and subscribed channels. Every measurement carries
	// the tag, never the id. Default: the global provider
	// (otel.GetMeterProvider), so an application that has set one up gets
	// memolock's metrics with no code.
	MeterProvider metric.MeterProvider

	// TracerProvider makes the client's spans: one per call that misses
	// the L1, with a child span for fetch, and a link from a waiter's span
	// to the span of the holder it waited for, in any process. Default:
	// the global provider (otel.GetTracerProvider).
	TracerProvider trace.TracerProvider

	// OnWait, if set, is called when a flight starts waiting for a lock held
	// by somebody else, with the caller's id and the holder's token. It runs
	// on the flight's goroutine: keep it quick. A panic in it is recovered
	// and ignored.
	OnWait func(id, holder string)
}

// discard is the Logger of a client without Options.Logger.
var discard = slog.New(slog.DiscardHandler)

// DefaultLockTTL is the lock TTL used when Options.LockTTL is zero.
const DefaultLockTTL = 10 * time.Second

// DefaultResurrectTTL is the resurrection time used when Options.StaleTTL
// is set and Options.ResurrectTTL is zero.
const DefaultResurrectTTL = 5 * time.Second

// closeWait bounds how long Close waits for calls to Redis: releasing held
// locks, lookups under way (which may take a lock that their flight then
// releases), and closing the pub/sub connection.
const closeWait = time.Second

// A Client computes values of one tag once across processes. It is safe for
// concurrent use. Make one with New; the zero value is not usable.
//
// Once it first waits for a value, a Client holds one pub/sub connection,
// made through the redis client, and two goroutines that tend it; under
// load, a few short-lived goroutines send overlapping lookups as pipelines;
// while Redis is unreachable, one goroutine probes it. Close stops them.
type Client struct {
	rdb          redis.UniversalClient
	keys         KeyScheme
	proto        protocol
	lockTTL      time.Duration
	failOpen     bool
	hashIDs      bool
	hashTags     bool // Options.HashTags, or a cluster client
	onWait       func(id, holder string)
	fetchTimeout time.Duration // Options.FetchTimeout
	negTTL       time.Duration // Options.NegTTL
	staleTTL     time.Duration // Options.StaleTTL
	resurrectTTL time.Duration // Options.ResurrectTTL, defaulted
	early        time.Duration // Options.RefreshAhead
	log          *slog.Logger  // Options.Logger; never nil
	meters       *meters       // from Options.MeterProvider
	tracer       trace.Tracer  // from Options.TracerProvider
	tagAttr      attribute.KeyValue
	// spanOpts and fetchSpanOpts start the Get and fetch spans: made
	// once, so that a call with a no-op tracer allocates nothing for them.
	spanOpts, fetchSpanOpts []trace.SpanStartOption
	l1                      *l1             // nil without Options.L1Size
	tracker                 *redis.Client   // the subscriber's own client, with an L1
	tracking                chan struct{}   // closed when track returns, with an L1
	calls                   context.Context // cancelled by Close: Purge and other bounded calls
	stopCalls               context.CancelFunc

	flights group
	sub     *subscriber // nil on a cluster
	shards  *shards     // on a cluster
	batch   *batcher
	outage  *outage
	stats   counters

	wg        sync.WaitGroup // flights' goroutines and the batcher's
	callbacks sync.WaitGroup // fetch and start functions running
	closed    chan struct{}  // closed when Close has finished
}

// New returns a Client for the values of tag, stored through rdb. It makes
// no connection itself: the first Get uses rdb, and the pub/sub connection
// is made when the client first waits for a value.
func New(rdb redis.UniversalClient, tag string, opts *Options) (*Client, error) {
	if rdb == nil || isNilPointer(rdb) {
		return nil, fmt.Errorf("%w: redis client is nil", ErrInvalid)
	}
	keys, err := NewKeyScheme(tag)
	if err != nil {
		return nil, err
	}
	if opts == nil {
		opts = &Options{}
	}
	lockTTL := opts.LockTTL
	switch {
	case lockTTL == 0:
		lockTTL = DefaultLockTTL
	case lockTTL < time.Millisecond:
		return nil, fmt.Errorf("%w: LockTTL %v is under 1ms; Redis locks are set in whole milliseconds", ErrInvalid, lockTTL)
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"FetchTimeout", opts.FetchTimeout}, {"NegTTL", opts.NegTTL}, {"StaleTTL", opts.StaleTTL},
		{"ResurrectTTL", opts.ResurrectTTL}, {"RefreshAhead", opts.RefreshAhead}} {
		switch {
		case d.v < 0:
			return nil, fmt.Errorf("%w: %s %v is negative; use 0 to turn it off", ErrInvalid, d.name, d.v)
		case d.v > 0 && d.v < time.Millisecond && d.name != "FetchTimeout":
			return nil, fmt.Errorf("%w: %s %v is under 1ms; Redis keeps times in whole milliseconds", ErrInvalid, d.name, d.v)
		}
	}
	resurrectTTL := opts.ResurrectTTL
	if resurrectTTL == 0 {
		resurrectTTL = DefaultResurrectTTL
	}
	log := opts.Logger
	if log == nil {
		log = discard
	}
	_, cluster := rdb.(*redis.ClusterClient)
	hashTags := opts.HashTags || cluster
	if hashTags && strings.ContainsAny(tag, "{}") {
		return nil, fmt.Errorf("%w: tag %q contains a brace; with hash tags (Options.HashTags, or a cluster client) the id's braces must be the first in every key", ErrInvalid, tag)
	}
	mp, tp := opts.MeterProvider, opts.TracerProvider
	if mp == nil || isNilPointer(mp) {
		mp = otel.GetMeterProvider()
	}
	if tp == nil || isNilPointer(tp) {
		tp = otel.GetTracerProvider()
	}
	c := &Client{
		tracer:       tp.Tracer(scope),
		tagAttr:      attribute.String("memolock.tag", tag),
		rdb:          rdb,
		keys:         keys,
		hashTags:     hashTags,
		lockTTL:      lockTTL.Truncate(time.Millisecond),
		failOpen:     opts.FailOpen,
		hashIDs:      opts.HashIDs,
		onWait:       opts.OnWait,
		fetchTimeout: opts.FetchTimeout,
		negTTL:       opts.NegTTL.Truncate(time.Millisecond),
		staleTTL:     opts.StaleTTL.Truncate(time.Millisecond),
		resurrectTTL: resurrectTTL.Truncate(time.Millisecond),
		early:        opts.RefreshAhead.Truncate(time.Millisecond),
		log:          log,
		closed:       make(chan struct{}),
	}
	if opts.L1Size < 0 {
		return nil, fmt.Errorf("%w: L1Size %d is negative; use 0 for no L1", ErrInvalid, opts.L1Size)
	}
	if opts.L1Size > 0 {
		c.l1 = newL1(tag, opts.L1Size)
		if c.tracker, err = c.l1.trackingClient(rdb); err != nil {
			c.l1.cache.StopAllGoroutines()
			return nil, err
		}
		c.sub = newSubscriber(c.tracker, &c.stats)
		c.sub.log = log.With("tag", tag)
		c.sub.onBreak = c.l1.down
		c.l1.sub = c.sub
		c.tracking = make(chan struct{})
		w := c.sub.watchTracking(invalidationChannel)
		go func() {
			defer close(c.tracking)
			c.track(w)
		}()
	} else if cc, ok := rdb.(*redis.ClusterClient); ok {
		c.shards = newShards(cc, &c.stats)
		c.shards.log = log.With("tag", tag)
	} else {
		c.sub = newSubscriber(rdb, &c.stats)
		c.sub.log = log.With("tag", tag)
	}
	c.calls, c.stopCalls = context.WithCancel(context.Background())
	c.batch = newBatcher(rdb, &c.stats, &c.wg)
	c.outage = newOutage(rdb, &c.stats)
	c.outage.log = log.With("tag", tag)
	sc := plainScripts
	if cluster {
		sc = shardedScripts
	}
	c.proto = protocol{rdb: rdb, keys: keys, sc: sc, batch: c.batch, stale: c.staleTTL, early: c.early}
	c.flights.stale = &c.stats.stale
	c.flights.calls = &c.stats
	c.spanOpts = []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindClient), trace.WithAttributes(c.tagAttr)}
	c.fetchSpanOpts = []trace.SpanStartOption{trace.WithAttributes(c.tagAttr)}
	// Last: the callback it registers reads the client, which must be
	// whole by then. A provider that cannot make the instruments costs
	// the metrics, not the client.
	if c.meters, err = newMeters(mp, tag, c); err != nil {
		c.log.Warn("memolock: the MeterProvider could not make memolock's instruments; no metrics",
			"tag", tag, "error", err)
	}
	return c, nil
}

func isNilPointer(v any) bool {
	rv := reflect.ValueOf(v)
	return rv.Kind() == reflect.Pointer && rv.IsNil()
}

// errNilClient answers calls on a nil or zero-value Client.
var errNilClient = fmt.Errorf("%w: memolock client is nil or not made by New", ErrInvalid)

var errNilFetch = fmt.Errorf("%w: fetch is nil", ErrInvalid)

// usable reports errNilClient for a nil or zero-value Client.
func (c *Client) usable() error {
	if c == nil || c.rdb == nil {
		return errNilClient
	}
	return nil
}

// Keys returns the client's key scheme; the zero KeyScheme for a nil Client.
func (c *Client) Keys() KeyScheme {
	if c == nil {
		return KeyScheme{}
	}
	return c.keys
}

// Stats returns a copy of the client's counters; zero for a nil Client.
func (c *Client) Stats() Stats {
	if c == nil {
		return Stats{}
	}
	s := c.stats.snapshot()
	s.Gets, s.Coalesced = c.flights.counts()
	return s
}

// Get returns the value of id. If Redis holds it, that is the answer.
// Otherwise exactly one caller across all processes, the lock winner, runs
// fetch and stores its value, and every other caller waits for it.
//
// Concurrent calls for one id in this process share one flight and get the
// same slice, which callers must not modify. If ctx ends first, Get returns
// at once, whatever Redis is doing, with an error matching both ErrTimeout
// and ctx.Err(); the flight goes on for the other callers, and a fetch
// already running is never cancelled by its callers.
//
// If fetch fails or panics, the lock is released, the callers of this flight
// get the error (a panic wraps ErrFetchPanicked), waiters in other processes
// get an error wrapping ErrHolderFailed within milliseconds, and nothing is
// stored; with Options.StaleTTL, an error (not a panic) serves the stale
// copy instead, if there is one. If fetch reports ErrNotFound, every caller
// and waiter gets an error wrapping ErrNotFound, which Options.NegTTL
// caches. If the lock was lost while fetch ran, the value is returned but not
// stored, and waiters elsewhere look again at once. If storing fails, the
// value is returned and waiters elsewhere take over when the lock expires.
//
// While Redis is unreachable, Get fails at once with an error wrapping
// ErrRedis (or runs fetch locally under Options.FailOpen), and a probe
// notices within a second when Redis answers again.
func (c *Client) Get(ctx context.Context, id string, fetch FetchFunc) ([]byte, error) {
	if fetch == nil {
		return nil, errNilFetch
	}
	val, _, err := c.do(ctx, id, fetch, nil)
	return val, err
}

// GetExternal is Get for values that another program produces: the lock
// winner calls start, which starts the work elsewhere, and then waits like
// everybody else for the value to be SET and PUBLISHed on KeyScheme.Notif.
// The winner keeps its lock until the value arrives, even if its callers
// leave, and Close releases it. If the lock expires first, the next caller
// starts the work again. This is the original redis-memolock's
// GetResourceExternal.
func (c *Client) GetExternal(ctx context.Context, id string, start StartFunc) ([]byte, error) {
	if start == nil {
		return nil, fmt.Errorf("%w: start is nil", ErrInvalid)
	}
	val, _, err := c.do(ctx, id, nil, start)
	return val, err
}

// do is one caller's Get: the flight's answer, counted, timed and traced.
func (c *Client) do(ctx context.Context, id string, fetch FetchFunc, start StartFunc) ([]byte, Served, error) {
	var cl call
	f, val, served, err := c.get(ctx, id, fetch, start, &cl)
	if !cl.begun {
		return val, served, err // answered (and counted) before Redis
	}
	if f != nil {
		val, served, err = c.flights.await(ctx, f)
	}
	c.observe(cl, served, err) // the flight counted the answer
	return val, served, err
}

// get starts or joins the flight for id. It returns the value or an error,
// or a flight to await (the caller awaits it itself, so that a woken
// caller returns through fewer frames), and the call as observed so far.
func (c *Client) get(ctx context.Context, id string, fetch FetchFunc, start StartFunc, cl *call) (*flight, []byte, Served, error) {
	if err := c.usable(); err != nil {
		return nil, nil, 0, err
	}
	key, err := c.wireID(id)
	switch {
	case ctx == nil:
		err = fmt.Errorf("%w: context is nil", ErrInvalid)
	case ctx.Err() != nil:
		err = fmt.Errorf("%w: %w", ErrTimeout, ctx.Err())
	}
	if err != nil {
		c.stats.count(0, err)
		return nil, nil, 0, err
	}
	if c.l1 != nil {
		if v, notFound, ok := c.l1.get(key); ok {
			if notFound {
				c.stats.calls[ServedL1][gotNotFound].Add(1)
				return nil, nil, ServedL1, c.notFoundErr(id)
			}
			c.stats.calls[ServedL1][gotValue].Add(1)
			return nil, v, ServedL1, nil
		}
	}
	*cl = c.begin(ctx)
	f, leader, err := c.flights.join(key, func() *flight {
		c.trace(cl, id)
		f := &flight{id: id, key: key, span: cl.span, fetch: fetch, start: start, done: make(chan struct{})}
		f.token, f.claim = c.claimSpan(cl.ctx, f)
		return f
	}, &c.wg)
	if err != nil {
		c.stats.count(0, err)
		return nil, nil, 0, err
	}
	if !leader {
		if f.span != nil {
			// Traced flights only: a thousand callers joining one that
			// nobody traces must not each start a span for nothing.
			c.trace(cl, id)
			cl.joined(f)
		}
		return f, nil, 0, nil
	}
	ctx = cl.ctx
	if c.l1 != nil {
		f.l1 = c.l1.snap(key) // before anything is read
	}
	if ctx.Done() != nil {
		// A caller that may leave must not wait on Redis itself: go-redis
		// ignores context deadlines by default.
		c.flights.launch(f, ctx)
		go c.resolve(f, nil)
		return f, nil, 0, nil
	}
	// This caller cannot leave, so the first lookup runs on its goroutine
	// and a hit costs no goroutine.
	a := c.lookup(ctx, f)
	if a.err == nil && (a.r.kind == replyHit || a.r.kind == replyRefresh) {
		c.stats.hits.Add(1)
		served := ServedRedis
		if a.r.stale {
			served = ServedStale
			c.stats.stale.Add(1)
		}
		mine := c.flights.finish(f, a.r.value, nil, served)
		f.endClaim()
		if a.r.kind == replyRefresh {
			c.refresh(f, ctx)
		}
		if mine && c.l1 != nil && f.l1.ok && served == ServedRedis && a.r.kind == replyHit {
			go func() {
				defer c.wg.Done() // the flight's, kept for this
				c.promoteFromRedis(key, a.r.value, f.l1)
			}()
		} else {
			c.wg.Done()
		}
		if !mine {
			return f, nil, 0, nil // Close finished it first: its answer, as counted
		}
		return nil, a.r.value, served, nil
	}
	c.flights.launch(f, ctx)
	go c.resolve(f, &a)
	return f, nil, 0, nil
}

// attempt is the outcome of one lookup.
type attempt struct {
	r   reply
	err error
	// sent is set when the acquire script may have run despite err: the
	// lock may hold the flight's token.
	sent bool
}

// lookup runs acquire for f, or fails at once during an outage.
func (c *Client) lookup(ctx context.Context, f *flight) attempt {
	if err := c.outage.err(); err != nil {
		return attempt{err: err}
	}
	early := c.early
	if f.fetch == nil || f.batched {
		early = 0 // only Get refreshes ahead: see refresh
	}
	r, err := c.proto.acquire(ctx, f.key, f.token, c.lockTTL, early)
	if err != nil {
		c.outage.report(err)
		return attempt{err: err, sent: mayHaveRun(err)}
	}
	return attempt{r: r}
}

// resolve runs flight f to its end, from the outcome of its first lookup if
// the caller made it, and finishes it.
func (c *Client) resolve(f *flight, first *attempt) {
	defer c.wg.Done()
	w := &wait{c: c, f: f}
	val, err := c.pursue(f, w, first)
	// Callers first; the rest can wait.
	c.flights.finish(f, val, err, w.served)
	f.endClaim()
	_, o := outcomeOf(w.served, err)
	w.done(o)
	w.end()
	// A value that came while waiting was just stored by its holder,
	// whose write invalidates it: promoting it would be a wasted round trip.
	// A value being refreshed is about to change.
	switch {
	case w.refresh:
		c.refresh(f, f.ctx)
	case c.l1 != nil && w.notFound && w.served == ServedRedis:
		c.l1.promoteNotFound(f.key, w.notFoundTTL, f.l1)
	case c.l1 != nil && err == nil && w.served == ServedRedis:
		c.promoteFromRedis(f.key, val, f.l1)
	}
}

// pursue looks the value up until it has it, computes it, or fails.
func (c *Client) pursue(f *flight, w *wait, a *attempt) ([]byte, error) {
	for {
		if a == nil {
			next := c.lookup(f.ctx, f)
			a = &next
		}
		r, err, sent := a.r, a.err, a.sent
		a = nil
		if err != nil {
			w.maybeLocked = w.maybeLocked || sent
			w.served = ServedComputed // if FailOpen computes
			return c.lookupFailed(f, err)
		}
		switch {
		case r.kind == replyHit || r.kind == replyRefresh:
			w.stale = r.stale
			w.refresh = r.kind == replyRefresh
			n := w.value(r.value)
			return n.val, n.err
		case r.kind == replyNotFound:
			w.served = ServedRedis
			if w.waited {
				w.served = ServedWaited
			}
			w.notFound, w.notFoundTTL = true, r.pttl
			return nil, c.notFound(f)
		case r.kind == replyLocked && f.start == nil:
			f.stale.Store(nil) // ours to compute now: a copy seen before may be gone
			w.takeover()
			w.end() // our own value needs no notification
			w.served = ServedComputed
			return c.hold(f, w, r.pttl)
		case r.kind == replyLocked && w.own.Load() && r.pttl >= 0:
			// External-producer mode: the lock we took is still ours, and
			// the producer still at work.
			r = reply{kind: replyBusy, pttl: r.pttl, holder: f.token}
		case r.kind == replyLocked:
			// External-producer mode: we took the lock, or took it again
			// after it expired. Start the work, unless nobody wants it.
			if c.flights.retire(f) {
				w.own.Store(true) // end releases it
				return nil, errAbandoned
			}
			w.takeover()
			if err := c.startExternal(f); err != nil {
				return nil, err
			}
			r = reply{kind: replyBusy, pttl: c.lockTTL, holder: f.token}
		}
		if n := w.wait(r); !n.again {
			return n.val, n.err
		}
	}
}

// notFound is the error for an id whose fetch found nothing.
func (c *Client) notFound(f *flight) error { return c.notFoundErr(f.id) }

func (c *Client) notFoundErr(id string) error {
	c.stats.notFound.Add(1)
	return fmt.Errorf("%w: id %s", ErrNotFound, quote(id))
}

// lookupFailed ends a flight whose lookup failed.
func (c *Client) lookupFailed(f *flight, err error) ([]byte, error) {
	if f.ctx.Err() != nil {
		return nil, c.ended()
	}
	if c.failOpen && f.fetch != nil && isOutage(err) && c.flights.hold(f, &c.callbacks) {
		c.stats.failOpen.Add(1)
		return c.compute(f, nil, nil, 0)
	}
	return nil, err
}

// ended returns the error for a flight whose context is done.
func (c *Client) ended() error {
	if c.closingNow() {
		return ErrClosed
	}
	return errAbandoned
}

// watch subscribes to channels: on the client's pub/sub connection, or,
// on a cluster, on the node that serves their slot.
func (c *Client) watch(onValue func(string), channels ...string) *watch {
	if c.shards != nil {
		return c.shards.watch(onValue, channels...)
	}
	return c.sub.watch(onValue, channels...)
}

// channels returns the number of channels the client has subscribed.
func (c *Client) channels() int {
	if c.shards != nil {
		return c.shards.channels()
	}
	return c.sub.channels()
}

// closingNow reports whether Close has begun. It reads the flight group's
// state, which Close sets before it cancels any flight, so that work ended
// by Close always finds the client closing.
func (c *Client) closingNow() bool { return c.flights.isClosed() }

// notifyWait calls OnWait for a flight that starts waiting on holder.
func (c *Client) notifyWait(f *flight, holder string) {
	if c.onWait != nil {
		_ = callUser(func() { c.onWait(f.id, holder) })
	}
}

// Close releases the locks this client holds, so waiters elsewhere take over
// at once, cancels the context of running fetches and waits for them to
// return, and closes the pub/sub connection. Callers still waiting get
// ErrClosed at once; a caller whose context has no Done channel may be in
// its first lookup, on its own goroutine, and returns when that lookup
// does. Close does not close the redis client.
//
// Calls to Redis that Close makes or waits for are bounded: if Redis does
// not answer, Close returns after about a second, and calls still blocked
// in go-redis end with go-redis's own timeouts (or when the redis client is
// closed).
//
// Close is safe to call more than once and concurrently; every call returns
// when the client is closed. Called from inside fetch, start or OnWait, it
// starts closing and returns at once, without waiting, and the client
// finishes closing once that callback has returned.
func (c *Client) Close() error {
	if err := c.usable(); err != nil {
		return err
	}
	flights, first := c.flights.close()
	if !first {
		if !inCallback() {
			<-c.closed
		}
		return nil
	}
	c.flights.cancel(flights) // after close: a fetch that returns finds the client closing
	c.stopCalls()
	for _, f := range flights {
		c.flights.finish(f, nil, ErrClosed, 0)
	}
	if inCallback() {
		go c.shutdown()
		return nil
	}
	c.shutdown()
	return nil
}

// shutdown waits for the work Close started to end.
func (c *Client) shutdown() {
	c.callbacks.Wait() // fetches see their cancelled context and return
	deadline := time.Now().Add(closeWait)
	// Every flight: those that hold a lock release it, and a lookup under
	// way may take one, which its flight then releases.
	waitTimeout(&c.wg, time.Until(deadline))
	if c.shards != nil {
		c.shards.close(time.Until(deadline))
	} else {
		c.sub.close(time.Until(deadline))
	}
	if c.l1 != nil {
		<-c.tracking // the subscriber's close ended its watch
		_ = c.tracker.Close()
		c.l1.cache.StopAllGoroutines()
	}
	c.outage.close(time.Until(deadline))
	c.meters.close()
	close(c.closed)
}
