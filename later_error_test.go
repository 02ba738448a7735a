package memolock

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// laterError is an error whose methods behave when they are first asked,
// and misbehave when they are asked again later: on a goroutine other than
// the ones it behaves on, which are the one that made it (a callback's,
// where the engine asks a callback's error once, in tame) and those the
// test adds. Every later call the engine made on a goroutine of its own
// (the fail event's text, the counters' errors.Is, a log line) was such a
// call, where nothing recovers: a panic there killed the process, and an
// Unwrap cycle made errors.Is spin for ever.
type laterError struct {
	method string // the method that misbehaves: Error, Is, As or Unwrap
	cycle  bool   // Unwrap misbehaves by returning the error itself, rather than by panicking
	second bool   // it misbehaves from the method's second call on, on whatever goroutine
	calls  int    // of method
	inner  error
	mu     sync.Mutex
	on     map[int64]bool // the goroutines it behaves on
	later  []string       // the methods asked later, where it misbehaved
}

func newLaterError(method string, cycle, second bool) *laterError {
	e := &laterError{method: method, cycle: cycle, second: second, inner: errors.New("inner"), on: map[int64]bool{}}
	e.behaveOn()
	return e
}

// behaveOn adds the calling goroutine to those e behaves on.
func (e *laterError) behaveOn() {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.on[testGoid()] = true
}

// misbehaves reports whether method, asked now, misbehaves, and records it.
func (e *laterError) misbehaves(method string) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	if method != e.method {
		return false
	}
	if e.calls++; e.second && e.calls == 1 || !e.second && e.on[testGoid()] {
		return false
	}
	e.later = append(e.later, method)
	return true
}

func (e *laterError) askedLater() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]string(nil), e.later...)
}

func (e *laterError) Error() string {
	if e.misbehaves("Error") {
		panic("laterError.Error asked again")
	}
	return "later error"
}

func (e *laterError) Is(error) bool {
	if e.misbehaves("Is") {
		panic("laterError.Is asked again")
	}
	return false
}

func (e *laterError) As(any) bool {
	if e.misbehaves("As") {
		panic("laterError.As asked again")
	}
	return false
}

func (e *laterError) Unwrap() error {
	if e.misbehaves("Unwrap") {
		if e.cycle {
			return e
		}
		panic("laterError.Unwrap asked again")
	}
	return e.inner
}

// testGoid returns the calling goroutine's id, read from runtime.Stack.
func testGoid() int64 {
	var buf [64]byte
	b := bytes.TrimPrefix(buf[:runtime.Stack(buf[:], false)], []byte("goroutine "))
	if i := bytes.IndexByte(b, ' '); i > 0 {
		b = b[:i]
	}
	id, _ := strconv.ParseInt(string(b), 10, 64)
	return id
}

var laterErrorCases = []struct {
	name   string
	method string
	cycle  bool
	second bool
}{
	{"Error panics", "Error", false, false},
	{"Is panics", "Is", false, false},
	{"As panics", "As", false, false},
	{"Unwrap panics", "Unwrap", false, false},
	{"Unwrap cycles", "Unwrap", true, false},
	// The walk of tame's probe itself asks Unwrap: once, since it walks
	// the chain itself; errors.Is asked it again, and went round for ever.
	{"Unwrap cycles from its second call", "Unwrap", true, true},
}

// A fetch's error whose methods misbehave only when asked again is asked
// once, on the fetch's goroutine: its caller gets it back as it is, a
// waiter in another process gets the failure with its text, the lock is
// released and Close returns; the engine asks it nothing more.
func TestGet_FetchErrorThatMisbehavesOnlyLaterIsAskedOnce(t *testing.T) {
	for _, tc := range laterErrorCases {
		t.Run(tc.name, func(t *testing.T) {
			b := miniBackend(t)
			raw := rawClient(t, b.addr)
			opts := &Options{LockTTL: 30 * time.Second} // a lock that lapses would hide a missing fail event
			a := unclosedClient(t, b.addr, "later", opts)
			waiter := newEngineClient(t, b.addr, "later", opts)

			var made *laterError
			inFetch, fail := make(chan struct{}), make(chan struct{})
			got := make(chan answer, 1)
			go func() {
				ctx, cancel := context.WithTimeout(bg(), 10*time.Second)
				defer cancel()
				v, err := a.Get(ctx, "k", func(context.Context, *Lease) ([]byte, time.Duration, error) {
					close(inFetch)
					<-fail
					made = newLaterError(tc.method, tc.cycle, tc.second)
					return nil, 0, made
				})
				got <- answer{v, err}
			}()
			signalled(t, inFetch, 5*time.Second, "fetch to run")
			var waiterFetches atomic.Int64
			wait := waiter.getIn(10*time.Second, "k", mustNotRun(&waiterFetches))
			waiter.live(t, "k")
			close(fail)

			if h, ok := await(got, 10*time.Second); !ok || h.err != error(made) {
				t.Errorf("Get = %p (%T) (returned: %v); want the fetch's own error, %p", h.err, h.err, ok, made)
			}
			w, ok := await(wait, 10*time.Second)
			if !ok || !errors.Is(w.err, ErrHolderFailed) || !strings.Contains(w.err.Error(), "later error") || waiterFetches.Load() != 0 {
				t.Errorf("a waiter elsewhere got %q, %v (returned: %v); want ErrHolderFailed with the fetch's error's text, at once", w.val, w.err, ok)
			}
			eventually(t, 5*time.Second, "the lock released", func() bool { return raw.Exists(bg(), "later/lock:k").Val() == 0 })
			closesWithin(t, a, 5*time.Second)
			if later := made.askedLater(); len(later) > 0 {
				t.Errorf("the fetch's error was asked %v again, after tame", later)
			}
		})
	}
}

