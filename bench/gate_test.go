package bench

import (
	"bufio"
	"strings"
	"testing"
)

// The heap a child reports for a round is what its calls allocated, as its
// CPU time is: not what the profiler allocates as it starts and stops
// (writing the profiles), nor the collections it forces for the allocations
// profile, which would swamp a cut of a few percent in a profiled round.
func TestGate_ProfilerIsNotCountedInTheRound(t *testing.T) {
	prof := &profiler{dir: t.TempDir(), name: "t", kinds: []string{"cpu", "trace", "block", "mutex", "allocs"}}
	in := bufio.NewScanner(strings.NewReader("go\n"))
	r, err := gate(in, []peer{nil}, prof, "round", 1, func(peer, int) (int64, int64) { return 1, 0 })
	if err != nil {
		t.Fatal(err)
	}
	// The calls allocate nothing: what is left is the runtime's own, and
	// the trace's writer, far from the megabytes that writing the
	// profiles takes. (A collection may still end in the round: the
	// profiler's start allocated just before it.)
	if r.bytes > 64<<10 || r.allocs > 256 {
		t.Errorf("a round whose calls allocate nothing reported %d bytes in %d objects", r.bytes, r.allocs)
	}
}
