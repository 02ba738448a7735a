package memolock

import (
	"context"
	"errors"
	"testing"
	"time"
)

// A hung fetch no longer freezes its key everywhere: past the time limit
// its context is cancelled, its callers get ErrTimeout, and waiters in other
// processes get the failure at once instead of waiting on a lock that the
// watchdog would renew for ever.
func TestGet_FetchTimeoutFreesAHungKey(t *testing.T) {
	b := miniBackend(t)
	opts := &Options{LockTTL: 30 * time.Second, FetchTimeout: 200 * time.Millisecond}
	holder := newTestClient(t, b.addr, "hung", opts)
	other := newTestClient(t, b.addr, "hung", opts)
	raw := rawClient(t, b.addr)
	started, cancelled := make(chan struct{}, 1), make(chan error, 1)
	ctx, cancel := context.WithTimeout(bg(), 5*time.Second) // the lock TTL is 30s
	defer cancel()
	got := make(chan error, 1)
	go func() {
		_, err := holder.Get(ctx, "k", func(ctx context.Context, _ *Lease) ([]byte, time.Duration, error) {
			started <- struct{}{}
			<-ctx.Done()
			cancelled <- ctx.Err()
			return nil, 0, ctx.Err()
		})
		got <- err
	}()
	<-started
	waiter := getAsync(other, ctx, "k", noFetch)
	err := <-got
	if !errors.Is(err, ErrTimeout) || errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("holder's caller got %v, want the fetch time limit's ErrTimeout", err)
	}
	if err := <-cancelled; !errors.Is(err, context.Canceled) {
		t.Errorf("fetch's context ended with %v", err)
	}
	select {
	case w := <-waiter:
		if want := "error: " + ErrHolderFailed.Error(); len(w) < len(want) || w[:len(want)] != want {
			t.Errorf("waiter got %q, want ErrHolderFailed", w)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the waiter is still waiting (the lock TTL is 30s)")
	}
	if raw.Exists(bg(), "hung:k", "hung/lock:k").Val() != 0 {
		t.Error("a value or lock left behind")
	}
	if s := holder.Stats(); s.FetchTimeouts != 1 || s.FetchErrors != 1 {
		t.Errorf("stats %+v", s)
	}
}

// Callers do not wait for a fetch that ignores its context; what it
// returns late is not stored.
func TestGet_FetchTimeoutDoesNotWaitForAFetchThatIgnoresItsContext(t *testing.T) {
	b := miniBackend(t)
	c := newTestClient(t, b.addr, "deaf", &Options{FetchTimeout: 100 * time.Millisecond})
	raw := rawClient(t, b.addr)
	release, returned := make(chan struct{}), make(chan struct{})
	ctx, cancel := context.WithTimeout(bg(), 5*time.Second)
	defer cancel()
	_, err := c.Get(ctx, "k", func(context.Context, *Lease) ([]byte, time.Duration, error) {
		defer close(returned)
		<-release
		return []byte("late"), time.Minute, nil
	})
	if !errors.Is(err, ErrTimeout) || errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Get = %v, want the fetch time limit's ErrTimeout", err)
	}
	close(release)
	<-returned
	// Close waits for what the fetch's return set off: a store, if there
	// were one, has landed once it returns, whatever the machine's load.
	_ = c.Close()
	if raw.Exists(bg(), "deaf:k").Val() != 0 {
		t.Error("the late value was stored")
	}
}

// WithFetchTimeout sets a limit per call, and 0 lifts the Options' limit.
func TestWithFetchTimeout_OverridesTheOption(t *testing.T) {
	b := miniBackend(t)
	c := newTestClient(t, b.addr, "per", &Options{FetchTimeout: 50 * time.Millisecond})
	slow := func(context.Context, *Lease) ([]byte, time.Duration, error) {
		time.Sleep(200 * time.Millisecond)
		return []byte("slow"), time.Minute, nil
	}
	if v, err := c.Get(WithFetchTimeout(bg(), 0), "lifted", slow); err != nil || string(v) != "slow" {
		t.Errorf("with the limit lifted: %q, %v", v, err)
	}
	if _, err := c.Get(bg(), "limited", slow); !errors.Is(err, ErrTimeout) {
		t.Errorf("with the option's 50ms: %v", err)
	}
	none := newTestClient(t, b.addr, "per2", nil)
	ctx, cancel := context.WithTimeout(WithFetchTimeout(bg(), 50*time.Millisecond), 5*time.Second)
	defer cancel()
	if _, err := none.Get(ctx, "k", slow); !errors.Is(err, ErrTimeout) || errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("with a per-call 50ms: %v", err)
	}
	if _, err := New(c.rdb, "neg", &Options{FetchTimeout: -time.Second}); !errors.Is(err, ErrInvalid) {
		t.Errorf("negative FetchTimeout: %v", err)
	}
}
