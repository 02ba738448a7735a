package memolock

import (
	"context"
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/memolock/memolock/internal/redistest"
	"github.com/redis/go-redis/v9"
	"golang.org/x/sync/singleflight"
)

// The benchmarks run against a private redis-server on loopback:
//
//	go test -run '^$' -bench . -benchtime 3s

const benchGoroutines = 64

// runParallel runs body on 64 goroutines in all.
func runParallel(b *testing.B, body func(pb *testing.PB)) {
	b.SetParallelism(max(1, benchGoroutines/runtime.GOMAXPROCS(0)))
	b.ResetTimer()
	b.RunParallel(body)
}

// newBenchClient is a Client on a go-redis client without the counting hook,
// so that it compares fairly with the plain go-redis baselines.
func newBenchClient(b *testing.B, addr, tag string) *Client {
	c, err := New(rawClient(b, addr), tag, nil)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = c.Close() })
	return c
}

func storeKeys(b *testing.B, rdb *redis.Client, tag string, n int) []string {
	ids := make([]string, n)
	pipe := rdb.Pipeline()
	for i := range ids {
		ids[i] = fmt.Sprint(i)
		pipe.Set(bg(), tag+":"+ids[i], "value of "+ids[i], 0)
	}
	if _, err := pipe.Exec(bg()); err != nil {
		b.Fatal(err)
	}
	return ids
}

var failFetch FetchFunc = func(context.Context, *Lease) ([]byte, time.Duration, error) {
	return nil, 0, fmt.Errorf("benchmark: unexpected miss")
}

// BenchmarkHit compares the hit path, 64 goroutines each reading a random
// one of 1,024 stored keys, with a plain GET of the same keys.
func BenchmarkHit(b *testing.B) {
	srv := realBackend(b)
	b.Run("go-redis-GET", func(b *testing.B) {
		rdb := rawClient(b, srv.addr)
		ids := storeKeys(b, rdb, "hit", 1024)
		runParallel(b, func(pb *testing.PB) {
			for pb.Next() {
				if err := rdb.Get(bg(), "hit:"+ids[rand.IntN(1024)]).Err(); err != nil {
					b.Error(err)
				}
			}
		})
	})
	b.Run("memolock", func(b *testing.B) {
		c := newBenchClient(b, srv.addr, "hit")
		ids := storeKeys(b, rawClient(b, srv.addr), "hit", 1024)
		before := c.Stats()
		runParallel(b, func(pb *testing.PB) {
			for pb.Next() {
				if _, err := c.Get(bg(), ids[rand.IntN(1024)], failFetch); err != nil {
					b.Error(err)
				}
			}
		})
		// Callers that joined a flight already under way for the same key.
		b.ReportMetric(float64(c.Stats().Coalesced-before.Coalesced)/float64(b.N), "coalesced/op")
	})
	// A caller whose context has a deadline may leave before Redis
	// answers, so its lookup runs on a goroutine of the flight's.
	b.Run("memolock-deadline", func(b *testing.B) {
		c := newBenchClient(b, srv.addr, "hit")
		ids := storeKeys(b, rawClient(b, srv.addr), "hit", 1024)
		ctx, cancel := context.WithTimeout(bg(), time.Hour)
		defer cancel()
		runParallel(b, func(pb *testing.PB) {
			for pb.Next() {
				if _, err := c.Get(ctx, ids[rand.IntN(1024)], failFetch); err != nil {
					b.Error(err)
				}
			}
		})
	})
}

// BenchmarkHotKey compares 64 goroutines reading one key through memolock
// with x/sync/singleflight wrapping GET. Besides the time per call, each
// reports the CPU time its process spent per call (cpu-ns/op) and the calls
// served per GET that reached Redis (calls/GET): the run is bound by the
// two cores, and a library that spends less CPU per call has more callers
// join each GET before its reply comes back.
func BenchmarkHotKey(b *testing.B) {
	srv := realBackend(b)
	b.Run("singleflight-GET", func(b *testing.B) {
		rdb := rawClient(b, srv.addr)
		storeKeys(b, rdb, "hot", 1)
		var g singleflight.Group
		m := startHotKeyMeter(b, srv.real)
		runParallel(b, func(pb *testing.PB) {
			for pb.Next() {
				_, err, _ := g.Do("hot:0", func() (any, error) { return rdb.Get(bg(), "hot:0").Bytes() })
				if err != nil {
					b.Error(err)
				}
			}
		})
		m.report(b)
	})
	b.Run("memolock", func(b *testing.B) {
		c := newBenchClient(b, srv.addr, "hot")
		storeKeys(b, rawClient(b, srv.addr), "hot", 1)
		m := startHotKeyMeter(b, srv.real)
		runParallel(b, func(pb *testing.PB) {
			for pb.Next() {
				if _, err := c.Get(bg(), "0", failFetch); err != nil {
					b.Error(err)
				}
			}
		})
		m.report(b)
	})
}

