package memolock

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/memolock/memolock/internal/engine"
	"github.com/memolock/memolock/internal/redistest"
)

// The nightly job: when it is due, every machine tries the lock, and only
// the one that gets it runs the job.
func ExampleClient_TryLock() {
	srv, _ := miniredis.Run()
	defer srv.Close()

	// runNightly is what every machine runs when the job is due.
	runNightly := func(jobs *Client, machine string, job func()) {
		ctx := context.Background()
		lease, err := jobs.TryLock(ctx, "nightly-report", 10*time.Minute)
		switch {
		case errors.Is(err, ErrBusy):
			fmt.Println(machine + ": skipped, another machine runs the job")
			return
		case err != nil:
			fmt.Println(machine+":", err) // Redis is down: try again later
			return
		}
		defer lease.Release(context.WithoutCancel(ctx))
		stop := lease.KeepAlive(ctx) // for a job that runs over 10 minutes
		defer stop()
		fmt.Println(machine + ": running the job")
		job()
	}

	var machines []*Client
	for range 2 {
		rdb := redis.NewClient(&redis.Options{Addr: srv.Addr()})
		defer rdb.Close()
		jobs, err := New(rdb, "jobs", nil)
		if err != nil {
			panic(err)
		}
		defer jobs.Close()
		machines = append(machines, jobs)
	}
	a, b := machines[0], machines[1]
	runNightly(a, "a", func() {
		runNightly(b, "b", func() {}) // b wakes up while a works
	})
	runNightly(b, "b", func() {}) // the next night
	// Output:
	// a: running the job
	// b: skipped, another machine runs the job
	// b: running the job
}

func TestTryLock_BusyForEveryoneElseAndForItsOwnClient(t *testing.T) {
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			c := newTestClient(t, b.addr, "tl", nil)
			other := newTestClient(t, b.addr, "tl", nil)
			for _, cl := range []*testClient{c, other} {
				cl.rdb.Ping(bg()) // connect: the handshake costs commands of its own
			}
			before := c.commands.n.Load()
			lease, err := c.TryLock(bg(), "nightly", time.Minute)
			if err != nil {
				t.Fatal(err)
			}
			if n := c.commands.n.Load() - before; n != 1 {
				t.Errorf("TryLock sent %d commands, want 1", n)
			}
			if v := rawClient(t, b.addr).Get(bg(), "tl/lock-mutex:"+HashID("nightly")).Val(); v != lease.Token() {
				t.Errorf("lock holds %q, want the lease's token %q", v, lease.Token())
			}
			for who, cl := range map[string]*testClient{"same client": c, "other client": other} {
				before := cl.commands.n.Load()
				l, err := cl.TryLock(bg(), "nightly", time.Minute)
				if !errors.Is(err, ErrBusy) || l != nil {
					t.Fatalf("%s: TryLock = %v, %v; want ErrBusy", who, l, err)
				}
				if !strings.Contains(err.Error(), lease.Token()) || !strings.Contains(err.Error(), `"nightly"`) {
					t.Errorf("%s: %q does not name the lock and its holder %s", who, err, lease.Token())
				}
				if n := cl.commands.n.Load() - before; n != 1 {
					t.Errorf("%s: busy TryLock sent %d commands, want 1", who, n)
				}
			}
			if _, err := c.TryLock(bg(), "another job", time.Minute); err != nil {
				t.Errorf("a lock of another name: %v", err)
			}
		})
	}
}

