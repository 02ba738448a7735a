package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/memolock/memolock/internal/redistest"
)

var binary string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "memolock-cli")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binary = filepath.Join(dir, "memolock")
	if out, err := exec.Command("go", "build", "-o", binary, ".").CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "building memolock: %v\n%s", err, out)
		os.Exit(1)
	}
	goleak.VerifyTestMain(m, goleak.Cleanup(func(code int) {
		os.RemoveAll(dir)
		os.Exit(code)
	}))
}

type invocation struct {
	stdout, stderr string
	code           int
	took           time.Duration
}

func memolockCmd(t *testing.T, env []string, args ...string) invocation {
	t.Helper()
	cmd := exec.Command(binary, args...)
	cmd.Env = append(os.Environ(), env...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	t0 := time.Now()
	err := cmd.Run()
	inv := invocation{stdout: out.String(), stderr: errb.String(), took: time.Since(t0)}
	if ee, ok := err.(*exec.ExitError); ok {
		inv.code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return inv
}

// Without protection every caller computes, if every GET comes before the
// first SET, which is --fetch after they start: 2 s, so that it holds on a
// loaded machine too (with 100 ms, 36 of 200 GETs came after it once).
func TestDemo_EmbeddedComputesOnce(t *testing.T) {
	inv := memolockCmd(t, nil, "demo", "--clients", "4", "--goroutines", "50", "--fetch", "2s")
	if inv.code != 0 {
		t.Fatalf("exit %d: %s", inv.code, inv.stderr)
	}
	var got, unprotected int
	for _, line := range strings.Split(inv.stdout, "\n") {
		f := strings.Fields(line)
		switch {
		case len(f) > 1 && f[0] == "memolock":
			fmt.Sscan(f[1], &got)
		case len(f) > 2 && f[0] == "no" && f[1] == "protection":
			fmt.Sscan(f[2], &unprotected)
		}
	}
	if got != 1 || unprotected != 200 {
		t.Fatalf("computations: memolock %d, unprotected %d; want 1 and 200\n%s", got, unprotected, inv.stdout)
	}
}

// demo --cluster runs the same stampede on a Redis Cluster, and leaves no
// key behind.
func TestDemo_Cluster(t *testing.T) {
	nodes := redistest.StartCluster(t, 3)
	url := "redis://" + nodes[0].Addr + "?addr=" + nodes[1].Addr
	inv := memolockCmd(t, nil, "demo", "--redis", url, "--cluster", "--clients", "4", "--goroutines", "50", "--fetch", "100ms")
	if inv.code != 0 {
		t.Fatalf("exit %d: %s", inv.code, inv.stderr)
	}
	var got int
	for _, line := range strings.Split(inv.stdout, "\n") {
		if f := strings.Fields(line); len(f) > 1 && f[0] == "memolock" {
			fmt.Sscan(f[1], &got)
		}
	}
	if got != 1 || !strings.Contains(inv.stdout, "cluster redis://") {
		t.Fatalf("memolock computations %d; want 1\n%s", got, inv.stdout)
	}
	rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{nodes[0].Addr}})
	defer rdb.Close()
	var left atomic.Int64 // ForEachMaster calls in parallel
	_ = rdb.ForEachMaster(context.Background(), func(ctx context.Context, n *redis.Client) error {
		left.Add(n.DBSize(ctx).Val())
		return nil
	})
	if n := left.Load(); n != 0 {
		t.Errorf("%d keys left behind", n)
	}
	for _, args := range [][]string{{"demo", "--cluster"}, {"demo", "--cluster", "--interop", "--redis", url}} {
		if inv := memolockCmd(t, nil, args...); inv.code != 2 || !strings.Contains(inv.stderr, "--cluster needs") {
			t.Errorf("%v: exit %d, %q", args, inv.code, inv.stderr)
		}
	}
}

// When the unprotected run fails (here Redis refuses its many
// connections), the memolock row is still printed.
func TestDemo_MemolockRowSurvivesAFailedUnprotectedRun(t *testing.T) {
	srv := redistest.Start(t, "--maxclients", "24")
	inv := memolockCmd(t, nil, "demo", "--redis", "redis://"+srv.Addr, "--clients", "8", "--goroutines", "200", "--fetch", "100ms")
	var memolockRow, failedRow bool
	for _, line := range strings.Split(inv.stdout, "\n") {
		f := strings.Fields(line)
		memolockRow = memolockRow || len(f) == 5 && f[0] == "memolock" && f[1] == "1"
		failedRow = failedRow || len(f) == 3 && f[0] == "no" && f[2] == "failed"
	}
	if inv.code != 1 || !memolockRow || !failedRow || !strings.Contains(inv.stderr, "no protection run:") {
		t.Errorf("exit %d, stdout %q, stderr %q; want 1, the memolock row, and the failure", inv.code, inv.stdout, inv.stderr)
	}
}

