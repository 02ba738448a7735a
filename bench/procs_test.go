package bench

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"runtime/trace"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// The cross-process benchmarks run this test binary again as child
// processes, as separate services would run: each child runs one library
// (one or more clients of it) and does what the parent asks on its stdin,
// one line at a time, answering on its stdout. The parent alternates the
// libraries round by round, so that they share the machine's state, and
// counts the commands Redis ran in each round (INFO commandstats).

// childEnv, when set ("<library> <addr> <clients> <profile dir or ->
// <index> <profile kinds or ->"), makes the test binary a child instead of
// running tests (see TestMain).
const childEnv = "MEMOLOCK_BENCH_CHILD"

var (
	libsFlag     = flag.String("procs.libs", strings.Join(allLibs, ","), "the libraries the cross-process benchmarks compare, comma-separated")
	profileDir   = flag.String("procs.profile", "", "if set, each child writes profiles of each timed round into this directory (see -procs.profile.kinds)")
	profileKinds = flag.String("procs.profile.kinds", "cpu,trace,block,mutex", "with -procs.profile, what the children record: any of cpu, trace, block, mutex and allocs (block, mutex and allocs sampling slow the children down)")
)

// libs returns the libraries of -procs.libs.
func libs(tb testing.TB) []string {
	var out []string
	for _, l := range strings.Split(*libsFlag, ",") {
		if l = strings.TrimSpace(l); l == "" {
			continue
		}
		if !slices.Contains(allLibs, l) {
			tb.Fatalf("-procs.libs: unknown library %q (known: %s)", l, strings.Join(allLibs, ", "))
		}
		out = append(out, l)
	}
	if len(out) == 0 {
		tb.Fatal("-procs.libs names no library")
	}
	return out
}

// child is one child process, seen from the parent.
type child struct {
	lib string
	in  io.WriteCloser
	out *bufio.Scanner
}

// startChildren starts n children that each run clients clients of lib
// against addr, and waits until they are ready. When the benchmark ends,
// their stdin is closed, and they close their clients and exit.
func startChildren(tb testing.TB, lib, addr string, n, clients int) []*child {
	dir, kinds := "-", "-"
	if *profileDir != "" {
		kinds = strings.ReplaceAll(*profileKinds, " ", "")
		for _, k := range strings.Split(kinds, ",") {
			if !slices.Contains([]string{"cpu", "trace", "block", "mutex", "allocs"}, k) {
				tb.Fatalf("-procs.profile.kinds: unknown kind %q (known: cpu, trace, block, mutex, allocs)", k)
			}
		}
		abs, err := filepath.Abs(*profileDir)
		if err != nil {
			tb.Fatal(err)
		}
		if err := os.MkdirAll(abs, 0o755); err != nil {
			tb.Fatal(err)
		}
		dir = abs
	}
	var cs []*child
	for i := range n {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%s %s %d %s %d %s", childEnv, lib, addr, clients, dir, i, kinds))
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
		tb.Cleanup(func() {
			_ = in.Close()
			done := make(chan struct{})
			go func() {
				_ = cmd.Wait()
				close(done)
			}()
			select {
			case <-done:
			case <-time.After(30 * time.Second):
				_ = cmd.Process.Kill()
				<-done
			}
		})
		c := &child{lib: lib, in: in, out: bufio.NewScanner(out)}
		c.out.Buffer(make([]byte, 64<<10), 64<<20) // a phases line is long
		cs = append(cs, c)
	}
	for _, c := range cs {
		c.expect(tb, "ready")
	}
	return cs
}

// send writes one line to the child.
func (c *child) send(tb testing.TB, line string) {
	tb.Helper()
	if _, err := io.WriteString(c.in, line+"\n"); err != nil {
		tb.Fatalf("%s child: %v", c.lib, err)
	}
}

// expect reads the child's next line, which must start with word, and
// returns the fields after it.
func (c *child) expect(tb testing.TB, word string) []string {
	tb.Helper()
	if !c.out.Scan() {
		tb.Fatalf("%s child ended before %q: %v", c.lib, word, c.out.Err())
	}
	f := strings.Fields(c.out.Text())
	if len(f) == 0 || f[0] != word {
		tb.Fatalf("%s child said %q; want %q", c.lib, c.out.Text(), word)
	}
	return f[1:]
}

