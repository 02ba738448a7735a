package memolock

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/memolock/memolock/internal/wire"
)

// notFoundFetch counts its calls and reports "not found".
func notFoundFetch(calls *atomic.Int64) FetchFunc {
	return func(context.Context, *Lease) ([]byte, time.Duration, error) {
		calls.Add(1)
		return nil, time.Minute, fmt.Errorf("user 42: %w", ErrNotFound)
	}
}

// A "not found" from fetch is cached for NegTTL, in every process, apart
// from values: an empty value is a value.
func TestNotFound_CachedForNegTTLOnly(t *testing.T) {
	b := realBackend(t)
	// Long enough for every check below to run while the marker lives,
	// however loaded the machine.
	const negTTL = 3 * time.Second
	c := newTestClient(t, b.addr, "neg", &Options{NegTTL: negTTL})
	other := newTestClient(t, b.addr, "neg", &Options{NegTTL: negTTL})
	var calls atomic.Int64
	r, err := c.GetResult(bg(), "k", notFoundFetch(&calls))
	if !errors.Is(err, ErrNotFound) || r.Served != ServedComputed || r.Value != nil {
		t.Fatalf("first Get: %+v, %v; want ErrNotFound, computed", r, err)
	}
	raw := rawClient(t, b.addr)
	if ttl := raw.PTTL(bg(), "neg/lock-notfound:k").Val(); ttl <= 0 || ttl > negTTL {
		t.Errorf("marker PTTL %v, want (0, %v]", ttl, negTTL)
	}
	if n := raw.Exists(bg(), "neg:k", "neg/lock:k").Val(); n != 0 {
		t.Errorf("%d of value and lock left; want none", n)
	}
	for _, cl := range []*testClient{c, other} {
		r, err := cl.GetResult(bg(), "k", notFoundFetch(&calls))
		if !errors.Is(err, ErrNotFound) || r.Served != ServedRedis {
			t.Errorf("cached: %+v, %v; want ErrNotFound from redis", r, err)
		}
		if _, err := cl.Get(bg(), "k", notFoundFetch(&calls)); !errors.Is(err, ErrNotFound) {
			t.Errorf("Get: %v", err)
		}
	}
	if p, err := c.Peek(bg(), "k"); err != nil || !p.NotFound || p.Found || p.NotFoundTTL <= 0 {
		t.Errorf("Peek: %+v, %v", p, err)
	}
	if n := calls.Load(); n != 1 {
		t.Fatalf("fetch ran %d times while the marker lived; want 1", n)
	}
	eventually(t, 10*time.Second, "the marker to expire", func() bool { return raw.Exists(bg(), "neg/lock-notfound:k").Val() == 0 })
	if _, err := c.Get(bg(), "k", notFoundFetch(&calls)); !errors.Is(err, ErrNotFound) || calls.Load() != 2 {
		t.Errorf("after NegTTL: %v, %d calls; want fetch to run again", err, calls.Load())
	}

	// An empty value is a value, not "not found".
	v, err := c.Get(bg(), "empty", func(context.Context, *Lease) ([]byte, time.Duration, error) {
		return []byte{}, time.Minute, nil
	})
	if err != nil || v == nil || len(v) != 0 {
		t.Errorf("empty value: %q, %v", v, err)
	}
	r, err = other.GetResult(bg(), "empty", noFetch)
	if err != nil || r.Served != ServedRedis || len(r.Value) != 0 {
		t.Errorf("empty value from redis: %+v, %v", r, err)
	}
	if s := c.Stats(); s.NotFound < 2 || s.FetchErrors != 0 {
		t.Errorf("stats %+v: want NotFound counted, no fetch errors", s)
	}
}

// With NegTTL 0 nothing is recorded: the next Get calls fetch again.
func TestNotFound_NegTTLZeroRecordsNothing(t *testing.T) {
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			c := newTestClient(t, b.addr, "neg0", nil)
			var calls atomic.Int64
			for i := 1; i <= 2; i++ {
				if _, err := c.Get(bg(), "k", notFoundFetch(&calls)); !errors.Is(err, ErrNotFound) {
					t.Fatalf("Get %d: %v", i, err)
				}
				if calls.Load() != int64(i) {
					t.Fatalf("fetch ran %d times after %d Gets", calls.Load(), i)
				}
			}
			if n := rawClient(t, b.addr).Exists(bg(), "neg0/lock-notfound:k", "neg0/lock:k").Val(); n != 0 {
				t.Errorf("%d keys left; want none", n)
			}
		})
	}
}

