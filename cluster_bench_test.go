package memolock

import (
	"context"
	"fmt"
	"math/rand/v2"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/memolock/memolock/internal/redistest"
	"github.com/memolock/memolock/internal/wire"
)

// benchTarget is one single redis-server or one 3-master cluster, on this
// machine, with clients made the same way on both.
type benchTarget struct {
	name  string
	nodes []*redistest.Server
}

func (bt benchTarget) client(b *testing.B, tag string) *Client {
	return bt.clientWith(b, tag, &Options{LockTTL: time.Minute})
}

func (bt benchTarget) clientWith(b *testing.B, tag string, opts *Options) *Client {
	var rdb redis.UniversalClient
	if len(bt.nodes) == 1 {
		rdb = redis.NewClient(&redis.Options{Addr: bt.nodes[0].Addr})
	} else {
		rdb = redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{bt.nodes[0].Addr}})
	}
	c, err := New(rdb, tag, opts)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = c.Close(); _ = rdb.Close() })
	return c
}

func benchTargets(b *testing.B) []benchTarget {
	return []benchTarget{
		{"node", []*redistest.Server{redistest.Start(b)}},
		{"cluster", redistest.StartCluster(b, 3)},
	}
}

// BenchmarkCluster compares one redis-server with a cluster of 3 masters,
// all on this machine: hits (64 goroutines over 1,024 stored ids) and
// misses (every op a new id: lookup, fetch, store).
func BenchmarkCluster(b *testing.B) {
	for _, bt := range benchTargets(b) {
		b.Run("hits/"+bt.name, func(b *testing.B) {
			c := bt.client(b, "bh")
			for i := range 1024 {
				if err := c.Set(bg(), strconv.Itoa(i), []byte("value"), 0); err != nil {
					b.Fatal(err)
				}
			}
			runParallel(b, func(pb *testing.PB) {
				for pb.Next() {
					if _, err := c.Get(bg(), strconv.Itoa(rand.IntN(1024)), failFetch); err != nil {
						b.Error(err)
					}
				}
			})
		})
		b.Run("misses/"+bt.name, func(b *testing.B) {
			c := bt.client(b, "bm")
			fetch := func(context.Context, *Lease) ([]byte, time.Duration, error) {
				return []byte("value"), time.Minute, nil
			}
			var n atomic.Int64
			run := wire.NewToken()[:8] // -count runs this again on the same servers
			runParallel(b, func(pb *testing.PB) {
				for pb.Next() {
					if _, err := c.Get(bg(), run+strconv.FormatInt(n.Add(1), 10), fetch); err != nil {
						b.Error(err)
					}
				}
			})
		})
	}
}

// BenchmarkClusterWakeup is BenchmarkWakeup on one node and on the
// cluster: 1,000 waiters over 4 clients, timed from the value's publish.
func BenchmarkClusterWakeup(b *testing.B) {
	for _, bt := range benchTargets(b) {
		b.Run(bt.name, func(b *testing.B) {
			var cs []*Client
			for range 4 {
				cs = append(cs, bt.client(b, "bw"))
			}
			var all []time.Duration
			run := wire.NewToken()[:8] // -count runs this again on the same servers
			for i := 0; b.Loop(); i++ {
				id := fmt.Sprint("w", run, i)
				key := cs[0].keys.Value(mustWire(b, cs[0], id))
				lock := cs[0].keys.Lock(mustWire(b, cs[0], id))
				ch := cs[0].keys.Notif(mustWire(b, cs[0], id))
				owner := bt.nodes[0]
				if len(bt.nodes) > 1 {
					owner, _ = nodeOf(b, bt.nodes, key)
				}
				owner.Do(b, "SET", lock, "publisher", "PX", 60000)
				all = append(all, wakeups(b,
					func(w int) {
						if _, err := cs[w%4].Get(bg(), id, failFetch); err != nil {
							b.Error(err)
						}
					},
					func() bool {
						cmd, count := "NUMSUB", int64(4)
						if len(bt.nodes) > 1 {
							cmd = "SHARDNUMSUB"
						}
						m, _ := owner.Do(b, "PUBSUB", cmd, ch).([]any)
						if len(m) != 2 || m[1] != count {
							return false
						}
						time.Sleep(10 * time.Millisecond) // marker PONGs, re-reads, the last joiners
						owner.Do(b, "SET", key, "v", "PX", 60000)
						return true
					},
					func() {
						publish := "PUBLISH"
						if len(bt.nodes) > 1 {
							publish = "SPUBLISH"
						}
						owner.Do(b, publish, ch, "v")
					})...)
			}
			reportPercentiles(b, all)
		})
	}
}

