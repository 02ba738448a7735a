package memolock

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// pingGate holds back every PING its connections write, and whatever they
// write after it, until it opens: a pub/sub subscription then takes
// effect but never becomes live (its marker is a PING).
type pingGate struct {
	mu    sync.Mutex
	held  bool
	conns []*gatedConn
}

type gatedConn struct {
	net.Conn
	g       *pingGate
	pending [][]byte
}

func (c *gatedConn) Write(b []byte) (int, error) {
	c.g.mu.Lock()
	if c.g.held && (len(c.pending) > 0 || bytes.Contains(bytes.ToLower(b), []byte("ping"))) {
		c.pending = append(c.pending, bytes.Clone(b))
		c.g.mu.Unlock()
		return len(b), nil
	}
	c.g.mu.Unlock()
	return c.Conn.Write(b)
}

func (g *pingGate) open() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.held = false
	for _, c := range g.conns {
		for _, b := range c.pending {
			_, _ = c.Conn.Write(b)
		}
		c.pending = nil
	}
}

// pingGatedClient is a test client whose PINGs a gate holds back until the
// test ends.
func pingGatedClient(t *testing.T, addr, tag string, opts *Options) *testClient {
	g := &pingGate{held: true}
	o := &redis.Options{Addr: addr, Dialer: func(ctx context.Context, network, a string) (net.Conn, error) {
		var d net.Dialer
		c, err := d.DialContext(ctx, network, a)
		if err != nil {
			return nil, err
		}
		gc := &gatedConn{Conn: c, g: g}
		g.mu.Lock()
		g.conns = append(g.conns, gc)
		g.mu.Unlock()
		return gc, nil
	}}
	c := newTestClientOn(t, o, tag, opts)
	t.Cleanup(g.open)
	return c
}

