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

	"github.com/memolock/memolock/internal/redistest"
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
	if addr := os.Getenv(traceChildEnv); addr != "" {
		runTraceChild(addr)
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

// testClient is a memolock Client with its own go-redis client, as a
// separate process would have.
type testClient struct {
	*Client
	rdb      *redis.Client
	commands *commandCounter
}

func newTestClient(t testing.TB, addr, tag string, opts *Options) *testClient {
	t.Helper()
	return newTestClientOn(t, &redis.Options{Addr: addr}, tag, opts)
}

// newTestClientOn is newTestClient with the go-redis options given.
func newTestClientOn(t testing.TB, o *redis.Options, tag string, opts *Options) *testClient {
	t.Helper()
	rdb := redis.NewClient(o)
	cc := &commandCounter{}
	rdb.AddHook(cc)
	c, err := New(rdb, tag, opts)
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

// stall makes the redis-server at addr, started with
// --enable-debug-command yes, sleep for seconds (DEBUG SLEEP), and returns
// once it has stalled. The test's cleanup waits for the sleep to end and
// fails the test if it did not end well.
func stall(t *testing.T, addr string, seconds int) {
	t.Helper()
	sleeper := rawClient(t, addr)
	slept := make(chan error, 1)
	go func() { slept <- sleeper.Do(bg(), "DEBUG", "SLEEP", seconds).Err() }()
	t.Cleanup(func() {
		if err := <-slept; err != nil {
			t.Errorf("DEBUG SLEEP: %v", err)
		}
	})
	eventually(t, 5*time.Second, "the server to stall", func() bool { return redistest.Stalled(addr) })
}

// lockDone checks that the lock at key was left done after a value was
// stored: "done:<token>", lingering at most lockLinger (see storeSrc).
func lockDone(t *testing.T, rdb redis.Cmdable, key string) {
	t.Helper()
	if v := rdb.Get(bg(), key).Val(); !strings.HasPrefix(v, "done:") {
		t.Errorf("lock %s = %q after the value was stored, want done:<token>", key, v)
	}
	if ttl := rdb.PTTL(bg(), key).Val(); ttl <= 0 || ttl > lockLinger {
		t.Errorf("lock %s lingers %v, want (0, %v]", key, ttl, lockLinger)
	}
}
