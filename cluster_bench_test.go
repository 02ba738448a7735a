package memolock

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/memolock/memolock/internal/redistest"
)

// benchTarget is one single redis-server or one 3-master cluster, on this
// machine, with clients made the same way on both.
type benchTarget struct {
	name  string
	nodes []*redistest.Server
}

func (bt benchTarget) client(b *testing.B, tag string) *Client {
	var rdb redis.UniversalClient
	if len(bt.nodes) == 1 {
		rdb = redis.NewClient(&redis.Options{Addr: bt.nodes[0].Addr})
	} else {
		rdb = redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{bt.nodes[0].Addr}})
	}
	c, err := New(rdb, tag, &Options{LockTTL: time.Minute})
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
			run := newToken()[:8] // -count runs this again on the same servers
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
			run := newToken()[:8] // -count runs this again on the same servers
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

// BenchmarkClusterBroadcast runs a stampede over 100 ids, from 2 clients,
// on a cluster of 3 masters, with sharded pub/sub (SPUBLISH) and, for
// comparison, with what memolock did before it (PUBLISH, SUBSCRIBE): it
// reports the pub/sub messages the masters received over the cluster bus,
// which is the broadcast cost of PUBLISH (each one goes to every node).
func BenchmarkClusterBroadcast(b *testing.B) {
	nodes := redistest.StartCluster(b, 3)
	for _, sharded := range []bool{true, false} {
		name := "SPUBLISH"
		if !sharded {
			name = "PUBLISH"
		}
		b.Run(name, func(b *testing.B) {
			bt := benchTarget{"cluster", nodes}
			var cs []*Client
			for range 2 {
				c := bt.client(b, "bb-"+name)
				if !sharded {
					c.proto.sc, c.shards, c.sub = plainScripts, nil, newSubscriber(c.rdb, &c.stats)
				}
				cs = append(cs, c)
			}
			before := busMessages(b, nodes)
			run := newToken()[:8]
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
	}
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
// marker PING, UNSUBSCRIBE, sharded or not) and how long after the
// publishes the last caller had its value. Each op is one whole run.
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
			var perKey, wake float64
			run := newToken()[:8]
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
		})
	}
}
