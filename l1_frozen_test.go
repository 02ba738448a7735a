package memolock

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/memolock/memolock/internal/redistest"
)

const frozenReaderEnv = "MEMOLOCK_FROZEN_READER"

// runFrozenReader is the reader process of TestL1_FrozenReaderServesNothingStale:
// a client with an L1 on the server at addr, whose goroutines read one id
// until told "stop"; it says "ready" once the L1 serves the value, and
// "saw <version>" the first time it reads each version. Then it prints,
// for each version, when its last read from the L1 began (Unix ns).
func runFrozenReader(addr string) {
	redis.SetLogger(quietLogger{})
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	defer rdb.Close()
	c, err := New(rdb, "frozen", &Options{L1Size: 100})
	if err != nil {
		panic(err)
	}
	defer c.Close()
	var mu sync.Mutex
	last := map[int]hotRead{} // the last read of each version that the L1 served
	seen := map[int]bool{}
	var ready atomic.Bool
	var stop atomic.Bool
	go func() {
		in := bufio.NewScanner(os.Stdin)
		in.Scan() // "stop", or the parent went away
		stop.Store(true)
	}()
	// Two readers that never sleep: when the process resumes, they run
	// on at once, as busy request handlers would, while the invalidation
	// waits for the network poller.
	var wg sync.WaitGroup
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !stop.Load() {
				start := time.Now()
				r, err := c.GetResult(context.Background(), "k", failFetch)
				if err != nil {
					continue
				}
				v, _ := strconv.Atoi(strings.TrimPrefix(string(r.Value), "v"))
				mu.Lock()
				if !seen[v] {
					seen[v] = true
					fmt.Println("saw", v)
				}
				// Only what the L1 served is judged: a call that joins
				// a flight gets what that flight's lookup read, which a
				// freeze can make as old as the freeze (singleflight's
				// semantics, not the L1's).
				if r.Served == ServedL1 {
					last[v] = hotRead{start: start.UnixNano(), served: r.Served}
				}
				mu.Unlock()
				if r.Served == ServedL1 && ready.CompareAndSwap(false, true) {
					fmt.Println("ready")
				}
			}
		}()
	}
	wg.Wait()
	for v, r := range last {
		fmt.Println("last", v, r.start, int(r.served))
	}
	fmt.Println("done")
}

// frozenFor is how long a reader process is frozen: longer than l1Bound,
// so that a value served from the L1 right after it resumes is stale by
// more than the bound.
const frozenFor = 3 * time.Second

// frozenReader is one reader process, and its lines.
type frozenReader struct {
	*child
	lines chan string
}

// await waits until the reader says want.
func (r frozenReader) await(t *testing.T, want string, within time.Duration) {
	t.Helper()
	deadline := time.After(within)
	for {
		select {
		case line, ok := <-r.lines:
			if !ok {
				t.Fatalf("a reader ended before %q", want)
			}
			if line == want {
				return
			}
		case <-deadline:
			t.Fatalf("a reader did not say %q within %v", want, within)
		}
	}
}

// An L1 reader process frozen (SIGSTOP) while its value is overwritten
// must not serve the old value, once it resumes, later than l1Bound after
// the write: the invalidation waits in its socket, unread, and the L1 must
// not take the connection's silence for "nothing changed". Whether a
// resumed reader reads its L1 before its invalidation is read is up to
// the Go scheduler: 2 reader processes are frozen twice each.
func TestL1_FrozenReaderServesNothingStale(t *testing.T) {
	const readers, freezes = 2, 2
	srv := redistest.Start(t)
	writer := newTestClient(t, srv.Addr, "frozen", nil)
	if err := writer.Set(bg(), "k", []byte("v1"), time.Hour); err != nil {
		t.Fatal(err)
	}
	var procs []frozenReader
	for range readers {
		r := frozenReader{startChild(t, frozenReaderEnv+"="+srv.Addr), make(chan string, 100)}
		go func() {
			defer close(r.lines)
			for r.out.Scan() {
				r.lines <- r.out.Text()
			}
		}()
		r.await(t, "ready", 10*time.Second) // its L1 serves v1
		pid := r.cmd.Process.Pid
		t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGCONT) })
		procs = append(procs, r)
	}
	written := map[int]time.Time{} // version: when it was written
	for v := 2; v < 2+freezes; v++ {
		for _, r := range procs {
			if err := syscall.Kill(r.cmd.Process.Pid, syscall.SIGSTOP); err != nil {
				t.Fatal(err)
			}
		}
		for _, r := range procs {
			eventually(t, 5*time.Second, "every thread of a reader to be stopped", func() bool { return allStopped(r.cmd.Process.Pid) })
		}
		if err := writer.Set(bg(), "k", fmt.Appendf(nil, "v%d", v), time.Hour); err != nil {
			t.Fatal(err)
		}
		written[v] = time.Now()
		time.Sleep(frozenFor) // the fault itself: the processes stay frozen this long
		for _, r := range procs {
			if err := syscall.Kill(r.cmd.Process.Pid, syscall.SIGCONT); err != nil {
				t.Fatal(err)
			}
		}
		for _, r := range procs {
			r.await(t, fmt.Sprint("saw ", v), 10*time.Second)
		}
	}
	for p, r := range procs {
		if _, err := r.in.Write([]byte("stop\n")); err != nil {
			t.Fatal(err)
		}
		for line := range r.lines {
			var v, served int
			var start int64
			if n, _ := fmt.Sscanf(line, "last %d %d %d", &v, &start, &served); n != 3 {
				continue
			}
			next, ok := written[v+1]
			if !ok {
				continue
			}
			late := time.Unix(0, start).Sub(next)
			t.Logf("reader %d: its last read of v%d (served %v) began %v after v%d was written", p, v, Served(served), late.Round(time.Millisecond), v+1)
			if late > l1Bound {
				t.Errorf("reader %d served v%d (%v) from a read that began %v after v%d was written (frozen %v); want none later than %v after the write",
					p, v, Served(served), late.Round(time.Millisecond), v+1, frozenFor, l1Bound)
			}
		}
	}
}

// allStopped reports whether every thread of a process is stopped
// (/proc/<pid>/task/*/stat): SIGSTOP stops each thread as it next runs.
func allStopped(pid int) bool {
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil || len(tasks) == 0 {
		return false
	}
	for _, task := range tasks {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/stat", pid, task.Name()))
		if err != nil {
			return false
		}
		// pid (comm) state ...: comm may hold spaces, so look after its ")".
		s := string(b)
		i := strings.LastIndexByte(s, ')')
		if i < 0 || i+3 > len(s) || s[i+2] != 'T' {
			return false
		}
	}
	return true
}
