package engine

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"runtime"
	"runtime/debug"
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/memolock/memolock/internal/wire"

	goidpkg "github.com/petermattis/goid"
)

// A runner is the one place that runs the user's callbacks: fetch, start,
// a GetMany batch and OnWait. As x/sync/singleflight's doCall, it tells a
// return from a panic from runtime.Goexit; unlike doCall, it runs each
// callback on a goroutine of its own, so that a Goexit (t.FailNow in a test)
// ends only that goroutine, and the engine's own goroutines go on to answer
// every caller and release the lock.
//
// Close waits for the callbacks to return. Called from inside one of this
// engine's callbacks, it must not (the callback would wait for itself): the
// runner knows its callbacks' goroutines by id, so that the question "am I
// inside a callback" is asked of this engine alone.
type runner struct {
	pending work // callbacks started or about to start; Close waits for them

	active  atomic.Int32 // callbacks running now: when 0, nobody is inside one
	mu      sync.Mutex
	running map[int64][]*flight // the goroutines running a callback now, and the flights it serves
}

// result is what a callback ended with.
type result[T any] struct {
	val T
	err error
}

// errGoexit is wrapped by the error of a callback that called
// runtime.Goexit.
var errGoexit = errors.New("called runtime.Goexit")

func goexitError(what string) error {
	return fmt.Errorf("memolock: %s %w", what, errGoexit)
}

// panickedError is the error of a callback that panicked, or that
// returned an error whose methods panic (see tame). It wraps ErrPanicked,
// and its text names the callback: ErrPanicked's own text says "fetch",
// which would misname a codec, start or OnWait.
type panickedError struct{ text string }

func (e *panickedError) Error() string { return e.text }
func (e *panickedError) Unwrap() error { return ErrPanicked }

// panicError is the error of a callback called what that panicked with p:
// it carries the stack, which a fail event leaves out.
func panicError(what string, p any) error {
	return &panickedError{text: fmt.Sprintf("memolock: %s panicked: %s\n%s", what, describe(p), debug.Stack())}
}

// describe formats p, a panic value, as %v does, unless that panics too:
// fmt recovers a panic in an Error or String method once, but re-panics on
// a second one inside it (an Error that panics with a value whose own
// Error panics), and that would escape every recover of the engine's.
func describe(p any) (s string) {
	defer func() {
		if recover() != nil {
			s = fmt.Sprintf("a %T whose Error or String method panics", p)
		}
	}()
	return fmt.Sprint(p)
}

// tame returns what the engine keeps of err, the error a callback called
// what returned: a *calledError, which holds err for the callers and
// answers the engine's own questions from what tame asked err once, here,
// on the callback's goroutine; or err itself, if it is one of the
// sentinels the engine asks about (nil, the engine's and the context
// package's errors, whose methods are safe); or an error wrapping
// ErrPanicked if err's methods panic when tame asks them: Error, and
// errors.Is and errors.As with what the engine asks of a callback's error.
// Most often that is a nil *T returned as an error, whose methods
// dereference it. Handed to every caller, such an error would panic in
// their own errors.Is; here it becomes an error wrapping ErrPanicked that
// names its type (the innermost error of its tree whose own methods panic,
// rather than a wrapper that only passes the panic on) and leaves it out
// of its chain, so that the caller's own errors.Is cannot panic on it
// either; so does an error whose chain has no end (see maxChain).
//
// After tame, the engine never calls err's methods again: its fail events,
// log lines, counters, spans and its own errors.Is and errors.As (even
// about an error of its own that wraps it) read the calledError, whose
// methods are the engine's. Only the callers get err back (see reveal),
// on their own goroutines. So an error whose methods panic, block, call
// runtime.Goexit or make a cycle only on a later call, or only for targets
// tame does not ask (the caller's own), harms only a caller that asks it,
// as it would without memolock. On tame's own call, on the callback's
// goroutine: a panic is recovered as above, a runtime.Goexit ends that
// goroutine and invoke reports the error as one whose methods do so, and
// a method that blocks holds the fetch up, as a fetch that blocks would
// (its time limit bounds the wait).
func tame(what string, err error) (tamed error) {
	if err == nil {
		return nil
	}
	if c, ok := err.(*calledError); ok { // tamed already: a batch's error, passed on by its members' fetches
		return c
	}
	if a, ok := err.(*annotatedError); ok { // a codec's error, which Inline tamed, passed on by a fetch
		c := *a.called
		c.err, c.text = a, a.text
		return &c
	}
	for _, known := range askedOfCallbackErrors {
		if err == known { // the engine's sentinels and the context package's: asking them is safe
			return err
		}
	}
	defer func() {
		if p := recover(); p != nil {
			tamed = &panickedError{text: fmt.Sprintf("memolock: %s returned an error of type %s whose methods panic (a nil pointer returned as an error?): %s", what, culprit(err, 0), describe(p))}
		}
	}()
	c, ok := probe(err)
	if !ok {
		return &panickedError{text: fmt.Sprintf("memolock: %s returned an error of type %T whose chain of wrapped errors has no end (an Unwrap cycle?) or holds more than %d errors", what, err, maxChain)}
	}
	return c
}