// Waiters elsewhere learn "not found" from the holder's event at once, with
// or without a NegTTL, instead of computing again.
func TestNotFound_WaiterElsewhereGetsItPromptly(t *testing.T) {
	for _, neg := range []time.Duration{0, time.Minute} {
		t.Run(fmt.Sprint("NegTTL=", neg), func(t *testing.T) {
			b := realBackend(t)
			opts := &Options{LockTTL: 30 * time.Second, NegTTL: neg}
			holder := newTestClient(t, b.addr, "negw", opts)
			waiter := newTestClient(t, b.addr, "negw", opts)
			l := countLookups(waiter.rdb, "negw:k")
			started, release := make(chan struct{}, 1), make(chan struct{})
			go func() {
				_, _ = holder.Get(bg(), "k", func(context.Context, *Lease) ([]byte, time.Duration, error) {
					started <- struct{}{}
					<-release
					return nil, 0, ErrNotFound
				})
			}()
			<-started
			var fetched atomic.Int64
			got := make(chan error, 1)
			go func() {
				r, err := waiter.GetResult(bg(), "k", notFoundFetch(&fetched))
				if err == nil || r.Served != ServedWaited {
					err = fmt.Errorf("served %v, error %w", r.Served, err)
				}
				got <- err
			}()
			parkedAndLive(t, l, 2)
			start := time.Now()
			close(release)
			select {
			case err := <-got:
				if !errors.Is(err, ErrNotFound) {
					t.Errorf("waiter: %v; want ErrNotFound", err)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("the waiter did not learn of it within 5s (the lock TTL is 30s)")
			}
			if fetched.Load() != 0 {
				t.Errorf("the waiter ran fetch")
			}
			t.Logf("waiter answered %v after the holder's fetch returned", time.Since(start))
		})
	}
}

// A store, a Set and a Delete all remove a cached "not found".
func TestNotFound_ValueWritesClearTheMarker(t *testing.T) {
	b := realBackend(t)
	c := newTestClient(t, b.addr, "negc", &Options{NegTTL: time.Minute})
	raw := rawClient(t, b.addr)
	var calls atomic.Int64
	for _, write := range []struct {
		name string
		do   func(id string) error
	}{
		{"Set", func(id string) error { return c.Set(bg(), id, []byte("v"), time.Minute) }},
		{"Delete", func(id string) error { _, err := c.Delete(bg(), id); return err }},
		{"store by a peer", func(id string) error {
			return wire.ScriptsFor(false).Store.Run(bg(), raw, c.Keys().wire().ID(id), "peer", "v", "60000", "n", "e", "0").Err()
		}},
	} {
		id := write.name
		if _, err := c.Get(bg(), id, notFoundFetch(&calls)); !errors.Is(err, ErrNotFound) {
			t.Fatal(err)
		}
		if write.name == "store by a peer" {
			raw.Set(bg(), "negc/lock:"+id, "peer", time.Minute)
		}
		if err := write.do(id); err != nil {
			t.Fatalf("%s: %v", write.name, err)
		}
		if raw.Exists(bg(), "negc/lock-notfound:"+id).Val() != 0 {
			t.Errorf("%s left the marker", write.name)
		}
	}
}

// syncBuffer is a log sink for one test.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func failingFetch(calls *atomic.Int64, msg string) FetchFunc {
	return func(context.Context, *Lease) ([]byte, time.Duration, error) {
		calls.Add(1)
		return nil, 0, errors.New(msg)
	}
}

