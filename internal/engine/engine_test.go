package engine

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"reflect"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	goidpkg "github.com/petermattis/goid"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/memolock/memolock/internal/redistest"
	"github.com/memolock/memolock/internal/wire"
	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// A new or flushed server has no scripts: a batch of EVALSHA meets
// NOSCRIPT and must fall back to EVAL.
func TestBatch_LoadsScriptsAfterScriptFlush(t *testing.T) {
	srv := redistest.Start(t)
	raw := redis.NewClient(&redis.Options{Addr: srv.Addr})
	defer raw.Close()
	raw.Set(context.Background(), "flush:hit", "stored", time.Minute)
	raw.ScriptFlush(context.Background())
	bt := newBatcher(raw, raw, &counters{}, &work{})
	calls := []*lookupCall{
		{keys: []string{"flush:hit", "flush/lock:hit", "flush/lock-notfound:hit", "flush/lock-stale:hit"}, args: []any{"t1", 1000}, done: make(chan struct{})},
		{keys: []string{"flush:miss", "flush/lock:miss", "flush/lock-notfound:miss", "flush/lock-stale:miss"}, args: []any{"t2", 1000}, done: make(chan struct{})},
	}
	bt.send(calls)
	if calls[0].err != nil || calls[0].res != "stored" {
		t.Errorf("hit after SCRIPT FLUSH: %v, %v", calls[0].res, calls[0].err)
	}
	if calls[1].err != nil || calls[1].res != int64(1) {
		t.Errorf("miss after SCRIPT FLUSH: %v, %v", calls[1].res, calls[1].err)
	}
	if v := raw.Get(context.Background(), "flush/lock:miss").Val(); v != "t2" {
		t.Errorf("lock = %q", v)
	}
}

// A member that must run again alone (here NOSCRIPT after a SCRIPT FLUSH;
// in a cluster fault test, a redirection to a node that refused
// connections, 1.3s of dial retries) holds up none of the members behind
// it: their replies are read already, and given out late they are stale.
// The second run is held until the test lets it go; the GET behind it must
// have its answer meanwhile.
func TestBatch_RunAgainHoldsUpNoOtherMember(t *testing.T) {
	srv := redistest.Start(t)
	raw := srv.Client(t)
	raw.Set(context.Background(), "rerun:hit", "stored", time.Minute)
	raw.ScriptFlush(context.Background())
	hold := &holdScripts{held: make(chan struct{}), release: make(chan struct{})}
	node := srv.Client(t)
	node.AddHook(hold)
	bt := newBatcher(node, node, &counters{}, &work{})
	calls := []*lookupCall{
		{keys: []string{"rerun:miss", "rerun/lock:miss", "rerun/lock-notfound:miss", "rerun/lock-stale:miss"}, args: []any{"t1", 1000}, done: make(chan struct{})},
		{keys: []string{"rerun:hit"}, done: make(chan struct{})}, // a GET: no NOSCRIPT
	}
	sent := make(chan struct{})
	go func() {
		defer close(sent)
		bt.send(calls)
	}()
	released := false
	let := func() {
		if !released {
			released = true
			close(hold.release)
		}
	}
	defer func() { let(); <-sent }()

	select {
	case <-hold.held:
	case <-time.After(10 * time.Second):
		t.Fatal("the lookup that met NOSCRIPT never ran again")
	}
	select {
	case <-calls[1].done:
	case <-time.After(5 * time.Second):
		t.Fatal("the GET behind a second run still has no answer while that run is held")
	}
	if calls[1].err != nil || calls[1].res != "stored" {
		t.Errorf("GET: %v, %v", calls[1].res, calls[1].err)
	}
	select {
	case <-calls[0].done:
		t.Fatal("the held lookup was answered before it ran again")
	default:
	}
	let()
	<-sent
	if calls[0].err != nil || calls[0].res != int64(1) {
		t.Errorf("lookup run again: %v, %v", calls[0].res, calls[0].err)
	}
}

// holdScripts holds the first script a client runs alone (not in a
// pipeline) until release is closed, and closes held when it does.
type holdScripts struct {
	once          sync.Once
	held, release chan struct{}
}

func (h *holdScripts) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *holdScripts) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if cmd.Name() == "evalsha" || cmd.Name() == "eval" {
			h.once.Do(func() {
				close(h.held)
				<-h.release
			})
		}
		return next(ctx, cmd)
	}
}
func (h *holdScripts) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

func TestTracing_TokenCarriesTraceparentOnlyWhenSampled(t *testing.T) {
	tp := sdktrace.NewTracerProvider()
	defer func() { _ = tp.Shutdown(context.Background()) }()
	_, span := tp.Tracer("t").Start(context.Background(), "s")
	defer span.End()
	tok := flightToken(span)
	sc, ok := holderSpan(tok)
	if !ok || sc.TraceID() != span.SpanContext().TraceID() || sc.SpanID() != span.SpanContext().SpanID() {
		t.Fatalf("token %q does not name its span", tok)
	}
	host, _ := os.Hostname()
	if !strings.HasPrefix(tok, tok[:32]+wire.HostSuffix(host)+strconv.Itoa(os.Getpid())+"/00-") {
		t.Errorf("token %q: want <hex>@host:pid/<traceparent>", tok)
	}
	never := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.NeverSample()))
	_, unsampled := never.Tracer("t").Start(context.Background(), "s")
	for _, tok := range []string{flightToken(unsampled), flightToken(nil), flightToken(trace.SpanFromContext(context.Background()))} {
		if strings.Contains(tok, "/") {
			t.Errorf("an unsampled span put a traceparent in token %q", tok)
		}
	}
	for _, tok := range []string{"", "x", "uuid-1234", "a@b:1/garbage", "a@b:1/00-00000000000000000000000000000000-0000000000000000-01"} {
		if _, ok := holderSpan(tok); ok {
			t.Errorf("holderSpan(%q) found a span", tok)
		}
	}
}

