package memolock

// Tests from a hostile review of the engine rewrite (internal/engine,
// internal/pubsub, internal/l1, internal/wire behind the façade). Each one
// fails on the code it was written against, and says what it requires.

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/memolock/memolock/internal/redistest"
)

// A cluster client learns the slots on its first call. Until it has, the
// node that owns a key cannot be known without asking Redis, and a seed
// node that accepts connections but never answers (a hung host) holds that
// question for go-redis's own timeouts. The caller's deadline must hold all
// the same ("returns at ctx's deadline whatever Redis does"), as it did
// before the engine asked for the key's node on the caller's goroutine.
func TestCluster_ControlCallsHoldTheDeadlineBeforeTheSlotsAreKnown(t *testing.T) {
	addr := redistest.Silent(t)
	for _, tc := range []struct {
		name string
		call func(ctx context.Context, c *Client) error
	}{
		{"Peek", func(ctx context.Context, c *Client) error { _, err := c.Peek(ctx, "k"); return err }},
		{"Lookup", func(ctx context.Context, c *Client) error { _, err := c.Lookup(ctx, "k"); return err }},
		{"Delete", func(ctx context.Context, c *Client) error { _, err := c.Delete(ctx, "k"); return err }},
		{"Set", func(ctx context.Context, c *Client) error { return c.Set(ctx, "k", []byte("v"), time.Minute) }},
		{"GetMany", func(ctx context.Context, c *Client) error {
			items, err := c.GetMany(ctx, []string{"k"}, noFetchID, nil)
			if err != nil {
				return err
			}
			return items[0].Err
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{addr}})
			defer rdb.Close() // ends what go-redis still has blocked, after Close
			c, err := New(rdb, "hung", nil)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			ctx, cancel := context.WithTimeout(bg(), 200*time.Millisecond)
			defer cancel()
			t0 := time.Now()
			err = tc.call(ctx, c)
			if d := time.Since(t0); d > time.Second || !errors.Is(err, ErrTimeout) {
				t.Errorf("%s returned %v after %v; want an error matching ErrTimeout after about 200ms", tc.name, err, d)
			}
		})
	}
}

// freezeNode stops a redis-server with SIGSTOP, as a hung host or a
// partition that drops packets would: it keeps its connections and answers
// nothing. The test's cleanup lets it run again.
func freezeNode(t *testing.T, s *redistest.Server) {
	t.Helper()
	info, _ := s.Do(t, "INFO", "server").(string)
	pid := 0
	for _, line := range strings.Split(info, "\r\n") {
		if v, ok := strings.CutPrefix(line, "process_id:"); ok {
			pid, _ = strconv.Atoi(v)
		}
	}
	if pid == 0 {
		t.Fatalf("no process_id in INFO of %s", s.Addr)
	}
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGCONT) })
}

// idsBy returns the first id, of the form "id<n>", whose keys under tag
// live on node, and n ids whose keys live on other masters.
func idsBy(t *testing.T, nodes []*redistest.Server, node *redistest.Server, tag string, n int) (on string, elsewhere []string) {
	t.Helper()
	for i := 0; on == "" || len(elsewhere) < n; i++ {
		id := fmt.Sprint("id", i)
		owner, _ := nodeOf(t, nodes, tag+":{"+id+"}")
		switch {
		case owner == node && on == "":
			on = id
		case owner != node && len(elsewhere) < n:
			elsewhere = append(elsewhere, id)
		}
	}
	return on, elsewhere
}

// One frozen master must not fail, nor hold up, the ids that other masters
// own (README, Architecture: "One sick node fails and delays only the ids
// it owns"). GetMany reads every node in parallel, but pursues the misses
// only once every node's read has answered: a frozen master's read takes
// go-redis's ReadTimeout (3s), so a call with a shorter deadline fails the
// misses of healthy masters with ErrTimeout, and one without a deadline
// computes them seconds late. Each subtest asks for one id of the frozen
// master and three of healthy ones, all missing, within 2s.
func TestCluster_FrozenMasterDoesNotFailGetManyOnOtherMasters(t *testing.T) {
	nodes := redistest.StartCluster(t, 3)
	for _, n := range nodes {
		// A master that fails with no replica would otherwise take the
		// whole cluster down (CLUSTERDOWN): Redis's doing, not memolock's.
		n.Do(t, "CONFIG", "SET", "cluster-require-full-coverage", "no")
	}
	c, _ := newClusterClient(t, nodes, "fz", &Options{LockTTL: 10 * time.Second})
	frozen := nodes[0]
	onFrozen, healthy := idsBy(t, nodes, frozen, "fz", 7)
	if _, err := c.Get(bg(), healthy[0], constFetch(new(atomic.Int64), "warm", 0)); err != nil {
		t.Fatal(err) // the client knows the slots before the freeze
	}
	freezeNode(t, frozen)
	value := func(id string) string { return "v of " + id }
	for _, tc := range []struct {
		name string
		ids  []string
		opts *ManyOptions
	}{
		{"fetch", healthy[1:4], nil},
		{"Batch", healthy[4:7], &ManyOptions{Batch: func(_ context.Context, ids []string) (map[string]BatchValue, error) {
			out := map[string]BatchValue{}
			for _, id := range ids {
				out[id] = BatchValue{Value: []byte(value(id)), TTL: time.Minute}
			}
			return out, nil
		}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fetch := func(_ context.Context, id string, _ *Lease) ([]byte, time.Duration, error) {
				return []byte(value(id)), time.Minute, nil
			}
			ctx, cancel := context.WithTimeout(bg(), 2*time.Second)
			defer cancel()
			items, err := c.GetMany(ctx, append([]string{onFrozen}, tc.ids...), fetch, tc.opts)
			if err != nil {
				t.Fatal(err)
			}
			for _, it := range items[1:] {
				if it.Err != nil || string(it.Value) != value(it.ID) {
					t.Errorf("id %s, on a healthy master: %q, %v; want %q", it.ID, it.Value, it.Err, value(it.ID))
				}
			}
			if items[0].Err == nil {
				t.Errorf("id %s, on the frozen master: %q and no error", onFrozen, items[0].Value)
			}
		})
	}
}

