package memolock

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/memolock/memolock/internal/wire"
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
	if c.g.held && (len(c.pending) > 0 || pingCommand.Match(b)) {
		c.pending = append(c.pending, bytes.Clone(b))
		c.g.mu.Unlock()
		return len(b), nil
	}
	c.g.mu.Unlock()
	return c.Conn.Write(b)
}

// pingCommand matches a PING command (not an argument that says "ping") in
// what a connection writes: RESP, an array whose first bulk string is it.
var pingCommand = regexp.MustCompile(`(?i)(^|\r\n)\*[0-9]+\r\n\$4\r\nping\r\n`)

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
		events := subscribeTo(t, raw, "bl2/lock-event:a")
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
	for _, kind := range []string{"fail", "notfound"} {
		for _, live := range []bool{true, false} {
			t.Run(fmt.Sprintf("%s/live=%v", kind, live), func(t *testing.T) {
				tag := fmt.Sprint("late-", kind, "-", live)
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
					if isLookup(cmd, tag+":a") && starts.Load() == 1 && !published.Swap(true) {
						// The lookup after the lock expired, sent after the
						// producer's late word.
						raw.Publish(bg(), tag+"/lock-event:a", kind+"\n"+token.Load().(string)+"\ngave up late")
					}
				}))
				events := subscribeTo(t, raw, tag+"/lock-event:a")
				ctx, cancel := context.WithTimeout(bg(), 20*time.Second)
				defer cancel()
				_, err := c.GetExternal(ctx, "a", recordStart(&token, &starts))
				wantLateWord(t, kind, err)
				if !published.Load() {
					t.Fatal("the lookup after the lock expired was never sent")
				}
				if n := starts.Load(); n != 1 {
					t.Errorf("start ran %d times: the late word did not stop the second start", n)
				}
				// The lock goes with the word said again under the flight's
				// token (PROTOCOL.md [E1a]), in the script that deletes it, so
				// before this end marker.
				eventually(t, 5*time.Second, "the lock to go", func() bool { return raw.Exists(bg(), tag+"/lock:a").Val() == 0 })
				raw.Publish(bg(), tag+"/lock-event:a", "end of test")
				tok := token.Load().(string)
				wantEvents(t, eventsUntilEnd(events), kind+"\n"+tok+"\ngave up late", lateWord(kind, tok))
			})
		}
	}
}

// subscribeTo subscribes raw to ch, and returns once the subscription is
// in effect.
func subscribeTo(t *testing.T, raw *redis.Client, ch string) *redis.PubSub {
	t.Helper()
	ps := raw.Subscribe(bg(), ch)
	t.Cleanup(func() { _ = ps.Close() })
	if _, err := ps.Receive(bg()); err != nil {
		t.Fatal(err)
	}
	return ps
}

// isLookup reports whether cmd is a lookup (the acquire script) of the
// value at key.
func isLookup(cmd redis.Cmder, key string) bool {
	args := cmd.Args()
	return (cmd.Name() == "evalsha" || cmd.Name() == "eval") && len(args) > 3 && args[3] == key
}

// wantLateWord fails the test unless err is what the earlier producer's
// late word of kind ("fail", with "gave up late", or "notfound") says.
func wantLateWord(t *testing.T, kind string, err error) {
	t.Helper()
	switch {
	case kind == "fail" && (!errors.Is(err, ErrHolderFailed) || !strings.Contains(err.Error(), "gave up late")):
		t.Fatalf("GetExternal = %v, want the earlier producer's failure", err)
	case kind == "notfound" && !errors.Is(err, ErrNotFound):
		t.Fatalf("GetExternal = %v, want the earlier producer's not found", err)
	}
}

// eventsUntilEnd reads events up to the test's "end of test" marker.
func eventsUntilEnd(events *redis.PubSub) []string {
	var seen []string
	for m := range events.Channel() {
		if m.Payload == "end of test" {
			break
		}
		seen = append(seen, m.Payload)
	}
	return seen
}

