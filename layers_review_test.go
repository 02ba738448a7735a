package memolock

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"
)

// GetMany reads the locks with the values when StaleTTL is set: a value put
// back stale is served stale, and never enters the L1.
func TestStale_GetManyFlagsResurrectedValues(t *testing.T) {
	b := realBackend(t)
	opts := &Options{StaleTTL: time.Minute, ResurrectTTL: 3 * time.Second, L1Size: 100}
	c := newTestClient(t, b.addr, "rvgm", opts)
	other := newTestClient(t, b.addr, "rvgm", opts)
	raw := rawClient(t, b.addr)
	if err := c.Set(bg(), "k", []byte("old"), time.Millisecond); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "the value to expire", func() bool { return raw.Exists(bg(), "rvgm:k").Val() == 0 })
	var calls atomic.Int64
	r, err := c.GetResult(bg(), "k", failingFetch(&calls, "db down"))
	if err != nil || r.Served != ServedStale {
		t.Fatalf("setup: %+v, %v", r, err)
	}
	items, err := other.GetMany(bg(), []string{"k"}, func(context.Context, string, *Lease) ([]byte, time.Duration, error) {
		return nil, 0, errors.New("must not run")
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if items[0].Served != ServedStale {
		t.Errorf("GetMany of a resurrected value: Served %v, want stale", items[0].Served)
	}
	// GetMany never promotes a stale value into the L1, from which Get
	// would serve it unflagged.
	for range 5 {
		_, _ = other.GetMany(bg(), []string{"k"}, func(context.Context, string, *Lease) ([]byte, time.Duration, error) {
			return nil, 0, errors.New("must not run")
		}, nil)
		time.Sleep(20 * time.Millisecond)
	}
	if r, err = other.GetResult(bg(), "k", noFetch); err != nil || r.Served != ServedStale {
		t.Errorf("Get after GetMany: %+v, %v; want stale, not from the L1", r, err)
	}
}

// A waiter whose context ends and gets the stale copy is counted in
// Stats.Stale.
func TestStale_CopyOnDeadlineIsCounted(t *testing.T) {
	b := realBackend(t)
	c := newTestClient(t, b.addr, "rvsc", &Options{LockTTL: 30 * time.Second, StaleTTL: time.Minute})
	raw := rawClient(t, b.addr)
	if err := c.Set(bg(), "k", []byte("old"), time.Millisecond); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "the value to expire", func() bool { return raw.Exists(bg(), "rvsc:k").Val() == 0 })
	raw.Set(bg(), "rvsc/lock:k", "someone", 30*time.Second)
	// The caller gives up once it waits (see TestStale_WaiterGivingUpGetsTheCopy).
	l := countLookups(c.rdb, "rvsc:k")
	ctx, cancel := context.WithCancel(bg())
	defer cancel()
	type res struct {
		r   Result
		err error
	}
	gaveUp := make(chan res, 1)
	go func() {
		r, err := c.GetResult(ctx, "k", noFetch)
		gaveUp <- res{r, err}
	}()
	parkedAndLive(t, l, 2)
	cancel()
	var got res
	select {
	case got = <-gaveUp:
	case <-time.After(5 * time.Second):
		t.Fatal("the caller that gave up got no answer within 5s")
	}
	if got.err != nil || got.r.Served != ServedStale {
		t.Fatalf("setup: %+v, %v", got.r, got.err)
	}
	if s := c.Stats(); s.Stale != 1 {
		t.Errorf("Stats.Stale = %d after one call answered stale; want 1", s.Stale)
	}
}

