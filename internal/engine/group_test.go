package engine

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
)

// A flight sealed while it releases its lock (its holder's failure heard in
// the takeover check, or its external producer's) may still answer its
// callers with the stale copy offered to it. A Delete or Set in this
// process meanwhile must take that copy away, as it does from a flight
// still joinable: otherwise the callers get, after the Delete, the copy it
// deleted (or, after a Set, the copy older than it).
func TestGroup_DetachTakesTheCopyOfASealedFlightToo(t *testing.T) {
	var g group
	var w work
	f := &flight{id: "k", key: "k", done: make(chan struct{})}
	if _, led, err := g.lead(f, &w); err != nil || !led {
		t.Fatalf("lead: led %v, err %v", led, err)
	}
	g.offer(f, []byte("old"))
	g.seal(f) // the holder's failure heard: the release under way
	g.detach("k")
	if copy := g.fallbackOf(f); copy != nil {
		t.Errorf("after the Delete, the sealed flight still offers %q to its callers", copy)
	}
	other := &flight{id: "j", key: "j", done: make(chan struct{})}
	if _, led, err := g.lead(other, &w); err != nil || !led {
		t.Fatalf("lead: led %v, err %v", led, err)
	}
	g.offer(other, []byte("j's"))
	g.seal(other)
	g.detach("k")
	if copy := g.fallbackOf(other); string(copy) != "j's" {
		t.Errorf("a Delete of k took j's copy: %q", copy)
	}
	g.finish(f, answer{})
	g.finish(other, answer{})
}

