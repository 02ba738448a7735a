package memolock

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// BenchmarkWakeupProcesses measures the time from PUBLISH to the return of
// each waiting call, for 4 OS processes × 250 goroutines parked on one key,
// as separate services would be. Each process has its own Go scheduler, and
// stamps its returns with the wall clock, which all processes share. Three
// designs run in the same run, their rounds interleaved so that the
// machine's noise falls on all three alike:
//
//   - memolock: one Client per process, 250 Gets on the key;
//   - psubscribe: the original redis-memolock's design, one PSUBSCRIBE of
//     the tag per process, go-redis Channel() and a dispatcher;
//   - floor: what no design can beat, one plain SUBSCRIBE per process whose
//     message closes one channel that its 250 goroutines wait on.
//
// Each iteration parks and wakes 1,000 waiters of each design. It reports
// p50 and p99 for each, over every waiter of every round, and memolock's
// over the floor's. The pooled p99 is mostly made by the 1-3% of rounds
// that the machine slows as a whole (a round whose every waiter is late
// puts 1,000 samples in the tail at once), so it also reports each
// round's own p99, the tail of one wake-up, as the median over rounds
// (round-p99-µs), and the median of memolock's over the floor's, round by
// round (round-p99-vs-floor: the rounds of one iteration ran back to back).
//
// Most of a wake-up is the machine's: the PUBLISH reaching each process and
// its scheduler waking (0.3-0.7 ms here, moving from round to round, alike
// for every design). What a design adds is mostly what it costs to run its
// 250 callers once one of them is awake, so it also reports each process's
// own spread, from its first caller's return to its median caller's, as
// the median over processes and rounds (spread-µs), and memolock's over
// the floor's (spread-vs-floor).
func BenchmarkWakeupProcesses(b *testing.B) {
	srv := realBackend(b)
	modes := []string{"floor", "memolock", "psubscribe"}
	children := map[string][]*child{}
	for _, mode := range modes {
		for range wakeProcesses {
			children[mode] = append(children[mode], startWakeChild(b, srv.addr, mode))
		}
	}
	raw := rawClient(b, srv.addr)
	lat := map[string][]time.Duration{}
	spread := map[string][]float64{}   // per process and round, first to median return, in µs
	roundP99 := map[string][]float64{} // each round's own p99, in µs
	var pairs []float64                // memolock's round p99 over the floor's, per iteration
	for i := 0; b.Loop(); i++ {
		for k := range modes {
			mode := modes[(i+k)%len(modes)] // rotate which goes first
			round, spreads := wakeRound(b, raw, children[mode], "wake-"+mode, strconv.Itoa(i))
			lat[mode] = append(lat[mode], round...)
			spread[mode] = append(spread[mode], spreads...)
			roundP99[mode] = append(roundP99[mode], float64(percentiles(round)[1].Microseconds()))
		}
		pairs = append(pairs, roundP99["memolock"][i]/roundP99["floor"][i])
	}
	p := map[string][2]time.Duration{}
	for _, mode := range modes {
		p[mode] = percentiles(lat[mode])
		b.ReportMetric(float64(p[mode][0].Microseconds()), mode+"-p50-µs")
		b.ReportMetric(float64(p[mode][1].Microseconds()), mode+"-p99-µs")
		b.ReportMetric(medianOf(roundP99[mode]), mode+"-round-p99-µs")
		b.ReportMetric(medianOf(spread[mode]), mode+"-spread-µs")
	}
	b.ReportMetric(medianOf(spread["memolock"])/medianOf(spread["floor"]), "spread-vs-floor")
	b.ReportMetric(float64(p["memolock"][0])/float64(p["floor"][0]), "p50-vs-floor")
	b.ReportMetric(float64(p["memolock"][1])/float64(p["floor"][1]), "p99-vs-floor")
	b.ReportMetric(medianOf(pairs), "round-p99-vs-floor")
}

// medianOf returns the median of xs, which it sorts.
func medianOf(xs []float64) float64 {
	slices.Sort(xs)
	if n := len(xs); n%2 == 0 {
		return (xs[n/2-1] + xs[n/2]) / 2
	}
	return xs[len(xs)/2]
}

// wakeRound parks the children's goroutines on id of tag, publishes its
// value once, and returns how long after the PUBLISH each returned, and
// each child's spread (from its first return to its median one, in µs).
// Only the PUBLISH and the wake-up are timed. Each design has a tag of its
// own, so that the PSUBSCRIBE design's pattern hears only its own rounds.
func wakeRound(b *testing.B, raw *redis.Client, children []*child, tag, id string) ([]time.Duration, []float64) {
	b.StopTimer()
	raw.Set(bg(), tag+"/lock:"+id, "publisher", time.Minute)
	for _, c := range children {
		if _, err := fmt.Fprintln(c.in, "park "+id); err != nil {
			b.Fatal(err)
		}
	}
	for _, c := range children {
		if !c.out.Scan() || c.out.Text() != "parked" {
			b.Fatalf("child did not park: %q %v", c.out.Text(), c.out.Err())
		}
	}
	raw.Set(bg(), tag+":"+id, "v", time.Minute)
	b.StartTimer()
	t0 := time.Now().UnixNano()
	raw.Publish(bg(), tag+"/notif:"+id, "v")
	var lat []time.Duration
	var spreads []float64
	for _, c := range children {
		if !c.out.Scan() {
			b.Fatal(c.out.Err())
		}
		var own []time.Duration
		for _, f := range strings.Fields(c.out.Text()) {
			ns, err := strconv.ParseInt(f, 10, 64)
			if err != nil {
				b.Fatal(err)
			}
			own = append(own, time.Duration(ns-t0))
		}
		if len(own) != wakeGoroutines {
			b.Fatalf("a child returned %d stamps, want %d", len(own), wakeGoroutines)
		}
		lat = append(lat, own...)
		slices.Sort(own)
		spreads = append(spreads, float64(own[len(own)/2]-own[0])/float64(time.Microsecond))
	}
	return lat, spreads
}