// After Delete, which removes the stale copy, a flight that read the copy
// before Delete no longer serves it to a caller whose context ends.
func TestStale_NoCopyServedAfterDelete(t *testing.T) {
	b := realBackend(t)
	c := newTestClient(t, b.addr, "rvsd", &Options{LockTTL: 30 * time.Second, StaleTTL: time.Minute})
	raw := rawClient(t, b.addr)
	if err := c.Set(bg(), "k", []byte("old"), time.Millisecond); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "the value to expire", func() bool { return raw.Exists(bg(), "rvsd:k").Val() == 0 })
	raw.Set(bg(), "rvsd/lock:k", "someone", 30*time.Second)
	l := countLookups(c.rdb, "rvsd:k")
	started := make(chan struct{}, 1)
	release := make(chan struct{})
	defer close(release)
	// The caller gives up once the flight, after Delete, computes: not on
	// a clock that a slow machine could run out before Delete.
	ctx, cancel := context.WithTimeout(bg(), time.Minute)
	defer cancel()
	got := make(chan Result, 1)
	go func() {
		r, err := c.GetResult(ctx, "k", blockingFetch(started, release, "new"))
		if err != nil {
			t.Log(err)
		}
		got <- r
	}()
	parkedAndLive(t, l, 2)
	if _, err := c.Delete(bg(), "k"); err != nil {
		t.Fatal(err)
	}
	if n := raw.Exists(bg(), "rvsd/lock-stale:k").Val(); n != 0 {
		t.Fatal("Delete left the stale copy")
	}
	<-started // the flight looked again and now computes
	cancel()
	r := <-got
	if string(r.Value) == "old" {
		t.Errorf("after Delete, the caller got the deleted stale value: %+v", r)
	}
}

// With RefreshAhead over half the value's TTL, a new value is born in the
// window: it is not refreshed again and again (each Get starting a fetch),
// it expires as usual.
func TestRefreshAhead_WindowOverHalfTheTTLDoesNotRefreshEachGet(t *testing.T) {
	b := realBackend(t)
	c := newTestClient(t, b.addr, "rvra", &Options{RefreshAhead: 2 * time.Second})
	var calls atomic.Int64
	fetch := func(context.Context, *Lease) ([]byte, time.Duration, error) {
		calls.Add(1)
		return []byte("v"), time.Second, nil
	}
	start := time.Now()
	if _, err := c.Get(bg(), "k", fetch); err != nil {
		t.Fatal(err)
	}
	for range 20 {
		if _, err := c.Get(bg(), "k", fetch); err != nil {
			t.Fatal(err)
		}
		time.Sleep(20 * time.Millisecond) // let the refresh finish
	}
	// One fetch per 1s TTL the Gets took (one, unless the machine is
	// slow), and one more for a TTL cut short: not one per Get.
	took := time.Since(start)
	if n, most := calls.Load(), 2+int64(took/time.Second); n > most {
		t.Errorf("fetch ran %d times for 21 Gets in %v, with a 1s TTL; want at most %d", n, took, most)
	}
}

// Under FailOpen, a fetch reporting ErrNotFound is counted in
// Stats.NotFound, not as a fetch error.
func TestNotFound_FailOpenCountsNotFound(t *testing.T) {
	b := realBackend(t)
	c := newTestClient(t, b.addr, "rvfo", &Options{FailOpen: true, NegTTL: time.Minute})
	b.real.Kill()
	var calls atomic.Int64
	_, err := c.Get(bg(), "k", notFoundFetch(&calls))
	if !errors.Is(err, ErrNotFound) || calls.Load() != 1 {
		t.Fatalf("setup: %v, %d calls", err, calls.Load())
	}
	if s := c.Stats(); s.NotFound != 1 || s.FetchErrors != 0 {
		t.Errorf("NotFound %d, FetchErrors %d; want 1, 0", s.NotFound, s.FetchErrors)
	}
}