// probe asks err what the engine and package memolock ask of a callback's
// error: its text, and errors.Is and errors.As with their targets, and
// returns the answers in a calledError. It walks err's chain itself, as
// errors.Is and errors.As would, asking each error of it Unwrap once: an
// Unwrap that answers otherwise when asked again (a cycle from its second
// call on) cannot lead it round for ever, as it would lead errors.Is. It
// reports false, asking no more, if the chain has no end. The chain is
// walked before the text is asked: a tree of errors larger than maxChain
// may have a text that never ends either (errors.Join's Error, over a tree
// whose errors share their inner errors, asks each leaf once per path to
// it: 2^40 times for 40 levels, building a string that long).
func probe(err error) (*calledError, bool) {
	c := &calledError{err: err}
	if budget := maxChain; !c.walk(err, &budget) {
		return nil, false
	}
	c.text = err.Error()
	return c, true
}

// walk asks each error of err's chain (Unwrap, depth first) what ask does,
// and reports whether the chain ends within *budget errors, which it
// counts down.
func (c *calledError) walk(err error, budget *int) bool {
	for err != nil {
		if *budget--; *budget < 0 {
			return false
		}
		c.ask(err)
		switch x := err.(type) {
		case interface{ Unwrap() error }:
			err = x.Unwrap()
		case interface{ Unwrap() []error }:
			for _, e := range x.Unwrap() {
				if !c.walk(e, budget) {
					return false
				}
			}
			return true
		default:
			return true
		}
	}
	return true
}

// ask asks err itself, not its chain, what errors.Is asks each error of a
// chain (== and its Is method) about askedOfCallbackErrors, and what
// errors.As asks it (its type, and its As method) for a *unreachableError,
// recording the first match as errors.As would. err == target cannot
// panic: every target's type is comparable.
func (c *calledError) ask(err error) {
	is, _ := err.(interface{ Is(error) bool })
	for i, target := range askedOfCallbackErrors {
		if c.is&(1<<i) == 0 && (err == target || is != nil && is.Is(target)) {
			c.is |= 1 << i
		}
	}
	if c.unreachableFound {
		return
	}
	if u, ok := err.(*unreachableError); ok {
		c.unreachable, c.unreachableFound = u, true
	} else if as, ok := err.(interface{ As(any) bool }); ok {
		var u *unreachableError
		if as.As(&u) {
			c.unreachable, c.unreachableFound = u, true
		}
	}
}

// A calledError is the engine's side of an error that a callback returned
// (see tame): it answers what the engine asks of that error (its text,
// errors.Is with askedOfCallbackErrors, errors.As with *unreachableError)
// from what tame asked it once, and wraps nothing, so that no errors.Is or
// errors.As of the engine's, even about an error of its own that wraps
// this one, walks into the callback's error again. The callers get the
// callback's error itself: see reveal.
type calledError struct {
	err              error             // the callback's error, as the callers get it
	text             string            // err.Error()
	is               uint16            // bit i: errors.Is(err, askedOfCallbackErrors[i])
	unreachable      *unreachableError // what errors.As(err, &unreachable) sets
	unreachableFound bool              // what errors.As(err, &unreachable) returns
}

func (c *calledError) Error() string { return c.text }