func TestRun_ConcurrentInvocationsRunCommandOnce(t *testing.T) {
	srv := redistest.Start(t)
	dir := t.TempDir()
	counter := filepath.Join(dir, "runs")
	script := fmt.Sprintf(`echo run >> %s; sleep 0.5; echo "report $$"`, counter)
	const n = 6
	results := make([]invocation, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i] = memolockCmd(t, nil, "run", "--redis", "redis://"+srv.Addr, "--tag", "cli", "--id", "report",
				"--ttl", "1m", "--", "sh", "-c", script)
		}()
	}
	wg.Wait()
	for i, r := range results {
		if r.code != 0 || r.stdout != results[0].stdout || !strings.HasPrefix(r.stdout, "report ") {
			t.Errorf("invocation %d: exit %d, stdout %q, stderr %q", i, r.code, r.stdout, r.stderr)
		}
	}
	runs, _ := os.ReadFile(counter)
	if c := strings.Count(string(runs), "run"); c != 1 {
		t.Errorf("command ran %d times", c)
	}
	waited := 0
	for _, r := range results {
		if strings.HasPrefix(r.stderr, "memolock run: waiting for cli:report, computed by ") {
			waited++
		}
	}
	if waited == 0 {
		t.Error("no waiting invocation said so on stderr")
	}
	// Cached now: a later run prints the same bytes without running.
	again := memolockCmd(t, []string{"MEMOLOCK_REDIS=redis://" + srv.Addr}, "run", "--tag", "cli", "--id", "report", "--ttl", "1m", "--", "false")
	if again.code != 0 || again.stdout != results[0].stdout {
		t.Errorf("cached run via MEMOLOCK_REDIS: exit %d, %q", again.code, again.stdout)
	}
}

// With --cluster, run takes a cluster URL (seed nodes as addr
// parameters): concurrent invocations over ids in different slots run each
// command once, and the ids are placed by memolock (cli:{id}).
func TestRun_ClusterStampede(t *testing.T) {
	nodes := redistest.StartCluster(t, 3)
	url := "redis://" + nodes[0].Addr + "?addr=" + nodes[1].Addr + "&addr=" + nodes[2].Addr
	dir := t.TempDir()
	ids := []string{"a", "b", "c", "d"}
	results := make([]invocation, 3*len(ids))
	var wg sync.WaitGroup
	for i := range results {
		id := ids[i%len(ids)]
		wg.Add(1)
		go func() {
			defer wg.Done()
			script := fmt.Sprintf(`echo run >> %s; sleep 0.5; echo "report %s"`, filepath.Join(dir, id), id)
			results[i] = memolockCmd(t, nil, "run", "--redis", url, "--cluster", "--tag", "cli", "--id", id,
				"--ttl", "1m", "--", "sh", "-c", script)
		}()
	}
	wg.Wait()
	for i, r := range results {
		if id := ids[i%len(ids)]; r.code != 0 || r.stdout != "report "+id+"\n" {
			t.Errorf("invocation %d: exit %d, stdout %q, stderr %q", i, r.code, r.stdout, r.stderr)
		}
	}
	rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{nodes[0].Addr}})
	defer rdb.Close()
	for _, id := range ids {
		runs, _ := os.ReadFile(filepath.Join(dir, id))
		if c := strings.Count(string(runs), "run"); c != 1 {
			t.Errorf("command for %s ran %d times", id, c)
		}
		if v := rdb.Get(context.Background(), "cli:{"+id+"}").Val(); v != "report "+id+"\n" {
			t.Errorf("cli:{%s} holds %q", id, v)
		}
	}
	// A cluster URL that does not parse is refused without echoing it.
	inv := memolockCmd(t, nil, "run", "--redis", "redis://:s3cret@"+nodes[0].Addr+"?addr=%zz", "--cluster", "--tag", "t", "--id", "i", "--ttl", "1s", "--", "true")
	if inv.code != 2 || strings.Contains(inv.stderr, "s3cret") {
		t.Errorf("bad cluster URL: exit %d, stderr %q", inv.code, inv.stderr)
	}
}

