// Package interop holds the cross-language tests: the Go, Python and C#
// implementations of memolock, each as its `run` command in processes of
// its own, sharing one key on a real redis-server. It also runs the Python
// and C# peers' own test suites, so that `go test ./...` covers all three.
//
// A runtime that is missing skips its cases, except under CI=true, where it
// fails them: CI installs python3-redis, python3-pytest, mono-mcs and
// mono-runtime.
package interop

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.uber.org/goleak"

	"github.com/memolock/memolock"
	"github.com/memolock/memolock/internal/redistest"
)

// A runtime runs one implementation's `run` command.
type runtime struct {
	name    string
	argv    []string // the command line up to and including "memolock"
	env     []string
	missing string // why it cannot run here, if it cannot
}

var (
	goRT     = &runtime{name: "go"}
	pythonRT = &runtime{name: "python"}
	csharpRT = &runtime{name: "csharp"}
	all      = []*runtime{goRT, pythonRT, csharpRT}
	here     string // this directory, absolute
)

// python is Debian's interpreter, which has python3-redis; the first
// python3 on PATH may not.
const python = "/usr/bin/python3"

func TestMain(m *testing.M) {
	var err error
	if here, err = filepath.Abs("."); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	tmp, err := os.MkdirTemp("", "memolock-interop")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	setUp(tmp)
	goleak.VerifyTestMain(m, goleak.Cleanup(func(code int) {
		os.RemoveAll(tmp)
		os.Exit(code)
	}))
}

// setUp builds what needs building and finds out which runtimes work.
func setUp(tmp string) {
	bin := filepath.Join(tmp, "memolock")
	if out, err := exec.Command("go", "build", "-o", bin, "../cmd/memolock").CombinedOutput(); err != nil {
		goRT.missing = fmt.Sprintf("go build ../cmd/memolock: %v\n%s", err, out)
	}
	goRT.argv = []string{bin}

	pythonRT.argv = []string{python, "-m", "memolock"}
	pythonRT.env = []string{"PYTHONPATH=" + filepath.Join(here, "python"), "PYTHONDONTWRITEBYTECODE=1"}
	if out, err := exec.Command(python, "-c", "import redis, pytest").CombinedOutput(); err != nil {
		pythonRT.missing = fmt.Sprintf("%s with redis and pytest: %v: %s (apt-get install -y python3-redis python3-pytest)",
			python, err, bytes.TrimSpace(out))
	}

	csharpRT.argv = []string{"mono", filepath.Join(here, "csharp", "bin", "memolock.exe")}
	if _, err := exec.LookPath("mono"); err != nil {
		csharpRT.missing = "mono not found (apt-get install -y mono-mcs mono-runtime)"
	} else if _, err := exec.LookPath("mcs"); err != nil {
		csharpRT.missing = "mcs not found (apt-get install -y mono-mcs)"
	} else if out, err := exec.Command("bash", filepath.Join(here, "csharp", "build.sh")).CombinedOutput(); err != nil {
		csharpRT.missing = fmt.Sprintf("csharp/build.sh: %v\n%s", err, out)
	}
}

// need skips the test unless every runtime can run, or fails it under
// CI=true.
func need(t *testing.T, rts ...*runtime) {
	t.Helper()
	for _, rt := range rts {
		if rt.missing == "" {
			continue
		}
		if os.Getenv("CI") == "true" {
			t.Fatalf("%s peer cannot run and CI=true: %s", rt.name, rt.missing)
		}
		t.Skipf("%s peer cannot run: %s", rt.name, rt.missing)
	}
}

// A proc is one `run` invocation, in a process group of its own so that
// killing it kills its command too.
type proc struct {
	rt     *runtime
	cmd    *exec.Cmd
	out    bytes.Buffer
	err    syncBuffer // read while the process runs
	done   chan struct{}
	code   int
	exited time.Time
}

// syncBuffer is a bytes.Buffer that one goroutine writes while another
// reads.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// key is one test's tag, id and files on one redis-server.
type key struct {
	t       *testing.T
	srv     *redistest.Server
	rdb     *redis.Client
	url     string
	tag, id string
	dir     string
}

func newKey(t *testing.T, tag string) *key {
	srv := redistest.Start(t)
	k := &key{t: t, srv: srv, rdb: srv.Client(t), url: "redis://" + srv.Addr, tag: tag, id: "k ünï 🦀", dir: t.TempDir()}
	return k
}

func (k *key) path(name string) string { return filepath.Join(k.dir, name) }