// Is answers errors.Is for askedOfCallbackErrors; false for any other
// target, which the engine does not ask about a callback's error.
func (c *calledError) Is(target error) bool {
	for i, known := range askedOfCallbackErrors {
		if target == known { // known's type is comparable: == cannot panic
			return c.is&(1<<i) != 0
		}
	}
	return false
}

// As answers errors.As for a *unreachableError.
func (c *calledError) As(target any) bool {
	if p, ok := target.(**unreachableError); ok && c.unreachableFound {
		*p = c.unreachable
		return true
	}
	return false
}

// reveal returns the error that a caller gets for err, an error the
// engine answers with: the callback's own error if err is a calledError,
// else err.
func reveal(err error) error {
	if c, ok := err.(*calledError); ok {
		return c.err
	}
	return err
}

// culprit names the type of the innermost error in err's tree whose own
// methods panic (Error, Unwrap, and Is and As with the engine's targets),
// or err's own type if none does alone: a wrapper whose Error only calls
// the wrapped one's is not the one to blame. It looks depth first, at most
// culpritDepth levels down (an Unwrap may lead round in a cycle).
func culprit(err error, depth int) string {
	if depth < culpritDepth {
		for _, inner := range unwrapped(err) {
			if inner != nil && panics(func() { probe(inner) }) {
				return culprit(inner, depth+1)
			}
		}
	}
	return fmt.Sprintf("%T", err)
}

const culpritDepth = 32

// unwrapped returns what err wraps, or nothing if its Unwrap panics.
func unwrapped(err error) (inner []error) {
	defer func() {
		if recover() != nil {
			inner = nil
		}
	}()
	switch u := err.(type) {
	case interface{ Unwrap() error }:
		return []error{u.Unwrap()}
	case interface{ Unwrap() []error }:
		return u.Unwrap()
	}
	return nil
}

// panics reports whether fn panics.
func panics(fn func()) (panicked bool) {
	defer func() {
		if recover() != nil {
			panicked = true
		}
	}()
	fn()
	return false
}

// maxChain bounds the errors tame walks in a callback's error's chain
// (Unwrap, depth first), as errors.Is and errors.As would. A chain with a
// cycle (an error that wraps itself), or whose Unwrap makes a new error at
// each call, has no end: errors.Is would never return, on the callback's
// goroutine, and the engine would take the fetch for one still running,
// keeping its lock and Close waiting for good.
const maxChain = 1 << 16

// askedOfCallbackErrors are the targets of the engine's errors.Is about a
// callback's error, and package memolock's about the error a call returns.
var askedOfCallbackErrors = [...]error{
	ErrNotFound, ErrMiss, ErrPanicked, ErrClosed, ErrTimeout, ErrHolderFailed,
	context.Canceled, context.DeadlineExceeded,
}

// invoke runs fn, a callback called what that serves flights fs (a batch
// serves many), on a goroutine of its own, and returns a channel that
// receives how it ended. The caller has added one to
// r.pending for it (under the flight group's lock, so that Close cannot miss
// it); the goroutine takes it away when fn ends, however it ends.
func invoke[T any](r *runner, what string, fs []*flight, fn func() (T, error)) <-chan result[T] {
	out := make(chan result[T], 1)
	go func() {
		id := goid()
		r.enter(id, fs)
		var res result[T]
		ended := false // fn returned or panicked; else it called runtime.Goexit
		var returned error
		probing := false // fn returned, and tame asks what it returned
		defer func() {
			switch {
			case !ended && probing:
				// fn returned, and the error's own methods ended the
				// goroutine: the error is to blame, as for one that panics.
				res = result[T]{err: &panickedError{text: fmt.Sprintf("memolock: %s returned an error of type %T whose methods call runtime.Goexit", what, returned)}}
			case !ended:
				res = result[T]{err: goexitError(what)} // made only then: a fetch's every return would pay for it
			}
			r.leave(id)
			r.pending.done()
			out <- res
		}()
		defer func() {
			if p := recover(); p != nil {
				res, ended = result[T]{err: panicError(what, p)}, true
			}
		}()
		v, err := fn()
		returned, probing = err, true
		res, ended = result[T]{val: v, err: tame(what, err)}, true
	}()
	return out
}

// callErr is invoke for a callback of flight f (nil: none) that returns
// only an error, waiting for it.
func (r *runner) callErr(what string, f *flight, fn func() error) error {
	res := <-invoke(r, what, []*flight{f}, func() (struct{}, error) { return struct{}{}, fn() })
	return res.err
}