// hotKeyMeter reads, around a benchmark's loop, the process's CPU time and
// the GETs its Redis served (INFO commandstats, which costs the loop
// nothing).
type hotKeyMeter struct {
	srv  *redistest.Server
	cpu  time.Duration
	gets int64
}

func startHotKeyMeter(b *testing.B, srv *redistest.Server) *hotKeyMeter {
	m := &hotKeyMeter{srv: srv, gets: commandCalls(b, srv, "get")}
	m.cpu, _ = processCPU()
	return m
}

func (m *hotKeyMeter) report(b *testing.B) {
	b.StopTimer()
	if cpu, ok := processCPU(); ok {
		b.ReportMetric(float64(cpu-m.cpu)/float64(b.N), "cpu-ns/op")
	}
	if gets := commandCalls(b, m.srv, "get") - m.gets; gets > 0 {
		b.ReportMetric(float64(b.N)/float64(gets), "calls/GET")
	}
}

// BenchmarkStampede measures the Redis commands one process spends when
// 10,000 goroutines miss the same key at once.
func BenchmarkStampede(b *testing.B) {
	srv := realBackend(b)
	c := newTestClient(b, srv.addr, "stampede", nil)
	const callers = 10000
	var commands int64
	for i := 0; b.Loop(); i++ {
		id := fmt.Sprint(i)
		if i == 0 { // load the scripts, as any warm client has
			_, _ = c.Get(bg(), "warm", func(context.Context, *Lease) ([]byte, time.Duration, error) { return nil, 0, nil })
		}
		before := c.commands.n.Load() + c.Stats().PubSubCommands()
		stampede(b, c, id, callers)
		commands += c.commands.n.Load() + c.Stats().PubSubCommands() - before
	}
	b.ReportMetric(float64(commands)/float64(b.N), "cmds/stampede")
}

// BenchmarkMiss measures round trips per miss: one client, a new key each
// time, a fetch that returns at once.
func BenchmarkMiss(b *testing.B) {
	srv := realBackend(b)
	c := newTestClient(b, srv.addr, "miss", nil)
	fetch := func(context.Context, *Lease) ([]byte, time.Duration, error) { return []byte("v"), time.Minute, nil }
	_, _ = c.Get(bg(), "warm", fetch)
	_, _ = c.Get(bg(), "warm", fetch)
	before := c.commands.n.Load()
	i := 0
	for b.Loop() {
		i++
		if _, err := c.Get(bg(), fmt.Sprint(i), fetch); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(c.commands.n.Load()-before)/float64(b.N), "roundtrips/miss")
}

// BenchmarkWakeup measures the time from PUBLISH to the return of Get for
// 1,000 parked waiters spread over 4 clients, and, for comparison, all in
// one client.
func BenchmarkWakeup(b *testing.B) {
	for _, clients := range []int{4, 1} {
		b.Run(fmt.Sprintf("clients=%d", clients), func(b *testing.B) { benchmarkWakeup(b, clients) })
	}
}

func benchmarkWakeup(b *testing.B, clients int) {
	srv := realBackend(b)
	var cs []*testClient
	for range clients {
		cs = append(cs, newTestClient(b, srv.addr, "wake", &Options{LockTTL: time.Minute}))
	}
	raw := rawClient(b, srv.addr)
	var all []time.Duration
	for i := 0; b.Loop(); i++ {
		id := fmt.Sprint(i)
		ch := "wake/notif:" + id
		raw.Set(bg(), "wake/lock:"+id, "publisher", time.Minute)
		all = append(all, wakeups(b,
			func(w int) {
				if _, err := cs[w%clients].Get(bg(), id, failFetch); err != nil {
					b.Error(err)
				}
			},
			func() bool {
				if raw.PubSubNumSub(bg(), ch).Val()[ch] < int64(clients) {
					return false
				}
				time.Sleep(10 * time.Millisecond) // marker PONGs, re-reads, the last joiners
				raw.Set(bg(), "wake:"+id, "v", time.Minute)
				return true
			},
			func() { raw.Publish(bg(), ch, "v") })...)
	}
	reportPercentiles(b, all)
}

const benchWaiters = 1000

