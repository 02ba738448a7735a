package memolock

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/memolock/memolock/internal/redistest"
	"github.com/memolock/memolock/internal/wire"
)

// Delete while a fetch runs: the fetch's value reaches its own callers but
// is never stored, and waiters elsewhere compute afresh at once.
func TestDelete_RacingARunningFetchNeverStoresTheOldValue(t *testing.T) {
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			holder := newTestClient(t, b.addr, "del", &Options{LockTTL: 30 * time.Second})
			other := newTestClient(t, b.addr, "del", &Options{LockTTL: 30 * time.Second})
			admin := newTestClient(t, b.addr, "del", nil)
			raw := rawClient(t, b.addr)
			l := countLookups(other.rdb, "del:k")
			started, release := make(chan struct{}, 1), make(chan struct{})
			ctx, cancel := context.WithTimeout(bg(), 10*time.Second)
			defer cancel()
			old := getAsync(holder, ctx, "k", blockingFetch(started, release, "old"))
			<-started
			fresh := getAsync(other, ctx, "k", constFetch(new(atomic.Int64), "fresh", 0))
			parkedAndLive(t, l, 2)
			if existed, err := admin.Delete(ctx, "k"); err != nil || existed {
				t.Fatalf("Delete = %v, %v; want false (no value yet), nil", existed, err)
			}
			within(t, 5*time.Second, fresh, "fresh", "the waiter elsewhere (lock TTL 30s)")
			close(release)
			within(t, 5*time.Second, old, "old", "the holder's own caller")
			if v := raw.Get(bg(), "del:k").Val(); v != "fresh" {
				t.Errorf("stored value %q: the computation from before the Delete stored", v)
			}
			if n := holder.Stats().LeaseLost; n != 1 {
				t.Errorf("holder LeaseLost = %d", n)
			}
		})
	}
}

func TestDelete_ReportsWhetherAValueWasThere(t *testing.T) {
	b := miniBackend(t)
	c := newTestClient(t, b.addr, "del2", &Options{HashIDs: true})
	if _, err := c.Get(bg(), "k", constFetch(new(atomic.Int64), "v", 0)); err != nil {
		t.Fatal(err)
	}
	if existed, err := c.Delete(bg(), "k"); err != nil || !existed {
		t.Fatalf("Delete = %v, %v", existed, err)
	}
	if keys := b.mini.Keys(); len(keys) != 0 {
		t.Errorf("keys left: %q", keys)
	}
	if existed, err := c.Delete(bg(), "k"); err != nil || existed {
		t.Fatalf("second Delete = %v, %v", existed, err)
	}
}

// Set wakes waiters with its value, and the computation under way does not
// overwrite it.
func TestSet_WakesWaitersAndOutlivesTheHolder(t *testing.T) {
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			opts := &Options{LockTTL: 30 * time.Second}
			holder := newTestClient(t, b.addr, "set", opts)
			other := newTestClient(t, b.addr, "set", opts)
			admin := newTestClient(t, b.addr, "set", nil)
			raw := rawClient(t, b.addr)
			l := countLookups(other.rdb, "set:k")
			started, release := make(chan struct{}, 1), make(chan struct{})
			ctx, cancel := context.WithTimeout(bg(), 10*time.Second)
			defer cancel()
			old := getAsync(holder, ctx, "k", blockingFetch(started, release, "old"))
			<-started
			waiter := getAsync(other, ctx, "k", noFetch)
			parkedAndLive(t, l, 2)
			if err := admin.Set(ctx, "k", []byte("set by admin"), time.Minute); err != nil {
				t.Fatal(err)
			}
			within(t, 5*time.Second, waiter, "set by admin", "the waiter")
			close(release)
			within(t, 5*time.Second, old, "old", "the holder's own caller")
			if v := raw.Get(bg(), "set:k").Val(); v != "set by admin" {
				t.Errorf("stored value %q: the holder overwrote Set", v)
			}
			if ttl := raw.PTTL(bg(), "set:k").Val(); ttl <= 0 || ttl > time.Minute {
				t.Errorf("value TTL %v", ttl)
			}
			lockDone(t, raw, "set/lock:k")
		})
	}
}

