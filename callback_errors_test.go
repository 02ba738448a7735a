package memolock

import (
	"context"
	"errors"
	"runtime"
	"strings"
	"testing"
	"time"
)

// isGoexit's Is ends its goroutine.
type isGoexit struct{}

func (isGoexit) Error() string { return "is goexit" }
func (isGoexit) Is(error) bool { runtime.Goexit(); return false }

// nilSafe's methods work on a nil pointer.
type nilSafe struct{}

func (e *nilSafe) Error() string { return "nil-safe" }

// multiNil joins nils and a nil pointer.
type multiNil struct{}

func (multiNil) Error() string   { return "multi" }
func (multiNil) Unwrap() []error { return []error{nil, (*nilPointerError)(nil), nil} }

// blockErr's Error blocks until ch is closed.
type blockErr struct{ ch chan struct{} }

func (e blockErr) Error() string { <-e.ch; return "block" }

// Callback errors that misbehave in ways tame lets through, or finds: each
// call is still answered, with the lock released, and counted as it should.
func TestCallbackErrors_MisbehavingErrorsAreAnswered(t *testing.T) {
	b := miniBackend(t)
	t.Run("Is calls Goexit", func(t *testing.T) {
		c := newTestClient(t, b.addr, "h1", nil)
		raw := rawClient(t, b.addr)
		ctx, cancel := context.WithTimeout(bg(), 3*time.Second)
		defer cancel()
		_, err := c.Get(ctx, "k", func(context.Context, *Lease) ([]byte, time.Duration, error) { return nil, 0, isGoexit{} })
		t.Logf("Get = %v", err)
		// The fetch returned; its error's Is ended the goroutine: the
		// error is named, as one whose methods panic would be.
		if !errors.Is(err, ErrFetchPanicked) || !strings.Contains(err.Error(), "fetch returned an error of type memolock.isGoexit whose methods call runtime.Goexit") {
			t.Errorf("Get = %v; want an error wrapping ErrFetchPanicked that names memolock.isGoexit", err)
		}
		eventually(t, 5*time.Second, "the lock released", func() bool { return raw.Exists(bg(), "h1/lock:k").Val() == 0 })
	})
	t.Run("typed nil, nil-safe", func(t *testing.T) {
		c := newTestClient(t, b.addr, "h2", nil)
		_, err := c.Get(bg(), "k", func(context.Context, *Lease) ([]byte, time.Duration, error) {
			return []byte("v"), time.Minute, (*nilSafe)(nil)
		})
		t.Logf("Get = %v", err)
		if err == nil || errors.Is(err, ErrFetchPanicked) {
			t.Errorf("Get = %v; want the typed nil's own error, not one wrapping ErrFetchPanicked (its methods are nil-safe)", err)
		}
	})
	t.Run("multi-error with nil entries and a nil pointer", func(t *testing.T) {
		c := newTestClient(t, b.addr, "h3", nil)
		items, err := c.GetMany(bg(), []string{"a", "b"}, nil, &ManyOptions{Batch: func(_ context.Context, ids []string) (map[string]BatchValue, error) {
			return map[string]BatchValue{"a": {Err: multiNil{}}, "b": {Value: []byte("v"), TTL: time.Minute}}, nil
		}})
		t.Logf("%v %+v", err, items)
		if err != nil || !errors.Is(items[0].Err, ErrFetchPanicked) || items[1].Err != nil {
			t.Errorf("GetMany = %v, %+v; want a's error to wrap ErrFetchPanicked and b's value", err, items)
		}
		if s := c.Stats(); s.FetchPanics != 1 {
			t.Errorf("FetchPanics %d", s.FetchPanics)
		}
	})
	t.Run("Error blocks, FetchTimeout", func(t *testing.T) {
		c := newTestClient(t, b.addr, "h4", &Options{FetchTimeout: 300 * time.Millisecond})
		ch := make(chan struct{})
		defer close(ch)
		t0 := time.Now()
		_, err := c.Get(bg(), "k", func(context.Context, *Lease) ([]byte, time.Duration, error) { return nil, 0, blockErr{ch} })
		t.Logf("Get = %v after %v", err, time.Since(t0))
		if !errors.Is(err, ErrTimeout) {
			t.Errorf("Get = %v; want an error wrapping ErrTimeout", err)
		}
	})
	t.Run("start returns a nil pointer", func(t *testing.T) {
		c := newTestClient(t, b.addr, "h5", nil)
		ctx, cancel := context.WithTimeout(bg(), 3*time.Second)
		defer cancel()
		_, err := c.GetExternal(ctx, "k", func(context.Context, *Lease) error { return (*nilPointerError)(nil) })
		t.Logf("GetExternal = %v", err)
		if !errors.Is(err, ErrFetchPanicked) || c.Stats().FetchPanics != 1 {
			t.Errorf("GetExternal = %v, FetchPanics %d; want an error wrapping ErrFetchPanicked, counted once", err, c.Stats().FetchPanics)
		}
	})
	t.Run("Typed.Set, codec error nil pointer", func(t *testing.T) {
		c := newTestClient(t, b.addr, "h6", nil)
		typed := Typed[string]{Client: c.Client, Codec: nilErrMarshal{}}
		err := typed.Set(bg(), "k", "v", time.Minute)
		t.Logf("Set = %v", err)
		if !errors.Is(err, ErrFetchPanicked) || !strings.Contains(err.Error(), "nilPointerError") {
			t.Errorf("Set = %v; want an error wrapping ErrFetchPanicked naming *memolock.nilPointerError", err)
		}
	})
}

// nilErrMarshal's Marshal returns a nil pointer as its error.
type nilErrMarshal struct{}

func (nilErrMarshal) Marshal(string) ([]byte, error)   { return nil, (*nilPointerError)(nil) }
func (nilErrMarshal) Unmarshal([]byte) (string, error) { return "", nil }