// A winner whose lock expired while its producer worked, and which then
// waits on another holder, keeps its producer's late failure or "not
// found" heard meanwhile: once it takes the lock again, it acts on it
// instead of starting the work a second time, and says it again under its
// own token and the other holder's (PROTOCOL.md [E1a]). So it does when its
// caller has left meanwhile, rather than hand the lock over with abandon.
func TestGetExternal_LateWordHeardWhileWaitingOnAnotherHolder(t *testing.T) {
	b := realBackend(t)
	raw := rawClient(t, b.addr)
	for _, kind := range []string{"fail", "notfound"} {
		for _, left := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/caller-left=%v", kind, left), func(t *testing.T) {
				tag := fmt.Sprint("lateother-", kind, "-", left)
				var token atomic.Value
				var starts atomic.Int64
				var told atomic.Bool
				c := newTestClient(t, b.addr, tag, &Options{LockTTL: time.Second, OnWait: func(_, holder string) {
					if holder == "other" && !told.Swap(true) {
						// The flight now waits on the other holder: its own
						// producer answers, late.
						raw.Publish(bg(), tag+"/lock-event:a", kind+"\n"+token.Load().(string)+"\ngave up late")
					}
				}})
				var other atomic.Bool
				c.rdb.AddHook(hookEach(func(cmd redis.Cmder) {
					if isLookup(cmd, tag+":a") && starts.Load() == 1 && !other.Load() {
						// The winner's lock expired: another holder takes it
						// just before the winner looks again.
						if raw.SetNX(bg(), tag+"/lock:a", "other", time.Second).Val() {
							other.Store(true)
						}
					}
				}))
				events := subscribeTo(t, raw, tag+"/lock-event:a")
				wait := 20 * time.Second
				if left {
					wait = 300 * time.Millisecond // before the lock expires
				}
				ctx, cancel := context.WithTimeout(bg(), wait)
				defer cancel()
				_, err := c.GetExternal(ctx, "a", recordStart(&token, &starts))
				tok := token.Load().(string)
				// The producer's word, then the flight's: under its token, in
				// the script that deletes the lock, then under the other's.
				seen := eventsUpTo(events, 3, 10*time.Second)
				if !told.Load() {
					t.Fatal("the flight never waited on the other holder")
				}
				if n := starts.Load(); n != 1 {
					t.Errorf("start ran %d times: the late word did not stop the second start", n)
				}
				if left {
					if !errors.Is(err, ErrTimeout) {
						t.Errorf("GetExternal = %v, want the caller's timeout", err)
					}
				} else {
					wantLateWord(t, kind, err)
				}
				raw.Publish(bg(), tag+"/lock-event:a", "end of test")
				wantEvents(t, append(seen, eventsUntilEnd(events)...),
					kind+"\n"+tok+"\ngave up late", lateWord(kind, tok), lateWord(kind, "other"))
				if raw.Exists(bg(), tag+"/lock:a").Val() != 0 {
					t.Error("lock kept after the late word")
				}
			})
		}
	}
}

// A word of the flight's own producer that comes in one read after an
// event that sends the flight to look (an unknown kind here) is acted on
// as soon as the lookup finds the lock still the flight's own, not once the
// lock expires (PROTOCOL.md [E1a]).
func TestGetExternal_WordAfterALookAgainEventEndsTheWaitPromptly(t *testing.T) {
	b := realBackend(t)
	raw := rawClient(t, b.addr)
	const lockTTL = 20 * time.Second
	c := newTestClient(t, b.addr, "lookword", &Options{LockTTL: lockTTL})
	ctx, cancel := context.WithTimeout(bg(), 2*lockTTL)
	defer cancel()
	var starts atomic.Int64
	t0 := time.Now()
	_, err := c.GetExternal(ctx, "a", func(_ context.Context, l *Lease) error {
		starts.Add(1)
		// Live before start ([E1]); start holds the flight up while both
		// arrive, so that it reads them in one go after start.
		pipe := raw.TxPipeline()
		pipe.Publish(bg(), "lookword/lock-event:a", "progress\n"+l.Token()+"\n")
		pipe.Publish(bg(), "lookword/lock-event:a", "fail\n"+l.Token()+"\ngave up")
		if _, err := pipe.Exec(bg()); err != nil {
			return err
		}
		time.Sleep(200 * time.Millisecond)
		return nil
	})
	if !errors.Is(err, ErrHolderFailed) || !strings.Contains(err.Error(), "gave up") {
		t.Fatalf("GetExternal = %v, want the producer's failure", err)
	}
	if d := time.Since(t0); d > lockTTL/2 {
		t.Errorf("the failure ended the wait after %v: only once the lock expired", d)
	}
	if n := starts.Load(); n != 1 {
		t.Errorf("start ran %d times", n)
	}
	eventually(t, 5*time.Second, "the lock to go", func() bool { return raw.Exists(bg(), "lookword/lock:a").Val() == 0 })
}

