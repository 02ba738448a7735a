package memolock

import (
	"context"
	"fmt"
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
				var cs []*Client
				for range 3 {
					rdb := redis.NewClient(&redis.Options{Addr: b.addr, Protocol: proto})
					c, err := New(rdb, "proto", &Options{LockTTL: time.Minute})
					if err != nil {
						t.Fatal(err)
					}
					t.Cleanup(func() { _ = c.Close(); _ = rdb.Close() })
					cs = append(cs, c)
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
				eventually(t, 5*time.Second, "3 subscribers", func() bool {
					return raw.PubSubNumSub(bg(), "proto/notif:k").Val()["proto/notif:k"] == 3
				})
				// Let the markers return, then publish: only live
				// subscriptions hear it, the rest must re-read.
				time.Sleep(20 * time.Millisecond)
				raw.Set(bg(), "proto:k", "published", time.Minute)
				raw.Del(bg(), "proto/lock:k")
				raw.Publish(bg(), "proto/notif:k", "published")
				wg.Wait()
			})
		}
	}
}