// While the winner waits for its subscription to be live before it starts
// the external work (PROTOCOL.md [E1]), what ends the flight ends it
// without starting the work, and the lock goes; a subscription that never
// becomes live holds the work up for a third of the lock TTL at most.
func TestGetExternal_BeforeTheSubscriptionIsLive(t *testing.T) {
	b := realBackend(t)
	raw := rawClient(t, b.addr)
	start := func(starts *atomic.Int64) StartFunc {
		return func(context.Context, *Lease) error {
			starts.Add(1)
			return nil
		}
	}
	t.Run("a value published is the answer, counted as a wake-up", func(t *testing.T) {
		c := pingGatedClient(t, b.addr, "bl1", &Options{LockTTL: 30 * time.Second})
		var starts atomic.Int64
		got := make(chan answer, 1)
		go func() {
			v, err := c.GetExternal(bg(), "a", start(&starts))
			got <- answer{v, err}
		}()
		subscribed(t, raw, "bl1/notif:a", 1)
		raw.Set(bg(), "bl1:a", "v", time.Minute)
		raw.Publish(bg(), "bl1/notif:a", "v")
		a, ok := await(got, 10*time.Second)
		if !ok || a.err != nil || string(a.val) != "v" {
			t.Fatalf("GetExternal = %q, %v (returned: %v), want the value published", a.val, a.err, ok)
		}
		if n := starts.Load(); n != 0 {
			t.Errorf("start ran %d times for a value that came first", n)
		}
		lockDone(t, raw, "bl1/lock:a")
		if st := c.Stats(); st.Wakeups != 1 || st.Hits != 0 {
			t.Errorf("Stats: Wakeups %d, Hits %d; want a pushed value counted as one wake-up", st.Wakeups, st.Hits)
		}
	})
	t.Run("callers leaving hand the lock over", func(t *testing.T) {
		c := pingGatedClient(t, b.addr, "bl2", &Options{LockTTL: 30 * time.Second})
		events := raw.Subscribe(bg(), "bl2/lock-event:a")
		defer events.Close()
		if _, err := events.Receive(bg()); err != nil {
			t.Fatal(err)
		}
		var starts atomic.Int64
		ctx, cancel := context.WithCancel(bg())
		got := make(chan answer, 1)
		go func() {
			v, err := c.GetExternal(ctx, "a", start(&starts))
			got <- answer{v, err}
		}()
		subscribed(t, raw, "bl2/notif:a", 1)
		cancel()
		if a, ok := await(got, 10*time.Second); !ok || !errors.Is(a.err, context.Canceled) {
			t.Errorf("GetExternal = %q, %v (returned: %v), want context.Canceled", a.val, a.err, ok)
		}
		select {
		case m := <-events.Channel():
			if !strings.HasPrefix(m.Payload, "abandon\n") {
				t.Errorf("event %q, want abandon", m.Payload)
			}
		case <-time.After(10 * time.Second):
			t.Error("no abandon event")
		}
		eventually(t, 10*time.Second, "the lock to go", func() bool { return raw.Exists(bg(), "bl2/lock:a").Val() == 0 })
		if n := starts.Load(); n != 0 {
			t.Errorf("start ran %d times with no caller left", n)
		}
	})
	t.Run("Close hands the lock over", func(t *testing.T) {
		c := pingGatedClient(t, b.addr, "bl3", &Options{LockTTL: 30 * time.Second})
		var starts atomic.Int64
		got := make(chan answer, 1)
		go func() {
			v, err := c.GetExternal(bg(), "a", start(&starts))
			got <- answer{v, err}
		}()
		subscribed(t, raw, "bl3/notif:a", 1)
		if err := c.Close(); err != nil {
			t.Fatal(err)
		}
		if a, ok := await(got, 10*time.Second); !ok || !errors.Is(a.err, ErrClosed) {
			t.Errorf("GetExternal = %q, %v (returned: %v), want ErrClosed", a.val, a.err, ok)
		}
		if n := starts.Load(); n != 0 {
			t.Errorf("start ran %d times after Close", n)
		}
		if raw.Exists(bg(), "bl3/lock:a").Val() != 0 {
			t.Error("lock kept after Close")
		}
	})
	t.Run("never live: the work starts after a third of the lock TTL, and its failure is heard", func(t *testing.T) {
		const lockTTL = 3 * time.Second
		c := pingGatedClient(t, b.addr, "bl4", &Options{LockTTL: lockTTL})
		var starts atomic.Int64
		t0 := time.Now()
		var startedAfter time.Duration
		_, err := c.GetExternal(bg(), "a", func(_ context.Context, l *Lease) error {
			starts.Add(1)
			startedAfter = time.Since(t0)
			return raw.Publish(bg(), "bl4/lock-event:a", "fail\n"+l.Token()+"\nbroke at once").Err()
		})
		if !errors.Is(err, ErrHolderFailed) || !strings.Contains(err.Error(), "broke at once") {
			t.Fatalf("GetExternal = %v, want the producer's failure", err)
		}
		if n := starts.Load(); n != 1 {
			t.Errorf("start ran %d times", n)
		}
		if startedAfter < lockTTL/3 {
			t.Errorf("start ran %v after the call, before the subscription was live and before a third of the lock TTL", startedAfter)
		}
	})
}