// Huge TTLs: the scripts pass Lua numbers (ttl, ttl + stale) to SET PX.
func TestLayers_HugeTTLs(t *testing.T) {
	b := realBackend(t)
	big := time.Duration(1<<63 - 1)
	c := newTestClient(t, b.addr, "rvbig", &Options{StaleTTL: big, NegTTL: big, ResurrectTTL: big, RefreshAhead: big})
	if err := c.Set(bg(), "k", []byte("v"), big); err != nil {
		t.Fatalf("Set: %v", err)
	}
	if _, err := c.Get(bg(), "g", func(context.Context, *Lease) ([]byte, time.Duration, error) {
		return []byte("v"), big, nil
	}); err != nil {
		t.Fatalf("Get: %v", err)
	}
	p, err := c.Peek(bg(), "g")
	t.Logf("peek %+v %v", p, err)
	var calls atomic.Int64
	if _, err := c.Get(bg(), "nf", notFoundFetch(&calls)); !errors.Is(err, ErrNotFound) {
		t.Fatalf("notfound: %v", err)
	}
}

// Close cancels a background refresh and leaves no lock behind.
func TestRefreshAhead_CloseCancelsTheRefresh(t *testing.T) {
	b := realBackend(t)
	c := newTestClient(t, b.addr, "rvcr", &Options{RefreshAhead: time.Minute})
	raw := rawClient(t, b.addr)
	raw.Set(bg(), "rvcr:k", "v", 30*time.Second)
	started := make(chan struct{}, 1)
	release := make(chan struct{})
	defer close(release)
	if v, err := c.Get(bg(), "k", blockingFetch(started, release, "new")); err != nil || string(v) != "v" {
		t.Fatalf("%q %v", v, err)
	}
	<-started
	t0 := time.Now()
	_ = c.Close()
	// Close gives Redis about a second; a refresh it failed to cancel
	// would hold it until the test ends.
	if d := time.Since(t0); d > 10*time.Second {
		t.Errorf("Close took %v", d)
	}
	if h := raw.Get(bg(), "rvcr/lock:k").Val(); h != "" {
		t.Errorf("lock left after Close: %q", h)
	}
}

// A cached "not found" is not counted in Stats.Hits ("flights answered by
// a value already in Redis").
func TestNotFound_CachedIsNotAHit(t *testing.T) {
	b := realBackend(t)
	c := newTestClient(t, b.addr, "rvnh", &Options{NegTTL: time.Minute})
	var calls atomic.Int64
	_, _ = c.Get(bg(), "k", notFoundFetch(&calls))
	before := c.Stats().Hits
	if _, err := c.Get(bg(), "k", notFoundFetch(&calls)); !errors.Is(err, ErrNotFound) {
		t.Fatal(err)
	}
	if h := c.Stats().Hits - before; h != 0 {
		t.Errorf("a cached not-found counted %d hit(s)", h)
	}
}

// A refresh whose fetch fails keeps the lock done until the value expires:
// the next lookup in the window does not start another one, so a failing
// dependency is not called back to back, and Stats.Refreshes counts no
// refresh.
func TestRefreshAhead_FailingRefreshIsNotRetriedBeforeExpiry(t *testing.T) {
	b := realBackend(t)
	c := newTestClient(t, b.addr, "rvfr", &Options{RefreshAhead: 5 * time.Second, StaleTTL: time.Minute})
	raw := rawClient(t, b.addr)
	raw.Set(bg(), "rvfr:k", "v", 4*time.Second)
	var calls atomic.Int64
	fetch := func(context.Context, *Lease) ([]byte, time.Duration, error) {
		calls.Add(1)
		time.Sleep(5 * time.Millisecond)
		return nil, 0, errors.New("db down")
	}
	start := time.Now()
	for time.Since(start) < 500*time.Millisecond {
		if v, err := c.Get(bg(), "k", fetch); err != nil || string(v) != "v" {
			t.Fatalf("%q %v", v, err)
		}
		time.Sleep(time.Millisecond)
	}
	if n := calls.Load(); n > 5 {
		t.Errorf("a failing dependency was called %d times in 500ms by refreshes of one key", n)
	}
	eventually(t, 10*time.Second, "refreshes to end", func() bool { return c.Stats().Fetches == calls.Load() })
	if r := c.Stats().Refreshes; r != 0 {
		t.Errorf("Stats.Refreshes = %d, though no value was refreshed (every refresh failed)", r)
	}
}
