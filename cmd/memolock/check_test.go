package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/memolock/memolock"
	"github.com/memolock/memolock/internal/redistest"
	"github.com/memolock/memolock/internal/wire"
)

// statusOf returns the status check printed for feature, "" if none.
func statusOf(out, feature string) string {
	for _, line := range strings.Split(out, "\n") {
		if f := strings.Fields(line); len(f) > 1 && f[1] == feature {
			return f[0]
		}
	}
	return ""
}

// The default user may do everything: check says so, feature by feature,
// warns that watch will not show takeovers while keyspace events are off
// (with the CONFIG SET to run), and leaves no key behind.
func TestCheck_OneServer(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	url := "redis://" + srv.Addr
	inv := memolockCmd(t, nil, "check", "--redis", url, "--tag", "chk")
	if inv.code != 0 || inv.stderr != "" {
		t.Fatalf("exit %d, stderr %q:\n%s", inv.code, inv.stderr, inv.stdout)
	}
	for f, want := range map[string]string{"server": "ok", "core": "ok", "l1": "ok", "inspect": "ok", "watch": "warn"} {
		if got := statusOf(inv.stdout, f); got != want {
			t.Errorf("%s: %q, want %q:\n%s", f, got, want, inv.stdout)
		}
	}
	if !strings.Contains(inv.stdout, "Redis 7.") || !strings.Contains(inv.stdout, "standalone") ||
		!strings.Contains(inv.stdout, `notify-keyspace-events is "", so it will not show takeovers: an administrator can run CONFIG SET notify-keyspace-events 'K$x'`) {
		t.Errorf("output:\n%s", inv.stdout)
	}
	if n := rdb.DBSize(context.Background()).Val(); n != 0 {
		t.Errorf("%d keys left behind: %v", n, rdb.Keys(context.Background(), "*").Val())
	}

	srv.Do(t, "CONFIG", "SET", "notify-keyspace-events", "Kx$g")
	inv = memolockCmd(t, nil, "check", "--redis", url, "--tag", "chk", "--features", "watch,core")
	if inv.code != 0 || statusOf(inv.stdout, "watch") != "ok" || statusOf(inv.stdout, "core") != "ok" || statusOf(inv.stdout, "l1") != "" {
		t.Errorf("events on, watch and core only: exit %d:\n%s%s", inv.code, inv.stdout, inv.stderr)
	}
}

// What keeps memolock from a server at all: unreachable, a password it
// wants or refuses (never printed), TLS it does not speak.
func TestCheck_ServerUnusable(t *testing.T) {
	srv := redistest.Start(t)
	srv.Do(t, "CONFIG", "SET", "requirepass", "s3cretPW")
	cases := []struct{ url, want string }{
		{"redis://127.0.0.1:1", "connection refused"},
		{"redis://" + srv.Addr, "the server wants a password"},
		{"redis://s3cretPW@" + srv.Addr, "write redis://:PASSWORD@host"},
		{"redis://:wrong@" + srv.Addr, "the user name or the password is wrong"},
		{"rediss://:s3cretPW@" + srv.Addr, "is a Redis server without TLS"},
	}
	for _, tc := range cases {
		inv := memolockCmd(t, nil, "check", "--redis", tc.url, "--tag", "chk")
		if inv.code != 1 || statusOf(inv.stdout, "server") != "FAIL" || !strings.Contains(inv.stdout+inv.stderr, tc.want) ||
			strings.Contains(inv.stdout+inv.stderr, "s3cretPW") {
			t.Errorf("%s: exit %d; want 1, the server FAIL and %q, without the password:\n%s%s", redact(tc.url), inv.code, tc.want, inv.stdout, inv.stderr)
		}
	}
	if inv := memolockCmd(t, nil, "check", "--redis", "redis://:s3cretPW@"+srv.Addr, "--tag", "chk", "--features", "core"); inv.code != 0 {
		t.Errorf("with the password: exit %d:\n%s%s", inv.code, inv.stdout, inv.stderr)
	}
}