func TestRun_FailingCommandCachesNothing(t *testing.T) {
	srv := redistest.Start(t)
	url := "redis://" + srv.Addr
	// The holder's command fails only once the waiter listens for holder
	// events, so a slow start cannot make the waiter find the lock already
	// free and run the command itself.
	gate := filepath.Join(t.TempDir(), "go")
	holder := make(chan invocation, 1)
	go func() {
		holder <- memolockCmd(t, nil, "run", "--redis", url, "--tag", "cli", "--id", "bad", "--ttl", "1m",
			"--lock-ttl", "30s", "--", "sh", "-c", "while [ ! -e '"+gate+"' ]; do sleep 0.05; done; echo partial; exit 3")
	}()
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr})
	defer rdb.Close()
	ctx := context.Background()
	deadline := time.Now().Add(60 * time.Second)
	until := func(what string, cond func() bool) {
		t.Helper()
		for !cond() {
			if time.Now().After(deadline) {
				_ = os.WriteFile(gate, nil, 0o644)
				t.Fatalf("timed out waiting for %s", what)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	// DBSIZE, not EXISTS, which would count as key misses below.
	until("the holder to take the lock", func() bool { return rdb.DBSize(ctx).Val() > 0 })
	// Every acquire misses the same keys (value, not-found marker) while
	// no value is stored: the holder's one lookup is the unit, and the
	// waiter makes two, the second once its subscription is live. Only
	// after that one may the command fail: a failure released before it
	// leaves the lock free, and the waiter would run the command itself.
	lookup := keyspaceMisses(t, rdb)
	if lookup == 0 {
		t.Fatal("the holder's lookup missed no key: lookups cannot be counted by key misses")
	}
	waiterc := make(chan invocation, 1)
	go func() {
		waiterc <- memolockCmd(t, nil, "run", "--redis", url, "--tag", "cli", "--id", "bad", "--ttl", "1m", "--", "sh", "-c", "echo waiter ran")
	}()
	until("the waiter to subscribe to holder events", func() bool {
		return rdb.PubSubNumSub(ctx, "cli/lock-event:bad").Val()["cli/lock-event:bad"] >= 1
	})
	until("the waiter's lookup once subscribed", func() bool { return keyspaceMisses(t, rdb) >= 3*lookup })
	if err := os.WriteFile(gate, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	waiter := <-waiterc
	h := <-holder
	if h.code != 3 {
		t.Errorf("holder exit %d, want the command's 3; stderr %q", h.code, h.stderr)
	}
	if waiter.code == 0 || !strings.Contains(waiter.stderr, "command exited with status 3") || waiter.stdout != "" {
		t.Errorf("waiter: exit %d, stdout %q, stderr %q", waiter.code, waiter.stdout, waiter.stderr)
	}
	if waiter.took > 10*time.Second {
		t.Errorf("waiter took %v (lock TTL 30s)", waiter.took)
	}
	if n := rdb.Exists(context.Background(), "cli:bad", "cli/lock:bad").Val(); n != 0 {
		t.Error("something was cached or locked after a failed command")
	}
}

// keyspaceMisses is the server's count of key lookups that found nothing
// (INFO stats), scripts' included.
func keyspaceMisses(t *testing.T, rdb *redis.Client) int64 {
	t.Helper()
	info, err := rdb.Info(context.Background(), "stats").Result()
	if err != nil {
		t.Fatalf("INFO stats: %v", err)
	}
	for _, line := range strings.Split(info, "\r\n") {
		if v, ok := strings.CutPrefix(line, "keyspace_misses:"); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				t.Fatalf("INFO stats: keyspace_misses %q", v)
			}
			return n
		}
	}
	t.Fatalf("INFO stats has no keyspace_misses:\n%s", info)
	return 0
}

func TestRun_WaitLimit(t *testing.T) {
	srv := redistest.Start(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr})
	defer rdb.Close()
	rdb.Set(context.Background(), "cli/lock:slow", "someone", time.Minute)
	inv := memolockCmd(t, nil, "run", "--redis", "redis://"+srv.Addr, "--tag", "cli", "--id", "slow", "--ttl", "1m",
		"--wait", "300ms", "--", "echo", "never")
	if inv.code != 124 || !strings.Contains(inv.stderr, "gave up") {
		t.Errorf("exit %d, stderr %q", inv.code, inv.stderr)
	}
}

