//go:build unix

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
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/memolock/memolock/internal/redistest"
)

// background is an invocation of memolock running in the background.
type background struct {
	cmd  *exec.Cmd
	out  syncBuffer
	errb syncBuffer
	done chan invocation
}

// syncBuffer is a bytes.Buffer that a test may read while a process
// writes to it.
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

func startMemolock(t *testing.T, args ...string) *background {
	t.Helper()
	b := &background{cmd: exec.Command(binary, args...), done: make(chan invocation, 1)}
	b.cmd.Stdout, b.cmd.Stderr = &b.out, &b.errb
	t0 := time.Now()
	if err := b.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		err := b.cmd.Wait()
		inv := invocation{stdout: b.out.String(), stderr: b.errb.String(), took: time.Since(t0)}
		if ee, ok := err.(*exec.ExitError); ok {
			inv.code = ee.ExitCode()
		}
		b.done <- inv
	}()
	t.Cleanup(func() {
		_ = b.cmd.Process.Kill()
	})
	return b
}

func (b *background) wait(t *testing.T, d time.Duration, what string) invocation {
	t.Helper()
	select {
	case inv := <-b.done:
		return inv
	case <-time.After(d):
		t.Fatalf("%s still running after %v", what, d)
		return invocation{}
	}
}

// alive reports whether process pid exists and is not a zombie.
func alive(pid int) bool {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return syscall.Kill(pid, 0) == nil
	}
	// pid (comm) state ...
	s := string(stat)
	return !strings.HasPrefix(s[strings.LastIndex(s, ")")+1:], " Z")
}

func readPids(t *testing.T, file string) []int {
	t.Helper()
	data, _ := os.ReadFile(file)
	var pids []int
	for _, f := range strings.Fields(string(data)) {
		if pid, err := strconv.Atoi(f); err == nil {
			pids = append(pids, pid)
		}
	}
	return pids
}

// SIGTERM to the invocation that runs the command stops the command's whole
// process group, grandchildren too, and releases the lock only once they
// are gone: a waiting invocation takes over at once and never overlaps.
func TestRun_SignalStopsTheWholeGroupBeforeHandingOver(t *testing.T) {
	srv := redistest.Start(t)
	url := "redis://" + srv.Addr
	dir := t.TempDir()
	pids := filepath.Join(dir, "pids")
	// Two grandchildren that outlive their shell unless killed.
	holderScript := fmt.Sprintf(`sleep 60 & echo $! >> %[1]s; sleep 60 & echo $! >> %[1]s; echo $$ >> %[1]s; wait`, pids)
	holder := startMemolock(t, "run", "--redis", url, "--tag", "sig", "--id", "k", "--ttl", "1m", "--lock-ttl", "30s",
		"--", "sh", "-c", holderScript)
	eventually(t, 5*time.Second, "the command to start its processes", func() bool { return len(readPids(t, pids)) == 3 })

	// The waiter's command records any of the holder's processes it finds
	// still running.
	waiterScript := fmt.Sprintf(`for p in $(cat %s); do if [ -d /proc/$p ] && ! grep -q '^[0-9]* ([^)]*) Z' /proc/$p/stat; then echo "overlap $p"; fi; done; echo taken-over`, pids)
	waiter := startMemolock(t, "run", "--redis", url, "--tag", "sig", "--id", "k", "--ttl", "1m", "--lock-ttl", "30s",
		"--", "sh", "-c", waiterScript)
	eventually(t, 5*time.Second, "the waiter to wait", func() bool { return strings.Contains(waiter.errb.String(), "waiting for sig:k") })

	t0 := time.Now()
	_ = holder.cmd.Process.Signal(syscall.SIGTERM)
	h := holder.wait(t, 10*time.Second, "the interrupted invocation")
	if h.code != 143 {
		t.Errorf("interrupted invocation: exit %d, want 143; stderr %q", h.code, h.stderr)
	}
	for _, pid := range readPids(t, pids) {
		if alive(pid) {
			t.Errorf("process %d of the command still runs after the invocation exited", pid)
		}
	}
	w := waiter.wait(t, 10*time.Second, "the waiter")
	if w.code != 0 || strings.TrimSpace(w.stdout) != "taken-over" {
		t.Errorf("waiter: exit %d, stdout %q, stderr %q", w.code, w.stdout, w.stderr)
	}
	if d := time.Since(t0); d > 10*time.Second {
		t.Errorf("takeover took %v (lock TTL 30s)", d)
	}
}

