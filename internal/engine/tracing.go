package engine

import (
	"context"
	"errors"
	"reflect"
	"strings"
	"time"

	"github.com/memolock/memolock/internal/wire"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// Tracing. Every call that misses the L1 gets a span, "memolock.Get", and
// the fetch it runs a child span, "memolock.fetch". A flight whose Get is
// traced (its span is sampled) appends its fetch span's W3C traceparent to
// its lock token, after a "/" (see claimSpan):
//
//	9f86d081884c7d659a2feaa0c55ad015@build-7:4121/00-<trace id>-<span id>-01
//
// so that a waiter in another process, which reads the token in its busy
// reply, links its own span to the holder's: one trace then shows who
// computed for whom. Peers compare tokens as opaque strings, so the
// original peers and the peers that do not trace never notice.

// A call is one caller's Get, as observed: when it reached Redis's side of
// the L1, and its span. The zero call was answered before that (an L1 hit
// or bad input) and is only counted.
type callSpan struct {
	begun bool
	ctx   context.Context
	t0    time.Time  // zero when nothing records Get durations
	span  trace.Span // nil when the call is not traced
}

// begin starts observing a call that missed the L1.
func (e *Engine) begin(cl *callSpan, ctx context.Context) {
	// Without an SDK (the global providers' default), a call records
	// nothing: a thousand callers woken at once must not each pay for
	// reading the clock and ending a span that nobody records.
	cl.begun, cl.ctx = true, ctx
	if e.meters.timing(ctx) {
		cl.t0 = time.Now()
	}
}

// trace starts cl's span, and keeps it if it records.
func (e *Engine) trace(cl *callSpan, id string) {
	probe := false
	if e.unsetQuiet() {
		// No SDK yet: the span most likely records nothing, and starting
		// it costs two allocations a flight (a mass miss starts
		// thousands). But the unset provider's spans may record all the
		// same (auto-instrumentation, or a provider set back to it), so
		// a Get now and then starts one to find out.
		if !e.probeDue() {
			return
		}
		probe = true
	}
	if ctx, span := e.tracer.Start(cl.ctx, "memolock.Get", e.spanOpts...); span.IsRecording() {
		if probe {
			e.unsetRecords.Store(true)
		}
		span.SetAttributes(attribute.String("memolock.id", id))
		cl.ctx, cl.span = ctx, span
	}
}

// joined marks a call that joined a flight another caller leads.
func (cl callSpan) joined(f *flight) {
	if cl.span != nil {
		cl.span.SetAttributes(attribute.Bool("memolock.coalesced", true))
		if f.span != nil {
			cl.span.AddLink(trace.Link{SpanContext: f.span.SpanContext(),
				Attributes: []attribute.KeyValue{attribute.String("memolock.link", "flight")}})
		}
	}
}

// observe records and ends what begin started.
func (e *Engine) observe(cl *callSpan, served Served, err error) {
	if cl.t0.IsZero() && cl.span == nil {
		return
	}
	e.record(cl, served, err)
}

// record is observe for a call that is timed or traced.
//
//go:noinline
func (e *Engine) record(cl *callSpan, served Served, err error) {
	if !cl.t0.IsZero() {
		e.meters.recordGet(cl.ctx, time.Since(cl.t0), served, err)
	}
	if cl.span == nil {
		return
	}
	s, o := outcomeOf(served, err)
	cl.span.SetAttributes(attribute.String("memolock.served", s.String()),
		attribute.String("memolock.result", outcomeLabels[o]))
	if o == gotError {
		cl.span.SetStatus(codes.Error, firstLine(err.Error()))
	}
	cl.span.End()
}

// claimSpan returns the token of flight f, led by a call whose span is
// f.span, and the span it names, if that call is traced (if not, no
// token: lookup makes one for the first script). The fetch span
// cannot be named in advance (the SDK picks span ids), and the token must
// be fixed before the first lookup, which may win the lock: so the span
// named is started now, as "memolock.fetch". If the flight computes, it
// is the fetch span; if not, it ends as "memolock.lookup", covering the
// flight's lookups and wait.
func (e *Engine) claimSpan(ctx context.Context, f *flight) (string, trace.Span) {
	if f.span == nil || !f.span.IsRecording() {
		return "", nil // made at the first script (see lookup): a hit read first needs none
	}
	_, span := e.fetchSpan(ctx, f)
	return flightToken(span), span
}

// endClaim ends f's claimed span if no fetch took it.
func (f *flight) endClaim() {
	if f.claim != nil {
		f.claim.SetName("memolock.lookup")
		f.claim.End()
		f.claim = nil
	}
}

// flightToken returns a new token naming span, when span is sampled and
// recording.
func flightToken(span trace.Span) string {
	t := wire.NewToken()
	if span == nil {
		return t
	}
	sc := span.SpanContext()
	if !span.IsRecording() || !sc.IsSampled() {
		// Not a span of memolock's provider: a no-op tracer hands back
		// its caller's span context, which is not ours to name.
		return t
	}
	carrier := propagation.MapCarrier{}
	propagation.TraceContext{}.Inject(trace.ContextWithSpanContext(context.Background(), sc), carrier)
	if tp := carrier["traceparent"]; tp != "" {
		t += "/" + tp
	}
	return t
}

// holderSpan returns the span that a holder's token names, if it names
// one.
func holderSpan(token string) (trace.SpanContext, bool) {
	_, tp, ok := strings.Cut(token, "/")
	if !ok {
		return trace.SpanContext{}, false
	}
	ctx := propagation.TraceContext{}.Extract(context.Background(), propagation.MapCarrier{"traceparent": tp})
	sc := trace.SpanContextFromContext(ctx)
	return sc, sc.IsValid()
}

// waitsOn notes on f's span the holder it waits for, and links to the
// holder's span if its token names one.
func (f *flight) waitsOn(holder string) {
	if f.span == nil || !f.span.IsRecording() {
		return
	}
	f.span.SetAttributes(attribute.Bool("memolock.waited", true), attribute.String("memolock.holder", holder))
	if sc, ok := holderSpan(holder); ok {
		f.span.AddLink(trace.Link{SpanContext: sc,
			Attributes: []attribute.KeyValue{attribute.String("memolock.link", "holder")}})
	}
}

// fetchSpan starts the span of f's fetch, under ctx, whose values (and
// span) are its leader's; or takes the span the flight's token names.
func (e *Engine) fetchSpan(ctx context.Context, f *flight) (context.Context, trace.Span) {
	if span := f.claim; span != nil {
		f.claim = nil
		return trace.ContextWithSpan(ctx, span), span
	}
	probe := false
	if e.unsetQuiet() && (f.span == nil || !f.span.IsRecording()) {
		// As for a Get (see trace): without an SDK, a fetch span is two
		// allocations that record nothing. A fetch probes too, now and
		// then, whether the unset provider records after all: a GetMany
		// batch's flights have no Get to probe for them. A flight whose
		// Get span records has seen the provider record.
		if !e.probeDue() {
			return ctx, noSpan
		}
		probe = true
	}
	ctx, span := e.tracer.Start(ctx, "memolock.fetch", e.fetchSpanOpts...)
	if span.IsRecording() {
		if probe {
			e.unsetRecords.Store(true)
		}
		span.SetAttributes(attribute.String("memolock.id", f.id))
	}
	return ctx, span
}

// fetchDone ends a fetch span, and records the fetch's duration.
func (e *Engine) fetchDone(ctx context.Context, span trace.Span, t0 time.Time, err error) {
	e.meters.recordFetch(ctx, time.Since(t0))
	if err != nil && span.IsRecording() {
		if errors.Is(err, ErrNotFound) {
			span.SetAttributes(attribute.String("memolock.result", "not_found"))
		} else {
			span.SetStatus(codes.Error, firstLine(err.Error()))
		}
	}
	span.End()
}

// firstLine is s up to its first newline: a span's status, without the
// stack trace of a panic.
func firstLine(s string) string {
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i]
	}
	return s
}