func TestRun_PasswordNeverPrinted(t *testing.T) {
	cases := []struct {
		env  []string
		args []string
	}{
		{nil, []string{"run", "--redis", "redis://user:s3cret-pw@127.0.0.1:1/0", "--tag", "t", "--id", "i", "--ttl", "1s", "--", "echo"}},
		{nil, []string{"run", "--redis", "redis://user:s3cret-pw@127.0.0.1:1/%zz", "--tag", "t", "--id", "i", "--ttl", "1s", "--", "echo"}},
		{nil, []string{"run", "--redis", "bogus://user:s3cret-pw@127.0.0.1:1", "--tag", "t", "--id", "i", "--ttl", "1s", "--", "echo"}},
		{nil, []string{"run", "--redis", "redis://s3cret-pw@127.0.0.1:1", "--tag", "t", "--id", "i", "--ttl", "1s", "--", "echo"}},
		{nil, []string{"run", "--redis", "redis://127.0.0.1:1/0?password=s3cret-pw&dial_timeout=1s", "--tag", "t", "--id", "i", "--ttl", "1s", "--", "echo"}},
		{nil, []string{"run", "--redis", "redis://127.0.0.1:1/0?password=s3cret-pw&bogus=1", "--tag", "t", "--id", "i", "--ttl", "1s", "--", "echo"}},
		{[]string{"MEMOLOCK_REDIS=redis://u:s3cret-pw@127.0.0.1:1"}, []string{"run", "--tag", "t", "--id", "i", "--ttl", "1s", "--", "echo"}},
		{[]string{"MEMOLOCK_REDIS=redis://u:s3cret-pw@127.0.0.1:1"}, []string{"run", "--bogus-flag"}},
		{nil, []string{"run", "--redis", "default:s3cret-pw@127.0.0.1:1", "--tag", "t", "--id", "i", "--ttl", "1s", "--", "echo"}},
		{nil, []string{"run", "--redis", "redis:s3cret-pw@127.0.0.1:1", "--tag", "t", "--id", "i", "--ttl", "1s", "--", "echo"}},
		{nil, []string{"run", "--redis", "s3cret-pw", "--tag", "t", "--id", "i", "--ttl", "1s", "--", "echo"}},
		{nil, []string{"run", "--redis", "redis://127.0.0.1:1/0?pwd=s3cret-pw", "--tag", "t", "--id", "i", "--ttl", "1s", "--", "echo"}},
		{nil, []string{"demo", "--redis", "redis:s3cret-pw@127.0.0.1:1", "--clients", "1", "--goroutines", "1"}},
		{nil, []string{"demo", "--redis", "redis://user:s3cret-pw@127.0.0.1:1/0", "--clients", "1", "--goroutines", "1"}},
		{nil, []string{"demo", "--redis", "redis://s3cret-pw@127.0.0.1:1/0", "--clients", "1", "--goroutines", "1"}},
	}
	for _, tc := range cases {
		inv := memolockCmd(t, tc.env, tc.args...)
		if inv.code == 0 {
			t.Errorf("%v: exit 0", tc.args)
		}
		if strings.Contains(inv.stdout+inv.stderr, "s3cret-pw") {
			t.Errorf("%v printed the password: %s%s", tc.args, inv.stdout, inv.stderr)
		}
	}
}

// go-redis logs every failed dial; the CLI prints only its own error.
func TestRun_RedisDownIsOneLineOnStderr(t *testing.T) {
	inv := memolockCmd(t, nil, "run", "--redis", "redis://127.0.0.1:1", "--tag", "t", "--id", "i", "--ttl", "1s", "--", "echo")
	lines := strings.Split(strings.TrimSpace(inv.stderr), "\n")
	if inv.code != 1 || len(lines) != 1 || !strings.Contains(lines[0], "connection refused") {
		t.Errorf("exit %d, stderr %q; want 1 and one line naming the refused connection", inv.code, inv.stderr)
	}
}