// childReport is what a child says when a round is over.
type childReport struct {
	ops, errs, comps int64
	start            time.Time     // when the child released its goroutines
	elapsed          time.Duration // from then to the last call's return
	gcs              int64         // garbage collections during the round
	allocs, bytes    int64         // heap objects and bytes allocated during the round
	cpu              time.Duration // CPU time the process used in the round (user and system)
}

func parseReport(tb testing.TB, f []string) childReport {
	tb.Helper()
	if len(f) != 8 {
		tb.Fatalf("bad report %q", f)
	}
	var n [8]int64
	for i, s := range f {
		v, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			tb.Fatalf("bad report %q: %v", f, err)
		}
		n[i] = v
	}
	return childReport{ops: n[0], errs: n[1], comps: n[2], elapsed: time.Duration(n[3]), gcs: n[4], cpu: time.Duration(n[5]), allocs: n[6], bytes: n[7]}
}

// roundResult is what one round measured.
type roundResult struct {
	wall    time.Duration // from the first "go" to the last report
	reports []childReport
	cmds    cmdCount // the commands Redis ran, trailing ones included
	// phases, if the round was asked for them, are each child's timings.
	phases []childPhases
	// redisCPU is the CPU time of redis-server's main thread from the
	// first "go" to the last report, and redisWait the time it was ready
	// to run but waited for a core (zero if /proc has no schedstat).
	redisCPU, redisWait time.Duration
}

// clientCPU is the CPU time of the children in the round.
func (r roundResult) clientCPU() time.Duration {
	var d time.Duration
	for _, c := range r.reports {
		d += c.cpu
	}
	return d
}

// round runs one round on children: each is sent cmd, says "set" once its
// goroutines wait for the start, and is then told "go" (all of them, one
// after the other). The commands are counted once the round's trailing
// ones (delayed unsubscriptions, say) are in.
func round(tb testing.TB, rdb *redis.Client, children []*child, cmd string) roundResult {
	tb.Helper()
	for _, c := range children {
		c.send(tb, cmd)
	}
	for _, c := range children {
		c.expect(tb, "set")
	}
	before := commandStats(tb, rdb)
	cpu0, wait0 := schedstat(redisPID)
	t0 := time.Now()
	for _, c := range children {
		c.send(tb, "go")
	}
	r := roundResult{reports: make([]childReport, len(children))}
	wantPhases := strings.HasPrefix(cmd, "miss ") && strings.HasSuffix(cmd, " 1")
	for i, c := range children {
		r.reports[i] = parseReport(tb, c.expect(tb, "done"))
		if wantPhases {
			r.phases = append(r.phases, parsePhases(tb, c.expect(tb, "phases")))
		}
	}
	r.wall = time.Since(t0)
	cpu1, wait1 := schedstat(redisPID)
	r.redisCPU, r.redisWait = cpu1-cpu0, wait1-wait0
	r.cmds = settle(tb, rdb).minus(before)
	return r
}

// schedstat returns how long the main thread of process pid has run, and
// waited to run, from /proc/<pid>/schedstat (zeros if it cannot be read).
func schedstat(pid int) (run, wait time.Duration) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/schedstat", pid))
	if err != nil {
		return 0, 0
	}
	f := strings.Fields(string(b))
	if len(f) < 2 {
		return 0, 0
	}
	r, _ := strconv.ParseInt(f[0], 10, 64)
	w, _ := strconv.ParseInt(f[1], 10, 64)
	return time.Duration(r), time.Duration(w)
}

// cmdCount is what INFO commandstats says: calls by command. Redis counts
// the commands a Lua script calls there too, and so do these counts.
type cmdCount map[string]int64

func (c cmdCount) total() int64 {
	var n int64
	for _, v := range c {
		n += v
	}
	return n
}

// scripts counts the script calls (EVALSHA, EVAL and their read-only
// forms): each is one request, however many commands it calls.
func (c cmdCount) scripts() int64 {
	return c["evalsha"] + c["eval"] + c["evalsha_ro"] + c["eval_ro"]
}

func (c cmdCount) minus(o cmdCount) cmdCount {
	d := cmdCount{}
	for k, v := range c {
		if v -= o[k]; v != 0 && k != "info" {
			d[k] = v
		}
	}
	return d
}

func (c cmdCount) String() string {
	keys := make([]string, 0, len(c))
	for k := range c {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return c[keys[i]] > c[keys[j]] })
	var sb strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&sb, " %s=%d", k, c[k])
	}
	return strings.TrimSpace(sb.String())
}

