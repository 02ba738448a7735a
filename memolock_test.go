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
)

func TestGet_HitReturnsStoredValue(t *testing.T) {
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			c := newTestClient(t, b.addr, "likes", nil)
			if err := c.rdb.Set(bg(), "likes:kristoff", "42", 0).Err(); err != nil {
				t.Fatal(err)
			}
			v, err := c.Get(bg(), "kristoff", func(context.Context, *Lease) ([]byte, time.Duration, error) {
				t.Error("fetch called on a hit")
				return nil, 0, nil
			})
			if err != nil || string(v) != "42" {
				t.Fatalf("Get = %q, %v; want 42", v, err)
			}
			if n := c.Stats().PubSubCommands(); n != 0 {
				t.Errorf("a hit sent %d pub/sub commands; a client that only hits needs no subscription", n)
			}
		})
	}
}

func TestGet_MissStoresValueWithTTLAndLeavesLockDone(t *testing.T) {
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			c := newTestClient(t, b.addr, "likes", nil)
			var calls atomic.Int64
			v, err := c.Get(bg(), "kristoff", constFetch(&calls, "99", 0))
			if err != nil || string(v) != "99" {
				t.Fatalf("Get = %q, %v", v, err)
			}
			if got := c.rdb.Get(bg(), "likes:kristoff").Val(); got != "99" {
				t.Errorf("stored value = %q, want 99", got)
			}
			if ttl := c.rdb.PTTL(bg(), "likes:kristoff").Val(); ttl <= 0 || ttl > time.Minute {
				t.Errorf("value TTL = %v, want (0, 1m]", ttl)
			}
			lockDone(t, c.rdb, "likes/lock:kristoff")
			// The next call is a hit.
			if v, err := c.Get(bg(), "kristoff", constFetch(&calls, "other", 0)); err != nil || string(v) != "99" {
				t.Fatalf("second Get = %q, %v", v, err)
			}
			if calls.Load() != 1 {
				t.Errorf("fetch ran %d times, want 1", calls.Load())
			}
		})
	}
}

func TestGet_ZeroTTLStoresWithoutExpiry(t *testing.T) {
	b := miniBackend(t)
	c := newTestClient(t, b.addr, "t", nil)
	_, err := c.Get(bg(), "k", func(context.Context, *Lease) ([]byte, time.Duration, error) {
		return []byte("v"), 0, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if ttl := b.mini.TTL("t:k"); ttl != 0 {
		t.Errorf("TTL = %v, want none", ttl)
	}
}

func TestGet_StampedeAcrossClientsFetchesOnce(t *testing.T) {
	const clients, goroutines = 8, 200
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			var calls atomic.Int64
			var wg sync.WaitGroup
			errs := make(chan error, clients*goroutines)
			start := make(chan struct{})
			for i := range clients {
				c := newTestClient(t, b.addr, "stampede", &Options{LockTTL: 30 * time.Second})
				for range goroutines {
					wg.Add(1)
					go func() {
						defer wg.Done()
						<-start
						v, err := c.Get(bg(), "hot", constFetch(&calls, "value", 50*time.Millisecond))
						if err == nil && string(v) != "value" {
							err = fmt.Errorf("client %d got %q", i, v)
						}
						if err != nil {
							errs <- err
						}
					}()
				}
			}
			close(start)
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Error(err)
			}
			if n := calls.Load(); n != 1 {
				t.Errorf("fetch ran %d times across %d clients, want 1", n, clients)
			}
		})
	}
}

func TestGet_InProcessStampedeCostsAFewCommands(t *testing.T) {
	b := realBackend(t)
	c := newTestClient(t, b.addr, "herd", nil)
	// Load the scripts first, as a warm client has.
	if _, err := c.Get(bg(), "warm", constFetch(new(atomic.Int64), "w", 0)); err != nil {
		t.Fatal(err)
	}
	before := c.commands.n.Load()
	calls := stampede(t, c, "hot", 10000)
	if n := c.commands.n.Load() - before; n > 5 {
		t.Errorf("10,000 callers cost %d commands, want <= 5", n)
	}
	if calls != 1 {
		t.Errorf("fetch ran %d times", calls)
	}
}

