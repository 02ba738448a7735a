package memolock

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/maypok86/otter/v2"
	"github.com/redis/go-redis/v9"

	"github.com/memolock/memolock/internal/redistest"
)

// l1Client is a test client with an L1 whose tracking is live.
func l1Client(t *testing.T, addr, tag string) *testClient {
	t.Helper()
	c := newTestClient(t, addr, tag, &Options{L1Size: 1000})
	eventually(t, 5*time.Second, "tracking to be live", func() bool { return c.e.L1Live() })
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
	const ttl = 5 * time.Second
	raw.Set(bg(), "ttl:k", "short-lived", ttl)
	time.Sleep(time.Second) // so that what Redis has left is well below the TTL set
	// At most what Redis has left when memolock reads it, later.
	left := raw.PTTL(bg(), "ttl:k").Val()
	eventually(t, 5*time.Second, "the value to reach the L1", func() bool {
		_, s := served(t, c, "k", noFetch)
		return s == ServedL1
	})
	_, _, got, ok := c.e.L1Entry("k")
	if !ok {
		t.Fatal("no L1 entry")
	}
	if got > left {
		t.Fatalf("L1 entry expires after %v; Redis had at most %v left of the %v it was set for", got, left, ttl)
	}
	// Once the entry's time is up, and the value is gone from Redis, the
	// next Get computes.
	_, _, got, _ = c.e.L1Entry("k")
	time.Sleep(got)
	eventually(t, 10*time.Second, "the value to expire in Redis", func() bool { return raw.Exists(bg(), "ttl:k").Val() == 0 })
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
		if v, _, _, ok := c.e.L1Entry("k"); ok {
			if string(v) != "new" {
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
		_, _, _, ok := c.e.L1Entry("k")
		return !ok
	})
	raw.Set(bg(), "kill:k", "new", 0)
	if v, _ := served(t, c, "k", noFetch); v != "new" {
		t.Errorf("after the kill: %q", v)
	}
	eventually(t, 5*time.Second, "tracking to be live again", func() bool { return c.e.L1Live() })
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
	eventually(t, 5*time.Second, "the refusal to be seen", func() bool { return c.e.L1Refused() })
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
	for !c.e.L1Live() && time.Now().Before(deadline) {
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
		// A bare otter cache of the same size, as the floor.
		bare := otter.Must(&otter.Options[string, []byte]{MaximumSize: 1000})
		defer bare.StopAllGoroutines()
		bare.Set("k", []byte("v"))
		b.ReportAllocs()
		for b.Loop() {
			if _, ok := bare.GetIfPresent("k"); !ok {
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
	eventually(t, 5*time.Second, "the refusal to be seen", func() bool { return c.e.L1Refused() })
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

// While a dependency fails, the stale copy put back in Redis is served from
// the L1 too, flagged stale, without a trip to Redis per read.
func TestL1_ServesStaleCopiesFlaggedStale(t *testing.T) {
	b := realBackend(t)
	writer := newTestClient(t, b.addr, "l1s", &Options{StaleTTL: time.Minute, ResurrectTTL: 30 * time.Second})
	reader := newTestClientOn(t, &redis.Options{Addr: b.addr}, "l1s", &Options{StaleTTL: time.Minute, ResurrectTTL: 30 * time.Second, L1Size: 100})
	eventually(t, 5*time.Second, "tracking to be live", func() bool { return reader.e.L1Live() })
	if err := writer.Set(bg(), "k", []byte("old"), time.Millisecond); err != nil {
		t.Fatal(err)
	}
	raw := rawClient(t, b.addr)
	eventually(t, 5*time.Second, "the value to expire", func() bool { return raw.Exists(bg(), "l1s:k").Val() == 0 })
	var calls atomic.Int64
	if r, err := writer.GetResult(bg(), "k", failingFetch(&calls, "db down")); err != nil || r.Served != ServedStale {
		t.Fatalf("the failing fetch: %+v, %v; want the stale copy", r, err)
	}
	eventually(t, 5*time.Second, "the stale copy to reach the reader's L1", func() bool {
		r, err := reader.GetResult(bg(), "k", failingFetch(&calls, "db down"))
		if err != nil || string(r.Value) != "old" || r.Served != ServedStale {
			t.Fatalf("reader: %+v, %v; want the stale copy, flagged stale", r, err)
		}
		_, _, _, ok := reader.e.L1Entry("k")
		return ok
	})
	before := reader.commands.n.Load()
	for range 20 {
		if r, err := reader.GetResult(bg(), "k", failingFetch(&calls, "db down")); err != nil || string(r.Value) != "old" || r.Served != ServedStale {
			t.Fatalf("reader: %+v, %v; want the stale copy, flagged stale", r, err)
		}
	}
	if n := reader.commands.n.Load() - before; n != 0 {
		t.Errorf("20 stale reads sent %d commands to Redis; want 0 (served from the L1)", n)
	}
	// A fresh value replaces the stale one everywhere.
	if err := writer.Set(bg(), "k", []byte("new"), time.Minute); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "the fresh value to reach the reader", func() bool {
		r, err := reader.GetResult(bg(), "k", failingFetch(&calls, "db down"))
		return err == nil && string(r.Value) == "new" && r.Served != ServedStale
	})
}

// With L1Wait, the L1 is ready when New returns: its first reads can be L1
// hits.
func TestL1_WaitMakesTheL1ReadyWhenNewReturns(t *testing.T) {
	b := realBackend(t)
	c := newTestClient(t, b.addr, "l1w", &Options{L1Size: 100, L1Wait: 5 * time.Second})
	if !c.e.L1Live() {
		t.Fatal("New returned before the L1's tracking was live")
	}
	rawClient(t, b.addr).Set(bg(), "l1w:k", "v", time.Minute)
	if _, s := served(t, c, "k", noFetch); s != ServedRedis {
		t.Fatalf("first read served %v; want redis", s)
	}
	eventually(t, 5*time.Second, "the value to reach the L1", func() bool {
		_, s := served(t, c, "k", noFetch)
		return s == ServedL1
	})
}

// A refused L1 is visible: New fails with L1Wait, and without it the
// refusal is counted (and logged).
func TestL1_RefusalIsVisible(t *testing.T) {
	srv := redistest.Start(t)
	srv.Do(t, "ACL", "SETUSER", "app", "on", ">pw", "+@all", "~*", "resetchannels", "&acl/*")
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, Username: "app", Password: "pw"})
	defer rdb.Close()
	_, err := New(rdb, "acl", &Options{L1Size: 100, L1Wait: 5 * time.Second})
	if !errors.Is(err, ErrRedis) || !strings.Contains(err.Error(), "L1") {
		t.Errorf("New with L1Wait, the invalidation channel refused: %v; want an error wrapping ErrRedis about the L1", err)
	}
	h := newLogCapture()
	c := aclClient(t, srv, "acl", &Options{L1Size: 100, Logger: h.logger()}, "~*", "resetchannels", "&acl/*")
	eventually(t, 5*time.Second, "the refusal to be counted", func() bool { return c.Stats().L1Refusals > 0 })
	if len(h.matching(slog.LevelWarn, "refused")) == 0 {
		t.Error("the refusal was not logged")
	}
}

func TestL1_WaitNeedsAnL1(t *testing.T) {
	b := miniBackend(t)
	rdb := redis.NewClient(&redis.Options{Addr: b.addr})
	defer rdb.Close()
	for _, o := range []*Options{{L1Wait: time.Second}, {L1Size: 10, L1Wait: -time.Second}} {
		if _, err := New(rdb, "t", o); !errors.Is(err, ErrInvalid) {
			t.Errorf("New(%+v) = %v; want ErrInvalid", o, err)
		}
	}
}

// A value this process computed enters its own L1, without a read of
// Redis, once its store's invalidation has come back; a write by anyone
// after it still drops it.
func TestL1_OwnComputedValueEntersTheL1(t *testing.T) {
	b := realBackend(t)
	c := newTestClient(t, b.addr, "l1o", &Options{L1Size: 100, L1Wait: 5 * time.Second})
	var calls atomic.Int64
	if v, s := served(t, c, "k", constFetch(&calls, "mine", 0)); v != "mine" || s != ServedComputed {
		t.Fatalf("first Get: %q, %v", v, s)
	}
	eventually(t, 5*time.Second, "the computed value to reach the L1", func() bool {
		_, _, _, ok := c.e.L1Entry("k")
		return ok
	})
	before := c.commands.n.Load()
	if v, s := served(t, c, "k", noFetch); v != "mine" || s != ServedL1 {
		t.Errorf("second Get: %q, %v; want the computed value from the L1", v, s)
	}
	if n := c.commands.n.Load() - before; n != 0 {
		t.Errorf("an L1 hit sent %d commands", n)
	}
	rawClient(t, b.addr).Set(bg(), "l1o:k", "theirs", time.Minute)
	eventually(t, 5*time.Second, "the outside write to drop it", func() bool {
		v, _ := served(t, c, "k", noFetch)
		return v == "theirs"
	})
}

// A value read from Redis enters the L1 from the lookup's own reply, which
// brings its TTL: the very next read is an L1 hit, and no PTTL is sent.
func TestL1_LookupReplyBringsTheTTL(t *testing.T) {
	b := realBackend(t)
	c := newTestClient(t, b.addr, "l1r", &Options{L1Size: 100, L1Wait: 5 * time.Second})
	rawClient(t, b.addr).Set(bg(), "l1r:k", "v", time.Minute)
	if _, err := c.Get(bg(), "warm", noFetch); err == nil { // load the script
		t.Fatal("warm-up: fetch should have been refused")
	}
	before := c.commands.n.Load()
	if v, s := served(t, c, "k", noFetch); v != "v" || s != ServedRedis {
		t.Fatalf("first read: %q, %v", v, s)
	}
	if v, s := served(t, c, "k", noFetch); v != "v" || s != ServedL1 {
		t.Errorf("the read right after: %q, %v; want an L1 hit", v, s)
	}
	if n := c.commands.n.Load() - before; n != 1 {
		t.Errorf("two reads sent %d commands; want 1, the lookup (no PTTL)", n)
	}
	if _, _, left, ok := c.e.L1Entry("k"); !ok || left > time.Minute || left < 50*time.Second {
		t.Errorf("L1 entry: present %v, %v left; want about a minute", ok, left)
	}
}

// A user who may not PING (supported: TestGet_RefusedMarkerPingStillMarks)
// keeps a working L1: a refused PING comes back in order as a PONG does,
// and renews the L1's freshness (found by a review: the L1 served nothing).
func TestL1_ServesWhenPingIsRefused(t *testing.T) {
	srv := redistest.Start(t)
	c := aclClientTweaked(t, srv, "np", &Options{L1Size: 1000}, nil, "~*", "&*", "-ping")
	eventually(t, 5*time.Second, "tracking to be live", func() bool { return c.e.L1Live() })
	var calls atomic.Int64
	fetch := constFetch(&calls, "v", 0)
	served(t, c, "k", fetch)
	eventually(t, 5*time.Second, "the value to reach the L1", func() bool {
		_, s := served(t, c, "k", fetch)
		return s == ServedL1
	})
}
