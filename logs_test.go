package memolock

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/memolock/memolock/internal/redistest"
	"github.com/memolock/memolock/internal/wire"
)

// logLine is one record a client logged.
type logLine struct {
	level slog.Level
	msg   string
	attrs map[string]string // groups flattened as "group.key"
	text  string            // level, message and every attribute
}

// logCapture is a slog.Handler that keeps every record, at every level.
type logCapture struct {
	mu     *sync.Mutex
	kept   *[]logLine
	attrs  []slog.Attr // from WithAttrs, keys already prefixed
	prefix string      // from WithGroup
}

func newLogCapture() *logCapture {
	return &logCapture{mu: new(sync.Mutex), kept: new([]logLine)}
}

// logger returns a Logger writing to h.
func (h *logCapture) logger() *slog.Logger { return slog.New(h) }

func (h *logCapture) Enabled(context.Context, slog.Level) bool { return true }

func (h *logCapture) Handle(_ context.Context, r slog.Record) error {
	l := logLine{level: r.Level, msg: r.Message, attrs: map[string]string{}}
	var text strings.Builder
	text.WriteString(r.Level.String() + " " + r.Message)
	var add func(prefix string, a slog.Attr)
	add = func(prefix string, a slog.Attr) {
		v := a.Value.Resolve()
		if v.Kind() == slog.KindGroup {
			p := prefix
			if a.Key != "" {
				p += a.Key + "."
			}
			for _, g := range v.Group() {
				add(p, g)
			}
			return
		}
		l.attrs[prefix+a.Key] = v.String()
		text.WriteString(" " + prefix + a.Key + "=" + v.String())
	}
	for _, a := range h.attrs {
		add("", a)
	}
	r.Attrs(func(a slog.Attr) bool {
		add(h.prefix, a)
		return true
	})
	l.text = text.String()
	h.mu.Lock()
	defer h.mu.Unlock()
	*h.kept = append(*h.kept, l)
	return nil
}

func (h *logCapture) WithAttrs(attrs []slog.Attr) slog.Handler {
	c := *h
	c.attrs = append([]slog.Attr(nil), h.attrs...)
	for _, a := range attrs {
		a.Key = h.prefix + a.Key
		c.attrs = append(c.attrs, a)
	}
	return &c
}

func (h *logCapture) WithGroup(name string) slog.Handler {
	c := *h
	c.prefix += name + "."
	return &c
}

// lines returns what was logged so far.
func (h *logCapture) lines() []logLine {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]logLine(nil), *h.kept...)
}

// matching returns the lines at level whose message contains text.
func (h *logCapture) matching(level slog.Level, text string) []logLine {
	var out []logLine
	for _, l := range h.lines() {
		if l.level == level && strings.Contains(l.msg, text) {
			out = append(out, l)
		}
	}
	return out
}

// logged waits until exactly one line at level has a message containing
// text, and returns it.
func logged(t *testing.T, h *logCapture, level slog.Level, text string) logLine {
	t.Helper()
	eventually(t, 5*time.Second, level.String()+" line "+wire.Quote(text), func() bool { return len(h.matching(level, text)) > 0 })
	got := h.matching(level, text)
	if len(got) != 1 {
		t.Errorf("%d %s lines %q; want 1: %v", len(got), level, text, got)
	}
	return got[0]
}

// wantAttrs checks that l carries the attributes want.
func wantAttrs(t *testing.T, l logLine, want map[string]string) {
	t.Helper()
	for k, v := range want {
		if got, ok := l.attrs[k]; !ok || !strings.Contains(got, v) {
			t.Errorf("line %q: %s=%q, want %q", l.msg, k, got, v)
		}
	}
}

