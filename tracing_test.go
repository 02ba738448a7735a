package memolock

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	tracenoop "go.opentelemetry.io/otel/trace/noop"
)

// newTraced returns a client whose spans go to the returned recorder.
func newTraced(t testing.TB, addr, tag string, opts Options) (*testClient, *tracetest.SpanRecorder) {
	t.Helper()
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	opts.TracerProvider = tp
	return newTestClient(t, addr, tag, &opts), rec
}

func spanAttr(s sdktrace.ReadOnlySpan, key string) (attribute.Value, bool) {
	for _, kv := range s.Attributes() {
		if string(kv.Key) == key {
			return kv.Value, true
		}
	}
	return attribute.Value{}, false
}

func spansNamed(rec *tracetest.SpanRecorder, name string) []sdktrace.ReadOnlySpan {
	var out []sdktrace.ReadOnlySpan
	for _, s := range rec.Ended() {
		if s.Name() == name {
			out = append(out, s)
		}
	}
	return out
}

func TestTracing_GetSpansAndFetchChild(t *testing.T) {
	srv := realBackend(t)
	c, rec := newTraced(t, srv.addr, "tr", Options{L1Size: 100})
	tracer := sdktrace.NewTracerProvider().Tracer("app")
	ctx, parent := tracer.Start(bg(), "request")
	defer parent.End()

	if _, err := c.Get(ctx, "a", func(context.Context, *Lease) ([]byte, time.Duration, error) {
		return []byte("v"), time.Minute, nil
	}); err != nil {
		t.Fatal(err)
	}
	gets := spansNamed(rec, "memolock.Get")
	fetches := spansNamed(rec, "memolock.fetch")
	if len(gets) != 1 || len(fetches) != 1 {
		t.Fatalf("after a computed Get: %d Get spans, %d fetch spans; want 1 and 1", len(gets), len(fetches))
	}
	g, f := gets[0], fetches[0]
	if g.Parent().SpanID() != parent.SpanContext().SpanID() {
		t.Error("the Get span is not a child of the caller's span")
	}
	if f.Parent().SpanID() != g.SpanContext().SpanID() || f.SpanContext().TraceID() != g.SpanContext().TraceID() {
		t.Error("the fetch span is not a child of the Get span")
	}
	if v, _ := spanAttr(g, "memolock.served"); v.AsString() != "computed" {
		t.Errorf("served = %q, want computed", v.AsString())
	}
	if v, _ := spanAttr(g, "memolock.tag"); v.AsString() != "tr" {
		t.Errorf("tag = %q", v.AsString())
	}

	// A Redis hit: a span, no fetch. Then an L1 hit: no span at all.
	c2, rec2 := newTraced(t, srv.addr, "tr", Options{L1Size: 100})
	r, err := c2.GetResult(bg(), "a", func(context.Context, *Lease) ([]byte, time.Duration, error) {
		return nil, 0, errors.New("not called")
	})
	if err != nil || r.Served != ServedRedis {
		t.Fatalf("second client: %v, %v", r.Served, err)
	}
	if gets := spansNamed(rec2, "memolock.Get"); len(gets) != 1 || len(spansNamed(rec2, "memolock.fetch")) != 0 {
		t.Fatalf("a Redis hit: %d Get spans, want 1 and no fetch", len(gets))
	} else if l := spansNamed(rec2, "memolock.lookup"); len(l) != 1 || l[0].Parent().SpanID() != gets[0].SpanContext().SpanID() {
		t.Fatalf("a Redis hit: %d lookup spans, want 1, the Get span's child", len(l))
	} else if v, _ := spanAttr(gets[0], "memolock.served"); v.AsString() != "redis" {
		t.Errorf("served = %q, want redis", v.AsString())
	}
	eventually(t, 5*time.Second, "an L1 hit", func() bool {
		r, err := c2.GetResult(bg(), "a", func(context.Context, *Lease) ([]byte, time.Duration, error) {
			return nil, 0, errors.New("not called")
		})
		return err == nil && r.Served == ServedL1
	})
	for _, s := range spansNamed(rec2, "memolock.Get") {
		if v, _ := spanAttr(s, "memolock.served"); v.AsString() == "l1" {
			t.Error("an L1 hit made a span")
		}
	}
}

