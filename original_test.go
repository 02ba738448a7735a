package memolock

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/memolock/memolock/internal/wire"
	"github.com/redis/go-redis/v9"
)

// These tests replay, with a raw client, the exact commands of the original
// redis-memolock peers (kristoff-it/redis-memolock, go/ and csharp/), and
// show what memolock does beside them. interop/PROTOCOL.md, "Original
// peers", describes the same cases.

// The original Go peer looks up with GET, then SET NX EX: two commands. One
// whose GET missed just before a memolock store, and whose SET NX lands just
// after it, must not win the lock and compute again.
func TestOriginalGoPeer_LookupAcrossOurStoreDoesNotComputeAgain(t *testing.T) {
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			c := newTestClient(t, b.addr, "orig", nil)
			raw := rawClient(t, b.addr)
			started, release := make(chan struct{}, 1), make(chan struct{})
			done := getAsync(c, bg(), "k", blockingFetch(started, release, "ours"))
			<-started

			// The original's GET misses while we compute...
			if err := raw.Get(bg(), "orig:k").Err(); !errors.Is(err, redis.Nil) {
				t.Fatalf("original's GET = %v, want a miss", err)
			}
			// ...our store runs...
			close(release)
			within(t, 5*time.Second, done, "ours", "memolock Get")
			// ...and then the original's SET NX arrives.
			won, err := raw.SetNX(bg(), "orig/lock:k", "0b1a6c1e-original-uuid", 10*time.Second).Result()
			if err != nil {
				t.Fatal(err)
			}
			if won {
				t.Fatal("the original peer won the lock after our store: it would compute the value again")
			}
			// It subscribes and reads the value again, as the original does:
			// the value is there.
			if v := raw.Get(bg(), "orig:k").Val(); v != "ours" {
				t.Fatalf("original's second GET = %q", v)
			}
		})
	}
}

// The lock's linger ends no later than the value, to the millisecond, after
// a store and after a Set. Redis 7.0 reckons each PX from the clock when
// its SET runs, so the scripts set the lock before the value: set after
// it, a lock could outlive the value by the millisecond the clock ticked
// between the two (seen in CI: value 499 ms left, lock 500); a release
// that lingers takes a millisecond off the value's PTTL for the same
// reason. The clock
// ticks between two SETs of one script about once in a few hundred, so
// the test makes a few thousand.
func TestStoreAndSet_LockNeverOutlivesTheValue(t *testing.T) {
	b := realBackend(t)
	c := newTestClient(t, b.addr, "outlive", nil)
	raw := rawClient(t, b.addr)
	check := func(how, id string) {
		t.Helper()
		pipe := raw.TxPipeline()
		value, lock := pipe.PTTL(bg(), "outlive:"+id), pipe.PTTL(bg(), "outlive/lock:"+id)
		if _, err := pipe.Exec(bg()); err != nil {
			t.Fatal(err)
		}
		// -2 is a key gone; the value is read first, so a lock that
		// expires no later than the value never reads as longer.
		if v, l := value.Val(), lock.Val(); l >= 0 && (v == -2 || l > v) {
			t.Fatalf("after %s of %s, the lock has %v left, the value %v", how, id, l, v)
		}
	}
	for i := range 2500 {
		id := fmt.Sprint("g", i)
		if _, err := c.Get(bg(), id, func(context.Context, *Lease) ([]byte, time.Duration, error) {
			return []byte("v"), 500 * time.Millisecond, nil
		}); err != nil {
			t.Fatal(err)
		}
		check("a store", id)
		id = fmt.Sprint("s", i)
		if err := c.Set(bg(), id, []byte("v"), 500*time.Millisecond); err != nil {
			t.Fatal(err)
		}
		check("a Set", id)
		// A release with a linger, as a winner in external mode makes
		// once the value has arrived: the lock lingers for the time the
		// value has left, read by PTTL in the same script.
		id = fmt.Sprint("r", i)
		if err := raw.Set(bg(), "outlive:"+id, "v", 500*time.Millisecond).Err(); err != nil {
			t.Fatal(err)
		}
		if err := raw.Set(bg(), "outlive/lock:"+id, "token", time.Minute).Err(); err != nil {
			t.Fatal(err)
		}
		if ok, err := c.proto.Release(bg(), id, "token", "", wire.LockLinger); err != nil || !ok {
			t.Fatalf("release of %s = %v, %v", id, ok, err)
		}
		check("a release", id)
	}
}

