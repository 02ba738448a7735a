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

// On a cluster the client places every id itself: the keys and channels
// of "id7" are cl:{id7}, cl/lock:{id7}, ..., all in one slot, with or
// without HashIDs.
func TestGet_ClusterPlacesIDs(t *testing.T) {
	nodes := redistest.StartCluster(t, 3)
	raw := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{nodes[0].Addr}})
	t.Cleanup(func() { _ = raw.Close() })
	for _, hashed := range []bool{false, true} {
		t.Run(fmt.Sprint("HashIDs=", hashed), func(t *testing.T) {
			tag := fmt.Sprint("cl", hashed)
			var calls atomic.Int64
			var wg sync.WaitGroup
			var cs []*Client
			for range 3 {
				rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{nodes[0].Addr}})
				c, err := New(rdb, tag, &Options{LockTTL: 30 * time.Second, HashIDs: hashed})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = c.Close(); _ = rdb.Close() })
				cs = append(cs, c)
				for g := range 10 {
					wg.Add(1)
					go func() {
						defer wg.Done()
						for i := range 100 {
							id := fmt.Sprint("id", (i+g*7)%100)
							ctx, cancel := context.WithTimeout(bg(), 20*time.Second)
							v, err := c.Get(ctx, id, constFetch(&calls, "v of "+id, 20*time.Millisecond))
							cancel()
							if err != nil || string(v) != "v of "+id {
								t.Errorf("Get(%s) = %q, %v", id, v, err)
								return
							}
						}
					}()
				}
			}
			wg.Wait()
			if n := calls.Load(); n != 100 {
				t.Errorf("100 ids fetched %d times", n)
			}
			want := tag + ":{id7}"
			if hashed {
				want = tag + ":{" + HashID("id7") + "}"
			}
			if v := raw.Get(bg(), want).Val(); v != "v of id7" {
				t.Errorf("%s holds %q", want, v)
			}
			// The empty id cannot be placed, unless hashed.
			_, err := cs[0].Get(bg(), "", constFetch(&calls, "empty", 0))
			if hashed != (err == nil) {
				t.Errorf("empty id, HashIDs %v: %v", hashed, err)
			}
			if !hashed && !errors.Is(err, ErrInvalid) {
				t.Errorf("empty id: %v, want ErrInvalid", err)
			}
		})
	}
	c, err := New(raw, "cl", nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	// An id with braces of its own is wrapped too: no two ids share keys.
	var calls atomic.Int64
	if _, err := c.Get(bg(), "{user-42}", constFetch(&calls, "v", 0)); err != nil {
		t.Fatal(err)
	}
	if v := raw.Get(bg(), "cl:{{user-42}}").Val(); v != "v" {
		t.Errorf("cl:{{user-42}} holds %q", v)
	}
	if p, err := c.Peek(bg(), "{user-42}"); err != nil || string(p.Value) != "v" {
		t.Errorf("Peek: %+v, %v", p, err)
	}
	if _, err := New(raw, "a{b}", nil); !errors.Is(err, ErrInvalid) {
		t.Errorf("a tag with braces on a cluster: %v", err)
	}
	// An error reply is still an answer, which FailOpen does not hide.
	failOpen, err := New(raw, "cl", &Options{FailOpen: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = failOpen.Close() })
	raw.LPush(bg(), "cl:{wrong}", "x")
	if _, err := failOpen.Get(bg(), "wrong", constFetch(&calls, "v", 0)); !errors.Is(err, ErrRedis) || !strings.Contains(err.Error(), "WRONGTYPE") {
		t.Errorf("WRONGTYPE on a cluster: %v, want ErrRedis naming it", err)
	}
	if calls.Load() != 1 {
		t.Errorf("fetch ran on an error reply")
	}
}