func TestSet_RejectsANegativeTTL(t *testing.T) {
	c := newTestClient(t, miniBackend(t).addr, "set2", nil)
	if err := c.Set(bg(), "k", []byte("v"), -time.Second); !errors.Is(err, ErrInvalid) {
		t.Fatalf("Set = %v", err)
	}
}

func TestPeek_ShowsValueTTLAndHolderAndNeverComputes(t *testing.T) {
	b := realBackend(t)
	c := newTestClient(t, b.addr, "peek", nil)
	p, err := c.Peek(bg(), "k")
	if err != nil || p.Found || p.Value != nil || p.Holder != "" {
		t.Fatalf("Peek of nothing = %+v, %v", p, err)
	}
	started, release := make(chan struct{}, 1), make(chan struct{})
	var token atomic.Value
	done := getAsync(c, bg(), "k", func(ctx context.Context, l *Lease) ([]byte, time.Duration, error) {
		token.Store(l.Token())
		return blockingFetch(started, release, "")(ctx, l)
	})
	<-started
	if p, err := c.Peek(bg(), "k"); err != nil || p.Found || p.Holder != token.Load() || p.HolderTTL <= 0 {
		t.Errorf("Peek during fetch = %+v, %v; want holder %v", p, err, token.Load())
	}
	close(release)
	<-done
	if err := c.Set(bg(), "k", []byte{}, time.Minute); err != nil {
		t.Fatal(err)
	}
	p, err = c.Peek(bg(), "k")
	if err != nil || !p.Found || len(p.Value) != 0 || p.TTL <= 0 || p.TTL > time.Minute {
		t.Errorf("Peek of an empty value = %+v, %v", p, err)
	}
	if err := c.Set(bg(), "forever", []byte("x"), 0); err != nil {
		t.Fatal(err)
	}
	if p, err := c.Peek(bg(), "forever"); err != nil || p.TTL != -1 || string(p.Value) != "x" {
		t.Errorf("Peek of a value without TTL = %+v, %v", p, err)
	}
}

// Purge removes every key of its tag, in batches, and nothing else, even
// with glob characters in the tag.
func TestPurge_RemovesTheTagsKeysOnly(t *testing.T) {
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			raw := rawClient(t, b.addr)
			c := newTestClient(t, b.addr, "p*[x]", nil)
			const n = 1234
			for i := range n {
				raw.Set(bg(), fmt.Sprintf("p*[x]:%d", i), "v", 0)
			}
			raw.Set(bg(), "p*[x]/lock:7", "tok", time.Minute)
			others := []string{"pX[x]:1", "p*[y]:1", "p:1", "p*[x]", "other:1"}
			for _, k := range others {
				raw.Set(bg(), k, "keep", 0)
			}
			got, err := c.Purge(bg())
			if err != nil || got != n+1 {
				t.Fatalf("Purge = %d, %v; want %d", got, err, n+1)
			}
			if left := raw.Exists(bg(), others...).Val(); left != int64(len(others)) {
				t.Errorf("Purge removed keys of other tags: %d of %d left", left, len(others))
			}
			if k := raw.Keys(bg(), "p\\*\\[x\\][:/]*").Val(); len(k) != 0 {
				t.Errorf("left behind: %q", k[:min(len(k), 5)])
			}
		})
	}
}

// Control calls hold their caller's deadline while Redis stalls and
// go-redis ignores context deadlines on reads (its default).
func TestControl_DeadlineHoldsWhileRedisStalls(t *testing.T) {
	srv := redistest.Start(t, "--enable-debug-command", "yes")
	c := stalledClient(t, srv, "stall", func(c *testClient) {
		if _, err := c.Peek(bg(), "warm"); err != nil { // load the script
			t.Fatal(err)
		}
	})
	for name, call := range map[string]func(context.Context) error{
		"Peek":   func(ctx context.Context) error { _, err := c.Peek(ctx, "k"); return err },
		"Delete": func(ctx context.Context) error { _, err := c.Delete(ctx, "k"); return err },
		"Set":    func(ctx context.Context) error { return c.Set(ctx, "k", []byte("v"), 0) },
		"Purge":  func(ctx context.Context) error { _, err := c.Purge(ctx); return err },
	} {
		ctx, cancel := context.WithTimeout(bg(), 100*time.Millisecond)
		t0 := time.Now()
		err := call(ctx)
		cancel()
		if !errors.Is(err, ErrTimeout) || !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("%s = %v, want ErrTimeout", name, err)
		}
		if d := time.Since(t0); d > stalledBound {
			t.Errorf("%s returned after %v with a 100ms deadline (go-redis would give up after %v)", name, d, stalledReadTimeout)
		}
	}
}

