package main

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
)

// demoMeters is what `demo --metrics` records through: the OpenTelemetry
// SDK with a reader that the demo collects from before its clients close.
type demoMeters struct {
	reader   *sdkmetric.ManualReader
	provider *sdkmetric.MeterProvider
	got      metricdata.ResourceMetrics
}

func newDemoMeters() *demoMeters {
	r := sdkmetric.NewManualReader()
	return &demoMeters{reader: r, provider: sdkmetric.NewMeterProvider(sdkmetric.WithReader(r))}
}

// collect reads every instrument. The demo calls it while its clients
// are open: a closed client is no longer observed.
func (m *demoMeters) collect() error {
	return m.reader.Collect(context.Background(), &m.got)
}

func (m *demoMeters) shutdown() { _ = m.provider.Shutdown(context.Background()) }

// print writes one line per data point: the instrument, its attributes
// (the tag is left out: the demo has one), and its value; histograms give
// their count, sum and mean.
func (m *demoMeters) print(w io.Writer) {
	var lines []string
	for _, sm := range m.got.ScopeMetrics {
		for _, mt := range sm.Metrics {
			switch d := mt.Data.(type) {
			case metricdata.Sum[int64]:
				for _, p := range d.DataPoints {
					lines = append(lines, fmt.Sprintf("%-28s %-40s %d", mt.Name, attrs(p.Attributes), p.Value))
				}
			case metricdata.Histogram[float64]:
				for _, p := range d.DataPoints {
					mean := 0.0
					if p.Count > 0 {
						mean = p.Sum / float64(p.Count)
					}
					lines = append(lines, fmt.Sprintf("%-28s %-40s count %d, sum %.3fs, mean %.3fms",
						mt.Name, attrs(p.Attributes), p.Count, p.Sum, mean*1000))
				}
			}
		}
	}
	slices.Sort(lines)
	fmt.Fprintf(w, "\nmemolock's OpenTelemetry metrics for that run, as the SDK recorded them, summed over the clients:\n")
	for _, l := range lines {
		fmt.Fprintln(w, "  "+l)
	}
}

// attrs prints a data point's attributes without the memolock. prefix and
// without the tag.
func attrs(s attribute.Set) string {
	var parts []string
	for _, kv := range s.ToSlice() {
		if kv.Key == "memolock.tag" {
			continue
		}
		parts = append(parts, strings.TrimPrefix(string(kv.Key), "memolock.")+"="+kv.Value.Emit())
	}
	return strings.Join(parts, " ")
}