func TestGet_WaiterCatchesValuePublishedBeforeItsSubscription(t *testing.T) {
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			raw := rawClient(t, b.addr)
			if err := raw.Set(bg(), "race/lock:k", "other-holder", 30*time.Second).Err(); err != nil {
				t.Fatal(err)
			}
			// OnWait runs after the miss and before the subscription: the
			// holder finishes exactly in that window, so the notification
			// is gone before the waiter listens.
			opts := &Options{LockTTL: 30 * time.Second, OnWait: func(id, holder string) {
				raw.Set(bg(), "race:k", "early", 0)
				raw.Del(bg(), "race/lock:k")
				raw.Publish(bg(), "race/notif:k", "early")
			}}
			c := newTestClient(t, b.addr, "race", opts)
			ctx, cancel := context.WithTimeout(bg(), 5*time.Second)
			defer cancel()
			v, err := c.Get(ctx, "k", func(context.Context, *Lease) ([]byte, time.Duration, error) {
				return nil, 0, errors.New("fetch must not run")
			})
			if err != nil || string(v) != "early" {
				t.Fatalf("Get = %q, %v; want the early value well before the 30s lock TTL", v, err)
			}
		})
	}
}

func TestGet_WaiterWokenByRawSetAndPublish(t *testing.T) {
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			raw := rawClient(t, b.addr)
			raw.Set(bg(), "ext/lock:k", "external", 30*time.Second)
			c := newTestClient(t, b.addr, "ext", nil)
			got := make(chan string, 1)
			go func() {
				v, err := c.Get(bg(), "k", func(context.Context, *Lease) ([]byte, time.Duration, error) {
					return nil, 0, errors.New("fetch must not run")
				})
				if err != nil {
					got <- "error: " + err.Error()
					return
				}
				got <- string(v)
			}()
			eventually(t, 5*time.Second, "the waiter to subscribe", func() bool {
				return raw.PubSubNumSub(bg(), "ext/notif:k").Val()["ext/notif:k"] == 1
			})
			raw.Set(bg(), "ext:k", "from outside", 0)
			raw.Publish(bg(), "ext/notif:k", "from outside")
			select {
			case v := <-got:
				if v != "from outside" {
					t.Fatalf("Get = %q", v)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("waiter not woken by a raw PUBLISH")
			}
			eventually(t, 5*time.Second, "the waiter to unsubscribe", func() bool {
				return raw.PubSubNumSub(bg(), "ext/notif:k").Val()["ext/notif:k"] == 0
			})
		})
	}
}

func TestGet_RawSubscriberReceivesValueAsPlainBytes(t *testing.T) {
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			raw := rawClient(t, b.addr)
			ps := raw.Subscribe(bg(), "plain/notif:k")
			defer ps.Close()
			if _, err := ps.Receive(bg()); err != nil { // the subscribe ack
				t.Fatal(err)
			}
			c := newTestClient(t, b.addr, "plain", nil)
			value := []byte{0, 1, 2, 0xff, 'x', '\n'}
			if _, err := c.Get(bg(), "k", func(context.Context, *Lease) ([]byte, time.Duration, error) {
				return value, time.Minute, nil
			}); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(bg(), 5*time.Second)
			defer cancel()
			msg, err := ps.ReceiveMessage(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if msg.Payload != string(value) {
				t.Fatalf("payload = %q, want %q", msg.Payload, value)
			}
		})
	}
}

// nilPointerError's methods dereference their receiver, as most do: a nil
// *nilPointerError returned as an error panics in Error and Is.
type nilPointerError struct{ code int }

func (e *nilPointerError) Error() string        { return fmt.Sprint("code ", e.code) }
func (e *nilPointerError) Is(target error) bool { return e.code == 1 && target == nil }

