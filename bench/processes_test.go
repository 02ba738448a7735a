package bench

import (
	"flag"
	"fmt"
	"strings"
	"testing"
	"time"
)

var (
	missProcs      = flag.Int("massmiss.procs", 4, "BenchmarkMassMiss: processes (and, in one process, clients)")
	missGoroutines = flag.Int("massmiss.goroutines", 5000, "BenchmarkMassMiss: goroutines per client")
	missKeys       = flag.Int("massmiss.keys", 1000, "BenchmarkMassMiss: missing keys per round")
	missFetch      = flag.Duration("massmiss.fetch", 50*time.Millisecond, "BenchmarkMassMiss: how long a fetch takes")
	missPhases     = flag.Bool("massmiss.phases", false, "BenchmarkMassMiss: log when the fetches ran and the calls returned (percentiles per library)")
	hotProcs       = flag.Int("hotkey.procs", 4, "BenchmarkHotKeyProcesses: processes of the cross-process case")
	hotGoroutines  = flag.Int("hotkey.goroutines", 64, "BenchmarkHotKeyProcesses: goroutines in all, spread over the processes")
	hotDuration    = flag.Duration("hotkey.duration", 500*time.Millisecond, "BenchmarkHotKeyProcesses: how long each round reads")
)

// series collects one figure of one library, a value per round.
type series map[string][]float64

func (s series) add(lib string, v float64) { s[lib] = append(s[lib], v) }

// BenchmarkMassMiss: N processes × M goroutines over K missing keys, each
// fetch taking D (flags -massmiss.*; by default 4 × 5,000 over 1,000, 50
// ms): goroutine g of each process gets key g mod K, all released at once
// (the goroutines exist before the start, so their creation is not timed).
// Each round uses new keys. The libraries take turns, round by round, their
// order rotating, each in processes of its own. The second case runs the
// same load in one process through N clients of the library.
//
// Reported per library, as the median of the rounds: wall-ms (from the
// start signal to the last process's last return), comps/key (fetches run,
// over K: 1 is the least), cmds/round (commands Redis ran, from INFO
// commandstats, which counts the commands Lua scripts call too) and
// scripts/round (EVALSHA and EVAL among them: one request each), cpu-ms
// (the CPU time of the library's processes in the round) and redis-cpu-ms
// (of redis-server's main thread). And memolock's wall time over each
// other library's, from the medians.
func BenchmarkMassMiss(b *testing.B) {
	procs, goroutines, keys := *missProcs, *missGoroutines, *missKeys
	if procs < 1 || goroutines < 1 || keys < 1 || *missFetch < 0 {
		b.Fatalf("-massmiss.procs, -massmiss.goroutines and -massmiss.keys must be at least 1, and -massmiss.fetch not negative")
	}
	cases := []struct {
		name           string
		procs, clients int
	}{
		{fmt.Sprintf("processes=%d", procs), procs, 1},
		{fmt.Sprintf("clients=%d", procs), 1, procs},
	}
	for _, cs := range cases {
		b.Run(cs.name, func(b *testing.B) {
			addr := needRedis(b)
			rdb := newRedis(b, addr)
			ls := libs(b)
			children := map[string][]*child{}
			for _, lib := range ls {
				children[lib] = startChildren(b, lib, addr, cs.procs, cs.clients)
				// Untimed: dials the pools, loads the scripts and starts
				// the subscribers, with a short fetch.
				round(b, rdb, children[lib], fmt.Sprintf("miss warm-%s w%d: %d %d 1ms 0", cs.name, time.Now().UnixNano(), keys, min(goroutines, keys)))
			}
			wall, comps, cmds, scripts, cpu, rcpu, rwait, heap, objs := series{}, series{}, series{}, series{}, series{}, series{}, series{}, series{}, series{}
			last, gcs, phases := map[string]cmdCount{}, map[string]int64{}, map[string]*phaseStats{}
			withPhases := 0
			if *missPhases {
				withPhases = 1
			}
			for i := 0; b.Loop(); i++ {
				for k := range ls {
					lib := ls[(i+k)%len(ls)]
					label := fmt.Sprintf("massmiss-%s-r%d", cs.name, i)
					r := round(b, rdb, children[lib], fmt.Sprintf("miss %s r%dt%d: %d %d %s %d", label, i, time.Now().UnixNano(), keys, goroutines, *missFetch, withPhases))
					if phases[lib] == nil {
						phases[lib] = &phaseStats{}
					}
					phases[lib].add(r.phases)
					var n, allocs, bytes int64
					for _, c := range r.reports {
						allocs += c.allocs
						bytes += c.bytes
						if c.errs > 0 {
							b.Fatalf("%s: %d calls failed", lib, c.errs)
						}
						n += c.comps
						gcs[lib] += c.gcs
					}
					wall.add(lib, ms(r.wall))
					comps.add(lib, float64(n)/float64(keys))
					cmds.add(lib, float64(r.cmds.total()))
					scripts.add(lib, float64(r.cmds.scripts()))
					cpu.add(lib, ms(r.clientCPU()))
					rcpu.add(lib, ms(r.redisCPU))
					rwait.add(lib, ms(r.redisWait))
					heap.add(lib, float64(bytes)/1e6)
					objs.add(lib, float64(allocs)/1e3)
					last[lib] = r.cmds
				}
			}
			for _, lib := range ls {
				b.Logf("%-22s wall %s ms, %s comps/key, %s cmds/round, CPU %s ms, Redis CPU %s ms (waited for a core %s ms), %d GCs, heap %s MB in %s k objects/round; last round: %v",
					lib, spread(wall[lib], "%.0f"), spread(comps[lib], "%.3f"), spread(cmds[lib], "%.0f"),
					spread(cpu[lib], "%.0f"), spread(rcpu[lib], "%.0f"), spread(rwait[lib], "%.0f"), gcs[lib],
					spread(heap[lib], "%.1f"), spread(objs[lib], "%.0f"), last[lib])
				if *missPhases {
					b.Logf("%-22s %v", lib, phases[lib])
				}
				b.ReportMetric(median(wall[lib]), lib+"-wall-ms")
				b.ReportMetric(median(comps[lib]), lib+"-comps/key")
				b.ReportMetric(median(cmds[lib]), lib+"-cmds/round")
				b.ReportMetric(median(scripts[lib]), lib+"-scripts/round")
				b.ReportMetric(median(cpu[lib]), lib+"-cpu-ms")
				b.ReportMetric(median(rcpu[lib]), lib+"-redis-cpu-ms")
			}
			reportRatios(b, ls, wall, "wall")
		})
	}
}