// A late word that reached the flight's subscription just before it would
// start the work again, read or not yet, stops that start (PROTOCOL.md
// [E1a]): the flight reads what it has before it calls start.
func TestGetExternal_LateWordDeliveredJustBeforeStartAgain(t *testing.T) {
	b := realBackend(t)
	raw := rawClient(t, b.addr)
	var token atomic.Value
	var sent atomic.Bool
	logger := slog.New(onLog(func(msg string) {
		if strings.Contains(msg, "its lock is taken again") && !sent.Swap(true) {
			// On the flight's goroutine, after the takeover check, before
			// it starts: the word is delivered meanwhile.
			raw.Publish(bg(), "lateready/lock-event:a", "fail\n"+token.Load().(string)+"\ngave up late")
			time.Sleep(200 * time.Millisecond)
		}
	}))
	c := newTestClient(t, b.addr, "lateready", &Options{LockTTL: time.Second, Logger: logger})
	ctx, cancel := context.WithTimeout(bg(), 20*time.Second)
	defer cancel()
	var starts atomic.Int64
	_, err := c.GetExternal(ctx, "a", recordStart(&token, &starts))
	if !sent.Load() {
		t.Fatal("the flight never took its own lock again")
	}
	if n := starts.Load(); n != 1 {
		t.Errorf("start ran %d times: the late word delivered before it was not read", n)
	}
	wantLateWord(t, "fail", err)
}

// onLog is a slog.Handler that calls its function with each message.
type onLog func(msg string)

func (h onLog) Enabled(context.Context, slog.Level) bool { return true }
func (h onLog) Handle(_ context.Context, r slog.Record) error {
	h(r.Message)
	return nil
}
func (h onLog) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h onLog) WithGroup(string) slog.Handler      { return h }

// lateWord is the event a flight publishes under token for its earlier
// producer's late word of kind, "gave up late" (PROTOCOL.md [E1a]).
func lateWord(kind, token string) string {
	if kind == "fail" {
		return "fail\n" + token + "\ngave up late"
	}
	return "notfound\n" + token + "\n"
}

// wantEvents fails the test unless seen is want, in order.
func wantEvents(t *testing.T, seen []string, want ...string) {
	t.Helper()
	if !slices.Equal(seen, want) {
		t.Errorf("events %q, want %q", seen, want)
	}
}

// eventsUpTo reads n events, or as many as come within d.
func eventsUpTo(events *redis.PubSub, n int, d time.Duration) []string {
	var seen []string
	timeout := time.After(d)
	for len(seen) < n {
		select {
		case m := <-events.Channel():
			seen = append(seen, m.Payload)
		case <-timeout:
			return seen
		}
	}
	return seen
}

// A producer's "not found" deletes the winner's lock with no other event,
// as its failure does (PROTOCOL.md [E3]): not with an abandon that would
// send waiters elsewhere to take the lock and start the work again.
func TestGetExternal_ProducersNotFoundDeletesTheLockWithoutAnother(t *testing.T) {
	b := realBackend(t)
	raw := rawClient(t, b.addr)
	c := newTestClient(t, b.addr, "pnf", &Options{LockTTL: 10 * time.Second})
	events := subscribeTo(t, raw, "pnf/lock-event:a")
	ctx, cancel := context.WithTimeout(bg(), 20*time.Second)
	defer cancel()
	_, err := c.GetExternal(ctx, "a", func(_ context.Context, l *Lease) error {
		// Live before start ([E1]): the winner hears it.
		return raw.Publish(bg(), "pnf/lock-event:a", "notfound\n"+l.Token()+"\n").Err()
	})
	if !errors.Is(err, ErrNotFound) {
		t.Fatalf("GetExternal = %v, want not found", err)
	}
	eventually(t, 5*time.Second, "the lock to go", func() bool { return raw.Exists(bg(), "pnf/lock:a").Val() == 0 })
	raw.Publish(bg(), "pnf/lock-event:a", "end of test")
	if seen := eventsUntilEnd(events); len(seen) != 1 || !strings.HasPrefix(seen[0], "notfound\n") {
		t.Errorf("events %q, want the producer's \"not found\" alone", seen)
	}
}