// With StaleTTL, a value past its TTL is served flagged stale when fetch
// fails, the error is logged, and fetch is not tried again, by anyone,
// before ResurrectTTL. A panic does not resurrect.
func TestStale_ServedOnErrorThenRetriedAfterResurrectTTL(t *testing.T) {
	b := realBackend(t)
	logs := &syncBuffer{}
	// ResurrectTTL long enough for every check below to run within it,
	// however loaded the machine.
	const resurrectTTL = 3 * time.Second
	opts := &Options{StaleTTL: time.Minute, ResurrectTTL: resurrectTTL,
		Logger: slog.New(slog.NewTextHandler(logs, nil))}
	c := newTestClient(t, b.addr, "stale", opts)
	other := newTestClient(t, b.addr, "stale", opts)
	raw := rawClient(t, b.addr)
	var calls atomic.Int64
	if _, err := c.Get(bg(), "k", func(context.Context, *Lease) ([]byte, time.Duration, error) {
		return []byte("v1"), 200 * time.Millisecond, nil
	}); err != nil {
		t.Fatal(err)
	}
	if ttl := raw.PTTL(bg(), "stale/lock-stale:k").Val(); ttl < 50*time.Second {
		t.Fatalf("stale copy PTTL %v; want about 1m", ttl)
	}
	eventually(t, 5*time.Second, "the value to expire", func() bool { return raw.Exists(bg(), "stale:k").Val() == 0 })

	r, err := c.GetResult(bg(), "k", failingFetch(&calls, "db down"))
	if err != nil || string(r.Value) != "v1" || r.Served != ServedStale {
		t.Fatalf("after a failed fetch: %+v, %v; want v1, stale", r, err)
	}
	if !bytes.Contains([]byte(logs.String()), []byte("db down")) {
		t.Errorf("the fetch error was not logged: %q", logs.String())
	}
	for _, cl := range []*testClient{c, other} {
		r, err := cl.GetResult(bg(), "k", failingFetch(&calls, "db down"))
		if err != nil || string(r.Value) != "v1" || r.Served != ServedStale {
			t.Errorf("during ResurrectTTL: %+v, %v; want v1, stale", r, err)
		}
	}
	if r, err := other.Lookup(bg(), "k"); err != nil || r.Served != ServedStale {
		t.Errorf("Lookup: %+v, %v", r, err)
	}
	if p, err := c.Peek(bg(), "k"); err != nil || !p.Stale || !p.Found || p.TTL > resurrectTTL || p.StaleCopyTTL <= 0 {
		t.Errorf("Peek: %+v, %v", p, err)
	}
	if n := calls.Load(); n != 1 {
		t.Errorf("fetch ran %d times; want 1 until ResurrectTTL passes", n)
	}
	eventually(t, 10*time.Second, "the resurrected value to expire", func() bool { return raw.Exists(bg(), "stale:k").Val() == 0 })
	r, err = other.GetResult(bg(), "k", func(context.Context, *Lease) ([]byte, time.Duration, error) {
		return []byte("v2"), time.Minute, nil
	})
	if err != nil || string(r.Value) != "v2" || r.Served != ServedComputed {
		t.Errorf("after ResurrectTTL: %+v, %v; want fetch to run again", r, err)
	}
	if s := c.Stats(); s.Stale < 2 {
		t.Errorf("Stats.Stale = %d", s.Stale)
	}

	// A panic does not resurrect.
	if err := c.Set(bg(), "p", []byte("old"), time.Millisecond); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "the value to expire", func() bool { return raw.Exists(bg(), "stale:p").Val() == 0 })
	_, err = c.Get(bg(), "p", func(context.Context, *Lease) ([]byte, time.Duration, error) { panic("boom") })
	if !errors.Is(err, ErrFetchPanicked) {
		t.Errorf("after a panic: %v; want ErrFetchPanicked", err)
	}
}

// Without a stale copy, or without StaleTTL, the fetch error is returned.
func TestStale_NoCopyNoStale(t *testing.T) {
	b := realBackend(t)
	var calls atomic.Int64
	with := newTestClient(t, b.addr, "nocopy", &Options{StaleTTL: time.Minute})
	if _, err := with.Get(bg(), "never", failingFetch(&calls, "db down")); err == nil || err.Error() != "db down" {
		t.Errorf("no copy: %v", err)
	}
	without := newTestClient(t, b.addr, "nocopy", nil)
	if _, err := without.Get(bg(), "x", func(context.Context, *Lease) ([]byte, time.Duration, error) {
		return []byte("v"), time.Millisecond, nil
	}); err != nil {
		t.Fatal(err)
	}
	raw := rawClient(t, b.addr)
	if raw.Exists(bg(), "nocopy/lock-stale:x").Val() != 0 {
		t.Error("a client without StaleTTL kept a copy")
	}
	eventually(t, 5*time.Second, "the value to expire", func() bool { return raw.Exists(bg(), "nocopy:x").Val() == 0 })
	if _, err := with.Get(bg(), "x", failingFetch(&calls, "db down")); err == nil {
		t.Error("stale value served without a copy")
	}
}