// BenchmarkClusterBroadcast measures the cluster-bus cost of publishing
// values, on a cluster of 3 masters: memolock's stampede over 100 ids from
// 2 clients, which publishes with SPUBLISH (the message stays on the slot's
// shard), against the same 100 values published with PUBLISH, as memolock
// did before sharded pub/sub (each message goes to every node).
func BenchmarkClusterBroadcast(b *testing.B) {
	nodes := redistest.StartCluster(b, 3)
	b.Run("SPUBLISH", func(b *testing.B) {
		bt := benchTarget{"cluster", nodes}
		cs := []*Client{bt.client(b, "bb"), bt.client(b, "bb")}
		before := busMessages(b, nodes)
		run := wire.NewToken()[:8]
		for i := 0; b.Loop(); i++ {
			done := make(chan error, 200)
			for _, c := range cs {
				for id := range 100 {
					go func() {
						_, err := c.Get(bg(), fmt.Sprint(run, i, "-", id), func(context.Context, *Lease) ([]byte, time.Duration, error) {
							time.Sleep(20 * time.Millisecond) // so that the other client waits
							return []byte("value"), time.Minute, nil
						})
						done <- err
					}()
				}
			}
			for range 200 {
				if err := <-done; err != nil {
					b.Error(err)
				}
			}
		}
		b.ReportMetric(float64(busMessages(b, nodes)-before)/float64(b.N), "bus-msgs/op")
		var wakeups int64
		for _, c := range cs {
			wakeups += c.Stats().Wakeups
		}
		b.ReportMetric(float64(wakeups)/float64(b.N), "wakeups/op")
	})
	b.Run("PUBLISH", func(b *testing.B) {
		rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{nodes[0].Addr}})
		defer rdb.Close()
		before := busMessages(b, nodes)
		for i := 0; b.Loop(); i++ {
			for id := range 100 {
				if err := rdb.Publish(bg(), fmt.Sprintf("bb/notif:{%d-%d}", i, id), "value").Err(); err != nil {
					b.Fatal(err)
				}
			}
		}
		b.ReportMetric(float64(busMessages(b, nodes)-before)/float64(b.N), "bus-msgs/op")
	})
}

// busMessages sums the pub/sub messages the nodes received over the
// cluster bus (CLUSTER INFO).
func busMessages(b *testing.B, nodes []*redistest.Server) int64 {
	var n int64
	for _, node := range nodes {
		info, _ := node.Do(b, "CLUSTER", "INFO").(string)
		for _, line := range strings.Split(info, "\r\n") {
			for _, k := range []string{"cluster_stats_messages_publish_received:", "cluster_stats_messages_publishshard_received:"} {
				if v, ok := strings.CutPrefix(line, k); ok {
					x, _ := strconv.ParseInt(v, 10, 64)
					n += x
				}
			}
		}
	}
	return n
}

func mustWire(b *testing.B, c *Client, id string) string {
	key, err := c.wireID(id)
	if err != nil {
		b.Fatal(err)
	}
	return key
}