// A winner that takes its own expired lock again is no takeover: a second
// start that fails publishes its failure once, and Stats.Takeovers stays 0.
func TestGetExternal_OwnRetakeIsNoTakeover(t *testing.T) {
	b := realBackend(t)
	raw := rawClient(t, b.addr)
	c := newTestClient(t, b.addr, "ownre", &Options{LockTTL: time.Second})
	events := subscribeTo(t, raw, "ownre/lock-event:a")
	ctx, cancel := context.WithTimeout(bg(), 20*time.Second)
	defer cancel()
	var starts atomic.Int64
	_, err := c.GetExternal(ctx, "a", func(context.Context, *Lease) error {
		if starts.Add(1) == 1 {
			return nil // a producer that never answers
		}
		return errors.New("second start failed")
	})
	if err == nil || !strings.Contains(err.Error(), "second start failed") {
		t.Fatalf("GetExternal = %v, want the second start's failure", err)
	}
	if n := starts.Load(); n != 2 {
		t.Fatalf("start ran %d times, want 2", n)
	}
	eventually(t, 5*time.Second, "the lock to go", func() bool { return raw.Exists(bg(), "ownre/lock:a").Val() == 0 })
	raw.Publish(bg(), "ownre/lock-event:a", "end of test")
	if seen := eventsUntilEnd(events); len(seen) != 1 || !strings.HasPrefix(seen[0], "fail\n") {
		t.Errorf("events %q, want the second start's failure once", seen)
	}
	if n := c.Stats().Takeovers; n != 0 {
		t.Errorf("Stats.Takeovers = %d, want 0: the lock was the flight's own", n)
	}
}

func TestGetExternal_EarlierProducersLateValueAnswersTheRetake(t *testing.T) {
	b := realBackend(t)
	raw := rawClient(t, b.addr)
	for _, live := range []bool{true, false} {
		t.Run(fmt.Sprintf("live=%v", live), func(t *testing.T) {
			// Live, the takeover check reads the value; not live, the
			// wait to be live before start does.
			tag := fmt.Sprint("latev-", live)
			mp, reader := newReader(t)
			opts := &Options{LockTTL: time.Second, MeterProvider: mp}
			var c *testClient
			if live {
				c = newTestClient(t, b.addr, tag, opts)
			} else {
				c = pingGatedClient(t, b.addr, tag, opts)
			}
			var starts atomic.Int64
			var published atomic.Bool
			c.rdb.AddHook(hookEach(func(cmd redis.Cmder) {
				if isLookup(cmd, tag+":a") && starts.Load() == 1 && !published.Swap(true) {
					// The lookup after the lock expired, sent after the value
					// (published only: stored, the lookup would find it).
					raw.Publish(bg(), tag+"/notif:a", "late value")
				}
			}))
			events := subscribeTo(t, raw, tag+"/lock-event:a")
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
			// The value of the work this flight started: computed, as when
			// it comes during the wait after start.
			if n := sum(collect(t, reader, tag), "memolock.gets", attr("served", "computed")); n != 1 {
				t.Errorf("gets served computed = %d, want 1", n)
			}
			raw.Publish(bg(), tag+"/lock-event:a", "end of test")
			for _, e := range eventsUntilEnd(events) {
				t.Errorf("event %q, want none for a value", e)
			}
			if raw.Exists(bg(), tag+"/lock:a").Val() != 0 && !strings.HasPrefix(raw.Get(bg(), tag+"/lock:a").Val(), "done:") {
				t.Errorf("lock = %q after the value", raw.Get(bg(), tag+"/lock:a").Val())
			}
		})
	}
}

