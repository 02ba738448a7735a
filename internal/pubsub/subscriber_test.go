package pubsub

import (
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// liveWatch watches channels on s and waits until it is live.
func liveWatch(t *testing.T, s *Subscriber, onValue func(string), channels ...string) (*Watch, *collector) {
	t.Helper()
	w := s.Watch(onValue, channels...)
	c := collect(t, w)
	waitFor(t, "the watch to go live", func() bool { return c.get().Reread })
	c.reset()
	return w, c
}

func TestSubscriberConnectsOnlyOnTheFirstWatch(t *testing.T) {
	f := newFakeRedis()
	s := fakeSubscriber(t, f, false, Config{})
	time.Sleep(10 * time.Millisecond) // a coarse check that nothing starts by itself
	if f.opened() != 0 {
		t.Fatal("a subscriber without watches opened a connection")
	}
	liveWatch(t, s, nil, "a")
	if f.opened() != 1 {
		t.Fatalf("opened %d connections", f.opened())
	}
}

func TestSubscriberValueRunsBeforeTheWatchIsPoked(t *testing.T) {
	f := newFakeRedis()
	s := fakeSubscriber(t, f, false, Config{})
	var w *Watch
	var mu sync.Mutex
	var order []string
	w = s.Watch(func(p string) {
		mu.Lock()
		defer mu.Unlock()
		// The signal was drained before the publish: a token now means
		// the watch was poked before its value was handed over.
		order = append(order, fmt.Sprintf("value %s poked=%v", p, len(w.Signal()) > 0))
	}, "n", "e")
	for !w.Take().Reread {
		<-w.Signal()
	}
	select {
	case <-w.Signal():
	default:
	}
	f.publish("n", "v")
	f.publish("e", "not a value")
	waitFor(t, "both messages", func() bool { return len(peek(w).Messages) == 2 })
	mu.Lock()
	defer mu.Unlock()
	if len(order) != 1 || order[0] != "value v poked=false" {
		t.Fatalf("order %q", order)
	}
}

func TestSubscriberSlowWaiterLosesNothing(t *testing.T) {
	f := newFakeRedis()
	s := fakeSubscriber(t, f, false, Config{})
	w := s.Watch(nil, "a")
	waitFor(t, "subscribed", func() bool { return s.Channels() == 1 && w.Take().Reread })
	for i := range 1000 {
		f.publish("a", fmt.Sprint(i))
	}
	var got []*redis.Message
	waitFor(t, "every message", func() bool {
		got = append(got, w.Take().Messages...)
		return len(got) == 1000
	})
	for i, m := range got {
		if m.Payload != fmt.Sprint(i) {
			t.Fatalf("message %d is %q", i, m.Payload)
		}
	}
}

// TestSubscriberSurvivesEveryFaultAtEveryCommand fails each command a
// subscriber sends, in every way a connection can fail, and checks that
// its watches recover: they look again (or carry a refusal that concerns
// them), and receive what is published afterwards.
func TestSubscriberSurvivesEveryFaultAtEveryCommand(t *testing.T) {
	faults := []struct {
		name      string
		ft        fault
		reconnect bool
	}{
		{"write error", fault{kind: writeError}, true},
		{"reconnect inside the call", fault{kind: redial}, true},
		{"BUSY", fault{kind: refuse, err: errBusy}, true},
		{"LOADING", fault{kind: refuse, err: errLoading}, true},
		{"NOPERM", fault{kind: refuse, err: errNoPerm}, false},
		{"silence", fault{kind: silence}, true},
	}
	for _, verb := range []string{verbSubscribe, verbPing, verbUnsubscribe} {
		for _, fc := range faults {
			t.Run(verb+"/"+fc.name, func(t *testing.T) {
				f := newFakeRedis()
				s := fakeSubscriber(t, f, false, Config{Health: 20 * time.Millisecond})
				stats := s.stats
				_, keep := liveWatch(t, s, nil, "keep")
				gone := s.Watch(nil, "gone")
				waitFor(t, "gone live", func() bool { return gone.Take().Reread })
				ft := fc.ft
				ft.verb = verb
				f.inject(ft)
				w := s.Watch(nil, "new1", "new2") // a SUBSCRIBE and a PING
				c := collect(t, w)
				gone.Stop() // an UNSUBSCRIBE
				waitFor(t, "the new watch to go live", func() bool { return c.get().Reread })
				if fc.reconnect && !(verb == verbPing && fc.ft.kind == refuse) { // a refused PING counts as back
					waitFor(t, "a reconnect", func() bool { return stats.Reconnects.Load() > 0 })
					waitFor(t, "the old watch to look again", func() bool { return keep.get().Reread })
				}
				waitFor(t, "the unwatched channel to go", func() bool { return s.Channels() == 3 })
				f.publish("keep", "k")
				f.publish("new1", "n")
				waitFor(t, "messages after the fault", func() bool { return keep.has("k") && c.has("n") })
			})
		}
	}
}

func TestSubscriberRefusedChannelGivesItsWatchesTheError(t *testing.T) {
	f := newFakeRedis()
	s := fakeSubscriber(t, f, false, Config{})
	f.inject(fault{verb: verbSubscribe, kind: refuse, err: errNoPerm})
	f.inject(fault{verb: verbSubscribe, kind: refuse, err: errNoPerm})
	w := s.Watch(nil, "secret")
	c := collect(t, w)
	waitFor(t, "the refusal", func() bool { return c.get().Err != nil })
	if !errors.Is(c.get().Err, errNoPerm) || c.get().Reread {
		t.Fatalf("events %+v", c.get())
	}
	if f.count(verbSubscribe) != 1 {
		t.Fatalf("a channel refused alone was sent %d times", f.count(verbSubscribe))
	}
}

func TestSubscriberGivesUpASilentConnection(t *testing.T) {
	f := newFakeRedis()
	s := fakeSubscriber(t, f, false, Config{Health: 20 * time.Millisecond})
	_, c := liveWatch(t, s, nil, "a")
	pings := s.stats.Pings.Load()
	f.inject(fault{kind: silence})
	f.publish("a", "lost")
	waitFor(t, "a probe", func() bool { return s.stats.Pings.Load() > pings })
	waitFor(t, "a reconnect and a reread", func() bool { return s.stats.Reconnects.Load() == 1 && c.get().Reread })
	f.publish("a", "after")
	waitFor(t, "a message on the new connection", func() bool { return c.has("after") })
}

func TestBackoffDoublesFromFiveMillisecondsToOneSecond(t *testing.T) {
	var got []time.Duration
	d := time.Duration(0)
	for range 10 {
		d = nextBackoff(d)
		got = append(got, d)
	}
	want := []time.Duration{5, 10, 20, 40, 80, 160, 320, 640, 1000, 1000}
	for i := range want {
		if got[i] != want[i]*time.Millisecond {
			t.Fatalf("backoffs %v", got)
		}
	}
}

func TestSubscriberFirstRetryIsImmediateAndAMarkerResetsTheBackoff(t *testing.T) {
	f := newFakeRedis()
	s := fakeSubscriber(t, f, false, Config{})
	_, c := liveWatch(t, s, nil, "a")
	for i := 1; i <= 3; i++ {
		// Each failure follows a connection that worked: no pause, ever.
		start := time.Now()
		f.inject(fault{verb: verbPing, kind: writeError})
		s.Watch(nil, fmt.Sprint("b", i))
		waitFor(t, "a reread", func() bool { return c.get().Reread })
		if d := time.Since(start); d > 500*time.Millisecond {
			t.Fatalf("recovery %d took %v: the backoff was not reset by the marker", i, d)
		}
		c.reset()
	}
}

// peek returns the watch's mailbox without taking it.
func peek(w *Watch) Events {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.box
}