// The lock lingers no longer than the value, so that once the value is
// gone, anybody can compute it again at once.
func TestGet_LockLingersNoLongerThanTheValue(t *testing.T) {
	b := realBackend(t)
	c := newTestClient(t, b.addr, "short", nil)
	raw := rawClient(t, b.addr)
	v, err := c.Get(bg(), "k", func(context.Context, *Lease) ([]byte, time.Duration, error) {
		return []byte("brief"), 50 * time.Millisecond, nil
	})
	if err != nil || string(v) != "brief" {
		t.Fatalf("Get = %q, %v", v, err)
	}
	if ttl := raw.PTTL(bg(), "short/lock:k").Val(); ttl > 50*time.Millisecond {
		t.Errorf("lock lingers %v, longer than the value's 50ms", ttl)
	}
	eventually(t, 5*time.Second, "value and lock to expire", func() bool {
		return raw.Exists(bg(), "short:k", "short/lock:k").Val() == 0
	})
	var calls atomic.Int64
	if v, err := c.Get(bg(), "k", constFetch(&calls, "again", 0)); err != nil || string(v) != "again" || calls.Load() != 1 {
		t.Fatalf("Get after expiry = %q, %v, %d fetches", v, err, calls.Load())
	}
}

// The original Go peer's renewal sends nanoseconds to EXPIRE, so a renewed
// lock lives for centuries. memolock waiters wait for the value (or their
// deadline) without spinning, and wake when the original publishes.
func TestOriginalGoPeer_PinnedLockIsWaitedOnQuietly(t *testing.T) {
	b := realBackend(t)
	c := newTestClient(t, b.addr, "pin", &Options{LockTTL: 200 * time.Millisecond})
	raw := rawClient(t, b.addr)
	l := countLookups(c.rdb, "pin:k")
	raw.Set(bg(), "pin/lock:k", "0b1a6c1e-original-uuid", 0)
	raw.Do(bg(), "EXPIRE", "pin/lock:k", int64(10*time.Second)) // int(10s) as seconds: 317 years

	ctx, cancel := context.WithTimeout(bg(), time.Second)
	defer cancel()
	if _, err := c.Get(ctx, "k", noFetch); !errors.Is(err, ErrTimeout) {
		t.Fatalf("Get = %v, want ErrTimeout", err)
	}
	if n := l.n.Load(); n > 4 {
		t.Errorf("%d lookups in 1s while the lock is pinned: the waiter spins", n)
	}

	base := l.n.Load() // before the call: its first lookup may run at once
	got := getAsync(c, bg(), "k", noFetch)
	parkedAndLive(t, l, base+2)
	raw.Set(bg(), "pin:k", "from the original", 0)
	raw.Publish(bg(), "pin/notif:k", "from the original")
	within(t, 5*time.Second, got, "from the original", "waiter")
}

