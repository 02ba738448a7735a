package memolock

import (
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
