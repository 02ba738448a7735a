package memolock

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/memolock/memolock/internal/redistest"
)

// l1Client is a test client with an L1 whose tracking is live.
func l1Client(t *testing.T, addr, tag string) *testClient {
	t.Helper()
	c := newTestClient(t, addr, tag, &Options{L1Size: 1000})
	eventually(t, 5*time.Second, "tracking to be live", func() bool { return c.l1.live() })
	return c
}

// served gets id and reports how it was served.
func served(t *testing.T, c *testClient, id string, fetch FetchFunc) (string, Served) {
	t.Helper()
	r, err := c.GetResult(bg(), id, fetch)
	if err != nil {
		t.Fatalf("GetResult(%q): %v", id, err)
	}
	return string(r.Value), r.Served
}

// Hit levels over repeated gets: computed, then Redis (which promotes),
// then the L1.
func TestL1_HitLevelsOverRepeatedGets(t *testing.T) {
	b := realBackend(t)
	c := l1Client(t, b.addr, "lv")
	var calls atomic.Int64
	fetch := constFetch(&calls, "v", 0)
	if v, s := served(t, c, "k", fetch); v != "v" || s != ServedComputed {
		t.Fatalf("first Get: %q, %v", v, s)
	}
	eventually(t, 5*time.Second, "the value to reach the L1", func() bool {
		_, s := served(t, c, "k", fetch)
		return s == ServedL1
	})
	if calls.Load() != 1 {
		t.Errorf("fetch ran %d times", calls.Load())
	}
	before := c.commands.n.Load()
	for range 100 {
		if v, s := served(t, c, "k", fetch); v != "v" || s != ServedL1 {
			t.Fatalf("L1 Get: %q, %v", v, s)
		}
	}
	if n := c.commands.n.Load() - before; n != 0 {
		t.Errorf("100 L1 hits sent %d commands to Redis", n)
	}
	if c.Stats().L1Hits < 100 {
		t.Errorf("Stats.L1Hits = %d", c.Stats().L1Hits)
	}
}

// A value promoted from Redis keeps the time Redis has left on it, not a
// fresh TTL.
func TestL1_PromotedEntryKeepsTheRemainingTTL(t *testing.T) {
	b := realBackend(t)
	c := l1Client(t, b.addr, "ttl")
	raw := rawClient(t, b.addr)
	raw.Set(bg(), "ttl:k", "short-lived", 400*time.Millisecond)
	time.Sleep(200 * time.Millisecond) // about 200ms left in Redis
	eventually(t, 5*time.Second, "the value to reach the L1", func() bool {
		_, s := served(t, c, "k", noFetch)
		return s == ServedL1
	})
	e, ok := c.l1.cache.GetEntry("k")
	if !ok {
		t.Fatal("no L1 entry")
	}
	if left := e.ExpiresAfter(); left > 250*time.Millisecond {
		t.Errorf("L1 entry expires after %v; Redis had about 200ms left", left)
	}
	time.Sleep(300 * time.Millisecond)
	var calls atomic.Int64
	if v, s := served(t, c, "k", constFetch(&calls, "again", 0)); v != "again" || s != ServedComputed {
		t.Errorf("after expiry: %q, %v; want a new computation", v, s)
	}
}

// A write from outside, as redis-cli SET would make it, drops the entry
// from the L1 of every client.
func TestL1_WriteFromOutsideDropsTheEntryEverywhere(t *testing.T) {
	b := realBackend(t)
	c1, c2 := l1Client(t, b.addr, "coh"), l1Client(t, b.addr, "coh")
	raw := rawClient(t, b.addr)
	raw.Set(bg(), "coh:k", "old", 0)
	for _, c := range []*testClient{c1, c2} {
		eventually(t, 5*time.Second, "the value to reach the L1", func() bool {
			_, s := served(t, c, "k", noFetch)
			return s == ServedL1
		})
	}
	raw.Set(bg(), "coh:k", "new", 0)
	for i, c := range []*testClient{c1, c2} {
		eventually(t, 5*time.Second, "the L1 to drop the old value", func() bool {
			v, _ := served(t, c, "k", noFetch)
			return v == "new"
		})
		if _, _, ok := c.l1.get("k"); ok {
			if v, _, _ := c.l1.get("k"); string(v) != "new" {
				t.Errorf("client %d's L1 holds %q", i+1, v)
			}
		}
	}
}

