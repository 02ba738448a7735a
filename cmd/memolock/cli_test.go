package main

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/memolock/memolock/internal/redistest"
)

// singleDashFlag finds a flag written -name, as the flag package writes
// them, where the help pages and the README write --name.
var singleDashFlag = regexp.MustCompile(`(^|[\s"'(\[])-[a-z][a-z-]+`)

// Every command has a help page, for -h, --help and `memolock help CMD`
// alike: on stdout, exit 0, with the same parts in the same order, flags
// written --name, and never the password of $MEMOLOCK_REDIS.
func TestHelp_EveryCommandHasAPage(t *testing.T) {
	env := []string{"MEMOLOCK_REDIS=redis://u:s3cret-pw@127.0.0.1:1"}
	pages := map[string][]string{
		"run": {"-- CMD [ARGS...]", "Only standard output is cached", "not the command", "--ttl DURATION",
			"--lock-ttl DURATION", "(default 10s)", "--id-hex HEX", "--id-base64 BASE64", "--quiet", "MEMOLOCK_REDIS",
			"124", "127", "128+N", "memolock run --tag reports --id 2026-11 --ttl 1h -- ./build-report 2026-11"},
		"demo":    {"--clients N", "(default 8)", "--fetch DURATION", "(default 200ms)", "--interop-dir DIR", "two languages"},
		"inspect": {"--id ID", "--id-hex HEX", "--json", "ttl_ms", "EVAL_RO", "MEMOLOCK_REDIS"},
		"watch":   {"--id ID", "notify-keyspace-events", "takeover", "SIGINT", "MEMOLOCK_REDIS"},
		"check":   {"--tag TAG", "--features", "ACL SETUSER", "MEMOLOCK_REDIS"},
		"version": {"--version"},
		"help":    {"help [COMMAND]"},
	}
	for name, wants := range pages {
		for _, args := range [][]string{{name, "--help"}, {name, "-h"}, {"help", name}} {
			inv := memolockCmd(t, env, args...)
			if inv.code != 0 || inv.stderr != "" {
				t.Errorf("%v: exit %d, stderr %q; want 0 and the page on stdout", args, inv.code, inv.stderr)
				continue
			}
			page := inv.stdout
			parts := []string{"memolock " + name + ": ", "\nUsage:\n  memolock " + name}
			if name != "help" {
				parts = append(parts, "\nFlags:\n", "  -h, --help ")
			}
			parts = append(parts, "\nExit status:\n")
			if name != "version" && name != "help" {
				parts = append(parts, "\nExamples:\n")
			}
			last := -1
			for _, p := range parts {
				i := strings.Index(page, p)
				if i < 0 || i < last {
					t.Errorf("%v: part %q missing or out of order:\n%s", args, p, page)
				}
				last = i
			}
			for _, w := range wants {
				if !strings.Contains(page, w) {
					t.Errorf("%v: no %q in:\n%s", args, w, page)
				}
			}
			if m := singleDashFlag.FindString(page); m != "" {
				t.Errorf("%v: a flag written %q:\n%s", args, m, page)
			}
			if strings.Contains(page, "s3cret") {
				t.Errorf("%v printed the password of $MEMOLOCK_REDIS", args)
			}
			for _, line := range strings.Split(page, "\n") {
				if len(line) > 100 {
					t.Errorf("%v: a line of %d columns: %q", args, len(line), line)
				}
			}
		}
	}
}

// memolock --help lists every command with its summary, says where the
// Redis URL comes from, and the exit codes; without a command the same
// overview goes to stderr, as a usage error.
func TestHelp_Main(t *testing.T) {
	for _, args := range [][]string{{"--help"}, {"-h"}, {"help"}} {
		inv := memolockCmd(t, nil, args...)
		if inv.code != 0 || inv.stderr != "" {
			t.Errorf("%v: exit %d, stderr %q", args, inv.code, inv.stderr)
		}
		for _, c := range commands {
			if !strings.Contains(inv.stdout, "  "+c.name+" ") || !strings.Contains(inv.stdout, c.summary) {
				t.Errorf("%v: command %s is not listed with its summary:\n%s", args, c.name, inv.stdout)
			}
		}
		for _, w := range []string{"MEMOLOCK_REDIS", "redis://:PASSWORD@host", "Exit status:", "Examples:", "memolock help COMMAND"} {
			if !strings.Contains(inv.stdout, w) {
				t.Errorf("%v: no %q in:\n%s", args, w, inv.stdout)
			}
		}
	}
	if inv := memolockCmd(t, nil); inv.code != 2 || inv.stdout != "" || !strings.Contains(inv.stderr, "Commands:") {
		t.Errorf("no command: exit %d, stdout %q, stderr %q; want 2 and the overview on stderr", inv.code, inv.stdout, inv.stderr)
	}
	for _, args := range [][]string{{"frobnicate"}, {"help", "frobnicate"}} {
		if inv := memolockCmd(t, nil, args...); inv.code != 2 || !strings.Contains(inv.stderr, `unknown command "frobnicate"`) || !strings.Contains(inv.stderr, "memolock --help") {
			t.Errorf("%v: exit %d, stderr %q", args, inv.code, inv.stderr)
		}
	}
}