// wakeups parks 1,000 goroutines in wait, polls ready until it reports
// them parked, then returns how long after the start of wake each wait
// returned. Only wake is timed.
func wakeups(b *testing.B, wait func(w int), ready func() bool, wake func()) []time.Duration {
	b.StopTimer()
	var t0 atomic.Int64
	lat := make([]time.Duration, benchWaiters)
	var wg sync.WaitGroup
	for w := range benchWaiters {
		wg.Add(1)
		go func() {
			defer wg.Done()
			wait(w)
			lat[w] = time.Duration(time.Now().UnixNano() - t0.Load())
		}()
	}
	for !ready() {
		time.Sleep(time.Millisecond)
	}
	b.StartTimer()
	t0.Store(time.Now().UnixNano())
	wake()
	wg.Wait()
	return lat
}

func reportPercentiles(b *testing.B, lat []time.Duration) {
	p := percentiles(lat)
	b.ReportMetric(float64(p[0].Microseconds()), "p50-µs")
	b.ReportMetric(float64(p[1].Microseconds()), "p99-µs")
}

// percentiles returns the 50th and 99th percentiles of lat, which it sorts.
func percentiles(lat []time.Duration) [2]time.Duration {
	slices.Sort(lat)
	return [2]time.Duration{lat[len(lat)/2], lat[len(lat)*99/100]}
}

// psubscribeWaiters is the original redis-memolock's waiting design, for
// comparison in the wake-up benchmarks: one PSUBSCRIBE of the whole tag per
// client, go-redis Channel(), and one goroutine that hands each message to
// the channels of its waiters.
type psubscribeWaiters struct {
	ps   *redis.PubSub
	mu   sync.Mutex
	subs map[string][]chan string
	done chan struct{}
}

func newPSubscribeWaiters(rdb *redis.Client, tag string) *psubscribeWaiters {
	p := &psubscribeWaiters{ps: rdb.PSubscribe(bg(), tag+"/notif:*"), subs: map[string][]chan string{}, done: make(chan struct{})}
	if _, err := p.ps.Receive(bg()); err != nil {
		panic(err)
	}
	msgs := p.ps.Channel()
	go func() {
		defer close(p.done)
		for m := range msgs {
			p.mu.Lock()
			for _, ch := range p.subs[m.Channel] {
				ch <- m.Payload
			}
			delete(p.subs, m.Channel)
			p.mu.Unlock()
		}
	}()
	return p
}

func (p *psubscribeWaiters) close() {
	_ = p.ps.Close()
	<-p.done
}

func (p *psubscribeWaiters) wait(channel string) string {
	ch := make(chan string, 1)
	p.mu.Lock()
	p.subs[channel] = append(p.subs[channel], ch)
	p.mu.Unlock()
	return <-ch
}

func (p *psubscribeWaiters) parked(channel string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.subs[channel])
}

// BenchmarkWakeupPSubscribe is BenchmarkWakeup for the original design.
func BenchmarkWakeupPSubscribe(b *testing.B) {
	srv := realBackend(b)
	const clients = 4
	var ps []*psubscribeWaiters
	for range clients {
		p := newPSubscribeWaiters(rawClient(b, srv.addr), "wake")
		b.Cleanup(p.close)
		ps = append(ps, p)
	}
	raw := rawClient(b, srv.addr)
	var all []time.Duration
	for i := 0; b.Loop(); i++ {
		ch := "wake/notif:" + fmt.Sprint(i)
		all = append(all, wakeups(b,
			func(w int) { ps[w%clients].wait(ch) },
			func() bool {
				n := 0
				for _, p := range ps {
					n += p.parked(ch)
				}
				if n < benchWaiters {
					return false
				}
				time.Sleep(10 * time.Millisecond)
				return true
			},
			func() { raw.Publish(bg(), ch, "v") })...)
	}
	reportPercentiles(b, all)
}

// BenchmarkWakeupFloor measures what BenchmarkWakeup cannot go below on
// this machine: waking 1,000 goroutines parked on 4 channels, closed at
// once, with no Redis involved.
func BenchmarkWakeupFloor(b *testing.B) {
	var all []time.Duration
	for b.Loop() {
		var chs [4]chan struct{}
		for i := range chs {
			chs[i] = make(chan struct{})
		}
		all = append(all, wakeups(b,
			func(w int) { <-chs[w%len(chs)] },
			func() bool { time.Sleep(10 * time.Millisecond); return true },
			func() {
				for _, ch := range chs {
					close(ch)
				}
			})...)
	}
	reportPercentiles(b, all)
}
