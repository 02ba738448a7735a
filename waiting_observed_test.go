package memolock

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel/codes"
)

// Callers that join a flight with a context that has no Done channel wait
// in Get's, GetResult's or GetExternal's own frame, and end their
// observation in engine.Wait.Answer (helper-71's review of f4768c4). Each
// must end its span and record its duration exactly once, with the
// flight's served and outcome, and so must one that waits inside the
// engine (a context with a Done channel).
func TestWaitingCallers_ObservedOnce(t *testing.T) {
	for _, tc := range []struct {
		name    string
		fail    bool
		closeIt bool
	}{
		{"value", false, false},
		{"error", true, false},
		{"close", false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := miniBackend(t)
			mp, reader := newReader(t)
			c, rec := newTraced(t, srv.addr, "wo"+tc.name, Options{MeterProvider: mp})
			started, release := make(chan struct{}, 1), make(chan struct{})
			fetch := func(ctx context.Context, _ *Lease) ([]byte, time.Duration, error) {
				select {
				case started <- struct{}{}:
				default:
				}
				<-release
				if tc.fail {
					return nil, 0, errors.New("backend down")
				}
				return []byte("v"), 0, nil
			}
			type res struct {
				how    string
				val    string
				served Served
				err    error
			}
			out := make(chan res, 16)
			var wg sync.WaitGroup
			run := func(how string, ctx context.Context) {
				wg.Add(1)
				go func() {
					defer wg.Done()
					switch how {
					case "Get":
						v, err := c.Get(ctx, "x", fetch)
						out <- res{how, string(v), 0, err}
					case "GetResult":
						r, err := c.GetResult(ctx, "x", fetch)
						out <- res{how, string(r.Value), r.Served, err}
					case "GetExternal":
						v, err := c.GetExternal(ctx, "x", func(context.Context, *Lease) error {
							return errors.New("start must not run")
						})
						out <- res{how, string(v), 0, err}
					}
				}()
			}
			run("Get", bg()) // the leader
			<-started
			cctx, cancel := context.WithCancel(bg())
			defer cancel()
			run("Get", bg())
			run("Get", bg())
			run("GetResult", bg())
			run("GetResult", bg())
			run("GetExternal", bg())
			run("Get", cctx) // waits inside the engine, for comparison
			const callers = 7
			eventually(t, 5*time.Second, "callers joining", func() bool { return c.Stats().Coalesced == callers-1 })
			if tc.closeIt {
				// Close answers the callers with ErrClosed at once, then
				// waits for the fetch, which is released once they have.
				closed := make(chan error, 1)
				go func() { closed <- c.Close() }()
				wg.Wait()
				close(release)
				if err := <-closed; err != nil {
					t.Fatal(err)
				}
			} else {
				close(release)
				wg.Wait()
			}
			close(out)
			for r := range out {
				switch {
				case tc.closeIt:
					if !errors.Is(r.err, ErrClosed) {
						t.Errorf("%s: %v, want ErrClosed", r.how, r.err)
					}
				case tc.fail:
					if r.err == nil {
						t.Errorf("%s: no error", r.how)
					}
				default:
					if r.err != nil || r.val != "v" {
						t.Errorf("%s: %q, %v", r.how, r.val, r.err)
					}
					if r.how == "GetResult" && r.served != ServedComputed {
						t.Errorf("GetResult served %v, want computed", r.served)
					}
				}
			}
			gets := spansNamed(rec, "memolock.Get")
			if len(gets) != callers {
				t.Errorf("%d Get spans ended, want %d", len(gets), callers)
			}
			wantResult := "value"
			if tc.fail || tc.closeIt {
				wantResult = "error"
			}
			for _, s := range gets {
				if v, _ := spanAttr(s, "memolock.result"); v.AsString() != wantResult {
					t.Errorf("span result %q, want %q", v.AsString(), wantResult)
				}
				if (wantResult == "error") != (s.Status().Code == codes.Error) {
					t.Errorf("span status %v", s.Status())
				}
			}
			tag := "wo" + tc.name
			rm := collect(t, reader, tag)
			servedLabel := "computed"
			if wantResult == "error" {
				servedLabel = "none"
			}
			if n := histCount(rm, "memolock.get.duration", attr("tag", tag)); n != callers {
				t.Errorf("get.duration counts %d, want %d", n, callers)
			}
			if n := histCount(rm, "memolock.get.duration", attr("served", servedLabel), attr("result", wantResult)); n != callers {
				t.Errorf("get.duration{%s,%s} counts %d, want %d", servedLabel, wantResult, n, callers)
			}
			if n := sum(rm, "memolock.gets", attr("tag", tag)); !tc.closeIt && n != callers {
				t.Errorf("gets = %d, want %d", n, callers)
			}
			if st := c.Stats(); st.Gets != callers {
				t.Errorf("Stats.Gets = %d, want %d", st.Gets, callers)
			}
		})
	}
}

// A flight whose value is a Redis hit, found inline by a leader that cannot
// leave: the leader's Wait is done before Join returns, and is still
// observed once, with 200 concurrent callers.
func TestInlineHits_ObservedOnce(t *testing.T) {
	srv := miniBackend(t)
	mp, reader := newReader(t)
	c, rec := newTraced(t, srv.addr, "woh", Options{MeterProvider: mp})
	if _, err := c.Get(bg(), "h", func(context.Context, *Lease) ([]byte, time.Duration, error) { return []byte("v"), time.Minute, nil }); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	const n = 200
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var err error
			if i%2 == 0 {
				_, err = c.Get(bg(), "h", noFetch)
			} else {
				var r Result
				r, err = c.GetResult(bg(), "h", noFetch)
				if err == nil && r.Served != ServedRedis && r.Served != ServedComputed {
					err = fmt.Errorf("served %v", r.Served)
				}
			}
			if err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	if got := len(spansNamed(rec, "memolock.Get")); got != n+1 {
		t.Errorf("%d Get spans, want %d", got, n+1)
	}
	rm := collect(t, reader, "woh")
	if got := histCount(rm, "memolock.get.duration"); got != n+1 {
		t.Errorf("get.duration counts %d, want %d", got, n+1)
	}
	if st := c.Stats(); st.Gets != n+1 {
		t.Errorf("Stats.Gets = %d, want %d", st.Gets, n+1)
	}
}

// A fetch that asks for its own id with a context without a Done channel is
// refused, not left pending.
func TestReentrantBackgroundGet_IsRefused(t *testing.T) {
	srv := miniBackend(t)
	c, rec := newTraced(t, srv.addr, "wor", Options{})
	var inner error
	_, err := c.Get(bg(), "x", func(ctx context.Context, _ *Lease) ([]byte, time.Duration, error) {
		_, inner = c.Get(bg(), "x", noFetch)
		_, inner2 := c.GetResult(context.Background(), "x", noFetch)
		if inner2 == nil {
			return nil, 0, errors.New("GetResult not refused")
		}
		return []byte("v"), 0, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if !errors.Is(inner, ErrInvalid) {
		t.Fatalf("inner Get: %v, want ErrInvalid", inner)
	}
	if got := len(spansNamed(rec, "memolock.Get")); got != 1 { // refused re-entrant calls are not traced
		t.Errorf("%d Get spans, want 1", got)
	}
}