// A signal still stops the command's group after the command itself has
// exited, while a process it left behind holds its output open; and SIGHUP
// (a closed terminal) counts like SIGTERM.
func TestRun_SignalStopsWhatTheCommandLeftBehind(t *testing.T) {
	for _, sig := range []syscall.Signal{syscall.SIGINT, syscall.SIGHUP} {
		t.Run(sig.String(), func(t *testing.T) {
			srv := redistest.Start(t)
			dir := t.TempDir()
			pids := filepath.Join(dir, "pids")
			holder := startMemolock(t, "run", "--redis", "redis://"+srv.Addr, "--tag", "left", "--id", "k", "--ttl", "1m",
				"--", "sh", "-c", fmt.Sprintf(`sleep 20 & echo $! $$ > %s; echo hi`, pids))
			eventually(t, 5*time.Second, "the command to start", func() bool { return len(readPids(t, pids)) == 2 })
			// The shell exits; its sleep holds the output open.
			eventually(t, 5*time.Second, "the shell to exit", func() bool { return !alive(readPids(t, pids)[1]) })
			_ = holder.cmd.Process.Signal(sig)
			h := holder.wait(t, 20*time.Second, "the interrupted invocation")
			if h.code != 128+int(sig) {
				t.Errorf("exit %d, want %d; stderr %q", h.code, 128+int(sig), h.stderr)
			}
			for _, pid := range readPids(t, pids) {
				if alive(pid) {
					t.Errorf("process %d the command left behind still runs", pid)
				}
			}
			rdb := redis.NewClient(&redis.Options{Addr: srv.Addr})
			defer rdb.Close()
			if n := rdb.Exists(context.Background(), "left/lock:k").Val(); n != 0 {
				t.Error("lock left behind")
			}
		})
	}
}

// A command that ignores SIGTERM gets SIGKILL at once on a second signal,
// without waiting for the grace (killGrace from the first signal).
func TestRun_SecondSignalForces(t *testing.T) {
	srv := redistest.Start(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr})
	defer rdb.Close()
	// Only an exit before the grace has run out proves that the second
	// signal forced the kill. An attempt whose command was slow to get its
	// SIGTERM (a loaded machine) may leave too little of the grace to
	// tell: try again. Without the forcing, no attempt can exit in time.
	const attempts = 5
	for attempt := range attempts {
		dir := t.TempDir()
		started, termed := filepath.Join(dir, "started"), filepath.Join(dir, "termed")
		id := strconv.Itoa(attempt)
		// The command shrugs SIGTERM off, noting that it came.
		holder := startMemolock(t, "run", "--redis", "redis://"+srv.Addr, "--tag", "sig2", "--id", id, "--ttl", "1m",
			"--", "sh", "-c", fmt.Sprintf(`trap 'touch %s' TERM; touch %s; while :; do sleep 0.05; done`, termed, started))
		exists := func(f string) func() bool { return func() bool { _, err := os.Stat(f); return err == nil } }
		eventually(t, 10*time.Second, "the command to start", exists(started))
		first := time.Now()
		_ = holder.cmd.Process.Signal(syscall.SIGINT)
		eventually(t, 10*time.Second, "the command to get SIGTERM", exists(termed))
		_ = holder.cmd.Process.Signal(syscall.SIGINT)
		h := holder.wait(t, 10*time.Second, "the interrupted invocation")
		took := time.Since(first)
		if h.code != 130 {
			t.Errorf("exit %d, want 130; stderr %q", h.code, h.stderr)
		}
		if n := rdb.Exists(context.Background(), "sig2/lock:"+id).Val(); n != 0 {
			t.Error("lock left behind")
		}
		if took < killGrace {
			return
		}
		t.Logf("attempt %d: exit %v after the first signal, the grace is %v: inconclusive", attempt+1, took, killGrace)
	}
	t.Errorf("in %d attempts the invocation never exited before the grace (%v) ran out: a second signal does not force the kill", attempts, killGrace)
}