// The same for start's error (GetExternal), and for a per-id fetch's error
// of GetMany, which its workers ask on goroutines of the engine's.
func TestCallbackErrors_ThatMisbehaveOnlyLaterAreAskedOnce(t *testing.T) {
	for _, tc := range laterErrorCases {
		t.Run("GetExternal, "+tc.name, func(t *testing.T) {
			b := miniBackend(t)
			raw := rawClient(t, b.addr)
			c := unclosedClient(t, b.addr, "laterx", nil)
			ctx, cancel := context.WithTimeout(bg(), 10*time.Second)
			defer cancel()
			var made *laterError
			_, err := c.GetExternal(ctx, "k", func(context.Context, *Lease) error {
				made = newLaterError(tc.method, tc.cycle, tc.second)
				return made
			})
			if err != error(made) {
				t.Errorf("GetExternal = %p (%T); want start's own error, %p", err, err, made)
			}
			eventually(t, 5*time.Second, "the lock released", func() bool { return raw.Exists(bg(), "laterx/lock:k").Val() == 0 })
			closesWithin(t, c, 5*time.Second)
			if later := made.askedLater(); len(later) > 0 {
				t.Errorf("start's error was asked %v again, after tame", later)
			}
		})
		t.Run("GetMany, "+tc.name, func(t *testing.T) {
			b := miniBackend(t)
			c := unclosedClient(t, b.addr, "laterm", nil)
			ctx, cancel := context.WithTimeout(bg(), 10*time.Second)
			defer cancel()
			var mu sync.Mutex
			made := map[string]*laterError{}
			items, err := c.GetMany(ctx, []string{"a", "b"}, func(_ context.Context, id string, _ *Lease) ([]byte, time.Duration, error) {
				e := newLaterError(tc.method, tc.cycle, tc.second)
				mu.Lock()
				made[id] = e
				mu.Unlock()
				return nil, 0, e
			}, nil)
			if err != nil {
				t.Fatalf("GetMany = %v", err)
			}
			for _, it := range items {
				if e := made[it.ID]; e == nil || it.Err != error(e) {
					t.Errorf("GetMany's %s: Err = %p (%T); want its fetch's own error", it.ID, it.Err, it.Err)
				} else if later := e.askedLater(); len(later) > 0 {
					t.Errorf("%s's fetch's error was asked %v again, after tame", it.ID, later)
				}
			}
			closesWithin(t, c, 5*time.Second)
		})
	}
}

// GetResult (and Typed.Get, which calls it) tells "not found" from what the
// engine asked the fetch's error once. It once asked errors.Is(err,
// ErrNotFound) of the error itself, on the caller's goroutine: a caller
// that never asks its fetch's error anything was killed by memolock's own
// second asking (or, for an Unwrap that cycles when asked again, GetResult
// never returned). helper-73's review found it.
func TestGetResult_AsksAFetchErrorNothingAgain(t *testing.T) {
	for _, method := range []string{"Is", "Unwrap"} {
		t.Run(method, func(t *testing.T) {
			b := miniBackend(t)
			c := unclosedClient(t, b.addr, "getresult-later", nil)
			defer closesWithin(t, c, 5*time.Second)
			var made *laterError
			var panicked any
			var err error
			func() {
				defer func() { panicked = recover() }()
				_, err = c.GetResult(bg(), "k", func(context.Context, *Lease) ([]byte, time.Duration, error) {
					made = newLaterError(method, false, false)
					return nil, 0, made
				})
			}()
			if panicked != nil {
				t.Fatalf("GetResult panicked on memolock's own errors.Is of the fetch's error: %v", panicked)
			}
			if err != error(made) {
				t.Errorf("GetResult = %v; want the fetch's own error", err)
			}
			if later := made.askedLater(); len(later) > 0 {
				t.Errorf("the fetch's error was asked %v again, after tame", later)
			}
		})
	}
}