func TestGet_FetchErrorReachesWaitersPromptlyAndStoresNothing(t *testing.T) {
	cases := []struct {
		name    string
		fetch   func() ([]byte, time.Duration, error)
		holder  error // what the holder's own callers match
		message string
	}{
		{"error", func() ([]byte, time.Duration, error) { return nil, 0, errors.New("database down") }, nil, "database down"},
		{"panic", func() ([]byte, time.Duration, error) { panic("boom") }, ErrFetchPanicked, "boom"},
		// Its methods would panic on the engine's goroutines, and kill the
		// process, were it passed on as it is.
		{"error whose methods panic", func() ([]byte, time.Duration, error) { return nil, 0, (*nilPointerError)(nil) }, ErrFetchPanicked, "*memolock.nilPointerError"},
	}
	for _, b := range backends(t) {
		for _, tc := range cases {
			t.Run(b.name+"/"+tc.name, func(t *testing.T) {
				opts := &Options{LockTTL: 30 * time.Second}
				holder := newTestClient(t, b.addr, "fail", opts)
				waiter := newTestClient(t, b.addr, "fail", opts)
				looks := countLookups(waiter.rdb, "fail:k")
				raw := rawClient(t, b.addr)

				started, release := make(chan struct{}, 1), make(chan struct{})
				holderErr := make(chan error, 1)
				go func() {
					_, err := holder.Get(bg(), "k", func(ctx context.Context, _ *Lease) ([]byte, time.Duration, error) {
						started <- struct{}{}
						<-release
						return tc.fetch()
					})
					holderErr <- err
				}()
				<-started
				const waiters = 20
				errs := make(chan error, waiters)
				for range waiters {
					go func() {
						_, err := waiter.Get(bg(), "k", func(context.Context, *Lease) ([]byte, time.Duration, error) {
							return nil, 0, errors.New("a waiter must not fetch")
						})
						errs <- err
					}()
				}
				parkedAndLive(t, looks, 2)
				// Every waiter in the flight before the failure: one that
				// began after its flight had the answer would look afresh
				// (see group.seal), find the lock gone, and fetch.
				eventually(t, 5*time.Second, "every waiter to join the flight", func() bool { return waiter.Stats().Coalesced == waiters-1 })
				t0 := time.Now()
				close(release)

				err := <-holderErr
				if err == nil || !strings.Contains(err.Error(), tc.message) || (tc.holder != nil && !errors.Is(err, tc.holder)) {
					t.Errorf("holder's caller got %v", err)
				}
				for range waiters {
					select {
					case err := <-errs:
						if !errors.Is(err, ErrHolderFailed) || !strings.Contains(err.Error(), tc.message) {
							t.Errorf("waiter got %v, want ErrHolderFailed with %q", err, tc.message)
						}
					case <-time.After(5 * time.Second):
						t.Fatal("waiter not told of the failure promptly (lock TTL is 30s)")
					}
				}
				if d := time.Since(t0); d > 5*time.Second {
					t.Errorf("waiters took %v", d)
				}
				if n := raw.Exists(bg(), "fail:k", "fail/lock:k").Val(); n != 0 {
					t.Errorf("value or lock left in Redis after a failed fetch")
				}
			})
		}
	}
}

func TestGet_NewCallersAfterFailureStartANewAttempt(t *testing.T) {
	b := miniBackend(t)
	c := newTestClient(t, b.addr, "retry", nil)
	if _, err := c.Get(bg(), "k", func(context.Context, *Lease) ([]byte, time.Duration, error) {
		return nil, 0, errors.New("first fails")
	}); err == nil {
		t.Fatal("want the first error")
	}
	v, err := c.Get(bg(), "k", func(context.Context, *Lease) ([]byte, time.Duration, error) {
		return []byte("second"), time.Minute, nil
	})
	if err != nil || string(v) != "second" {
		t.Fatalf("Get = %q, %v", v, err)
	}
}

func TestGet_CancelledCallerLeavesOthersTheValue(t *testing.T) {
	b := miniBackend(t)
	c := newTestClient(t, b.addr, "cancel", nil)
	started, release := make(chan struct{}, 1), make(chan struct{})
	fetch := blockingFetch(started, release, "shared")

	ctx, cancel := context.WithCancel(bg())
	cancelled := make(chan error, 1)
	go func() {
		_, err := c.Get(ctx, "k", fetch)
		cancelled <- err
	}()
	<-started
	var wg sync.WaitGroup
	results := make(chan string, 10)
	for range 10 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			v, err := c.Get(bg(), "k", fetch)
			if err != nil {
				results <- err.Error()
				return
			}
			results <- string(v)
		}()
	}
	eventually(t, 5*time.Second, "callers to join", func() bool { return c.Stats().Coalesced == 10 })
	cancel()
	select {
	case err := <-cancelled:
		if !errors.Is(err, ErrTimeout) || !errors.Is(err, context.Canceled) {
			t.Fatalf("cancelled caller got %v, want ErrTimeout and context.Canceled", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("cancelled caller did not return at once")
	}
	close(release)
	wg.Wait()
	close(results)
	for v := range results {
		if v != "shared" {
			t.Errorf("joined caller got %q", v)
		}
	}
}

func TestGet_DeadlineErrorMatchesErrTimeoutAndDeadlineExceeded(t *testing.T) {
	b := miniBackend(t)
	raw := rawClient(t, b.addr)
	raw.Set(bg(), "dl/lock:k", "someone", time.Minute)
	c := newTestClient(t, b.addr, "dl", nil)
	ctx, cancel := context.WithTimeout(bg(), 50*time.Millisecond)
	defer cancel()
	_, err := c.Get(ctx, "k", constFetch(new(atomic.Int64), "v", 0))
	if !errors.Is(err, ErrTimeout) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("got %v", err)
	}
	// The abandoned flight unsubscribes.
	eventually(t, 5*time.Second, "unsubscribe", func() bool {
		return len(b.mini.PubSubChannels("dl/*")) == 0
	})
}

