package engine

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/memolock/memolock/internal/wire"
)

// nilPointerError's methods dereference their receiver, as most do: a nil
// *nilPointerError returned as an error panics in Error and Is.
type nilPointerError struct{ code int }

func (e *nilPointerError) Error() string        { return "code " + string(rune('0'+e.code)) }
func (e *nilPointerError) Is(target error) bool { return e.code == 1 && target == nil }

// isPanicsFor's Is panics for one target only.
type isPanicsFor struct{ target error }

func (e isPanicsFor) Error() string { return "fine to print" }
func (e isPanicsFor) Is(target error) bool {
	if target == e.target {
		panic("Is asked about " + target.Error())
	}
	return false
}

// asPanics's As panics.
type asPanics struct{}

func (asPanics) Error() string { return "fine to print" }
func (asPanics) As(any) bool   { panic("As called") }

func TestTame(t *testing.T) {
	plain := errors.New("database down")
	if got := tame("fetch", nil); got != nil {
		t.Errorf("tame(nil) = %v", got)
	}
	if got := tame("fetch", plain); reveal(got) != plain || got.Error() != plain.Error() {
		t.Errorf("tame(plain) = %v, want it unchanged for the callers", got)
	}
	wrapped := errors.Join(errors.New("first"), isPanicsFor{target: errors.New("never asked")})
	if got := tame("fetch", wrapped); reveal(got) != wrapped {
		t.Errorf("tame(an error whose Is panics only for a target the engine never asks) = %v, want it unchanged for the callers", got)
	}
	// The engine's sentinels, the most common errors a callback returns
	// (ErrNotFound for "no such id"), are known safe: no probing, and no
	// allocation for it.
	for _, known := range askedOfCallbackErrors {
		if got := tame("fetch", known); got != known {
			t.Errorf("tame(%v) = %v, want it unchanged", known, got)
		}
	}
	if n := testing.AllocsPerRun(100, func() { _ = tame("fetch", ErrNotFound) }); n != 0 {
		t.Errorf("tame(ErrNotFound) allocates %v times, want 0", n)
	}
	cases := []struct {
		name string
		err  error
		want string
	}{
		{"nil pointer", (*nilPointerError)(nil), "*engine.nilPointerError"},
		// Wrapped, it is named rather than its wrapper, whose Error only
		// passes the panic on.
		{"nil pointer, joined", errors.Join(plain, (*nilPointerError)(nil)), "of type *engine.nilPointerError"},
		{"nil pointer, wrapped twice", fmt.Errorf("outer: %w", fmt.Errorf("inner: %w", (*nilPointerError)(nil))), "of type *engine.nilPointerError"},
		{"Unwrap panics", unwrapPanics{}, "of type engine.unwrapPanics"},
		{"Is panics for ErrNotFound", isPanicsFor{target: ErrNotFound}, "engine.isPanicsFor"},
		{"Is panics for context.Canceled", isPanicsFor{target: context.Canceled}, "engine.isPanicsFor"},
		{"As panics", asPanics{}, "engine.asPanics"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := tame("batch fetch", tc.err)
			if !errors.Is(got, ErrPanicked) {
				t.Fatalf("tame = %v, want an error wrapping ErrPanicked", got)
			}
			if msg := got.Error(); !strings.Contains(msg, tc.want) || !strings.Contains(msg, "batch fetch returned") {
				t.Errorf("tame's error %q should name the callback and the type %s", msg, tc.want)
			}
			// The tamed error leaves the original out of its chain: asking
			// it anything is safe.
			for _, target := range askedOfCallbackErrors {
				_ = errors.Is(got, target)
			}
			var u *unreachableError
			_ = errors.As(got, &u)
		})
	}
}

// unwrapPanics's Unwrap panics, as a nil pointer's would.
type unwrapPanics struct{}

func (unwrapPanics) Error() string { return "unwrap panics" }
func (unwrapPanics) Unwrap() error { panic("unwrap") }

