package pubsub

import (
	"context"
	"errors"
	"testing"
	"time"
)

func TestCloseWakesEveryWatchAndRefusesLaterOnes(t *testing.T) {
	f := newFakeRedis()
	s := fakeSubscriber(t, f, false, Config{})
	_, live := liveWatch(t, s, nil, "a")
	pending := collect(t, s.Watch(nil, "b")) // may not be live yet
	s.Close(time.Second)
	waitFor(t, "closed events", func() bool { return live.get().Closed && pending.get().Closed })
	late := s.Watch(nil, "c")
	if !late.Take().Closed {
		t.Fatal("a watch after Close was not told so")
	}
	late.Stop()
	late.Sync()
	s.Close(time.Second) // a second Close is harmless
}

func TestCloseOfASubscriberNeverStartedStartsNothing(t *testing.T) {
	f := newFakeRedis()
	s := newSubscriber(f.open, false, Config{})
	s.Close(time.Second)
	if f.opened() != 0 {
		t.Fatal("Close opened a connection")
	}
}

// TestCloseIsBoundedWhileACallIsStuck closes a subscriber whose owner is
// stuck in go-redis: Close returns after its bound, and the goroutines end
// when the call does (goleak checks that they did).
func TestCloseIsBoundedWhileACallIsStuck(t *testing.T) {
	f := newFakeRedis()
	s := newSubscriber(f.open, false, Config{})
	f.inject(fault{verb: verbSubscribe, kind: hang})
	w := s.Watch(nil, "a")
	<-f.hung
	start := time.Now()
	s.Close(50 * time.Millisecond)
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("Close took %v with a bound of 50ms", d)
	}
	if !w.Take().Closed {
		t.Fatal("the watch was not closed")
	}
	close(f.hang)
	<-s.done
	s.reads.Wait()
}

// TestCloseDuringEveryStep closes a subscriber at each step of its life;
// goleak checks that nothing outlives it, and every watch hears of it.
func TestCloseDuringEveryStep(t *testing.T) {
	steps := map[string]func(f *fakeRedis, s *Subscriber){
		"before any call":  func(*fakeRedis, *Subscriber) {},
		"during a backoff": func(f *fakeRedis, s *Subscriber) { failTwice(f, s) },
		"while reading": func(f *fakeRedis, s *Subscriber) {
			waitFor(t, "live", func() bool { return s.Channels() == 1 && f.count(verbPing) > 0 })
		},
		"while silent": func(f *fakeRedis, s *Subscriber) {
			f.inject(fault{kind: silence})
			s.Watch(nil, "b")
		},
	}
	for name, step := range steps {
		t.Run(name, func(t *testing.T) {
			f := newFakeRedis()
			s := newSubscriber(f.open, false, Config{Health: 10 * time.Millisecond})
			w := s.Watch(nil, "a")
			step(f, s)
			s.Close(5 * time.Second)
			if !w.Take().Closed {
				t.Fatal("the watch was not closed")
			}
			select {
			case <-s.done:
			default:
				t.Fatal("the owner outlived Close")
			}
		})
	}
}

// failTwice makes two replacements in a row fail, so that the owner
// pauses before the third.
func failTwice(f *fakeRedis, s *Subscriber) {
	f.inject(fault{kind: writeError})
	f.inject(fault{kind: writeError})
	f.inject(fault{kind: writeError})
	for s.stats.Reconnects.Load() < 2 {
		time.Sleep(time.Millisecond)
	}
}

func TestWaitTrackingAnswersAtOnceWhenItCannotSucceed(t *testing.T) {
	f := newFakeRedis()
	s := fakeSubscriber(t, f, false, Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := s.WaitTracking(ctx); !errors.Is(err, errNotTracking) {
		t.Fatalf("WaitTracking on a subscriber that does not track: %v", err)
	}
	tr := trackingFake(t, f, Config{})
	tr.Close(time.Second)
	if err := tr.WaitTracking(ctx); !errors.Is(err, ErrClosed) {
		t.Fatalf("WaitTracking after Close: %v", err)
	}
}