// countingError misbehaves from the second call of method on, on any
// goroutine: Error panics, Unwrap returns the error itself (a cycle).
type countingError struct {
	method string
	calls  atomic.Int64
	inner  error
}

func (e *countingError) Error() string {
	if e.method == "Error" && e.calls.Add(1) > 1 {
		panic("countingError.Error asked again")
	}
	return "counting error"
}

func (e *countingError) Unwrap() error {
	if e.method == "Unwrap" && e.calls.Add(1) > 1 {
		return e
	}
	return e.inner
}

// failingCodec fails its Marshal, or its Unmarshal, with err.
type failingCodec struct {
	err      error
	onDecode bool // Unmarshal fails, not Marshal
}

func (c failingCodec) Marshal(v string) ([]byte, error) {
	if c.onDecode {
		return []byte(v), nil
	}
	return nil, c.err
}

func (c failingCodec) Unmarshal(data []byte) (string, error) {
	if c.onDecode {
		return "", c.err
	}
	return string(data), nil
}

// A codec's error is asked once. Marshal's is tamed by Inline, which puts
// memolock's words before it, and the fetch returns that: invoke takes it
// in without asking the codec's error again. It was once wrapped with
// fmt.Errorf and tamed again, and an error that misbehaves when asked
// again reached the caller as ErrPanicked, or with a garbled text
// (helper-73's review). Unmarshal's comes on the caller's goroutine, and
// memolock's words before it are built from what tame asked.
func TestTyped_ACodecErrorIsAskedOnce(t *testing.T) {
	for _, tc := range []struct {
		name     string
		onDecode bool
		doing    string
	}{
		{"Marshal", false, "encoding"},
		{"Unmarshal", true, "decoding"},
	} {
		for _, method := range []string{"Error", "Unwrap"} {
			t.Run(tc.name+"/"+method, func(t *testing.T) {
				b := miniBackend(t)
				c := unclosedClient(t, b.addr, "codec-later", nil)
				defer closesWithin(t, c, 5*time.Second)
				codecErr := &countingError{method: method, inner: errors.New("inner")}
				typed := Typed[string]{Client: c, Codec: failingCodec{err: codecErr, onDecode: tc.onDecode}}
				_, err := typed.Get(bg(), "k", func(context.Context, *Lease) (string, time.Duration, error) { return "v", time.Minute, nil })
				want := fmt.Sprintf("memolock: %s value of id %q: counting error", tc.doing, "k")
				// errors.Is with codecErr first: it matches before asking Unwrap.
				if err == nil || !errors.Is(err, codecErr) || err.Error() != want {
					t.Errorf("Typed.Get = %q (%T); want %q, wrapping the codec's own error", err, err, want)
				}
			})
		}
	}
}

// A batch that fails several ids with one error value: the error is tamed
// once, by the first member to take it, and every id gets the batch's own
// error. Each member once tamed it again, and a member after the first got
// ErrPanicked (or "an Unwrap cycle") rather than the batch's own error
// (helper-73's review).
func TestGetMany_ABatchErrorSharedByIDsIsAskedOnce(t *testing.T) {
	for _, method := range []string{"Error", "Unwrap"} {
		t.Run(method, func(t *testing.T) {
			b := miniBackend(t)
			c := unclosedClient(t, b.addr, "batch-shared", nil)
			defer closesWithin(t, c, 5*time.Second)
			shared := &countingError{method: method, inner: errors.New("inner")}
			ctx, cancel := context.WithTimeout(bg(), 10*time.Second)
			defer cancel()
			items, err := c.GetMany(ctx, []string{"a", "b", "c"}, nil, &ManyOptions{
				Batch: func(_ context.Context, ids []string) (map[string]BatchValue, error) {
					out := make(map[string]BatchValue, len(ids))
					for _, id := range ids {
						out[id] = BatchValue{Err: shared}
					}
					return out, nil
				},
			})
			if err != nil {
				t.Fatalf("GetMany = %v", err)
			}
			for _, it := range items {
				if it.Err != error(shared) {
					t.Errorf("GetMany's %s: Err = %v (%T); want the batch's own error", it.ID, it.Err, it.Err)
				}
			}
		})
	}
}

type goexitPtrError struct{}