func TestTracing_FailedFetchAndCoalescedCallers(t *testing.T) {
	srv := realBackend(t)
	c, rec := newTraced(t, srv.addr, "tr", Options{})
	started, release := make(chan struct{}, 1), make(chan struct{})
	var wg sync.WaitGroup
	errs := make(chan error, 3)
	call := func() {
		defer wg.Done()
		_, err := c.Get(bg(), "bad", func(ctx context.Context, _ *Lease) ([]byte, time.Duration, error) {
			started <- struct{}{}
			<-release
			return nil, 0, errors.New("backend down")
		})
		errs <- err
	}
	wg.Add(3)
	go call()
	<-started // the first caller leads
	go call()
	go call()
	eventually(t, 5*time.Second, "callers joining", func() bool { return c.Stats().Coalesced == 2 })
	close(release)
	wg.Wait()
	close(errs)
	for err := range errs {
		if err == nil {
			t.Error("a caller got no error")
		}
	}
	gets := spansNamed(rec, "memolock.Get")
	if len(gets) != 3 {
		t.Fatalf("%d Get spans for 3 callers", len(gets))
	}
	var leader sdktrace.ReadOnlySpan
	joined := 0
	for _, s := range gets {
		if s.Status().Code != codes.Error {
			t.Errorf("a failed Get's span has status %v", s.Status())
		}
		if v, _ := spanAttr(s, "memolock.result"); v.AsString() != "error" {
			t.Errorf("result = %q, want error", v.AsString())
		}
		if _, ok := spanAttr(s, "memolock.coalesced"); ok {
			joined++
		} else {
			leader = s
		}
	}
	if joined != 2 || leader == nil {
		t.Fatalf("%d coalesced spans, want 2", joined)
	}
	for _, s := range gets {
		if s == leader {
			continue
		}
		if l := s.Links(); len(l) != 1 || l[0].SpanContext.SpanID() != leader.SpanContext().SpanID() {
			t.Error("a coalesced caller's span does not link to the flight leader's")
		}
	}
	if f := spansNamed(rec, "memolock.fetch"); len(f) != 1 || f[0].Status().Code != codes.Error {
		t.Errorf("fetch spans: %d, want 1 with an error status", len(f))
	}
}

// traceChildEnv makes the test binary a holder process for
// TestTracing_WaiterLinksToHolderInAnotherProcess.
const traceChildEnv = "MEMOLOCK_TRACE_CHILD"

// runTraceChild holds id "x" of tag "trx" on the Redis at addr: it says
// "fetching", waits for a line on stdin, stores "from-child", and prints
// the trace id, its Get span's id, its fetch span's id and parent id.
func runTraceChild(addr string) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	defer rdb.Close()
	c, err := New(rdb, "trx", &Options{TracerProvider: tp})
	if err != nil {
		fmt.Println("error", err)
		return
	}
	defer c.Close()
	_, err = c.Get(context.Background(), "x", func(context.Context, *Lease) ([]byte, time.Duration, error) {
		fmt.Println("fetching")
		var line string
		_, _ = fmt.Fscanln(os.Stdin, &line)
		return []byte("from-child"), time.Minute, nil
	})
	if err != nil {
		fmt.Println("error", err)
		return
	}
	g, f := spansNamed(rec, "memolock.Get"), spansNamed(rec, "memolock.fetch")
	if len(g) != 1 || len(f) != 1 {
		fmt.Println("error: spans", len(g), len(f))
		return
	}
	fmt.Println("spans", g[0].SpanContext().TraceID(), g[0].SpanContext().SpanID(), f[0].SpanContext().SpanID(), f[0].Parent().SpanID())
}

