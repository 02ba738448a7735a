package memolock

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Under load, lookups of many keys travel together in pipelines; every
// caller must still get its own key's answer, and each missing key must
// still be computed once.
func TestBatch_ConcurrentLookupsGetTheirOwnAnswers(t *testing.T) {
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			c := newTestClient(t, b.addr, "batch", nil)
			raw := rawClient(t, b.addr)
			const keys = 200
			for i := 0; i < keys; i += 2 {
				raw.Set(bg(), fmt.Sprintf("batch:%d", i), fmt.Sprintf("stored %d", i), time.Minute)
			}
			var fetches [keys]atomic.Int64
			var wg sync.WaitGroup
			for g := range 64 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for j := range keys {
						i := (g*7 + j) % keys
						v, err := c.Get(bg(), fmt.Sprint(i), func(context.Context, *Lease) ([]byte, time.Duration, error) {
							fetches[i].Add(1)
							return []byte(fmt.Sprintf("computed %d", i)), time.Minute, nil
						})
						want := fmt.Sprintf("computed %d", i)
						if i%2 == 0 {
							want = fmt.Sprintf("stored %d", i)
						}
						if err != nil || string(v) != want {
							t.Errorf("key %d: Get = %q, %v; want %q", i, v, err, want)
							return
						}
					}
				}()
			}
			wg.Wait()
			for i := range keys {
				want := int64(0)
				if i%2 == 1 {
					want = 1
				}
				if n := fetches[i].Load(); n != want {
					t.Errorf("key %d fetched %d times, want %d", i, n, want)
				}
			}
			if c.Stats().Batched == 0 {
				t.Error("64 concurrent goroutines never shared a pipeline")
			}
		})
	}
}

func TestBatch_RedisDownFailsEveryCaller(t *testing.T) {
	addr := refusedAddr(t)
	c := newTestClient(t, addr, "down", nil)
	var wg sync.WaitGroup
	for i := range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := c.Get(bg(), fmt.Sprint(i), constFetch(new(atomic.Int64), "v", 0))
			if !errors.Is(err, ErrRedis) {
				t.Errorf("Get = %v, want ErrRedis", err)
			}
		}()
	}
	wg.Wait()
}
