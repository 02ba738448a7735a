package memolock

import (
	"context"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/memolock/memolock/internal/engine"
	"github.com/memolock/memolock/internal/redistest"
	"github.com/memolock/memolock/internal/wire"
)

func TestMain(m *testing.M) {
	if os.Getenv(helperEnv) != "" {
		runHelperHolder()
		return
	}
	if spec := os.Getenv(wakeChildEnv); spec != "" {
		runWakeChild(spec)
		return
	}
	if spec := os.Getenv(clusterChildEnv); spec != "" {
		runClusterChild(spec)
		return
	}
	if addr := os.Getenv(frozenReaderEnv); addr != "" {
		runFrozenReader(addr)
		return
	}
	if spec := os.Getenv(faultChildEnv); spec != "" {
		runFaultChild(spec)
		return
	}
	if addr := os.Getenv(traceChildEnv); addr != "" {
		runTraceChild(addr)
		return
	}
	if addr := os.Getenv(globalTraceChildEnv); addr != "" {
		runGlobalTraceChild(addr)
		return
	}
	if addr := os.Getenv(restoredTraceChildEnv); addr != "" {
		runRestoredTraceChild(addr)
		return
	}
	if addr := os.Getenv(restoredBatchTraceChildEnv); addr != "" {
		runRestoredBatchTraceChild(addr)
		return
	}
	// go-redis logs every failed dial; the outage tests make many on purpose.
	redis.SetLogger(quietLogger{})
	goleak.VerifyTestMain(m)
}

// backend is a Redis server a test runs against.
type backend struct {
	name string
	addr string
	mini *miniredis.Miniredis // set for miniredis
	real *redistest.Server    // set for redis-server
}

// backends returns an embedded miniredis and a private redis-server.
func backends(t testing.TB) []backend {
	return []backend{miniBackend(t), realBackend(t)}
}

func miniBackend(t testing.TB) backend {
	m := miniredis.NewMiniRedis()
	if err := m.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Close)
	return backend{name: "miniredis", addr: m.Addr(), mini: m}
}

func realBackend(t testing.TB) backend {
	s := redistest.Start(t)
	return backend{name: "redis-server", addr: s.Addr, real: s}
}

// commandCounter counts the commands a go-redis client sends.
type commandCounter struct{ n atomic.Int64 }

func (h *commandCounter) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *commandCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.n.Add(1)
		return next(ctx, cmd)
	}
}
func (h *commandCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.n.Add(int64(len(cmds)))
		return next(ctx, cmds)
	}
}

// hookEach is a go-redis hook that calls its function with every command
// before it is sent, those of pipelines included.
type hookEach func(redis.Cmder)

func (h hookEach) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h hookEach) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h(cmd)
		return next(ctx, cmd)
	}
}
func (h hookEach) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, cmd := range cmds {
			h(cmd)
		}
		return next(ctx, cmds)
	}
}

// testClient is a memolock Client with its own go-redis client, as a
// separate process would have.
type testClient struct {
	*Client
	rdb      *redis.Client
	commands *commandCounter
}

func newTestClient(t testing.TB, addr, tag string, opts *Options, tweaks ...func(*engine.Config)) *testClient {
	t.Helper()
	return newTestClientOn(t, &redis.Options{Addr: addr}, tag, opts, tweaks...)
}

// pubsubHealth shortens the silence after which a pub/sub connection is
// probed.
func pubsubHealth(d time.Duration) func(*engine.Config) {
	return func(cfg *engine.Config) { cfg.PubSubHealth = d }
}