func TestControl_BadInput(t *testing.T) {
	c := newTestClient(t, miniBackend(t).addr, "bad", nil)
	var nilCtx context.Context // the bad input
	if _, err := c.Peek(nilCtx, "k"); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "context") {
		t.Errorf("Peek(nil ctx) = %v", err)
	}
	_ = c.Close()
	if _, err := c.Delete(bg(), "k"); !errors.Is(err, ErrClosed) {
		t.Errorf("Delete after Close = %v", err)
	}
	if _, err := c.Purge(bg()); !errors.Is(err, ErrClosed) {
		t.Errorf("Purge after Close = %v", err)
	}
}

// Purge works on a cluster, where the keys SCAN returns span slots.
func TestPurge_Cluster(t *testing.T) {
	nodes := redistest.StartCluster(t, 3)
	var addrs []string
	for _, n := range nodes {
		addrs = append(addrs, n.Addr)
	}
	rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs})
	t.Cleanup(func() { _ = rdb.Close() })
	c, err := New(rdb, "cl", nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	for i := range 100 {
		if err := c.Set(bg(), fmt.Sprintf("{id%d}", i), []byte("v"), 0); err != nil {
			t.Fatal(err)
		}
	}
	rdb.Set(bg(), "other:{x}", "keep", 0)
	n, err := c.Purge(bg())
	// Set leaves each lock done for a second: some may have expired.
	if err != nil || n < 100 || n > 200 {
		t.Fatalf("Purge = %d, %v; want the 100 values and their done locks", n, err)
	}
	if v := rdb.Get(bg(), "other:{x}").Val(); v != "keep" {
		t.Error("Purge removed another tag's key")
	}
}

// Delete and Set: a Get in this process afterwards never joins a flight
// that started before them.
func TestDeleteAndSet_DetachFlightsInThisProcess(t *testing.T) {
	for _, op := range []string{"Delete", "Set"} {
		t.Run(op, func(t *testing.T) {
			b := miniBackend(t)
			c := newTestClient(t, b.addr, "detach", &Options{LockTTL: 30 * time.Second})
			started, release := make(chan struct{}, 1), make(chan struct{})
			old := getAsync(c, bg(), "k", blockingFetch(started, release, "old"))
			<-started
			var err error
			if op == "Delete" {
				_, err = c.Delete(bg(), "k")
			} else {
				err = c.Set(bg(), "k", []byte("new"), time.Minute)
			}
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(bg(), 5*time.Second)
			defer cancel()
			v, err := c.Get(ctx, "k", constFetch(new(atomic.Int64), "new", 0))
			if err != nil || string(v) != "new" {
				t.Errorf("Get after %s = %q, %v; want new", op, v, err)
			}
			close(release)
			within(t, 5*time.Second, old, "old", "the earlier caller")
		})
	}
}

// isScript reports whether cmd runs script s (by its hash, or, after a
// NOSCRIPT, by its source).
func isScript(cmd redis.Cmder, s *redis.Script, src string) bool {
	args := cmd.Args()
	if len(args) < 2 {
		return false
	}
	switch cmd.Name() {
	case "evalsha":
		return args[1] == s.Hash()
	case "eval":
		return args[1] == src
	}
	return false
}

// holdScript makes c's first run of script s (source src) wait in its hook
// until release is called (at the test's end at the latest): held is
// closed once it waits there.
func holdScript(t *testing.T, c *testClient, s *redis.Script, src string) (held <-chan struct{}, release func()) {
	t.Helper()
	reached, gate := make(chan struct{}), make(chan struct{})
	var once atomic.Bool
	c.rdb.AddHook(hookEach(func(cmd redis.Cmder) {
		if isScript(cmd, s, src) && !once.Swap(true) {
			close(reached)
			<-gate
		}
	}))
	release = sync.OnceFunc(func() { close(gate) })
	t.Cleanup(release)
	return reached, release
}

