package memolock

import (
	"fmt"
	"log/slog"
	"reflect"
	"strings"
	"time"

	"github.com/memolock/memolock/internal/engine"
	"github.com/memolock/memolock/internal/wire"
	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
)

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

	// L1Wait, if positive, makes New wait up to that long for the L1 to
	// be ready (its tracking confirmed live, on every master of a
	// cluster), so that the first reads can be L1 hits; New fails with an
	// error wrapping ErrRedis if Redis refuses tracking (a server without
	// CLIENT TRACKING, or an ACL user refused the invalidation channel:
	// see the README's ACL recipe), or wrapping ErrTimeout if tracking is
	// not live in time. Default 0: New returns at once, the L1 fills once
	// tracking is live, and a refusal is logged and counted in
	// Stats.L1Refusals. It needs L1Size.
	L1Wait time.Duration

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

// DefaultLockTTL is the lock TTL used when Options.LockTTL is zero.
const DefaultLockTTL = 10 * time.Second

// DefaultResurrectTTL is the resurrection time used when Options.StaleTTL
// is set and Options.ResurrectTTL is zero.
const DefaultResurrectTTL = 5 * time.Second

// discard is the Logger of a client without Options.Logger.
var discard = slog.New(slog.DiscardHandler)

// config validates o, for a client of tag through rdb, and returns the
// engine's configuration with every default filled in: the one place that
// does either.
func (o *Options) config(rdb redis.UniversalClient, keys KeyScheme) (engine.Config, error) {
	if o == nil {
		o = &Options{}
	}
	cfg := engine.Config{
		Keys:     wire.NewKeys(keys.Tag()),
		FailOpen: o.FailOpen,
		OnWait:   o.OnWait,
		L1Size:   o.L1Size,
		Log:      o.Logger,
	}
	if err := routeOf(&cfg, rdb); err != nil {
		return cfg, err
	}
	if err := o.durations(&cfg); err != nil {
		return cfg, err
	}
	cfg.Placed = o.HashTags || cfg.Cluster != nil
	switch {
	case cfg.Placed && strings.ContainsAny(keys.Tag(), "{}"):
		return cfg, fmt.Errorf("%w: tag %q contains a brace; with hash tags (Options.HashTags, or a cluster client) the id's braces must be the first in every key", ErrInvalid, keys.Tag())
	case o.L1Size < 0:
		return cfg, fmt.Errorf("%w: L1Size %d is negative; use 0 for no L1", ErrInvalid, o.L1Size)
	}
	if cfg.Log == nil {
		cfg.Log = discard
	}
	cfg.MeterProvider, cfg.TracerProvider = o.MeterProvider, o.TracerProvider
	if cfg.MeterProvider == nil || isNilPointer(cfg.MeterProvider) {
		cfg.MeterProvider = otel.GetMeterProvider()
	}
	if cfg.TracerProvider == nil || isNilPointer(cfg.TracerProvider) {
		cfg.TracerProvider = otel.GetTracerProvider()
	}
	return cfg, nil
}

// durations validates o's durations into cfg, in whole milliseconds.
func (o *Options) durations(cfg *engine.Config) error {
	cfg.LockTTL = o.LockTTL
	switch {
	case cfg.LockTTL == 0:
		cfg.LockTTL = DefaultLockTTL
	case cfg.LockTTL < time.Millisecond:
		return fmt.Errorf("%w: LockTTL %v is under 1ms; Redis locks are set in whole milliseconds", ErrInvalid, cfg.LockTTL)
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"FetchTimeout", o.FetchTimeout}, {"NegTTL", o.NegTTL}, {"StaleTTL", o.StaleTTL},
		{"ResurrectTTL", o.ResurrectTTL}, {"RefreshAhead", o.RefreshAhead}} {
		switch {
		case d.v < 0:
			return fmt.Errorf("%w: %s %v is negative; use 0 to turn it off", ErrInvalid, d.name, d.v)
		case d.v > 0 && d.v < time.Millisecond && d.name != "FetchTimeout":
			return fmt.Errorf("%w: %s %v is under 1ms; Redis keeps times in whole milliseconds", ErrInvalid, d.name, d.v)
		}
	}
	if o.L1Wait < 0 {
		return fmt.Errorf("%w: L1Wait %v is negative; use 0 not to wait", ErrInvalid, o.L1Wait)
	}
	if o.L1Wait > 0 && o.L1Size == 0 {
		return fmt.Errorf("%w: L1Wait %v is set but L1Size is not: there is no L1 to wait for", ErrInvalid, o.L1Wait)
	}
	if o.ResurrectTTL > 0 && o.StaleTTL == 0 {
		return fmt.Errorf("%w: ResurrectTTL %v is set but StaleTTL is not: without StaleTTL no stale copy is kept to serve; set StaleTTL too, or drop ResurrectTTL", ErrInvalid, o.ResurrectTTL)
	}
	cfg.ResurrectTTL = o.ResurrectTTL
	if cfg.ResurrectTTL == 0 {
		cfg.ResurrectTTL = DefaultResurrectTTL
	}
	ms := func(d time.Duration) time.Duration { return d.Truncate(time.Millisecond) }
	cfg.LockTTL, cfg.ResurrectTTL = ms(cfg.LockTTL), ms(cfg.ResurrectTTL)
	cfg.FetchTimeout, cfg.NegTTL, cfg.StaleTTL, cfg.RefreshAhead = o.FetchTimeout, ms(o.NegTTL), ms(o.StaleTTL), ms(o.RefreshAhead)
	return nil
}

// routeOf sets the client of cfg: memolock serves only the clients whose
// routing of keys it knows.
func routeOf(cfg *engine.Config, rdb redis.UniversalClient) error {
	switch c := rdb.(type) {
	case *redis.Client:
		cfg.Single = c
	case *redis.ClusterClient:
		cfg.Cluster = c
	case *redis.Ring:
		return fmt.Errorf("%w: a *redis.Ring cannot be served: it places each key by its own hash, so a lock and the value it guards, or a lock and its renewals, can land on different shards; use a *redis.Client per shard, or a *redis.ClusterClient", ErrInvalid)
	default:
		return fmt.Errorf("%w: a redis client of type %T cannot be served: memolock must know how its keys are routed; pass a *redis.Client (a single node, or NewFailoverClient for Sentinel) or a *redis.ClusterClient", ErrInvalid, rdb)
	}
	return nil
}

func isNilPointer(v any) bool {
	rv := reflect.ValueOf(v)
	return rv.Kind() == reflect.Pointer && rv.IsNil()
}
