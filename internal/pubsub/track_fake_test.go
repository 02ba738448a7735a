package pubsub

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// trackingFake returns a tracking subscriber on f, whose dials f reports
// as the tracking client's hook would.
func trackingFake(t *testing.T, f *fakeRedis, cfg Config) *Subscriber {
	if cfg.Health == 0 {
		cfg.Health = time.Minute
	}
	s := newSubscriber(f.open, false, cfg)
	f.onDial = s.dialled
	s.startTracker()
	t.Cleanup(func() { s.Close(5 * time.Second) })
	return s
}

func waitTracking(t *testing.T, s *Subscriber) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := s.WaitTracking(ctx); err != nil {
		t.Fatal(err)
	}
}

// invalidations records what OnInvalidate received.
type invalidations struct {
	mu   sync.Mutex
	seen [][]string
}

func (iv *invalidations) add(keys []string) {
	iv.mu.Lock()
	defer iv.mu.Unlock()
	iv.seen = append(iv.seen, keys)
}

func (iv *invalidations) get() [][]string {
	iv.mu.Lock()
	defer iv.mu.Unlock()
	return slices.Clone(iv.seen)
}

func TestTrackingStartsAtOnceAndHandsInvalidationsOver(t *testing.T) {
	f := newFakeRedis()
	var iv invalidations
	s := trackingFake(t, f, Config{OnInvalidate: iv.add})
	waitTracking(t, s)
	f.arrive(item{msg: &redis.Message{Channel: invalidationChannel, PayloadSlice: []string{"t:a"}}})
	waitFor(t, "the invalidation", func() bool { return len(iv.get()) == 1 })
	if got := iv.get()[0]; !slices.Equal(got, []string{"t:a"}) {
		t.Fatalf("invalidated %q", got)
	}
}

func TestTrackingFlushKeepsTheConnection(t *testing.T) {
	f := newFakeRedis()
	var iv invalidations
	s := trackingFake(t, f, Config{OnInvalidate: iv.add})
	waitTracking(t, s)
	epoch, _ := s.Tracking()
	f.arrive(item{err: errors.New("redis: unsupported pubsub message payload: <nil>")})
	waitFor(t, "the flush", func() bool { return len(iv.get()) == 1 })
	if iv.get()[0] != nil {
		t.Fatalf("a flush invalidated %q, not everything", iv.get()[0])
	}
	if e, live := s.Tracking(); e != epoch || !live || s.stats.Reconnects.Load() != 0 {
		t.Fatalf("after a flush: epoch %d (was %d), live %v, reconnects %d", e, epoch, live, s.stats.Reconnects.Load())
	}
}

func TestTrackingEndsOnARedialAndComesBack(t *testing.T) {
	f := newFakeRedis()
	var breaks sync.WaitGroup
	breaks.Add(1)
	var once sync.Once
	s := trackingFake(t, f, Config{OnBreak: func() { once.Do(breaks.Done) }})
	waitTracking(t, s)
	breaks.Wait() // the first dial counts as one: nothing was tracked before it
	epoch, _ := s.Tracking()
	f.inject(fault{kind: redial})
	s.Watch(nil, "a") // its SUBSCRIBE meets the redial
	waitFor(t, "tracking to end", func() bool { e, _ := s.Tracking(); return e != epoch })
	waitTracking(t, s)
	if e, _ := s.Tracking(); e == epoch {
		t.Fatal("tracking came back with the epoch of before the redial")
	}
}