// The original C# peer as holder: GET; SET lock NX PX 60000; then, at once,
// SET value, DEL lock (unconditionally) and PUBLISH. memolock waiters get
// its value promptly and compute nothing.
func TestOriginalCSharpPeer_AsHolder(t *testing.T) {
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			c := newTestClient(t, b.addr, "cs", nil)
			raw := rawClient(t, b.addr)
			l := countLookups(c.rdb, "cs:k")
			if err := raw.Get(bg(), "cs:k").Err(); !errors.Is(err, redis.Nil) {
				t.Fatal(err)
			}
			if !raw.SetNX(bg(), "cs/lock:k", "8d3e0f0a-csharp-guid", time.Minute).Val() {
				t.Fatal("C# peer did not get the lock")
			}
			got := getAsync(c, bg(), "k", noFetch)
			parkedAndLive(t, l, 2)
			if _, err := raw.Pipelined(bg(), func(p redis.Pipeliner) error {
				p.Set(bg(), "cs:k", "from C#", 0)
				p.Del(bg(), "cs/lock:k")
				p.Publish(bg(), "cs/notif:k", "from C#")
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			within(t, 5*time.Second, got, "from C#", "memolock waiter")
		})
	}
}

// The original C# peer leaves its lock when its function throws. memolock
// waiters see no event and take over when that lock expires.
func TestOriginalCSharpPeer_FailedHolderIsTakenOverAtLockExpiry(t *testing.T) {
	b := realBackend(t)
	c := newTestClient(t, b.addr, "csf", nil)
	raw := rawClient(t, b.addr)
	// Before the lock is set: the lock cannot expire sooner than 300ms
	// after t0, however long this goroutine waits between the two.
	t0 := time.Now()
	raw.SetNX(bg(), "csf/lock:k", "8d3e0f0a-csharp-guid", 300*time.Millisecond)
	var calls atomic.Int64
	v, err := c.Get(bg(), "k", constFetch(&calls, "taken over", 0))
	if err != nil || string(v) != "taken over" || calls.Load() != 1 {
		t.Fatalf("Get = %q, %v, %d fetches", v, err, calls.Load())
	}
	if d := time.Since(t0); d < 250*time.Millisecond {
		t.Errorf("took over after %v, before the C# lock expired", d)
	}
}

// The original C# peer as waiter: PSUBSCRIBE T/notif:* (at start-up), GET,
// SET NX fails, wait. It gets memolock's value, byte for byte, on its
// pattern subscription.
func TestOriginalCSharpPeer_AsWaiter(t *testing.T) {
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			c := newTestClient(t, b.addr, "csw", nil)
			raw := rawClient(t, b.addr)
			ps := raw.PSubscribe(bg(), "csw/notif:*")
			defer ps.Close()
			if _, err := ps.Receive(bg()); err != nil {
				t.Fatal(err)
			}
			value := "bin\x00\xff\r\n" + string(make([]byte, 1<<20))
			started, release := make(chan struct{}, 1), make(chan struct{})
			done := getAsync(c, bg(), "k", blockingFetch(started, release, value))
			<-started
			if err := raw.Get(bg(), "csw:k").Err(); !errors.Is(err, redis.Nil) {
				t.Fatal(err)
			}
			if raw.SetNX(bg(), "csw/lock:k", "8d3e0f0a-csharp-guid", time.Minute).Val() {
				t.Fatal("C# peer took a lock memolock holds")
			}
			close(release)
			ctx, cancel := context.WithTimeout(bg(), 5*time.Second)
			defer cancel()
			m, err := ps.ReceiveMessage(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if m.Channel != "csw/notif:k" || m.Pattern != "csw/notif:*" || m.Payload != value {
				t.Fatalf("C# peer got %q on %q (pattern %q), %d bytes", m.Payload[:min(len(m.Payload), 10)], m.Channel, m.Pattern, len(m.Payload))
			}
			within(t, 5*time.Second, done, value, "memolock Get")
		})
	}
}