func TestVersion(t *testing.T) {
	for _, args := range [][]string{{"--version"}, {"version"}} {
		inv := memolockCmd(t, nil, args...)
		if inv.code != 0 || !strings.HasPrefix(inv.stdout, "memolock ") || !strings.Contains(inv.stdout, runtime.Version()) {
			t.Errorf("%v: exit %d, stdout %q, stderr %q", args, inv.code, inv.stdout, inv.stderr)
		}
	}
}

// A usage error is one line naming the flag as --name (a duration without
// a unit says which unit to add) and a pointer to the help page, not the
// whole usage; exit 2.
func TestUsageErrors(t *testing.T) {
	run := []string{"run", "--redis", "redis://127.0.0.1:1", "--tag", "t", "--id", "i"}
	cases := []struct {
		args []string
		want string
	}{
		{append(run, "--ttl", "5", "--", "true"), `--ttl "5": a duration needs a unit: 5s`},
		{append(run, "--ttl", "1m", "--wait", "soon", "--", "true"), `--wait "soon": not a duration`},
		{append(run, "--ttl", "1m", "--bogus", "--", "true"), "unknown flag --bogus"},
		{append(run, "--ttl"), "--ttl needs a value"},
		{append(run, "--ttl", "1m", "--quiet=maybe", "--", "true"), `--quiet "maybe"`},
		{[]string{"demo", "--clients", "x"}, `--clients "x": not a whole number`},
		{[]string{"inspect", "--tag", "t", "--id-hex", "zz"}, `--id-hex "zz": 'z' at 0 is not a hex digit`},
		{[]string{"watch", "--tag"}, "--tag needs a value"},
	}
	for _, tc := range cases {
		inv := memolockCmd(t, nil, tc.args...)
		cmd := tc.args[0]
		if inv.code != 2 || inv.stdout != "" || !strings.Contains(inv.stderr, "memolock "+cmd+": "+tc.want) {
			t.Errorf("%v: exit %d, stdout %q, stderr %q; want 2 and %q", tc.args, inv.code, inv.stdout, inv.stderr, tc.want)
		}
		if !strings.HasSuffix(inv.stderr, "Run 'memolock "+cmd+" --help' for usage.\n") || strings.Contains(inv.stderr, "Flags:") {
			t.Errorf("%v: stderr %q; want the error and a pointer to the help page, not the usage", tc.args, inv.stderr)
		}
		if m := singleDashFlag.FindString(inv.stderr); m != "" {
			t.Errorf("%v: a flag written %q: %q", tc.args, m, inv.stderr)
		}
	}
}

// The Redis URL's mistakes name the part that is wrong, never a value
// (which may be the password), and say how to write a password.
func TestRedisURLErrorsSayWhichPart(t *testing.T) {
	cases := []struct{ url, want string }{
		{"redis://127.0.0.1:1/0?password=s3cret-pw", `unknown parameter "password"; a password goes in the URL itself: redis://:PASSWORD@host:port`},
		{"redis://127.0.0.1:1/0?dial_timeout=s3cret-pw", `parameter "dial_timeout" is not a duration`},
		{"redis://127.0.0.1:1/s3cret-pw", "the database (its path) is not a number"},
		{"redis://:s3cret%zz@127.0.0.1:1", "bad %-escape"},
		{"rediss://127.0.0.1:1?bogus=s3cret-pw&pool_size=2", `unknown parameter "bogus"`},
	}
	for _, tc := range cases {
		inv := memolockCmd(t, nil, "run", "--redis", tc.url, "--tag", "t", "--id", "i", "--ttl", "1s", "--", "true")
		if inv.code != 2 || !strings.Contains(inv.stderr, tc.want) || strings.Contains(inv.stderr, "s3cret") {
			t.Errorf("%s: exit %d, stderr %q; want 2 and %q, without the secret", redact(tc.url), inv.code, inv.stderr, tc.want)
		}
	}
}