// A holder elsewhere that falls back to the stale value wakes its waiters
// at once, and they get the value flagged stale.
func TestStale_WaiterElsewhereGetsTheResurrectedValue(t *testing.T) {
	b := realBackend(t)
	opts := &Options{LockTTL: 30 * time.Second, StaleTTL: time.Minute}
	holder := newTestClient(t, b.addr, "stw", opts)
	waiter := newTestClient(t, b.addr, "stw", opts)
	raw := rawClient(t, b.addr)
	if err := holder.Set(bg(), "k", []byte("old"), time.Millisecond); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "the value to expire", func() bool { return raw.Exists(bg(), "stw:k").Val() == 0 })
	l := countLookups(waiter.rdb, "stw:k")
	started, release := make(chan struct{}, 1), make(chan struct{})
	go func() {
		_, _ = holder.Get(bg(), "k", func(context.Context, *Lease) ([]byte, time.Duration, error) {
			started <- struct{}{}
			<-release
			return nil, 0, errors.New("db down")
		})
	}()
	<-started
	got := make(chan Result, 1)
	go func() {
		r, err := waiter.GetResult(bg(), "k", noFetch)
		if err != nil {
			t.Error(err)
		}
		got <- r
	}()
	parkedAndLive(t, l, 2)
	close(release)
	select {
	case r := <-got:
		if string(r.Value) != "old" || r.Served != ServedStale {
			t.Errorf("waiter: %+v; want old, stale", r)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the waiter was not woken within 5s (the lock TTL is 30s)")
	}
}

// A waiter whose caller gives up gets the stale copy rather than an error,
// and so does one whose holder fails without putting it back.
func TestStale_WaiterGivingUpGetsTheCopy(t *testing.T) {
	b := realBackend(t)
	c := newTestClient(t, b.addr, "stg", &Options{LockTTL: 30 * time.Second, StaleTTL: time.Minute})
	raw := rawClient(t, b.addr)
	if err := c.Set(bg(), "k", []byte("old"), time.Millisecond); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "the value to expire", func() bool { return raw.Exists(bg(), "stg:k").Val() == 0 })
	raw.Set(bg(), "stg/lock:k", "someone", 30*time.Second)
	// The caller gives up once it waits (two lookups: before and after
	// subscribing), not on a clock that a stalled machine could run out
	// before the flight read the copy.
	l0 := countLookups(c.rdb, "stg:k")
	ctx, cancel := context.WithCancel(bg())
	defer cancel()
	gaveUp := make(chan Result, 1)
	go func() {
		r, err := c.GetResult(ctx, "k", noFetch)
		if err != nil {
			t.Errorf("giving up: %v; want the stale copy", err)
		}
		gaveUp <- r
	}()
	parkedAndLive(t, l0, 2)
	cancel()
	select {
	case r := <-gaveUp:
		if string(r.Value) != "old" || r.Served != ServedStale {
			t.Errorf("giving up: %+v; want old, stale", r)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the caller that gave up got no answer within 5s")
	}

	// A holder that fails without a stale value of its own (a peer).
	l := countLookups(c.rdb, "stg:k")
	got := make(chan Result, 1)
	go func() {
		r, err := c.GetResult(bg(), "k", noFetch)
		if err != nil {
			t.Error(err)
		}
		got <- r
	}()
	parkedAndLive(t, l, 2)
	raw.Del(bg(), "stg/lock:k")
	raw.Publish(bg(), "stg/lock-event:k", "fail\nsomeone\ndb down")
	select {
	case r := <-got:
		if string(r.Value) != "old" || r.Served != ServedStale {
			t.Errorf("holder failed: %+v; want old, stale", r)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no answer within 5s")
	}
}

// Lookup reads the L1, then Redis, never computes, and tells a miss from
// a cached "not found".
func TestLookup_TellsMissFromNotFound(t *testing.T) {
	b := realBackend(t)
	c := newTestClient(t, b.addr, "look", &Options{NegTTL: time.Minute, L1Size: 100})
	if _, err := c.Lookup(bg(), "k"); !errors.Is(err, ErrMiss) {
		t.Errorf("nothing cached: %v; want ErrMiss", err)
	}
	var calls atomic.Int64
	_, _ = c.Get(bg(), "nf", notFoundFetch(&calls))
	if r, err := c.Lookup(bg(), "nf"); !errors.Is(err, ErrNotFound) || r.Served != ServedRedis {
		t.Errorf("not found: %+v, %v", r, err)
	}
	if err := c.Set(bg(), "k", []byte("v"), time.Minute); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "the L1 to take k", func() bool {
		r, err := c.Lookup(bg(), "k")
		if err != nil || string(r.Value) != "v" {
			t.Fatalf("Lookup: %+v, %v", r, err)
		}
		return r.Served == ServedL1
	})
	if calls.Load() != 1 {
		t.Errorf("fetch ran %d times", calls.Load())
	}
}

