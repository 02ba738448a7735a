package bench

import (
	"context"
	"testing"
	"time"

	"github.com/memolock/memolock"
)

// coherenceTTL is the local TTL of the TinyLFU in TestCoherence:
// cache.NewTinyLFU(1000, 2*time.Second). go-redis/cache adds a random
// jitter of up to TTL/10 (200 ms), so an entry lives 2 to 2.2 s after it
// was read from Redis, whatever happens in Redis meanwhile.
const coherenceTTL = 2 * time.Second

// TestCoherence writes a new value with a raw SET (not through any of the
// libraries) after each local cache holds the old one:
//
//   - memolock with L1 serves the new value within a short eventually-loop
//     (CLIENT TRACKING invalidates the entry);
//   - go-redis/cache + TinyLFU keeps serving the old value until the entry's
//     local TTL runs out (2 s + up to 200 ms jitter), then the new one;
//   - rueidisaside, on client-side caching like memolock's L1, serves the new
//     value within the same eventually-loop.
func TestCoherence(t *testing.T) {
	addr := needRedis(t)
	ctx := context.Background()
	rdb := newRedis(t, addr)

	t.Run("memolock-L1", func(t *testing.T) {
		c, err := memolock.New(rdb, "coh", &memolock.Options{L1Size: 1000})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if err := rdb.Set(ctx, "coh:k", "old", 0).Err(); err != nil {
			t.Fatal(err)
		}
		eventually(t, 5*time.Second, "old value served from the L1", func() bool {
			r, err := c.GetResult(ctx, "k", failFetch)
			return err == nil && r.Served == memolock.ServedL1 && string(r.Value) == "old"
		})
		if err := rdb.Set(ctx, "coh:k", "new", 0).Err(); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		eventually(t, time.Second, "new value after a raw SET", func() bool {
			v, err := c.Get(ctx, "k", failFetch)
			return err == nil && string(v) == "new"
		})
		t.Logf("memolock-L1 served the new value %v after the raw SET", time.Since(start).Round(time.Microsecond))
	})

	t.Run("rueidisaside", func(t *testing.T) {
		tgt, ca := asideTarget(t, addr, time.Hour)
		key := tgt.hot[0]
		tgt.warm(t, tgt.hot) // now a local hit
		if err := rdb.Set(ctx, key, "new", 0).Err(); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		fn := func(context.Context, string) (string, error) { return "", errMiss }
		eventually(t, time.Second, "new value after a raw SET", func() bool {
			v, err := ca.Get(ctx, time.Hour, key, fn)
			return err == nil && v == "new"
		})
		t.Logf("rueidisaside served the new value %v after the raw SET", time.Since(start).Round(time.Microsecond))
	})

	t.Run("go-redis-cache-TinyLFU", func(t *testing.T) {
		tgt, cd, local := tinyLFUTarget(t, addr, coherenceTTL)
		key := tgt.hot[0]
		read := func() string {
			var v []byte
			if err := cd.Get(ctx, key, &v); err != nil {
				t.Fatal(err)
			}
			return string(v)
		}
		cached := time.Now()
		old := read() // from Redis, now in TinyLFU until cached + 2..2.2 s
		if _, ok := local.Get(key); !ok {
			t.Fatal("not admitted to TinyLFU")
		}
		if err := rdb.Set(ctx, key, "new", 0).Err(); err != nil {
			t.Fatal(err)
		}
		setAt := time.Now()
		// Stale for the whole local TTL: poll until just before it ends.
		for time.Since(cached) < coherenceTTL-100*time.Millisecond {
			if v := read(); v != old {
				t.Fatalf("TinyLFU served %q %v after caching, before its TTL", v, time.Since(cached))
			}
			time.Sleep(5 * time.Millisecond)
		}
		staleFor := time.Since(cached)
		setToStale := time.Since(setAt)
		// Then the entry expires and the next read goes to Redis.
		eventually(t, coherenceTTL/10+time.Second, "new value after TinyLFU's TTL", func() bool {
			return read() == "new"
		})
		t.Logf("go-redis/cache+TinyLFU (local TTL %v): still the old value %v after the raw SET (%v after caching it); the new value %v after caching it",
			coherenceTTL, setToStale.Round(time.Millisecond), staleFor.Round(time.Millisecond), time.Since(cached).Round(time.Millisecond))
	})
}

func eventually(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("no %s within %v", what, within)
		}
		time.Sleep(time.Millisecond)
	}
}