// newTestClientOn is newTestClient with the go-redis options given.
func newTestClientOn(t testing.TB, o *redis.Options, tag string, opts *Options, tweaks ...func(*engine.Config)) *testClient {
	t.Helper()
	rdb := redis.NewClient(o)
	cc := &commandCounter{}
	rdb.AddHook(cc)
	c, err := newClient(rdb, tag, opts, func(cfg *engine.Config) {
		for _, tw := range tweaks {
			tw(cfg)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = c.Close()
		_ = rdb.Close()
	})
	return &testClient{Client: c, rdb: rdb, commands: cc}
}

func rawClient(t testing.TB, addr string) *redis.Client {
	t.Helper()
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	t.Cleanup(func() { _ = rdb.Close() })
	return rdb
}

// eventually fails the test unless cond holds within d.
func eventually(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// constFetch returns a fetch that counts its calls and returns val.
func constFetch(calls *atomic.Int64, val string, delay time.Duration) FetchFunc {
	return func(ctx context.Context, _ *Lease) ([]byte, time.Duration, error) {
		calls.Add(1)
		select {
		case <-time.After(delay):
		case <-ctx.Done():
			return nil, 0, ctx.Err()
		}
		return []byte(val), time.Minute, nil
	}
}

// blockingFetch returns a fetch that signals started and returns val once
// release is closed.
func blockingFetch(started chan<- struct{}, release <-chan struct{}, val string) FetchFunc {
	return func(ctx context.Context, _ *Lease) ([]byte, time.Duration, error) {
		select {
		case started <- struct{}{}:
		default:
		}
		select {
		case <-release:
			return []byte(val), time.Minute, nil
		case <-ctx.Done():
			return nil, 0, ctx.Err()
		}
	}
}

func bg() context.Context { return context.Background() }

// stampede has callers goroutines Get id from c at once. Its fetch returns
// only once all of them have joined the flight, so every one is part of the
// stampede however slowly goroutines start. It returns how often fetch ran.
func stampede(tb testing.TB, c *testClient, id string, callers int) int64 {
	start := c.Stats().Coalesced
	var calls atomic.Int64
	fetch := func(context.Context, *Lease) ([]byte, time.Duration, error) {
		calls.Add(1)
		for c.Stats().Coalesced-start < int64(callers-1) {
			time.Sleep(100 * time.Microsecond)
		}
		return []byte("v"), time.Minute, nil
	}
	var wg sync.WaitGroup
	for range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if v, err := c.Get(bg(), id, fetch); err != nil || string(v) != "v" {
				tb.Errorf("Get = %q, %v", v, err)
			}
		}()
	}
	wg.Wait()
	return calls.Load()
}

type quietLogger struct{}

func (quietLogger) Printf(context.Context, string, ...any) {}

// takeOverVanished has c Get id, whose lock (key) a holder elsewhere
// holds and then abandons without a word, and returns what Get returned:
// a takeover, whatever the machine's load. The lock has no TTL (the
// waiter looks again after its own lock TTL) and goes only once the
// waiter waits: a lock set with a short TTL could expire before the
// first lookup, which would then simply compute.
func takeOverVanished(t *testing.T, c *testClient, raw *redis.Client, key, id string, fetch FetchFunc) (Result, error) {
	t.Helper()
	raw.Set(bg(), key, "vanished-holder", 0)
	type answer struct {
		r   Result
		err error
	}
	got := make(chan answer, 1)
	waits := c.Stats().Waits
	go func() {
		r, err := c.GetResult(bg(), id, fetch)
		got <- answer{r, err}
	}()
	eventually(t, 10*time.Second, "the waiter to wait", func() bool { return c.Stats().Waits > waits })
	raw.Del(bg(), key)
	a := <-got
	return a.r, a.err
}

// stalledClient is a testClient of a redis-server that stalls (DEBUG SLEEP)
// from the moment it returns until the test ends; the server must have
// been started with --enable-debug-command yes. warm runs first, while the
// server still answers (to load a script, say). go-redis ignores context
// deadlines on reads, as by default, its own read timeout is half a minute
// and it does not retry: only memolock's handling of a caller's deadline
// can return a call within the tests' bounds, however loaded the machine,
// and a memolock that ignored the deadline fails the test in half a minute.
func stalledClient(t *testing.T, srv *redistest.Server, tag string, warm func(*testClient)) *testClient {
	t.Helper()
	c := newTestClientOn(t, &redis.Options{Addr: srv.Addr, ReadTimeout: stalledReadTimeout, MaxRetries: -1}, tag, nil)
	if warm != nil {
		warm(c)
	}
	srv.Stall(t)
	return c
}

// stalledReadTimeout is go-redis's read timeout in stalledClient: far
// longer than a stalled call's bound (stalledBound).
const stalledReadTimeout = 30 * time.Second

// stalledBound bounds a call to a stalled Redis whose deadline is a few
// hundred milliseconds: coarse enough for a loaded machine, and far below
// go-redis's read timeout, which would end the call if memolock did not.
const stalledBound = 10 * time.Second

// lockDone checks that the lock at key was left done after a value was
// stored: "done:<token>", lingering at most wire.LockLinger (see wire.StoreSrc).
func lockDone(t *testing.T, rdb redis.Cmdable, key string) {
	t.Helper()
	if v := rdb.Get(bg(), key).Val(); !strings.HasPrefix(v, "done:") {
		t.Errorf("lock %s = %q after the value was stored, want done:<token>", key, v)
	}
	if ttl := rdb.PTTL(bg(), key).Val(); ttl <= 0 || ttl > wire.LockLinger {
		t.Errorf("lock %s lingers %v, want (0, %v]", key, ttl, wire.LockLinger)
	}
}