// With RefreshAhead, one caller across processes refreshes a hot key in
// the background before it expires: nobody else ever waits or computes.
func TestRefreshAhead_HotKeyNeverMisses(t *testing.T) {
	// A value lives 2.5s (more than twice the window, or it would not be
	// refreshed) and is refreshed once it has under 1s left: the refresh
	// (a 50ms fetch and a store) has a second to land before the value
	// expires, a margin that a loaded machine does not eat.
	const (
		ttl    = 2500 * time.Millisecond
		window = time.Second
		run    = 6 * time.Second
	)
	for _, l1 := range []int{0, 100} {
		t.Run(fmt.Sprint("L1Size=", l1), func(t *testing.T) {
			b := realBackend(t)
			opts := &Options{RefreshAhead: window, L1Size: l1}
			clients := []*testClient{newTestClient(t, b.addr, "ahead", opts), newTestClient(t, b.addr, "ahead", opts)}
			var calls atomic.Int64
			fetch := func(context.Context, *Lease) ([]byte, time.Duration, error) {
				n := calls.Add(1)
				time.Sleep(50 * time.Millisecond)
				return []byte(fmt.Sprint("v", n)), ttl, nil
			}
			if _, err := clients[0].Get(bg(), "hot", fetch); err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			var wg sync.WaitGroup
			for _, c := range clients {
				for range 4 {
					wg.Add(1)
					go func() {
						defer wg.Done()
						for time.Since(start) < run {
							r, err := c.GetResult(bg(), "hot", fetch)
							if err != nil || (r.Served != ServedRedis && r.Served != ServedL1) {
								t.Errorf("a read was %v, %v", r.Served, err)
								return
							}
							time.Sleep(time.Millisecond)
						}
					}()
				}
			}
			wg.Wait()
			n := calls.Load()
			// At most one refresh per cycle, across both clients: a value
			// is refreshed no sooner than ttl-window after it was stored.
			if most := int64(run/(ttl-window)) + 2; n < 3 || n > most {
				t.Errorf("fetch ran %d times in %v; want one refresh per cycle (3 to %d)", n, run, most)
			}
			// Every fetch but the first is a refresh. One that the last
			// reads set off may still run (seen under load: 3 refreshes
			// for 5 fetches): a refresh counts once it has stored.
			refreshes := func() int64 { return clients[0].Stats().Refreshes + clients[1].Stats().Refreshes }
			for deadline := time.Now().Add(5 * time.Second); refreshes() != calls.Load()-1; time.Sleep(2 * time.Millisecond) {
				if time.Now().After(deadline) {
					t.Errorf("%d refreshes for %d fetches, 5s after the reads ended", refreshes(), calls.Load())
					break
				}
			}
		})
	}
}

