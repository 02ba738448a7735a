package memolock

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

// restoredTraceChildEnv makes the test binary the child of
// TestTracing_GlobalProviderSetBack.
const restoredTraceChildEnv = "MEMOLOCK_RESTORED_TRACE_CHILD"

// runRestoredTraceChild sets an SDK as the global provider, then sets the
// provider it replaced back (as a test's cleanup does): that provider now
// delegates to the SDK. A client made then with the default provider
// serves a Get; it prints the Get and fetch spans the SDK recorded.
func runRestoredTraceChild(addr string) {
	rec, c, end := restoredProviderClient(addr, "trr")
	if c == nil {
		return
	}
	defer end()
	if _, err := c.Get(context.Background(), "k", func(context.Context, *Lease) ([]byte, time.Duration, error) {
		return []byte("v"), time.Minute, nil
	}); err != nil {
		fmt.Println("error", err)
		return
	}
	fmt.Println("spans", len(spansNamed(rec, "memolock.Get")), len(spansNamed(rec, "memolock.fetch")))
}

// restoredProviderClient sets an SDK recording into rec as the global
// provider, sets the provider it replaced back, and makes a client of tag
// with the default provider. With no client (it printed the error), there
// is nothing to end.
func restoredProviderClient(addr, tag string) (rec *tracetest.SpanRecorder, c *Client, end func()) {
	rec = tracetest.NewSpanRecorder()
	prev := otel.GetTracerProvider()
	otel.SetTracerProvider(sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec)))
	otel.SetTracerProvider(prev)
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	c, err := New(rdb, tag, nil)
	if err != nil {
		fmt.Println("error", err)
		_ = rdb.Close()
		return rec, nil, nil
	}
	return rec, c, func() {
		_ = c.Close()
		_ = rdb.Close()
	}
}

// The global provider set back after an SDK was set delegates to that SDK:
// its spans record, and a client's Gets are traced, as they were before
// clients skipped the spans of an unset provider.
func TestTracing_GlobalProviderSetBack(t *testing.T) {
	if got := globalTraceChild(t, restoredTraceChildEnv); got != "spans 1 1" {
		t.Fatalf("child printed %q; want the Get and its fetch traced (\"spans 1 1\")", got)
	}
}

// restoredBatchTraceChildEnv makes the test binary the child of
// TestTracing_GlobalProviderSetBackBatch.
const restoredBatchTraceChildEnv = "MEMOLOCK_RESTORED_BATCH_TRACE_CHILD"

// runRestoredBatchTraceChild is runRestoredTraceChild for a client that
// only serves GetMany calls with a Batch: no Get of its own ever asks
// whether the provider set back records. It prints the fetch spans the
// SDK recorded.
func runRestoredBatchTraceChild(addr string) {
	rec, c, end := restoredProviderClient(addr, "trb")
	if c == nil {
		return
	}
	defer end()
	items, err := c.GetMany(context.Background(), []string{"a", "b"}, nil, &ManyOptions{
		Batch: func(_ context.Context, ids []string) (map[string]BatchValue, error) {
			out := make(map[string]BatchValue, len(ids))
			for _, id := range ids {
				out[id] = BatchValue{Value: []byte("v"), TTL: time.Minute}
			}
			return out, nil
		}})
	if err != nil {
		fmt.Println("error", err)
		return
	}
	for _, it := range items {
		if it.Err != nil || it.Served != ServedComputed {
			fmt.Println("error", it.ID, it.Served, it.Err)
			return
		}
	}
	fmt.Println("fetch spans", len(spansNamed(rec, "memolock.fetch")))
}

// The fetches of a GetMany batch are traced through a global provider set
// back after an SDK was set, as they were before fetches skipped the spans
// of an unset provider, even when no Get has yet found it recording.
func TestTracing_GlobalProviderSetBackBatch(t *testing.T) {
	if got := globalTraceChild(t, restoredBatchTraceChildEnv); got != "fetch spans 2" {
		t.Fatalf("child printed %q; want both fetches of the batch traced (\"fetch spans 2\")", got)
	}
}