// redis-cli reads redis://PASSWORD@host as a password; Redis (and
// memolock) read the name before the @ as a user. The refusal says how to
// write it, and never prints it.
func TestRun_AuthErrorsSayHowToWriteThePassword(t *testing.T) {
	srv := redistest.Start(t)
	// Set here rather than on the command line: redistest's readiness
	// PING has no password.
	srv.Do(t, "CONFIG", "SET", "requirepass", "s3cretPW")
	cases := []struct{ url, want string }{
		{"redis://s3cretPW@" + srv.Addr, "write redis://:PASSWORD@host"},
		{"redis://" + srv.Addr, "the server wants a password: redis://:PASSWORD@host"},
		{"redis://:wrong@" + srv.Addr, "the user name or the password is wrong"},
	}
	for _, tc := range cases {
		inv := memolockCmd(t, nil, "run", "--redis", tc.url, "--tag", "t", "--id", "i", "--ttl", "1s", "--", "echo", "never")
		if inv.code != 1 || !strings.Contains(inv.stderr, tc.want) || strings.Contains(inv.stderr, "s3cretPW") {
			t.Errorf("%s: exit %d, stderr %q; want 1 and %q, without the password", redact(tc.url), inv.code, inv.stderr, tc.want)
		}
		if strings.Contains(inv.stderr, "memolock: ") {
			t.Errorf("%s: the library's prefix repeats the CLI's: %q", redact(tc.url), inv.stderr)
		}
	}
	// Written as it should be, it works.
	inv := memolockCmd(t, nil, "run", "--redis", "redis://:s3cretPW@"+srv.Addr, "--tag", "t", "--id", "i", "--ttl", "1s", "--", "echo", "ok")
	if inv.code != 0 || inv.stdout != "ok\n" {
		t.Errorf("redis://:PASSWORD@host: exit %d, stdout %q, stderr %q", inv.code, inv.stdout, inv.stderr)
	}
}

// rediss:// against a server without TLS says so within the dial time-out
// (5s), rather than "context deadline exceeded" after five of them.
func TestRun_TLSAgainstAPlainServer(t *testing.T) {
	srv := redistest.Start(t)
	inv := memolockCmd(t, nil, "run", "--redis", "rediss://"+srv.Addr, "--tag", "t", "--id", "i", "--ttl", "1s", "--", "echo", "never")
	if inv.code != 1 || !strings.Contains(inv.stderr, "is a Redis server without TLS") || !strings.Contains(inv.stderr, "write redis:// rather than rediss://") {
		t.Errorf("exit %d, stderr %q; want 1 and a word about TLS", inv.code, inv.stderr)
	}
	// The dial time-out, and some room for a loaded machine: the fault
	// took 26.5s.
	if inv.took > 12*time.Second {
		t.Errorf("took %v", inv.took)
	}
}

// --wait against a Redis that never answers says that Redis did not
// answer; against a holder, whom it gave up on.
func TestRun_WaitLimitSaysWhatItWaitedFor(t *testing.T) {
	silent := redistest.Silent(t)
	inv := memolockCmd(t, nil, "run", "--redis", "redis://"+silent, "--tag", "t", "--id", "i", "--ttl", "1m", "--wait", "1s", "--", "echo", "x")
	if inv.code != 124 || !strings.Contains(inv.stderr, "did not answer within --wait 1s") || strings.Contains(inv.stderr, "gave up waiting") {
		t.Errorf("silent Redis: exit %d, stderr %q", inv.code, inv.stderr)
	}
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	rdb.Set(context.Background(), "t/lock:i", "the-holder", time.Minute)
	inv = memolockCmd(t, nil, "run", "--redis", "redis://"+srv.Addr, "--tag", "t", "--id", "i", "--ttl", "1m", "--wait", "300ms", "--", "echo", "x")
	if inv.code != 124 || !strings.Contains(inv.stderr, "gave up waiting for t:i after") || !strings.Contains(inv.stderr, "the-holder computes it") {
		t.Errorf("held lock: exit %d, stderr %q", inv.code, inv.stderr)
	}
}

// Outside a clone, --interop finds Go alone: that is no interop demo. It
// says what to pass, and fails.
func TestDemo_InteropNeedsTwoLanguages(t *testing.T) {
	dir := t.TempDir()
	inv := memolockCmd(t, nil, "demo", "--interop", "--interop-dir", dir)
	if inv.code != 1 || !strings.Contains(inv.stderr, "--interop needs two languages at least, and only Go can run here") ||
		!strings.Contains(inv.stdout, "pass --interop-dir") || strings.Contains(inv.stdout, "1 languages") {
		t.Errorf("exit %d, stdout %q, stderr %q", inv.code, inv.stdout, inv.stderr)
	}
}