// Redis becoming unreachable is one warning, however many calls find it
// so, and its coming back another.
func TestLogs_OutageWarnsWhenEnteredAndWhenLeft(t *testing.T) {
	srv := redistest.Start(t)
	h := newLogCapture()
	c := newTestClient(t, srv.Addr, "lo", &Options{Logger: h.logger()})
	var calls atomic.Int64
	if _, err := c.Get(bg(), "warm", constFetch(&calls, "w", 0)); err != nil {
		t.Fatal(err)
	}
	srv.Kill()
	for range 5 {
		if _, err := c.Get(bg(), "k", constFetch(&calls, "v", 0)); !errors.Is(err, ErrRedis) {
			t.Fatalf("Get with Redis down = %v, want ErrRedis", err)
		}
	}
	entered := logged(t, h, slog.LevelWarn, "unreachable")
	wantAttrs(t, entered, map[string]string{"error": "connection refused"})
	if n := len(h.matching(slog.LevelWarn, "answers again")); n != 0 {
		t.Fatalf("%d lines say Redis is back while it is down", n)
	}
	srv.Restart(t)
	eventually(t, 5*time.Second, "Get to work again", func() bool {
		_, err := c.Get(bg(), "back", constFetch(&calls, "v", 0))
		return err == nil
	})
	logged(t, h, slog.LevelWarn, "answers again")
	if n := len(h.matching(slog.LevelWarn, "unreachable")); n != 1 {
		t.Errorf("%d outage-entered lines for one outage", n)
	}
}

// A fetch whose lock is deleted under it logs a warning naming the id.
func TestLogs_LeaseLostWarns(t *testing.T) {
	b := miniBackend(t)
	h := newLogCapture()
	c := newTestClient(t, b.addr, "ll", &Options{Logger: h.logger()})
	raw := rawClient(t, b.addr)
	if _, err := c.Get(bg(), "k", func(ctx context.Context, _ *Lease) ([]byte, time.Duration, error) {
		raw.Del(ctx, "ll/lock:k")
		return []byte("v"), time.Minute, nil
	}); err != nil {
		t.Fatal(err)
	}
	l := logged(t, h, slog.LevelWarn, "lease was lost")
	wantAttrs(t, l, map[string]string{"tag": "ll", "id": "k"})
}

// A store that Redis refuses logs a warning with Redis's error.
func TestLogs_StoreFailureWarns(t *testing.T) {
	srv := redistest.Start(t)
	h := newLogCapture()
	c := newTestClient(t, srv.Addr, "lsf", &Options{Logger: h.logger()})
	raw := rawClient(t, srv.Addr)
	var restore func()
	if _, err := c.Get(bg(), "k", func(context.Context, *Lease) ([]byte, time.Duration, error) {
		restore = outOfMemory(t, srv, raw)
		return []byte("v"), time.Minute, nil
	}); err != nil {
		t.Fatal(err)
	}
	restore()
	l := logged(t, h, slog.LevelWarn, "storing a fetched value failed")
	wantAttrs(t, l, map[string]string{"tag": "lsf", "id": "k", "error": "OOM"})
}

// A stale value served because fetch failed logs a warning with the
// fetch's error, which the caller never sees.
func TestLogs_StaleServedWarns(t *testing.T) {
	b := realBackend(t)
	h := newLogCapture()
	c := newTestClient(t, b.addr, "lst", &Options{StaleTTL: time.Minute, Logger: h.logger()})
	raw := rawClient(t, b.addr)
	if err := c.Set(bg(), "k", []byte("old"), time.Millisecond); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "the value to expire", func() bool { return raw.Exists(bg(), "lst:k").Val() == 0 })
	var calls atomic.Int64
	if r, err := c.GetResult(bg(), "k", failingFetch(&calls, "db down")); err != nil || r.Served != ServedStale {
		t.Fatalf("Get = %+v, %v; want stale", r, err)
	}
	l := logged(t, h, slog.LevelWarn, "stale value")
	wantAttrs(t, l, map[string]string{"tag": "lst", "id": "k", "error": "db down"})
}

// A dependency that fails takes every id with it: serving 50 ids stale
// logs one line per tag, not one per id.
func TestLogs_StaleServedIsOneLinePerTagNotPerID(t *testing.T) {
	b := realBackend(t)
	h := newLogCapture()
	c := newTestClient(t, b.addr, "lsq", &Options{StaleTTL: time.Minute, Logger: h.logger()})
	raw := rawClient(t, b.addr)
	for i := range 50 {
		if err := c.Set(bg(), fmt.Sprint(i), []byte("old"), time.Millisecond); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, 5*time.Second, "the values to expire", func() bool { return raw.Exists(bg(), "lsq:49").Val() == 0 })
	var calls atomic.Int64
	for i := range 50 {
		if r, err := c.GetResult(bg(), fmt.Sprint(i), failingFetch(&calls, "db down")); err != nil || r.Served != ServedStale {
			t.Fatalf("Get = %+v, %v; want stale", r, err)
		}
	}
	if n := len(h.matching(slog.LevelWarn, "stale value")); n != 1 {
		t.Errorf("%d lines for 50 ids served stale within seconds; want 1", n)
	}
}

