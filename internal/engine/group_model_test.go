package engine

import (
	"context"
	"math/rand/v2"
	"testing"
)

// A random model of the group: flights' own goroutines, callers, Set and
// Delete, refreshes and Close, in 3,000 seeded orders of the calls the
// mutex allows. Nothing panics, finished never changes, every caller is
// answered, and the counts and work end at zero. It failed on the retire
// that moved a flight out of finished (helper-76's audit).
func TestGroup_ARandomModelOfCallersFlightsAndCloseEndsClean(t *testing.T) {
	for seed := uint64(0); seed < 3000; seed++ {
		r := rand.New(rand.NewPCG(seed, 7))
		var g group
		var w, cb work
		type caller struct {
			f    *flight
			gone bool
		}
		var flights []*flight
		ended := map[*flight]bool{} // its goroutine concluded
		var callers []*caller
		keys := []string{"a", "b"}
		closed := false
		for step := 0; step < 60; step++ {
			switch r.IntN(9) {
			case 0, 1: // a caller
				if closed {
					continue
				}
				k := keys[r.IntN(2)]
				f, err := g.find(k)
				if err != nil {
					continue
				}
				if f == nil {
					nf := &flight{id: k, key: k, done: make(chan struct{})}
					var led bool
					f, led, _ = g.lead(nf, &w)
					if led {
						flights = append(flights, nf)
						g.launch(nf, context.Background())
					}
				}
				callers = append(callers, &caller{f: f})
			case 2: // a caller leaves
				if len(callers) > 0 {
					c := callers[r.IntN(len(callers))]
					if !c.gone {
						if _, left := g.leave(c.f); left {
							c.gone = true
						}
					}
				}
			case 3, 4, 5: // a flight's goroutine acts
				if len(flights) == 0 {
					continue
				}
				f := flights[r.IntN(len(flights))]
				if ended[f] {
					continue
				}
				before := f.phase
				switch r.IntN(6) {
				case 0:
					if g.hold(f, &cb) {
						cb.done()
					}
				case 1:
					if g.retire(f) {
						g.finish(f, answer{err: errAbandoned})
						ended[f] = true
						w.done()
					}
				case 2:
					g.seal(f)
				case 3:
					g.offer(f, []byte("x"))
				case 4:
					g.deliver(f, answer{val: []byte("v")})
				case 5:
					g.finish(f, answer{val: []byte("v")})
					ended[f] = true
					w.done()
				}
				if before == finished && f.phase != finished {
					t.Fatalf("seed %d: phase left finished", seed)
				}
			case 6:
				if r.IntN(2) == 0 {
					g.detach(keys[r.IntN(2)])
					continue
				}
				// a refresh ahead: a background flight
				k := keys[r.IntN(2)]
				rf := &flight{id: k, key: k, kind: forRefresh, done: make(chan struct{})}
				if g.background(rf, context.Background(), &w, &cb) {
					cb.done() // its fetch returns at once
					flights = append(flights, rf)
				}
			case 7:
				if r.IntN(4) == 0 {
					g.detach("")
				}
			case 8:
				if !closed && r.IntN(5) == 0 {
					closed = true
					fs, _ := g.close()
					for _, f := range fs {
						g.finish(f, answer{err: ErrClosed})
					}
				}
			}
			for _, f := range flights {
				if f.refs < 0 {
					t.Fatalf("seed %d: refs %d", seed, f.refs)
				}
			}
		}
		// Everything ends: remaining goroutines conclude.
		for _, f := range flights {
			if !ended[f] {
				g.finish(f, answer{})
				ended[f] = true
				w.done()
			}
		}
		for _, c := range callers {
			if c.gone {
				continue
			}
			select {
			case <-c.f.done:
			default:
				t.Fatalf("seed %d: a caller is never answered", seed)
			}
		}
		if g.joinable != 0 || len(g.detached) != 0 || len(g.keys) != 0 {
			t.Fatalf("seed %d: joinable %d detached %d keys %v", seed, g.joinable, len(g.detached), g.keys)
		}
		if w.n != 0 || cb.n != 0 {
			t.Fatalf("seed %d: work %d callbacks %d", seed, w.n, cb.n)
		}
	}
}
