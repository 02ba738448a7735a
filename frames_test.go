package memolock

import (
	"runtime"
	"strings"
	"testing"
	"time"
)

// TestGet_AWaitingCallerWaitsInItsOwnFrame checks that a caller of Get or
// GetResult that waits for a flight (its own or another's) is parked in
// that method's frame, with no frame of the engine's between it and the
// channel it waits on: a caller woken with a thousand others returns
// through every frame it waited in, and each was a cache line or two to
// fetch again (see engine.Wait.Done and BenchmarkWakeupProcesses).
func TestGet_AWaitingCallerWaitsInItsOwnFrame(t *testing.T) {
	srv := miniBackend(t)
	c := newTestClient(t, srv.addr, "frames", nil)
	started, release := make(chan struct{}), make(chan struct{})
	done := make(chan error, 3)
	go func() {
		_, err := c.Get(bg(), "x", blockingFetch(started, release, "v"))
		done <- err
	}()
	<-started
	go func() {
		_, err := c.Get(bg(), "x", failFetch)
		done <- err
	}()
	go func() {
		_, err := c.GetResult(bg(), "x", failFetch)
		done <- err
	}()
	var parked map[string]int
	eventually(t, 5*time.Second, "three callers parked in Get and GetResult", func() bool {
		parked = waitingCallers(t)
		return parked["Get"] == 2 && parked["GetResult"] == 1
	})
	close(release)
	for range 3 {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
}

// waitingCallers counts, by method, the goroutines parked on a channel
// receive inside package memolock's Get or GetResult. It fails t if one
// waits with another frame between the receive and the method.
func waitingCallers(t *testing.T) map[string]int {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	n := map[string]int{}
	for _, g := range strings.Split(string(buf), "\n\n") {
		if !strings.Contains(g, "[chan receive") {
			continue
		}
		// The stack's functions, innermost first; a traceback leaves out
		// the runtime's own frames (the receive's).
		var funcs []string
		for _, line := range strings.Split(g, "\n")[1:] {
			if !strings.HasPrefix(line, "\t") && !strings.HasPrefix(line, "runtime.") {
				funcs = append(funcs, line)
			}
		}
		for i, fn := range funcs {
			method := ""
			switch {
			case strings.HasPrefix(fn, "github.com/memolock/memolock.(*Client).Get("):
				method = "Get"
			case strings.HasPrefix(fn, "github.com/memolock/memolock.(*Client).GetResult("):
				method = "GetResult"
			default:
				continue
			}
			if i > 0 {
				t.Fatalf("a caller of %s waits below it, not in its frame:\n%s", method, g)
			}
			n[method]++
			break
		}
	}
	return n
}