func TestClose_WakesThousandParkedWaiters(t *testing.T) {
	b := miniBackend(t)
	raw := rawClient(t, b.addr)
	const keys, perKey = 100, 10
	for i := range keys {
		raw.Set(bg(), fmt.Sprintf("park/lock:%d", i), "someone-else", time.Minute)
	}
	c := newTestClient(t, b.addr, "park", nil)
	errs := make(chan error, keys*perKey)
	for i := range keys {
		for range perKey {
			go func() {
				_, err := c.Get(bg(), fmt.Sprint(i), constFetch(new(atomic.Int64), "v", 0))
				errs <- err
			}()
		}
	}
	eventually(t, 10*time.Second, "1,000 waiters to park", func() bool {
		s := c.Stats()
		return s.Waits == keys && s.Coalesced == keys*(perKey-1)
	})
	done := make(chan struct{})
	go func() {
		_ = c.Close()
		_ = c.Close() // idempotent
		close(done)
	}()
	for range keys * perKey {
		select {
		case err := <-errs:
			if !errors.Is(err, ErrClosed) {
				t.Fatalf("waiter got %v, want ErrClosed", err)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("a waiter was not released by Close")
		}
	}
	<-done
	if _, err := c.Get(bg(), "after", constFetch(new(atomic.Int64), "v", 0)); !errors.Is(err, ErrClosed) {
		t.Fatalf("Get after Close = %v, want ErrClosed", err)
	}
}

func TestClose_ReleasesHeldLockSoWaitersElsewhereTakeOver(t *testing.T) {
	b := miniBackend(t)
	opts := &Options{LockTTL: time.Minute}
	holder := newTestClient(t, b.addr, "handover", opts)
	other := newTestClient(t, b.addr, "handover", opts)
	started := make(chan struct{}, 1)
	go func() { _, _ = holder.Get(bg(), "k", blockingFetch(started, nil, "never")) }()
	<-started
	got := make(chan string, 1)
	go func() {
		v, err := other.Get(bg(), "k", constFetch(new(atomic.Int64), "taken over", 0))
		if err != nil {
			got <- err.Error()
		}
		got <- string(v)
	}()
	waitersLive(t, "handover/notif:k", other)
	if err := holder.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case v := <-got:
		if v != "taken over" {
			t.Fatalf("got %q", v)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no takeover after the holder closed (lock TTL is 1m)")
	}
}

func TestGet_LeaseLostStoresNothing(t *testing.T) {
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			c := newTestClient(t, b.addr, "lease", nil)
			raw := rawClient(t, b.addr)
			v, err := c.Get(bg(), "k", func(ctx context.Context, l *Lease) ([]byte, time.Duration, error) {
				raw.Del(bg(), "lease/lock:k") // an invalidation deletes the lock
				if held, err := l.Held(ctx); held || err != nil {
					t.Errorf("Held = %v, %v after the lock was deleted", held, err)
				}
				if err := l.Extend(ctx, time.Second); !errors.Is(err, ErrLeaseLost) {
					t.Errorf("Extend = %v, want ErrLeaseLost", err)
				}
				return []byte("stale"), time.Minute, nil
			})
			if err != nil || string(v) != "stale" {
				t.Fatalf("Get = %q, %v; the caller still gets its value", v, err)
			}
			if n := raw.Exists(bg(), "lease:k").Val(); n != 0 {
				t.Fatal("a value was stored after the lease was lost")
			}
			if c.Stats().LeaseLost != 1 {
				t.Errorf("LeaseLost = %d", c.Stats().LeaseLost)
			}
		})
	}
}