// wantTheWriteAfterAHeldFlight checks a flight of c's for "k" whose write
// is held (held, then release): another process Sets "written", and a Get
// on c begun then must get that, not join the flight, whose answer (what
// says) came before the Set. The write is released once that Get has
// ended or joined.
func wantTheWriteAfterAHeldFlight(t *testing.T, ctx context.Context, c, other *testClient, held <-chan struct{}, release func(), what string) {
	t.Helper()
	select {
	case <-held:
	case <-ctx.Done():
		t.Fatal("the flight never made the write held")
	}
	if err := other.Set(ctx, "k", []byte("written"), time.Minute); err != nil {
		t.Fatal(err)
	}
	var again atomic.Int64
	later := getAsync(c, ctx, "k", constFetch(&again, "computed again", 0))
	var got string
	eventually(t, 10*time.Second, "the later call to end or to join the flight", func() bool {
		select {
		case got = <-later:
			return true
		default:
			return c.Stats().Coalesced > 0
		}
	})
	release()
	if got == "" {
		got = <-later // it joined: it ends with the flight
	}
	if got != "written" {
		t.Errorf("a call begun after another process's Set = %q, want %q (it joined a flight whose %s came before the Set)", got, "written", what)
	}
	if n := again.Load(); n != 0 {
		t.Errorf("the later call computed %d times", n)
	}
}

// A caller who begins after a flight's fetch returned, while the flight's
// store is still on its way (held here; a master that just died holds it
// for seconds), does not join that flight: a write by another process may
// have landed meanwhile, and it gets that write, not the older
// computation (memcache leases: no stale answer after a write). The
// flight's own callers still get what it computed.
func TestGet_ACallerAfterTheComputationEndedLooksAfreshWhileItsStoreIsHeld(t *testing.T) {
	b := miniBackend(t)
	c := newTestClient(t, b.addr, "sealed", &Options{LockTTL: 30 * time.Second})
	other := newTestClient(t, b.addr, "sealed", nil)
	held, release := holdScript(t, c, wire.ScriptsFor(false).Store, wire.StoreSrc)
	ctx, cancel := context.WithTimeout(bg(), 20*time.Second)
	defer cancel()
	first := getAsync(c, ctx, "k", constFetch(new(atomic.Int64), "computed", 0))
	wantTheWriteAfterAHeldFlight(t, ctx, c, other, held, release, "fetch")
	within(t, 10*time.Second, first, "computed", "the flight's own caller")
}

// As for a value (above), so for a fetch that failed: a caller who begins
// after fetch returned, while the flight still writes to Redis what came
// of it (its lock's release with the failure; with StaleTTL, first the
// stale copy's resurrection), does not join that flight. Another
// process's Set may have landed meanwhile, and the caller gets it, not the
// failure (or the stale copy) of a computation that ended before it.
func TestGet_ACallerAfterAFailedComputationLooksAfreshWhileItsWritesAreHeld(t *testing.T) {
	for _, tc := range []struct {
		name     string
		staleTTL time.Duration
		script   func(wire.Scripts) (*redis.Script, string)
	}{
		{"release", 0, func(s wire.Scripts) (*redis.Script, string) { return s.Release, wire.ReleaseSrc }},
		{"resurrect", time.Hour, func(s wire.Scripts) (*redis.Script, string) { return s.Resurrect, wire.ResurrectSrc }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := miniBackend(t)
			c := newTestClient(t, b.addr, "sealedfail", &Options{LockTTL: 30 * time.Second, StaleTTL: tc.staleTTL})
			other := newTestClient(t, b.addr, "sealedfail", nil)
			script, src := tc.script(*wire.ScriptsFor(false))
			held, release := holdScript(t, c, script, src)
			ctx, cancel := context.WithTimeout(bg(), 20*time.Second)
			defer cancel()
			first := getAsync(c, ctx, "k", func(context.Context, *Lease) ([]byte, time.Duration, error) {
				return nil, 0, errors.New("boom")
			})
			wantTheWriteAfterAHeldFlight(t, ctx, c, other, held, release, "failed fetch")
			select {
			case got := <-first:
				if !strings.HasPrefix(got, "error: ") || !strings.Contains(got, "boom") {
					t.Errorf("the flight's own caller got %q, want the fetch's error", got)
				}
			case <-time.After(10 * time.Second):
				t.Error("the flight's own caller had no answer after 10s")
			}
		})
	}
}