// BenchmarkMassExpiry parks 10 goroutines on each of 10,000 ids in one
// client (the ids' locks held by an outside holder), then stores and
// publishes every value in one pipeline, on one node and on the cluster.
// It reports the pub/sub commands the client sent per id (SUBSCRIBE,
// marker PING, UNSUBSCRIBE, sharded or not), how long after the publishes
// the last caller had its value, and what a parked waiter costs in memory
// (heap and stacks, its own goroutine included), beside a bare goroutine
// parked on a channel, measured just before the callers. Each op is one
// whole run.
//
// The two memory figures are taken in the same state of the runtime:
//   - Both start on 2 KB stacks (see startOnSmallStacks). Go starts a
//     goroutine with the average stack its last collection scanned
//     (GODEBUG adaptivestackstart), and the few goroutines this process
//     has between runs are deep ones: bare goroutines started then took
//     4.2 KB each, where they took 2.7 KB in a fresh process.
//   - Both reuse dead goroutines from the runtime's free list, whose
//     descriptors (about 450 B each) are then not counted. Before, the
//     callers reused the bare goroutines' and the bare ones did not. The
//     goroutines memolock starts beyond its callers (a flight's) are
//     charged a descriptor each, measured as a fresh goroutine's cost
//     beyond a reused one's (descriptor-B; see goroutineDescriptor).
//
// The first run in a process costs more per caller than later ones (maps
// and pools grow once), so the figure depends a little on -benchtime.
func BenchmarkMassExpiry(b *testing.B) {
	const ids, perID = 10_000, 10
	for _, bt := range benchTargets(b) {
		b.Run(bt.name, func(b *testing.B) {
			c := bt.client(b, "mx")
			var rdb redis.UniversalClient
			if len(bt.nodes) == 1 {
				rdb = redis.NewClient(&redis.Options{Addr: bt.nodes[0].Addr})
			} else {
				rdb = redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{bt.nodes[0].Addr}})
			}
			b.Cleanup(func() { _ = rdb.Close() })
			var perKey, wake, perWaiter, bare float64
			// Dead goroutines stay on the runtime's free list, and a new
			// one reuses its descriptor: started here once, as many as any
			// run below has at once (callers, a goroutine per flight, the
			// ballast), they make the bare goroutines and the callers alike
			// reuse them. What memolock's own goroutines would have cost is
			// added below, a descriptor each: the difference between a
			// goroutine started here and a bare one started later.
			release := startOnSmallStacks()
			fresh := bareWaiter(ids*(perID+1) + 2*startBallast)
			release()
			run := wire.NewToken()[:8]
			for i := 0; b.Loop(); i++ {
				b.StopTimer()
				keys := make([]string, ids)
				pipe := rdb.Pipeline()
				for k := range keys {
					keys[k] = fmt.Sprint(run, "-", i, "-", k)
					pipe.Set(bg(), c.keys.Lock(mustWire(b, c, keys[k])), "outside", time.Minute)
				}
				if _, err := pipe.Exec(bg()); err != nil {
					b.Fatal(err)
				}
				before := c.Stats()
				release := startOnSmallStacks()
				bareNow := bareWaiter(ids * perID)
				bare += bareNow
				if i == 0 && goroutineDescriptor == 0 {
					goroutineDescriptor = fresh - bareNow
					if goroutineDescriptor < minDescriptor {
						// Not fresh: the free list held enough already
						// (another benchmark ran first in this process).
						goroutineDescriptor = minDescriptor
					}
				}
				g0 := runtime.NumGoroutine()
				mem0 := parkedMemory()
				var done atomic.Int64
				var woken sync.WaitGroup
				for _, id := range keys {
					for range perID {
						woken.Add(1)
						go func() {
							defer woken.Done()
							if _, err := c.Get(bg(), id, failFetch); err != nil {
								b.Error(err)
							}
							done.Add(1)
						}()
					}
				}
				// Parked: every flight waits, its subscription live (it
				// looked again), and stays quiet.
				for {
					s := c.Stats()
					if s.Waits-before.Waits == ids && c.Stats().PubSubCommands() == s.PubSubCommands() {
						time.Sleep(50 * time.Millisecond)
						if c.Stats().PubSubCommands() == s.PubSubCommands() {
							break
						}
					}
					time.Sleep(10 * time.Millisecond)
				}
				// The goroutines memolock started beyond the callers,
				// charged a descriptor each (their own stacks are counted).
				extra := max(0, runtime.NumGoroutine()-g0-ids*perID)
				perWaiter += (float64(parkedMemory()-mem0) + float64(extra)*goroutineDescriptor) / (ids * perID)
				release()
				b.StartTimer()
				t0 := time.Now()
				pipe = rdb.Pipeline()
				for _, id := range keys {
					w := mustWire(b, c, id)
					pipe.Set(bg(), c.keys.Value(w), "v", time.Minute)
				}
				if _, err := pipe.Exec(bg()); err != nil {
					b.Fatal(err)
				}
				pipe = rdb.Pipeline()
				for _, id := range keys {
					ch := c.keys.Notif(mustWire(b, c, id))
					if len(bt.nodes) > 1 {
						pipe.SPublish(bg(), ch, "v")
					} else {
						pipe.Publish(bg(), ch, "v")
					}
				}
				if _, err := pipe.Exec(bg()); err != nil {
					b.Fatal(err)
				}
				woken.Wait()
				wake += time.Since(t0).Seconds()
				b.StopTimer()
				// Let the UNSUBSCRIBEs go out before counting.
				time.Sleep(100 * time.Millisecond)
				perKey += float64(c.Stats().PubSubCommands()-before.PubSubCommands()) / ids
				b.StartTimer()
			}
			b.ReportMetric(perKey/float64(b.N), "pubsub-cmds/id")
			b.ReportMetric(wake/float64(b.N)*1000, "wake-ms")
			b.ReportMetric(perWaiter/float64(b.N), "B/waiter")
			b.ReportMetric(bare/float64(b.N), "bare-B/waiter")
			b.ReportMetric(goroutineDescriptor, "descriptor-B")
		})
	}
}