// A panic's error names the callback that panicked: ErrPanicked's own text
// says "fetch", and a codec is not one.
func TestPanicErrorNamesItsCallback(t *testing.T) {
	for _, what := range []string{"fetch", "start", "OnWait", "the codec's Unmarshal"} {
		err := panicError(what, "boom")
		if !errors.Is(err, ErrPanicked) || !strings.HasPrefix(err.Error(), "memolock: "+what+" panicked: boom\n") {
			t.Errorf("panicError(%q, boom) = %q, want it to wrap ErrPanicked and begin \"memolock: %s panicked: boom\"", what, err, what)
		}
	}
	err := Inline("the codec's Marshal", "encoding", "k", func() error { panic("boom") })
	if !errors.Is(err, ErrPanicked) || !strings.HasPrefix(err.Error(), `memolock: encoding value of id "k": memolock: the codec's Marshal panicked: boom`) {
		t.Errorf("Inline's panic error = %q", err)
	}
	err = Inline("the codec's Marshal", "encoding", "k", func() error { return (*nilPointerError)(nil) })
	if !errors.Is(err, ErrPanicked) || !strings.HasPrefix(err.Error(), `memolock: encoding value of id "k": memolock: the codec's Marshal returned an error of type *engine.nilPointerError`) {
		t.Errorf("Inline's tamed error = %q", err)
	}
}

// bomb's Error panics with a bomb: fmt recovers the first panic, and
// re-panics on the second, inside its own recovery.
type bomb struct{}

func (bomb) Error() string { panic(bomb{}) }

// A panic value, or an error, whose Error panics while it is being
// described, still becomes an error wrapping ErrPanicked: nothing escapes
// to the engine's goroutines, where it would kill the process.
func TestDescribeSurvivesAPanickingPanicValue(t *testing.T) {
	if err := tame("fetch", bomb{}); !errors.Is(err, ErrPanicked) || !strings.Contains(err.Error(), "engine.bomb") {
		t.Errorf("tame(bomb) = %v, want an error wrapping ErrPanicked naming engine.bomb", err)
	}
	if err := panicError("fetch", bomb{}); !errors.Is(err, ErrPanicked) || !strings.Contains(err.Error(), "a engine.bomb whose Error or String method panics") {
		t.Errorf("panicError(bomb) = %v", err)
	}
	if got := describe("boom"); got != "boom" {
		t.Errorf("describe(\"boom\") = %q", got)
	}
}

// selfWrapping wraps itself; endlessChain's Unwrap makes a new error each
// time. errors.Is on either never returns.
type selfWrapping struct{ next error }

func (e *selfWrapping) Error() string { return "self-wrapping" }
func (e *selfWrapping) Unwrap() error { return e.next }

type endlessChain struct{}

func (endlessChain) Error() string   { return "endless" }
func (endlessChain) Unwrap() []error { return []error{nil, endlessChain{}} }

func TestTame_AChainWithoutAnEndIsTamedNotWalkedForEver(t *testing.T) {
	cyc := &selfWrapping{}
	cyc.next = cyc
	deep := error(ErrNotFound)
	for range maxChain - 1 {
		deep = &selfWrapping{next: deep}
	}
	cases := []struct {
		name string
		err  error
		want string
	}{
		{"Unwrap cycle", cyc, "*engine.selfWrapping"},
		{"Unwrap cycle, joined", errors.Join(errors.New("x"), cyc), "*errors.joinError"},
		{"Unwrap []error without end", endlessChain{}, "engine.endlessChain"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			done := make(chan error, 1)
			go func() { done <- tame("fetch", tc.err) }()
			select {
			case got := <-done:
				if !errors.Is(got, ErrPanicked) || !strings.Contains(got.Error(), tc.want) {
					t.Errorf("tame = %v; want an error wrapping ErrPanicked naming %s", got, tc.want)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("tame did not return within 5s")
			}
		})
	}
	if got := tame("fetch", deep); reveal(got) != deep {
		t.Errorf("tame(a chain of %d errors) = %.80v; want it unchanged for the callers", maxChain, got)
	}
}