// A late failure of the flight's earlier producer that comes in one batch
// after the other holder's abandon is kept all the same: the abandon sends
// the flight to look again, and the failure ends it once it holds the lock
// ([E1]), instead of a second start.
func TestGetExternal_LateWordInOneBatchAfterTheHoldersAbandon(t *testing.T) {
	b := realBackend(t)
	raw := rawClient(t, b.addr)
	tag := "latebatch"
	var token atomic.Value
	var starts atomic.Int64
	var told atomic.Bool
	c := newTestClient(t, b.addr, tag, &Options{LockTTL: time.Second, OnWait: func(_, holder string) {
		if holder == "other" && !told.Swap(true) {
			// On the flight's goroutine, before it reads its subscription:
			// both events reach it together.
			raw.Del(bg(), tag+"/lock:a")
			raw.Publish(bg(), tag+"/lock-event:a", "abandon\nother\n")
			raw.Publish(bg(), tag+"/lock-event:a", "fail\n"+token.Load().(string)+"\ngave up late")
			time.Sleep(200 * time.Millisecond)
		}
	}})
	var other atomic.Bool
	c.rdb.AddHook(hookEach(func(cmd redis.Cmder) {
		if isLookup(cmd, tag+":a") && starts.Load() == 1 && !other.Load() {
			if raw.SetNX(bg(), tag+"/lock:a", "other", time.Second).Val() {
				other.Store(true)
			}
		}
	}))
	ctx, cancel := context.WithTimeout(bg(), 20*time.Second)
	defer cancel()
	_, err := c.GetExternal(ctx, "a", func(_ context.Context, l *Lease) error {
		token.Store(l.Token())
		if starts.Add(1) > 1 {
			return errors.New("started again")
		}
		return nil
	})
	if !told.Load() {
		t.Fatal("the flight never waited on the other holder")
	}
	if n := starts.Load(); n != 1 {
		t.Errorf("start ran %d times: the late failure, in one batch after the holder's abandon, was lost", n)
	}
	if !errors.Is(err, ErrHolderFailed) || !strings.Contains(err.Error(), "gave up late") {
		t.Errorf("GetExternal = %v, want the earlier producer's failure", err)
	}
}

// In the takeover check after waiting on another holder, that holder's
// word decides before the flight's earlier producer's late failure: a
// value it published without storing is the answer (as in every peer).
func TestGetExternal_TakeoverCheckHoldersValueBeforeALateFailure(t *testing.T) {
	b := realBackend(t)
	raw := rawClient(t, b.addr)
	tag := "latetv"
	var token atomic.Value
	var starts atomic.Int64
	var other, published atomic.Bool
	c := newTestClient(t, b.addr, tag, &Options{LockTTL: time.Second})
	c.rdb.AddHook(hookEach(func(cmd redis.Cmder) {
		if !(isLookup(cmd, tag+":a") && starts.Load() == 1) {
			return
		}
		switch {
		case !other.Load():
			if raw.SetNX(bg(), tag+"/lock:a", "other", time.Second).Val() {
				other.Store(true)
			}
		case !published.Swap(true):
			// The other holder published a value without storing it and
			// let its lock go; the earlier producer's failure came first.
			raw.Del(bg(), tag+"/lock:a")
			raw.Publish(bg(), tag+"/lock-event:a", "fail\n"+token.Load().(string)+"\ngave up late")
			raw.Publish(bg(), tag+"/notif:a", "the other's value")
		}
	}))
	ctx, cancel := context.WithTimeout(bg(), 20*time.Second)
	defer cancel()
	v, err := c.GetExternal(ctx, "a", recordStart(&token, &starts))
	if !published.Load() {
		t.Fatal("the flight never took the lock over from the other holder")
	}
	if err != nil || string(v) != "the other's value" {
		t.Errorf("GetExternal = %q, %v, want the other holder's value", v, err)
	}
	if n := starts.Load(); n != 1 {
		t.Errorf("start ran %d times", n)
	}
}

// At a re-take of its own lock, the takeover check lets a value decide
// before its earlier producer's late word, wherever each comes in what the
// check reads (PROTOCOL.md [E1a]: "at a re-take of its own lock ([X4]), a
// value"), as Python and C# do.
func TestGetExternal_OwnRetakeValueDecidesBeforeAWordReadFirstInTheCheck(t *testing.T) {
	b := realBackend(t)
	raw := rawClient(t, b.addr)
	tag := "rv-ownvalfirst"
	c := newTestClient(t, b.addr, tag, &Options{LockTTL: time.Second})
	var starts atomic.Int64
	var token atomic.Value
	var published atomic.Bool
	c.rdb.AddHook(hookEach(func(cmd redis.Cmder) {
		if isLookup(cmd, tag+":a") && starts.Load() == 1 && !published.Swap(true) {
			// The lookup after the lock expired, sent after the earlier
			// producer's late failure and then a value (published only).
			raw.Publish(bg(), tag+"/lock-event:a", "fail\n"+token.Load().(string)+"\ngave up late")
			raw.Publish(bg(), tag+"/notif:a", "late value")
		}
	}))
	ctx, cancel := context.WithTimeout(bg(), 20*time.Second)
	defer cancel()
	v, err := c.GetExternal(ctx, "a", recordStart(&token, &starts))
	if !published.Load() {
		t.Fatal("the lookup after the lock expired was never sent")
	}
	if n := starts.Load(); n != 1 {
		t.Errorf("start ran %d times", n)
	}
	if err != nil || string(v) != "late value" {
		t.Errorf("GetExternal = %q, %v, want the value, which decides before the word in the own re-take's check", v, err)
	}
}