// start runs rt's `run` command for the key with a shell command.
func (k *key) start(rt *runtime, flags []string, script string, args ...string) *proc {
	k.t.Helper()
	argv := append(append([]string{}, rt.argv...), "run", "--redis", k.url, "--tag", k.tag, "--id", k.id, "--ttl", "1m")
	argv = append(argv, flags...)
	argv = append(argv, "--", "sh", "-c", script, "sh")
	argv = append(argv, args...)
	p := &proc{rt: rt, cmd: exec.Command(argv[0], argv[1:]...), done: make(chan struct{})}
	p.cmd.Env = append(os.Environ(), rt.env...)
	p.cmd.Stdout, p.cmd.Stderr = &p.out, &p.err
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := p.cmd.Start(); err != nil {
		k.t.Fatalf("%s: %v", rt.name, err)
	}
	go func() {
		err := p.cmd.Wait()
		p.exited = time.Now()
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			p.code = ee.ExitCode()
			if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
				p.code = 128 + int(ws.Signal())
			}
		} else if err != nil {
			p.code = -1
		}
		close(p.done)
	}()
	k.t.Cleanup(func() {
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		<-p.done
	})
	return p
}

// wait waits for p to exit, at most d.
func (p *proc) wait(t *testing.T, d time.Duration) {
	t.Helper()
	select {
	case <-p.done:
	case <-time.After(d):
		t.Fatalf("%s still running after %v; stderr:\n%s", p.rt.name, d, p.stderr())
	}
}

func (p *proc) stderr() string { return p.err.String() }

// waiting waits until every one of ps says on stderr that it waits: it has
// looked up and knows the holder (every run command prints "memolock:
// waiting for" when its first lookup finds the lock held).
func (k *key) waiting(ps ...*proc) {
	k.t.Helper()
	for _, p := range ps {
		k.waitFor(60*time.Second, p.rt.name+" to wait", func() bool {
			return strings.Contains(p.err.String(), "memolock: waiting for")
		})
	}
	// Once its subscription is live, each waiter looks up once more. A
	// failure released just before that lookup runs leaves the lock free,
	// and the waiter takes it and computes instead of reporting the
	// failure (interop/PROTOCOL.md, step 2): give that lookup time to run.
	// This is a settling delay, not a bound that anything is held to.
	time.Sleep(500 * time.Millisecond)
}

// expect checks p's exit code and, unless want is nil, its stdout.
func (p *proc) expect(t *testing.T, code int, want []byte) {
	t.Helper()
	p.wait(t, 60*time.Second)
	if p.code != code {
		t.Errorf("%s exited %d, want %d; stderr:\n%s", p.rt.name, p.code, code, p.err.String())
	}
	if want != nil && !bytes.Equal(p.out.Bytes(), want) {
		t.Errorf("%s printed %q, want %q", p.rt.name, p.out.Bytes(), want)
	}
}

// runs returns how many times commands appended to the file name.
func (k *key) runs(name string) int {
	data, err := os.ReadFile(k.path(name))
	if errors.Is(err, os.ErrNotExist) {
		return 0
	}
	if err != nil {
		k.t.Fatal(err)
	}
	return strings.Count(string(data), "\n")
}