// Taking over the lock of a holder that went silent is information.
func TestLogs_TakeoverInfo(t *testing.T) {
	b := realBackend(t)
	h := newLogCapture()
	c := newTestClient(t, b.addr, "lto", &Options{LockTTL: 300 * time.Millisecond, Logger: h.logger()})
	var calls atomic.Int64
	if r, err := takeOverVanished(t, c, rawClient(t, b.addr), "lto/lock:k", "k", constFetch(&calls, "v", 0)); err != nil || r.Served != ServedComputed {
		t.Fatalf("Get = %+v, %v; want computed after a takeover", r, err)
	}
	l := logged(t, h, slog.LevelInfo, "took over")
	wantAttrs(t, l, map[string]string{"tag": "lto", "id": "k", "previous_holder": "vanished-holder"})
}

// A pub/sub connection replaced after an error is a debug line.
func TestLogs_PubSubReconnectDebug(t *testing.T) {
	b := realBackend(t)
	h := newLogCapture()
	c := newTestClient(t, b.addr, "lps", &Options{LockTTL: 30 * time.Second, Logger: h.logger()})
	raw := rawClient(t, b.addr)
	cancel := parkOnForeignLock(t, c, raw, "k")
	defer cancel()
	if n := raw.ClientKillByFilter(bg(), "TYPE", "pubsub").Val(); n != 1 {
		t.Fatalf("CLIENT KILL TYPE pubsub killed %d connections, want 1", n)
	}
	eventually(t, 5*time.Second, "a debug line on the reconnect", func() bool {
		return len(h.matching(slog.LevelDebug, "pub/sub connection")) > 0
	})
	for _, l := range h.lines() {
		if l.level > slog.LevelDebug {
			t.Errorf("a killed pub/sub connection logged %s: %s", l.level, l.text)
		}
	}
}

// Calls that go well log nothing: not one line per call.
func TestLogs_NoLinePerCall(t *testing.T) {
	b := realBackend(t)
	redisLog, l1Log := newLogCapture(), newLogCapture()
	plain := newTestClient(t, b.addr, "lnl", &Options{Logger: redisLog.logger()})
	cached := newTestClient(t, b.addr, "lnl", &Options{L1Size: 100, Logger: l1Log.logger()})
	eventually(t, 5*time.Second, "tracking to be live", func() bool { return cached.e.L1Live() })
	if err := plain.Set(bg(), "k", []byte("v"), time.Minute); err != nil {
		t.Fatal(err)
	}
	for i := range 100 {
		if r, err := plain.GetResult(bg(), "k", noFetch); err != nil || r.Served != ServedRedis {
			t.Fatalf("Redis hit %d: %+v, %v", i, r, err)
		}
	}
	eventually(t, 5*time.Second, "the value to reach the L1", func() bool {
		r, err := cached.GetResult(bg(), "k", noFetch)
		if err != nil {
			t.Fatal(err)
		}
		return r.Served == ServedL1
	})
	for i := range 100 {
		if r, err := cached.GetResult(bg(), "k", noFetch); err != nil || r.Served != ServedL1 {
			t.Fatalf("L1 hit %d: %+v, %v", i, r, err)
		}
	}
	for _, h := range []*logCapture{redisLog, l1Log} {
		for _, l := range h.lines() {
			t.Errorf("a call that went well logged: %s", l.text)
		}
	}
}