// parkedMemory is the memory the process holds for goroutines and the heap,
// after a collection.
func parkedMemory() int64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return int64(ms.HeapInuse + ms.StackInuse)
}

// bareWaiter is what n bare goroutines parked on a channel cost each: the
// floor under a waiting caller's own goroutine. BenchmarkMassExpiry
// measures it just before its callers, in the same state.
func bareWaiter(n int) float64 {
	m0 := parkedMemory()
	release := parkGoroutines(n)
	perGoroutine := float64(parkedMemory()-m0) / float64(n)
	release()
	return perGoroutine
}

// parkGoroutines starts n goroutines that park on a channel, and returns
// once all have started; release ends them and waits for them to exit.
func parkGoroutines(n int) (release func()) {
	stop := make(chan struct{})
	var started, exited sync.WaitGroup
	started.Add(n)
	exited.Add(n)
	for range n {
		go func() {
			defer exited.Done()
			started.Done()
			<-stop
		}()
	}
	started.Wait()
	return func() {
		close(stop)
		exited.Wait()
	}
}

// goroutineDescriptor is what a new goroutine costs beyond a reused one,
// measured by BenchmarkMassExpiry's first run in the process; at least
// minDescriptor, the runtime's g in Go 1.26 on 64-bit platforms (its
// size class), which a measurement made after the runtime's free list
// already held enough goroutines would miss.
var goroutineDescriptor float64

const minDescriptor = 448

// startBallast is how many goroutines startOnSmallStacks parks.
const startBallast = 4096

// startOnSmallStacks parks 4,096 shallow goroutines until the returned
// function is called, and collects, so that the runtime starts goroutines
// on 2 KB stacks from then on, until its next collection.
//
// The runtime starts a goroutine with a stack of the average size that its
// last collection scanned, plus a guard, rounded up to a power of two
// (GODEBUG adaptivestackstart, on by default). Between runs this process
// has about a dozen goroutines, most of them deep (the testing harness,
// go-redis's and memolock's readers), and a collection then makes the
// runtime start goroutines on 4 KB stacks: until the next one, which
// may come only after tens of thousands of goroutines have started, bare
// or memolock's callers alike. That is the runtime's choice about any
// goroutine, not what a waiting caller costs, which is what the memory
// figures are about; in a process with many goroutines it follows what
// they are.
func startOnSmallStacks() (release func()) {
	// Twice: the stacks of goroutines that died since the last collection
	// are freed by this one, and stack memory partly used by them would
	// count as in use before a measurement, and be filled during it.
	runtime.GC()
	runtime.GC()
	release = parkGoroutines(startBallast)
	runtime.GC()
	return release
}

// BenchmarkClusterL1Hits is BenchmarkCluster's hits with the L1 on: 64
// goroutines over 1,024 ids, every one in the L1, on one node and on the
// cluster (a tracking subscriber per master).
func BenchmarkClusterL1Hits(b *testing.B) {
	for _, bt := range benchTargets(b) {
		b.Run(bt.name, func(b *testing.B) {
			c := bt.clientWith(b, "bl1", &Options{LockTTL: time.Minute, L1Size: 10_000})
			ids := make([]string, 1024)
			for i := range ids {
				ids[i] = strconv.Itoa(i)
				if err := c.Set(bg(), ids[i], []byte("value"), 0); err != nil {
					b.Fatal(err)
				}
			}
			deadline := time.Now().Add(30 * time.Second)
			for _, id := range ids {
				for {
					r, err := c.GetResult(bg(), id, failFetch)
					if err == nil && r.Served == ServedL1 {
						break
					}
					if time.Now().After(deadline) {
						b.Fatalf("id %s not in the L1 after 30s: %v, %v", id, r.Served, err)
					}
					time.Sleep(time.Millisecond)
				}
			}
			before := c.Stats()
			b.ReportAllocs()
			runParallel(b, func(pb *testing.PB) {
				for pb.Next() {
					if _, err := c.Get(bg(), ids[rand.IntN(len(ids))], failFetch); err != nil {
						b.Error(err)
					}
				}
			})
			b.ReportMetric(float64(c.Stats().L1Hits-before.L1Hits)/float64(b.N), "l1-hits/op")
		})
	}
}

