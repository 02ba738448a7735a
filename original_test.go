package memolock

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/memolock/memolock/internal/redistest"
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
// a store, a Set and a release that lingers. Redis 7.0 reckons each PX from
// the clock when its SET runs, so a lock set after the value with a
// relative PX could outlive it by the millisecond the clock ticked between
// the two (seen in CI: value 499 ms left, lock 500); the scripts compare
// the two PTTLs afterwards and cut or delete such a lock. The clock
// ticks between two SETs of one script about once in a few hundred, so the
// test makes a few thousand. (A stall inside a script: the next test.)
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

// However long Redis stalls inside a script, the lingering lock still ends
// no later than the value: the server is frozen (SIGSTOP) for 3 ms at a
// time while pipelines of stores, Sets and releases run, so that some
// freezes land between a script's two writes, and every expiry is then
// read as an absolute time (PEXPIRETIME, Redis 7.0), which no freeze
// during the read can skew. A lock given a relative linger after the
// value, or a release lingering for the value's PTTL less 1 ms, outlives
// the value here by the freeze.
func TestLingeringLock_NeverOutlivesTheValueThroughStalls(t *testing.T) {
	s := redistest.Start(t)
	raw := rawClient(t, s.Addr)
	sc := wire.ScriptsFor(false)
	for _, script := range []*redis.Script{sc.Store, sc.Set, sc.Release} {
		if err := script.Load(bg(), raw).Err(); err != nil {
			t.Fatal(err)
		}
	}
	stop, frozen := make(chan struct{}), make(chan error, 1)
	go func() {
		var err error
		for err == nil {
			select {
			case <-stop:
				frozen <- nil
				return
			case <-time.After(time.Millisecond):
			}
			err = s.Freeze(3 * time.Millisecond)
		}
		<-stop
		frozen <- err
	}()
	defer func() {
		close(stop)
		if err := <-frozen; err != nil {
			t.Error(err)
		}
	}()
	const ids, rounds = 40, 400
	ms := func(d time.Duration) int64 { // -1 and -2 come as they are
		if d < 0 {
			return int64(d)
		}
		return d.Milliseconds()
	}
	keys := func(how string, i int) []string {
		id := fmt.Sprint(how, i)
		return []string{"stall:" + id, "stall/lock:" + id, "stall/nf:" + id, "stall/stale:" + id}
	}
	for round := range rounds {
		token := fmt.Sprint("token", round)
		pipe := raw.Pipeline()
		for i := range ids {
			k := keys("store", i)
			pipe.Set(bg(), k[1], token, time.Minute)
			sc.Store.EvalSha(bg(), pipe, k, token, "v", 500, "ch", "ev", 1000)
			k = keys("set", i)
			sc.Set.EvalSha(bg(), pipe, k, token, "v", 500, "ch", 1000, 0)
			k = keys("release", i)
			pipe.Set(bg(), k[0], "v", 500*time.Millisecond)
			pipe.Set(bg(), k[1], token, time.Minute)
			sc.Release.EvalSha(bg(), pipe, []string{k[1], k[0]}, token, "ev", "", 1000)
		}
		if _, err := pipe.Exec(bg()); err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		pipe = raw.Pipeline()
		type read struct {
			name        string
			value, lock *redis.DurationCmd
		}
		var reads []read
		for _, how := range []string{"store", "set", "release"} {
			for i := range ids {
				k := keys(how, i)
				reads = append(reads, read{k[0], pipe.PExpireTime(bg(), k[0]), pipe.PExpireTime(bg(), k[1])})
			}
		}
		if _, err := pipe.Exec(bg()); err != nil {
			t.Fatalf("round %d, reading: %v", round, err)
		}
		for _, r := range reads {
			// -2: no key. The value expires at v, the lock at l (ms since
			// the epoch); a lock on a value that is gone must be gone too.
			v, l := r.value.Val(), r.lock.Val()
			if l == -1 || (l >= 0 && (v < 0 || l > v)) {
				t.Fatalf("round %d: the lock of %s expires at %d, the value at %d (ms since the epoch; -1 never, -2 gone)",
					round, r.name, ms(l), ms(v))
			}
		}
	}
}