func commandStats(tb testing.TB, rdb *redis.Client) cmdCount {
	tb.Helper()
	s, err := rdb.Info(context.Background(), "commandstats").Result()
	if err != nil {
		tb.Fatal(err)
	}
	c := cmdCount{}
	for _, line := range strings.Split(s, "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":")
		name, isCmd := strings.CutPrefix(name, "cmdstat_")
		if !ok || !isCmd {
			continue
		}
		calls, _, _ := strings.Cut(strings.TrimPrefix(rest, "calls="), ",")
		n, err := strconv.ParseInt(calls, 10, 64)
		if err != nil {
			tb.Fatalf("INFO commandstats: %q: %v", line, err)
		}
		c[name] = n
	}
	return c
}

// settle waits until Redis has run no command but INFO for 50 ms (at most
// 3 s), and returns the counts then.
func settle(tb testing.TB, rdb *redis.Client) cmdCount {
	tb.Helper()
	last := commandStats(tb, rdb)
	deadline := time.Now().Add(3 * time.Second)
	for time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
		now := commandStats(tb, rdb)
		if now.minus(last).total() == 0 {
			return now
		}
		last = now
	}
	return last
}

// median returns the median of xs (the mean of the middle two for an even
// count), which it sorts.
func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	sort.Float64s(xs)
	if n := len(xs); n%2 == 0 {
		return (xs[n/2-1] + xs[n/2]) / 2
	}
	return xs[len(xs)/2]
}

// spread formats xs as "median (min-max)".
func spread(xs []float64, format string) string {
	if len(xs) == 0 {
		return "-"
	}
	s := slices.Clone(xs)
	m := median(s)
	return fmt.Sprintf(format+" ("+format+"-"+format+")", m, s[0], s[len(s)-1])
}

// runChild is the child's side: it makes its clients, says "ready", and
// serves rounds until its stdin closes. It returns the exit code.
func runChild(spec string) int {
	f := strings.Fields(spec)
	if len(f) != 6 {
		fmt.Fprintf(os.Stderr, "%s: want \"library addr clients profile-dir index kinds\", got %q\n", childEnv, spec)
		return 2
	}
	lib, addr, dir, index := f[0], f[1], f[3], f[4]
	n, err := strconv.Atoi(f[2])
	if err != nil || n < 1 {
		fmt.Fprintf(os.Stderr, "%s: bad client count %q\n", childEnv, f[2])
		return 2
	}
	redis.SetLogger(quietLogger{})
	var peers []peer
	defer func() {
		for _, p := range peers {
			p.close()
		}
	}()
	for range n {
		p, err := newPeer(lib, addr)
		if err != nil {
			fmt.Fprintf(os.Stderr, "%s child: %v\n", lib, err)
			return 1
		}
		peers = append(peers, p)
	}
	prof := &profiler{dir: dir, name: lib + "-p" + index, kinds: strings.Split(f[5], ",")}
	if prof.wants("block") {
		runtime.SetBlockProfileRate(1)
	}
	if prof.wants("mutex") {
		runtime.SetMutexProfileFraction(1)
	}
	if prof.wants("allocs") {
		runtime.MemProfileRate = 512
	}
	fmt.Println("ready")
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		w := strings.Fields(in.Text())
		var err error
		switch {
		case len(w) == 7 && w[0] == "miss":
			err = missRound(in, peers, prof, w[1:])
		case len(w) == 5 && w[0] == "hot":
			err = hotRound(in, peers, prof, w[1:])
		default:
			err = fmt.Errorf("unknown command %q", in.Text())
		}
		if err != nil {
			fmt.Fprintf(os.Stderr, "%s child: %v\n", lib, err)
			return 1
		}
	}
	return 0
}

