package bench

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"testing"
	"time"

	"github.com/go-redis/cache/v9"
	"github.com/memolock/memolock"
	"github.com/redis/go-redis/v9"
	"github.com/redis/rueidis"
	"github.com/redis/rueidis/rueidisaside"
)

// The comparison: 64 goroutines (b.SetParallelism over GOMAXPROCS) reading
//   - BenchmarkKeys1024: a key drawn uniformly at random from 1,024 cached keys,
//   - BenchmarkHotKey: one hot key,
//
// through memolock without L1, memolock with L1 (Options{L1Size: 4096}),
// go-redis/cache with cache.NewTinyLFU(4096, time.Hour), and rueidisaside
// (client-side caching, local TTL time.Hour). Every cache is warm before
// b.ResetTimer: the memolock L1 and rueidis's cache answer every key
// locally, and TinyLFU holds every key.
//
//	go test -run '^$' -bench . -benchtime 2s -count 3

const (
	goroutines = 64
	nKeys      = 1024
	l1Size     = 4096
	localTTL   = time.Hour // TinyLFU's and rueidis's local TTL in the benchmarks
)

// value is what every key holds: the same bytes for every implementation.
func value(i int) string { return fmt.Sprintf("value of key %d, some payload", i) }

// target is one implementation under test.
type target struct {
	name string
	// get reads one key (an id for memolock, a Redis key for the others).
	get func(ctx context.Context, id string) error
	// warm makes every id a local hit (or, without a local cache, loads
	// what the first call loads), or fails.
	warm func(tb testing.TB, ids []string)
	// after reports per-op metrics and checks the run was served as meant.
	after func(b *testing.B, ids []string) func()
	ids   []string
	hot   []string
}

func ids(prefix string) (all, hot []string) {
	all = make([]string, nKeys)
	for i := range all {
		all[i] = prefix + fmt.Sprint(i)
	}
	return all, []string{prefix + "hot"}
}

func newRedis(tb testing.TB, addr string) *redis.Client {
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	tb.Cleanup(func() { _ = rdb.Close() })
	return rdb
}

// store writes the values with plain SETs, without TTL.
func store(tb testing.TB, rdb *redis.Client, keys ...string) {
	tb.Helper()
	pipe := rdb.Pipeline()
	for i, k := range keys {
		pipe.Set(context.Background(), k, value(i), 0)
	}
	if _, err := pipe.Exec(context.Background()); err != nil {
		tb.Fatal(err)
	}
}

func prefixed(prefix string, ids []string) []string {
	out := make([]string, len(ids))
	for i, id := range ids {
		out[i] = prefix + id
	}
	return out
}

var errMiss = errors.New("benchmark: unexpected miss")

var failFetch memolock.FetchFunc = func(context.Context, *memolock.Lease) ([]byte, time.Duration, error) {
	return nil, 0, errMiss
}

func memolockTarget(tb testing.TB, addr string, withL1 bool) target {
	tag, opts, name := "ml", (*memolock.Options)(nil), "memolock"
	if withL1 {
		tag, opts, name = "ml1", &memolock.Options{L1Size: l1Size}, "memolock-L1"
	}
	rdb := newRedis(tb, addr)
	c, err := memolock.New(rdb, tag, opts)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = c.Close() })
	all, hot := ids("")
	store(tb, rdb, prefixed(tag+":", all)...)
	store(tb, rdb, prefixed(tag+":", hot)...)
	t := target{name: name, ids: all, hot: hot}
	t.get = func(ctx context.Context, id string) error {
		v, err := c.Get(ctx, id, failFetch)
		if err == nil && len(v) == 0 {
			err = errMiss
		}
		return err
	}
	t.warm = func(tb testing.TB, ids []string) {
		deadline := time.Now().Add(10 * time.Second)
		for _, id := range ids {
			for {
				r, err := c.GetResult(context.Background(), id, failFetch)
				if err != nil {
					tb.Fatal(err)
				}
				// Without L1 a read from Redis is the best there is; with
				// it, wait until tracking is live and the value promoted.
				if !withL1 || r.Served == memolock.ServedL1 {
					break
				}
				if time.Now().After(deadline) {
					tb.Fatalf("%s: %q never served from the L1 (last: %v)", name, id, r.Served)
				}
				time.Sleep(time.Millisecond)
			}
		}
	}
	t.after = func(b *testing.B, _ []string) func() {
		before := c.Stats()
		return func() {
			s := c.Stats()
			if withL1 {
				l1 := float64(s.L1Hits-before.L1Hits) / float64(b.N)
				b.ReportMetric(l1, "l1hits/op")
				if l1 < 0.99 {
					b.Errorf("only %.3f of reads were L1 hits", l1)
				}
			} else {
				b.ReportMetric(float64(s.Coalesced-before.Coalesced)/float64(b.N), "coalesced/op")
			}
		}
	}
	return t
}