func TestGet_LeaseLostToNewHolderKeepsItsValue(t *testing.T) {
	b := miniBackend(t)
	c := newTestClient(t, b.addr, "lease2", nil)
	raw := rawClient(t, b.addr)
	_, err := c.Get(bg(), "k", func(ctx context.Context, l *Lease) ([]byte, time.Duration, error) {
		raw.Set(bg(), "lease2/lock:k", "newer-holder", time.Minute)
		return []byte("old"), time.Minute, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if v := raw.Get(bg(), "lease2/lock:k").Val(); v != "newer-holder" {
		t.Fatalf("the newer holder's lock was touched: %q", v)
	}
	if raw.Exists(bg(), "lease2:k").Val() != 0 {
		t.Fatal("stale value stored over a newer holder's lock")
	}
}

func TestLease_TokenIsRandomAndNamesHolder(t *testing.T) {
	b := miniBackend(t)
	c := newTestClient(t, b.addr, "tok", nil)
	seen := map[string]bool{}
	for i := range 3 {
		_, err := c.Get(bg(), fmt.Sprint(i), func(ctx context.Context, l *Lease) ([]byte, time.Duration, error) {
			tok := l.Token()
			hexPart, holder, ok := strings.Cut(tok, "@")
			if !ok || len(hexPart) != 32 || !strings.Contains(holder, ":") {
				t.Errorf("token %q: want 32 hex chars (128 bits) then @host:pid", tok)
			}
			if s, _ := b.mini.Get(c.keys.Lock(l.ID())); s != tok {
				t.Errorf("lock holds %q, lease says %q", s, tok)
			}
			if seen[hexPart] {
				t.Errorf("token repeated")
			}
			seen[hexPart] = true
			return []byte("v"), time.Minute, nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
}

func TestGet_AnyIDWorks(t *testing.T) {
	// Any id works and reaches Redis unchanged; HashIDs bounds key length.
	long := strings.Repeat("x", 10*1024)
	ids := []string{"plain", "ünïcødé", "emoji 🦀🔥", "bin\x00\xff\x01ary", long, "", "with:colon/and/slash"}
	for _, hashed := range []bool{false, true} {
		t.Run(fmt.Sprint("hashed=", hashed), func(t *testing.T) {
			b := miniBackend(t)
			c := newTestClient(t, b.addr, "ids", &Options{HashIDs: hashed})
			for _, id := range ids {
				v, err := c.Get(bg(), id, func(context.Context, *Lease) ([]byte, time.Duration, error) {
					return []byte("v:" + id), time.Minute, nil
				})
				if err != nil || string(v) != "v:"+id {
					t.Fatalf("id %q: Get = %q, %v", id[:min(len(id), 20)], v[:min(len(v), 20)], err)
				}
				key := "ids:" + id
				if hashed {
					key = "ids:" + HashID(id)
				}
				if got, _ := b.mini.Get(key); got != "v:"+id {
					t.Errorf("id %q not stored under %q", id[:min(len(id), 20)], key[:min(len(key), 30)])
				}
			}
			if hashed {
				for _, k := range b.mini.Keys() {
					if len(k) > len("ids/lock:")+64 {
						t.Errorf("hashed key too long: %d bytes", len(k))
					}
				}
			}
		})
	}
}

func TestGet_ExternalProducer(t *testing.T) {
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			opts := &Options{LockTTL: 30 * time.Second}
			c1 := newTestClient(t, b.addr, "report", opts)
			c2 := newTestClient(t, b.addr, "report", opts)
			raw := rawClient(t, b.addr)
			var starts atomic.Int64
			// The "other program": told by start, it SETs and PUBLISHes.
			start := func(ctx context.Context, l *Lease) error {
				starts.Add(1)
				go func() {
					time.Sleep(50 * time.Millisecond)
					raw.Set(bg(), "report:q1", "pdf-location", time.Minute)
					raw.Publish(bg(), "report/notif:q1", "pdf-location")
				}()
				return nil
			}
			var wg sync.WaitGroup
			for _, c := range []*testClient{c1, c2, c1, c2} {
				wg.Add(1)
				go func() {
					defer wg.Done()
					v, err := c.GetExternal(bg(), "q1", start)
					if err != nil || string(v) != "pdf-location" {
						t.Errorf("GetExternal = %q, %v", v, err)
					}
				}()
			}
			wg.Wait()
			if starts.Load() != 1 {
				t.Errorf("external work started %d times", starts.Load())
			}
			lockDone(t, raw, "report/lock:q1")
		})
	}
}

func TestGet_ExternalProducerFailureReportedWithToken(t *testing.T) {
	b := miniBackend(t)
	c := newTestClient(t, b.addr, "job", &Options{LockTTL: 30 * time.Second})
	raw := rawClient(t, b.addr)
	ctx, cancel := context.WithTimeout(bg(), 20*time.Second)
	defer cancel()
	_, err := c.GetExternal(ctx, "j", func(_ context.Context, l *Lease) error {
		tok := l.Token()
		go func() {
			// Once the winner listens: an event published before its
			// subscription took effect is lost.
			for raw.PubSubNumSub(bg(), "job/lock-event:j").Val()["job/lock-event:j"] < 1 {
				if ctx.Err() != nil {
					return
				}
				time.Sleep(time.Millisecond)
			}
			raw.Publish(bg(), "job/lock-event:j", "fail\n"+tok+"\nconverter crashed")
		}()
		return nil
	})
	if !errors.Is(err, ErrHolderFailed) || !strings.Contains(err.Error(), "converter crashed") {
		t.Fatalf("got %v", err)
	}
	if raw.Exists(bg(), "job/lock:j").Val() != 0 {
		t.Error("lock not released")
	}
}

// A producer that answers while start still runs (it failed at once, or
// had the value ready) publishes before start returns. The winner is live
// before it starts the work (PROTOCOL.md [E1]), so the answer is heard at
// once, not after the 30 s lock TTL and a second start.
func TestGetExternal_ProducerThatAnswersDuringStartIsHeard(t *testing.T) {
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			c := newTestClient(t, b.addr, "quick", &Options{LockTTL: 30 * time.Second})
			raw := rawClient(t, b.addr)
			t.Run("fail", func(t *testing.T) {
				var starts atomic.Int64
				ctx, cancel := context.WithTimeout(bg(), 10*time.Second)
				defer cancel()
				_, err := c.GetExternal(ctx, "f", func(_ context.Context, l *Lease) error {
					starts.Add(1)
					return raw.Publish(bg(), "quick/lock-event:f", "fail\n"+l.Token()+"\nno such report").Err()
				})
				if !errors.Is(err, ErrHolderFailed) || !strings.Contains(err.Error(), "no such report") {
					t.Fatalf("GetExternal = %v, want the producer's failure well before the 30 s lock TTL", err)
				}
				if n := starts.Load(); n != 1 {
					t.Errorf("start ran %d times", n)
				}
				if raw.Exists(bg(), "quick/lock:f").Val() != 0 {
					t.Error("lock not released after the producer's failure")
				}
			})
			t.Run("value published, not stored", func(t *testing.T) {
				looks := countLookups(c.rdb, "quick:v")
				var starts atomic.Int64
				ctx, cancel := context.WithTimeout(bg(), 10*time.Second)
				defer cancel()
				v, err := c.GetExternal(ctx, "v", func(_ context.Context, l *Lease) error {
					starts.Add(1)
					return raw.Publish(bg(), "quick/notif:v", "ready at once").Err()
				})
				if err != nil || string(v) != "ready at once" {
					t.Fatalf("GetExternal = %q, %v, want the published value well before the 30 s lock TTL", v, err)
				}
				if n := starts.Load(); n != 1 {
					t.Errorf("start ran %d times", n)
				}
				// Live before the work started: nothing can have been
				// missed, so no lookup after it.
				if n := looks.n.Load(); n != 1 {
					t.Errorf("%d lookups, want the one that took the lock", n)
				}
			})
		})
	}
}