// On a cluster, core is checked as a cluster client works, on the probe
// id's master; a cluster node without --cluster, or --cluster on one
// server, is a failure that says what to pass.
func TestCheck_Cluster(t *testing.T) {
	nodes := redistest.StartCluster(t, 3)
	url := "redis://" + nodes[0].Addr + "?addr=" + nodes[1].Addr
	inv := memolockCmd(t, nil, "check", "--redis", url, "--cluster", "--tag", "chk")
	if inv.code != 0 || statusOf(inv.stdout, "core") != "ok" || statusOf(inv.stdout, "inspect") != "ok" ||
		statusOf(inv.stdout, "watch") != "warn" || !strings.Contains(inv.stdout, ", cluster, ") || !strings.Contains(inv.stdout, "on every master") {
		t.Errorf("--cluster: exit %d:\n%s%s", inv.code, inv.stdout, inv.stderr)
	}
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{nodes[0].Addr}})
	defer cc.Close()
	var left int64
	_ = cc.ForEachMaster(context.Background(), func(ctx context.Context, n *redis.Client) error {
		if k := n.DBSize(ctx).Val(); k > 0 {
			left += k
		}
		return nil
	})
	if left != 0 {
		t.Errorf("%d keys left behind", left)
	}
	inv = memolockCmd(t, nil, "check", "--redis", "redis://"+nodes[0].Addr, "--tag", "chk")
	if inv.code != 1 || !strings.Contains(inv.stdout, "is a Redis Cluster node: pass --cluster") {
		t.Errorf("a node without --cluster: exit %d:\n%s%s", inv.code, inv.stdout, inv.stderr)
	}
	single := redistest.Start(t)
	inv = memolockCmd(t, nil, "check", "--redis", "redis://"+single.Addr, "--cluster", "--tag", "chk")
	if inv.code != 1 || !strings.Contains(inv.stdout, "drop --cluster") {
		t.Errorf("--cluster on one server: exit %d:\n%s%s", inv.code, inv.stdout, inv.stderr)
	}
}

func TestCheck_BadUsage(t *testing.T) {
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"check"}, "--tag is required"},
		{[]string{"check", "--tag", "t", "--features", "core,bogus"}, `unknown feature "bogus"`},
		{[]string{"check", "--tag", "t", "--cluster", "--features", "l1"}, "the L1 needs one server"},
		{[]string{"check", "--tag", "a/lock"}, `contains "/lock"`},
		{[]string{"check", "--tag", "t", "--redis", "redis://:s3cret@h:1/0?pwd=x"}, `unknown parameter "pwd"`},
		{[]string{"check", "--tag", "t", "extra"}, `unexpected argument "extra"`},
	}
	for _, tc := range cases {
		inv := memolockCmd(t, nil, tc.args...)
		if inv.code != 2 || !strings.Contains(inv.stderr, tc.want) || strings.Contains(inv.stderr, "s3cret") {
			t.Errorf("%v: exit %d, stderr %q; want 2 and %q", tc.args, inv.code, inv.stderr, tc.want)
		}
	}
}