// Close ends the L1's invalidations (the tracking connection closes), so
// an entry it keeps may be stale at any moment after. A Get after Close
// gets ErrClosed, with an L1 as without one, and never a value that an
// outside write has replaced.
func TestL1_ServesNothingAfterClose(t *testing.T) {
	b := realBackend(t)
	c := l1Client(t, b.addr, "lclose")
	raw := rawClient(t, b.addr)
	raw.Set(bg(), "lclose:k", "old", time.Minute)
	eventually(t, 5*time.Second, "the value to reach the L1", func() bool {
		_, s := served(t, c, "k", noFetch)
		return s == ServedL1
	})
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	raw.Set(bg(), "lclose:k", "new", time.Minute)
	if r, err := c.GetResult(bg(), "k", noFetch); !errors.Is(err, ErrClosed) {
		t.Errorf("GetResult after Close = %q (served %v), %v; want ErrClosed", r.Value, r.Served, err)
	}
	if v, err := c.Get(bg(), "k", noFetch); !errors.Is(err, ErrClosed) {
		t.Errorf("Get after Close = %q, %v; want ErrClosed", v, err)
	}
	if r, err := c.Lookup(bg(), "k"); !errors.Is(err, ErrClosed) {
		t.Errorf("Lookup after Close = %q (served %v), %v; want ErrClosed", r.Value, r.Served, err)
	}
}

// A zero Lease (a Lease{} literal, or a field never set) is bad input like
// a nil one: each method answers as for a nil lease, or with an error, and
// none panics.
func TestLease_ZeroValueNeverPanics(t *testing.T) {
	for _, m := range []struct {
		name string
		call func(l *Lease) error // nil when the method answered as it must
	}{
		{"ID", func(l *Lease) error {
			if id := l.ID(); id != "" {
				return fmt.Errorf("ID() = %q, want \"\"", id)
			}
			return nil
		}},
		{"Token", func(l *Lease) error {
			if tok := l.Token(); tok != "" {
				return fmt.Errorf("Token() = %q, want \"\"", tok)
			}
			return nil
		}},
		{"Held", func(l *Lease) error {
			if held, _ := l.Held(bg()); held {
				return errors.New("Held() = true")
			}
			return nil
		}},
		{"Extend", func(l *Lease) error {
			if err := l.Extend(bg(), time.Second); err == nil {
				return errors.New("Extend() = nil, want an error")
			}
			return nil
		}},
		{"Renew", func(l *Lease) error {
			if err := l.Renew(bg(), time.Second); err == nil {
				return errors.New("Renew() = nil, want an error")
			}
			return nil
		}},
		{"Release", func(l *Lease) error {
			if err := l.Release(bg()); !errors.Is(err, ErrInvalid) {
				return fmt.Errorf("Release() = %v, want ErrInvalid", err)
			}
			return nil
		}},
		{"KeepAlive", func(l *Lease) error { l.KeepAlive(bg())(); return nil }},
	} {
		t.Run(m.name, func(t *testing.T) {
			defer func() {
				if p := recover(); p != nil {
					t.Errorf("%s on a zero Lease panicked: %v", m.name, p)
				}
			}()
			if err := m.call(&Lease{}); err != nil {
				t.Errorf("%s on a zero Lease: %v", m.name, err)
			}
		})
	}
}

// A fetch that asks its own Client for the id it is computing would wait
// for itself: the inner Get joins the flight, which waits for the fetch.
// With a context that cannot end, it hangs until Close, and the outer
// callers wait out their deadlines. The engine knows which flight a
// callback serves (it already knows a callback's goroutine, for Close), so
// the inner call must fail at once with an error wrapping ErrInvalid that
// names the problem, and the outer Get get its value.
func TestGet_OwnIDInsideItsFetchFailsFast(t *testing.T) {
	b := realBackend(t)
	c := newTestClient(t, b.addr, "reentrant", nil)
	inner := make(chan error, 1)
	ctx, cancel := context.WithTimeout(bg(), 5*time.Second)
	defer cancel()
	v, err := c.Get(ctx, "k", func(context.Context, *Lease) ([]byte, time.Duration, error) {
		_, err := c.Get(bg(), "k", noFetch)
		inner <- err
		return []byte("v"), time.Minute, nil
	})
	if err != nil || string(v) != "v" {
		t.Errorf("outer Get = %q, %v; want \"v\"", v, err)
	}
	select {
	case err := <-inner:
		if !errors.Is(err, ErrInvalid) {
			t.Errorf("inner Get of the id its fetch computes = %v; want an error wrapping ErrInvalid", err)
		}
	default:
		t.Error("the inner Get of the id its fetch computes had not returned when the outer one did")
	}
}