func TestGet_RedisDown(t *testing.T) {
	addr := refusedAddr(t) // a closed server's port could be another test's server by now
	t.Run("default returns ErrRedis", func(t *testing.T) {
		c := newTestClient(t, addr, "down", nil)
		var calls atomic.Int64
		_, err := c.Get(bg(), "k", constFetch(&calls, "v", 0))
		if !errors.Is(err, ErrRedis) || calls.Load() != 0 {
			t.Fatalf("Get = %v with %d fetches, want ErrRedis and none", err, calls.Load())
		}
	})
	t.Run("FailOpen computes locally", func(t *testing.T) {
		c := newTestClient(t, addr, "down", &Options{FailOpen: true})
		var calls atomic.Int64
		var wg sync.WaitGroup
		for range 20 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				v, err := c.Get(bg(), "k", func(ctx context.Context, l *Lease) ([]byte, time.Duration, error) {
					if l != nil {
						t.Error("fail-open fetch got a lease")
					}
					calls.Add(1)
					// Until every caller has joined: one that began after
					// the flight answered would start a flight of its own,
					// find Redis down, and compute again, as it should.
					for deadline := time.Now().Add(10 * time.Second); c.Stats().Coalesced < 19 && time.Now().Before(deadline); {
						time.Sleep(100 * time.Microsecond)
					}
					return []byte("local"), time.Minute, nil
				})
				if err != nil || string(v) != "local" {
					t.Errorf("Get = %q, %v", v, err)
				}
			}()
		}
		wg.Wait()
		if calls.Load() != 1 {
			t.Errorf("fail-open fetch ran %d times for 20 callers in one process, want 1", calls.Load())
		}
	})
}