// While a flight with callers to wake is waking them (settle, between
// leaving flights and closing done), a caller of its key waits: were it
// the first one woken, calling again at once, it would lead the key's next
// flight before the others could join it. It goes on once the wake-up is
// over, or at Close; callers of other keys never wait.
func TestGroup_ACallerOfAWakingKeyWaitsForTheWakeUp(t *testing.T) {
	var g group
	var w work
	g.mu.Lock()
	g.wakes("k")
	g.mu.Unlock()

	found := make(chan error, 1)
	go func() {
		f, err := g.find("k")
		if f != nil {
			err = fmt.Errorf("joined %p", f)
		}
		found <- err
	}()
	led := make(chan bool, 1)
	next := &flight{id: "k", key: "k", done: make(chan struct{})}
	go func() {
		_, ok, _ := g.lead(next, &w)
		led <- ok
	}()
	// Another key's caller goes through at once.
	if f, err := g.find("j"); f != nil || err != nil {
		t.Fatalf("find(j) = %v, %v", f, err)
	}
	// Nothing may come back before the wake-up ends (a late return would
	// only make this pass wrongly, never fail wrongly).
	select {
	case err := <-found:
		t.Fatalf("find returned (%v) while the key's flight was waking its callers", err)
	case <-led:
		t.Fatal("lead returned while the key's flight was waking its callers")
	case <-time.After(50 * time.Millisecond):
	}
	g.mu.Lock()
	g.woke("k")
	g.mu.Unlock()
	select {
	case ok := <-led:
		if !ok {
			t.Error("lead joined a flight once the wake-up was over")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("lead still waits after the wake-up ended")
	}
	select {
	case err := <-found:
		// find ran before or after lead: none found, or the new one joined.
		if err != nil && !strings.HasPrefix(err.Error(), "joined") {
			t.Errorf("find: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("find still waits after the wake-up ended")
	}
	g.finish(next, answer{})

	// A key waits for all its flights' wake-ups, and another key's ending
	// wakes none of its callers.
	g.mu.Lock()
	g.wakes("k")
	g.wakes("k")
	g.mu.Unlock()
	go func() {
		f, err := g.find("k")
		if f != nil {
			err = fmt.Errorf("joined %p", f)
		}
		found <- err
	}()
	time.Sleep(50 * time.Millisecond) // let find wait (too short only makes this pass wrongly)
	j := &flight{id: "j", key: "j", done: make(chan struct{})}
	g.lead(j, &w)
	g.find("j")
	g.finish(j, answer{}) // two callers: a wake-up of its own
	g.mu.Lock()
	g.woke("k")
	g.mu.Unlock()
	select {
	case err := <-found:
		t.Fatalf("find returned (%v) while one of its key's flights was still waking its callers", err)
	case <-time.After(50 * time.Millisecond):
	}
	g.mu.Lock()
	g.woke("k")
	g.mu.Unlock()
	select {
	case err := <-found:
		if err != nil {
			t.Errorf("find: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("find still waits after its key's wake-ups ended")
	}

	// Close ends the wait too.
	g.mu.Lock()
	g.wakes("k")
	g.mu.Unlock()
	go func() {
		_, err := g.find("k")
		found <- err
	}()
	time.Sleep(50 * time.Millisecond) // let find wait (too short only makes this pass wrongly)
	g.close()
	select {
	case err := <-found:
		if !errors.Is(err, ErrClosed) {
			t.Errorf("find after Close: %v, want ErrClosed", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("find still waits after Close")
	}
}

// settle leaves nothing waking behind it, whatever the number of callers,
// and whether its flight was the key's or detached.
func TestGroup_SettleLeavesNothingWaking(t *testing.T) {
	var g group
	var w work
	for _, callers := range []int{1, 2, 3, 300} {
		f := &flight{id: "k", key: "k", done: make(chan struct{})}
		if _, led, err := g.lead(f, &w); err != nil || !led {
			t.Fatalf("lead: %v, %v", led, err)
		}
		for range callers - 1 {
			if j, err := g.find("k"); j != f || err != nil {
				t.Fatalf("find: %p, %v", j, err)
			}
		}
		if n := g.finish(f, answer{val: []byte("v")}); n != callers {
			t.Errorf("finish answered %d callers, want %d", n, callers)
		}
		if len(g.keys) != 0 || g.joinable != 0 {
			t.Fatalf("%d callers: keys %v, joinable %d after finish", callers, g.keys, g.joinable)
		}
	}
	f := &flight{id: "k", key: "k", done: make(chan struct{})}
	g.lead(f, &w)
	g.find("k")
	g.detach("k")
	g.finish(f, answer{})
	if len(g.keys) != 0 || len(g.detached) != 0 || g.joinable != 0 {
		t.Errorf("detached: keys %v, detached %v, joinable %d after finish", g.keys, g.detached, g.joinable)
	}
}

// panicky is an error whose Is method panics, as a user's might.
type panicky struct{}

func (panicky) Error() string { return "panicky" }
func (panicky) Is(error) bool { panic("a user's Is panics") }

// settle runs the user's error's methods (errors.Is, to count the answer).
// If one panics, the panic goes on, but the callers still get their answer
// and the key is left waking nothing.
func TestGroup_SettleAnswersEvenIfTheErrorsIsPanics(t *testing.T) {
	g := group{answers: &counters{}}
	var w work
	f := &flight{id: "k", key: "k", done: make(chan struct{})}
	g.lead(f, &w)
	g.find("k")
	func() {
		defer func() {
			if p := recover(); p == nil {
				t.Error("the panic did not go on")
			}
		}()
		g.finish(f, answer{err: panicky{}})
	}()
	select {
	case <-f.done:
	default:
		t.Fatal("the callers were left waiting")
	}
	if len(g.keys) != 0 {
		t.Errorf("keys %v after the panic", g.keys)
	}
	done := make(chan error, 1)
	go func() { _, err := g.find("k"); done <- err }()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("find: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a new caller of the key waits forever after the panic")
	}
}

// blockingIs's Is tells asked that it runs, then waits for release: it
// holds settle inside outcomeOf, past its first section.
type blockingIs struct {
	asked   chan<- struct{}
	release <-chan struct{}
}

func (blockingIs) Error() string { return "blocking" }
func (e blockingIs) Is(error) bool {
	select {
	case e.asked <- struct{}{}:
	default:
	}
	<-e.release
	return false
}

// settle gives its callers the answer (closes done) before it ends the
// key's waking, which takes the group's lock: callers of the key arriving
// meanwhile wait until the flight's own have their answer. With the two
// the other way round, settle waits here for the lock the test holds, and
// done stays open.
func TestGroup_AKeyStaysWakingUntilItsCallersHaveTheAnswer(t *testing.T) {
	g := group{answers: &counters{}}
	var w work
	f := &flight{id: "k", key: "k", done: make(chan struct{})}
	g.lead(f, &w)
	g.find("k") // a second caller: the flight holds its key while it wakes them
	asked, release := make(chan struct{}, 1), make(chan struct{})
	settled := make(chan struct{})
	go func() {
		defer close(settled)
		g.finish(f, answer{err: blockingIs{asked: asked, release: release}})
	}()
	<-asked // settle is in outcomeOf, the key waking
	g.mu.Lock()
	if g.keys["k"].waking != 1 {
		t.Errorf("keys %v while the flight answers its callers; want k waking 1", g.keys)
	}
	close(release)
	select {
	case <-f.done:
	case <-time.After(5 * time.Second):
		t.Error("settle waited for the group's lock before it gave its callers the answer")
	}
	g.mu.Unlock()
	<-settled
	if len(g.keys) != 0 {
		t.Errorf("keys %v after settle", g.keys)
	}
}

// The group keeps a key's joinable flight and its wake-ups in one entry:
// detaching one key leaves the others' flights joinable, detaching all
// ("", Purge) leaves none, and counts, which the flights gauge reads,
// follows every step, with a key's entry gone once it holds nothing.
func TestGroup_DetachSealAndCountsKeepEachKeysFlight(t *testing.T) {
	var g group
	var w work
	lead := func(key string) *flight {
		t.Helper()
		f := &flight{id: key, key: key, done: make(chan struct{})}
		if _, led, err := g.lead(f, &w); err != nil || !led {
			t.Fatalf("lead(%s): %v, %v", key, led, err)
		}
		return f
	}
	running := func(want int) {
		t.Helper()
		if _, n := g.counts(); n != want {
			t.Errorf("counts: %d flights running, want %d", n, want)
		}
	}
	a, b, c := lead("a"), lead("b"), lead("c")
	running(3)
	g.detach("b")
	if f, _ := g.find("b"); f != nil {
		t.Error("find(b) joined a detached flight")
	}
	if f, _ := g.find("a"); f != a {
		t.Errorf("find(a) = %p, want a's flight %p: detach(b) took it", f, a)
	}
	running(3) // b runs on, detached
	b2 := lead("b")
	running(4)
	g.seal(c)
	g.seal(c) // a second seal changes nothing
	if f, _ := g.find("c"); f != nil {
		t.Error("find(c) joined a sealed flight")
	}
	running(4)
	g.detach("")
	for _, key := range []string{"a", "b", "c"} {
		if f, _ := g.find(key); f != nil {
			t.Errorf("find(%s) joined a flight after detach(\"\")", key)
		}
	}
	running(4)
	for _, f := range []*flight{a, b, c, b2} {
		g.finish(f, answer{})
	}
	running(0)
	if len(g.keys) != 0 || g.joinable != 0 || len(g.detached) != 0 {
		t.Errorf("after every flight finished: keys %v, joinable %d, detached %d", g.keys, g.joinable, len(g.detached))
	}
	d := lead("d")
	if flights, ok := g.close(); !ok || len(flights) != 1 || flights[0] != d {
		t.Errorf("close returned %v, %v; want d's flight alone", flights, ok)
	}
	g.finish(d, answer{})
}

// A holding flight whose callers all left is still the group's, and Close
// finishes it with ErrClosed; its own goroutine, retiring it afterwards
// (an external producer's round that took its lock again), must not make
// it a flight to finish again: finish would close done twice and panic
// (helper-75's review).
func TestGroup_RetireAfterCloseFinishedTheFlightFinishesNothingAgain(t *testing.T) {
	var g group
	var w work
	f := &flight{id: "k", key: "k", done: make(chan struct{})}
	g.lead(f, &w)
	if !g.hold(f, &w) {
		t.Fatal("hold refused a looking flight")
	}
	g.leave(f) // its one caller gave up: a holding flight goes on
	flights, _ := g.close()
	for _, f := range flights {
		g.finish(f, answer{err: ErrClosed})
	}
	if !g.retire(f) {
		t.Error("retire kept a flight that Close finished")
	}
	if f.phase != finished {
		t.Errorf("retire turned a finished flight into phase %v", f.phase)
	}
	defer func() {
		if r := recover(); r != nil {
			t.Fatalf("the flight's own finish after retire: %v", r)
		}
	}()
	if n := g.finish(f, answer{err: errAbandoned}); n != -1 {
		t.Errorf("finish after retire answered %d callers; want -1 (finished already)", n)
	}
}

// wakes counts one more flight of key waking its callers, as settle does
// for a flight with callers to wake. Under mu.
func (g *group) wakes(key string) {
	s := g.keys[key]
	s.waking++
	g.put(key, s)
}
