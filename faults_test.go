package memolock

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/memolock/memolock/internal/redistest"
	"github.com/memolock/memolock/internal/wire"
)

// Fault tests run on a real redis-server: miniredis has no CLIENT KILL and
// no real expiry.

func nilClient() *redis.Client { return nil }

func runtimeGoexit() { runtime.Goexit() }

// waitersLive waits until every client has a live subscription to ch:
// subscribed, and its marker PING back.
func waitersLive(t *testing.T, ch string, clients ...*testClient) {
	t.Helper()
	eventually(t, 5*time.Second, fmt.Sprintf("%d live subscriptions to %s", len(clients), ch), func() bool {
		for _, c := range clients {
			if c.e.LiveWatches(ch) == 0 {
				return false
			}
		}
		return true
	})
}

func TestGet_WaitersSurviveClientKillOfPubSub(t *testing.T) {
	b := realBackend(t)
	opts := &Options{LockTTL: 30 * time.Second}
	holder := newTestClient(t, b.addr, "kill", opts)
	raw := rawClient(t, b.addr)
	started, release := make(chan struct{}, 1), make(chan struct{})
	go func() { _, _ = holder.Get(bg(), "k", blockingFetch(started, release, "survived")) }()
	<-started

	const clients, perClient = 4, 25
	results := make(chan string, clients*perClient)
	var waiters []*testClient
	for range clients {
		c := newTestClient(t, b.addr, "kill", opts)
		waiters = append(waiters, c)
		for range perClient {
			go func() {
				v, err := c.Get(bg(), "k", constFetch(new(atomic.Int64), "waiter fetched", 0))
				if err != nil {
					results <- err.Error()
					return
				}
				results <- string(v)
			}()
		}
	}
	waitersLive(t, "kill/notif:k", waiters...)
	if n := raw.ClientKillByFilter(bg(), "TYPE", "pubsub").Val(); n < clients {
		t.Fatalf("CLIENT KILL TYPE pubsub killed %d connections", n)
	}
	// Publish right away, most likely inside the reconnect gap: the waiters
	// must re-read after resubscribing.
	t0 := time.Now()
	close(release)
	for range clients * perClient {
		select {
		case v := <-results:
			if v != "survived" {
				t.Errorf("waiter got %q", v)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("waiter still waiting 10s after the value was published (lock TTL 30s)")
		}
	}
	t.Logf("all waiters had the value %v after the kill", time.Since(t0))
	for _, c := range waiters {
		if c.Stats().Reconnects == 0 {
			t.Error("a waiter's subscriber saw no reconnect")
		}
	}
}

func TestGet_WaitersSurviveRedisRestart(t *testing.T) {
	b := realBackend(t)
	opts := &Options{LockTTL: 30 * time.Second}
	holder := newTestClient(t, b.addr, "restart", opts)
	waiter := newTestClient(t, b.addr, "restart", opts)
	raw := rawClient(t, b.addr)
	started, release := make(chan struct{}, 1), make(chan struct{})
	holderDone := make(chan error, 1)
	go func() {
		_, err := holder.Get(bg(), "k", blockingFetch(started, release, "from holder"))
		holderDone <- err
	}()
	<-started
	got := make(chan string, 1)
	go func() {
		v, err := waiter.Get(bg(), "k", constFetch(new(atomic.Int64), "from waiter", 0))
		if err != nil {
			got <- err.Error()
			return
		}
		got <- string(v)
	}()
	waitersLive(t, "restart/notif:k", waiter)

	b.real.Restart(t) // an empty server: the lock is gone
	t0 := time.Now()
	select {
	case v := <-got:
		// The waiter re-read after resubscribing, found no lock, took over.
		if v != "from waiter" {
			t.Errorf("waiter got %q", v)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("waiter still waiting 10s after the restart (lock TTL 30s)")
	}
	t.Logf("waiter answered %v after the restart", time.Since(t0))
	close(release)
	if err := <-holderDone; err != nil {
		t.Errorf("holder: %v", err)
	}
	// The old holder lost its lease in the restart: the waiter's value stays.
	if v := raw.Get(bg(), "restart:k").Val(); v != "from waiter" {
		t.Errorf("stored value = %q", v)
	}
}

const helperEnv = "MEMOLOCK_TEST_HOLDER"

// runHelperHolder is the child process of TestGet_WaiterTakesOverWhenHolderDies:
// it takes the lock, says so, and computes forever.
func runHelperHolder() {
	addr, rest, _ := strings.Cut(os.Getenv(helperEnv), " ")
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	c, err := New(rdb, "crash", &Options{LockTTL: 2 * time.Second})
	if err != nil {
		fmt.Println("ERROR", err)
		os.Exit(1)
	}
	_, err = c.Get(context.Background(), rest, func(ctx context.Context, l *Lease) ([]byte, time.Duration, error) {
		fmt.Println("HOLDING", l.Token())
		select {}
	})
	fmt.Println("ERROR", err)
	os.Exit(1)
}

func TestGet_WaiterTakesOverWhenHolderDies(t *testing.T) {
	b := realBackend(t)
	raw := rawClient(t, b.addr)
	child := exec.Command(os.Args[0], "-test.run=^$")
	child.Env = append(os.Environ(), helperEnv+"="+b.addr+" k")
	out, err := child.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "HOLDING ") {
		_ = child.Process.Kill()
		_ = child.Wait()
		t.Fatalf("child: %q, %v", line, err)
	}
	token := strings.TrimSpace(strings.TrimPrefix(line, "HOLDING "))
	if v := raw.Get(bg(), "crash/lock:k").Val(); v != token {
		t.Fatalf("lock holds %q, child says %q", v, token)
	}

	var holders []string
	var mu sync.Mutex
	c := newTestClient(t, b.addr, "crash", &Options{LockTTL: 2 * time.Second,
		OnWait: func(id, holder string) { mu.Lock(); holders = append(holders, holder); mu.Unlock() }})
	result := make(chan error, 1)
	var calls atomic.Int64
	go func() {
		v, err := c.Get(bg(), "k", constFetch(&calls, "recomputed", 0))
		if err == nil && string(v) != "recomputed" {
			err = fmt.Errorf("got %q", v)
		}
		result <- err
	}()
	eventually(t, 5*time.Second, "the waiter to wait", func() bool { return c.Stats().Waits == 1 })
	_ = child.Process.Signal(syscall.SIGKILL)
	_ = child.Wait()
	select {
	case err := <-result:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("no takeover 15s after the holder died (lock TTL 2s)")
	}
	if calls.Load() != 1 || c.Stats().Takeovers != 1 {
		t.Errorf("fetches = %d, takeovers = %d; want 1 and 1", calls.Load(), c.Stats().Takeovers)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(holders) == 0 || holders[0] != token {
		t.Errorf("OnWait saw holders %q, want the child's token first", holders)
	}
}

func TestGet_WatchdogKeepsSlowFetchLocked(t *testing.T) {
	b := realBackend(t)
	// Renewed every LockTTL/3: three seconds leave the watchdog 2 s of
	// scheduling delay on a loaded machine before the lock could lapse
	// (with one second, the 667 ms left lapsed once under .ci/under-load,
	// two copies of the suite on two cores).
	const lockTTL = 3 * time.Second
	opts := &Options{LockTTL: lockTTL}
	c1 := newTestClient(t, b.addr, "slow", opts)
	c2 := newTestClient(t, b.addr, "slow", opts)
	var calls atomic.Int64
	var wg sync.WaitGroup
	for _, c := range []*testClient{c1, c2} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Two lock TTLs long: five renewals.
			v, err := c.Get(bg(), "k", constFetch(&calls, "slow value", 2*lockTTL))
			if err != nil || string(v) != "slow value" {
				t.Errorf("Get = %q, %v", v, err)
			}
		}()
		eventually(t, 5*time.Second, "the first client to compute", func() bool { return calls.Load() == 1 })
	}
	wg.Wait()
	if calls.Load() != 1 {
		t.Fatalf("a slow fetch lost its lock: fetch ran %d times", calls.Load())
	}
}

