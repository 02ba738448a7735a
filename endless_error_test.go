package memolock

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// cyclicError wraps itself: its chain has no end. errors.Is and errors.As
// on it never return (a wrapper that was meant to wrap the error before it,
// and was handed itself).
type cyclicError struct{ next error }

func (e *cyclicError) Error() string { return "cyclic" }
func (e *cyclicError) Unwrap() error { return e.next }

// endlessError's Unwrap makes a new error each time: a chain without a
// cycle, and without an end.
type endlessError struct{ depth int }

func (e *endlessError) Error() string { return "endless" }
func (e *endlessError) Unwrap() error { return &endlessError{depth: e.depth + 1} }

// unclosedClient is newTestClient without the Close in its cleanup, for a
// test that times Close itself.
func unclosedClient(t *testing.T, addr, tag string, opts *Options) *Client {
	t.Helper()
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	t.Cleanup(func() { _ = rdb.Close() })
	c, err := newClient(rdb, tag, opts, nil)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// closesWithin fails the test unless c.Close returns within d.
func closesWithin(t *testing.T, c *Client, d time.Duration) {
	t.Helper()
	closed := make(chan struct{})
	go func() { _ = c.Close(); close(closed) }()
	select {
	case <-closed:
	case <-time.After(d):
		t.Fatalf("Close did not return within %v", d)
	}
}

// A fetch that returned at once, with an error whose chain has no end,
// must be answered as a failure: its callers told, its lock released, Close
// free to return. tame's errors.Is on such an error never returns, on the
// fetch's callback goroutine, which the engine then takes for a fetch
// still running: the caller waits out its deadline, the watchdog renews the
// lock for ever (so every process's waiters for the id wait for ever), and
// Close waits for ever.
func TestGet_FetchErrorWithoutAnEndIsAnsweredAndReleasesTheLock(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  func() error
	}{
		{"Unwrap cycle", func() error { e := &cyclicError{}; e.next = e; return e }},
		{"Unwrap without end", func() error { return &endlessError{} }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := miniBackend(t)
			c := unclosedClient(t, b.addr, "cyc", &Options{LockTTL: 500 * time.Millisecond})
			raw := rawClient(t, b.addr)

			ctx, cancel := context.WithTimeout(bg(), 10*time.Second)
			defer cancel()
			_, err := c.Get(ctx, "k", func(context.Context, *Lease) ([]byte, time.Duration, error) {
				return nil, 0, tc.err()
			})
			if err == nil || errors.Is(err, ErrTimeout) {
				t.Errorf("Get whose fetch failed at once = %v; want the failure, before the caller's deadline", err)
			}
			// miniredis lets no key expire by itself: the lock goes only if
			// it is released, not renewed for a fetch that had returned.
			eventually(t, 5*time.Second, "the lock released", func() bool { return raw.Exists(bg(), "cyc/lock:k").Val() == 0 })
			closesWithin(t, c, 5*time.Second)
		})
	}
}

// joinsItself is a multi-error (Unwrap() []error) among whose errors is
// itself: errors.Is on it recurses until the stack overflows, a fatal
// error that no recover catches.
type joinsItself struct{ errs []error }

func (e *joinsItself) Error() string   { return "joins itself" }
func (e *joinsItself) Unwrap() []error { return e.errs }

func TestGet_FetchErrorJoiningItselfDoesNotKillTheProcess(t *testing.T) {
	b := miniBackend(t)
	c := newTestClient(t, b.addr, "join", nil)
	ctx, cancel := context.WithTimeout(bg(), 10*time.Second)
	defer cancel()
	_, err := c.Get(ctx, "k", func(context.Context, *Lease) ([]byte, time.Duration, error) {
		e := &joinsItself{}
		e.errs = []error{errors.New("first"), e}
		return nil, 0, e
	})
	if !errors.Is(err, ErrFetchPanicked) {
		t.Errorf("Get = %v; want an error wrapping ErrFetchPanicked", err)
	}
}

// A batch's per-id error without an end fails its own id, at once, and
// leaves the lock and Close free.
func TestGetMany_BatchErrorWithoutAnEndFailsItsIDAtOnce(t *testing.T) {
	b := miniBackend(t)
	c := unclosedClient(t, b.addr, "cycb", &Options{LockTTL: 500 * time.Millisecond})
	raw := rawClient(t, b.addr)
	ctx, cancel := context.WithTimeout(bg(), 10*time.Second)
	defer cancel()
	items, err := c.GetMany(ctx, []string{"a", "b"}, nil, &ManyOptions{Batch: func(_ context.Context, ids []string) (map[string]BatchValue, error) {
		cyc := &cyclicError{}
		cyc.next = cyc
		return map[string]BatchValue{"a": {Err: cyc}, "b": {Value: []byte("v-b"), TTL: time.Minute}}, nil
	}})
	if err != nil {
		t.Fatal(err)
	}
	for _, it := range items {
		switch {
		case it.ID == "a" && (it.Err == nil || errors.Is(it.Err, ErrTimeout)):
			t.Errorf("a: %q, %v; want its failure, before the caller's deadline", it.Value, it.Err)
		case it.ID == "b" && (it.Err != nil || string(it.Value) != "v-b"):
			t.Errorf("b: %q, %v; want its value", it.Value, it.Err)
		}
	}
	eventually(t, 5*time.Second, "a's lock released", func() bool { return raw.Exists(bg(), "cycb/lock:a").Val() == 0 })
	closesWithin(t, c, 5*time.Second)
}

// textJoinsItself is joinsItself with the Error most multi-errors have:
// it joins its errors' texts, and so recurses until the stack overflows
// if asked before its chain is counted.
type textJoinsItself struct{ errs []error }

func (e *textJoinsItself) Error() string {
	s := "errors:"
	for _, err := range e.errs {
		s += " " + err.Error()
	}
	return s
}
func (e *textJoinsItself) Unwrap() []error { return e.errs }

func TestGet_FetchErrorJoiningItselfWhoseTextJoinsItsErrorsDoesNotKillTheProcess(t *testing.T) {
	b := miniBackend(t)
	c := newTestClient(t, b.addr, "joint", nil)
	ctx, cancel := context.WithTimeout(bg(), 10*time.Second)
	defer cancel()
	_, err := c.Get(ctx, "k", func(context.Context, *Lease) ([]byte, time.Duration, error) {
		e := &textJoinsItself{}
		e.errs = []error{errors.New("first"), e}
		return nil, 0, e
	})
	if !errors.Is(err, ErrFetchPanicked) {
		t.Errorf("Get = %v; want an error wrapping ErrFetchPanicked", err)
	}
}