// waitFor waits until cond holds, at most d.
func (k *key) waitFor(d time.Duration, what string, cond func() bool) {
	k.t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			k.t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// subscribers waits until n processes subscribe to the key's value and
// events channels: each waiting process subscribes once, however it waits.
// Both, since a fail event published before a waiter's events
// subscription took effect is lost, and that waiter then computes itself
// (interop/PROTOCOL.md, step 2).
func (k *key) subscribers(n int64) {
	k.t.Helper()
	chans := []string{k.tag + "/notif:" + k.id, k.tag + "/lock-event:" + k.id}
	k.waitFor(60*time.Second, fmt.Sprintf("%d subscribers to %q", n, chans), func() bool {
		m, err := k.rdb.PubSubNumSub(context.Background(), chans...).Result()
		return err == nil && m[chans[0]] >= n && m[chans[1]] >= n
	})
}

// The value every case computes: UTF-8, bytes that are not, and a newline,
// written by printf from octal escapes.
var (
	valueFormat = `h\303\251llo \001\377\000 bytes\n`
	value       = []byte("h\xc3\xa9llo \x01\xff\x00 bytes\n")
)

// gated appends a line to $1, waits until the file $2 exists, then prints
// $3 (a printf format).
const gated = `echo run >> "$1"; while [ ! -e "$2" ]; do sleep 0.01; done; printf "$3"`

func others(rt *runtime) []*runtime {
	var out []*runtime
	for _, o := range all {
		if o != rt {
			out = append(out, o)
		}
	}
	return out
}

// 1. One language computes while the other two wait: they get the same
// bytes, and nobody else computes.
func TestOneComputesOthersWait(t *testing.T) {
	for _, holder := range all {
		t.Run(holder.name+" computes", func(t *testing.T) {
			need(t, all...)
			k := newKey(t, "share")
			h := k.start(holder, nil, gated, k.path("runs"), k.path("go"), valueFormat)
			k.waitFor(60*time.Second, "the holder's command", func() bool { return k.runs("runs") == 1 })
			var ws []*proc
			for _, rt := range others(holder) {
				ws = append(ws, k.start(rt, nil, gated, k.path("runs"), k.path("go"), "must not run"))
			}
			k.subscribers(2)
			k.waiting(ws...)
			if err := os.WriteFile(k.path("go"), nil, 0o644); err != nil {
				t.Fatal(err)
			}
			h.expect(t, 0, value)
			for _, w := range ws {
				w.expect(t, 0, value)
			}
			if n := k.runs("runs"); n != 1 {
				t.Errorf("the command ran %d times", n)
			}
		})
	}
}

// 2. A mixed stampede on one key runs the command once.
func TestMixedStampedeRunsOnce(t *testing.T) {
	need(t, all...)
	k := newKey(t, "stampede")
	counts := map[*runtime]int{goRT: 4, pythonRT: 4, csharpRT: 2}
	var ps []*proc
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, rt := range all {
		for range counts[rt] {
			wg.Add(1)
			go func() { // start them as close together as we can
				defer wg.Done()
				p := k.start(rt, nil, `echo run >> "$1"; sleep 1; printf "$2"`, k.path("runs"), valueFormat)
				mu.Lock()
				ps = append(ps, p)
				mu.Unlock()
			}()
		}
	}
	wg.Wait()
	for _, p := range ps {
		p.expect(t, 0, value)
	}
	if n := k.runs("runs"); n != 1 {
		t.Errorf("the command ran %d times across %d processes", n, len(ps))
	}
}

// 3. A holder killed with SIGKILL: a waiter in another language takes over
// once the lock expires, and succeeds.
func TestKilledHolderIsTakenOver(t *testing.T) {
	for i, holder := range all {
		waiter := all[(i+1)%len(all)]
		t.Run(holder.name+" killed, "+waiter.name+" takes over", func(t *testing.T) {
			need(t, holder, waiter)
			k := newKey(t, "killed")
			ttl := []string{"--lock-ttl", "1s"}
			h := k.start(holder, ttl, `echo run >> "$1"; sleep 60`, k.path("runs"))
			k.waitFor(60*time.Second, "the holder's command", func() bool { return k.runs("runs") == 1 })
			w := k.start(waiter, ttl, `echo run >> "$1"; printf "$2"`, k.path("runs"), valueFormat)
			k.subscribers(1)
			if err := syscall.Kill(-h.cmd.Process.Pid, syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			w.expect(t, 0, value)
			if n := k.runs("runs"); n != 2 {
				t.Errorf("the command ran %d times, want 2 (the killed run and the takeover)", n)
			}
		})
	}
}

// 4. A failing holder: waiters in the other languages fail promptly, not
// after the lock TTL (30 s here). The bound asserted is coarse, as the
// machine is noisy; the test logs what it measured.
func TestFailingHolderFailsWaitersPromptly(t *testing.T) {
	for _, holder := range all {
		t.Run(holder.name+" fails", func(t *testing.T) {
			need(t, all...)
			k := newKey(t, "failing")
			ttl := []string{"--lock-ttl", "30s"}
			h := k.start(holder, ttl, `echo run >> "$1"; while [ ! -e "$2" ]; do sleep 0.01; done; echo "backend down" >&2; date +%s%N > "$3"; exit 3`,
				k.path("runs"), k.path("go"), k.path("failed"))
			k.waitFor(60*time.Second, "the holder's command", func() bool { return k.runs("runs") == 1 })
			var ws []*proc
			for _, rt := range others(holder) {
				ws = append(ws, k.start(rt, ttl, `echo run >> "$1"`, k.path("runs")))
			}
			k.subscribers(2)
			k.waiting(ws...)
			if err := os.WriteFile(k.path("go"), nil, 0o644); err != nil {
				t.Fatal(err)
			}
			h.expect(t, 3, nil)
			stamp, err := os.ReadFile(k.path("failed"))
			if err != nil {
				t.Fatal(err)
			}
			var ns int64
			if _, err := fmt.Sscan(string(stamp), &ns); err != nil {
				t.Fatalf("the command's failure time %q: %v", stamp, err)
			}
			failed := time.Unix(0, ns)
			for _, w := range ws {
				w.expect(t, 1, []byte{})
				after := w.exited.Sub(failed)
				t.Logf("%s waiter exited %v after the %s holder's command failed", w.rt.name, after.Round(time.Millisecond), holder.name)
				if after > 5*time.Second {
					t.Errorf("%s waiter failed %v after the holder: it waited for the lock TTL", w.rt.name, after)
				}
				if !strings.Contains(w.err.String(), "backend down") && !strings.Contains(w.err.String(), "exit") {
					t.Errorf("%s waiter's error does not say what failed:\n%s", w.rt.name, w.err.String())
				}
			}
			if n := k.runs("runs"); n != 1 {
				t.Errorf("the command ran %d times", n)
			}
		})
	}
}

// 6. A raw client playing the original Go peer (GET, then SET NX EX 10)
// across any implementation's store never wins the lock.
func TestOriginalPeerLookupAcrossStoreDoesNotComputeTwice(t *testing.T) {
	for _, holder := range all {
		t.Run(holder.name+" stores", func(t *testing.T) {
			need(t, holder)
			k := newKey(t, "orig")
			ctx := context.Background()
			h := k.start(holder, nil, gated, k.path("runs"), k.path("go"), valueFormat)
			k.waitFor(60*time.Second, "the holder's command", func() bool { return k.runs("runs") == 1 })
			if err := k.rdb.Get(ctx, k.tag+":"+k.id).Err(); !errors.Is(err, redis.Nil) {
				t.Fatalf("original's GET = %v, want a miss", err)
			}
			if err := os.WriteFile(k.path("go"), nil, 0o644); err != nil {
				t.Fatal(err)
			}
			h.expect(t, 0, value)
			won, err := k.rdb.SetNX(ctx, k.tag+"/lock:"+k.id, "0b1a6c1e-original-uuid", 10*time.Second).Result()
			if err != nil {
				t.Fatal(err)
			}
			if won {
				t.Fatalf("the original peer won the lock right after the %s store: it would compute again", holder.name)
			}
			if v, _ := k.rdb.Get(ctx, k.tag+":"+k.id).Bytes(); !bytes.Equal(v, value) {
				t.Fatalf("stored value %q", v)
			}
		})
	}
}

// 5 and the peers' own tests: each runs its suite, vectors included.
func TestPythonPeerSuite(t *testing.T) {
	need(t, pythonRT)
	cmd := exec.Command(python, "-m", "pytest", "-q", "-p", "no:cacheprovider")
	cmd.Dir = filepath.Join(here, "python")
	cmd.Env = append(append(os.Environ(), pythonRT.env...), "MEMOLOCK_GO_BIN="+goRT.argv[0]) // its Go cases too
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("pytest: %v\n%s", err, out)
	}
}

func TestCSharpPeerSuite(t *testing.T) {
	need(t, csharpRT)
	if out, err := exec.Command("bash", filepath.Join(here, "csharp", "test.sh")).CombinedOutput(); err != nil {
		t.Fatalf("csharp/test.sh: %v\n%s", err, out)
	}
}

// The cross-language demo, as a newcomer runs it: on the embedded
// miniredis, every runtime found, one run of the command.
func TestDemoInterop(t *testing.T) {
	need(t, all...)
	cmd := exec.Command(goRT.argv[0], "demo", "--interop", "--interop-dir", here, "--processes", "2")
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		t.Fatalf("demo --interop: %v\nstdout:\n%s\nstderr:\n%s", err, out.String(), errb.String())
	}
	for _, want := range []string{"6 processes in 3 languages", "The command ran 1 time(s) for 6 processes.", "Python #2", "C# #2", "Go #2"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("demo output lacks %q:\n%s", want, out.String())
		}
	}
	if strings.Contains(out.String(), "not found") {
		t.Errorf("demo could not find a runtime:\n%s", out.String())
	}
}