// A flight that takes its own expired lock again and then, while it gets
// live, receives its earlier producer's value never starts again: its wait
// is recorded as one that got a value, not as one that got nothing (result
// "none", as for a lock taken over to compute).
func TestGetExternal_ValueWhileGettingLiveAtARetakeIsNoWaitForNothing(t *testing.T) {
	b := realBackend(t)
	raw := rawClient(t, b.addr)
	tag := "rv-livevalue"
	mp, reader := newReader(t)
	c := pingGatedClient(t, b.addr, tag, &Options{LockTTL: time.Second, MeterProvider: mp})
	var starts atomic.Int64
	var published atomic.Bool
	c.rdb.AddHook(hookEach(func(cmd redis.Cmder) {
		if isLookup(cmd, tag+":a") && starts.Load() == 1 && !published.Swap(true) {
			raw.Publish(bg(), tag+"/notif:a", "late value")
		}
	}))
	ctx, cancel := context.WithTimeout(bg(), 20*time.Second)
	defer cancel()
	v, err := c.GetExternal(ctx, "a", func(context.Context, *Lease) error {
		starts.Add(1)
		return nil
	})
	if err != nil || string(v) != "late value" {
		t.Fatalf("GetExternal = %q, %v, want the earlier producer's value", v, err)
	}
	if n := starts.Load(); n != 1 {
		t.Fatalf("start ran %d times", n)
	}
	// The wait is recorded once its callers have their answer.
	var rm metricdata.ResourceMetrics
	eventually(t, 5*time.Second, "the wait to be recorded", func() bool {
		rm = collect(t, reader, tag)
		return histCount(rm, "memolock.wait.duration") > 0
	})
	if n := histCount(rm, "memolock.wait.duration", attr("result", "none")); n != 0 {
		t.Errorf("wait.duration result=none: %d, want 0: the wait ended with a value, nothing was started again", n)
	}
	if n := histCount(rm, "memolock.wait.duration", attr("result", "value")); n != 1 {
		t.Errorf("wait.duration result=value: %d, want 1", n)
	}
}

// A winner that took the lock over after waiting on another holder H,
// and then acts on its producer's word kept from a read that sent it to
// look again (the lookup finding the lock still its own), publishes the
// word again under its own token and under H's ([E1a]: "If the winner took
// the lock over after waiting on another holder H, it SHOULD also publish
// the word under H's token"), as Python does: H is the holder it took over
// from, not the one it waited on last (by then its own token).
func TestGetExternal_WordActedOnWithTheLockStillOursAfterATakeoverIsSaidUnderTheOldHolder(t *testing.T) {
	b := realBackend(t)
	raw := rawClient(t, b.addr)
	tag := "rv-stilloursrelay"
	c := newTestClient(t, b.addr, tag, &Options{LockTTL: 3 * time.Second})
	if err := raw.Set(bg(), tag+"/lock:a", "other", 500*time.Millisecond).Err(); err != nil {
		t.Fatal(err)
	}
	events := subscribeTo(t, raw, tag+"/lock-event:a")
	ctx, cancel := context.WithTimeout(bg(), 20*time.Second)
	defer cancel()
	var token atomic.Value
	_, err := c.GetExternal(ctx, "a", func(_ context.Context, l *Lease) error {
		token.Store(l.Token())
		pipe := raw.TxPipeline()
		pipe.Publish(bg(), tag+"/lock-event:a", "progress\n"+l.Token()+"\n")
		pipe.Publish(bg(), tag+"/lock-event:a", "fail\n"+l.Token()+"\ngave up late")
		if _, err := pipe.Exec(bg()); err != nil {
			return err
		}
		time.Sleep(200 * time.Millisecond)
		return nil
	})
	wantLateWord(t, "fail", err)
	if n := c.Stats().Takeovers; n != 1 {
		t.Fatalf("Stats.Takeovers = %d, want 1 (the lock taken over from the other holder)", n)
	}
	eventually(t, 5*time.Second, "the lock to go", func() bool { return raw.Exists(bg(), tag+"/lock:a").Val() == 0 })
	time.Sleep(100 * time.Millisecond)
	raw.Publish(bg(), tag+"/lock-event:a", "end of test")
	tok := token.Load().(string)
	wantEvents(t, eventsUntilEnd(events), "progress\n"+tok+"\n", "fail\n"+tok+"\ngave up late", lateWord("fail", tok), lateWord("fail", "other"))
}