// A renewal that finds the lease lost (the lock deleted while fetch runs)
// ends the renewals: the watchdog sends no more of them for the rest of the
// fetch.
func TestGet_WatchdogStopsOnceTheLeaseIsLost(t *testing.T) {
	b := realBackend(t)
	const lockTTL = 300 * time.Millisecond // a renewal every 100 ms
	c := newTestClient(t, b.addr, "wdlost", &Options{LockTTL: lockTTL})
	renew := wire.ScriptsFor(false).Renew
	renews := &renewCounter{sha: renew.Hash()}
	c.rdb.AddHook(renews)
	raw := rawClient(t, b.addr)
	// Loaded first, every renewal is the EVALSHA that renews counts: on a
	// fresh server the first one is refused (NOSCRIPT) and go-redis sends
	// it again as an EVAL, whose answer renews does not see, and which
	// may come after the DEL below.
	if err := renew.Load(bg(), raw).Err(); err != nil {
		t.Fatal(err)
	}
	release := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		_, err := c.Get(bg(), "k", func(ctx context.Context, _ *Lease) ([]byte, time.Duration, error) {
			select {
			case <-release:
			case <-ctx.Done(): // the test failed, and Close cancels fetch
				return nil, 0, ctx.Err()
			}
			return []byte("v"), time.Minute, nil
		})
		done <- err
	}()
	eventually(t, 10*time.Second, "a renewal", func() bool { return renews.sent.Load() >= 1 })
	if err := raw.Del(bg(), "wdlost/lock:k").Err(); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "a renewal finding the lease lost", func() bool { return renews.lostAt.Load() > 0 })
	// Ten renewal periods: a watchdog that went on would send about ten
	// more. One may have begun between the reply and the watchdog's
	// hearing it.
	time.Sleep(10 * lockTTL / 3)
	if n := renews.sent.Load() - renews.lostAt.Load(); n > 1 {
		t.Errorf("%d renewals were sent after one found the lease lost; want at most 1", n)
	}
	close(release)
	select {
	case err := <-done:
		if !errors.Is(err, ErrLeaseLost) && err != nil {
			t.Errorf("Get = %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Get did not return once fetch did")
	}
}