func TestNew_RejectsBadInput(t *testing.T) {
	b := miniBackend(t)
	rdb := rawClient(t, b.addr)
	cases := []struct {
		name string
		new  func() (*Client, error)
		want string
	}{
		{"nil client", func() (*Client, error) { return New(nil, "t", nil) }, "redis client is nil"},
		{"typed nil client", func() (*Client, error) { return New(nilClient(), "t", nil) }, "redis client is nil"},
		{"empty tag", func() (*Client, error) { return New(rdb, "", nil) }, "tag is empty"},
		{"tag with /lock", func() (*Client, error) { return New(rdb, "a/lock", nil) }, `contains "/lock"`},
		{"tag with /notif", func() (*Client, error) { return New(rdb, "a/notif:x", nil) }, `contains "/notif"`},
		{"tag with /lock-event", func() (*Client, error) { return New(rdb, "a/lock-event", nil) }, `contains "/lock"`},
		{"lock TTL under 1ms", func() (*Client, error) { return New(rdb, "t", &Options{LockTTL: time.Microsecond}) }, "under 1ms"},
		{"negative lock TTL", func() (*Client, error) { return New(rdb, "t", &Options{LockTTL: -time.Second}) }, "under 1ms"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c, err := tc.new()
			if c != nil {
				c.Close()
				t.Fatal("got a client")
			}
			if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want ErrInvalid naming %q", err, tc.want)
			}
		})
	}
}

func TestGet_RejectsBadInput(t *testing.T) {
	b := miniBackend(t)
	c := newTestClient(t, b.addr, "bad", nil)
	fetch := constFetch(new(atomic.Int64), "v", 0)
	var nilCtx context.Context // the bad input under test
	cases := []struct {
		name string
		call func() error
		want string
	}{
		{"nil fetch", func() error { _, err := c.Get(bg(), "k", nil); return err }, "fetch is nil"},
		{"nil start", func() error { _, err := c.GetExternal(bg(), "k", nil); return err }, "start is nil"},
		{"nil context", func() error { _, err := c.Get(nilCtx, "k", fetch); return err }, "context is nil"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.call()
			if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want ErrInvalid naming %q", err, tc.want)
			}
		})
	}
}

func TestGet_WrongTypeValueKeyIsAClearError(t *testing.T) {
	b := miniBackend(t)
	raw := rawClient(t, b.addr)
	raw.HSet(bg(), "wt:k", "f", "v")
	c := newTestClient(t, b.addr, "wt", nil)
	_, err := c.Get(bg(), "k", constFetch(new(atomic.Int64), "v", 0))
	if !errors.Is(err, ErrRedis) || !strings.Contains(err.Error(), `"wt:k"`) {
		t.Fatalf("got %v, want ErrRedis naming the key", err)
	}
}

func TestGet_GoexitInFetchIsAnError(t *testing.T) {
	b := miniBackend(t)
	c := newTestClient(t, b.addr, "goexit", nil)
	_, err := c.Get(bg(), "k", func(context.Context, *Lease) ([]byte, time.Duration, error) {
		runtimeGoexit()
		return nil, 0, nil
	})
	if err == nil || !strings.Contains(err.Error(), "Goexit") {
		t.Fatalf("got %v", err)
	}
}