func TestLease_ReleaseLetsTheNextTryLockIn(t *testing.T) {
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			c := newTestClient(t, b.addr, "tl", nil)
			other := newTestClient(t, b.addr, "tl", nil)
			lease, err := c.TryLock(bg(), "nightly", time.Minute)
			if err != nil {
				t.Fatal(err)
			}
			if err := lease.Release(bg()); err != nil {
				t.Fatal(err)
			}
			if err := lease.Release(bg()); err != nil {
				t.Errorf("second Release = %v, want nil", err)
			}
			next, err := other.TryLock(bg(), "nightly", time.Minute)
			if err != nil {
				t.Fatalf("TryLock after Release: %v", err)
			}
			if err := lease.Release(bg()); err != nil {
				t.Errorf("stale Release = %v, want nil", err)
			}
			if held, err := next.Held(bg()); !held || err != nil {
				t.Errorf("a stale Release took the new holder's lock: Held = %v, %v", held, err)
			}
		})
	}
}

// The pitfall of every lock with a TTL: the job outlived it and somebody
// else took the lock. The late Release must not delete the new holder's
// lock, and has nothing to report.
func TestLease_ReleaseAfterExpiryIsQuietAndSparesTheNewHolder(t *testing.T) {
	b := realBackend(t)
	c := newTestClient(t, b.addr, "tl", nil)
	other := newTestClient(t, b.addr, "tl", nil)
	rdb := rawClient(t, b.addr)
	key := "tl/lock-mutex:" + HashID("nightly")
	lease, err := c.TryLock(bg(), "nightly", 30*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	// Gone already (-2) is fine on a loaded machine; no TTL (-1) is not.
	if ttl := rdb.PTTL(bg(), key).Val(); ttl == -time.Nanosecond || ttl > 30*time.Millisecond {
		t.Errorf("PTTL = %v, want at most 30ms", ttl)
	}
	eventually(t, 5*time.Second, "the lock to expire", func() bool { return rdb.Exists(bg(), key).Val() == 0 })
	if err := lease.Release(bg()); err != nil {
		t.Errorf("Release of an expired lock = %v, want nil", err)
	}
	next, err := other.TryLock(bg(), "nightly", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if err := lease.Release(bg()); err != nil {
		t.Errorf("Release of a lock now held by another = %v, want nil", err)
	}
	if v := rdb.Get(bg(), key).Val(); v != next.Token() {
		t.Errorf("lock = %q after a stale Release, want the new holder's %q", v, next.Token())
	}
}

func TestLease_RenewExtendsAndNeverShortens(t *testing.T) {
	b := realBackend(t)
	c := newTestClient(t, b.addr, "tl", nil)
	rdb := rawClient(t, b.addr)
	key := "tl/lock-mutex:" + HashID("nightly")
	lease, err := c.TryLock(bg(), "nightly", time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if err := lease.Renew(bg(), time.Minute); err != nil {
		t.Fatal(err)
	}
	if ttl := rdb.PTTL(bg(), key).Val(); ttl < 50*time.Second || ttl > time.Minute {
		t.Errorf("PTTL = %v after Renew(1m)", ttl)
	}
	if err := lease.Renew(bg(), time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if ttl := rdb.PTTL(bg(), key).Val(); ttl < 50*time.Second {
		t.Errorf("PTTL = %v after Renew(1ms), want the minute kept", ttl)
	}
	if err := lease.Renew(bg(), 0); !errors.Is(err, ErrInvalid) {
		t.Errorf("Renew(0) = %v, want ErrInvalid", err)
	}
}

func TestLease_RenewAfterLossIsErrLeaseLost(t *testing.T) {
	b := realBackend(t)
	c := newTestClient(t, b.addr, "tl", nil)
	other := newTestClient(t, b.addr, "tl", nil)
	rdb := rawClient(t, b.addr)
	key := "tl/lock-mutex:" + HashID("nightly")
	lease, err := c.TryLock(bg(), "nightly", 30*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "the lock to expire", func() bool { return rdb.Exists(bg(), key).Val() == 0 })
	if err := lease.Renew(bg(), time.Minute); !errors.Is(err, ErrLeaseLost) {
		t.Errorf("Renew of an expired lock = %v, want ErrLeaseLost", err)
	}
	if rdb.Exists(bg(), key).Val() != 0 {
		t.Error("Renew of an expired lock brought it back")
	}
	next, err := other.TryLock(bg(), "nightly", time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if err := lease.Renew(bg(), time.Minute); !errors.Is(err, ErrLeaseLost) {
		t.Errorf("Renew of a lock held by another = %v, want ErrLeaseLost", err)
	}
	if ttl := rdb.PTTL(bg(), key).Val(); ttl > time.Second {
		t.Errorf("a lost lease's Renew extended the new holder's lock to %v", ttl)
	}
	if held, _ := next.Held(bg()); !held {
		t.Error("the new holder lost its lock")
	}
}

// The watchdog keeps a short lock alive for as long as the job runs, and
// once stopped lets it expire.
func TestLease_KeepAliveHoldsAShortLockUntilStopped(t *testing.T) {
	b := realBackend(t)
	c := newTestClient(t, b.addr, "tl", nil)
	other := newTestClient(t, b.addr, "tl", nil)
	// Renewed every TTL/3: 3 s leave the watchdog 2 s of scheduling delay
	// before the lock could lapse. With 1 s (667 ms of slack), a renewal
	// came too late under .ci/under-load (load average 15).
	const ttl = 3 * time.Second
	lease, err := c.TryLock(bg(), "nightly", ttl)
	if err != nil {
		t.Fatal(err)
	}
	stop := lease.KeepAlive(bg())
	// The job runs over two TTLs; nobody else may get in meanwhile.
	for end := time.Now().Add(2*ttl + 100*time.Millisecond); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		if l, err := other.TryLock(bg(), "nightly", time.Minute); !errors.Is(err, ErrBusy) {
			stop()
			t.Fatalf("TryLock during KeepAlive = %v, %v; want ErrBusy", l, err)
		}
	}
	stop()
	stop() // harmless
	if held, err := lease.Held(bg()); !held || err != nil {
		t.Fatalf("after stop: Held = %v, %v; stop must not release", held, err)
	}
	eventually(t, 15*time.Second, "the lock to expire once the watchdog stopped", func() bool {
		_, err := other.TryLock(bg(), "nightly", time.Minute)
		return err == nil
	})
}

// The watchdog ends with its context: the lock then expires.
func TestLease_KeepAliveEndsWithItsContext(t *testing.T) {
	b := realBackend(t)
	c := newTestClient(t, b.addr, "tl", nil)
	rdb := rawClient(t, b.addr)
	key := "tl/lock-mutex:" + HashID("nightly")
	lease, err := c.TryLock(bg(), "nightly", 100*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(bg())
	stop := lease.KeepAlive(ctx)
	cancel()
	eventually(t, 5*time.Second, "the lock to expire", func() bool { return rdb.Exists(bg(), key).Val() == 0 })
	stopped := make(chan struct{})
	go func() {
		stop()
		close(stopped)
	}()
	select {
	case <-stopped:
	case <-time.After(5 * time.Second):
		t.Fatal("stop still waits for a watchdog whose context ended")
	}
}

// A watchdog that finds the lease lost stops renewing: it never extends a
// lock that somebody else took, and stop returns at once.
func TestLease_KeepAliveStopsOnceTheLeaseIsLost(t *testing.T) {
	b := realBackend(t)
	c := newTestClient(t, b.addr, "tl", nil)
	rdb := rawClient(t, b.addr)
	key := "tl/lock-mutex:" + HashID("nightly")
	lease, err := c.TryLock(bg(), "nightly", 30*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	sub := rdb.Subscribe(bg(), key)
	defer sub.Close()
	if _, err := sub.Receive(bg()); err != nil {
		t.Fatal(err)
	}
	rdb.Del(bg(), key)
	stop := lease.KeepAlive(bg())
	defer stop()
	// Each renewal that finds the lease lost reports it on the key's
	// channel: one report, then the watchdog ends.
	first, cancelFirst := context.WithTimeout(bg(), 5*time.Second)
	defer cancelFirst()
	if _, err := sub.ReceiveMessage(first); err != nil {
		t.Fatalf("no renewal reported the loss: %v", err)
	}
	ctx, cancel := context.WithTimeout(bg(), 200*time.Millisecond) // over 6 renewal periods
	defer cancel()
	if m, err := sub.ReceiveMessage(ctx); err == nil {
		t.Errorf("the watchdog went on after the lease was lost: %q", m.Payload)
	}
}

func TestTryLock_AnyUTF8NameHashedToABoundedKey(t *testing.T) {
	b := miniBackend(t)
	c := newTestClient(t, b.addr, "tl", nil)
	for _, name := range []string{"nightly", "ночной отчёт", "🌙 job 🚀", strings.Repeat("名", 10<<10/3+1), "a\x00b", "tl/lock:x"} {
		lease, err := c.TryLock(bg(), name, time.Minute)
		if err != nil {
			t.Errorf("TryLock(%.20q) = %v", name, err)
			continue
		}
		key := "tl/lock-mutex:" + HashID(name)
		if got := b.mini.Keys(); !slices.Contains(got, key) {
			t.Errorf("TryLock(%.20q): keys %q, want %q", name, got, key)
		}
		if err := lease.Release(bg()); err != nil {
			t.Error(err)
		}
	}
}

// A Get for any id, even one that spells the lock's hash, has keys of its
// own: it neither waits on a lock nor blocks it.
func TestTryLock_KeysNeverMeetGetKeys(t *testing.T) {
	b := miniBackend(t)
	c := newTestClient(t, b.addr, "tl", nil)
	if _, err := c.TryLock(bg(), "nightly", time.Minute); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(bg(), 5*time.Second)
	defer cancel()
	for _, id := range []string{HashID("nightly"), "mutex:" + HashID("nightly"), "-mutex:" + HashID("nightly")} {
		if v, err := c.Get(ctx, id, func(context.Context, *Lease) ([]byte, time.Duration, error) {
			return []byte("v"), time.Minute, nil
		}); err != nil || string(v) != "v" {
			t.Errorf("Get(%q) = %q, %v", id, v, err)
		}
	}
}

func TestTryLock_RejectsBadInputWithoutCallingRedis(t *testing.T) {
	b := miniBackend(t)
	c := newTestClient(t, b.addr, "tl", nil)
	cancelled, cancel := context.WithCancel(bg())
	cancel()
	for _, tc := range []struct {
		what string
		ctx  context.Context
		name string
		ttl  time.Duration
		want []error
		says string
	}{
		{"empty name", bg(), "", time.Minute, []error{ErrInvalid}, "lock name is empty"},
		{"invalid UTF-8", bg(), "report-\xff\xfe", time.Minute, []error{ErrInvalid}, `"report-\xff\xfe" is not valid UTF-8`},
		{"long invalid UTF-8", bg(), strings.Repeat("x", 10<<10) + "\xff", time.Minute, []error{ErrInvalid}, `"... is not valid UTF-8`},
		{"zero TTL", bg(), "nightly", 0, []error{ErrInvalid}, "lock TTL 0s is under 1ms"},
		{"negative TTL", bg(), "nightly", -time.Second, []error{ErrInvalid}, "lock TTL -1s is under 1ms"},
		{"sub-millisecond TTL", bg(), "nightly", 500 * time.Microsecond, []error{ErrInvalid}, "lock TTL 500µs is under 1ms"},
		{"nil context", nil, "nightly", time.Minute, []error{ErrInvalid}, "context is nil"},
		{"cancelled context", cancelled, "nightly", time.Minute, []error{ErrTimeout, context.Canceled}, `lock "nightly"`},
	} {
		before := c.commands.n.Load()
		lease, err := c.TryLock(tc.ctx, tc.name, tc.ttl)
		if lease != nil || err == nil {
			t.Errorf("%s: TryLock = %v, %v", tc.what, lease, err)
			continue
		}
		for _, want := range tc.want {
			if !errors.Is(err, want) {
				t.Errorf("%s: %v, want %v", tc.what, err, want)
			}
		}
		if !strings.Contains(err.Error(), tc.says) || len(err.Error()) > 300 {
			t.Errorf("%s: %q, want a short message saying %q", tc.what, err, tc.says)
		}
		if n := c.commands.n.Load() - before; n != 0 {
			t.Errorf("%s: sent %d commands", tc.what, n)
		}
	}
	if keys := b.mini.Keys(); len(keys) != 0 {
		t.Errorf("bad input left keys %q", keys)
	}
}

func TestTryLock_TTLGoesToRedisInWholeMilliseconds(t *testing.T) {
	b := realBackend(t)
	c := newTestClient(t, b.addr, "tl", nil)
	rdb := rawClient(t, b.addr)
	lease, err := c.TryLock(bg(), "slow", time.Hour+999*time.Microsecond)
	if err != nil {
		t.Fatal(err)
	}
	if ttl := rdb.PTTL(bg(), "tl/lock-mutex:"+HashID("slow")).Val(); ttl > time.Hour || ttl < time.Hour-time.Minute {
		t.Errorf("PTTL = %v, want 1h", ttl)
	}
	_ = lease.Release(bg())
	if _, err := c.TryLock(bg(), "fast", 1900*time.Microsecond); err != nil {
		t.Fatalf("TryLock(1.9ms) = %v", err)
	}
	eventually(t, 5*time.Second, "a 1ms lock to expire", func() bool {
		_, err := c.TryLock(bg(), "fast", time.Minute)
		return err == nil
	})
}

func TestTryLock_NilAndClosedClients(t *testing.T) {
	b := miniBackend(t)
	var nilClient *Client
	if _, err := nilClient.TryLock(bg(), "nightly", time.Minute); !errors.Is(err, ErrInvalid) {
		t.Errorf("nil Client: %v, want ErrInvalid", err)
	}
	if _, err := (&Client{}).TryLock(bg(), "nightly", time.Minute); !errors.Is(err, ErrInvalid) {
		t.Errorf("zero Client: %v, want ErrInvalid", err)
	}
	c := newTestClient(t, b.addr, "tl", nil)
	lease, err := c.TryLock(bg(), "nightly", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := c.TryLock(bg(), "other", time.Minute); !errors.Is(err, ErrClosed) {
		t.Errorf("closed Client: %v, want ErrClosed", err)
	}
	// The lease outlives its Client: it needs only the redis client.
	if err := lease.Release(bg()); err != nil {
		t.Errorf("Release after Close: %v", err)
	}
	if b.mini.Exists("tl/lock-mutex:" + HashID("nightly")) {
		t.Error("Release after Close left the lock")
	}
}

// Release deletes only locks from TryLock: the lease a fetch gets guards a
// value that the Client stores and releases.
func TestLease_ReleaseRefusesLeasesNotFromTryLock(t *testing.T) {
	b := miniBackend(t)
	c := newTestClient(t, b.addr, "tl", nil)
	var nilLease *Lease
	if err := nilLease.Release(bg()); !errors.Is(err, ErrInvalid) {
		t.Errorf("nil lease: Release = %v, want ErrInvalid", err)
	}
	nilLease.KeepAlive(bg())() // nothing to do, nothing to leak
	_, err := c.Get(bg(), "k", func(ctx context.Context, lease *Lease) ([]byte, time.Duration, error) {
		if err := lease.Release(ctx); !errors.Is(err, ErrInvalid) {
			t.Errorf("fetch lease: Release = %v, want ErrInvalid", err)
		}
		lease.KeepAlive(ctx)()
		if held, err := lease.Held(ctx); !held || err != nil {
			t.Errorf("fetch lease after Release: Held = %v, %v", held, err)
		}
		return []byte("v"), time.Minute, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	lease, err := c.TryLock(bg(), "nightly", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	//lint:ignore SA1012 a nil context is what this checks
	if err := lease.Release(nil); !errors.Is(err, ErrInvalid) {
		t.Errorf("Release(nil) = %v, want ErrInvalid", err)
	}
	cancelled, cancel := context.WithCancel(bg())
	cancel()
	if err := lease.Release(cancelled); !errors.Is(err, ErrTimeout) || !errors.Is(err, context.Canceled) {
		t.Errorf("Release(cancelled) = %v, want ErrTimeout and context.Canceled", err)
	}
	if !b.mini.Exists("tl/lock-mutex:" + HashID("nightly")) {
		t.Error("a Release that failed deleted the lock")
	}
}

// go-redis retries a command whose reply was lost. The retried SET finds
// the lock holding the token the first attempt set: the lock is ours, not
// busy until it expires.
func TestTryLock_LostReplyRetriedByGoRedisIsOurs(t *testing.T) {
	b := realBackend(t)
	f := &redistest.Faults{}
	c := newTestClientOn(t, &redis.Options{Addr: b.addr, Dialer: f.Dial(b.addr)}, "tl", nil)
	f.DropReply("lock-mutex")
	lease, err := c.TryLock(bg(), "nightly", time.Minute)
	if err != nil {
		t.Fatalf("TryLock = %v; the lost reply's lock was ours", err)
	}
	if err := lease.Release(bg()); err != nil {
		t.Fatal(err)
	}
	if n := rawClient(t, b.addr).Exists(bg(), "tl/lock-mutex:"+HashID("nightly")).Val(); n != 0 {
		t.Error("lock still held after Release")
	}
}

// Redis down: TryLock and Release say so, wrapping ErrRedis; TryLock then
// fails at once while the Client's probe waits for Redis.
func TestTryLock_RedisDownIsErrRedis(t *testing.T) {
	b := realBackend(t)
	c := newTestClientOn(t, &redis.Options{Addr: b.addr, MaxRetries: -1, DialTimeout: 200 * time.Millisecond}, "tl", nil)
	lease, err := c.TryLock(bg(), "nightly", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	b.real.Kill()
	if _, err := c.TryLock(bg(), "other", time.Minute); !errors.Is(err, ErrRedis) || errors.Is(err, ErrBusy) {
		t.Errorf("TryLock with Redis down = %v, want ErrRedis", err)
	}
	if _, err := c.TryLock(bg(), "other", time.Minute); !engine.Unreachable(err) {
		t.Errorf("TryLock during a known outage = %v, want the outage's error at once", err)
	}
	if err := lease.Release(bg()); !errors.Is(err, ErrRedis) {
		t.Errorf("Release with Redis down = %v, want ErrRedis", err)
	}
	if err := lease.Renew(bg(), time.Minute); !errors.Is(err, ErrRedis) || errors.Is(err, ErrLeaseLost) {
		t.Errorf("Renew with Redis down = %v, want ErrRedis", err)
	}
}

// A nightly job on a Redis Cluster: every key a script touches must be in
// one slot, and Release names only the lock.
func TestLease_ReleaseOnACluster(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a cluster")
	}
	nodes := redistest.StartCluster(t, 3)
	rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{nodes[0].Addr}})
	t.Cleanup(func() { _ = rdb.Close() })
	c, err := New(rdb, "tl", nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	for i := range 5 { // names in several slots
		name := fmt.Sprint("job ", i)
		lease, err := c.TryLock(bg(), name, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.TryLock(bg(), name, time.Minute); !errors.Is(err, ErrBusy) {
			t.Errorf("%s: second TryLock = %v, want ErrBusy", name, err)
		}
		if err := lease.Renew(bg(), 2*time.Minute); err != nil {
			t.Error(err)
		}
		if err := lease.Release(bg()); err != nil {
			t.Error(err)
		}
		if _, err := c.TryLock(bg(), name, time.Minute); err != nil {
			t.Errorf("%s: TryLock after Release = %v", name, err)
		}
	}
}