// Every command that a script of the library calls is tried on its own by
// core, on one server and on a cluster (SPUBLISH for PUBLISH): Redis checks
// each command a script runs against the user's rules, so a script that
// gains one core does not try would fail under a user that check passes.
// The commands are read with scriptCall, as check reads the command of a
// line that Redis refuses; a redis.call or redis.pcall it cannot read (a
// call without parentheses, an alias, a space before the parenthesis)
// fails the test.
func TestCheck_CoreTriesEveryScriptCommand(t *testing.T) {
	anyCall := regexp.MustCompile(`(?i)redis\s*\.\s*p?call\b`)
	keys, err := memolock.NewKeyScheme("chk")
	if err != nil {
		t.Fatal(err)
	}
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{"127.0.0.1:1"}})
	defer cc.Close()
	for _, tc := range []struct {
		name    string
		ck      *checker
		sharded bool
		publish string
	}{
		{"one server", &checker{tag: "chk", keys: keys, probeID: "p", id: "p"}, false, "+publish"},
		{"cluster", &checker{tag: "chk", keys: keys, probeID: "{p}", id: "p", rdb: cc, cluster: cc}, true, "+spublish"},
	} {
		tried := map[string]bool{}
		for _, p := range tc.ck.coreTrials() {
			tried[p.cmd] = true
		}
		called := map[string]bool{}
		for _, src := range wire.Sources(tc.sharded) {
			calls := scriptCall.FindAllStringSubmatch(src, -1)
			if n := len(anyCall.FindAllString(src, -1)); n != len(calls) {
				t.Errorf("%s: a script has redis.call or redis.pcall %d times, %d of them as redis.call('NAME', ...): which command the others call cannot be told (write each so: no alias, no call without parentheses, no space before them):\n%s", tc.name, n, len(calls), src)
			}
			for _, c := range calls {
				called["+"+strings.ToLower(c[1])] = true
			}
		}
		// The parsing found what the scripts are known to call.
		for _, cmd := range []string{"+get", "+set", "+del", "+pttl", "+pexpire", tc.publish} {
			if !called[cmd] {
				t.Errorf("%s: no script calls %s: %v", tc.name, cmd, called)
			}
		}
		for cmd := range called {
			if !tried[cmd] {
				t.Errorf("%s: a script calls %s, which core does not try on its own", tc.name, cmd)
			}
		}
	}
}

// reply is an error reply of Redis, as go-redis returns it (a redis.Error).
type reply string

// Error returns the reply's text.
func (r reply) Error() string { return string(r) }

// RedisError marks reply as Redis's.
func (reply) RedisError() {}

// Inside a script, Redis 6.x and 7.0 name no refused command, but the
// script and the line: the command is the one that line of the library's
// script calls, if just one. Redis 7.0's replies were seen on a private
// 7.0.15; Redis 6.x's are as its scripting.c words them (6.0.20, 6.2.14),
// no such server being at hand.
func TestRefusedRule_InAScript(t *testing.T) {
	refusal := func(src string, line int) error {
		return reply(fmt.Sprintf("ERR The user executing the script can't run this command or subcommand script: %s, on @user_script:%d.", redis.NewScript(src).Hash(), line))
	}
	refusal6 := func(src string, line int, what string) error {
		return reply(fmt.Sprintf("ERR Error running script (call to f_%s): @user_script:%d: @user_script: %d: The user executing the script %s", redis.NewScript(src).Hash(), line, line, what))
	}
	cmd6 := "can't run this command or subcommand"
	lineOf := func(src, text string) int {
		for i, l := range strings.Split(src, "\n") {
			if strings.Contains(l, text) {
				return i + 1
			}
		}
		t.Fatalf("no line has %q", text)
		return 0
	}
	chans := trial{chans: "&chk/*"}
	for _, tc := range []struct {
		name string
		err  error
		want string
	}{
		{"renew's PEXPIRE", refusal(wire.RenewSrc, lineOf(wire.RenewSrc, "'PEXPIRE'")), "+pexpire"},
		{"store's PUBLISH", refusal(wire.StoreSrc, lineOf(wire.StoreSrc, "redis.call('PUBLISH', ARGV[4]")), "+publish"},
		{"store's SPUBLISH", refusal(wire.ShardedSrc(wire.StoreSrc), lineOf(wire.StoreSrc, "redis.call('PUBLISH', ARGV[4]")), "+spublish"},
		{"a line with GET and PTTL", refusal(wire.PeekSrc, 1), ""},
		{"a line beyond the script", refusal(wire.PeekSrc, 9), ""},
		{"a script not the library's", refusal("return redis.call('TIME')", 1), ""},
		{"a channel", reply("ERR The user executing the script can't publish to the channel mentioned in the command script: 44d03940c54ffa1c23cce67f66c2fda8299138dd, on @user_script:38."), "&chk/*"},
		{"a refusal that names the command (Redis 7.2 and later, not tried here)", reply("ERR ACL failure in script: User app has no permissions to run the 'pexpire' command script: 46da20686de889af8c2725e8ad91bc3a8ad2eabc, on @user_script:6."), "+pexpire"},
		{"no refusal", reply("ERR Error running script (call to f_0123): @user_script:6: oops"), ""},
		{"Redis 6: renew's PEXPIRE", refusal6(wire.RenewSrc, lineOf(wire.RenewSrc, "'PEXPIRE'"), cmd6), "+pexpire"},
		{"Redis 6: store's PUBLISH", refusal6(wire.StoreSrc, lineOf(wire.StoreSrc, "redis.call('PUBLISH', ARGV[4]"), cmd6), "+publish"},
		{"Redis 6: a line with GET and PTTL", refusal6(wire.PeekSrc, 1, cmd6), ""},
		{"Redis 6: a script not the library's", refusal6("return redis.call('TIME')", 1, cmd6), ""},
		{"Redis 6: a channel", refusal6(wire.StoreSrc, lineOf(wire.StoreSrc, "redis.call('PUBLISH', ARGV[4]"), "can't publish to the channel mentioned in the command"), "&chk/*"},
	} {
		if got := refusedRule(tc.err, chans); got != tc.want {
			t.Errorf("%s: %q, want %q (%v)", tc.name, got, tc.want, tc.err)
		}
	}
}