func TestTracing_WaiterLinksToHolderInAnotherProcess(t *testing.T) {
	srv := realBackend(t)
	holder := startChild(t, traceChildEnv+"="+srv.addr)
	if !holder.out.Scan() || holder.out.Text() != "fetching" {
		t.Fatalf("holder process: %q", holder.out.Text())
	}
	waiting := make(chan string, 1)
	c, rec := newTraced(t, srv.addr, "trx", Options{OnWait: func(_, h string) { waiting <- h }})
	got := make(chan error, 1)
	go func() {
		r, err := c.GetResult(bg(), "x", func(context.Context, *Lease) ([]byte, time.Duration, error) {
			return nil, 0, errors.New("the waiter must not compute")
		})
		if err == nil && (string(r.Value) != "from-child" || r.Served != ServedWaited) {
			err = fmt.Errorf("got %q served %v", r.Value, r.Served)
		}
		got <- err
	}()
	var holderToken string
	select {
	case holderToken = <-waiting:
	case <-time.After(10 * time.Second):
		t.Fatal("the waiter never waited")
	}
	if _, err := fmt.Fprintln(holder.in, "go"); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatal(err)
	}
	if !holder.out.Scan() {
		t.Fatal("holder process said nothing more")
	}
	f := strings.Fields(holder.out.Text())
	if len(f) != 5 || f[0] != "spans" {
		t.Fatalf("holder process: %q", holder.out.Text())
	}
	traceID, getSpan, fetchSpan, fetchParent := f[1], f[2], f[3], f[4]
	if getSpan != fetchParent {
		t.Fatalf("holder: fetch span's parent %s is not its Get span %s", fetchParent, getSpan)
	}
	gets := spansNamed(rec, "memolock.Get")
	if len(gets) != 1 {
		t.Fatalf("%d waiter Get spans", len(gets))
	}
	w := gets[0]
	if v, _ := spanAttr(w, "memolock.holder"); v.AsString() != holderToken {
		t.Errorf("waiter's holder attribute %q, want %q", v.AsString(), holderToken)
	}
	if v, _ := spanAttr(w, "memolock.waited"); !v.AsBool() {
		t.Error("waiter's span does not say it waited")
	}
	linked := false
	for _, l := range w.Links() {
		if l.SpanContext.TraceID().String() == traceID && l.SpanContext.SpanID().String() == fetchSpan {
			linked = true
		}
	}
	if !linked {
		t.Errorf("waiter's links %v do not name the holder's fetch span %s/%s (token %q)", w.Links(), traceID, fetchSpan, holderToken)
	}
}

// globalTraceChildEnv makes the test binary the child of
// TestTracing_GlobalProviderSetAfterNew, which sets the global tracer
// provider: no other test's may change under it.
const globalTraceChildEnv = "MEMOLOCK_GLOBAL_TRACE_CHILD"

// runGlobalTraceChild makes a client with the default TracerProvider
// (the global one, no SDK set), serves a Get, then sets an SDK as the
// global provider and serves another. It prints the Get spans each made.
func runGlobalTraceChild(addr string) {
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	defer rdb.Close()
	c, err := New(rdb, "trg", nil)
	if err != nil {
		fmt.Println("error", err)
		return
	}
	defer c.Close()
	val := func(context.Context, *Lease) ([]byte, time.Duration, error) { return []byte("v"), time.Minute, nil }
	if _, err := c.Get(context.Background(), "before", val); err != nil {
		fmt.Println("error", err)
		return
	}
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	otel.SetTracerProvider(tp)
	if _, err := c.Get(context.Background(), "after", val); err != nil {
		fmt.Println("error", err)
		return
	}
	var ids []string
	for _, s := range spansNamed(rec, "memolock.Get") {
		v, _ := spanAttr(s, "memolock.id")
		ids = append(ids, v.AsString())
	}
	fmt.Println("spans", strings.Join(ids, ","), len(spansNamed(rec, "memolock.fetch")))
}

// A client made with the default TracerProvider before the application
// sets its SDK as the global provider traces the calls made after: a
// client does not start spans while no SDK is set (they would record
// nothing), but asks again on every call.
func TestTracing_GlobalProviderSetAfterNew(t *testing.T) {
	if got := globalTraceChild(t, globalTraceChildEnv); got != "spans after 1" {
		t.Fatalf("child printed %q; want the one Get made after the SDK was set traced, with its fetch (\"spans after 1\")", got)
	}
}

// globalTraceChild runs this test binary as a child that sets the global
// tracer provider (env names which child), against a miniredis, and
// returns what it printed.
func globalTraceChild(t *testing.T, env string) string {
	t.Helper()
	srv := miniBackend(t)
	child := exec.Command(os.Args[0], "-test.run=^$")
	child.Env = append(os.Environ(), env+"="+srv.addr)
	out, err := child.CombinedOutput()
	if err != nil {
		t.Fatalf("child: %v: %s", err, out)
	}
	return strings.TrimSpace(string(out))
}