func TestRun_BadUsage(t *testing.T) {
	cases := []struct {
		args []string
		want string
	}{
		{nil, "usage"},
		{[]string{"frobnicate"}, `unknown command "frobnicate"`},
		{[]string{"run", "--id", "i", "--ttl", "1s", "--", "echo"}, "--tag and --id (or --id-hex, --id-base64) are required"},
		{[]string{"run", "--tag", "t", "--id", "i", "--", "echo"}, "--ttl is required"},
		{[]string{"run", "--tag", "t", "--id", "i", "--ttl", "1s"}, "no command given"},
		{[]string{"run", "--tag", "a/lock", "--id", "i", "--ttl", "1s", "--", "echo"}, `contains "/lock"`},
		{[]string{"run", "--tag", "t", "--id", "i", "--ttl", "1s", "--lock-ttl", "1us", "--", "echo"}, "under 1ms"},
		{[]string{"run", "--tag", "t", "--id", "i", "--ttl", "-1s", "--", "echo"}, "--ttl -1s is negative"},
		{[]string{"run", "--tag", "t", "--id", "i", "--ttl", "1s", "--wait", "-1s", "--", "echo"}, "--wait -1s is negative"},
		{[]string{"demo", "--clients", "8", "--goroutines", "200000"}, "too many"},
	}
	for _, tc := range cases {
		inv := memolockCmd(t, nil, tc.args...)
		if inv.code != 2 || !strings.Contains(inv.stderr, tc.want) {
			t.Errorf("%v: exit %d, stderr %q; want 2 and %q", tc.args, inv.code, inv.stderr, tc.want)
		}
	}
}

// A cluster URL's addr parameters are shown only when they are host:port:
// userinfo in them is a password, however it is written.
func TestRedact_ClusterAddrUserinfo(t *testing.T) {
	for _, raw := range []string{
		"redis://:pw@h1:7000?addr=user:s3cret@h2:7001",
		"redis://h1:7000?addr=redis://u:s3cret@h2:7001",
		"redis://h1:7000?addr=:s3cret@h2:7001&dial_timeout=bogus",
	} {
		if out := redact(raw); strings.Contains(out, "s3cret") {
			t.Errorf("redact(%q) = %q: the password shows", raw, out)
		}
		if _, err := openRedis(raw, true); err != nil && strings.Contains(err.Error(), "s3cret") {
			t.Errorf("openRedis(%q): %v", raw, err)
		}
	}
	if out := redact("redis://:pw@h1:7000?addr=h2:7001&addr=h3:7002"); !strings.Contains(out, "addr=h2%3A7001") || strings.Contains(out, "pw") {
		t.Errorf("plain seed nodes: %q", out)
	}
}

// No flag or argument error of any command prints a password, whether the
// URL comes as a stray argument (--cluster takes none) or as a flag's bad
// value: the flag package quotes what it cannot parse.
func TestRun_PasswordNeverPrintedInArgumentErrors(t *testing.T) {
	const url = "redis://:s3cret@127.0.0.1:1"
	// Port 1 refuses: nothing here may reach a real server, the default
	// one least of all.
	env := []string{"MEMOLOCK_REDIS=redis://127.0.0.1:1"}
	down := []string{"--redis", "redis://127.0.0.1:1"}
	for _, args := range [][]string{
		{"run", "--tag", "t", "--id", "i", "--ttl", "1s", "--cluster", url, "--", "echo"},
		{"run", "--tag", "t", "--id", "i", "--ttl", "1s", "--cluster", url, "echo"},
		{"run", "--tag", "t", "--id", "i", "--ttl", "1s", "--cluster=" + url, "--", "echo"},
		{"run", "--tag", "t", "--id", "i", "--ttl", url, "--", "echo"},
		{"demo", "--cluster", url},
		{"demo", "--cluster=" + url},
		{"demo", "--clients", url},
		{"inspect", "--tag", "t", "--id", "i", "--cluster", url},
		{"inspect", "--tag", "t", "--id", "i", "--cluster=" + url},
		{"inspect", "--tag", "t", "--id", "i", "--json=" + url},
		{"inspect", "--tag", "t", "--id", "i", "-" + url},
		{"watch", "--tag", "t", "--cluster", url},
		{"watch", "--tag", "t", "--cluster=" + url},
		{"watch", "--tag", "t", "--" + url + "=x"},
		{url},
	} {
		if len(args) > 1 {
			args = append(append([]string{args[0]}, down...), args[1:]...)
		}
		inv := memolockCmd(t, env, args...)
		if inv.code != 2 || strings.Contains(inv.stdout+inv.stderr, "s3cret") || inv.stderr == "" {
			t.Errorf("%q: exit %d, stdout %q, stderr %q; want 2, and an error without the password", args, inv.code, inv.stdout, inv.stderr)
		}
	}
}