// --id-hex and --id-base64 reach any bytes, and name the same key as --id
// does for the same bytes; their bad input is refused with the C# CLI's
// words (interop/csharp/tests/CliTests.cs, Run_IdFlagsRejectBadInput).
func TestIDFlags(t *testing.T) {
	srv := redistest.Start(t)
	url := "redis://" + srv.Addr
	rdb := srv.Client(t)
	ctx := context.Background()
	run := func(idFlag, id, out string) invocation {
		return memolockCmd(t, nil, "run", "--redis", url, "--tag", "ids", idFlag, id, "--ttl", "1m", "--", "printf", out)
	}
	// Bytes that are not UTF-8, and a NUL, which no argv can carry.
	if inv := run("--id-hex", "FFfe00c3282D80", "binary"); inv.code != 0 || inv.stdout != "binary" {
		t.Fatalf("--id-hex: exit %d, %q, %q", inv.code, inv.stdout, inv.stderr)
	}
	if v := rdb.Get(ctx, "ids:\xff\xfe\x00\xc3\x28\x2d\x80").Val(); v != "binary" {
		t.Errorf("the value of the raw id holds %q", v)
	}
	if inv := run("--id-base64", "//4AwygtgA==", "other"); inv.stdout != "binary" {
		t.Errorf("--id-base64 of the same bytes: %q, %q", inv.stdout, inv.stderr)
	}
	if inv := run("--id-base64", "//4AwygtgA", "other"); inv.stdout != "binary" {
		t.Errorf("--id-base64 without padding: %q, %q", inv.stdout, inv.stderr)
	}
	if inv := run("--id", "h\xc3\xa9", "text"); inv.stdout != "text" {
		t.Errorf("--id: %q, %q", inv.stdout, inv.stderr)
	}
	for _, args := range [][]string{{"--id-hex", "68C3A9"}, {"--id-base64", "aMOp"}} {
		if inv := run(args[0], args[1], "other"); inv.stdout != "text" {
			t.Errorf("%v: %q, %q; want the value of --id hé", args, inv.stdout, inv.stderr)
		}
	}
	// inspect and watch take them too.
	inv := memolockCmd(t, nil, "inspect", "--redis", url, "--tag", "ids", "--id-hex", "fffe00c3282d80", "--json")
	if inv.code != 0 || !strings.Contains(inv.stdout, `"found":true`) || !strings.Contains(inv.stdout, `"id_base64":"//4AwygtgA=="`) {
		t.Errorf("inspect --id-hex: exit %d, %q, %q", inv.code, inv.stdout, inv.stderr)
	}
	w := startWatch(t, "--redis", url, "--tag", "ids", "--id-base64", "aMOp", "--id-hex", "ff")
	rdb.Publish(ctx, "ids/notif:h\xc3\xa9", "abc")
	rdb.Publish(ctx, "ids/notif:\xff", "abcd")
	waitLine(t, w, `value +id=hé size=3 published`)
	waitLine(t, w, `value +id="\\xff" size=4 published`)
	w.stop(t, syscall.SIGTERM)

	cases := []struct{ flag, value, want string }{
		{"--id-hex", "zz", `--id-hex "zz": 'z' at 0 is not a hex digit`},
		{"--id-hex", "abc", `--id-hex "abc": odd length: 3 hex digits (two per byte)`},
		{"--id-base64", "a", `--id-base64 "a": a length of 1 base64 characters cannot be decoded`},
		{"--id-base64", "ab=c", `--id-base64 "ab=c": '=' at 2 is not in the standard base64 alphabet`},
		{"--id-base64", "-_-_", `--id-base64 "-_-_": '-' at 0 is not in the standard base64 alphabet (A-Z a-z 0-9 + /, then = padding)`},
		{"--id-base64", "aGk==", `--id-base64 "aGk==": wrong padding: 2 '=' after 3 characters (want 1)`},
		{"--id-hex", "", "--tag and --id (or --id-hex, --id-base64) are required"},
	}
	for _, tc := range cases {
		for _, cmd := range [][]string{
			{"run", "--redis", "redis://127.0.0.1:1", "--tag", "t", tc.flag, tc.value, "--ttl", "1s", "--", "true"},
			{"inspect", "--redis", "redis://127.0.0.1:1", "--tag", "t", tc.flag, tc.value},
			{"watch", "--redis", "redis://127.0.0.1:1", "--tag", "t", tc.flag, tc.value},
		} {
			if cmd[0] != "run" && tc.value == "" {
				continue // an empty id is one to inspect, and watch takes none at all
			}
			inv := memolockCmd(t, nil, cmd...)
			if inv.code != 2 || !strings.Contains(inv.stderr, "memolock "+cmd[0]+": "+tc.want) {
				t.Errorf("%v: exit %d, stderr %q; want 2 and %q", cmd, inv.code, inv.stderr, tc.want)
			}
		}
	}
	both := memolockCmd(t, nil, "run", "--redis", "redis://127.0.0.1:1", "--tag", "t", "--id", "x", "--id-hex", "78", "--ttl", "1s", "--", "true")
	if both.code != 2 || !strings.Contains(both.stderr, "give one of --id, --id-hex and --id-base64, not --id and --id-hex") {
		t.Errorf("--id and --id-hex: exit %d, %q", both.code, both.stderr)
	}
}