// A client whose TracerProvider is a no-op (the default, before the
// application sets one up) never puts a traceparent in its lock token,
// even when the caller's context carries a sampled span of another
// provider: that span is not memolock's to name.
func TestTracing_NoopProviderLeavesTokensPlain(t *testing.T) {
	srv := miniBackend(t)
	tokens := make(chan string, 2)
	for _, opts := range []*Options{{}, {TracerProvider: tracenoop.NewTracerProvider()}} {
		c := newTestClient(t, srv.addr, "trn", opts)
		tp := sdktrace.NewTracerProvider()
		ctx, span := tp.Tracer("app").Start(bg(), "request")
		if _, err := c.Get(ctx, "k"+strconv.Itoa(len(tokens)), func(_ context.Context, l *Lease) ([]byte, time.Duration, error) {
			tokens <- l.Token()
			return []byte("v"), time.Minute, nil
		}); err != nil {
			t.Fatal(err)
		}
		span.End()
		_ = tp.Shutdown(bg())
	}
	close(tokens)
	for tok := range tokens {
		if strings.Contains(tok, "/") {
			t.Errorf("token %q names a span, with a no-op TracerProvider", tok)
		}
	}
}

// Every span a client starts ends, whatever path its call takes: computed,
// a Redis hit, a failed fetch, a wait that ends in a takeover, an external
// producer, a caller that gives up. The span a traced token names (the
// claim) ends as memolock.fetch when its flight computes, and as
// memolock.lookup when it does not.
func TestTracing_EverySpanEnds(t *testing.T) {
	srv := realBackend(t)
	c, rec := newTraced(t, srv.addr, "tre", Options{LockTTL: 300 * time.Millisecond})
	raw := rawClient(t, srv.addr)
	val := func(context.Context, *Lease) ([]byte, time.Duration, error) { return []byte("v"), time.Minute, nil }

	if _, err := c.Get(bg(), "computed", val); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Get(bg(), "computed", val); err != nil { // a Redis hit
		t.Fatal(err)
	}
	if _, err := c.Get(bg(), "bad", func(context.Context, *Lease) ([]byte, time.Duration, error) {
		return nil, 0, errors.New("down")
	}); err == nil {
		t.Fatal("no error")
	}
	// A holder that vanished: its lock expires, and this flight takes over.
	raw.Set(bg(), "tre/lock:gone", "someone-else", 300*time.Millisecond)
	if r, err := c.GetResult(bg(), "gone", val); err != nil || r.Served != ServedComputed {
		t.Fatalf("takeover: %v, %v", r.Served, err)
	}
	// An external producer.
	go func() {
		eventually(t, 5*time.Second, "the external start", func() bool { return raw.Exists(bg(), "tre/lock:ext").Val() == 1 })
		raw.Set(bg(), "tre:ext", "made elsewhere", time.Minute)
		raw.Publish(bg(), "tre/notif:ext", "made elsewhere")
	}()
	if _, err := c.GetExternal(bg(), "ext", func(context.Context, *Lease) error { return nil }); err != nil {
		t.Fatal(err)
	}
	// A caller that gives up while waiting on somebody else's lock.
	raw.Set(bg(), "tre/lock:held", "someone-else", time.Minute)
	ctx, cancel := context.WithTimeout(bg(), 100*time.Millisecond)
	if _, err := c.Get(ctx, "held", val); !errors.Is(err, ErrTimeout) {
		t.Fatalf("gave up: %v", err)
	}
	cancel()
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	started, ended := len(rec.Started()), len(rec.Ended())
	if started != ended {
		t.Errorf("%d spans started, %d ended", started, ended)
	}
	if n := len(spansNamed(rec, "memolock.fetch")); n != 3 {
		t.Errorf("%d fetch spans, want 3: computed, failed, taken over", n)
	}
	if n := len(spansNamed(rec, "memolock.lookup")); n < 3 {
		t.Errorf("%d lookup spans, want at least the Redis hit's, the external producer's and the wait given up", n)
	}
}
