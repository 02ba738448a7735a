package memolock

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/memolock/memolock/internal/engine"
	"github.com/memolock/memolock/internal/redistest"
)

// newReader returns a MeterProvider read by hand, shut down when the test
// ends (after the clients made on it are closed).
func newReader(t testing.TB) (*sdkmetric.MeterProvider, *sdkmetric.ManualReader) {
	t.Helper()
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	return mp, reader
}

// meteredClient is newTestClient with a MeterProvider of its own, read by
// the reader returned.
func meteredClient(t testing.TB, addr, tag string, opts Options) (*testClient, *sdkmetric.ManualReader) {
	t.Helper()
	mp, reader := newReader(t)
	opts.MeterProvider = mp
	return newTestClient(t, addr, tag, &opts), reader
}

// collect reads reader, and checks that every memolock data point carries
// one of tags, and none an id or a label outside the documented ones.
func collect(t testing.TB, reader *sdkmetric.ManualReader, tags ...string) metricdata.ResourceMetrics {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(bg(), &rm); err != nil {
		t.Fatalf("Collect: %v", err)
	}
	labels := map[attribute.Key][]string{
		"memolock.tag":    tags,
		"memolock.served": {"l1", "redis", "computed", "waited", "stale", "miss", "none"},
		"memolock.result": {"value", "not_found", "error", "none"},
		"memolock.reason": {"error", "panic", "timeout"},
	}
	eachPoint(t, rm, func(name string, attrs attribute.Set, _ int64, _ uint64) {
		if _, ok := attrs.Value("memolock.tag"); !ok {
			t.Errorf("%s %v: no memolock.tag", name, attrs.Encoded(attribute.DefaultEncoder()))
		}
		for _, kv := range attrs.ToSlice() {
			allowed, ok := labels[kv.Key]
			if !ok || !contains(allowed, kv.Value.Emit()) {
				t.Errorf("%s: label %s=%q; want only the tag, served, result and reason, with their documented values",
					name, kv.Key, kv.Value.Emit())
			}
		}
	})
	return rm
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// eachPoint calls fn with every data point of memolock's engine.Scope: a
// counter's or gauge's value, or a histogram's count.
func eachPoint(t testing.TB, rm metricdata.ResourceMetrics, fn func(name string, attrs attribute.Set, value int64, count uint64)) {
	t.Helper()
	for _, sm := range rm.ScopeMetrics {
		if sm.Scope.Name != engine.Scope {
			continue
		}
		for _, m := range sm.Metrics {
			switch d := m.Data.(type) {
			case metricdata.Sum[int64]:
				for _, dp := range d.DataPoints {
					fn(m.Name, dp.Attributes, dp.Value, 0)
				}
			case metricdata.Histogram[float64]:
				for _, dp := range d.DataPoints {
					fn(m.Name, dp.Attributes, 0, dp.Count)
				}
			default:
				t.Errorf("%s is a %T; want an int64 sum or a float64 histogram", m.Name, m.Data)
			}
		}
	}
}

// attr is a memolock label: attr("served", "l1") is memolock.served=l1.
func attr(key, value string) attribute.KeyValue {
	return attribute.String("memolock."+key, value)
}

func matches(set attribute.Set, attrs []attribute.KeyValue) bool {
	for _, kv := range attrs {
		if v, ok := set.Value(kv.Key); !ok || v != kv.Value {
			return false
		}
	}
	return true
}

// sum adds up the points of counter or gauge name whose labels include attrs.
func sum(rm metricdata.ResourceMetrics, name string, attrs ...attribute.KeyValue) int64 {
	var n int64
	eachPoint(nopTB{}, rm, func(m string, set attribute.Set, v int64, _ uint64) {
		if m == name && matches(set, attrs) {
			n += v
		}
	})
	return n
}

// histCount adds up the counts of histogram name's points whose labels
// include attrs.
func histCount(rm metricdata.ResourceMetrics, name string, attrs ...attribute.KeyValue) uint64 {
	var n uint64
	eachPoint(nopTB{}, rm, func(m string, set attribute.Set, _ int64, c uint64) {
		if m == name && matches(set, attrs) {
			n += c
		}
	})
	return n
}

// pointsOf counts the points of metric name whose labels include attrs.
func pointsOf(rm metricdata.ResourceMetrics, name string, attrs ...attribute.KeyValue) int {
	n := 0
	eachPoint(nopTB{}, rm, func(m string, set attribute.Set, _ int64, _ uint64) {
		if m == name && matches(set, attrs) {
			n++
		}
	})
	return n
}

// nopTB lets the readers above share eachPoint; collect has already
// reported unexpected data types.
type nopTB struct{ testing.TB }

func (nopTB) Helper()               {}
func (nopTB) Errorf(string, ...any) {}

// agree checks that the counters of c in rm say what c.Stats says. c must
// be idle.
func agree(t *testing.T, c *testClient, rm metricdata.ResourceMetrics) {
	t.Helper()
	s := c.Stats()
	tag := attr("tag", c.Keys().Tag())
	for _, k := range []struct {
		name      string
		got, want int64
	}{
		{"fetches", sum(rm, "memolock.fetches", tag), s.Fetches},
		{"fetch.failures", sum(rm, "memolock.fetch.failures", tag), s.FetchErrors},
		{"fetch.failures{panic}", sum(rm, "memolock.fetch.failures", tag, attr("reason", "panic")), s.FetchPanics},
		{"fetch.failures{timeout}", sum(rm, "memolock.fetch.failures", tag, attr("reason", "timeout")), s.FetchTimeouts},
		{"takeovers", sum(rm, "memolock.takeovers", tag), s.Takeovers},
		{"holder.failures", sum(rm, "memolock.holder.failures", tag), s.HolderFails},
		{"leases.lost", sum(rm, "memolock.leases.lost", tag), s.LeaseLost},
		{"store.errors", sum(rm, "memolock.store.errors", tag), s.StoreErrors},
		{"refreshes", sum(rm, "memolock.refreshes", tag), s.Refreshes},
		{"pubsub.reconnects", sum(rm, "memolock.pubsub.reconnects", tag), s.Reconnects},
		{"outages", sum(rm, "memolock.outages", tag), s.Outages},
		{"gets{l1}", sum(rm, "memolock.gets", tag, attr("served", "l1")), s.L1Hits},
	} {
		if k.got != k.want {
			t.Errorf("memolock.%s = %d, but Stats says %d", k.name, k.got, k.want)
		}
	}
}

var (
	servedLabels = []string{"l1", "redis", "computed", "waited", "stale", "miss", "none"}
	resultLabels = []string{"value", "not_found", "error", "none"}
)

// Every answer is counted once, by how it was served and what it was; only
// the answers that reach past the L1 are timed.
func TestMetrics_GetsCountEachAnswerByHowItWasServed(t *testing.T) {
	b := realBackend(t)
	c, reader := meteredClient(t, b.addr, "mg", Options{L1Size: 100})
	eventually(t, 5*time.Second, "tracking to be live", func() bool { return c.e.L1Live() })
	want := map[[2]string]int64{}
	var calls atomic.Int64

	if r, err := c.GetResult(bg(), "k", constFetch(&calls, "v", 0)); err != nil || r.Served != ServedComputed {
		t.Fatalf("first Get: %+v, %v; want computed", r, err)
	}
	want[[2]string{"computed", "value"}]++
	// A value this process computed enters its L1 at once; one written
	// elsewhere is read from Redis first.
	rawClient(t, b.addr).Set(bg(), "mg:r", "v", 0)
	eventually(t, 5*time.Second, "the value to reach the L1", func() bool {
		r, err := c.GetResult(bg(), "r", noFetch)
		if err != nil || (r.Served != ServedRedis && r.Served != ServedL1) {
			t.Fatalf("Get of a stored value: %+v, %v", r, err)
		}
		want[[2]string{r.Served.String(), "value"}]++
		return r.Served == ServedL1
	})
	if want[[2]string{"redis", "value"}] == 0 {
		t.Fatal("the value reached the L1 without a Redis hit first")
	}
	for range 20 {
		if r, err := c.GetResult(bg(), "k", noFetch); err != nil || r.Served != ServedL1 {
			t.Fatalf("L1 hit: %+v, %v", r, err)
		}
	}
	want[[2]string{"l1", "value"}] += 20
	if r, err := c.Lookup(bg(), "k"); err != nil || r.Served != ServedL1 {
		t.Fatalf("Lookup of an L1 value: %+v, %v", r, err)
	}
	want[[2]string{"l1", "value"}]++

	if r, err := c.GetResult(bg(), "nf", notFoundFetch(&calls)); !errors.Is(err, ErrNotFound) || r.Served != ServedComputed {
		t.Fatalf("not found: %+v, %v", r, err)
	}
	want[[2]string{"computed", "not_found"}]++
	if _, err := c.Get(bg(), "bad", failingFetch(&calls, "db down")); err == nil {
		t.Fatal("a failing fetch gave no error")
	}
	want[[2]string{"none", "error"}]++ // an error is served by nobody
	if _, err := c.Lookup(bg(), "absent"); !errors.Is(err, ErrMiss) {
		t.Fatalf("Lookup of nothing: %v", err)
	}
	want[[2]string{"miss", "none"}]++
	done, cancel := context.WithCancel(bg())
	cancel()
	if _, err := c.Get(done, "k2", noFetch); !errors.Is(err, ErrTimeout) {
		t.Fatalf("Get with a done context: %v", err)
	}
	want[[2]string{"none", "error"}]++

	rm := collect(t, reader, "mg")
	var total int64
	for _, s := range servedLabels {
		for _, r := range resultLabels {
			total += want[[2]string{s, r}]
			if got := sum(rm, "memolock.gets", attr("tag", "mg"), attr("served", s), attr("result", r)); got != want[[2]string{s, r}] {
				t.Errorf("gets{served=%s, result=%s} = %d, want %d", s, r, got, want[[2]string{s, r}])
			}
		}
	}
	if got := sum(rm, "memolock.gets", attr("tag", "mg")); got != total {
		t.Errorf("gets = %d in all, want %d", got, total)
	}
	// Stats.Gets counts the same answers, L1 hits included.
	if st := c.Stats(); st.Gets != total || st.L1Hits != want[[2]string{"l1", "value"}] {
		t.Errorf("Stats: Gets %d, L1Hits %d; want %d and %d, as memolock.gets counts", st.Gets, st.L1Hits, total, want[[2]string{"l1", "value"}])
	}
	for _, k := range [][2]string{{"computed", "value"}, {"redis", "value"}, {"computed", "not_found"}, {"none", "error"}} {
		timed := want[k]
		if k == [2]string{"none", "error"} {
			timed-- // the Get whose context was done never reached Redis: counted, not timed
		}
		if got := histCount(rm, "memolock.get.duration", attr("served", k[0]), attr("result", k[1])); got != uint64(timed) {
			t.Errorf("get.duration{served=%s, result=%s} counts %d, want %d", k[0], k[1], got, timed)
		}
	}
	if n := pointsOf(rm, "memolock.get.duration", attr("served", "l1")); n != 0 {
		t.Errorf("get.duration has %d points for L1 hits; they must not be timed", n)
	}
	if got := histCount(rm, "memolock.fetch.duration", attr("tag", "mg")); got != 3 {
		t.Errorf("fetch.duration counts %d fetches, want 3", got)
	}
	if s := c.Stats(); s.L1Hits != want[[2]string{"l1", "value"}] {
		t.Errorf("Stats.L1Hits = %d, want %d", s.L1Hits, want[[2]string{"l1", "value"}])
	}
	agree(t, c, rm)
}

// A waiter parked on another process's lock shows in the gauges while it
// waits, and is counted as waited, with its wait timed, once it has the
// value.
func TestMetrics_WaiterIsGaugedWhileParkedAndCountedAsWaited(t *testing.T) {
	b := realBackend(t)
	opts := Options{LockTTL: 30 * time.Second}
	holder, hr := meteredClient(t, b.addr, "mw", opts)
	waiter, wr := meteredClient(t, b.addr, "mw", opts)
	l := countLookups(waiter.rdb, "mw:k")
	started, release := make(chan struct{}, 1), make(chan struct{})
	held := getAsync(holder, bg(), "k", blockingFetch(started, release, "pushed"))
	<-started
	got := getAsync(waiter, bg(), "k", noFetch)
	parkedAndLive(t, l, 2)

	tag := attr("tag", "mw")
	rm := collect(t, wr, "mw")
	if n := sum(rm, "memolock.waiting", tag); n != 1 {
		t.Errorf("waiter: waiting = %d while parked, want 1", n)
	}
	if n := sum(rm, "memolock.flights", tag); n != 1 {
		t.Errorf("waiter: flights = %d while parked, want 1", n)
	}
	if n := sum(rm, "memolock.pubsub.channels", tag); n < 2 {
		t.Errorf("waiter: pubsub.channels = %d while parked, want the value's and the events' at least", n)
	}
	hm := collect(t, hr, "mw")
	if n := sum(hm, "memolock.waiting", tag); n != 0 {
		t.Errorf("holder: waiting = %d while it fetches, want 0", n)
	}
	if n := sum(hm, "memolock.flights", tag); n != 1 {
		t.Errorf("holder: flights = %d while it fetches, want 1", n)
	}

	close(release)
	within(t, 5*time.Second, got, "pushed", "waiter")
	within(t, 5*time.Second, held, "pushed", "holder")
	eventually(t, 5*time.Second, "the gauges to fall back to 0", func() bool {
		rm = collect(t, wr, "mw")
		return sum(rm, "memolock.waiting", tag) == 0 && sum(rm, "memolock.flights", tag) == 0 &&
			sum(rm, "memolock.pubsub.channels", tag) == 0
	})
	if n := sum(rm, "memolock.gets", tag, attr("served", "waited"), attr("result", "value")); n != 1 {
		t.Errorf("waiter: gets{waited, value} = %d, want 1", n)
	}
	if n := sum(rm, "memolock.gets", tag); n != 1 {
		t.Errorf("waiter: gets = %d, want 1", n)
	}
	if n := histCount(rm, "memolock.wait.duration", tag, attr("result", "value")); n != 1 {
		t.Errorf("waiter: wait.duration{value} counts %d, want 1", n)
	}
	if n := histCount(rm, "memolock.get.duration", tag, attr("served", "waited"), attr("result", "value")); n != 1 {
		t.Errorf("waiter: get.duration{waited, value} counts %d, want 1", n)
	}
	if n := sum(rm, "memolock.fetches", tag); n != 0 {
		t.Errorf("waiter: fetches = %d, want 0", n)
	}
	if s := waiter.Stats(); s.Waits != 1 {
		t.Errorf("waiter: Stats.Waits = %d, want 1", s.Waits)
	}
	agree(t, waiter, rm)

	eventually(t, 5*time.Second, "the holder's flight to end", func() bool {
		hm = collect(t, hr, "mw")
		return sum(hm, "memolock.flights", tag) == 0
	})
	if n := sum(hm, "memolock.gets", tag, attr("served", "computed"), attr("result", "value")); n != 1 {
		t.Errorf("holder: gets{computed, value} = %d, want 1", n)
	}
	if n := sum(hm, "memolock.fetches", tag); n != 1 {
		t.Errorf("holder: fetches = %d, want 1", n)
	}
	if n := histCount(hm, "memolock.fetch.duration", tag); n != 1 {
		t.Errorf("holder: fetch.duration counts %d, want 1", n)
	}
	if n := pointsOf(hm, "memolock.wait.duration"); n != 0 {
		t.Errorf("holder: %d wait.duration points; it never waited", n)
	}
	agree(t, holder, hm)
}

// GetMany counts each distinct id once, however often it is given.
func TestMetrics_GetManyCountsEachDistinctIDOnce(t *testing.T) {
	b := miniBackend(t)
	c, reader := meteredClient(t, b.addr, "mm", Options{})
	if err := c.Set(bg(), "a", []byte("stored"), time.Minute); err != nil {
		t.Fatal(err)
	}
	items, err := c.GetMany(bg(), []string{"a", "b", "b", "c", "a"}, func(_ context.Context, id string, _ *Lease) ([]byte, time.Duration, error) {
		return []byte("computed " + id), time.Minute, nil
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := describe(items); strings.Join(got, " ") != "a=stored/redis b=computed b/computed b=computed b/computed c=computed c/computed a=stored/redis" {
		t.Fatalf("GetMany = %v", got)
	}
	rm := collect(t, reader, "mm")
	tag := attr("tag", "mm")
	if n := sum(rm, "memolock.gets", tag, attr("served", "redis"), attr("result", "value")); n != 1 {
		t.Errorf("gets{redis, value} = %d, want 1 (a, given twice)", n)
	}
	if n := sum(rm, "memolock.gets", tag, attr("served", "computed"), attr("result", "value")); n != 2 {
		t.Errorf("gets{computed, value} = %d, want 2 (b, given twice, and c)", n)
	}
	if n := sum(rm, "memolock.gets", tag); n != 3 {
		t.Errorf("gets = %d for 3 distinct ids", n)
	}
	if n := sum(rm, "memolock.fetches", tag); n != 2 {
		t.Errorf("fetches = %d, want 2", n)
	}
	agree(t, c, rm)
}

// A value served stale because fetch failed is counted as stale, and the
// failure as a fetch error.
func TestMetrics_StaleAnswerOnFetchError(t *testing.T) {
	b := realBackend(t)
	c, reader := meteredClient(t, b.addr, "ms", Options{StaleTTL: time.Minute})
	raw := rawClient(t, b.addr)
	if _, err := c.Get(bg(), "k", func(context.Context, *Lease) ([]byte, time.Duration, error) {
		return []byte("v1"), 200 * time.Millisecond, nil
	}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "the value to expire", func() bool { return raw.Exists(bg(), "ms:k").Val() == 0 })
	var calls atomic.Int64
	if r, err := c.GetResult(bg(), "k", failingFetch(&calls, "db down")); err != nil || r.Served != ServedStale {
		t.Fatalf("after a failed fetch: %+v, %v; want stale", r, err)
	}
	rm := collect(t, reader, "ms")
	tag := attr("tag", "ms")
	if n := sum(rm, "memolock.gets", tag, attr("served", "stale"), attr("result", "value")); n != 1 {
		t.Errorf("gets{stale, value} = %d, want 1", n)
	}
	if n := sum(rm, "memolock.fetch.failures", tag, attr("reason", "error")); n != 1 {
		t.Errorf("fetch.failures{error} = %d, want 1", n)
	}
	if n := histCount(rm, "memolock.get.duration", tag, attr("served", "stale")); n != 1 {
		t.Errorf("get.duration{stale} counts %d, want 1", n)
	}
	if s := c.Stats(); s.Stale != 1 {
		t.Errorf("Stats.Stale = %d, want 1", s.Stale)
	}
	agree(t, c, rm)
}

// Failed fetches are counted by reason, and every fetch is timed.
func TestMetrics_FetchFailuresByReason(t *testing.T) {
	b := miniBackend(t)
	c, reader := meteredClient(t, b.addr, "mf", Options{FetchTimeout: 200 * time.Millisecond})
	var calls atomic.Int64
	if _, err := c.Get(bg(), "error", failingFetch(&calls, "db down")); err == nil || err.Error() != "db down" {
		t.Errorf("failing fetch: %v", err)
	}
	if _, err := c.Get(bg(), "panic", func(context.Context, *Lease) ([]byte, time.Duration, error) { panic("boom") }); !errors.Is(err, ErrFetchPanicked) {
		t.Errorf("panicking fetch: %v", err)
	}
	if _, err := c.Get(bg(), "timeout", func(ctx context.Context, _ *Lease) ([]byte, time.Duration, error) {
		<-ctx.Done()
		return nil, 0, ctx.Err()
	}); !errors.Is(err, ErrTimeout) {
		t.Errorf("hung fetch: %v", err)
	}
	if _, err := c.Get(bg(), "ok", constFetch(&calls, "v", 0)); err != nil {
		t.Fatal(err)
	}
	rm := collect(t, reader, "mf")
	tag := attr("tag", "mf")
	for reason, want := range map[string]int64{"error": 1, "panic": 1, "timeout": 1} {
		if n := sum(rm, "memolock.fetch.failures", tag, attr("reason", reason)); n != want {
			t.Errorf("fetch.failures{%s} = %d, want %d", reason, n, want)
		}
	}
	if n := sum(rm, "memolock.fetches", tag); n != 4 {
		t.Errorf("fetches = %d, want 4", n)
	}
	if n := histCount(rm, "memolock.fetch.duration", tag); n != 4 {
		t.Errorf("fetch.duration counts %d, want 4", n)
	}
	if n := sum(rm, "memolock.gets", tag, attr("served", "none"), attr("result", "error")); n != 3 {
		t.Errorf("gets{none, error} = %d, want 3", n)
	}
	if s := c.Stats(); s.FetchPanics != 1 || s.FetchTimeouts != 1 || s.FetchErrors != 3 {
		t.Errorf("Stats: %d panics, %d time-outs, %d errors; want 1, 1, 3", s.FetchPanics, s.FetchTimeouts, s.FetchErrors)
	}
	agree(t, c, rm)
}

// A fetch that panics once its time limit has passed failed once, by
// time-out: no reason's count may go negative, as a counter never falls.
func TestMetrics_FetchFailureReasonsNeverGoNegative(t *testing.T) {
	b := miniBackend(t)
	c, reader := meteredClient(t, b.addr, "mfn", Options{FetchTimeout: 100 * time.Millisecond})
	if _, err := c.Get(bg(), "k", func(ctx context.Context, _ *Lease) ([]byte, time.Duration, error) {
		<-ctx.Done()
		panic("too late")
	}); !errors.Is(err, ErrTimeout) {
		t.Fatalf("Get = %v, want ErrTimeout", err)
	}
	// The late panic is recovered (and counted) after Get returned, once
	// fetch's goroutine ends; nothing else runs a fetch meanwhile.
	c.e.WaitIdle(time.Minute)
	rm := collect(t, reader, "mfn")
	var total int64
	for _, reason := range []string{"error", "panic", "timeout"} {
		n := sum(rm, "memolock.fetch.failures", attr("tag", "mfn"), attr("reason", reason))
		if n < 0 {
			t.Errorf("fetch.failures{%s} = %d: a counter went negative", reason, n)
		}
		total += n
	}
	if total != 1 {
		t.Errorf("fetch.failures = %d in all for one failed fetch", total)
	}
	if s := c.Stats(); s.FetchPanics+s.FetchTimeouts > s.FetchErrors {
		t.Errorf("Stats: %d panics and %d time-outs, both \"also counted in FetchErrors\", but FetchErrors = %d",
			s.FetchPanics, s.FetchTimeouts, s.FetchErrors)
	}
}

// A waiter whose holder vanished takes the lock over once it expires: a
// takeover, and a wait that ended with nothing.
func TestMetrics_TakeoverAfterTheHolderVanishes(t *testing.T) {
	b := realBackend(t)
	c, reader := meteredClient(t, b.addr, "mt", Options{LockTTL: 300 * time.Millisecond})
	var calls atomic.Int64
	if r, err := takeOverVanished(t, c, rawClient(t, b.addr), "mt/lock:k", "k", constFetch(&calls, "v", 0)); err != nil || r.Served != ServedComputed {
		t.Fatalf("Get = %+v, %v; want computed after a takeover", r, err)
	}
	rm := collect(t, reader, "mt")
	tag := attr("tag", "mt")
	if n := sum(rm, "memolock.takeovers", tag); n != 1 {
		t.Errorf("takeovers = %d, want 1", n)
	}
	if n := histCount(rm, "memolock.wait.duration", tag, attr("result", "none")); n != 1 {
		t.Errorf("wait.duration{none} counts %d, want 1", n)
	}
	if n := histCount(rm, "memolock.wait.duration", tag); n != 1 {
		t.Errorf("wait.duration counts %d waits, want 1", n)
	}
	if n := sum(rm, "memolock.gets", tag, attr("served", "computed"), attr("result", "value")); n != 1 {
		t.Errorf("gets{computed, value} = %d, want 1", n)
	}
	agree(t, c, rm)
}

// A waiter told that its holder elsewhere failed counts a holder failure,
// and its wait ends in an error.
func TestMetrics_HolderFailureElsewhere(t *testing.T) {
	b := realBackend(t)
	opts := Options{LockTTL: 30 * time.Second}
	holder, hr := meteredClient(t, b.addr, "mh", opts)
	waiter, wr := meteredClient(t, b.addr, "mh", opts)
	l := countLookups(waiter.rdb, "mh:k")
	started, release := make(chan struct{}, 1), make(chan struct{})
	held := getAsync(holder, bg(), "k", func(context.Context, *Lease) ([]byte, time.Duration, error) {
		started <- struct{}{}
		<-release
		return nil, 0, errors.New("db down")
	})
	<-started
	got := getAsync(waiter, bg(), "k", noFetch)
	parkedAndLive(t, l, 2)
	close(release)
	within(t, 5*time.Second, held, "error: db down", "holder")
	select {
	case v := <-got:
		if !strings.Contains(v, ErrHolderFailed.Error()) {
			t.Fatalf("waiter: %q, want ErrHolderFailed", v)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("waiter not told within 5s (lock TTL 30s)")
	}
	tag := attr("tag", "mh")
	// The flight answers its callers, and leaves the flights gauge, before
	// it records how long it waited.
	eventually(t, 5*time.Second, "the waiter's flight to end and record its wait", func() bool {
		rm := collect(t, wr, "mh")
		return sum(rm, "memolock.flights") == 0 && histCount(rm, "memolock.wait.duration", tag, attr("result", "error")) > 0
	})
	rm := collect(t, wr, "mh")
	if n := sum(rm, "memolock.holder.failures", tag); n != 1 {
		t.Errorf("waiter: holder.failures = %d, want 1", n)
	}
	if n := sum(rm, "memolock.gets", tag, attr("result", "error")); n != 1 {
		t.Errorf("waiter: gets{error} = %d, want 1", n)
	}
	if n := histCount(rm, "memolock.wait.duration", tag, attr("result", "error")); n != 1 {
		t.Errorf("waiter: wait.duration{error} counts %d, want 1", n)
	}
	agree(t, waiter, rm)
	hm := collect(t, hr, "mh")
	if n := sum(hm, "memolock.fetch.failures", tag, attr("reason", "error")); n != 1 {
		t.Errorf("holder: fetch.failures{error} = %d, want 1", n)
	}
	if n := sum(hm, "memolock.holder.failures", tag); n != 0 {
		t.Errorf("holder: holder.failures = %d, want 0", n)
	}
}

// A fetch whose lock is deleted under it has its value refused: a lease
// lost, not a store error.
func TestMetrics_LeaseLost(t *testing.T) {
	b := miniBackend(t)
	c, reader := meteredClient(t, b.addr, "ml", Options{})
	raw := rawClient(t, b.addr)
	v, err := c.Get(bg(), "k", func(ctx context.Context, _ *Lease) ([]byte, time.Duration, error) {
		if n := raw.Del(ctx, "ml/lock:k").Val(); n != 1 {
			t.Errorf("deleted %d locks", n)
		}
		return []byte("v"), time.Minute, nil
	})
	if err != nil || string(v) != "v" {
		t.Fatalf("Get = %q, %v", v, err)
	}
	rm := collect(t, reader, "ml")
	if n := sum(rm, "memolock.leases.lost", attr("tag", "ml")); n != 1 {
		t.Errorf("leases.lost = %d, want 1", n)
	}
	if n := sum(rm, "memolock.store.errors", attr("tag", "ml")); n != 0 {
		t.Errorf("store.errors = %d, want 0", n)
	}
	agree(t, c, rm)
}

// outOfMemory makes the private server srv refuse writes until the
// returned function (also run at cleanup) lifts the limit.
func outOfMemory(t *testing.T, srv *redistest.Server, raw *redis.Client) func() {
	t.Helper()
	if err := raw.ConfigSet(bg(), "maxmemory-policy", "noeviction").Err(); err != nil {
		t.Fatal(err)
	}
	if err := raw.ConfigSet(bg(), "maxmemory", "1").Err(); err != nil {
		t.Fatal(err)
	}
	restore := func() { _ = raw.ConfigSet(bg(), "maxmemory", "0").Err() }
	t.Cleanup(restore)
	return restore
}

// A store that Redis refuses (out of memory) is a store error, and no
// outage: Redis answered.
func TestMetrics_StoreError(t *testing.T) {
	srv := redistest.Start(t)
	c, reader := meteredClient(t, srv.Addr, "mse", Options{})
	raw := rawClient(t, srv.Addr)
	var restore func()
	v, err := c.Get(bg(), "k", func(context.Context, *Lease) ([]byte, time.Duration, error) {
		restore = outOfMemory(t, srv, raw)
		return []byte("v"), time.Minute, nil
	})
	restore()
	if err != nil || string(v) != "v" {
		t.Fatalf("Get = %q, %v; want the value, unstored", v, err)
	}
	eventually(t, 5*time.Second, "the flight to end", func() bool {
		return sum(collect(t, reader, "mse"), "memolock.flights") == 0
	})
	rm := collect(t, reader, "mse")
	if n := sum(rm, "memolock.store.errors", attr("tag", "mse")); n != 1 {
		t.Errorf("store.errors = %d, want 1", n)
	}
	if n := sum(rm, "memolock.outages", attr("tag", "mse")); n != 0 {
		t.Errorf("outages = %d after an error reply, want 0", n)
	}
	agree(t, c, rm)
}

// A value refreshed ahead of its expiry is counted as a refresh.
func TestMetrics_RefreshAhead(t *testing.T) {
	b := realBackend(t)
	c, reader := meteredClient(t, b.addr, "mr", Options{RefreshAhead: 400 * time.Millisecond})
	var calls atomic.Int64
	fetch := func(context.Context, *Lease) ([]byte, time.Duration, error) {
		return []byte(fmt.Sprint("v", calls.Add(1))), time.Second, nil
	}
	if _, err := c.Get(bg(), "hot", fetch); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "a refresh", func() bool {
		if _, err := c.Get(bg(), "hot", fetch); err != nil {
			t.Fatal(err)
		}
		return c.Stats().Refreshes > 0
	})
	eventually(t, 5*time.Second, "the refresh's flight to end", func() bool {
		return sum(collect(t, reader, "mr"), "memolock.flights") == 0
	})
	rm := collect(t, reader, "mr")
	if n := sum(rm, "memolock.refreshes", attr("tag", "mr")); n != 1 {
		t.Errorf("refreshes = %d, want 1", n)
	}
	if n := sum(rm, "memolock.fetches", attr("tag", "mr")); n != 2 {
		t.Errorf("fetches = %d, want 2", n)
	}
	agree(t, c, rm)
}

// parkOnForeignLock starts a Get of id on c that waits on a lock held by a
// holder that never answers, and returns once the wait is live; cancel
// ends the Get.
func parkOnForeignLock(t *testing.T, c *testClient, raw *redis.Client, id string) (cancel func()) {
	t.Helper()
	tag := c.Keys().Tag()
	raw.Set(bg(), tag+"/lock:"+id, "silent-holder", 30*time.Second)
	l := countLookups(c.rdb, tag+":"+id)
	ctx, stop := context.WithCancel(bg())
	got := getAsync(c, ctx, id, noFetch)
	parkedAndLive(t, l, 2)
	return func() {
		stop()
		select {
		case <-got:
		case <-time.After(5 * time.Second):
			t.Fatal("the parked Get did not return within 5s of its cancellation")
		}
	}
}

// A pub/sub connection killed under a waiter is replaced, and counted.
func TestMetrics_PubSubReconnects(t *testing.T) {
	b := realBackend(t)
	c, reader := meteredClient(t, b.addr, "mp", Options{LockTTL: 30 * time.Second})
	raw := rawClient(t, b.addr)
	cancel := parkOnForeignLock(t, c, raw, "k")
	defer cancel()
	if n := raw.ClientKillByFilter(bg(), "TYPE", "pubsub").Val(); n != 1 {
		t.Fatalf("CLIENT KILL TYPE pubsub killed %d connections, want 1", n)
	}
	eventually(t, 5*time.Second, "a reconnect", func() bool { return c.Stats().Reconnects > 0 })
	rm := collect(t, reader, "mp")
	if n := sum(rm, "memolock.pubsub.reconnects", attr("tag", "mp")); n < 1 || n > c.Stats().Reconnects {
		t.Errorf("pubsub.reconnects = %d; want at least 1, at most Stats' %d", n, c.Stats().Reconnects)
	}
}

// A Redis that refuses connections is one outage, however many calls
// find it so; every call is counted as an error.
func TestMetrics_Outages(t *testing.T) {
	c, reader := meteredClient(t, refusedAddr(t), "mo", Options{})
	var calls atomic.Int64
	for i := range 5 {
		if _, err := c.Get(bg(), fmt.Sprint("k", i), constFetch(&calls, "v", 0)); !errors.Is(err, ErrRedis) {
			t.Fatalf("Get %d = %v, want ErrRedis", i, err)
		}
	}
	rm := collect(t, reader, "mo")
	tag := attr("tag", "mo")
	if n := sum(rm, "memolock.outages", tag); n != 1 {
		t.Errorf("outages = %d, want 1", n)
	}
	if n := sum(rm, "memolock.gets", tag, attr("result", "error")); n != 5 {
		t.Errorf("gets{error} = %d, want 5", n)
	}
	if n := sum(rm, "memolock.fetches", tag); n != 0 || calls.Load() != 0 {
		t.Errorf("fetches = %d (fetch ran %d times), want 0", n, calls.Load())
	}
	agree(t, c, rm)
}

// A call that failed because Redis was unreachable ran no fetch: it must
// not be counted, or timed, as computed.
func TestMetrics_OutageErrorsAreNotCountedAsComputed(t *testing.T) {
	c, reader := meteredClient(t, refusedAddr(t), "moc", Options{})
	var calls atomic.Int64
	for i := range 3 {
		if _, err := c.Get(bg(), fmt.Sprint("k", i), constFetch(&calls, "v", 0)); !errors.Is(err, ErrRedis) {
			t.Fatalf("Get %d = %v, want ErrRedis", i, err)
		}
	}
	rm := collect(t, reader, "moc")
	if n := sum(rm, "memolock.gets", attr("served", "computed")); n != 0 {
		t.Errorf("gets{served=computed} = %d, but fetch never ran (%d calls)", n, calls.Load())
	}
	if n := histCount(rm, "memolock.get.duration", attr("served", "computed")); n != 0 {
		t.Errorf("get.duration{served=computed} counts %d, but fetch never ran", n)
	}
}

// Once a client is closed its callback is gone: a Collect reports
// nothing observed from it, while another client on the same provider
// goes on being observed.
func TestMetrics_ClosedClientIsNoLongerObserved(t *testing.T) {
	b := miniBackend(t)
	mp, reader := newReader(t)
	closing := newTestClient(t, b.addr, "mca", &Options{MeterProvider: mp})
	staying := newTestClient(t, b.addr, "mcb", &Options{MeterProvider: mp})
	var calls atomic.Int64
	for _, c := range []*testClient{closing, staying} {
		if _, err := c.Get(bg(), "k", constFetch(&calls, "v", 0)); err != nil {
			t.Fatal(err)
		}
	}
	observed := []string{"memolock.gets", "memolock.fetches", "memolock.fetch.failures", "memolock.takeovers",
		"memolock.holder.failures", "memolock.leases.lost", "memolock.store.errors", "memolock.refreshes",
		"memolock.pubsub.reconnects", "memolock.outages", "memolock.waiting", "memolock.flights", "memolock.pubsub.channels"}
	rm := collect(t, reader, "mca", "mcb")
	for _, name := range observed {
		for _, tag := range []string{"mca", "mcb"} {
			if pointsOf(rm, name, attr("tag", tag)) == 0 {
				t.Errorf("open client %s: no %s", tag, name)
			}
		}
	}
	if err := closing.Close(); err != nil {
		t.Fatal(err)
	}
	rm = collect(t, reader, "mca", "mcb")
	for _, name := range observed {
		if n := pointsOf(rm, name, attr("tag", "mca")); n != 0 {
			t.Errorf("closed client: %d %s points", n, name)
		}
		if pointsOf(rm, name, attr("tag", "mcb")) == 0 {
			t.Errorf("open client: no %s after the other closed", name)
		}
	}
	if n := sum(rm, "memolock.gets", attr("tag", "mcb")); n != 1 {
		t.Errorf("open client: gets = %d, want 1", n)
	}
}

// A New that fails leaves nothing registered on the MeterProvider: the
// next Collect neither panics nor reports the client that never was.
func TestMetrics_FailedNewLeavesNoCallback(t *testing.T) {
	b := miniBackend(t)
	mp, reader := newReader(t)
	ring := redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": b.addr}})
	defer ring.Close()
	if _, err := New(ring, "mfail", &Options{L1Size: 10, MeterProvider: mp}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("New with an L1 on a ring = %v, want ErrInvalid", err)
	}
	var rm metricdata.ResourceMetrics
	func() {
		defer func() {
			if p := recover(); p != nil {
				t.Errorf("Collect after a failed New panicked: %v", p)
			}
		}()
		rm = collect(t, reader, "mfail")
	}()
	if n := pointsOf(rm, "memolock.gets") + pointsOf(rm, "memolock.fetches") + pointsOf(rm, "memolock.waiting"); n != 0 {
		t.Errorf("%d points from a client whose New failed", n)
	}
}

// A failure reason's count only grows, even read while failures are
// being counted: each reason is a counter of its own, not a difference.
func TestMetrics_FetchFailureReasonsOnlyGrowUnderConcurrentCollection(t *testing.T) {
	b := miniBackend(t)
	c, reader := meteredClient(t, b.addr, "mfg", Options{})
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			_, _ = c.Get(bg(), "k", func(context.Context, *Lease) ([]byte, time.Duration, error) {
				if i%2 == 0 {
					return nil, 0, errors.New("plain")
				}
				panic("boom")
			})
		}
	}()
	// At least 300 collections, and on until both reasons were seen: the
	// Gets run beside them at whatever pace a loaded machine allows.
	last := map[string]int64{}
	deadline := time.Now().Add(20 * time.Second)
	for i := 0; i < 300 || ((last["panic"] == 0 || last["error"] == 0) && time.Now().Before(deadline)); i++ {
		rm := collect(t, reader, "mfg")
		for _, reason := range []string{"error", "panic"} {
			n := sum(rm, "memolock.fetch.failures", attr("tag", "mfg"), attr("reason", reason))
			if n < last[reason] {
				t.Fatalf("fetch.failures{%s} went from %d to %d", reason, last[reason], n)
			}
			last[reason] = n
		}
	}
	close(stop)
	<-done
	if last["panic"] == 0 || last["error"] == 0 {
		t.Fatalf("no failures seen: %v", last)
	}
}

// A ManyOptions.Batch function that panics counts as a panic.
func TestMetrics_BatchPanicCountsAsPanic(t *testing.T) {
	b := miniBackend(t)
	c, reader := meteredClient(t, b.addr, "mbp", Options{})
	items, err := c.GetMany(bg(), []string{"a", "b"}, nil, &ManyOptions{Batch: func(context.Context, []string) (map[string]BatchValue, error) {
		panic("batch blew up")
	}})
	if err != nil {
		t.Fatal(err)
	}
	for _, it := range items {
		if !errors.Is(it.Err, ErrFetchPanicked) {
			t.Fatalf("item %s: %v", it.ID, it.Err)
		}
	}
	rm := collect(t, reader, "mbp")
	if n := sum(rm, "memolock.fetch.failures", attr("tag", "mbp"), attr("reason", "panic")); n != 2 {
		t.Errorf("fetch.failures{panic} = %d, want one per member flight, 2", n)
	}
	if n := sum(rm, "memolock.fetch.failures", attr("tag", "mbp"), attr("reason", "error")); n != 0 {
		t.Errorf("fetch.failures{error} = %d, want 0", n)
	}
	if s := c.Stats(); s.FetchPanics != 2 || s.FetchErrors != 2 {
		t.Errorf("Stats: %d panics, %d errors; want 2 and 2", s.FetchPanics, s.FetchErrors)
	}
}

// totalCalls is every answer c counted.
func totalCalls(c *Client) int64 {
	_, n := c.e.AnswerCounts()
	return n
}

// closeOnMGET closes the memolock client while GetMany's MGET is out.
type closeOnMGET struct {
	c    atomic.Pointer[Client]
	once sync.Once
}

func (h *closeOnMGET) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *closeOnMGET) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if cmd.Name() == "mget" {
			h.once.Do(func() {
				c := h.c.Load()
				go c.Close()
				for !c.e.Closing() {
					time.Sleep(time.Millisecond)
				}
			})
		}
		return next(ctx, cmd)
	}
}
func (h *closeOnMGET) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// GetMany's ids that no flight can take (the client closed under it)
// are counted too, with a batch function or without.
func TestMetrics_GetManyIdsRefusedAtCloseAreCounted(t *testing.T) {
	for _, batch := range []bool{true, false} {
		t.Run(fmt.Sprint("batch=", batch), func(t *testing.T) {
			b := miniBackend(t)
			rdb := redis.NewClient(&redis.Options{Addr: b.addr})
			defer rdb.Close()
			h := &closeOnMGET{}
			rdb.AddHook(h)
			c, err := New(rdb, "mgc", nil)
			if err != nil {
				t.Fatal(err)
			}
			h.c.Store(c)
			opts := &ManyOptions{}
			if batch {
				opts.Batch = func(_ context.Context, ids []string) (map[string]BatchValue, error) {
					m := map[string]BatchValue{}
					for _, id := range ids {
						m[id] = BatchValue{Value: []byte(id), TTL: time.Minute}
					}
					return m, nil
				}
			}
			items, err := c.GetMany(bg(), []string{"a", "b", "c"}, func(_ context.Context, id string, _ *Lease) ([]byte, time.Duration, error) {
				return []byte(id), time.Minute, nil
			}, opts)
			_ = c.Close()
			if err != nil || len(items) != 3 {
				t.Fatalf("GetMany: %d items, %v", len(items), err)
			}
			if n := totalCalls(c); n != 3 {
				t.Errorf("3 ids answered, %d counted", n)
			}
		})
	}
}