// An invocation that waits exits at once on a signal, with 128+N.
func TestRun_WaitingInvocationExitsOnSignal(t *testing.T) {
	srv := redistest.Start(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr})
	defer rdb.Close()
	rdb.Set(context.Background(), "sig3/lock:k", "someone", time.Minute)
	waiter := startMemolock(t, "run", "--redis", "redis://"+srv.Addr, "--tag", "sig3", "--id", "k", "--ttl", "1m", "--", "echo")
	eventually(t, 10*time.Second, "the waiter to wait", func() bool { return strings.Contains(waiter.errb.String(), "waiting for") })
	t0 := time.Now()
	_ = waiter.cmd.Process.Signal(syscall.SIGINT)
	// At once: 10s, on a loaded machine, against the other holder's lock,
	// which a waiter deaf to signals would wait out (a minute).
	w := waiter.wait(t, 30*time.Second, "the waiting invocation")
	if w.code != 130 || time.Since(t0) > 10*time.Second {
		t.Errorf("exit %d after %v; want 130 at once", w.code, time.Since(t0))
	}
	if v := rdb.Get(context.Background(), "sig3/lock:k").Val(); v != "someone" {
		t.Errorf("the other holder's lock was touched: %q", v)
	}
}

// Exit codes follow the shell's conventions, and the invocation that ran a
// failing command still passes its output through.
func TestRun_ExitCodes(t *testing.T) {
	srv := redistest.Start(t)
	url := "redis://" + srv.Addr
	dir := t.TempDir()
	notExec := filepath.Join(dir, "not-executable")
	if err := os.WriteFile(notExec, []byte("#!/bin/sh\necho hi\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	noShebang := filepath.Join(dir, "no-shebang")
	if err := os.WriteFile(noShebang, []byte("echo ran with $1\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name   string
		argv   []string
		code   int
		stdout string
	}{
		{"not found", []string{"memolock-no-such-command"}, 127, ""},
		{"not found by path", []string{filepath.Join(dir, "missing")}, 127, ""},
		{"not executable", []string{notExec}, 126, ""},
		{"a directory", []string{dir}, 126, ""},
		{"killed by SIGKILL", []string{"sh", "-c", "kill -9 $$"}, 137, ""},
		{"killed by SIGTERM", []string{"sh", "-c", "echo some; kill -15 $$"}, 143, "some\n"},
		{"failing", []string{"sh", "-c", "echo partial; exit 3"}, 3, "partial\n"},
		{"a script without #!", []string{noShebang, "arg"}, 0, "ran with arg\n"},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			args := append([]string{"run", "--redis", url, "--tag", "codes", "--id", strconv.Itoa(i), "--ttl", "1m", "--"}, tc.argv...)
			inv := memolockCmd(t, nil, args...)
			if inv.code != tc.code || inv.stdout != tc.stdout {
				t.Errorf("exit %d, stdout %q; want %d, %q (stderr %q)", inv.code, inv.stdout, tc.code, tc.stdout, inv.stderr)
			}
		})
	}
}

// --wait holds when Redis stalls or never answers. The stall lasts until
// the test ends, and the URL raises go-redis's read timeout to a minute
// without retries (go-redis ignores context deadlines on reads): only
// memolock's own handling of the deadline can end the invocation within
// the bound, which is coarse enough for a loaded machine.
func TestRun_WaitHoldsWhenRedisStalls(t *testing.T) {
	const (
		goRedisTimeouts = "?read_timeout=60s&max_retries=-1"
		// 1s of waiting, up to 1s more for Close to give a lookup that may
		// have taken a lock the chance to release it, and the start of a
		// process on a loaded machine; go-redis alone would take a minute.
		bound = 20 * time.Second
	)
	srv := redistest.Start(t, "--enable-debug-command", "yes")
	srv.Stall(t)
	inv := memolockCmd(t, nil, "run", "--redis", "redis://"+srv.Addr+goRedisTimeouts, "--tag", "st", "--id", "k", "--ttl", "1m", "--wait", "1s", "--", "echo", "x")
	if inv.code != 124 || inv.took > bound {
		t.Errorf("exit %d after %v; want 124 within %v (Redis stalls until the test ends); stderr %q", inv.code, inv.took, bound, inv.stderr)
	}

	silent := redistest.Silent(t)
	inv = memolockCmd(t, nil, "run", "--redis", "redis://"+silent+goRedisTimeouts, "--tag", "st", "--id", "k", "--ttl", "1m", "--wait", "1s", "--", "echo", "x")
	if inv.code != 124 || inv.took > bound {
		t.Errorf("silent server: exit %d after %v; want 124 within %v; stderr %q", inv.code, inv.took, bound, inv.stderr)
	}
}

// eventually fails the test unless cond holds within d.
func eventually(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
