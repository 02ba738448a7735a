//go:build unix

package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
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
// timestamp. The bound tells "shows it" from "never does" on a loaded
// machine; what watch printed, on both streams, is in the failure.
func waitLine(t *testing.T, b *background, re string) {
	t.Helper()
	const bound = 30 * time.Second
	line := regexp.MustCompile(`(?m)^\S+ ` + re + `$`)
	deadline := time.Now().Add(bound)
	for !line.MatchString(b.out.String()) {
		if time.Now().After(deadline) {
			t.Fatalf("no line matching %s after %v; stdout:\n%s\nstderr:\n%s", re, bound, b.out.String(), b.errb.String())
		}
		time.Sleep(5 * time.Millisecond)
	}
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

// On one server with keyspace events for keys set and expired, watch
// shows values (by size), holder failures, abandons, "not found", stale
// values and takeovers, but not the lock that lingers after a store;
// SIGINT ends it with exit 0.
func TestWatch_SingleNodeFeed(t *testing.T) {
	srv := redistest.Start(t, "--notify-keyspace-events", "K$x")
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
	waitLine(t, b, `abandon +id=ab holder=token-ab: the lock is gone \(given up or found lost\); waiters look again`)

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
	rdb.Set(ctx, "feed/lock:dead", "a-holder-that-died", 500*time.Millisecond)
	waitLine(t, b, `takeover +id=dead lock expired: holder gone, next caller takes over`)

	inv := b.stop(t, syscall.SIGINT)
	if strings.Contains(inv.stdout, "s3cret") {
		t.Errorf("a value's bytes were printed:\n%s", inv.stdout)
	}
	for _, not := range []string{"takeover id=a ", "takeover id=st ", "id=a stale"} {
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
		!regexp.MustCompile(`CONFIG SET notify-keyspace-events '(gEK\$x|EgK\$x)'\n`).MatchString(inv.stderr) {
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
	srv := redistest.Start(t, "--notify-keyspace-events", "K$x")
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
	rdb.Set(ctx, tag+"/lock:two words", "t", 500*time.Millisecond)
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
	cc.Set(ctx, "cw/lock:{c}", "a-holder-that-died", 500*time.Millisecond)
	waitLine(t, ids, `takeover +id=c lock expired: holder gone, next caller takes over`)
	waitLine(t, keyspace, `takeover +id=c lock expired: holder gone, next caller takes over`)

	// A stale value put back is no store, and the end of its lock no
	// takeover (ResurrectTTL above the 2s the feed once allowed a lock).
	sc := newClient(t, cc, "cw", &memolock.Options{StaleTTL: time.Hour, ResurrectTTL: 2500 * time.Millisecond})
	if _, err := sc.Get(ctx, "st", value("old-s3cret", 50*time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	waitLine(t, keyspace, `stored +id=st size=10`)
	eventually(t, 10*time.Second, "the value to expire", func() bool { return cc.Exists(ctx, "cw:{st}").Val() == 0 })
	if r, err := sc.GetResult(ctx, "st", failing("down")); err != nil || r.Served != memolock.ServedStale {
		t.Fatalf("stale Get: %v %v", r.Served, err)
	}
	waitLine(t, keyspace, `stale +id=st size=10: a stale value put back after a failed fetch.*`)
	waitLine(t, keyspace, `refetch +id=st .*`)

	for _, b := range []*background{ids, keyspace} {
		inv := b.stop(t, syscall.SIGINT)
		if strings.Contains(inv.stdout, "s3cret") {
			t.Errorf("a value's bytes were printed:\n%s", inv.stdout)
		}
		if flat := strings.Join(strings.Fields(inv.stdout), " "); strings.Count(flat, "stored id=st ") > 1 || strings.Contains(flat, "takeover id=st ") {
			t.Errorf("the stale value shows as stored, or its end as a takeover:\n%s", inv.stdout)
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
	if !strings.Contains(inv.stderr, `takeovers (locks that expire) and values stored and "not found" cached will not be shown`) ||
		set == nil || len(set[1]) != 3 || strings.Trim(set[1], "K$x") != "" {
		t.Errorf("stderr %q", inv.stderr)
	}

	// Pointed at a node without --cluster, watch says that it is one.
	inv = startWatch(t, "--redis", "redis://"+nodes[0].Addr, "--tag", "cw").stop(t, syscall.SIGINT)
	if !strings.Contains(inv.stderr, "is a Redis Cluster node: pass --cluster") {
		t.Errorf("without --cluster: stderr %q", inv.stderr)
	}
}

// When Redis goes away, watch says so once and listens again when it is
// back; what was published meanwhile is missed, and it says that too.
func TestWatch_SurvivesARestart(t *testing.T) {
	srv := redistest.Start(t, "--notify-keyspace-events", "K$x")
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
	// As many ids as allowed, and one of them again.
	repeated := append(slices.Clone(tooManyIDs[:len(tooManyIDs)-2]), "--id", "0", "--redis", "redis://127.0.0.1:1")
	cases := []struct {
		args []string
		code int
		want string
	}{
		{nil, 2, "--tag is required"},
		{[]string{"--id", "i"}, 2, "--tag is required"},
		{[]string{"--tag", "t", "--bogus"}, 2, "unknown flag --bogus"},
		{[]string{"--tag", "t", "extra"}, 2, `unexpected argument "extra"`},
		{[]string{"--tag", "a/notif"}, 2, `contains "/notif"`},
		{[]string{"--tag", "t{x}", "--cluster", "--redis", "redis://127.0.0.1:1"}, 2, "contains a brace"},
		{[]string{"--tag", "t", "--cluster", "--redis", "redis://127.0.0.1:1", "--id", ""}, 2, "cannot be placed"},
		{[]string{"--tag", "t", "--redis", "bogus://h:1"}, 2, "not of the form"},
		{[]string{"--tag", "t", "--redis", "redis://h:1/0?dial_timeout=bogus"}, 2, "not a valid Redis URL"},
		{tooManyIDs, 2, "at most 100"},
		{repeated, 1, "connection refused"},
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
	if inv := memolockCmd(t, nil, "watch", "-h"); inv.code != 0 || !strings.Contains(inv.stdout, "--id ID") {
		t.Errorf("-h: exit %d, %q", inv.code, inv.stdout)
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

// serverMillis returns the server's clock in Unix milliseconds.
func serverMillis(t *testing.T, rdb *redis.Client) int64 {
	t.Helper()
	now, err := rdb.Time(context.Background()).Result()
	if err != nil {
		t.Fatal(err)
	}
	return now.UnixMilli()
}

// expireTime returns when key expires, in the server's Unix milliseconds,
// without expiring it (it must not have expired yet).
func expireTime(t *testing.T, rdb *redis.Client, key string) int64 {
	t.Helper()
	ms, err := rdb.Do(context.Background(), "PEXPIRETIME", key).Int64()
	if err != nil || ms < 0 {
		t.Fatalf("PEXPIRETIME %s: %d, %v", key, ms, err)
	}
	return ms
}

// watch tells a takeover only of a lock it saw held. With active expiry
// off (as when Redis has many keys to expire), a lock expires only when
// something touches it, long after its TTL: a value's done lock that
// expires so, after the value, is no takeover; a lock that was there
// before watch started shows as a plain expiry; a holder's lock that
// expires is a takeover.
func TestWatch_TakeoverOnlyOfALockSeenHeld(t *testing.T) {
	srv := redistest.Start(t, "--notify-keyspace-events", "K$x", "--enable-debug-command", "local")
	srv.Do(t, "DEBUG", "SET-ACTIVE-EXPIRE", "0")
	rdb := srv.Client(t)
	ctx := context.Background()
	url := "redis://" + srv.Addr
	rdb.Set(ctx, "late/lock:before", "a-holder-watch-never-saw", 200*time.Millisecond)
	rdb.Set(ctx, "late/lock:stale-before", "stale:a-stale-value-watch-never-saw", 200*time.Millisecond)
	b := startWatch(t, "--redis", url, "--tag", "late")

	c := newClient(t, rdb, "late", nil)
	if err := c.Set(ctx, "lag", []byte("v"), 2500*time.Millisecond); err != nil { // the lock lingers 1s
		t.Fatal(err)
	}
	waitLine(t, b, `value +id=lag size=1 published`)
	rdb.Set(ctx, "late/lock:dead", "a-holder-that-died", time.Second)
	end := max(expireTime(t, rdb, "late:lag"), expireTime(t, rdb, "late/lock:lag"), expireTime(t, rdb, "late/lock:dead"))
	eventually(t, 10*time.Second, "the TTLs to pass", func() bool { return serverMillis(t, rdb) > end+1 })

	// Every key is past its TTL and still there. inspect expires the
	// value and its lock as any lookup would.
	if inv := memolockCmd(t, nil, "inspect", "--redis", url, "--tag", "late", "--id", "lag"); inv.code != 0 || !strings.Contains(inv.stdout, "value       none") {
		t.Fatalf("inspect: exit %d, %q %q", inv.code, inv.stdout, inv.stderr)
	}
	for _, key := range []string{"late/lock:before", "late/lock:stale-before", "late/lock:dead"} {
		if n := rdb.Exists(ctx, key).Val(); n != 0 {
			t.Fatalf("%s is still there", key)
		}
	}
	waitLine(t, b, `takeover +id=dead lock expired: holder gone, next caller takes over`)
	waitLine(t, b, `expired +id=before .*`)
	waitLine(t, b, `expired +id=stale-before .*`)
	inv := b.stop(t, syscall.SIGINT)
	flat := strings.Join(strings.Fields(inv.stdout), " ")
	if n := strings.Count(flat, " id=lag "); n != 1 {
		t.Errorf("%d lines about lag, want its value alone:\n%s", n, inv.stdout)
	}
	for _, not := range []string{"takeover id=before", "takeover id=stale-before", "refetch id=stale-before"} {
		if strings.Contains(flat, not) {
			t.Errorf("printed %q:\n%s", not, inv.stdout)
		}
	}
}

// SIGTERM and SIGINT end watch at once, with exit 0, even when nobody
// reads its output: the lines it could not write are dropped, and it says
// how many on stderr.
func TestWatch_SignalEndsItWhileStdoutIsBlocked(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	ctx := context.Background()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close() // never read
	cmd := exec.Command(binary, "watch", "--redis", "redis://"+srv.Addr, "--tag", "blk")
	var errb syncBuffer
	cmd.Stdout, cmd.Stderr = w, &errb
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	w.Close()
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-done
	})
	eventually(t, 10*time.Second, "watch to listen", func() bool { return strings.Contains(errb.String(), "watching tag") })

	// Far more lines than a pipe holds.
	pipe := rdb.Pipeline()
	for i := range 20000 {
		pipe.Publish(ctx, "blk/notif:"+strconv.Itoa(i), "a value")
	}
	if _, err := pipe.Exec(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat("/proc/self/task"); err == nil {
		eventually(t, 10*time.Second, "watch to block on its output", func() bool {
			chans, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/wchan", cmd.Process.Pid))
			for _, ch := range chans {
				if b, _ := os.ReadFile(ch); strings.Contains(string(b), "pipe_write") {
					return true
				}
			}
			return false
		})
	}
	t0 := time.Now()
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		done <- err // for the cleanup
		if err != nil || time.Since(t0) > 5*time.Second {
			t.Errorf("watch ended with %v after %v; want exit 0 within 5s", err, time.Since(t0))
		}
	case <-time.After(5 * time.Second):
		t.Fatalf("watch still runs 5s after SIGTERM with its output blocked; stderr %q", errb.String())
	}
	if !regexp.MustCompile(`memolock watch: [0-9]+ lines of the feed were not written`).MatchString(errb.String()) {
		t.Errorf("stderr %q", errb.String())
	}
}

// After a reconnect watch checks the keyspace events again: a server that
// restarted may have them off.
func TestWatch_ChecksKeyspaceEventsAgainAfterAReconnect(t *testing.T) {
	srv := redistest.Start(t, "--notify-keyspace-events", "K$x")
	b := startWatch(t, "--redis", "redis://"+srv.Addr, "--tag", "feed")
	srv.Do(t, "CONFIG", "SET", "notify-keyspace-events", "")
	srv.Do(t, "CLIENT", "KILL", "TYPE", "pubsub")
	eventually(t, 10*time.Second, "watch to subscribe again", func() bool { return strings.Contains(b.errb.String(), "subscribed again") })
	eventually(t, 10*time.Second, "watch to say that keyspace events are off", func() bool {
		return strings.Contains(b.errb.String(), "keyspace events this feed needs are off")
	})
	b.stop(t, syscall.SIGINT)
}
