package memolock

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"
)

// Close answers callers still waiting with ErrClosed at once (Client.Close:
// "Callers still waiting get ErrClosed at once"), while it waits for the
// fetches it cancelled. That holds for a flight's leader whose context has
// no Done channel too: it waits for its flight's answer, not for the user
// callback the flight runs (fetch, start, OnWait), which may be slow to
// honour its cancellation, or wait for the caller itself.
func TestClose_AnswersALeaderWithoutDoneWhileItsCallbackRuns(t *testing.T) {
	// heldGet starts a Get whose fetch closes started, then holds on until
	// letGo is closed (or 10s), ignoring its context.
	heldGet := func(c *testClient, started, letGo chan struct{}) <-chan error {
		out := make(chan error, 1)
		go func() {
			_, err := c.Get(bg(), "k", func(context.Context, *Lease) ([]byte, time.Duration, error) {
				close(started)
				select {
				case <-letGo:
				case <-time.After(10 * time.Second):
				}
				return []byte("late"), time.Minute, nil
			})
			out <- err
		}()
		return out
	}
	for _, tc := range []struct {
		name string
		// run starts the Get, whose callback closes started, then holds
		// on until letGo is closed (or 10s), ignoring its context.
		run func(c *testClient, started, letGo chan struct{}) <-chan error
	}{
		{name: "fetch", run: heldGet},
		{name: "start", run: func(c *testClient, started, letGo chan struct{}) <-chan error {
			out := make(chan error, 1)
			go func() {
				_, err := c.GetExternal(bg(), "k", func(context.Context, *Lease) error {
					close(started)
					select {
					case <-letGo:
					case <-time.After(10 * time.Second):
					}
					return nil
				})
				out <- err
			}()
			return out
		}},
		{name: "fetch under FailOpen", run: heldGet},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := miniBackend(t)
			opts := &Options{LockTTL: 30 * time.Second}
			if tc.name == "fetch under FailOpen" {
				opts.FailOpen = true
			}
			c := newTestClient(t, b.addr, "closelead", opts)
			started, letGo := make(chan struct{}), make(chan struct{})
			var once sync.Once
			free := func() { once.Do(func() { close(letGo) }) }
			defer free()
			if tc.name == "fetch under FailOpen" {
				b.mini.Close() // Redis out of reach: FailOpen computes without a lock
			}
			got := tc.run(c, started, letGo)
			signalled(t, started, 5*time.Second, "the callback to start")
			closed := make(chan struct{})
			go func() {
				_ = c.Close()
				close(closed)
			}()
			select {
			case err := <-got:
				if !errors.Is(err, ErrClosed) {
					t.Errorf("the leader got %v; want ErrClosed", err)
				}
			case <-time.After(3 * time.Second):
				t.Errorf("the leader (context.Background()) was not answered within 3s of Close, while its %s still ran", tc.name)
			}
			free()
			signalled(t, closed, 5*time.Second, "Close to return once the callback did")
		})
	}
}

// The same for OnWait: a slow OnWait holds its flight, not a leader that
// Close has answered.
func TestClose_AnswersALeaderWithoutDoneWhileOnWaitRuns(t *testing.T) {
	b := miniBackend(t)
	raw := rawClient(t, b.addr)
	raw.Set(bg(), "closewait/lock:k", "someone-else", time.Minute)
	started, letGo := make(chan struct{}), make(chan struct{})
	var once sync.Once
	free := func() { once.Do(func() { close(letGo) }) }
	defer free()
	c := newTestClient(t, b.addr, "closewait", &Options{LockTTL: 30 * time.Second, OnWait: func(string, string) {
		close(started)
		select {
		case <-letGo:
		case <-time.After(10 * time.Second):
		}
	}})
	got := make(chan error, 1)
	go func() {
		_, err := c.Get(bg(), "k", noFetch)
		got <- err
	}()
	signalled(t, started, 5*time.Second, "OnWait to run")
	closed := make(chan struct{})
	go func() {
		_ = c.Close()
		close(closed)
	}()
	select {
	case err := <-got:
		if !errors.Is(err, ErrClosed) {
			t.Errorf("the leader got %v; want ErrClosed", err)
		}
	case <-time.After(3 * time.Second):
		t.Errorf("the leader (context.Background()) was not answered within 3s of Close, while OnWait still ran")
	}
	free()
	signalled(t, closed, 5*time.Second, "Close")
}
