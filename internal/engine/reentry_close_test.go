package engine

import "testing"

// A fetch asks for its own id (a reentrant Get) just as Close finishes its
// flight: find joined the flight before Close, and reentered drops the
// call again after. Close's finish counted the call with the flight's
// callers; the reentry error must not be counted once more (Join counts
// any error it returns), or Stats.Gets says three answers for two calls.
// The call takes the flight's answer, which waits for nothing (helper-76's
// audit).
func TestEngine_AReentryAfterCloseFinishedItsFlightIsCountedOnce(t *testing.T) {
	e := &Engine{}
	e.flights.answers = &e.stats
	f := &flight{id: "k", key: "k", done: make(chan struct{})}
	if _, led, _ := e.flights.lead(f, &e.work); !led { // the first caller
		t.Fatal("lead")
	}
	if !e.flights.hold(f, &e.callbacks.pending) { // its fetch is about to run
		t.Fatal("hold")
	}
	// The fetch runs on this goroutine, and asks for its own id.
	e.callbacks.enter(goid(), []*flight{f})
	defer e.callbacks.leave(goid())
	j, err := e.flights.find("k") // Join: find, then joinFound
	if j != f || err != nil {
		t.Fatalf("find = %v, %v", j, err)
	}
	// Close, between the two.
	flights, _ := e.flights.close()
	for _, g := range flights {
		e.flights.finish(g, answer{err: ErrClosed})
	}
	if err := e.joinFound(&callSpan{}, j); err != nil {
		e.stats.answered(0, err) // as Join does for an error of joinFound
	}
	if _, total := e.AnswerCounts(); total != 2 {
		t.Errorf("answers counted for 2 calls (the leader, the reentrant call): %d", total)
	}
}