// A winner whose own lock expired takes it again under the same token; its
// earlier producer's failure, published just then, ends the flight, and the
// work is not started a second time (PROTOCOL.md [E1]): heard in the
// takeover check when the subscription is live, or while the winner waits
// for it to be live.
func TestGetExternal_EarlierProducersLateFailureEndsTheRetake(t *testing.T) {
	b := realBackend(t)
	raw := rawClient(t, b.addr)
	for _, live := range []bool{true, false} {
		t.Run(fmt.Sprintf("live=%v", live), func(t *testing.T) {
			tag := fmt.Sprint("late-", live)
			opts := &Options{LockTTL: time.Second}
			var c *testClient
			if live {
				c = newTestClient(t, b.addr, tag, opts)
			} else {
				c = pingGatedClient(t, b.addr, tag, opts)
			}
			var starts atomic.Int64
			var token atomic.Value
			var published atomic.Bool
			c.rdb.AddHook(hookEach(func(cmd redis.Cmder) {
				args := cmd.Args()
				if (cmd.Name() == "evalsha" || cmd.Name() == "eval") && len(args) > 3 && args[3] == tag+":a" && starts.Load() == 1 && !published.Swap(true) {
					// The lookup after the lock expired, sent after the failure.
					raw.Publish(bg(), tag+"/lock-event:a", "fail\n"+token.Load().(string)+"\ngave up late")
				}
			}))
			events := raw.Subscribe(bg(), tag+"/lock-event:a")
			defer events.Close()
			if _, err := events.Receive(bg()); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(bg(), 20*time.Second)
			defer cancel()
			_, err := c.GetExternal(ctx, "a", func(_ context.Context, l *Lease) error {
				token.Store(l.Token())
				starts.Add(1)
				return nil
			})
			if !errors.Is(err, ErrHolderFailed) || !strings.Contains(err.Error(), "gave up late") {
				t.Fatalf("GetExternal = %v, want the earlier producer's failure", err)
			}
			// The producer's event is out: the lock goes without another
			// (PROTOCOL.md [E3]). Everything the flight published came
			// before its answer, so before this end marker.
			raw.Publish(bg(), tag+"/lock-event:a", "end of test")
			var seen []string
			for m := range events.Channel() {
				if m.Payload == "end of test" {
					break
				}
				seen = append(seen, m.Payload)
			}
			if len(seen) != 1 {
				t.Errorf("events %q, want the producer's failure alone", seen)
			}
			if !published.Load() {
				t.Fatal("the lookup after the lock expired was never sent")
			}
			if n := starts.Load(); n != 1 {
				t.Errorf("start ran %d times: the late failure did not stop the second start", n)
			}
			if raw.Exists(bg(), tag+"/lock:a").Val() != 0 {
				t.Error("lock kept after the failure")
			}
		})
	}
}

// The same with the earlier producer's value, published just as the lock
// expired: it is the answer, and the lock goes as for a value that came in
// time ([E2]: no event), not with an abandon event that would send every
// waiter to Redis.
func TestGetExternal_EarlierProducersLateValueAnswersTheRetake(t *testing.T) {
	b := realBackend(t)
	raw := rawClient(t, b.addr)
	c := newTestClient(t, b.addr, "latev", &Options{LockTTL: time.Second})
	var starts atomic.Int64
	var published atomic.Bool
	c.rdb.AddHook(hookEach(func(cmd redis.Cmder) {
		args := cmd.Args()
		if (cmd.Name() == "evalsha" || cmd.Name() == "eval") && len(args) > 3 && args[3] == "latev:a" && starts.Load() == 1 && !published.Swap(true) {
			// The lookup after the lock expired, sent after the value
			// (published only: stored, the lookup would find it).
			raw.Publish(bg(), "latev/notif:a", "late value")
		}
	}))
	events := raw.Subscribe(bg(), "latev/lock-event:a")
	defer events.Close()
	if _, err := events.Receive(bg()); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(bg(), 20*time.Second)
	defer cancel()
	v, err := c.GetExternal(ctx, "a", func(context.Context, *Lease) error {
		starts.Add(1)
		return nil
	})
	if err != nil || string(v) != "late value" {
		t.Fatalf("GetExternal = %q, %v, want the earlier producer's value", v, err)
	}
	if !published.Load() {
		t.Fatal("the lookup after the lock expired was never sent")
	}
	if n := starts.Load(); n != 1 {
		t.Errorf("start ran %d times", n)
	}
	raw.Publish(bg(), "latev/lock-event:a", "end of test")
	for m := range events.Channel() {
		if m.Payload == "end of test" {
			break
		}
		t.Errorf("event %q, want none for a value", m.Payload)
	}
	if raw.Exists(bg(), "latev/lock:a").Val() != 0 && !strings.HasPrefix(raw.Get(bg(), "latev/lock:a").Val(), "done:") {
		t.Errorf("lock = %q after the value", raw.Get(bg(), "latev/lock:a").Val())
	}
}