// slowLookup holds every script call back until released, so that Close
// lands while a lookup is out; out is closed when the first one is.
type slowLookup struct {
	out, release chan struct{}
	once         sync.Once
}

func (h *slowLookup) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *slowLookup) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if n := cmd.Name(); n == "evalsha" || n == "eval" {
			h.once.Do(func() { close(h.out) })
			<-h.release
		}
		return next(ctx, cmd)
	}
}
func (h *slowLookup) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// A caller whose inline lookup (a context that cannot end) returns after
// Close finished its flight gets the flight's answer, ErrClosed, as it was
// counted: never a value counted as an error.
func TestMetrics_CloseDuringAnInlineHitCountsWhatTheCallerGot(t *testing.T) {
	b := miniBackend(t)
	rawClient(t, b.addr).Set(bg(), "cih:x", "v", time.Minute)
	rdb := redis.NewClient(&redis.Options{Addr: b.addr})
	defer rdb.Close()
	slow := &slowLookup{out: make(chan struct{}), release: make(chan struct{})}
	rdb.AddHook(slow)
	c, err := New(rdb, "cih", nil)
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	go func() {
		_, err := c.GetResult(bg(), "x", func(context.Context, *Lease) ([]byte, time.Duration, error) { return []byte("f"), time.Minute, nil })
		got <- err
	}()
	<-slow.out // the lookup is under way
	closed := make(chan struct{})
	go func() {
		_ = c.Close()
		close(closed)
	}()
	eventually(t, 5*time.Second, "Close to begin", func() bool { return c.e.Closing() })
	close(slow.release)
	<-closed
	err = <-got
	if err != nil && !errors.Is(err, ErrClosed) {
		t.Fatalf("the caller got %v", err)
	}
	answer := "redis/value"
	if err != nil {
		answer = "none/error"
	}
	counts, total := c.e.AnswerCounts()
	if n := counts[answer]; n != 1 || total != 1 {
		t.Errorf("the caller got err=%v; counts: that answer %d, in all %d", err, n, total)
	}
}