// Before Redis 7.0, TryLock cannot work (it sends SET with both NX and
// GET): check's core does not try it there, and says so in a warning; the
// rest of core passes with the core recipe, on a server that passes for
// Redis 6.2.14 (see olderRedis).
func TestCheck_CoreBeforeRedis7(t *testing.T) {
	srv := redistest.Start(t)
	admin := srv.Client(t)
	ctx := context.Background()
	const tag = "old"
	setUser(t, []*redistest.Server{srv}, "app", rulesFor("core", tag, 0))
	addr := olderRedis(t, srv.Addr, "6.2.14")
	inv := memolockCmd(t, nil, "check", "--redis", userURL("app", addr), "--tag", tag, "--features", "core")
	if inv.code != 0 || statusOf(inv.stdout, "core") != "warn" || !strings.Contains(inv.stdout, "Redis 6.2.14, standalone") ||
		!strings.Contains(inv.stdout, "not TryLock, which needs Redis 7.0") || inv.stderr != "" {
		t.Errorf("exit %d; want 0, and core warn that TryLock needs Redis 7.0:\n%s%s", inv.code, inv.stdout, inv.stderr)
	}
	if keys := admin.Keys(ctx, "*").Val(); len(keys) > 0 {
		t.Errorf("left behind: %v", keys)
	}
	// The proxy passes for Redis 6.2 indeed: TryLock fails through it.
	rdb := redis.NewClient(&redis.Options{Addr: addr, Username: "app", Password: aclPassword})
	defer rdb.Close()
	c, err := memolock.New(rdb, tag, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.TryLock(ctx, "x", time.Second); err == nil || !strings.Contains(err.Error(), "ERR syntax error") {
		t.Errorf("TryLock through the proxy: %v, want ERR syntax error", err)
	}
}

// The trial of the library's calls runs when every command passed on its
// own, and can fail core then: through a proxy that refuses SET with both
// NX and GET, as Redis 6.2 does, but lets the server say it is 7.0 or
// later, TryLock fails, and core says that TryLock will fail (not run and
// Get, which work).
func TestCheck_CoreTriesTheLibraryAfterAllPassed(t *testing.T) {
	srv := redistest.Start(t)
	addr := olderRedis(t, srv.Addr, "")
	inv := memolockCmd(t, nil, "check", "--redis", "redis://"+addr, "--tag", "chk", "--features", "core")
	if inv.code != 1 || statusOf(inv.stdout, "core") != "FAIL" || strings.Count(inv.stdout, "      - ") != 1 ||
		!strings.Contains(inv.stdout, "through the library: TryLock: ") || !strings.Contains(inv.stdout, "ERR syntax error") ||
		!strings.Contains(inv.stdout, "FAIL  core     TryLock will fail (") || strings.Contains(inv.stdout, "run and Get") {
		t.Errorf("exit %d; want 1, and core FAIL for TryLock alone:\n%s%s", inv.code, inv.stdout, inv.stderr)
	}
}

// olderRedis starts a TCP proxy to the server at target that passes for
// Redis version (6.2.14, say; "" keeps the server's): it puts version in
// the replies to HELLO, and makes the server refuse a SET with both NX and
// GET as 6.2 does ("ERR syntax error"), by adding an argument that SET
// does not know. It returns the proxy's address, and stops the proxy when
// the test ends.
func olderRedis(t *testing.T, target, version string) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var (
		wg     sync.WaitGroup
		mu     sync.Mutex
		conns  []net.Conn
		closed bool
	)
	t.Cleanup(func() {
		l.Close()
		mu.Lock()
		closed = true
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			client, err := l.Accept()
			if err != nil {
				return
			}
			server, err := net.Dial("tcp", target)
			if err != nil {
				client.Close()
				continue
			}
			mu.Lock()
			if closed {
				mu.Unlock()
				client.Close()
				server.Close()
				return
			}
			conns = append(conns, client, server)
			wg.Add(2)
			mu.Unlock()
			go func() {
				defer wg.Done()
				defer server.Close()
				forwardCommands(client, server)
			}()
			go func() {
				defer wg.Done()
				defer client.Close()
				forwardReplies(server, client, version)
			}()
		}
	}()
	return l.Addr().String()
}