// gate starts calls on every peer's goroutines at once: it starts them,
// says "set" once they all run, waits for "go", then releases them and
// reports when the last one is done. call is one goroutine's work; it
// returns how many calls it made and how many failed.
func gate(in *bufio.Scanner, peers []peer, prof *profiler, label string, goroutines int, call func(p peer, g int) (ops, errs int64)) (childReport, error) {
	release := make(chan struct{})
	var started, finished sync.WaitGroup
	var ops, errs atomic.Int64
	for _, p := range peers {
		for g := range goroutines {
			started.Add(1)
			finished.Add(1)
			go func() {
				defer finished.Done()
				started.Done()
				<-release
				o, e := call(p, g)
				ops.Add(o)
				errs.Add(e)
			}()
		}
	}
	started.Wait()
	fmt.Println("set")
	if !in.Scan() || in.Text() != "go" {
		close(release)
		finished.Wait()
		return childReport{}, fmt.Errorf("want \"go\", got %q (%v)", in.Text(), in.Err())
	}
	stop := prof.start(label)
	// The heap and the collections are counted, as the CPU time is, inside
	// the profiler's start and stop: writing the profiles allocates
	// megabytes, and the allocations profile forces collections.
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	gcs, allocs, bytes := ms.NumGC, ms.Mallocs, ms.TotalAlloc
	cpu0 := cpuTime()
	t0 := time.Now()
	close(release)
	finished.Wait()
	elapsed := time.Since(t0)
	cpu := cpuTime() - cpu0
	runtime.ReadMemStats(&ms)
	stop()
	return childReport{ops: ops.Load(), errs: errs.Load(), start: t0, elapsed: elapsed, gcs: int64(ms.NumGC - gcs), cpu: cpu,
		allocs: int64(ms.Mallocs - allocs), bytes: int64(ms.TotalAlloc - bytes)}, nil
}

// missRound: "miss <label> <prefix> <keys> <goroutines> <fetch> <phases>".
// Each client's goroutine g gets key prefix+(g mod keys) once, with a
// fetch that takes the fetch time. With phases 1, it also says when each
// fetch started and ended and when each call returned (see phaseLine).
func missRound(in *bufio.Scanner, peers []peer, prof *profiler, w []string) error {
	label, prefix := w[0], w[1]
	keys, err1 := strconv.Atoi(w[2])
	goroutines, err2 := strconv.Atoi(w[3])
	d, err3 := time.ParseDuration(w[4])
	if err := errors.Join(err1, err2, err3); err != nil || keys < 1 || goroutines < 1 || (w[5] != "0" && w[5] != "1") {
		return fmt.Errorf("bad miss round %q: %v", w, err)
	}
	phases := w[5] == "1"
	var comps atomic.Int64
	var mu sync.Mutex
	var fetches []fetchSpan
	returns := make([]int64, len(peers)*goroutines) // unix ns, by client and goroutine
	ctx := context.Background()
	r, err := gate(in, peers, prof, label, goroutines, func(p peer, g int) (int64, int64) {
		key := prefix + strconv.Itoa(g%keys)
		want := value(g % keys)
		v, err := p.get(ctx, key, func() ([]byte, error) {
			comps.Add(1)
			t := time.Now()
			time.Sleep(d)
			if phases {
				mu.Lock()
				fetches = append(fetches, fetchSpan{key: g % keys, start: t.UnixNano(), end: time.Now().UnixNano()})
				mu.Unlock()
			}
			return []byte(want), nil
		})
		if phases {
			returns[slices.Index(peers, p)*goroutines+g] = time.Now().UnixNano()
		}
		if err != nil || string(v) != want {
			fmt.Fprintf(os.Stderr, "get %s = %q, %v; want %q\n", key, v, err, want)
			return 1, 1
		}
		return 1, 0
	})
	if err != nil {
		return err
	}
	r.comps = comps.Load()
	fmt.Println("done", r.ops, r.errs, r.comps, int64(r.elapsed), r.gcs, int64(r.cpu), r.allocs, r.bytes)
	if phases {
		fmt.Println(phaseLine(r.start, keys, goroutines, fetches, returns))
	}
	return nil
}

// fetchSpan is one fetch a child ran: for key index key, from start to end
// (unix ns).
type fetchSpan struct {
	key        int
	start, end int64
}

// phaseLine is "phases <start> <fetches> <key> <start> <end>... <returns>
// <return>...": the round's start, then each fetch, then the return of each
// call, by client and goroutine (goroutine g of a client asked for key g mod
// keys), in ns since the start.
func phaseLine(start time.Time, keys, goroutines int, fetches []fetchSpan, returns []int64) string {
	t0 := start.UnixNano()
	var sb strings.Builder
	fmt.Fprintf(&sb, "phases %d %d %d %d", t0, keys, goroutines, len(fetches))
	for _, f := range fetches {
		fmt.Fprintf(&sb, " %d %d %d", f.key, f.start-t0, f.end-t0)
	}
	fmt.Fprintf(&sb, " %d", len(returns))
	for _, r := range returns {
		fmt.Fprintf(&sb, " %d", r-t0)
	}
	return sb.String()
}