// culprit probes the inner errors of one whose probing panicked: an inner
// error whose chain has no end must be counted, not walked by errors.Is
// for ever. errors.Join's Error asks the nil pointer, so probing the join
// panics before its chain is walked.
func TestTame_CulpritDoesNotWalkAnInnerChainWithoutAnEnd(t *testing.T) {
	cyc := &selfWrapping{}
	cyc.next = cyc
	done := make(chan error, 1)
	go func() { done <- tame("fetch", errors.Join(cyc, (*nilPointerError)(nil))) }()
	select {
	case got := <-done:
		if !errors.Is(got, ErrPanicked) {
			t.Errorf("tame = %v; want an error wrapping ErrPanicked", got)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("tame did not return within 5s")
	}
	// probe counts a chain before asking anything else of it, so culprit
	// meets an inner chain without an end only if Unwrap changes its
	// answer: here, from its third call (culprit's).
	ch := &changingJoin{first: []error{(*nilPointerError)(nil)}, later: []error{cyc, (*nilPointerError)(nil)}}
	go func() { done <- tame("fetch", ch) }()
	select {
	case got := <-done:
		if !errors.Is(got, ErrPanicked) {
			t.Errorf("tame = %v; want an error wrapping ErrPanicked", got)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("tame did not return within 5s (an Unwrap that changes its answer)")
	}
}

// changingJoin's Unwrap returns first on its first two calls, later after.
type changingJoin struct {
	calls        int
	first, later []error
}

func (e *changingJoin) Error() string { return "changing" }
func (e *changingJoin) Unwrap() []error {
	if e.calls++; e.calls <= 2 {
		return e.first
	}
	return e.later
}

// dagNode's Error asks both of its errors, as errors.Join's does (without
// building the text, so that only time grows): a tree of them in which
// each node holds the one below twice has 2^depth paths to its leaf.
type dagNode struct{ a, b error }

func (n *dagNode) Error() string   { return n.a.Error() + n.b.Error()[:0] }
func (n *dagNode) Unwrap() []error { return []error{n.a, n.b} }

// An error tree far larger than maxChain is tamed before its text is
// asked: errors.Join(e, e) 40 levels deep has a text of 2^40 lines, which
// would run the process out of memory (a fatal error) before tame counted
// its 2^40 errors.
func TestTame_ATreeLargerThanMaxChainIsTamedBeforeItsTextIsAsked(t *testing.T) {
	var e error = errors.New("x")
	for range 40 {
		e = &dagNode{a: e, b: e}
	}
	done := make(chan error, 1)
	go func() { done <- tame("fetch", e) }()
	select {
	case got := <-done:
		if !errors.Is(got, ErrPanicked) || !strings.Contains(got.Error(), "more than") {
			t.Errorf("tame = %v; want an error wrapping ErrPanicked saying the tree holds more than maxChain errors", got)
		}
	case <-time.After(3 * time.Second):
		t.Fatal("tame did not return within 3s: a tree of 2^40 errors was asked its text before it was counted")
	}
}

// textJoinsItself is a multi-error, holding itself, whose Error joins its
// errors' texts, as most multi-errors' do: asked its text before its chain
// is counted, it recurses until the stack overflows, a fatal error.
type textJoinsItself struct{ errs []error }

func (e *textJoinsItself) Error() string {
	s := "errors:"
	for _, err := range e.errs {
		s += " " + err.Error()
	}
	return s
}
func (e *textJoinsItself) Unwrap() []error { return e.errs }

func TestTame_AMultiErrorHoldingItselfIsTamedBeforeItsTextIsAsked(t *testing.T) {
	e := &textJoinsItself{}
	e.errs = []error{errors.New("first"), e}
	if got := tame("fetch", e); !errors.Is(got, ErrPanicked) || !strings.Contains(got.Error(), "no end") {
		t.Errorf("tame = %v; want an error wrapping ErrPanicked saying its chain has no end", got)
	}
}

// countingError counts the calls of its methods: Error, Is, As, Unwrap.
type countingError struct {
	calls atomic.Int32
	inner error
}

func (e *countingError) Error() string { e.calls.Add(1); return "counting: " + e.inner.Error() }
func (e *countingError) Is(error) bool { e.calls.Add(1); return false }
func (e *countingError) As(any) bool   { e.calls.Add(1); return false }
func (e *countingError) Unwrap() error { e.calls.Add(1); return e.inner }

// After tame, the engine asks a callback's error nothing: whatever it asks
// on its own goroutines (the fail event's text, the counters' errors.Is,
// errors.Is about an error of its own that wraps it, isOutage, errors.As)
// is answered from what tame asked, on the callback's goroutine. The
// callers get the error itself back.
func TestTame_TheEngineAsksACallbacksErrorOnlyInTame(t *testing.T) {
	u := &unreachableError{addr: "10.0.0.1:6379", cause: errors.New("dial")}
	for _, tc := range []struct {
		name        string
		inner       error
		notFound    bool
		unreachable bool
	}{
		{"wrapping ErrNotFound", ErrNotFound, true, false},
		{"wrapping an unreachableError", u, false, true},
		{"wrapping an error of its own", errors.New("database down"), false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := &countingError{inner: tc.inner}
			got := tame("fetch", e)
			asked := e.calls.Load()
			if asked == 0 {
				t.Fatal("tame asked the error nothing")
			}
			if reveal(got) != error(e) {
				t.Errorf("reveal(tame(e)) = %v; want e itself, for the callers", reveal(got))
			}
			if got.Error() != e.inner.Error() && got.Error() != "counting: "+e.inner.Error() {
				t.Errorf("tame(e).Error() = %q", got.Error())
			}
			if errors.Is(got, ErrNotFound) != tc.notFound || errors.Is(got, ErrMiss) || errors.Is(got, ErrPanicked) {
				t.Errorf("errors.Is of tame(e) does not answer as e would")
			}
			if _, o := outcomeOf(ServedComputed, got); (o == gotNotFound) != tc.notFound {
				t.Errorf("outcomeOf(tame(e)) = %v", o)
			}
			var v *unreachableError
			if errors.As(got, &v) != tc.unreachable || (tc.unreachable && v != u) {
				t.Errorf("errors.As(tame(e), *unreachableError) = %v; want %v", v, tc.unreachable)
			}
			wrapped := fmt.Errorf("%w: %w", ErrTimeout, got) // an error of the engine's that wraps it
			if !errors.Is(wrapped, ErrTimeout) || errors.Is(wrapped, context.Canceled) || errors.Is(wrapped, ErrNotFound) != tc.notFound {
				t.Errorf("errors.Is about an error wrapping tame(e) does not answer as it would about e")
			}
			_ = isOutage(got)
			_ = isOutage(wrapped)
			if ev := wire.FailEvent("token", got); !strings.Contains(ev, "counting") {
				t.Errorf("FailEvent = %q; want e's text", ev)
			}
			if n := e.calls.Load(); n != asked {
				t.Errorf("e was asked %d more times after tame", n-asked)
			}
			if again := tame("batch fetch", got); again != got {
				t.Errorf("tame(tame(e)) = %v; want tame(e) unchanged (a batch's error, passed on by its members)", again)
			}
		})
	}
}

// secondCallError behaves the first time each of its methods is asked (Is
// and As: with each target), and misbehaves from the second time on: its
// method named bad panics, or, for Unwrap with cycle set, returns the
// error itself, a chain without an end.
type secondCallError struct {
	bad   string
	cycle bool
	mu    sync.Mutex
	asked map[string]int
}

func (e *secondCallError) again(call string) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.asked == nil {
		e.asked = map[string]int{}
	}
	e.asked[call]++
	return e.asked[call] > 1 && strings.HasPrefix(call, e.bad)
}

