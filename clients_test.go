package memolock

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/memolock/memolock/internal/redistest"
)

func TestGet_WorksThroughSentinelFailoverClient(t *testing.T) {
	master := redistest.Start(t)
	sentinel := redistest.StartSentinel(t, master)
	var calls atomic.Int64
	var wg sync.WaitGroup
	for range 3 {
		rdb := redis.NewFailoverClient(&redis.FailoverOptions{MasterName: "mymaster", SentinelAddrs: []string{sentinel.Addr}})
		c, err := New(rdb, "sentinel", &Options{LockTTL: 30 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close(); _ = rdb.Close() })
		for range 20 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				v, err := c.Get(bg(), "k", constFetch(&calls, "through sentinel", 100*time.Millisecond))
				if err != nil || string(v) != "through sentinel" {
					t.Errorf("Get = %q, %v", v, err)
				}
			}()
		}
	}
	wg.Wait()
	if calls.Load() != 1 {
		t.Errorf("fetch ran %d times", calls.Load())
	}
	if v := master.Do(t, "GET", "sentinel:k"); v != "through sentinel" {
		t.Errorf("master holds %v", v)
	}
}

// RESP2 and RESP3 answer PING in subscribed mode differently (an array
// against a plain string); markers must work with both.
func TestGet_WorksOverRESP2AndRESP3(t *testing.T) {
	for _, b := range backends(t) {
		for _, proto := range []int{2, 3} {
			t.Run(fmt.Sprintf("%s/RESP%d", b.name, proto), func(t *testing.T) {
				raw := rawClient(t, b.addr)
				raw.Del(bg(), "proto:k")
				raw.Set(bg(), "proto/lock:k", "someone", time.Minute)
				var cs []*testClient
				for range 3 {
					rdb := redis.NewClient(&redis.Options{Addr: b.addr, Protocol: proto})
					c, err := New(rdb, "proto", &Options{LockTTL: time.Minute})
					if err != nil {
						t.Fatal(err)
					}
					t.Cleanup(func() { _ = c.Close(); _ = rdb.Close() })
					cs = append(cs, &testClient{Client: c, rdb: rdb})
				}
				var wg sync.WaitGroup
				for _, c := range cs {
					for range 10 {
						wg.Add(1)
						go func() {
							defer wg.Done()
							ctx, cancel := context.WithTimeout(bg(), 10*time.Second)
							defer cancel()
							v, err := c.Get(ctx, "k", constFetch(new(atomic.Int64), "fetched", 0))
							if err != nil || string(v) != "published" {
								t.Errorf("Get = %q, %v", v, err)
							}
						}()
					}
				}
				waitersLive(t, "proto/notif:k", cs...)
				raw.Set(bg(), "proto:k", "published", time.Minute)
				raw.Del(bg(), "proto/lock:k")
				raw.Publish(bg(), "proto/notif:k", "published")
				wg.Wait()
			})
		}
	}
}

// Redis Cluster is a later issue, but the key scheme already allows it: an
// id in {braces} puts the value and the lock of that id in one slot.
func TestGet_WorksOnClusterWithHashTaggedIDs(t *testing.T) {
	nodes := redistest.StartCluster(t, 3)
	var calls atomic.Int64
	var wg sync.WaitGroup
	var cs []*Client
	for range 3 {
		rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{nodes[0].Addr}})
		c, err := New(rdb, "cl", &Options{LockTTL: 30 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close(); _ = rdb.Close() })
		cs = append(cs, c)
		for range 10 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range 10 {
					ctx, cancel := context.WithTimeout(bg(), 10*time.Second)
					v, err := c.Get(ctx, fmt.Sprintf("{id%d}", i), constFetch(&calls, "v", 20*time.Millisecond))
					cancel()
					if err != nil || string(v) != "v" {
						t.Errorf("Get = %q, %v", v, err)
						return
					}
				}
			}()
		}
	}
	wg.Wait()
	if calls.Load() != 10 {
		t.Errorf("10 keys fetched %d times", calls.Load())
	}
	// Without a hash tag the script's two keys are in different slots:
	// an error reply, which FailOpen does not hide.
	rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{nodes[0].Addr}})
	failOpen, err := New(rdb, "cl", &Options{FailOpen: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = failOpen.Close(); _ = rdb.Close() })
	for _, c := range []*Client{cs[0], failOpen} {
		_, err := c.Get(bg(), "plain", constFetch(&calls, "v", 0))
		if !errors.Is(err, ErrRedis) || !strings.Contains(err.Error(), "CROSSSLOT") {
			t.Errorf("un-tagged id on a cluster: %v, want ErrRedis naming CROSSSLOT", err)
		}
	}
	if calls.Load() != 10 {
		t.Errorf("fetch ran on a CROSSSLOT error")
	}
}