// hotRound: "hot <label> <key> <goroutines> <duration>". The goroutines
// read key, which is stored, over and over for the duration.
func hotRound(in *bufio.Scanner, peers []peer, prof *profiler, w []string) error {
	label, key := w[0], w[1]
	goroutines, err1 := strconv.Atoi(w[2])
	d, err2 := time.ParseDuration(w[3])
	if err := errors.Join(err1, err2); err != nil || goroutines < 1 || d <= 0 {
		return fmt.Errorf("bad hot round %q: %v", w, err)
	}
	var comps atomic.Int64
	var stop atomic.Bool
	var timer *time.Timer
	var once sync.Once
	ctx := context.Background()
	want := value(hotValue)
	fetch := func() ([]byte, error) {
		comps.Add(1)
		return nil, errMiss
	}
	r, err := gate(in, peers, prof, label, goroutines, func(p peer, _ int) (ops, errs int64) {
		once.Do(func() { timer = time.AfterFunc(d, func() { stop.Store(true) }) })
		for !stop.Load() {
			v, err := p.get(ctx, key, fetch)
			ops++
			if err != nil || string(v) != want {
				fmt.Fprintf(os.Stderr, "get %s = %q, %v; want %q\n", key, v, err, want)
				errs++
				break
			}
		}
		return ops, errs
	})
	if err != nil {
		return err
	}
	timer.Stop()
	r.comps = comps.Load()
	fmt.Println("done", r.ops, r.errs, r.comps, int64(r.elapsed), r.gcs, int64(r.cpu), r.allocs, r.bytes)
	return nil
}

// cpuTime is the CPU time this process has used, user and system.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// hotValue is the index of the hot key's value (see value).
const hotValue = 7

// profiler writes the profiles of one child's timed rounds, when it has a
// directory: a CPU profile and an execution trace of the round, and the
// block and mutex profiles (cumulative) before and after it, to be read
// with go tool pprof -base; and the allocations profile likewise.
type profiler struct {
	dir, name string
	kinds     []string // cpu, trace, block, mutex, allocs
}

func (p *profiler) wants(kind string) bool { return p.dir != "-" && slices.Contains(p.kinds, kind) }

// start starts profiling the round label, unless it is a warm-up ("warm"
// rounds are not profiled), and returns the function that stops it.
func (p *profiler) start(label string) func() {
	if p.dir == "-" || strings.HasPrefix(label, "warm") {
		return func() {}
	}
	base := filepath.Join(p.dir, label+"-"+p.name)
	p.snapshot(base + ".before")
	var stops []func()
	if p.wants("cpu") {
		if f, err := os.Create(base + ".cpu.pprof"); err != nil {
			fmt.Fprintln(os.Stderr, "profile:", err)
		} else if err := pprof.StartCPUProfile(f); err != nil {
			fmt.Fprintln(os.Stderr, "profile:", err)
			_ = f.Close()
		} else {
			stops = append(stops, func() { pprof.StopCPUProfile(); _ = f.Close() })
		}
	}
	if p.wants("trace") {
		if f, err := os.Create(base + ".trace"); err != nil {
			fmt.Fprintln(os.Stderr, "profile:", err)
		} else if err := trace.Start(f); err != nil {
			fmt.Fprintln(os.Stderr, "profile:", err)
			_ = f.Close()
		} else {
			stops = append(stops, func() { trace.Stop(); _ = f.Close() })
		}
	}
	return func() {
		for i := len(stops) - 1; i >= 0; i-- {
			stops[i]()
		}
		p.snapshot(base + ".after")
	}
}

func (p *profiler) snapshot(base string) {
	for _, kind := range []string{"block", "mutex", "allocs"} {
		if !p.wants(kind) {
			continue
		}
		if kind == "allocs" {
			runtime.GC() // the profile is as of the last GC
		}
		f, err := os.Create(base + "." + kind + ".pprof")
		if err != nil {
			fmt.Fprintln(os.Stderr, "profile:", err)
			return
		}
		_ = pprof.Lookup(kind).WriteTo(f, 0)
		_ = f.Close()
	}
}