// forwardCommands passes the commands read from client to server, one by
// one, a SET with both NX and GET with one argument more.
func forwardCommands(client, server net.Conn) {
	rd := bufio.NewReader(client)
	for {
		args, err := readCommand(rd)
		if err != nil {
			return
		}
		if len(args) > 3 && strings.EqualFold(args[0], "set") &&
			slices.ContainsFunc(args[3:], func(a string) bool { return strings.EqualFold(a, "nx") }) &&
			slices.ContainsFunc(args[3:], func(a string) bool { return strings.EqualFold(a, "get") }) {
			args = append(args, "as-redis-6.2")
		}
		var b strings.Builder
		fmt.Fprintf(&b, "*%d\r\n", len(args))
		for _, a := range args {
			fmt.Fprintf(&b, "$%d\r\n%s\r\n", len(a), a)
		}
		if _, err := io.WriteString(server, b.String()); err != nil {
			return
		}
	}
}

// readCommand reads one command, an array of bulk strings, as clients send
// them.
func readCommand(rd *bufio.Reader) ([]string, error) {
	line := func(prefix byte) (int, error) {
		l, err := rd.ReadString('\n')
		if err != nil {
			return 0, err
		}
		if len(l) < 3 || l[0] != prefix {
			return 0, fmt.Errorf("not %c: %q", prefix, l)
		}
		return strconv.Atoi(strings.TrimRight(l[1:], "\r\n"))
	}
	n, err := line('*')
	if err != nil {
		return nil, err
	}
	args := make([]string, n)
	for i := range args {
		size, err := line('$')
		if err != nil {
			return nil, err
		}
		b := make([]byte, size+2)
		if _, err := io.ReadFull(rd, b); err != nil {
			return nil, err
		}
		args[i] = string(b[:size])
	}
	return args, nil
}

// helloVersion is the version in HELLO's reply (a map, or with RESP2 an
// array, of bulk strings).
var helloVersion = regexp.MustCompile(`\$7\r\nversion\r\n\$[0-9]+\r\n[^\r]*\r\n`)