func (r *runner) enter(id int64, fs []*flight) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.running == nil {
		r.running = make(map[int64][]*flight)
	}
	r.running[id] = fs
	r.active.Add(1)
	for _, f := range fs {
		f.inCallback.Add(1)
	}
}

func (r *runner) leave(id int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, f := range r.running[id] {
		f.inCallback.Add(-1)
	}
	delete(r.running, id)
	r.active.Add(-1)
}

// inside reports whether the calling goroutine runs one of r's callbacks. A
// goroutine that a callback starts is not inside it.
func (r *runner) inside() bool {
	_, ok := r.current()
	return ok
}

// current returns the flights whose callback the calling goroutine runs,
// if it runs one of r's.
func (r *runner) current() ([]*flight, bool) {
	if r.active.Load() == 0 {
		return nil, false // no callback runs: spare the stack read
	}
	id := goid()
	r.mu.Lock()
	defer r.mu.Unlock()
	f, ok := r.running[id]
	return f, ok
}

// goid returns the calling goroutine's id. petermattis/goid reads it from
// the runtime's own goroutine record in nanoseconds; the only other way,
// parsing runtime.Stack's first line ("goroutine 42 [running]:"), walks the
// whole stack under the runtime's global print lock, and 10,000 callers
// joining one flight while its fetch ran (each must be checked: see
// Engine.reentered) queued on that lock, making BenchmarkStampede 3× as
// slow. The library mirrors the runtime's goroutine struct for each Go
// release; so it is checked against the parse at start-up, on goroutines
// of their own, and the parse serves if they ever disagree.
var goid = pickGoid()

func pickGoid() func() int64 {
	ok := make(chan bool, 4)
	for range cap(ok) {
		go func() { ok <- goidpkg.Get() == stackGoid() }()
	}
	fast := goidpkg.Get() == stackGoid()
	for range cap(ok) {
		fast = <-ok && fast
	}
	if fast {
		return goidpkg.Get
	}
	return stackGoid
}

// stackGoid reads the goroutine id from runtime.Stack.
func stackGoid() int64 {
	var buf [64]byte
	b := buf[:runtime.Stack(buf[:], false)]
	b = bytes.TrimPrefix(b, []byte("goroutine "))
	if i := bytes.IndexByte(b, ' '); i > 0 {
		b = b[:i]
	}
	id, err := strconv.ParseInt(string(b), 10, 64)
	if err != nil {
		return -1
	}
	return id
}

// Inline runs fn, a callback called what that serves one caller alone (a
// codec's Marshal or Unmarshal, on its caller's goroutine), for the value
// of id, and returns its error as "memolock: <doing> value of id <id>:
// <the error's text>". A panic becomes an error wrapping ErrPanicked with
// the stack, and so does an error whose methods panic (see tame); any
// other error is fn's own, which the returned error wraps. Its text is
// built from what tame asked fn's error once: the error is not asked
// again, here or by the engine if the caller's fetch returns it (see
// annotatedError). A runtime.Goexit ends the caller's goroutine, as it
// would without memolock: nothing of the engine's waits on it.
func Inline(what, doing, id string, fn func() error) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = annotate(doing, id, panicError(what, p))
		}
	}()
	return annotate(doing, id, tame(what, fn()))
}

// annotate puts memolock's words before err, an error that tame returned.
func annotate(doing, id string, err error) error {
	if err == nil {
		return nil
	}
	prefix := "memolock: " + doing + " value of id " + wire.Quote(id)
	if c, ok := err.(*calledError); ok {
		return &annotatedError{text: prefix + ": " + c.text, called: c}
	}
	return fmt.Errorf("%s: %w", prefix, err) // memolock's own error, or a sentinel: safe to ask
}

// An annotatedError is a callback's error with memolock's words before it
// (see Inline). Its text is built from what tame asked the callback's
// error once, and tame takes it in without asking that error again; its
// Unwrap gives the callback's own error, for the callers.
type annotatedError struct {
	text   string
	called *calledError
}

func (a *annotatedError) Error() string { return a.text }
func (a *annotatedError) Unwrap() error { return a.called.err }