// renewCounter is a go-redis hook that counts the renew scripts sent (as
// EVALSHA), and notes how many had been sent when one first answers 0 (the
// lease lost): those sent before, and still under way then (a loaded
// machine's slow replies), are not sent after the lease was found lost.
type renewCounter struct {
	sha          string
	sent, lostAt atomic.Int64
}

func (h *renewCounter) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *renewCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		args := cmd.Args()
		if len(args) < 2 || fmt.Sprint(args[0]) != "evalsha" || fmt.Sprint(args[1]) != h.sha {
			return next(ctx, cmd)
		}
		h.sent.Add(1)
		err := next(ctx, cmd)
		if c, ok := cmd.(*redis.Cmd); ok {
			if v, e := c.Int(); e == nil && v == 0 {
				h.lostAt.CompareAndSwap(0, h.sent.Load())
			}
		}
		return err
	}
}
func (h *renewCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

func TestLease_ExtendNeverShortens(t *testing.T) {
	b := realBackend(t)
	c := newTestClient(t, b.addr, "ext", &Options{LockTTL: 10 * time.Second})
	raw := rawClient(t, b.addr)
	_, err := c.Get(bg(), "k", func(ctx context.Context, l *Lease) ([]byte, time.Duration, error) {
		if err := l.Extend(ctx, time.Minute); err != nil {
			return nil, 0, err
		}
		if ttl := raw.PTTL(bg(), "ext/lock:k").Val(); ttl < 50*time.Second {
			t.Errorf("after Extend(1m) the lock TTL is %v", ttl)
		}
		if err := l.Extend(ctx, time.Second); err != nil {
			return nil, 0, err
		}
		if ttl := raw.PTTL(bg(), "ext/lock:k").Val(); ttl < 50*time.Second {
			t.Errorf("Extend(1s) shortened the lock to %v", ttl)
		}
		if err := l.Extend(ctx, time.Microsecond); !errors.Is(err, ErrInvalid) {
			t.Errorf("Extend(1µs) = %v, want ErrInvalid", err)
		}
		return []byte("v"), time.Minute, nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// loseReply runs the first acquire script on key for real, then reports it
// failed, as when a reply is lost on its way.
type loseReply struct {
	key    string
	before func() // runs first, e.g. to wait for other callers
	after  func() // runs once the script has run, e.g. to cancel a context
	done   atomic.Bool
}

func (h *loseReply) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *loseReply) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (h *loseReply) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		args := cmd.Args()
		if len(args) < 4 || args[3] != h.key || h.done.Load() {
			return next(ctx, cmd)
		}
		h.before()
		if err := next(context.Background(), cmd); err != nil {
			return err // NOSCRIPT: Script.Run tries EVAL next
		}
		h.done.Store(true)
		h.after()
		cmd.SetErr(context.Canceled)
		return context.Canceled
	}
}

// A lookup whose reply a leaving caller never saw may have taken the lock:
// the abandoned flight releases it.
func TestGet_AbandonedLostReplyReleasesItsLock(t *testing.T) {
	b := miniBackend(t)
	c := newTestClient(t, b.addr, "lost2", &Options{LockTTL: time.Minute})
	ctx, cancel := context.WithCancel(bg())
	c.rdb.AddHook(&loseReply{key: "lost2:k", before: func() {}, after: cancel})
	if _, err := c.Get(ctx, "k", constFetch(new(atomic.Int64), "v", 0)); !errors.Is(err, context.Canceled) {
		t.Fatalf("Get = %v", err)
	}
	eventually(t, 5*time.Second, "the orphaned lock to go", func() bool { return !b.mini.Exists("lost2/lock:k") })
}

func TestGet_WaiterSurvivesSilentlyDeadPubSubConnection(t *testing.T) {
	b := miniBackend(t)
	proxy := redistest.StartProxy(t, b.addr)
	raw := rawClient(t, b.addr)
	raw.Set(bg(), "silent/lock:k", "holder", time.Minute)
	c := newTestClient(t, proxy.Addr, "silent", &Options{LockTTL: time.Minute}, pubsubHealth(100*time.Millisecond))
	looks := countLookups(c.rdb, "silent:k")
	got := make(chan string, 1)
	go func() {
		v, err := c.Get(bg(), "k", constFetch(new(atomic.Int64), "fetched", 0))
		if err != nil {
			got <- err.Error()
			return
		}
		got <- string(v)
	}()
	parkedAndLive(t, looks, 2)
	if n := proxy.SilencePubSub(); n != 1 {
		t.Fatalf("silenced %d pub/sub connections, want 1", n)
	}
	// The holder finishes while the waiter's connection swallows everything.
	raw.Set(bg(), "silent:k", "published", time.Minute)
	raw.Del(bg(), "silent/lock:k")
	raw.Publish(bg(), "silent/notif:k", "published")
	select {
	case v := <-got:
		if v != "published" {
			t.Fatalf("got %q", v)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("waiter still waiting 5s after the value was published (lock TTL 1m)")
	}
	if c.Stats().Reconnects == 0 {
		t.Error("the dead connection was not replaced")
	}
}