func (*goexitPtrError) Error() string { runtime.Goexit(); return "" }

// An error shared by several ids whose Error ends the goroutine that asks
// it: it is tamed on a goroutine of its own, and every id it fails gets
// the same error (the member that tamed it once got "fetch called
// runtime.Goexit", the others an error blaming the error's methods); the
// members that wait for that taming are not left waiting, and the ids with
// values get them.
func TestGetMany_ASharedBatchErrorThatEndsItsGoroutineFailsItsIDs(t *testing.T) {
	b := miniBackend(t)
	c := unclosedClient(t, b.addr, "batch-shared-goexit", nil)
	defer closesWithin(t, c, 5*time.Second)
	shared := &goexitPtrError{}
	ctx, cancel := context.WithTimeout(bg(), 10*time.Second) // a bound for "answered at all"
	defer cancel()
	items, err := c.GetMany(ctx, []string{"a", "b", "c"}, nil, &ManyOptions{
		Batch: func(_ context.Context, ids []string) (map[string]BatchValue, error) {
			out := make(map[string]BatchValue, len(ids))
			for _, id := range ids {
				out[id] = BatchValue{Value: []byte("v-" + id), TTL: time.Minute}
			}
			out["a"] = BatchValue{Err: shared}
			out["b"] = BatchValue{Err: shared}
			return out, nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, it := range items {
		switch {
		case it.ID != "c" && (!errors.Is(it.Err, ErrFetchPanicked) || !strings.Contains(it.Err.Error(), "whose methods call runtime.Goexit")):
			// As a Get's caller gets for such an error: one kind for both
			// ids, blaming the error's methods, not the batch (helper-74).
			t.Errorf("%s: %q, %v; want an error wrapping ErrFetchPanicked that blames the error's methods", it.ID, it.Value, it.Err)
		case it.ID == "c" && (it.Err != nil || string(it.Value) != "v-c"):
			t.Errorf("c: %q, %v; want its value", it.Value, it.Err)
		}
	}
}

// valueLaterError is a comparable non-pointer error whose Error panics
// when asked a second time (its counter is shared by its copies).
type valueLaterError struct{ calls *atomic.Int64 }

func (e valueLaterError) Error() string {
	if e.calls.Add(1) > 1 {
		panic("valueLaterError.Error asked again")
	}
	return "value later error"
}

// sliceError is not comparable: == on it panics.
type sliceError struct{ parts []string }

func (e sliceError) Error() string { return strings.Join(e.parts, ",") }

func batchOfOneError(err error) *ManyOptions {
	return &ManyOptions{Batch: func(_ context.Context, ids []string) (map[string]BatchValue, error) {
		out := make(map[string]BatchValue, len(ids))
		for _, id := range ids {
			out[id] = BatchValue{Err: err}
		}
		return out, nil
	}}
}

// A comparable value error shared by ids is tamed once too: matched with
// ==, not only when it is a pointer (helper-74's review).
func TestGetMany_ASharedValueBatchErrorIsAskedOnce(t *testing.T) {
	b := miniBackend(t)
	c := unclosedClient(t, b.addr, "batch-value", nil)
	defer closesWithin(t, c, 5*time.Second)
	shared := valueLaterError{calls: new(atomic.Int64)}
	ctx, cancel := context.WithTimeout(bg(), 10*time.Second)
	defer cancel()
	items, err := c.GetMany(ctx, []string{"a", "b", "c"}, nil, batchOfOneError(shared))
	if err != nil {
		t.Fatal(err)
	}
	for _, it := range items {
		if it.Err != error(shared) {
			t.Errorf("%s: Err = %v (%T); want the batch's own error", it.ID, it.Err, it.Err)
		}
	}
}

// A non-comparable error shared by ids cannot be matched: it is tamed for
// each id, without a panic, and each id gets it.
func TestGetMany_ANonComparableSharedBatchErrorIsEachIDs(t *testing.T) {
	b := miniBackend(t)
	c := unclosedClient(t, b.addr, "batch-slice", nil)
	defer closesWithin(t, c, 5*time.Second)
	shared := sliceError{parts: []string{"x", "y"}}
	ctx, cancel := context.WithTimeout(bg(), 10*time.Second)
	defer cancel()
	items, err := c.GetMany(ctx, []string{"a", "b"}, nil, batchOfOneError(shared))
	if err != nil {
		t.Fatal(err)
	}
	for _, it := range items {
		var se sliceError
		if !errors.As(it.Err, &se) || it.Err.Error() != "x,y" {
			t.Errorf("%s: Err = %v (%T); want the batch's own error", it.ID, it.Err, it.Err)
		}
	}
}
