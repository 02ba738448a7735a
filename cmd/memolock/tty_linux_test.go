package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/memolock/memolock/internal/redistest"
)

// onTerminal runs shell line under script(1), on a pseudo-terminal, and
// returns it running, with a pipe to type into the terminal. (script ends
// the session when its input ends.)
func onTerminal(t *testing.T, line string) (*os.File, *syncBuffer, <-chan error) {
	t.Helper()
	if _, err := exec.LookPath("script"); err != nil {
		t.Skip("script(1) not installed")
	}
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close(); w.Close() })
	cmd := exec.Command("script", "-qec", line, "/dev/null")
	cmd.Stdin = r
	out := &syncBuffer{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	exited := make(chan struct{})
	go func() {
		done <- cmd.Wait()
		close(exited)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
	})
	return w, out, done
}

func waitDone(t *testing.T, done <-chan error, out *syncBuffer, what string) error {
	t.Helper()
	select {
	case err := <-done:
		return err
	case <-time.After(10 * time.Second):
		t.Fatalf("%s still running; output %q", what, out.String())
		return nil
	}
}

// On a terminal the command's group takes the terminal over, as a shell's
// job does, so that the command can read it: from stdin, or from /dev/tty
// when memolock's own standard files are redirected.
func TestRun_CommandReadsTheTerminal(t *testing.T) {
	srv := redistest.Start(t)
	for i, read := range []string{"read x", "read x < /dev/tty"} {
		t.Run(read, func(t *testing.T) {
			dir := t.TempDir()
			line := fmt.Sprintf("%s run --redis redis://%s --tag tty --id %d --ttl 1m -- sh -c '%s; echo got:$x'", binary, srv.Addr, i, read)
			if strings.Contains(read, "/dev/tty") {
				line += fmt.Sprintf(" </dev/null >%s/out 2>&1; cat %s/out", dir, dir)
			}
			w, out, done := onTerminal(t, line)
			fmt.Fprintln(w, "hello")
			if err := waitDone(t, done, out, "the invocation"); err != nil || !strings.Contains(out.String(), "got:hello") {
				t.Errorf("exit %v, output %q", err, out.String())
			}
		})
	}
}

// On a terminal, SIGTERM to memolock still stops the command's whole group,
// processes it started in the background included.
func TestRun_TerminalSignalStopsTheWholeGroup(t *testing.T) {
	srv := redistest.Start(t)
	dir := t.TempDir()
	pids, mlpid := filepath.Join(dir, "pids"), filepath.Join(dir, "mlpid")
	// The terminal stays open after memolock exits: closing it would send
	// SIGHUP to whatever is left in its foreground.
	line := fmt.Sprintf("sh -c 'echo $$ > %s; exec %s run --redis redis://%s --tag tty2 --id k --ttl 1m -- sh -c \"sleep 31 & echo \\$! > %s; wait\"'; echo exit:$?; sleep 10",
		mlpid, binary, srv.Addr, pids)
	_, out, _ := onTerminal(t, line)
	eventually(t, 5*time.Second, "the command to start", func() bool { return len(readPids(t, pids)) == 1 })
	data, _ := os.ReadFile(mlpid)
	pid, err := strconv.Atoi(strings.TrimSpace(string(data)))
	if err != nil {
		t.Fatal(err)
	}
	_ = syscall.Kill(pid, syscall.SIGTERM)
	eventually(t, 10*time.Second, "the invocation to exit", func() bool { return strings.Contains(out.String(), "exit:") })
	if !strings.Contains(out.String(), "exit:143") {
		t.Errorf("output %q, want exit:143", out.String())
	}
	for _, p := range readPids(t, pids) {
		if alive(p) {
			t.Errorf("process %d of the command still runs", p)
		}
	}
}

// ^C on the terminal reaches the command, in the terminal's foreground: the
// invocation exits 130, and a waiting invocation takes over at once rather
// than reporting a failure.
func TestRun_ControlCHandsOver(t *testing.T) {
	srv := redistest.Start(t)
	dir := t.TempDir()
	started := filepath.Join(dir, "started")
	// The shell around it gets the ^C too: it must live to print the status.
	line := fmt.Sprintf("trap : INT; %s run --redis redis://%s --tag tty3 --id k --ttl 1m --lock-ttl 30s -- sh -c 'touch %s; sleep 30'; echo exit:$?",
		binary, srv.Addr, started)
	w, out, done := onTerminal(t, line)
	eventually(t, 5*time.Second, "the command to start", func() bool { _, err := os.Stat(started); return err == nil })
	waiter := startMemolock(t, "run", "--redis", "redis://"+srv.Addr, "--tag", "tty3", "--id", "k", "--ttl", "1m",
		"--", "echo", "taken-over")
	eventually(t, 5*time.Second, "the waiter to wait", func() bool { return strings.Contains(waiter.errb.String(), "waiting for") })
	_, _ = w.Write([]byte{3}) // ^C
	_ = waitDone(t, done, out, "the interrupted invocation")
	if !strings.Contains(out.String(), "exit:130") {
		t.Errorf("output %q, want exit:130", out.String())
	}
	wi := waiter.wait(t, 10*time.Second, "the waiter")
	if wi.code != 0 || strings.TrimSpace(wi.stdout) != "taken-over" {
		t.Errorf("waiter: exit %d, stdout %q, stderr %q (lock TTL 30s)", wi.code, wi.stdout, wi.stderr)
	}
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr})
	defer rdb.Close()
	if v := rdb.Get(context.Background(), "tty3:k").Val(); v != "taken-over\n" {
		t.Errorf("cached %q", v)
	}
}

// Job control works on memolock run as on any command: ^Z stops it and
// gives the shell its prompt back, fg resumes it, and a background run
// whose command reads the terminal stops until fg gives it the terminal.
func TestRun_JobControlOnATerminal(t *testing.T) {
	if _, err := exec.LookPath("bash"); err != nil {
		t.Skip("bash not installed")
	}
	srv := redistest.Start(t)
	dir := t.TempDir()
	started := filepath.Join(dir, "started")
	w, out, done := onTerminal(t, "bash --norc --noprofile -i")
	typeLine := func(line string) { _, _ = fmt.Fprintln(w, line) }
	expect := func(what string) {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		for !strings.Contains(out.String(), what) {
			if time.Now().After(deadline) {
				t.Fatalf("no %q on the terminal: %q", what, out.String())
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	run := fmt.Sprintf("%s run --redis redis://%s --tag jc --ttl 1m --lock-ttl 30s", binary, srv.Addr)

	// ^Z, then fg. The command sleeps long enough for the ^Z to find it
	// running on a loaded machine.
	typeLine(fmt.Sprintf("%s --id 1 -- sh -c 'touch %s; sleep 3; echo slept'", run, started))
	eventually(t, 10*time.Second, "the command to start", func() bool { _, err := os.Stat(started); return err == nil })
	_, _ = w.Write([]byte{0x1a}) // ^Z
	expect("Stopped")
	typeLine("fg; echo fg1:$?")
	expect("fg1:0")

	// In the background, reading the terminal: stopped, then fg.
	typeLine(fmt.Sprintf("%s --id 2 -- sh -c 'read x; echo got:$x' &", run))
	typeLine("sleep 0.5; jobs")
	expect("Stopped")
	mark := len(out.String())
	typeLine("fg")
	// fg prints the job's command line as it gives it the terminal.
	eventually(t, 10*time.Second, "fg", func() bool { return strings.Contains(out.String()[mark:], "got:$x") })
	typeLine("hello")
	expect("got:hello")
	typeLine("exit")
	_ = waitDone(t, done, out, "the shell")
}