// tinyLFUTarget is go-redis/cache with its TinyLFU local cache, read with
// Cache.Get into a *[]byte (the cheapest typed path: it copies the bytes,
// no msgpack). Values are plain bytes in Redis, which go-redis/cache
// stores and reads unencoded.
func tinyLFUTarget(tb testing.TB, addr string, ttl time.Duration) (target, *cache.Cache, *cache.TinyLFU) {
	rdb := newRedis(tb, addr)
	local := cache.NewTinyLFU(l1Size, ttl)
	cd := cache.New(&cache.Options{Redis: rdb, LocalCache: local, StatsEnabled: true})
	all, hot := ids("grc:")
	store(tb, rdb, all...)
	store(tb, rdb, hot...)
	t := target{name: "go-redis-cache-TinyLFU", ids: all, hot: hot}
	t.get = func(ctx context.Context, key string) error {
		var v []byte
		err := cd.Get(ctx, key, &v)
		if err == nil && len(v) == 0 {
			err = errMiss
		}
		return err
	}
	t.warm = func(tb testing.TB, keys []string) {
		deadline := time.Now().Add(10 * time.Second)
		for _, k := range keys {
			for {
				var v []byte
				if err := cd.Get(context.Background(), k, &v); err != nil {
					tb.Fatal(err)
				}
				if _, ok := local.Get(k); ok {
					break
				}
				if time.Now().After(deadline) {
					tb.Fatalf("TinyLFU never admitted %q", k)
				}
			}
		}
	}
	t.after = func(b *testing.B, _ []string) func() {
		before := *cd.Stats()
		return func() {
			s := *cd.Stats()
			reads := float64(s.Hits+s.Misses-before.Hits-before.Misses) / float64(b.N)
			b.ReportMetric(reads, "redis-reads/op")
			if reads > 0.01 {
				b.Errorf("%.3f of reads went to Redis", reads)
			}
		}
	}
	return t, cd, local
}

// asideTarget is rueidisaside: rueidis's cache-aside client on RESP3
// client-side caching (CLIENT TRACKING, default mode), local TTL ttl.
func asideTarget(tb testing.TB, addr string, ttl time.Duration) (target, rueidisaside.CacheAsideClient) {
	ca, err := rueidisaside.NewClient(rueidisaside.ClientOption{
		ClientOption: rueidis.ClientOption{InitAddress: []string{addr}},
	})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(ca.Close)
	all, hot := ids("rue:")
	rdb := newRedis(tb, addr)
	store(tb, rdb, all...)
	store(tb, rdb, hot...)
	fn := func(context.Context, string) (string, error) { return "", errMiss }
	t := target{name: "rueidisaside", ids: all, hot: hot}
	t.get = func(ctx context.Context, key string) error {
		v, err := ca.Get(ctx, ttl, key, fn)
		if err == nil && v == "" {
			err = errMiss
		}
		return err
	}
	isHit := func(k string) bool {
		c := ca.Client()
		return c.DoCache(context.Background(), c.B().Get().Key(k).Cache(), ttl).IsCacheHit()
	}
	t.warm = func(tb testing.TB, keys []string) {
		deadline := time.Now().Add(10 * time.Second)
		for _, k := range keys {
			for {
				if _, err := ca.Get(context.Background(), ttl, k, fn); err != nil {
					tb.Fatal(err)
				}
				if isHit(k) {
					break
				}
				if time.Now().After(deadline) {
					tb.Fatalf("rueidis never cached %q", k)
				}
				time.Sleep(time.Millisecond)
			}
		}
	}
	t.after = func(b *testing.B, keys []string) func() {
		return func() {
			// rueidisaside keeps no counters: check that the keys are still
			// local hits after the run.
			for _, k := range keys[:min(len(keys), 16)] {
				if !isHit(k) {
					b.Errorf("%q no longer a local hit", k)
				}
			}
		}
	}
	return t, ca
}

func targets(b *testing.B) []target {
	addr := needRedis(b)
	t1, _, _ := tinyLFUTarget(b, addr, localTTL)
	t2, _ := asideTarget(b, addr, localTTL)
	return []target{
		memolockTarget(b, addr, false),
		memolockTarget(b, addr, true),
		t1,
		t2,
	}
}

// runParallel runs body on 64 goroutines in all.
func runParallel(b *testing.B, body func(pb *testing.PB)) {
	b.SetParallelism(max(1, goroutines/runtime.GOMAXPROCS(0)))
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(body)
	b.StopTimer()
}

// BenchmarkKeys1024: 64 goroutines, each read a key drawn uniformly at
// random from 1,024 cached keys.
func BenchmarkKeys1024(b *testing.B) {
	for _, t := range targets(b) {
		b.Run(t.name, func(b *testing.B) {
			t.warm(b, t.ids)
			done := t.after(b, t.ids)
			ctx := context.Background()
			runParallel(b, func(pb *testing.PB) {
				for pb.Next() {
					if err := t.get(ctx, t.ids[rand.IntN(nKeys)]); err != nil {
						b.Error(err)
						return
					}
				}
			})
			done()
		})
	}
}

// BenchmarkHotKey: 64 goroutines read one key.
func BenchmarkHotKey(b *testing.B) {
	for _, t := range targets(b) {
		b.Run(t.name, func(b *testing.B) {
			t.warm(b, t.hot)
			done := t.after(b, t.hot)
			ctx := context.Background()
			hot := t.hot[0]
			runParallel(b, func(pb *testing.PB) {
				for pb.Next() {
					if err := t.get(ctx, hot); err != nil {
						b.Error(err)
						return
					}
				}
			})
			done()
		})
	}
}
