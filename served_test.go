package memolock

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"
)

// GetResult reports how each value was served: computed here, then from
// Redis; received from the holder by a waiter elsewhere.
func TestGetResult_ReportsHowEachValueWasServed(t *testing.T) {
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			c := newTestClient(t, b.addr, "served", nil)
			other := newTestClient(t, b.addr, "served", nil)
			l := countLookups(other.rdb, "served:k")
			started, release := make(chan struct{}, 1), make(chan struct{})
			type res struct {
				r   Result
				err error
			}
			computed, waited := make(chan res, 1), make(chan res, 1)
			go func() {
				r, err := c.GetResult(bg(), "k", blockingFetch(started, release, "v"))
				computed <- res{r, err}
			}()
			<-started
			go func() {
				r, err := other.GetResult(bg(), "k", noFetch)
				waited <- res{r, err}
			}()
			parkedAndLive(t, l, 2)
			close(release)
			for name, want := range map[string]struct {
				ch     chan res
				served Served
			}{"holder": {computed, ServedComputed}, "waiter": {waited, ServedWaited}} {
				select {
				case got := <-want.ch:
					if got.err != nil || string(got.r.Value) != "v" || got.r.Served != want.served {
						t.Errorf("%s: %+v, %v; want %v", name, got.r, got.err, want.served)
					}
				case <-time.After(5 * time.Second):
					t.Fatalf("%s: no value", name)
				}
			}
			for _, cl := range []*testClient{c, other} {
				r, err := cl.GetResult(bg(), "k", noFetch)
				if err != nil || r.Served != ServedRedis || string(r.Value) != "v" {
					t.Errorf("a later Get: %+v, %v; want %v", r, err, ServedRedis)
				}
			}
			// A caller whose context can end takes the other path.
			ctx, cancel := context.WithTimeout(bg(), 5*time.Second)
			defer cancel()
			if r, err := c.GetResult(ctx, "k", noFetch); err != nil || r.Served != ServedRedis {
				t.Errorf("with a deadline: %+v, %v", r, err)
			}
			if r, err := c.GetResult(ctx, "fresh", constFetch(new(atomic.Int64), "f", 0)); err != nil || r.Served != ServedComputed {
				t.Errorf("a miss with a deadline: %+v, %v", r, err)
			}
		})
	}
}

func TestGetResult_BadInput(t *testing.T) {
	c := newTestClient(t, miniBackend(t).addr, "served2", nil)
	if _, err := c.GetResult(bg(), "k", nil); !errors.Is(err, ErrInvalid) {
		t.Errorf("nil fetch: %v", err)
	}
	if s := Served(0).String(); s != "none" {
		t.Errorf("zero Served = %q", s)
	}
	if s := ServedWaited.String(); s != "waited" {
		t.Errorf("ServedWaited = %q", s)
	}
}

// A negative TTL returns the value to the flight's callers and to waiters
// elsewhere, but stores nothing: the next Get computes again.
func TestGet_NegativeTTLIsHandedOutButNotCached(t *testing.T) {
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			c := newTestClient(t, b.addr, "nocache", &Options{LockTTL: 30 * time.Second})
			other := newTestClient(t, b.addr, "nocache", &Options{LockTTL: 30 * time.Second})
			raw := rawClient(t, b.addr)
			l := countLookups(other.rdb, "nocache:k")
			var calls atomic.Int64
			started, release := make(chan struct{}, 1), make(chan struct{})
			fetch := func(ctx context.Context, _ *Lease) ([]byte, time.Duration, error) {
				calls.Add(1)
				select {
				case started <- struct{}{}:
				default:
				}
				<-release
				return []byte("fleeting"), -1, nil
			}
			ctx, cancel := context.WithTimeout(bg(), 10*time.Second)
			defer cancel()
			mine := getAsync(c, ctx, "k", fetch)
			<-started
			theirs := getAsync(other, ctx, "k", noFetch)
			parkedAndLive(t, l, 2)
			close(release)
			within(t, 5*time.Second, mine, "fleeting", "the holder's caller")
			within(t, 5*time.Second, theirs, "fleeting", "the waiter elsewhere (lock TTL 30s)")
			if n := raw.Exists(bg(), "nocache:k", "nocache/lock:k").Val(); n != 0 {
				t.Errorf("%d keys left: the value was cached or the lock kept", n)
			}
			if v, err := c.Get(ctx, "k", fetch); err != nil || string(v) != "fleeting" || calls.Load() != 2 {
				t.Errorf("next Get = %q, %v after %d fetches; want a second fetch", v, err, calls.Load())
			}
		})
	}
}