// BenchmarkClusterSickMaster measures calls for ids on the healthy masters
// of a 3-master cluster while the third is dead (SIGKILL) or frozen
// (SIGSTOP), with no replica to take over, so that the fault lasts: 64
// goroutines each time either a memolock Get or a plain GET from the same
// go-redis client, of a random one of 1,024 stored ids on the healthy
// masters, while 16 more goroutines keep asking for ids of the sick master.
// It reports p50 and p99 of both, and their ratios (goal: memolock within
// 2× of GET). Timing starts once the client has found the sick master
// unreachable (for a frozen one, after go-redis's 3 s read timeout).
func BenchmarkClusterSickMaster(b *testing.B) {
	for _, fault := range []string{"dead", "frozen"} {
		b.Run(fault, func(b *testing.B) {
			b.Cleanup(func() { awaitDialRetries(b) }) // runs last, after the client is closed
			nodes := redistest.StartClusterWithReplicas(b, 3, 0, "--cluster-require-full-coverage", "no")
			rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{nodes[0].Addr}})
			c, err := New(rdb, "sick", &Options{LockTTL: time.Minute})
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() {
				_ = c.Close()
				_ = rdb.Close()
			})
			victim := nodes[1]
			var healthy, sick []string
			for i := range 2048 {
				id := strconv.Itoa(i)
				if err := c.Set(bg(), id, []byte("value"), 0); err != nil {
					b.Fatal(err)
				}
				if n, _ := nodeOf(b, nodes, c.keys.Value(mustWire(b, c, id))); n == victim {
					sick = append(sick, id)
				} else if len(healthy) < 1024 {
					healthy = append(healthy, id)
				}
			}
			healthyKeys := make([]string, len(healthy))
			for i, id := range healthy {
				healthyKeys[i] = c.keys.Value(mustWire(b, c, id))
			}
			switch fault {
			case "dead":
				victim.Kill()
			case "frozen":
				pid := serverPID(b, victim)
				if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
					b.Fatal(err)
				}
				b.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGCONT) })
			}
			stop := make(chan struct{})
			var sickLoad sync.WaitGroup
			for range 16 {
				sickLoad.Add(1)
				go func() {
					defer sickLoad.Done()
					for {
						select {
						case <-stop:
							return
						default:
						}
						ctx, cancel := context.WithTimeout(bg(), 5*time.Second)
						_, _ = c.Get(ctx, sick[rand.IntN(len(sick))], failFetch)
						cancel()
						time.Sleep(time.Millisecond) // calls fail at once during the outage: no spinning
					}
				}()
			}
			b.Cleanup(func() {
				close(stop)
				sickLoad.Wait()
			})
			deadline := time.Now().Add(30 * time.Second)
			for c.Stats().Outages == 0 {
				if time.Now().After(deadline) {
					b.Fatal("the sick master was not found unreachable within 30s")
				}
				time.Sleep(10 * time.Millisecond)
			}
			var mu sync.Mutex
			var mine, gets []time.Duration
			var errs atomic.Int64
			runParallel(b, func(pb *testing.PB) {
				var m, g []time.Duration
				for i := 0; pb.Next(); i++ {
					j := rand.IntN(len(healthy))
					t0 := time.Now()
					if i%2 == 0 {
						if _, err := c.Get(bg(), healthy[j], failFetch); err != nil {
							errs.Add(1)
						}
						m = append(m, time.Since(t0))
					} else {
						if err := rdb.Get(bg(), healthyKeys[j]).Err(); err != nil {
							errs.Add(1)
						}
						g = append(g, time.Since(t0))
					}
				}
				mu.Lock()
				mine, gets = append(mine, m...), append(gets, g...)
				mu.Unlock()
			})
			b.StopTimer()
			if n := errs.Load(); n > 0 {
				b.Errorf("%d calls for healthy-master ids failed", n)
			}
			if len(mine) == 0 || len(gets) == 0 {
				return
			}
			pm, pg := percentiles(mine), percentiles(gets)
			b.ReportMetric(float64(pm[0].Microseconds()), "memolock-p50-µs")
			b.ReportMetric(float64(pm[1].Microseconds()), "memolock-p99-µs")
			b.ReportMetric(float64(pg[0].Microseconds()), "GET-p50-µs")
			b.ReportMetric(float64(pg[1].Microseconds()), "GET-p99-µs")
			b.ReportMetric(float64(pm[0])/float64(max(pg[0], 1)), "p50-ratio")
			b.ReportMetric(float64(pm[1])/float64(max(pg[1], 1)), "p99-ratio")
		})
	}
}