const (
	wakeProcesses  = 4
	wakeGoroutines = 250
	wakeChildEnv   = "MEMOLOCK_WAKE_CHILD"
)

// child is this test binary run again as a helper process (see TestMain),
// driven by lines on its stdin.
type child struct {
	cmd *exec.Cmd
	in  io.WriteCloser
	out *bufio.Scanner
}

// startChild starts a child with env (NAME=spec) added. When the test
// ends, its stdin is closed and it is waited for, or killed if the test
// failed.
func startChild(tb testing.TB, env string) *child {
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), env)
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		tb.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		tb.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	c := &child{cmd: cmd, in: in, out: bufio.NewScanner(out)}
	c.out.Buffer(make([]byte, 1<<20), 1<<20)
	tb.Cleanup(func() {
		_ = in.Close()
		if tb.Failed() {
			_ = cmd.Process.Kill()
		}
		_ = cmd.Wait()
	})
	return c
}

// startWakeChild is one process of BenchmarkWakeupProcesses.
func startWakeChild(b *testing.B, addr, mode string) *child {
	return startChild(b, wakeChildEnv+"="+mode+" "+addr)
}

// runWakeChild is the child process's side: it parks its goroutines on
// each key it is told, says "parked" once they are all parked and its
// subscription is live, and prints the wall-clock times at which they
// returned.
func runWakeChild(spec string) {
	mode, addr, _ := strings.Cut(spec, " ")
	tag := "wake-" + mode
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	defer rdb.Close()
	in := bufio.NewScanner(os.Stdin)
	var park func(id string, ready chan<- struct{}) // set per mode

	switch mode {
	case "memolock":
		c, err := New(rdb, tag, &Options{LockTTL: time.Minute})
		if err != nil {
			panic(err)
		}
		defer c.Close()
		looks := countLookups(rdb, "")
		park = func(id string, ready chan<- struct{}) {
			before := c.Stats().Coalesced
			looks.key.Store(tag + ":" + id)
			looks.n.Store(0)
			go func() {
				// Parked: every caller joined, and the flight looked again
				// once its subscription was live.
				for c.Stats().Coalesced-before < wakeGoroutines-1 || looks.n.Load() < 2 {
					time.Sleep(100 * time.Microsecond)
				}
				ready <- struct{}{}
			}()
		}
		runWakeRounds(in, park, func(id string) {
			if _, err := c.Get(context.Background(), id, failFetch); err != nil {
				panic(err)
			}
		})
	case "psubscribe":
		p := newPSubscribeWaiters(rdb, tag)
		defer p.close()
		park = func(id string, ready chan<- struct{}) {
			go func() {
				for p.parked(tag+"/notif:"+id) < wakeGoroutines {
					time.Sleep(100 * time.Microsecond)
				}
				ready <- struct{}{}
			}()
		}
		runWakeRounds(in, park, func(id string) { p.wait(tag + "/notif:" + id) })
	case "floor":
		ps := rdb.Subscribe(context.Background())
		defer ps.Close()
		var mu sync.Mutex
		var woken chan struct{}
		park = func(id string, ready chan<- struct{}) {
			ch := make(chan struct{})
			mu.Lock()
			woken = ch
			mu.Unlock()
			if err := ps.Subscribe(context.Background(), tag+"/notif:"+id); err != nil {
				panic(err)
			}
			go func() {
				for {
					msg, err := ps.Receive(context.Background())
					if err != nil {
						panic(err)
					}
					switch m := msg.(type) {
					case *redis.Subscription:
						if m.Kind == "subscribe" {
							ready <- struct{}{}
						}
					case *redis.Message:
						close(ch)
						return
					}
				}
			}()
		}
		runWakeRounds(in, park, func(string) {
			mu.Lock()
			ch := woken
			mu.Unlock()
			<-ch
		})
	default:
		panic("unknown mode " + mode)
	}
}

// runWakeRounds runs the rounds the parent asks for: park wakeGoroutines
// calls of wait, say "parked" once they all called it and park says ready,
// and print their return times.
func runWakeRounds(in *bufio.Scanner, park func(string, chan<- struct{}), wait func(id string)) {
	for in.Scan() {
		id, ok := strings.CutPrefix(in.Text(), "park ")
		if !ok {
			panic("bad command " + in.Text())
		}
		stamps := make([]int64, wakeGoroutines)
		var wg sync.WaitGroup
		var entered atomic.Int64
		ready := make(chan struct{}, 1)
		park(id, ready)
		for g := range wakeGoroutines {
			wg.Add(1)
			go func() {
				defer wg.Done()
				entered.Add(1)
				wait(id)
				stamps[g] = time.Now().UnixNano()
			}()
		}
		<-ready
		for entered.Load() < wakeGoroutines {
			time.Sleep(100 * time.Microsecond)
		}
		time.Sleep(time.Millisecond) // the last ones from entered to parked
		fmt.Println("parked")
		wg.Wait()
		var sb strings.Builder
		for _, s := range stamps {
			sb.WriteString(strconv.FormatInt(s, 10))
			sb.WriteByte(' ')
		}
		fmt.Println(sb.String())
	}
}