// forwardReplies passes what server sends to client, with version (if
// not "") in HELLO's replies. A reply comes in one read, as the server
// writes each in one go on loopback: a version cut across two reads would
// stay as it is, and the test see it.
func forwardReplies(server, client net.Conn, version string) {
	buf := make([]byte, 32<<10)
	with := []byte(fmt.Sprintf("$7\r\nversion\r\n$%d\r\n%s\r\n", len(version), version))
	for {
		n, err := server.Read(buf)
		if n > 0 {
			out := buf[:n]
			if version != "" {
				out = helloVersion.ReplaceAllLiteral(out, with)
			}
			if _, werr := client.Write(out); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// Only Redis's reply tells which rule is missing, not what wraps it: the
// library's errors name keys, and so the tag, which may hold "channel" or
// "key", and text that is not Redis's is no refusal.
func TestRefusedRule_OnlyTheReply(t *testing.T) {
	keys := reply("NOPERM this user has no permissions to access one of the keys used as arguments")
	inScript := reply("ERR The user executing the script can't access at least one of the keys mentioned in the command script: 1b936e3fe509bcbc9cd0664897bbe8fd0ac95a1d, on @user_script:3.")
	library := trial{keys: "~channel/*", chans: "&channel/*"} // libraryTrial's rules
	for _, tc := range []struct {
		name string
		err  error
		p    trial
		want string
	}{
		{"TryLock's key refused, tag channel", fmt.Errorf("TryLock: %w: taking lock %q (channel/lock-mutex:ab12): %w", memolock.ErrRedis, "x", keys), library, "~channel/*"},
		{"a key refused in a script, tag channel", fmt.Errorf("Get: %w: reading %q: %w", memolock.ErrRedis, "channel:x", inScript), library, "~channel/*"},
		{"a channel refused, tag key", fmt.Errorf("subscribing to %q: %w", "key/notif:x", reply("NOPERM this user has no permissions to access one of the channels used as arguments")), trial{keys: "~key/*", chans: "&key/*"}, "&key/*"},
		{"a channel refused in the library, tag key", fmt.Errorf("Get: %w: storing %q (key/lock:x): %w", memolock.ErrRedis, "x", reply("NOPERM this user has no permissions to access one of the channels used as arguments")), trial{keys: "~key/*", chans: "&key/*"}, "&key/*"},
		{"no refusal, tag key", fmt.Errorf("Delete: %w: deleting %q: %w", memolock.ErrRedis, "key:x", reply("ERR something about a key")), library, ""},
		{"wrapped, with a keys rule", fmt.Errorf("Get: %w: reading %q: %w", memolock.ErrRedis, "channel:x", keys), trial{keys: "~channel:*", chans: "&channel/*"}, "~channel:*"},
		{"a refusal's words, not Redis's", errors.New("NOPERM this user has no permissions to run the 'get' command"), trial{cmd: "+get"}, ""},
	} {
		if got := refusedRule(tc.err, tc.p); got != tc.want {
			t.Errorf("%s: %q, want %q (%v)", tc.name, got, tc.want, tc.err)
		}
	}
}

// A call that does not return in time goes on, and may still write a
// probe key: cleanUp waits for it to return before it deletes the keys,
// so that none is left behind.
func TestCheck_CleanUpWaitsForLateCalls(t *testing.T) {
	srv := redistest.Start(t)
	admin := srv.Client(t)
	nodes := []*redistest.Server{srv}
	const tag = "late"
	setUser(t, nodes, "app", rulesFor("core", tag, 0))
	ck := probeChecker(t, nodes, tag)
	key := ck.keys.Value(ck.probeID)
	wrote := make(chan struct{})
	err := ck.callWithin(50*time.Millisecond, func(ctx context.Context) error {
		defer close(wrote)
		<-ctx.Done()
		time.Sleep(300 * time.Millisecond)
		return ck.rdb.Set(context.Background(), key, "late", 10*time.Second).Err()
	})
	if err == nil || !strings.Contains(err.Error(), noAnswer) {
		t.Errorf("the late call: %v, want %q", err, noAnswer)
	}
	ck.cleanUp()
	<-wrote
	if keys := admin.Keys(context.Background(), "*").Val(); len(keys) > 0 {
		t.Errorf("left behind after cleanUp: %v", keys)
	}
}

// TryLock is tried from Redis 7.0, whose release candidates say 6.9.240
// and later, and on a server whose version could not be read.
func TestCheck_TryLockVersions(t *testing.T) {
	for v, want := range map[string]bool{
		"7.0.15": true, "7.2.4": true, "8.0.0": true, "6.9.240": true, "6.9.242": true,
		"6.9.239": false, "6.2.14": false, "6.0.20": false, "5.0.14": false, "": true, "unknown": true,
	} {
		if got := (&checker{version: v}).tryLock(); got != want {
			t.Errorf("%q: %v, want %v", v, got, want)
		}
	}
}
