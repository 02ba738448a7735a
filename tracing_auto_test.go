package memolock

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
)

// OpenTelemetry's zero-code instrumentation (go.opentelemetry.io/auto, an
// eBPF agent) attaches to a process that set no SDK: it sets
// autoInstEnabled, and the global tracer's spans then record, through
// go.opentelemetry.io/auto/sdk, whose start it fills in. These two stand
// in for the agent.

//go:linkname autoInstEnabled go.opentelemetry.io/otel/internal/global.autoInstEnabled
var autoInstEnabled *bool

//go:linkname autoSDKStart go.opentelemetry.io/auto/sdk.start
var autoSDKStart func(ctx context.Context, span unsafe.Pointer, psc *trace.SpanContext, sampled *bool, sc *trace.SpanContext)

// A client with the default TracerProvider, in a process where the
// auto-instrumentation agent attached (no SDK set, yet the global
// tracer's spans record), traces its Gets: its token names the span.
func TestTracing_AutoInstrumentationWithoutSDK(t *testing.T) {
	srv := miniBackend(t)
	c := newTestClient(t, srv.addr, "tra", nil)
	var starts atomic.Int64
	prevStart, prevOn := autoSDKStart, *autoInstEnabled
	autoSDKStart = func(_ context.Context, _ unsafe.Pointer, _ *trace.SpanContext, sampled *bool, sc *trace.SpanContext) {
		n := starts.Add(1)
		*sampled = true
		*sc = trace.NewSpanContext(trace.SpanContextConfig{TraceID: trace.TraceID{1}, SpanID: trace.SpanID{byte(n)}, TraceFlags: trace.FlagsSampled})
	}
	*autoInstEnabled = true
	t.Cleanup(func() { autoSDKStart, *autoInstEnabled = prevStart, prevOn })

	var token string
	if _, err := c.Get(bg(), "k", func(_ context.Context, l *Lease) ([]byte, time.Duration, error) {
		token = l.Token()
		return []byte("v"), time.Minute, nil
	}); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(token, "/") {
		t.Errorf("token %q names no span (%d auto spans started): the Get was not traced, though the global tracer records", token, starts.Load())
	}
}

// restoredTraceChildEnv makes the test binary the child of
// TestTracing_GlobalProviderSetBack.
const restoredTraceChildEnv = "MEMOLOCK_RESTORED_TRACE_CHILD"

// runRestoredTraceChild sets an SDK as the global provider, then sets the
// provider it replaced back (as a test's cleanup does): that provider now
// delegates to the SDK. A client made then with the default provider
// serves a Get; it prints the Get spans the SDK recorded.
func runRestoredTraceChild(addr string) {
	rec := tracetest.NewSpanRecorder()
	prev := otel.GetTracerProvider()
	otel.SetTracerProvider(sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec)))
	otel.SetTracerProvider(prev)
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	defer rdb.Close()
	c, err := New(rdb, "trr", nil)
	if err != nil {
		fmt.Println("error", err)
		return
	}
	defer c.Close()
	if _, err := c.Get(context.Background(), "k", func(context.Context, *Lease) ([]byte, time.Duration, error) {
		return []byte("v"), time.Minute, nil
	}); err != nil {
		fmt.Println("error", err)
		return
	}
	fmt.Println("spans", len(spansNamed(rec, "memolock.Get")))
}

// The global provider set back after an SDK was set delegates to that SDK:
// its spans record, and a client's Gets are traced, as they were before
// clients skipped the spans of an unset provider.
func TestTracing_GlobalProviderSetBack(t *testing.T) {
	srv := miniBackend(t)
	child := exec.Command(os.Args[0], "-test.run=^$")
	child.Env = append(os.Environ(), restoredTraceChildEnv+"="+srv.addr)
	out, err := child.CombinedOutput()
	if err != nil {
		t.Fatalf("child: %v: %s", err, out)
	}
	if got := strings.TrimSpace(string(out)); got != "spans 1" {
		t.Fatalf("child printed %q; want the Get traced (\"spans 1\")", got)
	}
}
