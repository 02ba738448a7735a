package engine

import (
	"context"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// Scope names memolock's meter and tracer; Version is the instrumentation
// version they carry.
const (
	Scope   = "github.com/memolock/memolock"
	Version = "0.5.0"
)

// meters are an engine's OpenTelemetry instruments.
//
// Counters and gauges are observed: a callback reads the engine's own
// atomics (the ones behind Stats) when the SDK collects, so that counting
// costs the hot path nothing more than it already did. Only durations are
// recorded as they happen, and never for an L1 hit, whose clock reads alone
// would cost more than the hit.
type meters struct {
	fetchDur, waitDur, getDur metric.Float64Histogram
	labels
	reg      metric.Registration
	disabled bool // a meter that failed to make its instruments records nothing
}

// labels are the attribute sets of every measurement, made once: passing
// attributes per measurement would allocate.
type labels struct {
	tagAttr attribute.KeyValue
	tag     metric.MeasurementOption                        // the tag, on every measurement
	answers [servedKinds][outcomes]metric.MeasurementOption // tag, served and result
	// The same as slices for Record, which takes them variadic.
	tagRec     []metric.RecordOption
	answersRec [servedKinds][outcomes][]metric.RecordOption
	resultsRec [outcomes][]metric.RecordOption // tag and result
}

func newLabels(tag string) labels {
	l := labels{tagAttr: attribute.String("memolock.tag", tag)}
	l.tag = metric.WithAttributeSet(attribute.NewSet(l.tagAttr))
	l.tagRec = []metric.RecordOption{l.tag}
	for o := range outcomes {
		result := attribute.String("memolock.result", outcomeLabels[o])
		l.resultsRec[o] = []metric.RecordOption{metric.WithAttributeSet(attribute.NewSet(l.tagAttr, result))}
		for s := range servedKinds {
			l.answers[s][o] = metric.WithAttributeSet(attribute.NewSet(l.tagAttr, attribute.String("memolock.served", s.String()), result))
			l.answersRec[s][o] = []metric.RecordOption{l.answers[s][o]}
		}
	}
	return l
}

// observed is a counter or gauge read from the engine when the SDK collects.
type observed struct {
	name, unit, desc string
	gauge            bool
	reason           string // of a fetch failure, as an attribute
	read             func() int64
}

func (e *Engine) observables() []observed {
	s := &e.stats
	return []observed{
		{name: "memolock.fetches", unit: "{fetch}", desc: "Fetch (or start) functions run by this process.", read: s.fetches.Load},
		{name: "memolock.fetch.failures", unit: "{fetch}", desc: "Fetches that failed, by reason: error, panic or timeout.", reason: "error", read: s.fetchOther.Load},
		{name: "memolock.fetch.failures", reason: "panic", read: s.fetchPanics.Load},
		{name: "memolock.fetch.failures", reason: "timeout", read: s.fetchTimeouts.Load},
		{name: "memolock.takeovers", unit: "{lock}", desc: "Locks taken after the previous holder's lock expired.", read: s.takeovers.Load},
		{name: "memolock.holder.failures", unit: "{event}", desc: "Failures received from holders in other processes.", read: s.holderFails.Load},
		{name: "memolock.leases.lost", unit: "{lease}", desc: "Fetched values not stored because the lock was lost.", read: s.leaseLost.Load},
		{name: "memolock.store.errors", unit: "{store}", desc: "Fetched values not stored because Redis failed.", read: s.storeErrors.Load},
		{name: "memolock.refreshes", unit: "{refresh}", desc: "Values refreshed ahead of expiry (Options.RefreshAhead).", read: s.refreshes.Load},
		{name: "memolock.pubsub.reconnects", unit: "{connection}", desc: "Pub/sub connections replaced after an error.", read: s.pubsub.Reconnects.Load},
		{name: "memolock.outages", unit: "{outage}", desc: "Times Redis was found unreachable.", read: s.outages.Load},
		{name: "memolock.l1.refusals", unit: "{connection}", desc: "Connections on which Redis refused the L1's tracking: the L1 stays empty until one tracks.", read: s.pubsub.TrackingRefusals.Load},
		{name: "memolock.waiting", unit: "{flight}", gauge: true, desc: "Flights parked until a value comes from elsewhere: another holder, or an external producer.", read: s.waiting.Load},
		{name: "memolock.flights", unit: "{flight}", gauge: true, desc: "Flights in progress in this process.", read: func() int64 {
			_, running := e.flights.counts()
			return int64(running)
		}},
		{name: "memolock.pubsub.channels", unit: "{channel}", gauge: true, desc: "Channels subscribed on this client's pub/sub connections.", read: func() int64 { return int64(e.subs.Channels()) }},
	}
}

// newMeters makes the engine's instruments on mp.
func newMeters(mp metric.MeterProvider, e *Engine) (*meters, error) {
	m := mp.Meter(Scope, metric.WithInstrumentationVersion(Version))
	ms := &meters{labels: newLabels(e.cfg.Keys.Tag())}
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
	if err == nil {
		err = ms.register(m, e)
	}
	if err != nil {
		return &meters{labels: ms.labels, disabled: true}, err
	}
	return ms, nil
}

// register makes the observed instruments and the callback that reads them.
func (ms *meters) register(m metric.Meter, e *Engine) error {
	obs := e.observables()
	insts := make([]metric.Int64Observable, len(obs))
	attrs := make([]metric.ObserveOption, len(obs))
	var all []metric.Observable
	made := map[string]metric.Int64Observable{}
	for i, o := range obs {
		attrs[i] = ms.tag
		if o.reason != "" {
			attrs[i] = metric.WithAttributeSet(attribute.NewSet(ms.tagAttr, attribute.String("memolock.reason", o.reason)))
		}
		if insts[i] = made[o.name]; insts[i] != nil {
			continue
		}
		var err error
		if o.gauge {
			insts[i], err = m.Int64ObservableUpDownCounter(o.name, metric.WithUnit(o.unit), metric.WithDescription(o.desc))
		} else {
			insts[i], err = m.Int64ObservableCounter(o.name, metric.WithUnit(o.unit), metric.WithDescription(o.desc))
		}
		if err != nil {
			return err
		}
		made[o.name] = insts[i]
		all = append(all, insts[i])
	}
	gets, err := m.Int64ObservableCounter("memolock.gets", metric.WithUnit("{call}"),
		metric.WithDescription("Answers given to callers (Get and its variants, Lookup, each distinct GetMany id), by how they were served and what they were."))
	if err != nil {
		return err
	}
	answers := &e.stats.answers
	ms.reg, err = m.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		for i, ob := range obs {
			o.ObserveInt64(insts[i], ob.read(), attrs[i])
		}
		for sv := range servedKinds {
			for oc := range outcomes {
				if n := answers[sv][oc].Load(); n > 0 {
					o.ObserveInt64(gets, n, ms.answers[sv][oc])
				}
			}
		}
		return nil
	}, append(all, gets)...)
	return err
}

// recordFetch records how long a fetch ran.
func (m *meters) recordFetch(ctx context.Context, d time.Duration) {
	if !m.disabled {
		m.fetchDur.Record(ctx, d.Seconds(), m.tagRec...)
	}
}

// recordWait records how long a flight waited for another holder, and what it
// got: none when it took the lock over.
func (m *meters) recordWait(ctx context.Context, d time.Duration, o outcome) {
	if !m.disabled {
		m.waitDur.Record(ctx, d.Seconds(), m.resultsRec[o]...)
	}
}

// recordGet records how long a call took, by how it was served.
func (m *meters) recordGet(ctx context.Context, d time.Duration, served Served, err error) {
	if !m.disabled {
		served, o := outcomeOf(served, err)
		m.getDur.Record(ctx, d.Seconds(), m.answersRec[served][o]...)
	}
}

// timing reports whether Get durations are recorded: not without an SDK.
func (m *meters) timing(ctx context.Context) bool {
	return !m.disabled && m.getDur.Enabled(ctx)
}

// close stops the callback, so that a closed engine is no longer observed.
func (m *meters) close() {
	if m.reg != nil {
		_ = m.reg.Unregister()
	}
}