// unsetQuiet reports whether the tracer is the unset global provider's, not
// yet seen to record.
func (e *Engine) unsetQuiet() bool {
	return e.unset != nil && !e.unsetRecords.Load() && otel.GetTracerProvider() == e.unset
}

// probeDue reports whether a span of the unset provider is due to be
// started to see whether it records: once every unsetProbeEvery, for the
// one caller that claims the turn.
func (e *Engine) probeDue() bool {
	now, next := time.Now().UnixNano(), e.unsetProbe.Load()
	return now >= next && e.unsetProbe.CompareAndSwap(next, now+int64(unsetProbeEvery))
}

// noSpan is the span of a fetch that nothing traces: it does nothing.
var noSpan = trace.SpanFromContext(context.Background())

// unsetProbeEvery is how often a Get or a fetch starts a span of the
// unset global provider to see whether it records (see trace).
const unsetProbeEvery = 100 * time.Millisecond

// isUnsetGlobal reports whether tp is the global tracer provider while no
// SDK has been set: otel's own delegating provider, which
// otel.GetTracerProvider returns until otel.SetTracerProvider replaces it
// (the two stop being equal then, and it delegates to the SDK).
func isUnsetGlobal(tp trace.TracerProvider) bool {
	if tp != otel.GetTracerProvider() {
		return false
	}
	t := reflect.TypeOf(tp)
	return t.Kind() == reflect.Pointer && t.Elem().PkgPath() == "go.opentelemetry.io/otel/internal/global" && t.Elem().Name() == "tracerProvider"
}