// When the tracking connection is killed, the L1 is flushed: writes made
// while it was down are never hidden by a stale entry.
func TestL1_FlushedWhenTheTrackingConnectionIsKilled(t *testing.T) {
	b := realBackend(t)
	c := l1Client(t, b.addr, "kill")
	raw := rawClient(t, b.addr)
	raw.Set(bg(), "kill:k", "old", 0)
	eventually(t, 5*time.Second, "the value to reach the L1", func() bool {
		_, s := served(t, c, "k", noFetch)
		return s == ServedL1
	})
	if err := raw.Do(bg(), "CLIENT", "KILL", "TYPE", "pubsub").Err(); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "the L1 to be flushed", func() bool {
		_, _, ok := c.l1.get("k")
		return !ok
	})
	raw.Set(bg(), "kill:k", "new", 0)
	if v, _ := served(t, c, "k", noFetch); v != "new" {
		t.Errorf("after the kill: %q", v)
	}
	eventually(t, 5*time.Second, "tracking to be live again", func() bool { return c.l1.live() })
	eventually(t, 5*time.Second, "the new value to reach the L1", func() bool {
		v, s := served(t, c, "k", noFetch)
		return s == ServedL1 && v == "new"
	})
}

// Delete and Set drop this process's L1 entry at once.
func TestL1_DeleteAndSetDropTheEntryAtOnce(t *testing.T) {
	b := realBackend(t)
	c := l1Client(t, b.addr, "own")
	raw := rawClient(t, b.addr)
	raw.Set(bg(), "own:k", "old", 0)
	eventually(t, 5*time.Second, "the value to reach the L1", func() bool {
		_, s := served(t, c, "k", noFetch)
		return s == ServedL1
	})
	if err := c.Set(bg(), "k", []byte("new"), 0); err != nil {
		t.Fatal(err)
	}
	if v, s := served(t, c, "k", noFetch); v != "new" || s == ServedL1 {
		t.Errorf("right after Set: %q, %v", v, s)
	}
	eventually(t, 5*time.Second, "the value to reach the L1", func() bool {
		_, s := served(t, c, "k", noFetch)
		return s == ServedL1
	})
	if _, err := c.Delete(bg(), "k"); err != nil {
		t.Fatal(err)
	}
	if v, s := served(t, c, "k", constFetch(new(atomic.Int64), "computed", 0)); v != "computed" || s != ServedComputed {
		t.Errorf("right after Delete: %q, %v", v, s)
	}
}

// miniredis has no CLIENT TRACKING: the L1 stays empty, and everything
// else works.
func TestL1_WithoutTrackingStaysEmpty(t *testing.T) {
	b := miniBackend(t)
	c := newTestClient(t, b.addr, "mini", &Options{L1Size: 100})
	eventually(t, 5*time.Second, "the refusal to be seen", func() bool { return c.l1.refused.Load() })
	var calls atomic.Int64
	for i := range 20 {
		v, s := served(t, c, "k", constFetch(&calls, "v", 0))
		if v != "v" || s == ServedL1 {
			t.Fatalf("Get %d: %q, %v", i, v, s)
		}
	}
	b.mini.Set("mini:k", "changed")
	if v, _ := served(t, c, "k", noFetch); v != "changed" {
		t.Errorf("after a write: %q", v)
	}
	// Waiting still works.
	other := newTestClient(t, b.addr, "mini", nil)
	started, release := make(chan struct{}, 1), make(chan struct{})
	done := getAsync(other, bg(), "w", blockingFetch(started, release, "pushed"))
	<-started
	got := getAsync(c, bg(), "w", noFetch)
	time.Sleep(100 * time.Millisecond)
	close(release)
	within(t, 5*time.Second, done, "pushed", "holder")
	within(t, 5*time.Second, got, "pushed", "waiter with an unusable L1")
}

func TestL1_BadOptions(t *testing.T) {
	b := miniBackend(t)
	rdb := rawClient(t, b.addr)
	if _, err := New(rdb, "t", &Options{L1Size: -1}); !errors.Is(err, ErrInvalid) {
		t.Errorf("negative L1Size: %v", err)
	}
	ring := redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": b.addr}})
	defer ring.Close()
	if _, err := New(ring, "t", &Options{L1Size: 10}); !errors.Is(err, ErrInvalid) {
		t.Errorf("L1 on a ring: %v", err)
	}
}