// The waiter's timer keeps the bounds that interop/vectors.json gives every
// peer ([W7]-[W9] of PROTOCOL.md), and draws inside them.
func TestWaitBoundsMatchTheVectors(t *testing.T) {
	raw, err := os.ReadFile("../../interop/vectors.json")
	if err != nil {
		t.Fatal(err)
	}
	var v struct {
		Timers []struct {
			PTTL     int64 `json:"pttl_ms"`
			LockTTL  int64 `json:"lock_ttl_ms"`
			Earliest int64 `json:"earliest_us"`
			Latest   int64 `json:"latest_us"`
		} `json:"timers"`
	}
	if err := json.Unmarshal(raw, &v); err != nil {
		t.Fatal(err)
	}
	if len(v.Timers) == 0 {
		t.Fatal("no timer vectors")
	}
	for _, tv := range v.Timers {
		pttl, lockTTL := time.Duration(tv.PTTL)*time.Millisecond, time.Duration(tv.LockTTL)*time.Millisecond
		if tv.PTTL > int64(wire.MaxPTTL/time.Millisecond) {
			pttl = wire.MsDuration(tv.PTTL)
		}
		earliest, latest := waitBounds(pttl, lockTTL)
		if earliest.Microseconds() != tv.Earliest || latest.Microseconds() != tv.Latest {
			t.Errorf("pttl %dms, lock TTL %dms: bounds %v..%v, want %dus..%dus", tv.PTTL, tv.LockTTL, earliest, latest, tv.Earliest, tv.Latest)
		}
		for range 100 {
			if d := waitFor(pttl, lockTTL); d < earliest || d > latest {
				t.Fatalf("pttl %dms: drew %v outside %v..%v", tv.PTTL, d, earliest, latest)
			}
		}
	}
}

// A write waits out a slot migration's replies and a failover's
// CLUSTERDOWN (a store refused with it failed a holder in CI); a lookup
// waits out the migration's only, and errors that are not Redis's replies
// are neither.
func TestPassingRepliesOfASlotChangingHands(t *testing.T) {
	cases := []struct {
		err             error
		moving, passing bool
	}{
		{redisReply("TRYAGAIN Multiple keys request during rehashing of slot"), true, true},
		{redisReply("MOVED 3999 127.0.0.1:6381"), true, true},
		{redisReply("ASK 3999 127.0.0.1:6381"), true, true},
		{redisReply("CLUSTERDOWN Hash slot not served"), false, true},
		{redisReply("ERR unknown command"), false, false},
		{errors.New("CLUSTERDOWN but not a reply"), false, false},
	}
	for _, c := range cases {
		if got := slotMoving(c.err); got != c.moving {
			t.Errorf("slotMoving(%v) = %v, want %v", c.err, got, c.moving)
		}
		if got := passing(c.err); got != c.passing {
			t.Errorf("passing(%v) = %v, want %v", c.err, got, c.passing)
		}
	}
}

// redisReply is an error reply as go-redis returns one.
type redisReply string

func (r redisReply) Error() string { return string(r) }
func (redisReply) RedisError()     {}

// goid names the calling goroutine as runtime.Stack does, on every
// goroutine, whichever way pickGoid chose to read it.
func TestGoidIsTheStacksGoroutineID(t *testing.T) {
	ids := make(chan [2]int64, 8)
	var wg sync.WaitGroup
	for range cap(ids) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ids <- [2]int64{goid(), stackGoid()}
		}()
	}
	wg.Wait()
	close(ids)
	seen := map[int64]bool{}
	for p := range ids {
		if p[0] != p[1] || p[0] <= 0 {
			t.Errorf("goid() = %d, runtime.Stack says %d", p[0], p[1])
		}
		if seen[p[0]] {
			t.Errorf("goroutine id %d seen twice", p[0])
		}
		seen[p[0]] = true
	}
	// On the platforms petermattis/goid reads natively, the fast read must
	// be the one in use: the parse queues every caller on the runtime's
	// print lock (see goid). A Go release it does not know yet fails here.
	if runtime.Compiler == "gc" && (runtime.GOARCH == "amd64" || runtime.GOARCH == "arm64") &&
		reflect.ValueOf(goid).Pointer() != reflect.ValueOf(goidpkg.Get).Pointer() {
		t.Errorf("goid reads runtime.Stack on %s/%s, %s: petermattis/goid disagreed with it at start-up", runtime.GOOS, runtime.GOARCH, runtime.Version())
	}
}

// A hot key makes a flight for about every 15 callers across processes
// (BenchmarkHotKeyProcesses), and a hit read first touches none of what the
// lookups keep (lookupState): the flight itself must fit a 256-byte
// allocation, not the 384 it took when that state lived in it.
func TestFlight_FitsA256ByteAllocation(t *testing.T) {
	if size := reflect.TypeOf(flight{}).Size(); size > 256 {
		t.Errorf("a flight takes %d bytes; want at most 256 (move what only some flights need behind a pointer, as lookupState)", size)
	}
}
