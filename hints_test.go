package memolock

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// commandNames records the names of the commands a go-redis client sends.
type commandNames struct {
	mu    sync.Mutex
	names []string
}

func (h *commandNames) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *commandNames) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.add(cmd)
		return next(ctx, cmd)
	}
}
func (h *commandNames) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, c := range cmds {
			h.add(c)
		}
		return next(ctx, cmds)
	}
}
func (h *commandNames) add(c redis.Cmder) {
	h.mu.Lock()
	h.names = append(h.names, strings.ToLower(c.Name()))
	h.mu.Unlock()
}

// since returns the commands sent since the last call (and forgets them),
// leaving out pub/sub's.
func (h *commandNames) since() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []string
	for _, n := range h.names {
		switch n {
		case "subscribe", "unsubscribe", "ping", "ssubscribe", "sunsubscribe", "client", "hello":
		default:
			out = append(out, n)
		}
	}
	h.names = nil
	return out
}

func namedClient(t *testing.T, addr string, opts *Options) (*Client, *commandNames) {
	t.Helper()
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	names := &commandNames{}
	rdb.AddHook(names)
	c, err := New(rdb, "hint", opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = c.Close()
		_ = rdb.Close()
	})
	return c, names
}

// TestGet_AnIDFoundLatelyIsReadWithAPlainGET: once a lookup found an id's
// value, the next ones read it with GET, which Redis runs faster than the
// acquire script; a GET that finds nothing is followed by the script, which
// takes the lock as it would have at once, and the hint goes.
func TestGet_AnIDFoundLatelyIsReadWithAPlainGET(t *testing.T) {
	for _, be := range backends(t) {
		t.Run(be.name, func(t *testing.T) {
			c, names := namedClient(t, be.addr, nil)
			raw := rawClient(t, be.addr)
			var calls atomic.Int64
			fetch := constFetch(&calls, "v1", 0)
			get := func() string {
				t.Helper()
				v, err := c.Get(bg(), "a", fetch)
				if err != nil {
					t.Fatal(err)
				}
				return string(v)
			}
			get() // a miss: computed
			if got := names.since(); !slices.Contains(got, "evalsha") && !slices.Contains(got, "eval") {
				t.Fatalf("the first lookup sent %v; want the acquire script", got)
			}
			get() // a hit, found by the script
			if got := names.since(); slices.Contains(got, "get") {
				t.Fatalf("a hit with no hint sent %v", got)
			}
			if v := get(); v != "v1" {
				t.Fatalf("got %q", v)
			}
			if got := names.since(); !slices.Equal(got, []string{"get"}) {
				t.Fatalf("a hit after a hit sent %v; want one GET", got)
			}
			// The value goes behind the client's back: the GET finds
			// nothing, the script takes the lock, the id is computed.
			if err := raw.Del(bg(), "hint:a").Err(); err != nil {
				t.Fatal(err)
			}
			if v := get(); v != "v1" || calls.Load() != 2 {
				t.Fatalf("after the value went: %q, %d computations; want v1, 2", v, calls.Load())
			}
			got := names.since()
			if len(got) < 2 || got[0] != "get" || (got[1] != "evalsha" && got[1] != "eval") {
				t.Fatalf("a GET that missed was followed by %v; want the acquire script", got)
			}
			get()
			if got := names.since(); slices.Contains(got, "get") {
				t.Fatalf("the hint outlived a GET that missed: %v", got)
			}
			// Delete drops the hint: no GET that would find nothing.
			get()
			names.since()
			if _, err := c.Delete(bg(), "a"); err != nil {
				t.Fatal(err)
			}
			names.since()
			get()
			if got := names.since(); slices.Contains(got, "get") {
				t.Fatalf("the hint outlived Delete: %v", got)
			}
		})
	}
}

// TestGet_LookupsThatNeedMoreThanTheValueNeverReadFirst: an L1 needs the
// value's PTTL, RefreshAhead may take the lock on a hit, StaleTTL reads
// the lock's flag; their lookups always run the script.
func TestGet_LookupsThatNeedMoreThanTheValueNeverReadFirst(t *testing.T) {
	be := realBackend(t)
	for name, opts := range map[string]*Options{
		"RefreshAhead": {RefreshAhead: 100 * time.Millisecond},
		"StaleTTL":     {StaleTTL: time.Minute},
	} {
		t.Run(name, func(t *testing.T) {
			c, names := namedClient(t, be.addr, opts)
			var calls atomic.Int64
			for range 4 {
				if _, err := c.Get(bg(), name, constFetch(&calls, "v", 0)); err != nil {
					t.Fatal(err)
				}
			}
			if got := names.since(); slices.Contains(got, "get") {
				t.Fatalf("sent %v; want no GET", got)
			}
		})
	}
}

// TestGet_ReadsFirstAreNotCountedAsBatchedLookups: Stats.Batched counts
// lookups (acquire scripts) sent in a pipeline with others; GETs read first
// travel in the same pipelines but are not lookups.
func TestGet_ReadsFirstAreNotCountedAsBatchedLookups(t *testing.T) {
	be := realBackend(t)
	c, names := namedClient(t, be.addr, nil)
	var calls atomic.Int64
	for i := range 64 {
		for range 2 { // computed, then found by the script: hinted
			if _, err := c.Get(bg(), fmt.Sprint("hot", i), constFetch(&calls, "v", 0)); err != nil {
				t.Fatal(err)
			}
		}
	}
	names.since()
	batched := c.Stats().Batched
	var wg sync.WaitGroup
	for i := range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 200 {
				if _, err := c.Get(bg(), fmt.Sprint("hot", i), constFetch(&calls, "v", 0)); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	scripts, gets := 0, 0
	for _, n := range names.since() {
		switch n {
		case "evalsha", "eval":
			scripts++
		case "get":
			gets++
		}
	}
	if gets == 0 {
		t.Fatal("no GET was read first: the test proves nothing")
	}
	if b := c.Stats().Batched - batched; b > int64(scripts) {
		t.Errorf("Stats.Batched grew by %d, but only %d acquire scripts were sent (and %d GETs)", b, scripts, gets)
	}
}
