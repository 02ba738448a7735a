package pubsub

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/memolock/memolock/internal/redistest"
)

// realSubscriber returns a subscriber of srv, closed when the test ends,
// and a client to publish with.
func realSubscriber(t *testing.T, addr string, cfg Config) (*Subscriber, *redis.Client) {
	t.Helper()
	rdb := redis.NewClient(&redis.Options{Addr: addr}) // RESP3, the default
	s := New(rdb, cfg)
	t.Cleanup(func() {
		s.Close(5 * time.Second)
		_ = rdb.Close()
	})
	return s, rdb
}

var bg = context.Background()

func publish(t *testing.T, rdb *redis.Client, ch, payload string) {
	t.Helper()
	if err := rdb.Publish(bg, ch, payload).Err(); err != nil {
		t.Fatal(err)
	}
}

// pubsubClientID returns the id of the server's only pub/sub connection.
func pubsubClientID(t *testing.T, srv *redistest.Server) string {
	t.Helper()
	var id string
	waitFor(t, "one pub/sub connection", func() bool {
		list, _ := srv.Do(t, "CLIENT", "LIST", "TYPE", "pubsub").(string)
		lines := strings.Fields(strings.TrimSpace(list))
		ids := 0
		for _, f := range lines {
			if v, ok := strings.CutPrefix(f, "id="); ok {
				id = v
				ids++
			}
		}
		return ids == 1
	})
	return id
}

func TestRealValuesMessagesAndSync(t *testing.T) {
	srv := redistest.Start(t)
	s, rdb := realSubscriber(t, srv.Addr, Config{})
	values := make(chan string, 1)
	w, c := liveWatch(t, s, func(p string) { values <- p }, "n:a", "e:a")
	for i := range 100 {
		publish(t, rdb, "e:a", fmt.Sprint(i))
	}
	w.Sync()
	waitFor(t, "synced", func() bool { return c.get().Synced })
	if n := len(c.get().Messages); n != 100 {
		t.Fatalf("synced with %d of the 100 messages published before", n)
	}
	publish(t, rdb, "n:a", "v")
	if v := <-values; v != "v" {
		t.Fatalf("value %q", v)
	}
	w.Stop()
	waitFor(t, "the unsubscription", func() bool { return s.Channels() == 0 })
}

func TestRealClientKillAndRestart(t *testing.T) {
	srv := redistest.Start(t)
	s, rdb := realSubscriber(t, srv.Addr, Config{})
	_, c := liveWatch(t, s, nil, "a")
	srv.Do(t, "CLIENT", "KILL", "TYPE", "pubsub")
	waitFor(t, "a reread after CLIENT KILL", func() bool { return c.get().Reread })
	publish(t, rdb, "a", "after kill")
	waitFor(t, "the message", func() bool { return c.has("after kill") })
	c.reset()
	srv.Restart(t)
	waitFor(t, "a reread after a restart", func() bool { return c.get().Reread })
	publish(t, rdb, "a", "after restart")
	waitFor(t, "the message", func() bool { return c.has("after restart") })
	if n := s.stats.Reconnects.Load(); n < 2 {
		t.Fatalf("%d reconnects", n)
	}
}

func TestRealSilentConnectionIsReplaced(t *testing.T) {
	srv := redistest.Start(t)
	proxy := redistest.StartProxy(t, srv.Addr)
	s, rdb := realSubscriber(t, proxy.Addr, Config{Health: 100 * time.Millisecond})
	_, c := liveWatch(t, s, nil, "a")
	if proxy.SilencePubSub() != 1 {
		t.Fatal("no pub/sub connection to silence")
	}
	waitFor(t, "a reread on a new connection", func() bool { return c.get().Reread })
	publish(t, rdb, "a", "v")
	waitFor(t, "the message", func() bool { return c.has("v") })
}

