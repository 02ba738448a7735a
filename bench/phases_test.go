package bench

import (
	"fmt"
	"slices"
	"strconv"
	"testing"
	"time"
)

// childPhases is a child's phases line (see phaseLine), in absolute unix
// ns.
type childPhases struct {
	start      int64
	keys       int
	goroutines int
	fetches    []fetchSpan
	returns    []int64 // by client and goroutine
}

func parsePhases(tb testing.TB, f []string) childPhases {
	tb.Helper()
	n := make([]int64, len(f))
	for i, s := range f {
		v, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			tb.Fatalf("bad phases line: %v", err)
		}
		n[i] = v
	}
	bad := func() { tb.Fatalf("bad phases line (%d fields)", len(f)) }
	if len(n) < 5 {
		bad()
	}
	p := childPhases{start: n[0], keys: int(n[1]), goroutines: int(n[2])}
	nf := int(n[3])
	rest := n[4:]
	if len(rest) < 3*nf+1 {
		bad()
	}
	for i := range nf {
		p.fetches = append(p.fetches, fetchSpan{key: int(rest[3*i]), start: p.start + rest[3*i+1], end: p.start + rest[3*i+2]})
	}
	rest = rest[3*nf:]
	nr := int(rest[0])
	if len(rest) != nr+1 || p.goroutines < 1 || p.keys < 1 {
		bad()
	}
	for _, r := range rest[1:] {
		p.returns = append(p.returns, p.start+r)
	}
	return p
}

// phaseStats collects, over rounds, where a mass miss's time went.
type phaseStats struct {
	first  []float64 // per key: from the round's start to its first fetch's start
	fetch  []float64 // per fetch: how long it ran (the fetch sleeps D)
	own    []float64 // per call in a process that ran a fetch of its key: from the key's first fetch's end to the return
	others []float64 // per call in a process that ran none: the same
	last   []float64 // per round: from the round's start to the last return
}

// add takes in one round's phases (one per child).
func (s *phaseStats) add(ps []childPhases) {
	if len(ps) == 0 {
		return
	}
	start := ps[0].start
	for _, p := range ps {
		start = min(start, p.start)
	}
	keys := ps[0].keys
	firstStart := make([]int64, keys)
	firstEnd := make([]int64, keys)
	ran := make([][]bool, len(ps)) // by child and key
	for i, p := range ps {
		ran[i] = make([]bool, keys)
		for _, f := range p.fetches {
			if firstStart[f.key] == 0 || f.start < firstStart[f.key] {
				firstStart[f.key] = f.start
			}
			if firstEnd[f.key] == 0 || f.end < firstEnd[f.key] {
				firstEnd[f.key] = f.end
			}
			ran[i][f.key] = true
			s.fetch = append(s.fetch, ms(time.Duration(f.end-f.start)))
		}
	}
	for _, t := range firstStart {
		if t != 0 {
			s.first = append(s.first, ms(time.Duration(t-start)))
		}
	}
	var last int64
	for i, p := range ps {
		for j, ret := range p.returns {
			last = max(last, ret)
			k := (j % p.goroutines) % keys
			if firstEnd[k] == 0 {
				continue
			}
			d := ms(time.Duration(ret - firstEnd[k]))
			if ran[i][k] {
				s.own = append(s.own, d)
			} else {
				s.others = append(s.others, d)
			}
		}
	}
	s.last = append(s.last, ms(time.Duration(last-start)))
}

// String gives p50/p90/p99/max of each phase, in ms.
func (s *phaseStats) String() string {
	q := func(xs []float64) string {
		if len(xs) == 0 {
			return "-"
		}
		x := slices.Clone(xs)
		slices.Sort(x)
		at := func(p float64) float64 { return x[min(len(x)-1, int(p*float64(len(x))))] }
		return fmt.Sprintf("%.1f/%.1f/%.1f/%.1f", at(0.5), at(0.9), at(0.99), x[len(x)-1])
	}
	return fmt.Sprintf("p50/p90/p99/max ms: first fetch starts %s; fetch runs %s; calls return after the key's first fetch ends, in its process %s, elsewhere %s; last return %s",
		q(s.first), q(s.fetch), q(s.own), q(s.others), q(s.last))
}