func (e *secondCallError) Error() string {
	if e.again("Error") {
		panic("Error asked again")
	}
	return "second call"
}

func (e *secondCallError) Is(target error) bool {
	if e.again(fmt.Sprintf("Is %p", target)) {
		panic("Is asked again")
	}
	return false
}

func (e *secondCallError) As(target any) bool {
	if e.again(fmt.Sprintf("As %T", target)) {
		panic("As asked again")
	}
	return false
}

func (e *secondCallError) Unwrap() error {
	if e.again("Unwrap") {
		if e.cycle {
			return e
		}
		panic("Unwrap asked again")
	}
	return io.EOF
}

// An error whose methods misbehave from their second call on is asked
// each once, by tame, which takes it for a sound error: the callers get it
// back as it is, and what the engine asks after is answered without it.
// An Unwrap that cycles from its second call on led tame's own errors.Is
// round for ever, on the callback's goroutine.
func TestTame_AnErrorThatMisbehavesFromItsSecondCallIsAskedOnce(t *testing.T) {
	for _, tc := range []struct {
		bad   string
		cycle bool
	}{{"Error", false}, {"Is", false}, {"As", false}, {"Unwrap", false}, {"Unwrap", true}} {
		t.Run(fmt.Sprintf("%s, cycle %v", tc.bad, tc.cycle), func(t *testing.T) {
			e := &secondCallError{bad: tc.bad, cycle: tc.cycle}
			done := make(chan error, 1)
			go func() {
				got := tame("fetch", e)
				// What the engine asks on its own goroutines, after tame.
				_ = wire.FailEvent("token", got)
				_, _ = outcomeOf(ServedComputed, got)
				_ = errors.Is(fmt.Errorf("%w: %w", ErrTimeout, got), context.Canceled)
				_ = isOutage(got)
				var u *unreachableError
				_ = errors.As(got, &u)
				done <- got
			}()
			select {
			case got := <-done:
				if reveal(got) != error(e) || got.Error() != "second call" {
					t.Errorf("tame(e) = %v, revealed %v; want e, for the callers", got, reveal(got))
				}
			case <-time.After(5 * time.Second):
				t.Fatal("tame, or what the engine asks after it, did not return within 5s")
			}
		})
	}
}
