package memolock

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/memolock/memolock/internal/wire"
	"github.com/redis/go-redis/v9"
)

// endsHolderBeforeLookup ends the holder's lock on key with event (by the
// release script, as a failing holder does) just before the waiter's second
// lookup of key reaches Redis, the one its subscription going live makes
// (the first found the holder and subscribed): the holder's news is then
// published before the lookup runs, and reaches the waiter's connection
// while its flight is busy with that lookup. This is the moment a renewing
// holder's failure meets the waiters' timers (issue 15, defect 1).
type endsHolderBeforeLookup struct {
	raw        *redis.Client
	keys       wire.Keys
	id, holder string
	event      string
	lookups    atomic.Int64
	fired      atomic.Bool
}

func (h *endsHolderBeforeLookup) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *endsHolderBeforeLookup) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		args := cmd.Args()
		if len(args) > 3 && (cmd.Name() == "evalsha" || cmd.Name() == "eval") && args[3] == h.keys.Value(h.id) && h.lookups.Add(1) == 2 {
			_ = wire.ScriptsFor(false).Release.Run(ctx, h.raw, []string{h.keys.Lock(h.id), h.keys.Value(h.id)},
				h.holder, h.keys.Events(h.id), h.event, 0).Err()
			h.fired.Store(true)
		}
		return next(ctx, cmd)
	}
}
func (h *endsHolderBeforeLookup) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

type answerOf struct {
	v   []byte
	err error
}

// A waiter whose lookup takes a lock that its holder released, with a
// failure, in that very moment honours the failure instead of computing,
// and passes it on under its own token.
func TestGet_TakeoverHonoursTheHolderFailureAlreadyOnItsConnection(t *testing.T) {
	for _, tc := range []struct {
		name  string
		event func(holder string) string
		check func(t *testing.T, v []byte, err error)
	}{
		{"fail", func(h string) string { return wire.FailText(h, "db timed out after 5s") }, func(t *testing.T, v []byte, err error) {
			if !errors.Is(err, ErrHolderFailed) || !strings.Contains(err.Error(), "db timed out after 5s") {
				t.Errorf("Get = %q, %v; want ErrHolderFailed with the holder's message", v, err)
			}
		}},
		{"notfound", wire.NotFoundEvent, func(t *testing.T, v []byte, err error) {
			if !errors.Is(err, ErrNotFound) {
				t.Errorf("Get = %q, %v; want ErrNotFound", v, err)
			}
		}},
		{"abandon", wire.AbandonEvent, func(t *testing.T, v []byte, err error) {
			if err != nil || string(v) != "computed" {
				t.Errorf("Get = %q, %v; an abandoned lock is a genuine takeover: want it computed", v, err)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := realBackend(t)
			raw := rawClient(t, b.addr)
			keys := wire.NewKeys("to")
			raw.Set(bg(), keys.Lock("k"), "holderH", 30*time.Second)
			// Loaded, so that each lookup is one EVALSHA for the hook to count.
			raw.ScriptLoad(bg(), wire.AcquireSrc)
			hook := &endsHolderBeforeLookup{raw: raw, keys: keys, id: "k", holder: "holderH", event: tc.event("holderH")}
			c := newTestClientOn(t, &redis.Options{Addr: b.addr}, "to", &Options{LockTTL: 30 * time.Second})
			c.rdb.AddHook(hook)
			events := raw.Subscribe(bg(), keys.Events("k"))
			defer events.Close()
			if _, err := events.Receive(bg()); err != nil {
				t.Fatal(err)
			}
			var calls atomic.Int64
			fetch := func(context.Context, *Lease) ([]byte, time.Duration, error) {
				calls.Add(1)
				return []byte("computed"), time.Minute, nil
			}
			got := make(chan answerOf, 1)
			go func() {
				v, err := c.Get(bg(), "k", fetch)
				got <- answerOf{v, err}
			}()
			var a answerOf
			select {
			case a = <-got:
			case <-time.After(10 * time.Second):
				t.Fatal("no answer 10s after the holder ended (the lock TTL is 30s)")
			}
			if !hook.fired.Load() {
				t.Fatal("the holder was not ended before a lookup: the test did not exercise the takeover")
			}
			tc.check(t, a.v, a.err)
			if tc.name == "abandon" {
				return
			}
			if n := calls.Load(); n != 0 {
				t.Fatalf("fetch ran %d times after the holder's %s; want 0", n, tc.name)
			}
			// Waiters that saw this waiter as the holder hear the same news
			// under its token, and the lock it took is gone.
			ctx, cancel := context.WithTimeout(bg(), 5*time.Second)
			defer cancel()
			for {
				m, err := events.ReceiveMessage(ctx)
				if err != nil {
					t.Fatalf("no event from the waiter: %v", err)
				}
				kind, token, _ := wire.ParseEvent(m.Payload)
				if token == "holderH" {
					continue // the holder's own
				}
				if kind != tc.name {
					t.Errorf("the waiter passed on %q; want a %s event", m.Payload, tc.name)
				}
				break
			}
			if n := raw.Exists(bg(), keys.Lock("k")).Val(); n != 0 {
				t.Errorf("the lock the waiter took is still there")
			}
		})
	}
}

// A holder that dies leaves its waiters to look again as their timers fire,
// one after the other (they are spread on purpose). The first takes the lock
// over; if its fetch fails, it tells the dead holder's waiters too, so that
// they fail at once instead of each taking the lock in turn and running the
// failing fetch again.
func TestGet_TakeoverFailureReachesTheDeadHoldersWaiters(t *testing.T) {
	b := realBackend(t)
	raw := rawClient(t, b.addr)
	keys := wire.NewKeys("dh")
	raw.Set(bg(), keys.Lock("k"), "dead-holder", 3*time.Second)
	var calls atomic.Int64
	fetch := func(context.Context, *Lease) ([]byte, time.Duration, error) {
		calls.Add(1)
		return nil, 0, errors.New("the database refuses")
	}
	const waiters = 4
	got := make(chan error, waiters)
	for range waiters {
		c := newTestClient(t, b.addr, "dh", &Options{LockTTL: 3 * time.Second})
		go func() {
			_, err := c.Get(bg(), "k", fetch)
			got <- err
		}()
		eventually(t, 5*time.Second, "the waiter to listen", func() bool { return c.e.LiveWatches(keys.Notif("k")) > 0 })
	}
	for range waiters {
		select {
		case err := <-got:
			if err == nil || !strings.Contains(err.Error(), "the database refuses") {
				t.Errorf("a waiter got %v; want the failure", err)
			}
		case <-time.After(20 * time.Second):
			t.Fatal("a waiter had no answer 20s after the dead holder's lock expired")
		}
	}
	if n := calls.Load(); n != 1 {
		t.Errorf("the failing fetch ran %d times among %d waiters of a dead holder; want once", n, waiters)
	}
}