// Original waiters read only T/notif:I. When a memolock holder fails, they
// see nothing: they wait for their own timeout or the next value.
func TestOriginalWaiter_SeesNothingWhenAMemolockHolderFails(t *testing.T) {
	b := realBackend(t)
	c := newTestClient(t, b.addr, "of", nil)
	raw := rawClient(t, b.addr)
	ps := raw.PSubscribe(bg(), "of/notif:*")
	defer ps.Close()
	if _, err := ps.Receive(bg()); err != nil {
		t.Fatal(err)
	}
	_, err := c.Get(bg(), "k", func(context.Context, *Lease) ([]byte, time.Duration, error) {
		return nil, 0, errors.New("backend down")
	})
	if err == nil {
		t.Fatal("Get succeeded")
	}
	if n := raw.Exists(bg(), "of/lock:k").Val(); n != 0 {
		t.Error("the failed holder's lock is still there: an original peer could not compute")
	}
	ctx, cancel := context.WithTimeout(bg(), 300*time.Millisecond)
	defer cancel()
	if m, err := ps.ReceiveMessage(ctx); err == nil {
		t.Fatalf("original waiter got %q on %q", m.Payload, m.Channel)
	}
}

// A value deleted (an invalidation of the value alone, an eviction) while
// its lock lingers as done is computed again at once: a done lock guards
// nothing once its value is gone.
func TestGet_DoneLockWithoutItsValueIsTakenOverAtOnce(t *testing.T) {
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			c := newTestClient(t, b.addr, "gone", nil)
			raw := rawClient(t, b.addr)
			var calls atomic.Int64
			if _, err := c.Get(bg(), "k", constFetch(&calls, "first", 0)); err != nil {
				t.Fatal(err)
			}
			raw.Del(bg(), "gone:k")
			other := newTestClient(t, b.addr, "gone", nil)
			ctx, cancel := context.WithTimeout(bg(), 5*time.Second) // miniredis never expires the lock
			defer cancel()
			v, err := other.Get(ctx, "k", constFetch(&calls, "second", 0))
			if err != nil || string(v) != "second" {
				t.Fatalf("Get = %q, %v", v, err)
			}
			if s := other.Stats(); s.Waits != 0 {
				t.Errorf("the second client waited on the done lock (%+v)", s)
			}
			lockDone(t, raw, "gone/lock:k")
		})
	}
}

// The external winner's done lock lingers no longer than the value the
// producer stored, and not at all if that value is already gone.
func TestGetExternal_DoneLockLingersNoLongerThanTheValue(t *testing.T) {
	b := realBackend(t)
	c := newTestClient(t, b.addr, "extv", nil)
	raw := rawClient(t, b.addr)
	v, err := c.GetExternal(bg(), "k", func(ctx context.Context, l *Lease) error {
		go func() {
			raw.Set(bg(), "extv:k", "brief", 100*time.Millisecond)
			raw.Publish(bg(), "extv/notif:k", "brief")
		}()
		return nil
	})
	if err != nil || string(v) != "brief" {
		t.Fatalf("GetExternal = %q, %v", v, err)
	}
	// Released before the callers get the value.
	if v := raw.Get(bg(), "extv/lock:k").Val(); v != "" && !strings.HasPrefix(v, "done:") {
		t.Fatalf("the winner still holds its lock (%q) after its caller got the value", v)
	}
	if ttl := raw.PTTL(bg(), "extv/lock:k").Val(); ttl > 100*time.Millisecond {
		t.Errorf("done lock lingers %v, longer than the value's 100ms", ttl)
	}
}

// A peer that sends a linger of 0 to the store script gets a deleted lock,
// not an error after the value was written.
func TestStoreScript_ZeroLingerDeletesTheLock(t *testing.T) {
	b := realBackend(t)
	raw := rawClient(t, b.addr)
	raw.Set(bg(), "z/lock:k", "tok", time.Minute)
	n, err := raw.Eval(bg(), wire.StoreSrc, []string{"z:k", "z/lock:k", "z/lock-notfound:k", "z/lock-stale:k"}, "tok", "v", "0", "z/notif:k", "z/lock-event:k", "0").Int()
	if err != nil || n != 1 {
		t.Fatalf("store = %d, %v", n, err)
	}
	if raw.Exists(bg(), "z/lock:k").Val() != 0 || raw.Get(bg(), "z:k").Val() != "v" {
		t.Error("want the value stored and the lock deleted")
	}
}