// 7. A Go holder whose fetch finds nothing: every language's waiter learns
// it from the notfound event at once (Python and C# exit 3, Go 1), and,
// with a NegTTL, every later lookup answers so without running anything.
func TestNotFoundReachesEveryLanguage(t *testing.T) {
	need(t, all...)
	k := newKey(t, "absent")
	c, err := memolock.New(k.rdb, k.tag, &memolock.Options{LockTTL: 30 * time.Second, NegTTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	started, release := make(chan struct{}), make(chan struct{})
	held := make(chan error, 1)
	go func() {
		_, err := c.Get(context.Background(), k.id, func(context.Context, *memolock.Lease) ([]byte, time.Duration, error) {
			close(started)
			<-release
			return nil, 0, memolock.ErrNotFound
		})
		held <- err
	}()
	<-started
	ttl := []string{"--lock-ttl", "30s"}
	ws := k.waitersOfEveryLanguage(ttl)
	released := time.Now()
	close(release)
	if err := <-held; !errors.Is(err, memolock.ErrNotFound) {
		t.Fatalf("the Go holder's callers got %v", err)
	}
	codes := map[string]int{"go": 1, "python": 3, "csharp": 3}
	for _, w := range ws {
		w.expect(t, codes[w.rt.name], []byte{})
		if after := w.exited.Sub(released); after > 5*time.Second {
			t.Errorf("%s waiter exited %v after the holder: it waited for the lock TTL", w.rt.name, after)
		}
		if !strings.Contains(strings.ToLower(w.stderr()), "not found") {
			t.Errorf("%s waiter does not say \"not found\":\n%s", w.rt.name, w.stderr())
		}
	}
	// Cached: nobody runs the command.
	for _, rt := range all {
		p := k.start(rt, ttl, `echo run >> "$1"`, k.path("runs"))
		p.expect(t, codes[rt.name], []byte{})
	}
	if n := k.runs("runs"); n != 0 {
		t.Errorf("the command ran %d times", n)
	}
}

// A traced Go holder's token carries its span's traceparent after a "/"
// (PROTOCOL.md, Token). Every peer compares tokens as opaque strings: a
// Python and a C# waiter still match the holder's failure event to the
// holder they wait for, and fail at once instead of after the lock TTL;
// and a Go waiter in another process too.
func TestTracedHolderTokenIsOpaqueToEveryPeer(t *testing.T) {
	need(t, all...)
	k := newKey(t, "traced")
	tp := sdktrace.NewTracerProvider()
	defer func() { _ = tp.Shutdown(context.Background()) }()
	c, err := memolock.New(k.rdb, k.tag, &memolock.Options{LockTTL: 30 * time.Second, TracerProvider: tp})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, span := tp.Tracer("interop").Start(context.Background(), "request")
	defer span.End()
	started, release := make(chan string, 1), make(chan struct{})
	held := make(chan error, 1)
	go func() {
		_, err := c.Get(ctx, k.id, func(_ context.Context, l *memolock.Lease) ([]byte, time.Duration, error) {
			started <- l.Token()
			<-release
			return nil, 0, errors.New("traced backend down")
		})
		held <- err
	}()
	token := <-started
	if !strings.Contains(token, "/00-") {
		t.Fatalf("the traced holder's token %q carries no traceparent", token)
	}
	ttl := []string{"--lock-ttl", "30s"}
	ws := k.waitersOfEveryLanguage(ttl)
	released := time.Now()
	close(release)
	if err := <-held; err == nil {
		t.Fatal("the holder's callers got no error")
	}
	for _, w := range ws {
		w.expect(t, 1, []byte{})
		if after := w.exited.Sub(released); after > 5*time.Second {
			t.Errorf("%s waiter exited %v after the holder failed: it did not match the traced token", w.rt.name, after)
		}
		if !strings.Contains(w.stderr(), "traced backend down") {
			t.Errorf("%s waiter does not report the holder's failure:\n%s", w.rt.name, w.stderr())
		}
	}
	if n := k.runs("runs"); n != 0 {
		t.Errorf("the command ran %d times", n)
	}
}

// waitersOfEveryLanguage starts one `memolock run` of each language on k,
// which a holder in this process holds, and returns once all of them wait
// with live subscriptions. Their command, if they ever run it, counts in
// "runs".
func (k *key) waitersOfEveryLanguage(ttl []string) []*proc {
	var ws []*proc
	for _, rt := range all {
		ws = append(ws, k.start(rt, ttl, `echo run >> "$1"`, k.path("runs")))
	}
	k.subscribers(int64(len(all)))
	k.waiting(ws...)
	return ws
}