// A lookup that finds a cached "not found" ({pttl}) while an external
// winner holds its own lock ends the flight with ErrNotFound, and the lock
// goes first, with abandon and no linger (PROTOCOL.md [L4]): nothing of
// the flight's was stored to keep it for.
func TestGetExternal_CachedNotFoundWithTheLockStillOursReleasesWithNoLinger(t *testing.T) {
	b := realBackend(t)
	raw := rawClient(t, b.addr)
	tag := "ownpttl"
	c := newTestClient(t, b.addr, tag, &Options{LockTTL: 30 * time.Second})
	events := subscribeTo(t, raw, tag+"/lock-event:a")
	var token atomic.Value
	var starts atomic.Int64
	ctx, cancel := context.WithTimeout(bg(), 20*time.Second)
	defer cancel()
	began := time.Now()
	_, err := c.GetExternal(ctx, "a", func(_ context.Context, l *Lease) error {
		starts.Add(1)
		token.Store(l.Token())
		if err := raw.Set(bg(), tag+"/lock-notfound:a", "", time.Minute).Err(); err != nil {
			return err
		}
		// An event of a kind the winner does not know: it looks again.
		return raw.Publish(bg(), tag+"/lock-event:a", "progress\n"+l.Token()+"\n").Err()
	})
	took := time.Since(began)
	if n := raw.Exists(bg(), tag+"/lock:a").Val(); n != 0 {
		t.Errorf("the lock is still there (%q): released with a linger, or not at all", raw.Get(bg(), tag+"/lock:a").Val())
	}
	if !errors.Is(err, ErrNotFound) {
		t.Fatalf("GetExternal: %v, want ErrNotFound", err)
	}
	if n := starts.Load(); n != 1 {
		t.Errorf("start ran %d times", n)
	}
	if took > 15*time.Second {
		t.Errorf("took %v: not promptly, only after the lock TTL", took)
	}
	raw.Publish(bg(), tag+"/lock-event:a", "end of test")
	tok := token.Load().(string)
	wantEvents(t, eventsUntilEnd(events), "progress\n"+tok+"\n", "abandon\n"+tok+"\n")
}

// A flight that took the lock over from h1, started, lost its lock to
// "other" while its producer was silent, kept the producer's late word
// while it waited on "other", and then took "other"'s lock: the word goes
// again under its own token and under "other", the holder it took over
// from last, not under h1 ([E1a]).
func TestGetExternal_LateWordAfterTwoTakeoversIsSaidUnderTheLastHolder(t *testing.T) {
	b := realBackend(t)
	raw := rawClient(t, b.addr)
	kind := "fail"
	tag := "tworelay"
	var token atomic.Value
	var starts atomic.Int64
	var told atomic.Bool
	c := newTestClient(t, b.addr, tag, &Options{LockTTL: time.Second, OnWait: func(_, holder string) {
		if holder == "other" && !told.Swap(true) {
			raw.Publish(bg(), tag+"/lock-event:a", kind+"\n"+token.Load().(string)+"\ngave up late")
		}
	}})
	var other atomic.Bool
	c.rdb.AddHook(hookEach(func(cmd redis.Cmder) {
		if isLookup(cmd, tag+":a") && starts.Load() == 1 && !other.Load() {
			if raw.SetNX(bg(), tag+"/lock:a", "other", time.Second).Val() {
				other.Store(true)
			}
		}
	}))
	if err := raw.Set(bg(), tag+"/lock:a", "h1", 500*time.Millisecond).Err(); err != nil {
		t.Fatal(err)
	}
	events := subscribeTo(t, raw, tag+"/lock-event:a")
	ctx, cancel := context.WithTimeout(bg(), 20*time.Second)
	defer cancel()
	_, err := c.GetExternal(ctx, "a", recordStart(&token, &starts))
	if !told.Load() {
		t.Fatal("the flight never waited on the other holder")
	}
	if n := starts.Load(); n != 1 {
		t.Fatalf("start ran %d times", n)
	}
	wantLateWord(t, kind, err)
	eventually(t, 5*time.Second, "the lock to go", func() bool { return raw.Exists(bg(), tag+"/lock:a").Val() == 0 })
	time.Sleep(100 * time.Millisecond)
	raw.Publish(bg(), tag+"/lock-event:a", "end of test")
	tok := token.Load().(string)
	seen := eventsUntilEnd(events)
	wantEvents(t, seen, kind+"\n"+tok+"\ngave up late", lateWord(kind, tok), lateWord(kind, "other"))
}

