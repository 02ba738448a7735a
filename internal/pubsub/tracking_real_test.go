package pubsub

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/memolock/memolock/internal/redistest"
)

// realTracking returns a subscriber of addr that tracks the keys under
// "t:", and the invalidations it received.
func realTracking(t *testing.T, opts *redis.Options, cfg Config) (*Subscriber, *invalidations) {
	t.Helper()
	var iv invalidations
	cfg.Track = []string{"t:"}
	cfg.OnInvalidate = iv.add
	rdb := redis.NewClient(opts)
	s := New(rdb, cfg)
	t.Cleanup(func() {
		s.Close(5 * time.Second)
		_ = rdb.Close()
	})
	return s, &iv
}

func (iv *invalidations) has(key string) bool {
	for _, keys := range iv.get() {
		if slices.Contains(keys, key) {
			return true
		}
	}
	return false
}

func TestRealTrackingInvalidatesAndEndsOnAKill(t *testing.T) {
	srv := redistest.Start(t)
	s, iv := realTracking(t, &redis.Options{Addr: srv.Addr}, Config{})
	waitTracking(t, s)
	epoch, _ := s.Tracking()
	srv.Do(t, "SET", "t:a", "1")
	srv.Do(t, "SET", "other", "1")
	waitFor(t, "the invalidation of t:a", func() bool { return iv.has("t:a") })
	if iv.has("other") {
		t.Fatal("a key outside the prefix was invalidated")
	}
	srv.Do(t, "CLIENT", "KILL", "TYPE", "pubsub")
	waitFor(t, "tracking to end", func() bool { e, _ := s.Tracking(); return e != epoch })
	waitTracking(t, s)
	srv.Do(t, "SET", "t:b", "1")
	waitFor(t, "an invalidation on the new connection", func() bool { return iv.has("t:b") })
}

// TestRealTrackingFlushAllKeepsTheConnection: FLUSHALL sends an
// invalidation with a nil payload, which go-redis cannot decode. It is
// "every key" for OnInvalidate, and the connection stays. (Before: the
// decoding error replaced the connection, by accident.)
func TestRealTrackingFlushAllKeepsTheConnection(t *testing.T) {
	srv := redistest.Start(t)
	s, iv := realTracking(t, &redis.Options{Addr: srv.Addr}, Config{})
	waitTracking(t, s)
	epoch, _ := s.Tracking()
	srv.Do(t, "SET", "t:a", "1")
	waitFor(t, "the invalidation of t:a", func() bool { return iv.has("t:a") })
	srv.Do(t, "FLUSHALL")
	waitFor(t, "the flush", func() bool { return slices.ContainsFunc(iv.get(), func(k []string) bool { return k == nil }) })
	srv.Do(t, "SET", "t:b", "1")
	waitFor(t, "an invalidation after the flush", func() bool { return iv.has("t:b") })
	if e, live := s.Tracking(); e != epoch || !live || s.stats.Reconnects.Load() != 0 {
		t.Fatalf("after FLUSHALL: epoch %d (was %d), live %v, %d reconnects", e, epoch, live, s.stats.Reconnects.Load())
	}
}

// TestRealTrackingComesBackAfterABusyScript: the tracking connection is
// killed while a script keeps Redis busy, so that every new connection
// meets BUSY on CLIENT ID. Those refusals pass: once the script is
// killed, tracking is live again, with the same subscriber. (Before: the
// first BUSY set "refused" for the client's life.)
func TestRealTrackingComesBackAfterABusyScript(t *testing.T) {
	srv := redistest.Start(t, "--busy-reply-threshold", "50")
	logs, log := newLogCounter()
	s, iv := realTracking(t, &redis.Options{Addr: srv.Addr}, Config{Log: log})
	waitTracking(t, s)
	id := pubsubClientID(t, srv)
	script := startBusyScript(t, srv.Addr, "CLIENT", "KILL", "ID", id)
	defer script.Close()
	waitFor(t, "redials refused while busy", func() bool { return s.stats.Reconnects.Load() >= 3 })
	if _, live := s.Tracking(); live {
		t.Fatal("tracking live while Redis refuses it")
	}
	srv.Do(t, "SCRIPT", "KILL")
	waitTracking(t, s)
	srv.Do(t, "SET", "t:a", "1")
	waitFor(t, "an invalidation after the script", func() bool { return iv.has("t:a") })
	if !logs.contains("BUSY") {
		t.Fatalf("no redial met BUSY: %q", logs.msgs)
	}
}

// TestRealBusySubscribeIsRetried: a watch that comes while a script runs
// meets BUSY on SUBSCRIBE; it is retried, not failed, and goes live once
// the script ends.
func TestRealBusySubscribeIsRetried(t *testing.T) {
	srv := redistest.Start(t, "--busy-reply-threshold", "50")
	s, rdb := realSubscriber(t, srv.Addr, Config{})
	liveWatch(t, s, nil, "warm") // the connection exists before the script
	script := startBusyScript(t, srv.Addr)
	defer script.Close()
	waitFor(t, "Redis to be busy", func() bool { return rdb.Ping(bg).Err() != nil })
	w := s.Watch(nil, "a")
	c := collect(t, w)
	waitFor(t, "refusals", func() bool { return s.stats.Reconnects.Load() >= 2 || c.get().Err != nil })
	if err := c.get().Err; err != nil {
		t.Fatalf("a transient refusal failed the watch: %v", err)
	}
	srv.Do(t, "SCRIPT", "KILL")
	waitFor(t, "the watch to go live", func() bool { return c.get().Reread })
	publish(t, rdb, "a", "v")
	waitFor(t, "the message", func() bool { return c.has("v") })
}

