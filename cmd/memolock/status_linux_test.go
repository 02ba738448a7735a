package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/memolock/memolock/internal/redistest"
)

// gatedHolder starts an invocation that holds tag:id until the returned
// function is called, and returns once it holds the lock.
func gatedHolder(t *testing.T, srv *redistest.Server, tag, id string) (open func(), b *background) {
	t.Helper()
	gate := filepath.Join(t.TempDir(), "go")
	b = startMemolock(t, "run", "--redis", "redis://"+srv.Addr, "--tag", tag, "--id", id, "--ttl", "1m", "--lock-ttl", "30s",
		"--", "sh", "-c", "while [ ! -e '"+gate+"' ]; do sleep 0.05; done; echo v")
	rdb := srv.Client(t)
	eventually(t, 10*time.Second, "the holder's lock", func() bool {
		return rdb.Exists(context.Background(), tag+"/lock:"+id).Val() == 1
	})
	return func() {
		if err := os.WriteFile(gate, nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}, b
}

// On a terminal a waiter shows one status line, drawn again in place
// (elapsed time, and whom it waits for), and erases it before the output.
func TestRun_OnATerminalTheWaitIsOneLineInPlace(t *testing.T) {
	srv := redistest.Start(t)
	open, holder := gatedHolder(t, srv, "tty4", "k")
	_, out, done := onTerminal(t, fmt.Sprintf("%s run --redis redis://%s --tag tty4 --id k --ttl 1m -- echo never; echo exit:$?", binary, srv.Addr))
	eventually(t, 10*time.Second, "three drawings of the status line", func() bool {
		return strings.Count(out.String(), "memolock run: waiting for tty4:k, computed by ") >= 3
	})
	open()
	_ = waitDone(t, done, out, "the waiter")
	holder.wait(t, 10*time.Second, "the holder")
	o := out.String()
	first := strings.Index(o, "memolock run: waiting for")
	last := strings.LastIndex(o, "memolock run: waiting for")
	if strings.ContainsAny(o[first:last], "\n") || !strings.Contains(o[first:last], "\r") {
		t.Errorf("the status line was not drawn in place: %q", o)
	}
	if !strings.Contains(o, "s)\x1b[K") {
		t.Errorf("no elapsed time on the status line: %q", o)
	}
	if !strings.Contains(o, "\r\x1b[Kv\r\n") || !strings.Contains(o, "exit:0") {
		t.Errorf("the line was not erased before the output: %q", o)
	}
}

// On a terminal the holder shows how long its command runs, and the
// command's stderr appears on lines of its own, the status line below it.
func TestRun_OnATerminalTheHolderShowsItsCommand(t *testing.T) {
	srv := redistest.Start(t)
	gate := filepath.Join(t.TempDir(), "go")
	line := fmt.Sprintf("%s run --redis redis://%s --tag tty5 --id k --ttl 1m -- sh -c 'echo to-stderr >&2; while [ ! -e %s ]; do sleep 0.05; done; echo v'; echo exit:$?",
		binary, srv.Addr, gate)
	_, out, done := onTerminal(t, line)
	eventually(t, 10*time.Second, "the status line after the command's stderr", func() bool {
		o := out.String()
		i := strings.Index(o, "to-stderr")
		return i >= 0 && strings.Contains(o[i:], "memolock run: computing tty5:k (")
	})
	if err := os.WriteFile(gate, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	_ = waitDone(t, done, out, "the holder")
	o := out.String()
	if !strings.Contains(o, "\r\x1b[Kto-stderr\r\n") || !strings.Contains(o, "exit:0") {
		t.Errorf("the command's stderr is not on a line of its own: %q", o)
	}
	// --quiet: the command has the terminal, and memolock says nothing.
	quiet := fmt.Sprintf("%s run --quiet --redis redis://%s --tag tty5 --id q --ttl 1m -- sh -c 'test -t 2 && echo stderr-is-a-terminal'; echo exit:$?", binary, srv.Addr)
	_, qout, qdone := onTerminal(t, quiet)
	_ = waitDone(t, qdone, qout, "the quiet holder")
	if q := qout.String(); strings.Contains(q, "memolock run:") || !strings.Contains(q, "stderr-is-a-terminal") || !strings.Contains(q, "exit:0") {
		t.Errorf("--quiet: %q", q)
	}
}