// No line ever holds a value or the Redis password, whatever goes wrong.
func TestLogs_NeverTheValueOrThePassword(t *testing.T) {
	const (
		password = "pw-Zx81-never-logged"
		value    = "value-Qm47-never-logged"
	)
	srv := redistest.Start(t)
	if err := rawClient(t, srv.Addr).ConfigSet(bg(), "requirepass", password).Err(); err != nil {
		t.Fatal(err)
	}
	authed := &redis.Options{Addr: srv.Addr, Password: password}
	admin := redis.NewClient(authed)
	t.Cleanup(func() { _ = admin.Close() })
	h := newLogCapture()
	c := newTestClientOn(t, authed, "lpw", &Options{LockTTL: 300 * time.Millisecond, StaleTTL: time.Minute, Logger: h.logger()})
	valueFetch := func(context.Context, *Lease) ([]byte, time.Duration, error) {
		return []byte(value), time.Minute, nil
	}

	// A stale value served.
	if err := c.Set(bg(), "stale", []byte(value), time.Millisecond); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "the value to expire", func() bool { return admin.Exists(bg(), "lpw:stale").Val() == 0 })
	var calls atomic.Int64
	if r, err := c.GetResult(bg(), "stale", failingFetch(&calls, "db down")); err != nil || string(r.Value) != value {
		t.Fatalf("stale: %+v, %v", r, err)
	}
	// A lease lost.
	if _, err := c.Get(bg(), "lost", func(ctx context.Context, l *Lease) ([]byte, time.Duration, error) {
		admin.Del(ctx, "lpw/lock:lost")
		return valueFetch(ctx, l)
	}); err != nil {
		t.Fatal(err)
	}
	// A store refused.
	var restore func()
	if _, err := c.Get(bg(), "oom", func(ctx context.Context, l *Lease) ([]byte, time.Duration, error) {
		restore = outOfMemory(t, srv, admin)
		return valueFetch(ctx, l)
	}); err != nil {
		t.Fatal(err)
	}
	restore()
	// A takeover.
	if _, err := takeOverVanished(t, c, admin, "lpw/lock:taken", "taken", valueFetch); err != nil {
		t.Fatal(err)
	}
	// A pub/sub reconnect.
	cancel := parkOnForeignLock(t, c, admin, "parked")
	if n := admin.ClientKillByFilter(bg(), "TYPE", "pubsub").Val(); n != 1 {
		t.Fatalf("CLIENT KILL TYPE pubsub killed %d connections, want 1", n)
	}
	eventually(t, 5*time.Second, "a reconnect", func() bool { return c.Stats().Reconnects > 0 })
	cancel()
	// An outage.
	srv.Kill()
	if _, err := c.Get(bg(), "down", valueFetch); !errors.Is(err, ErrRedis) {
		t.Fatalf("Get with Redis down = %v, want ErrRedis", err)
	}

	for _, want := range []struct {
		level slog.Level
		text  string
	}{
		{slog.LevelWarn, "stale value"}, {slog.LevelWarn, "lease was lost"}, {slog.LevelWarn, "storing a fetched value failed"},
		{slog.LevelInfo, "took over"}, {slog.LevelDebug, "pub/sub connection"}, {slog.LevelWarn, "unreachable"},
	} {
		if len(h.matching(want.level, want.text)) == 0 {
			t.Errorf("no %s line %q: the test did not exercise it", want.level, want.text)
		}
	}
	for _, l := range h.lines() {
		if strings.Contains(l.text, value) || strings.Contains(l.text, password) {
			t.Errorf("a line gives the value or the password away: %s", l.text)
		}
	}
}

// Every line names the tag of the client that logged it, as
// Options.Logger promises: an application with several clients must tell
// which one lost Redis, or its pub/sub connection.
func TestLogs_EveryLineCarriesTheTag(t *testing.T) {
	srv := redistest.Start(t)
	h := newLogCapture()
	c := newTestClient(t, srv.Addr, "ltag", &Options{LockTTL: 30 * time.Second, Logger: h.logger()})
	raw := rawClient(t, srv.Addr)
	cancel := parkOnForeignLock(t, c, raw, "k")
	if n := raw.ClientKillByFilter(bg(), "TYPE", "pubsub").Val(); n != 1 {
		t.Fatalf("CLIENT KILL TYPE pubsub killed %d connections, want 1", n)
	}
	eventually(t, 5*time.Second, "a reconnect", func() bool { return c.Stats().Reconnects > 0 })
	cancel()
	srv.Kill()
	if _, err := c.Get(bg(), "down", noFetch); !errors.Is(err, ErrRedis) {
		t.Fatalf("Get with Redis down = %v, want ErrRedis", err)
	}
	srv.Restart(t)
	eventually(t, 5*time.Second, "the outage to end", func() bool { return len(h.matching(slog.LevelWarn, "answers again")) > 0 })
	lines := h.lines()
	if len(lines) < 3 {
		t.Fatalf("%d lines; want a reconnect, an outage and its end", len(lines))
	}
	for _, l := range lines {
		if l.attrs["tag"] != "ltag" {
			t.Errorf("no tag=ltag on: %s", l.text)
		}
	}
}
