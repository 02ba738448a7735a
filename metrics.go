package memolock

import (
	"context"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// scope names memolock's meter and tracer.
const scope = "github.com/memolock/memolock"

// meters are a Client's OpenTelemetry instruments.
//
// Counters and gauges are observed: a callback reads the Client's own
// atomics (the ones behind Stats) when the SDK collects, so that counting
// costs the hot path nothing more than it already did. Only durations are
// recorded as they happen, and never for an L1 hit, whose clock reads
// alone would cost more than the hit.
type meters struct {
	fetchDur, waitDur, getDur metric.Float64Histogram

	tag     metric.MeasurementOption                        // the tag, on every measurement
	calls   [servedKinds][outcomes]metric.MeasurementOption // tag, served and result
	results [outcomes]metric.MeasurementOption              // tag and result
	// The same as slices for Record, which takes them variadic: passing
	// one option would allocate a slice per measurement.
	tagRec     []metric.RecordOption
	callsRec   [servedKinds][outcomes][]metric.RecordOption
	resultsRec [outcomes][]metric.RecordOption
	reg        metric.Registration
	disabled   bool // a meter that failed to make its instruments records nothing
}

// servedLabel names a Served value in metrics and spans.
func servedLabel(s Served) string {
	if s == servedMiss {
		return "miss"
	}
	return s.String()
}

var outcomeLabels = [outcomes]string{"value", "not_found", "error", "none"}

// newMeters makes the instruments of a Client of tag on mp.
func newMeters(mp metric.MeterProvider, tag string, c *Client) (*meters, error) {
	m := mp.Meter(scope)
	tagAttr := attribute.String("memolock.tag", tag)
	tags := attribute.NewSet(tagAttr)
	ms := &meters{tag: metric.WithAttributeSet(tags)}
	for s := range servedKinds {
		for o := range outcomes {
			ms.calls[s][o] = metric.WithAttributeSet(attribute.NewSet(tagAttr,
				attribute.String("memolock.served", servedLabel(s)), attribute.String("memolock.result", outcomeLabels[o])))
		}
	}
	for o := range outcomes {
		ms.results[o] = metric.WithAttributeSet(attribute.NewSet(tagAttr, attribute.String("memolock.result", outcomeLabels[o])))
		ms.resultsRec[o] = []metric.RecordOption{ms.results[o]}
		for s := range servedKinds {
			ms.callsRec[s][o] = []metric.RecordOption{ms.calls[s][o]}
		}
	}
	ms.tagRec = []metric.RecordOption{ms.tag}

	var err error
	seconds := func(name, desc string) metric.Float64Histogram {
		var h metric.Float64Histogram
		if err == nil {
			h, err = m.Float64Histogram(name, metric.WithUnit("s"), metric.WithDescription(desc),
				metric.WithExplicitBucketBoundaries(.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30))
		}
		return h
	}
	ms.fetchDur = seconds("memolock.fetch.duration", "How long fetch ran, in this process.")
	ms.waitDur = seconds("memolock.wait.duration", "How long a flight waited for another holder, from its busy reply to the value (or error).")
	ms.getDur = seconds("memolock.get.duration", "How long a Get took, by how it was served; L1 hits are not timed.")

	type counter struct {
		name, unit, desc string
		read             func() int64
		reason           string // of a fetch failure
		attrs            metric.ObserveOption
	}
	s := &c.stats
	counters := []counter{
		{"memolock.fetches", "{fetch}", "Fetch (or start) functions run by this process.", s.fetches.Load, "", nil},
		{"memolock.fetch.failures", "{fetch}", "Fetches that failed, by reason: error, panic or timeout.", s.fetchOther.Load, "error", nil},
		{"memolock.fetch.failures", "", "", s.fetchPanics.Load, "panic", nil},
		{"memolock.fetch.failures", "", "", s.fetchTimeouts.Load, "timeout", nil},
		{"memolock.takeovers", "{lock}", "Locks taken after the previous holder's lock expired.", s.takeovers.Load, "", nil},
		{"memolock.holder.failures", "{event}", "Failures received from holders in other processes.", s.holderFails.Load, "", nil},
		{"memolock.leases.lost", "{lease}", "Fetched values not stored because the lock was lost.", s.leaseLost.Load, "", nil},
		{"memolock.store.errors", "{store}", "Fetched values not stored because Redis failed.", s.storeErrors.Load, "", nil},
		{"memolock.refreshes", "{refresh}", "Values refreshed ahead of expiry (Options.RefreshAhead).", s.refreshes.Load, "", nil},
		{"memolock.pubsub.reconnects", "{connection}", "Pub/sub connections replaced after an error.", s.reconnects.Load, "", nil},
		{"memolock.outages", "{outage}", "Times Redis was found unreachable.", s.outages.Load, "", nil},
	}
	made := map[string]metric.Int64ObservableCounter{}
	var observables []metric.Observable
	for i, k := range counters {
		if err != nil {
			break
		}
		counters[i].attrs = metric.WithAttributeSet(tags)
		if k.reason != "" {
			counters[i].attrs = metric.WithAttributeSet(attribute.NewSet(tagAttr, attribute.String("memolock.reason", k.reason)))
		}
		if _, ok := made[k.name]; !ok {
			made[k.name], err = m.Int64ObservableCounter(k.name, metric.WithUnit(k.unit), metric.WithDescription(k.desc))
			observables = append(observables, made[k.name])
		}
	}
	var gets metric.Int64ObservableCounter
	if err == nil {
		gets, err = m.Int64ObservableCounter("memolock.gets", metric.WithUnit("{call}"),
			metric.WithDescription("Answers given to callers (Get and its variants, Lookup, each distinct GetMany id), by how they were served and what they were."))
	}
	gauge := func(name, unit, desc string) metric.Int64ObservableUpDownCounter {
		var g metric.Int64ObservableUpDownCounter
		if err == nil {
			g, err = m.Int64ObservableUpDownCounter(name, metric.WithUnit(unit), metric.WithDescription(desc))
		}
		return g
	}
	waiting := gauge("memolock.waiting", "{flight}", "Flights parked until a value comes from elsewhere: another holder, or an external producer.")
	flights := gauge("memolock.flights", "{flight}", "Flights in progress in this process.")
	channels := gauge("memolock.pubsub.channels", "{channel}", "Channels subscribed on this client's pub/sub connections.")
	if err != nil {
		return &meters{disabled: true}, err
	}
	observables = append(observables, gets, waiting, flights, channels)
	tagObs := ms.tag
	ms.reg, err = m.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		for _, k := range counters {
			o.ObserveInt64(made[k.name], k.read(), k.attrs)
		}
		for sv := range servedKinds {
			for oc := range outcomes {
				if n := s.calls[sv][oc].Load(); n > 0 {
					o.ObserveInt64(gets, n, ms.calls[sv][oc])
				}
			}
		}
		o.ObserveInt64(waiting, s.waiting.Load(), tagObs)
		o.ObserveInt64(flights, int64(c.flights.running()), tagObs)
		o.ObserveInt64(channels, int64(c.channels()), tagObs)
		return nil
	}, observables...)
	if err != nil {
		return &meters{disabled: true}, err
	}
	return ms, nil
}

// fetched records how long a fetch ran.
func (m *meters) fetched(ctx context.Context, d time.Duration) {
	if !m.disabled {
		m.fetchDur.Record(ctx, d.Seconds(), m.tagRec...)
	}
}

// waited records how long a flight waited for another holder, and what it
// got: none when it took the lock over.
func (m *meters) waited(ctx context.Context, d time.Duration, o outcome) {
	if !m.disabled {
		m.waitDur.Record(ctx, d.Seconds(), m.resultsRec[o]...)
	}
}

// got records how long a call took, by how it was served.
func (m *meters) got(ctx context.Context, d time.Duration, served Served, err error) {
	if !m.disabled {
		served, o := outcomeOf(served, err)
		m.getDur.Record(ctx, d.Seconds(), m.callsRec[served][o]...)
	}
}

// timing reports whether Get durations are recorded: not without an SDK.
func (m *meters) timing(ctx context.Context) bool {
	return !m.disabled && m.getDur.Enabled(ctx)
}

// close stops the callback, so that a closed Client is no longer observed.
func (m *meters) close() {
	if m.reg != nil {
		_ = m.reg.Unregister()
	}
}