func TestClose_WhileThousandsOfGetsAreInFlight(t *testing.T) {
	b := miniBackend(t)
	c := newTestClient(t, b.addr, "busy", nil)
	raw := rawClient(t, b.addr)
	raw.Set(bg(), "busy:hit", "v", time.Minute)
	// Held elsewhere far longer than the bounds below: a waiter that Close
	// failed to wake would only look again when this lock expires.
	raw.Set(bg(), "busy/lock:held", "someone", 10*time.Minute)
	const goroutines = 2000
	var wg sync.WaitGroup
	var values, closed, toHeld atomic.Int64
	for i := range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := 0; ; j++ {
				// Half the goroutines keep hitting and missing; the other
				// half park on a lock held elsewhere after two values.
				id := []string{"hit", fmt.Sprint("miss-", i, "-", j), "held"}[j%3]
				if i%2 == 0 && id == "held" {
					id = "hit"
				}
				if id == "held" {
					toHeld.Add(1)
				}
				v, err := c.Get(bg(), id, constFetch(new(atomic.Int64), "v", time.Millisecond))
				switch {
				case errors.Is(err, ErrClosed):
					closed.Add(1)
					return
				case err != nil:
					t.Errorf("Get(%q) = %v", id, err)
					return
				case string(v) != "v":
					t.Errorf("Get(%q) = %q", id, v)
					return
				}
				values.Add(1)
			}
		}()
	}
	// Under way: every goroutine of the parking half has had its two
	// values and gone to the held lock, whose flight waits, while the
	// other half still hits and misses. However slowly goroutines run,
	// Close then meets all three kinds of Get.
	eventually(t, time.Minute, "Gets of every kind to be under way", func() bool {
		return toHeld.Load() == goroutines/2 && c.Stats().Waits > 0
	})
	// Close waits for Redis at most about a second (closeWait); the bound
	// tells that from a Close, or callers, stuck until the held lock expires
	// (10 minutes) or for ever, however loaded the machine.
	const bound = 30 * time.Second
	deadline := time.Now().Add(bound)
	done := make(chan struct{})
	go func() {
		var cw sync.WaitGroup
		for range 3 { // concurrent Close calls
			cw.Add(1)
			go func() { defer cw.Done(); _ = c.Close() }()
		}
		cw.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(time.Until(deadline)):
		t.Fatalf("Close did not return within %v", bound)
	}
	returned := make(chan struct{})
	go func() { wg.Wait(); close(returned) }()
	select {
	case <-returned:
	case <-time.After(time.Until(deadline)):
		t.Fatalf("%d of %d goroutines still in Get %v after Close began", goroutines-closed.Load(), goroutines, bound)
	}
	if closed.Load() != goroutines {
		t.Errorf("%d of %d goroutines saw ErrClosed", closed.Load(), goroutines)
	}
	if n := raw.Exists(bg(), "busy/lock:held").Val(); n != 1 {
		t.Error("Close released a lock it did not hold")
	}
}

// A "not found" answer names its id however it was served: computed here,
// as read from Redis or the L1 (found walking the newcomer's path: only
// the computed one did not). An error of fetch's own that wraps
// ErrNotFound is passed on as it is.
func TestGet_ComputedNotFoundNamesTheID(t *testing.T) {
	b := miniBackend(t)
	c := newTestClient(t, b.addr, "nf", &Options{NegTTL: time.Minute})
	_, err := c.Get(bg(), "missing-7", func(context.Context, *Lease) ([]byte, time.Duration, error) {
		return nil, 0, ErrNotFound
	})
	if !errors.Is(err, ErrNotFound) || !strings.Contains(err.Error(), `"missing-7"`) {
		t.Fatalf("computed not found: %v, want ErrNotFound naming the id", err)
	}
	own := fmt.Errorf("user 8 is not in the table: %w", ErrNotFound)
	_, err = c.Get(bg(), "missing-8", func(context.Context, *Lease) ([]byte, time.Duration, error) {
		return nil, 0, own
	})
	if err != own {
		t.Fatalf("fetch's own not-found error came back as %v", err)
	}
}
