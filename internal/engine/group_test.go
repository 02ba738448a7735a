package engine

import "testing"

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