// Off a terminal, a waiting invocation says so when the wait starts, then
// at most once every 30s: a cron or CI log does not get a line a second.
// The holder says nothing there: its command's output is the log.
func TestRun_OffATerminalAWaitIsALineNotAStream(t *testing.T) {
	srv := redistest.Start(t)
	url := "redis://" + srv.Addr
	rdb := srv.Client(t)
	gate := filepath.Join(t.TempDir(), "go")
	holder := startMemolock(t, "run", "--redis", url, "--tag", "log", "--id", "k", "--ttl", "1m", "--lock-ttl", "30s",
		"--", "sh", "-c", "while [ ! -e '"+gate+"' ]; do sleep 0.05; done; echo v")
	eventually(t, 10*time.Second, "the holder's lock", func() bool { return rdb.Exists(context.Background(), "log/lock:k").Val() == 1 })
	t0 := time.Now()
	waiter := startMemolock(t, "run", "--redis", url, "--tag", "log", "--id", "k", "--ttl", "1m", "--", "echo", "never")
	eventually(t, 10*time.Second, "the waiter to wait", func() bool { return strings.Contains(waiter.errb.String(), "waiting for log:k") })
	// Long enough for a line a second to show (the fault printed one),
	// short against the 30s the status lines may come at.
	for time.Since(t0) < 3500*time.Millisecond {
		time.Sleep(50 * time.Millisecond)
	}
	if err := os.WriteFile(gate, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	w := waiter.wait(t, 20*time.Second, "the waiter")
	h := holder.wait(t, 20*time.Second, "the holder")
	if w.code != 0 || w.stdout != "v\n" || h.code != 0 || h.stdout != "v\n" {
		t.Fatalf("waiter %d %q %q; holder %d %q %q", w.code, w.stdout, w.stderr, h.code, h.stdout, h.stderr)
	}
	lines := strings.Split(strings.TrimSpace(w.stderr), "\n")
	// "At most one every 30 s or so" (issue 16).
	if allowed := 1 + int(w.took/(30*time.Second)); len(lines) > allowed || !strings.HasPrefix(lines[0], "memolock run: waiting for log:k, computed by ") {
		t.Errorf("waiter, %v: %d lines on stderr, %d allowed: %q", w.took, len(lines), allowed, w.stderr)
	}
	if strings.Contains(w.stderr, "\r") || strings.Contains(w.stderr, "\x1b") {
		t.Errorf("terminal controls in a log: %q", w.stderr)
	}
	if h.stderr != "" {
		t.Errorf("the holder said %q off a terminal", h.stderr)
	}
	// --quiet: nothing at all.
	rdb.Set(context.Background(), "log/lock:q", "someone", 300*time.Millisecond)
	if q := memolockCmd(t, nil, "run", "--redis", url, "--tag", "log", "--id", "q", "--ttl", "1m", "--quiet", "--", "echo", "q"); q.code != 0 || q.stderr != "" || q.stdout != "q\n" {
		t.Errorf("--quiet: exit %d, stdout %q, stderr %q", q.code, q.stdout, q.stderr)
	}
}

// A NOPERM that names the refused command gets the rule to add; SELECT,
// which a database other than 0 needs, says so (found walking the
// newcomer's path: the README's recipe works on db 0 only).
func TestRedisHintNamesTheRuleOfARefusedCommand(t *testing.T) {
	cases := []struct{ msg, want string }{
		{"NOPERM User u has no permissions to run the 'select' command", "add +select"},
		{"NOPERM this user has no permissions to run the 'client|tracking' command", "add +client|tracking"},
		{"NOPERM No permissions to access a channel", "'memolock check' names the ACL rules to add"},
	}
	for _, c := range cases {
		if got := redisHint(errors.New(c.msg), "redis://u:pw@host/1"); !strings.Contains(got, c.want) {
			t.Errorf("hint for %q = %q, want it to say %q", c.msg, got, c.want)
		}
	}
}
