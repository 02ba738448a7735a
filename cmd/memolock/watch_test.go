//go:build unix

package main

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/memolock/memolock"
	"github.com/memolock/memolock/internal/redistest"
)

// startWatch starts memolock watch in the background and returns once it
// says that it listens.
func startWatch(t *testing.T, args ...string) *background {
	t.Helper()
	b := startMemolock(t, append([]string{"watch"}, args...)...)
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(b.errb.String(), "memolock watch: watching tag ") {
		select {
		case inv := <-b.done:
			t.Fatalf("watch %v ended: exit %d, stderr %q", args, inv.code, inv.stderr)
		case <-time.After(5 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("watch %v not listening after 10s: %q", args, b.errb.String())
		}
	}
	return b
}

// waitLine waits until watch prints a line that matches re, after its
// timestamp.
func waitLine(t *testing.T, b *background, re string) {
	t.Helper()
	line := regexp.MustCompile(`(?m)^\S+ ` + re + `$`)
	eventually(t, 10*time.Second, "a line matching "+re+" in:\n"+b.out.String(), func() bool {
		return line.MatchString(b.out.String())
	})
}

// stop sends sig to watch and returns how it ended, which must be exit 0
// within 10s.
func (b *background) stop(t *testing.T, sig syscall.Signal) invocation {
	t.Helper()
	if err := b.cmd.Process.Signal(sig); err != nil {
		t.Fatal(err)
	}
	inv := b.wait(t, 10*time.Second, "watch after "+sig.String())
	if inv.code != 0 {
		t.Errorf("watch after %v: exit %d, stderr %q", sig, inv.code, inv.stderr)
	}
	return inv
}

func failing(msg string) memolock.FetchFunc {
	return func(context.Context, *memolock.Lease) ([]byte, time.Duration, error) {
		return nil, 0, errors.New(msg)
	}
}

func value(v string, ttl time.Duration) memolock.FetchFunc {
	return func(context.Context, *memolock.Lease) ([]byte, time.Duration, error) {
		return []byte(v), ttl, nil
	}
}

// On one server with keyspace events for expired keys, watch shows values
// (by size), holder failures, abandons, "not found", stale values and
// takeovers, but not the lock that lingers after a store; SIGINT ends it
// with exit 0.
func TestWatch_SingleNodeFeed(t *testing.T) {
	srv := redistest.Start(t, "--notify-keyspace-events", "Kx")
	rdb := srv.Client(t)
	ctx := context.Background()
	b := startWatch(t, "--redis", "redis://"+srv.Addr, "--tag", "feed")
	c := newClient(t, rdb, "feed", &memolock.Options{NegTTL: time.Minute, StaleTTL: time.Hour, ResurrectTTL: 300 * time.Millisecond})

	secret := "the-value-s3cret-bytes"
	if _, err := c.Get(ctx, "a", value(secret, time.Minute)); err != nil {
		t.Fatal(err)
	}
	waitLine(t, b, fmt.Sprintf(`value +id=a size=%d published`, len(secret)))

	if _, err := c.Get(ctx, "b", failing("boom: the database said no\nstack trace")); err == nil {
		t.Fatal("failing fetch: no error")
	}
	waitLine(t, b, `fail +id=b holder=[0-9a-f]{32}@\S+ message="boom: the database said no"`)

	if _, err := c.Get(ctx, "nf2", func(context.Context, *memolock.Lease) ([]byte, time.Duration, error) {
		return nil, 0, memolock.ErrNotFound
	}); !errors.Is(err, memolock.ErrNotFound) {
		t.Fatal(err)
	}
	waitLine(t, b, `notfound +id=nf2 holder=\S+: fetch found nothing`)

	rdb.Set(ctx, "feed/lock:ab", "token-ab", time.Minute)
	if _, err := c.Delete(ctx, "ab"); err != nil {
		t.Fatal(err)
	}
	waitLine(t, b, `abandon +id=ab holder=token-ab: .*`)

	// A stale value put back, and the end of its time.
	if _, err := c.Get(ctx, "st", value("old-s3cret", 50*time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "the value to expire", func() bool { return rdb.Exists(ctx, "feed:st", "feed/lock:st").Val() == 0 })
	if r, err := c.GetResult(ctx, "st", failing("down")); err != nil || r.Served != memolock.ServedStale {
		t.Fatalf("stale Get: %v %v", r.Served, err)
	}
	waitLine(t, b, `stale +id=st holder=\S+: fetch failed; a stale value is served`)
	waitLine(t, b, `refetch +id=st .*`)

	// A holder that died: its lock expires without a value. The lock that
	// lingered after a's store expired earlier, and showed nothing.
	eventually(t, 10*time.Second, "a's lingering lock to expire", func() bool { return rdb.Exists(ctx, "feed/lock:a").Val() == 0 })
	rdb.Set(ctx, "feed/lock:dead", "a-holder-that-died", 100*time.Millisecond)
	waitLine(t, b, `takeover +id=dead lock expired: holder gone, next caller takes over`)

	inv := b.stop(t, syscall.SIGINT)
	if strings.Contains(inv.stdout, "s3cret") {
		t.Errorf("a value's bytes were printed:\n%s", inv.stdout)
	}
	for _, not := range []string{"takeover id=a ", "id=st lock expired", "id=a stale"} {
		if strings.Contains(strings.Join(strings.Fields(inv.stdout), " "), not) {
			t.Errorf("printed %q:\n%s", not, inv.stdout)
		}
	}
	for _, line := range strings.Split(strings.TrimSpace(inv.stdout), "\n") {
		stamp, _, _ := strings.Cut(line, " ")
		if _, err := time.Parse(time.RFC3339Nano, stamp); err != nil {
			t.Errorf("line without a timestamp: %q", line)
		}
	}
	if strings.Contains(inv.stderr, "notify-keyspace-events") {
		t.Errorf("keyspace events are on, but: %q", inv.stderr)
	}
}

// With keyspace events off, watch says once, on stderr, that takeovers
// will not show and which CONFIG SET would show them (keeping the flags
// already set), and never changes the setting. Values still show.
// SIGTERM ends it with exit 0.
func TestWatch_SaysHowToTurnOnKeyspaceEvents(t *testing.T) {
	srv := redistest.Start(t, "--notify-keyspace-events", "Eg")
	b := startWatch(t, "--redis", "redis://"+srv.Addr, "--tag", "feed")
	c := newClient(t, srv.Client(t), "feed", nil)
	if err := c.Set(context.Background(), "x", []byte("12345"), time.Minute); err != nil {
		t.Fatal(err)
	}
	waitLine(t, b, `value +id=x size=5 published`)
	inv := b.stop(t, syscall.SIGTERM)
	if n := strings.Count(inv.stderr, "notify-keyspace-events"); n != 2 || // "is" and "CONFIG SET"
		!strings.Contains(inv.stderr, "takeovers (locks that expire) will not be shown") ||
		!regexp.MustCompile(`CONFIG SET notify-keyspace-events (gEKx|EgKx)\n`).MatchString(inv.stderr) {
		t.Errorf("stderr %q", inv.stderr)
	}
	if got := srv.Client(t).ConfigGet(context.Background(), "notify-keyspace-events").Val()["notify-keyspace-events"]; got != "gE" {
		t.Errorf("notify-keyspace-events changed to %q", got)
	}

	// A server that refuses CONFIG: watch says it could not check, and
	// runs.
	hidden := redistest.Start(t, "--rename-command", "CONFIG", "CONFIG-hidden")
	b = startWatch(t, "--redis", "redis://"+hidden.Addr, "--tag", "feed")
	inv = b.stop(t, syscall.SIGINT)
	if !strings.Contains(inv.stderr, "could not check notify-keyspace-events") || strings.Count(inv.stderr, "\n") != 2 {
		t.Errorf("stderr %q", inv.stderr)
	}
}

// Without --id, watch subscribes by pattern with the tag's glob characters
// escaped, so another tag that the raw pattern would match stays out; with
// --id it shows those ids only.
func TestWatch_EscapedTagAndIDs(t *testing.T) {
	srv := redistest.Start(t, "--notify-keyspace-events", "Kx")
	rdb := srv.Client(t)
	ctx := context.Background()
	const tag = `g*[x]?\`
	all := startWatch(t, "--redis", "redis://"+srv.Addr, "--tag", tag)
	some := startWatch(t, "--redis", "redis://"+srv.Addr, "--tag", tag, "--id", "one", "--id", "two words", "--id", "one")

	// Tag gAx1 matches the pattern g*[x]?\/notif:* unescaped.
	other := newClient(t, rdb, "gAx1", nil)
	if err := other.Set(ctx, "intruder", []byte("1"), time.Minute); err != nil {
		t.Fatal(err)
	}
	rdb.Set(ctx, "gAx1/lock:intruder-lock", "t", 50*time.Millisecond)
	eventually(t, 10*time.Second, "the lock to expire", func() bool { return rdb.Exists(ctx, "gAx1/lock:intruder-lock").Val() == 0 })
	c := newClient(t, rdb, tag, nil)
	for _, id := range []string{"unwatched", "one"} {
		if err := c.Set(ctx, id, []byte("1"), time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	rdb.Set(ctx, tag+"/lock:two words", "t", 50*time.Millisecond)
	waitLine(t, all, `takeover +id="two words" .*`)
	waitLine(t, some, `takeover +id="two words" .*`)
	for _, tc := range []struct {
		b         *background
		values    int
		unwatched bool
	}{{all, 2, true}, {some, 1, false}} {
		inv := tc.b.stop(t, syscall.SIGINT)
		if strings.Contains(inv.stdout, "intruder") {
			t.Errorf("another tag's traffic shows:\n%s", inv.stdout)
		}
		if strings.Count(inv.stdout, " value ") != tc.values || strings.Contains(inv.stdout, "id=unwatched") != tc.unwatched {
			t.Errorf("want %d values (unwatched: %v):\n%s", tc.values, tc.unwatched, inv.stdout)
		}
	}
}

// On a cluster, with --id, watch reads each id's sharded channels on the
// master of its slot, and keyspace events on every master; without --id,
// it says that only keyspace events show, and shows values stored.
func TestWatch_Cluster(t *testing.T) {
	nodes := redistest.StartCluster(t, 3)
	for _, n := range nodes {
		n.Do(t, "CONFIG", "SET", "notify-keyspace-events", "K$x")
	}
	url := "redis://" + nodes[0].Addr + "?addr=" + nodes[1].Addr
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{nodes[0].Addr}})
	t.Cleanup(func() { _ = cc.Close() })
	ctx := context.Background()
	ids := startWatch(t, "--redis", url, "--cluster", "--tag", "cw", "--id", "a", "--id", "b", "--id", "c")
	keyspace := startWatch(t, "--redis", url, "--cluster", "--tag", "cw")

	c := newClient(t, cc, "cw", nil)
	secret := "cluster-s3cret"
	if _, err := c.Get(ctx, "a", value(secret, time.Minute)); err != nil {
		t.Fatal(err)
	}
	waitLine(t, ids, fmt.Sprintf(`value +id=a size=%d published`, len(secret)))
	waitLine(t, keyspace, fmt.Sprintf(`stored +id=a size=%d`, len(secret)))
	if _, err := c.Get(ctx, "b", failing("boom")); err == nil {
		t.Fatal("no error")
	}
	waitLine(t, ids, `fail +id=b holder=\S+ message="boom"`)
	cc.Set(ctx, "cw/lock:{c}", "a-holder-that-died", 100*time.Millisecond)
	waitLine(t, ids, `takeover +id=c lock expired: holder gone, next caller takes over`)
	waitLine(t, keyspace, `takeover +id=c lock expired: holder gone, next caller takes over`)

	for _, b := range []*background{ids, keyspace} {
		inv := b.stop(t, syscall.SIGINT)
		if strings.Contains(inv.stdout, "s3cret") {
			t.Errorf("a value's bytes were printed:\n%s", inv.stdout)
		}
		if hint := strings.Contains(inv.stderr, "pass --id to see everything"); hint != (b == keyspace) {
			t.Errorf("hint %v, stderr %q", hint, inv.stderr)
		}
		if strings.Contains(inv.stderr, "CONFIG SET") {
			t.Errorf("stderr %q", inv.stderr)
		}
	}

	// Without $ events, watch says what the keyspace feed cannot show.
	for _, n := range nodes {
		n.Do(t, "CONFIG", "SET", "notify-keyspace-events", "Kx")
	}
	inv := startWatch(t, "--redis", url, "--cluster", "--tag", "cw").stop(t, syscall.SIGINT)
	set := regexp.MustCompile(`CONFIG SET notify-keyspace-events '(\S+)' on (\S+), (\S+), (\S+)\n`).FindStringSubmatch(inv.stderr)
	if !strings.Contains(inv.stderr, `values stored and "not found" cached will not be shown`) || strings.Contains(inv.stderr, "takeovers") ||
		set == nil || len(set[1]) != 3 || strings.Trim(set[1], "K$x") != "" {
		t.Errorf("stderr %q", inv.stderr)
	}
}

// When Redis goes away, watch says so once and listens again when it is
// back; what was published meanwhile is missed, and it says that too.
func TestWatch_SurvivesARestart(t *testing.T) {
	srv := redistest.Start(t, "--notify-keyspace-events", "Kx")
	b := startWatch(t, "--redis", "redis://"+srv.Addr, "--tag", "feed")
	srv.Kill()
	eventually(t, 10*time.Second, "watch to notice", func() bool { return strings.Contains(b.errb.String(), "lost the connection") })
	srv.Restart(t)
	eventually(t, 15*time.Second, "watch to subscribe again", func() bool { return strings.Contains(b.errb.String(), "subscribed again") })
	c := newClient(t, srv.Client(t), "feed", nil)
	if err := c.Set(context.Background(), "after", []byte("123"), time.Minute); err != nil {
		t.Fatal(err)
	}
	waitLine(t, b, `value +id=after size=3 published`)
	inv := b.stop(t, syscall.SIGINT)
	if n := strings.Count(inv.stderr, "lost the connection"); n != 1 {
		t.Errorf("%d lines about the lost connection: %q", n, inv.stderr)
	}
}

func TestWatch_BadUsageAndRedisDown(t *testing.T) {
	silent := redistest.Silent(t)
	tooManyIDs := []string{"--tag", "t"}
	for i := range maxWatchIDs + 1 {
		tooManyIDs = append(tooManyIDs, "--id", fmt.Sprint(i))
	}
	cases := []struct {
		args []string
		code int
		want string
	}{
		{nil, 2, "--tag is required"},
		{[]string{"--id", "i"}, 2, "--tag is required"},
		{[]string{"--tag", "t", "--bogus"}, 2, "flag provided but not defined: -bogus"},
		{[]string{"--tag", "t", "extra"}, 2, `unexpected argument "extra"`},
		{[]string{"--tag", "a/notif"}, 2, `contains "/notif"`},
		{[]string{"--tag", "t{x}", "--cluster", "--redis", "redis://127.0.0.1:1"}, 2, "contains a brace"},
		{[]string{"--tag", "t", "--cluster", "--redis", "redis://127.0.0.1:1", "--id", ""}, 2, "cannot be placed"},
		{[]string{"--tag", "t", "--redis", "bogus://h:1"}, 2, "not of the form"},
		{[]string{"--tag", "t", "--redis", "redis://h:1/0?dial_timeout=bogus"}, 2, "not a valid Redis URL"},
		{tooManyIDs, 2, "at most 100"},
		{[]string{"--tag", "t", "--redis", "redis://127.0.0.1:1"}, 1, "connection refused"},
		{[]string{"--tag", "t", "--redis", "redis://127.0.0.1:1?addr=127.0.0.1:2", "--cluster"}, 1, "connection refused"},
		{[]string{"--tag", "t", "--redis", "redis://" + silent}, 1, "Redis did not answer in time"},
		{[]string{"--tag", "t", "--redis", "redis://" + silent, "--cluster", "--id", "i"}, 1, "Redis did not answer in time"},
	}
	for _, tc := range cases {
		inv := memolockCmd(t, nil, append([]string{"watch"}, tc.args...)...)
		if inv.code != tc.code || !strings.Contains(inv.stderr, tc.want) || inv.stdout != "" || inv.took > 15*time.Second {
			t.Errorf("%v: exit %d after %v, stdout %q, stderr %q; want %d and %q", tc.args, inv.code, inv.took, inv.stdout, inv.stderr, tc.code, tc.want)
		}
	}
	if inv := memolockCmd(t, nil, "watch", "-h"); inv.code != 0 || !strings.Contains(inv.stderr, "-id value") {
		t.Errorf("-h: exit %d, %q", inv.code, inv.stderr)
	}
}

func TestWatch_ParseEventAndGlobEscape(t *testing.T) {
	for _, tc := range []struct{ payload, kind, token, msg string }{
		{"fail\ntok\nboom", "fail", "tok", "boom"},
		{"fail\ntok\nboom\nstack", "fail", "tok", "boom"},
		{"abandon\ntok\n", "abandon", "tok", ""},
		{"abandon\ntok", "abandon", "tok", ""},
		{"weird", "weird", "", ""},
		{"fail\ntok\n" + strings.Repeat("é", 3000), "fail", "tok", strings.Repeat("é", 2048)},
	} {
		kind, token, msg := parseEvent(tc.payload)
		if kind != tc.kind || token != tc.token || msg != tc.msg {
			t.Errorf("parseEvent(%q) = %q %q %q", tc.payload, kind, token, msg)
		}
	}
	if got := globEscape(`a*b?c[d]e\f`); got != `a\*b\?c\[d\]e\\f` {
		t.Errorf("globEscape: %s", got)
	}
	for _, tc := range []struct{ flags, need, miss string }{
		{"", "Kx", "Kx"}, {"AK", "K$x", ""}, {"A", "Kx", "K"}, {"gE", "Kx", "Kx"}, {"Kx", "K$x", "$"}, {"xK$", "K$x", ""},
	} {
		if got := missingFlags(tc.flags, tc.need); got != tc.miss {
			t.Errorf("missingFlags(%q, %q) = %q, want %q", tc.flags, tc.need, got, tc.miss)
		}
	}
}
