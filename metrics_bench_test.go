package memolock

import (
	"context"
	"testing"
	"time"

	"go.opentelemetry.io/otel/metric/noop"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	tracenoop "go.opentelemetry.io/otel/trace/noop"
)

// BenchmarkMetricsOverhead measures what the OpenTelemetry SDK costs the
// hit paths: a client whose MeterProvider is the SDK's (with a reader, so
// that every instrument is live) against one with a no-op provider, on the
// same server in the same run. The two run in alternating slices of 1,000
// calls, so that drift in the machine's speed hits both alike. Tracing is
// off for both (a no-op TracerProvider): this is the metrics' cost alone.
//
// Reported: ns/op of each, and overhead-% = (sdk - noop) / noop.
func BenchmarkMetricsOverhead(b *testing.B) {
	srv := realBackend(b)
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	b.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	tp := tracenoop.NewTracerProvider()
	ctx := context.Background()
	fetch := func(context.Context, *Lease) ([]byte, time.Duration, error) { return []byte("v"), time.Hour, nil }

	for _, path := range []struct {
		name string
		l1   int
		want Served
	}{{"redis-hit", 0, ServedRedis}, {"l1-hit", 1000, ServedL1}} {
		b.Run(path.name, func(b *testing.B) {
			sdk := newTestClient(b, srv.addr, "bench-otel", &Options{L1Size: path.l1, MeterProvider: mp, TracerProvider: tp})
			none := newTestClient(b, srv.addr, "bench-otel", &Options{L1Size: path.l1, MeterProvider: noop.NewMeterProvider(), TracerProvider: tp})
			for _, c := range []*testClient{sdk, none} {
				deadline := time.Now().Add(5 * time.Second)
				for {
					r, err := c.GetResult(ctx, "k", fetch)
					if err == nil && r.Served == path.want {
						break
					}
					if time.Now().After(deadline) {
						b.Fatalf("never served from %v: %v, %v", path.want, r.Served, err)
					}
					time.Sleep(time.Millisecond)
				}
			}
			const slice = 1000
			var took [2]time.Duration
			var calls [2]int
			clients := [2]*testClient{sdk, none}
			which, t0 := 0, time.Now()
			b.ResetTimer()
			for i := 0; b.Loop(); i++ {
				// Every slice of calls goes to one client, in turn, and
				// is timed as a whole: a clock read per call would cost
				// about as much as an L1 hit.
				if i%slice == 0 && i > 0 {
					now := time.Now()
					took[which] += now.Sub(t0)
					which, t0 = 1-which, now
				}
				if _, err := clients[which].Get(ctx, "k", fetch); err != nil {
					b.Fatal(err)
				}
				calls[which]++
			}
			took[which] += time.Since(t0)
			if calls[0] == 0 || calls[1] == 0 {
				return // too few iterations to compare (-benchtime 1x)
			}
			sdkNs := float64(took[0].Nanoseconds()) / float64(calls[0])
			noneNs := float64(took[1].Nanoseconds()) / float64(calls[1])
			b.ReportMetric(sdkNs, "sdk-ns/op")
			b.ReportMetric(noneNs, "noop-ns/op")
			b.ReportMetric(100*(sdkNs-noneNs)/noneNs, "overhead-%")

			// The SDK saw the calls: the benchmark measured live instruments.
			var rm metricdata.ResourceMetrics
			if err := reader.Collect(ctx, &rm); err != nil {
				b.Fatal(err)
			}
			if !collected(rm, "memolock.gets") {
				b.Fatal("the SDK collected no memolock.gets")
			}
		})
	}
}

// collected reports whether rm has a metric of that name.
func collected(rm metricdata.ResourceMetrics, name string) bool {
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name == name {
				return true
			}
		}
	}
	return false
}
