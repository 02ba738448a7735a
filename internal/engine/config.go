package engine

import (
	"context"
	"log/slog"
	"time"

	"github.com/memolock/memolock/internal/wire"
	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
)

// FetchFunc computes a value; package memolock documents it. lease is nil
// when the value is computed without a lock (fail-open).
type FetchFunc func(ctx context.Context, lease *wire.Lease) (value []byte, ttl time.Duration, err error)

// Fetch calls f.
func (f FetchFunc) Fetch(ctx context.Context, lease *wire.Lease) ([]byte, time.Duration, error) {
	return f(ctx, lease)
}

// A Fetcher computes a value: a FetchFunc, or a function type of the
// caller's with a Fetch method, which converts to a Fetcher without
// allocating (a func value is one pointer), where a closure adapting it
// would allocate on every call, flight or not.
type Fetcher interface {
	Fetch(ctx context.Context, lease *wire.Lease) (value []byte, ttl time.Duration, err error)
}

// fetcherOf is f as a Fetcher: nil for nil.
func fetcherOf(f FetchFunc) Fetcher {
	if f == nil {
		return nil
	}
	return f
}

// StartFunc starts work that another program finishes (GetExternal).
type StartFunc func(ctx context.Context, lease *wire.Lease) error

// Config is an engine's configuration, validated and defaulted by package
// memolock (Options.init): every duration is whole milliseconds, and
// nothing here is left to a default.
type Config struct {
	// Single is the client of a single node (or a Sentinel failover
	// client); Cluster the client of a Redis Cluster. Exactly one is set.
	Single  *redis.Client
	Cluster *redis.ClusterClient

	Keys         wire.Keys
	LockTTL      time.Duration
	FailOpen     bool
	FetchTimeout time.Duration // 0: none
	NegTTL       time.Duration // 0: "not found" is not recorded
	StaleTTL     time.Duration // 0: no stale copies
	ResurrectTTL time.Duration
	RefreshAhead time.Duration // 0: no refresh ahead of expiry
	L1Size       int           // 0: no L1
	// Placed is set when ids are placed in one cluster slot each
	// (Options.HashTags): a GetMany read then never spans slots.
	Placed bool

	Log            *slog.Logger // never nil
	MeterProvider  metric.MeterProvider
	TracerProvider trace.TracerProvider
	OnWait         func(id, holder string)

	// PubSubHealth is how long a pub/sub connection may stay silent before
	// it is probed; 0: pubsub's default. Tests shorten it.
	PubSubHealth time.Duration
}

// rdb is the client that routes by key.
func (c *Config) rdb() redis.UniversalClient {
	if c.Cluster != nil {
		return c.Cluster
	}
	return c.Single
}