// BenchmarkRefreshAhead reads one hot key 1,000 times a second, from two
// clients, for 10 expiry cycles of a value that lives 1s and takes 200ms to
// fetch, with and without RefreshAhead. Each op is one whole run (use
// -benchtime 1x). It reports the reads that did not find a value (they
// waited or computed) and the read latency.
func BenchmarkRefreshAhead(b *testing.B) {
	const (
		ttl    = time.Second
		fetchD = 200 * time.Millisecond
		cycles = 10
	)
	for _, early := range []time.Duration{0, 400 * time.Millisecond} {
		b.Run(fmt.Sprint("RefreshAhead=", early), func(b *testing.B) {
			addr := realBackend(b).addr
			opts := &Options{RefreshAhead: early}
			clients := []*Client{newTestClient(b, addr, "ra", opts).Client, newTestClient(b, addr, "ra", opts).Client}
			fetch := func(context.Context, *Lease) ([]byte, time.Duration, error) {
				time.Sleep(fetchD)
				return []byte("value"), ttl, nil
			}
			var (
				mu        sync.Mutex
				latencies []time.Duration
				misses    int
				fetches   atomic.Int64
			)
			counted := func(ctx context.Context, l *Lease) ([]byte, time.Duration, error) {
				fetches.Add(1)
				return fetch(ctx, l)
			}
			b.ResetTimer()
			for range b.N {
				if _, err := clients[0].Get(bg(), "hot", counted); err != nil {
					b.Fatal(err)
				}
				var wg sync.WaitGroup
				tick := time.NewTicker(time.Millisecond)
				end := time.Now().Add(cycles * ttl)
				for i := 0; time.Now().Before(end); i++ {
					<-tick.C
					wg.Add(1)
					go func(c *Client) {
						defer wg.Done()
						start := time.Now()
						r, err := c.GetResult(bg(), "hot", counted)
						d := time.Since(start)
						if err != nil {
							b.Error(err)
							return
						}
						mu.Lock()
						latencies = append(latencies, d)
						if r.Served != ServedRedis {
							misses++
						}
						mu.Unlock()
					}(clients[i%2])
				}
				tick.Stop()
				wg.Wait()
			}
			b.StopTimer()
			slices.Sort(latencies)
			b.ReportMetric(float64(len(latencies))/float64(b.N), "reads/op")
			b.ReportMetric(float64(misses)/float64(b.N), "misses/op")
			b.ReportMetric(float64(fetches.Load())/float64(b.N), "fetches/op")
			b.ReportMetric(float64(latencies[len(latencies)*99/100].Microseconds()), "p99-µs")
			b.ReportMetric(float64(latencies[len(latencies)-1].Microseconds()), "max-µs")
		})
	}
}

// A cached "not found" enters the L1 like a value, and any write to the
// value or to the marker, by anyone, drops it.
func TestNotFound_L1HoldsItUntilAnyWrite(t *testing.T) {
	b := realBackend(t)
	c := newTestClient(t, b.addr, "negl1", &Options{NegTTL: time.Minute, L1Size: 100})
	raw := rawClient(t, b.addr)
	var calls atomic.Int64
	for _, write := range []struct {
		name string
		do   func(id string)
		want string // what Get answers after the write; "" for not found
	}{
		{"SET of the value", func(id string) { raw.Set(bg(), "negl1:"+id, "v", time.Minute) }, "v"},
		{"DEL of the marker", func(id string) { raw.Del(bg(), "negl1/lock-notfound:"+id) }, "fetched"},
	} {
		id := write.name
		if _, err := c.Get(bg(), id, notFoundFetch(&calls)); !errors.Is(err, ErrNotFound) {
			t.Fatal(err)
		}
		eventually(t, 5*time.Second, "the L1 to take the not-found", func() bool {
			r, err := c.GetResult(bg(), id, notFoundFetch(&calls))
			if !errors.Is(err, ErrNotFound) {
				t.Fatalf("%s: %+v, %v", write.name, r, err)
			}
			return r.Served == ServedL1
		})
		if r, err := c.Lookup(bg(), id); !errors.Is(err, ErrNotFound) || r.Served != ServedL1 {
			t.Errorf("Lookup: %+v, %v", r, err)
		}
		write.do(id)
		eventually(t, 5*time.Second, "the L1 to drop it after a "+write.name, func() bool {
			v, err := c.Get(bg(), id, constFetch(&calls, "fetched", 0))
			return err == nil && string(v) == write.want
		})
	}
}