// TestRealMassParkingCostsFewCommands parks 10,000 waits at once on one
// node, each with a value channel and an event channel, delivers their
// values, and ends them: at most 0.1 pub/sub commands per key.
func TestRealMassParkingCostsFewCommands(t *testing.T) {
	const keys = 10_000
	srv := redistest.Start(t)
	stats := new(Stats)
	s, rdb := realSubscriber(t, srv.Addr, Config{Stats: stats})
	var live, done sync.WaitGroup
	live.Add(keys)
	done.Add(keys)
	for i := range keys {
		go func() {
			defer done.Done()
			got := make(chan struct{})
			w := s.Watch(func(string) { close(got) }, fmt.Sprint("n:", i), fmt.Sprint("e:", i))
			defer w.Stop()
			for !w.Take().Reread {
				<-w.Signal()
			}
			live.Done()
			<-got
		}()
	}
	live.Wait()
	pipe := rdb.Pipeline()
	for i := range keys {
		pipe.Publish(bg, fmt.Sprint("n:", i), "v")
	}
	if _, err := pipe.Exec(bg); err != nil {
		t.Fatal(err)
	}
	done.Wait()
	waitFor(t, "every channel unsubscribed", func() bool { return s.Channels() == 0 })
	cmds := stats.Subscribes.Load() + stats.Unsubscribes.Load() + stats.Pings.Load()
	perKey := float64(cmds) / keys
	t.Logf("%d commands for %d keys: %.3f per key", cmds, keys, perKey)
	if perKey > 0.1 {
		t.Fatalf("%.3f pub/sub commands per key, over 0.1", perKey)
	}
}

// logCounter counts the log records at each level.
type logCounter struct {
	mu     sync.Mutex
	counts map[slog.Level]int
	msgs   []string
}

func newLogCounter() (*logCounter, *slog.Logger) {
	lc := &logCounter{counts: make(map[slog.Level]int)}
	return lc, slog.New(lc)
}

func (lc *logCounter) Enabled(context.Context, slog.Level) bool { return true }
func (lc *logCounter) WithAttrs([]slog.Attr) slog.Handler       { return lc }
func (lc *logCounter) WithGroup(string) slog.Handler            { return lc }
func (lc *logCounter) Handle(_ context.Context, r slog.Record) error {
	lc.mu.Lock()
	defer lc.mu.Unlock()
	lc.counts[r.Level]++
	line := r.Message
	r.Attrs(func(a slog.Attr) bool { line += " " + a.String(); return true })
	lc.msgs = append(lc.msgs, line)
	return nil
}

func (lc *logCounter) count(l slog.Level) int {
	lc.mu.Lock()
	defer lc.mu.Unlock()
	return lc.counts[l]
}

func (lc *logCounter) contains(s string) bool {
	lc.mu.Lock()
	defer lc.mu.Unlock()
	for _, m := range lc.msgs {
		if strings.Contains(m, s) {
			return true
		}
	}
	return false
}

// TestRealWriteFailureInsideACall fails the write of a marker PING: go-redis
// dials again and resubscribes inside that call, and what was published in
// between is lost, so the subscriber replaces the connection and every
// watch looks again.
func TestRealWriteFailureInsideACall(t *testing.T) {
	srv := redistest.Start(t)
	var faults redistest.Faults
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, Dialer: faults.Dial(srv.Addr)})
	s := New(rdb, Config{})
	defer func() {
		s.Close(5 * time.Second)
		_ = rdb.Close()
	}()
	_, old := liveWatch(t, s, nil, "a")
	faults.FailPubSubWrite(markerPrefix)
	_, fresh := liveWatch(t, s, nil, "b")
	waitFor(t, "the old watch to look again", func() bool { return old.get().Reread })
	if n := s.stats.Reconnects.Load(); n != 1 {
		t.Fatalf("%d reconnects", n)
	}
	publish(t, rdb, "a", "1")
	publish(t, rdb, "b", "2")
	waitFor(t, "both messages", func() bool { return old.has("1") && fresh.has("2") })
}