// startBusyScript sends first (if any) and then an endless script on a
// connection of its own, in one write, so that Redis runs both before it
// serves anyone else. The script runs until SCRIPT KILL.
func startBusyScript(t *testing.T, addr string, first ...string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for _, cmd := range [][]string{first, {"EVAL", "while true do end", "0"}} {
		if len(cmd) == 0 {
			continue
		}
		fmt.Fprintf(&b, "*%d\r\n", len(cmd))
		for _, a := range cmd {
			fmt.Fprintf(&b, "$%d\r\n%s\r\n", len(a), a)
		}
	}
	if _, err := c.Write([]byte(b.String())); err != nil {
		t.Fatal(err)
	}
	return c // the replies stay in Redis's buffer until the script ends
}

// TestRealTrackingRefusedByAnACLIsLoggedOnceAndAskedAgain: a user who may
// not run CLIENT gets no tracking, a warning, and working watches; once
// the ACL allows it, the next connection tracks. Nothing is remembered
// for ever.
func TestRealTrackingRefusedByAnACLIsLoggedOnceAndAskedAgain(t *testing.T) {
	srv := redistest.Start(t)
	srv.Do(t, "ACL", "SETUSER", "limited", "on", ">pw", "~*", "&*", "+@all", "-client")
	logs, log := newLogCounter()
	opts := &redis.Options{Addr: srv.Addr, Username: "limited", Password: "pw", Protocol: 2}
	s, iv := realTracking(t, opts, Config{Log: log})
	ctx, cancel := context.WithTimeout(bg, 10*time.Second)
	defer cancel()
	if err := s.WaitTracking(ctx); err == nil || !strings.Contains(err.Error(), "NOPERM") {
		t.Fatalf("WaitTracking with CLIENT refused: %v", err)
	}
	_, c := liveWatch(t, s, nil, "a") // watches work without tracking
	srv.Do(t, "CLIENT", "KILL", "USER", "limited")
	waitFor(t, "a reread", func() bool { return c.get().Reread })
	if n := logs.count(slog.LevelWarn); n != 1 {
		t.Fatalf("%d warnings for the same refusal, want 1: %q", n, logs.msgs)
	}
	srv.Do(t, "ACL", "SETUSER", "limited", "+client")
	epoch, _ := s.Tracking()
	srv.Do(t, "CLIENT", "KILL", "USER", "limited")
	waitFor(t, "the kill to be seen", func() bool { e, _ := s.Tracking(); return e != epoch })
	waitTracking(t, s)
	srv.Do(t, "SET", "t:a", "1")
	waitFor(t, "an invalidation", func() bool { return iv.has("t:a") })
}

func TestRealRefusedChannelsGetTheError(t *testing.T) {
	srv := redistest.Start(t)
	srv.Do(t, "ACL", "SETUSER", "chan", "on", ">pw", "~*", "resetchannels", "&ok:*", "+@all")
	rs, _ := realSubscriber(t, srv.Addr, Config{})
	rs.Close(time.Second)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, Username: "chan", Password: "pw", Protocol: 2})
	defer rdb.Close()
	rs = New(rdb, Config{})
	defer rs.Close(5 * time.Second)
	denied := collect(t, rs.Watch(nil, "no:1"))
	allowed := collect(t, rs.Watch(nil, "ok:1"))
	waitFor(t, "the refusal and the live watch", func() bool { return denied.get().Err != nil && allowed.get().Reread })
	var reply redis.Error
	if !errors.As(denied.get().Err, &reply) || !strings.HasPrefix(reply.Error(), "NOPERM") {
		t.Fatalf("the denied watch got %v", denied.get().Err)
	}
}

// A tracking subscriber is made from the options of a client that go-redis
// may be connecting at that moment (on a cluster, a master's client that
// go-redis made and uses). go-redis's first handshake on a server without
// maintenance notifications turns them off in the options it shares, under
// a lock of its own: copying the options must not read that setting. The
// race detector, which CI runs, is what fails this test without the fix.
func TestRealTrackingFromAClientBeingConnected(t *testing.T) {
	srv := redistest.Start(t)
	for range 3 {
		base := redis.NewClient(&redis.Options{Addr: srv.Addr})
		pinged := make(chan error, 1)
		go func() { pinged <- base.Ping(context.Background()).Err() }()
		s := New(base, Config{Track: []string{"t:"}, OnInvalidate: func([]string) {}})
		waitTracking(t, s)
		if err := <-pinged; err != nil {
			t.Fatal(err)
		}
		s.Close(5 * time.Second)
		_ = base.Close()
	}
}