// BenchmarkL1Hit measures an L1 hit through Get beside a bare otter read of
// the same cache, in the same run.
func BenchmarkL1Hit(b *testing.B) {
	srv := realBackend(b)
	c := newTestClient(b, srv.addr, "bench-l1", &Options{L1Size: 1000})
	deadline := time.Now().Add(5 * time.Second)
	for !c.l1.live() && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	ctx := context.Background()
	fetch := func(context.Context, *Lease) ([]byte, time.Duration, error) { return []byte("v"), time.Hour, nil }
	for time.Now().Before(deadline) {
		if r, _ := c.GetResult(ctx, "k", fetch); r.Served == ServedL1 {
			break
		}
		time.Sleep(time.Millisecond)
	}
	b.Run("memolock", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := c.Get(ctx, "k", fetch); err != nil {
				b.Fatal(err)
			}
		}
		if c.Stats().L1Hits == 0 {
			b.Fatal("no L1 hits")
		}
	})
	b.Run("otter", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, ok := c.l1.cache.GetIfPresent("k"); !ok {
				b.Fatal("not in otter")
			}
		}
	})
}

// GetMany reads the L1 first, and promotes what it finds in Redis.
func TestL1_GetManyReadsAndFillsTheL1(t *testing.T) {
	b := realBackend(t)
	c := l1Client(t, b.addr, "many")
	raw := rawClient(t, b.addr)
	for _, id := range []string{"a", "b", "c"} {
		raw.Set(bg(), "many:"+id, "v-"+id, time.Minute)
	}
	fetch := func(_ context.Context, id string, _ *Lease) ([]byte, time.Duration, error) {
		return []byte("computed-" + id), time.Minute, nil
	}
	eventually(t, 5*time.Second, "GetMany to fill the L1", func() bool {
		items, err := c.GetMany(bg(), []string{"a", "b", "c"}, fetch, nil)
		if err != nil {
			t.Fatal(err)
		}
		for _, it := range items {
			if it.Err != nil || string(it.Value) != "v-"+it.ID {
				t.Fatalf("item %+v", it)
			}
			if it.Served != ServedL1 {
				return false
			}
		}
		return true
	})
	before := c.commands.n.Load()
	items, err := c.GetMany(bg(), []string{"c", "a", "b", "a"}, fetch, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, it := range items {
		if it.Served != ServedL1 || string(it.Value) != "v-"+it.ID {
			t.Errorf("item %+v", it)
		}
	}
	if n := c.commands.n.Load() - before; n != 0 {
		t.Errorf("a GetMany answered by the L1 sent %d commands", n)
	}
	raw.Set(bg(), "many:b", "changed", time.Minute)
	eventually(t, 5*time.Second, "the write to reach GetMany", func() bool {
		items, _ := c.GetMany(bg(), []string{"a", "b"}, fetch, nil)
		return string(items[1].Value) == "changed"
	})
}

// An ACL user that may track but not subscribe to the invalidation channel
// (Redis 7 users get resetchannels by default) gets no invalidations: its
// L1 must stay empty, while waits on its own channels still work.
func TestL1_RefusedInvalidationChannelKeepsTheL1Empty(t *testing.T) {
	srv := redistest.Start(t)
	c := aclClient(t, srv, "acl", &Options{L1Size: 100}, "~*", "resetchannels", "&acl/*")
	raw := rawClient(t, srv.Addr)
	raw.Set(bg(), "acl:k", "old", 0)
	eventually(t, 5*time.Second, "the refusal to be seen", func() bool { return c.l1.refused.Load() })
	for range 20 {
		if _, s := served(t, c, "k", noFetch); s == ServedL1 {
			t.Fatal("served from an L1 that gets no invalidations")
		}
		time.Sleep(5 * time.Millisecond)
	}
	raw.Set(bg(), "acl:k", "new", 0)
	if v, _ := served(t, c, "k", noFetch); v != "new" {
		t.Errorf("after an outside write: %q", v)
	}
}