// A stall as long as the value's whole TTL, right after the lock's SET,
// leaves both keys expired but still there inside the script, and PTTL reads
// 0 for both, never less: the lock, set after the value, may expire a
// millisecond later, so it must go with the value. Redis frees a key's old
// contents when a SET replaces them, after reckoning the new expiry: a lock
// key holding a large set stalls the script right after the lock's SET
// (a few ms here), and a value key holding a smaller one makes the clock
// tick between the value's SET and the lock's. The TTLs sweep the range
// the stall covers.
func TestSet_LockGoesWithAValueThatExpiredDuringTheScript(t *testing.T) {
	s := redistest.Start(t)
	raw := rawClient(t, s.Addr)
	sc := wire.ScriptsFor(false)
	if err := sc.Set.Load(bg(), raw).Err(); err != nil {
		t.Fatal(err)
	}
	fill := func(key string, n int) {
		members := make([]any, n)
		for i := range members {
			members[i] = i
		}
		for i := 0; i < n; i += 10000 {
			if err := raw.SAdd(bg(), key, members[i:min(i+10000, n)]...).Err(); err != nil {
				t.Fatal(err)
			}
		}
	}
	fill("big:lock", 200000)
	fill("big:value", 30000)
	keys := []string{"gone:k", "gone/lock:k", "gone/nf:k", "gone/stale:k"}
	for round := range 3 {
		for ttl := 1; ttl <= 20; ttl++ {
			pipe := raw.Pipeline()
			pipe.Copy(bg(), "big:value", keys[0], 0, true)
			pipe.Copy(bg(), "big:lock", keys[1], 0, true)
			set := sc.Set.EvalSha(bg(), pipe, keys, "token", "v", ttl, "gone/notif:k", 1000, 0)
			value, lock := pipe.Exists(bg(), keys[0]), pipe.Exists(bg(), keys[1])
			if _, err := pipe.Exec(bg()); err != nil {
				t.Fatalf("round %d, TTL %d ms: %v", round, ttl, err)
			}
			if set.Err() != nil {
				t.Fatal(set.Err())
			}
			if value.Val() == 0 && lock.Val() == 1 {
				t.Fatalf("round %d, TTL %d ms: the value is gone, its lock is still there", round, ttl)
			}
		}
	}
}

// A store or a Set whose TTL Redis refuses (peers never send one: [C3])
// fails before it writes anything, as a script does not roll back: the
// value's SET, which can refuse the TTL, runs before any other write. The lock keeps
// the holder's token, so that its waiters are not left with a done lock
// and no value.
func TestStoreAndSet_RefusedTTLWritesNothing(t *testing.T) {
	b := realBackend(t)
	raw := rawClient(t, b.addr)
	sc := wire.ScriptsFor(false)
	sub := raw.Subscribe(bg(), "refused/notif:k")
	defer sub.Close()
	if _, err := sub.ReceiveTimeout(bg(), 5*time.Second); err != nil {
		t.Fatal(err)
	}
	keys := []string{"refused:k", "refused/lock:k", "refused/nf:k", "refused/stale:k"}
	for _, ttl := range []any{-1, "1e17", "1.5", "x"} {
		if err := raw.Set(bg(), keys[1], "token", time.Minute).Err(); err != nil {
			t.Fatal(err)
		}
		if err := sc.Store.Run(bg(), raw, keys, "token", "v", ttl, "refused/notif:k", "ev", 1000).Err(); err == nil {
			t.Errorf("store with TTL %v: no error", ttl)
		}
		if err := sc.Set.Run(bg(), raw, keys, "other", "v", ttl, "refused/notif:k", 1000, 0).Err(); err == nil {
			t.Errorf("Set with TTL %v: no error", ttl)
		}
		if n := raw.Exists(bg(), keys[0]).Val(); n != 0 {
			t.Errorf("after a store and a Set with TTL %v, the value is there", ttl)
		}
		if h := raw.Get(bg(), keys[1]).Val(); h != "token" {
			t.Errorf("after a store and a Set with TTL %v, the lock holds %q, not the holder's token", ttl, h)
		}
	}
	// Nothing was published: a PING's reply is the first message.
	if err := sub.Ping(bg()); err != nil {
		t.Fatal(err)
	}
	if msg, err := sub.ReceiveTimeout(bg(), 5*time.Second); err != nil {
		t.Fatal(err)
	} else if _, pong := msg.(*redis.Pong); !pong {
		t.Errorf("published %v", msg)
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