// BenchmarkHotKeyProcesses: 64 goroutines (-hotkey.goroutines) read one
// stored key for 500 ms a round (-hotkey.duration), in one process and
// spread over 4 processes (-hotkey.procs), for each library in processes
// of its own, taking turns round by round. memolock runs without L1;
// go-redis/cache and rueidisaside answer from their local caches.
//
// Reported per library, as the median of the rounds: ops/s (every process's
// calls over the round's wall time), cmds/kop and scripts/kop (commands
// Redis ran per 1,000 calls, and script calls among them; see
// BenchmarkMassMiss), cpu-ms and redis-cpu-ms; and memolock's ops/s over
// each other library's.
func BenchmarkHotKeyProcesses(b *testing.B) {
	total := *hotGoroutines
	if total < 1 || *hotProcs < 1 || *hotDuration <= 0 {
		b.Fatalf("-hotkey.goroutines and -hotkey.procs must be at least 1, and -hotkey.duration positive")
	}
	for _, procs := range []int{1, *hotProcs} {
		per := max(1, total/procs)
		b.Run(fmt.Sprintf("processes=%d", procs), func(b *testing.B) {
			addr := needRedis(b)
			rdb := newRedis(b, addr)
			ls := libs(b)
			children := map[string][]*child{}
			for _, lib := range ls {
				if err := rdb.Set(b.Context(), redisKey(lib, "hot"), value(hotValue), 0).Err(); err != nil {
					b.Fatal(err)
				}
				children[lib] = startChildren(b, lib, addr, procs, 1)
				round(b, rdb, children[lib], fmt.Sprintf("hot warm-hot%d hot %d 50ms", procs, per))
			}
			ops, cmds, scripts, cpu, rcpu, rwait, heap, objs := series{}, series{}, series{}, series{}, series{}, series{}, series{}, series{}
			last := map[string]cmdCount{}
			for i := 0; b.Loop(); i++ {
				for k := range ls {
					lib := ls[(i+k)%len(ls)]
					label := fmt.Sprintf("hotkey-processes=%d-r%d", procs, i)
					r := round(b, rdb, children[lib], fmt.Sprintf("hot %s hot %d %s", label, per, *hotDuration))
					var n, allocs, bytes int64
					for _, c := range r.reports {
						allocs += c.allocs
						bytes += c.bytes
						if c.errs > 0 || c.comps > 0 {
							b.Fatalf("%s: %d calls failed, %d computed", lib, c.errs, c.comps)
						}
						n += c.ops
					}
					ops.add(lib, float64(n)/r.wall.Seconds())
					cmds.add(lib, 1000*float64(r.cmds.total())/float64(n))
					scripts.add(lib, 1000*float64(r.cmds.scripts())/float64(n))
					cpu.add(lib, ms(r.clientCPU()))
					rcpu.add(lib, ms(r.redisCPU))
					rwait.add(lib, ms(r.redisWait))
					heap.add(lib, float64(bytes)/float64(n))
					objs.add(lib, float64(allocs)/float64(n))
					last[lib] = r.cmds
				}
			}
			for _, lib := range ls {
				b.Logf("%-22s %s k ops/s, %s cmds/kop, CPU %s ms, Redis CPU %s ms (waited for a core %s ms), heap %s B in %s objects/call; last round: %v", lib,
					spread(scale(ops[lib], 1e-3), "%.0f"), spread(cmds[lib], "%.1f"),
					spread(cpu[lib], "%.0f"), spread(rcpu[lib], "%.0f"), spread(rwait[lib], "%.0f"),
					spread(heap[lib], "%.0f"), spread(objs[lib], "%.2f"), last[lib])
				b.ReportMetric(median(ops[lib]), lib+"-ops/s")
				b.ReportMetric(median(cmds[lib]), lib+"-cmds/kop")
				b.ReportMetric(median(scripts[lib]), lib+"-scripts/kop")
				b.ReportMetric(median(cpu[lib]), lib+"-cpu-ms")
				b.ReportMetric(median(rcpu[lib]), lib+"-redis-cpu-ms")
			}
			reportRatios(b, ls, ops, "ops")
		})
	}
}

// reportRatios reports memolock's median over each other library's, as
// "memolock/<lib>-<what>".
func reportRatios(b *testing.B, ls []string, by series, what string) {
	m, ok := by[libMemolock]
	if !ok {
		return
	}
	mm := median(m)
	for _, lib := range ls {
		if lib == libMemolock {
			continue
		}
		if o := median(by[lib]); o > 0 {
			b.ReportMetric(mm/o, "memolock/"+strings.TrimPrefix(lib, "go-redis-cache-")+"-"+what)
		}
	}
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func scale(xs []float64, f float64) []float64 {
	out := make([]float64, len(xs))
	for i, x := range xs {
		out[i] = x * f
	}
	return out
}