// recordStart is a start function that counts its calls in starts and
// keeps the lease's token in token.
func recordStart(token *atomic.Value, starts *atomic.Int64) StartFunc {
	return func(_ context.Context, l *Lease) error {
		token.Store(l.Token())
		starts.Add(1)
		return nil
	}
}

// As for a computation (see
// TestGet_ACallerAfterTheComputationEndedLooksAfreshWhileItsStoreIsHeld),
// so for external work: once the producer's value, or its failure, has
// come, the flight releases its lock before its callers have their answer
// (held here; a master that just died holds it for a second), and a
// caller who begins meanwhile, after another process's Set, gets the Set's
// value, not the producer's older answer.
func TestGetExternal_ACallerAfterTheAnswerCameLooksAfreshWhileTheReleaseIsHeld(t *testing.T) {
	sc := wire.ScriptsFor(false)
	for _, tc := range []struct {
		name    string
		produce func(ctx context.Context, raw *redis.Client, keys wire.Keys, token string) error
		want    string // the flight's own caller's answer, or its prefix
	}{
		{"value", func(ctx context.Context, raw *redis.Client, keys wire.Keys, token string) error {
			n, err := sc.Store.Run(ctx, raw, keys.ID("k"), token, "produced", wire.TTLMillis(time.Minute),
				keys.Notif("k"), keys.Events("k"), wire.LockLinger.Milliseconds(), 0).Int()
			if err == nil && n != 1 {
				err = fmt.Errorf("store script answered %d", n)
			}
			return err
		}, "produced"},
		{"failure", func(ctx context.Context, raw *redis.Client, keys wire.Keys, token string) error {
			return raw.Publish(ctx, keys.Events("k"), "fail\n"+token+"\nboom").Err()
		}, "error: "},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := miniBackend(t)
			const tag = "extsealed"
			c := newTestClient(t, b.addr, tag, &Options{LockTTL: 30 * time.Second})
			other := newTestClient(t, b.addr, tag, nil)
			raw := rawClient(t, b.addr)
			held, release := holdScript(t, c, sc.Release, wire.ReleaseSrc)
			ctx, cancel := context.WithTimeout(bg(), 20*time.Second)
			defer cancel()
			var token atomic.Value
			var starts atomic.Int64
			first := make(chan string, 1)
			go func() {
				v, err := c.GetExternal(ctx, "k", recordStart(&token, &starts))
				if err != nil {
					first <- "error: " + err.Error()
					return
				}
				first <- string(v)
			}()
			eventually(t, 10*time.Second, "start to run", func() bool { return starts.Load() == 1 })
			if err := tc.produce(ctx, raw, wire.NewKeys(tag), token.Load().(string)); err != nil {
				t.Fatalf("the producer: %v", err)
			}
			wantTheWriteAfterAHeldFlight(t, ctx, c, other, held, release, "answer")
			select {
			case got := <-first:
				if !strings.HasPrefix(got, tc.want) {
					t.Errorf("the flight's own caller got %q, want %q", got, tc.want)
				}
			case <-time.After(10 * time.Second):
				t.Error("the flight's own caller had no answer after 10s")
			}
		})
	}
}
