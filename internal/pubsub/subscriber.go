package pubsub

import (
	"context"
	"io"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// Stats counts what subscribers send. A caller passes one in Config and
// reads it whenever it likes; several subscribers may share one.
type Stats struct {
	Subscribes   atomic.Int64 // SUBSCRIBE and SSUBSCRIBE commands
	Unsubscribes atomic.Int64 // UNSUBSCRIBE and SUNSUBSCRIBE commands
	Pings        atomic.Int64 // marker and probe PINGs (a probe follows SUNSUBSCRIBEs that name channels)
	Reconnects   atomic.Int64 // connections replaced after a failure
	// TrackingRefusals counts the connections on which Redis refused
	// tracking (CLIENT TRACKING, or a subscription to the invalidation
	// channel): each leaves the L1 empty until the next connection.
	TrackingRefusals atomic.Int64
}

// Config configures a Subscriber or a Router.
type Config struct {
	// Log takes debug lines on reconnects and warnings on refusals, never
	// a payload. Nil: none.
	Log *slog.Logger
	// Stats counts commands and reconnects. Nil: a private one.
	Stats *Stats
	// Track, if not nil, turns client-side caching on for the keys that
	// start with these prefixes (all keys if it is empty), redirected to
	// the subscriber's own connection: see Subscriber.Tracking.
	Track []string
	// OnInvalidate receives the keys that tracking invalidates, nil for
	// "every key" (FLUSHALL, FLUSHDB). It runs on the reader: it must not
	// block.
	OnInvalidate func(keys []string)
	// OnBreak is called when a connection is found broken or is dialled
	// again: invalidations may have been lost. It must not block.
	OnBreak func()
	// Health is how long a connection may stay silent before a probe PING;
	// with no answer for as long again, it is replaced. 0: 3 s.
	Health time.Duration
}

// A Watcher hands out watches: a Subscriber, or a Router over the masters
// of a cluster.
type Watcher interface {
	// Watch subscribes to channels and returns a watch that gets every
	// message on them, and Reread once the subscription is live. onValue,
	// if not nil, is called by the reader, outside any lock, with each
	// message on channels[0], before the watch is poked.
	Watch(onValue func(payload string), channels ...string) *Watch
	// Channels returns the number of channels subscribed now.
	Channels() int
	// Close stops everything and wakes every watch with Closed. It waits
	// up to d for its goroutines; a call stuck in go-redis ends by
	// go-redis's own timeouts.
	Close(d time.Duration)
}

// conn is what a subscriber uses of a go-redis *PubSub.
type conn interface {
	Subscribe(ctx context.Context, channels ...string) error
	SSubscribe(ctx context.Context, channels ...string) error
	Unsubscribe(ctx context.Context, channels ...string) error
	SUnsubscribe(ctx context.Context, channels ...string) error
	Ping(ctx context.Context, payload ...string) error
	ReceiveTimeout(ctx context.Context, timeout time.Duration) (any, error)
	Close() error
}

const (
	// defaultHealth is Config.Health's default.
	defaultHealth = 3 * time.Second
	// callTimeout bounds each call the owner makes: a dial, or a write.
	callTimeout = 2 * time.Second
	// maxBackoff bounds the pause between two replacements that fail.
	maxBackoff = time.Second
)

// A Subscriber fans the messages of one pub/sub connection out to
// watches; see the package comment for its goroutines.
type Subscriber struct {
	open         func(context.Context) conn // a new connection, not dialled yet
	trackClient  *redis.Client              // the client it made to track, if any; closed by Close
	log          *slog.Logger
	stats        *Stats
	health       time.Duration
	onInvalidate func([]string)
	onBreak      func()
	onMoved      func() // a Router's: reload the slots

	ctx    context.Context // bounds the owner's calls; cancelled by Close
	cancel context.CancelFunc
	kick   chan struct{} // capacity 1: the owner has work
	stop   chan struct{} // closed by Close
	done   chan struct{} // closed when the owner has returned
	reads  sync.WaitGroup

	mu           sync.Mutex
	m            *machine
	started      bool
	trackChanged chan struct{} // closed and replaced when the tracking state changes
	warned       map[string]bool
}

// New returns the Subscriber of a single node (or of the master a
// failover client follows). Unless it tracks, it connects on the first
// watch.
func New(rdb *redis.Client, cfg Config) *Subscriber {
	if cfg.Track != nil {
		return newTracking(rdb, false, cfg)
	}
	return newSubscriber(func(ctx context.Context) conn { return rdb.Subscribe(ctx) }, false, cfg)
}

func newSubscriber(open func(context.Context) conn, sharded bool, cfg Config) *Subscriber {
	ctx, cancel := context.WithCancel(context.Background())
	s := &Subscriber{
		open:         open,
		log:          cfg.Log,
		stats:        cfg.Stats,
		health:       cfg.Health,
		onInvalidate: cfg.OnInvalidate,
		onBreak:      cfg.OnBreak,
		ctx:          ctx,
		cancel:       cancel,
		kick:         make(chan struct{}, 1),
		stop:         make(chan struct{}),
		done:         make(chan struct{}),
		m:            newMachine(sharded),
		trackChanged: make(chan struct{}),
		warned:       make(map[string]bool),
	}
	if s.log == nil {
		s.log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if s.stats == nil {
		s.stats = new(Stats)
	}
	if s.health <= 0 {
		s.health = defaultHealth
	}
	return s
}

// Watch subscribes to channels; see Watcher.
func (s *Subscriber) Watch(onValue func(payload string), channels ...string) *Watch {
	w := newWatch(onValue, slices.Clone(channels))
	if len(channels) == 0 {
		w.box.Err = errNoChannels
		w.poke()
		return w
	}
	w.sub = s
	var fx effects
	s.mu.Lock()
	s.m.watch(w, &fx)
	s.startLocked()
	s.mu.Unlock()
	s.apply(&fx)
	return w
}

// startLocked starts the owner, once: connections start on the first
// watch, so that a client that only hits holds none.
func (s *Subscriber) startLocked() {
	if !s.started && !s.m.closed {
		s.started = true
		go s.run()
	}
}

func (s *Subscriber) unwatch(w *Watch) {
	var fx effects
	s.mu.Lock()
	s.m.unwatch(w, time.Now(), &fx)
	s.mu.Unlock()
	s.apply(&fx)
}

func (s *Subscriber) sync(w *Watch) {
	var fx effects
	s.mu.Lock()
	s.m.sync(w, &fx)
	s.mu.Unlock()
	s.apply(&fx)
}

// Channels returns the number of channels subscribed on the connection.
func (s *Subscriber) Channels() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.m.sent)
}

// Close stops the subscriber; see Watcher.
func (s *Subscriber) Close(d time.Duration) {
	s.shut(d, false)
}

// retire is Close for a subscriber replaced by another: its watches, and
// any that reach it late, are told to move rather than that it closed.
func (s *Subscriber) retire(d time.Duration) {
	s.shut(d, true)
}

func (s *Subscriber) shut(d time.Duration, moved bool) {
	deadline := time.Now().Add(d)
	var fx effects
	s.mu.Lock()
	if s.m.closed {
		s.mu.Unlock()
		return
	}
	if moved {
		s.m.retire(time.Now(), &fx)
	} else {
		s.m.close(&fx)
	}
	started := s.started
	s.mu.Unlock()
	s.cancel()
	close(s.stop)
	s.apply(&fx)
	if started {
		t := time.NewTimer(time.Until(deadline))
		select {
		case <-s.done:
			t.Stop()
			waitUntil(&s.reads, deadline)
		case <-t.C:
		}
	}
	if s.trackClient != nil {
		_ = s.trackClient.Close()
	}
}

// waitUntil waits for wg, or until deadline.
func waitUntil(wg *sync.WaitGroup, deadline time.Time) {
	done := make(chan struct{})
	go func() {
		wg.Wait()
		close(done)
	}()
	t := time.NewTimer(time.Until(deadline))
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
	}
}

func (s *Subscriber) wake() {
	select {
	case s.kick <- struct{}{}:
	default:
	}
}

// apply carries out effects, outside the mutex: mailboxes first, then the
// callbacks that hand values and invalidations over, then the pokes.
func (s *Subscriber) apply(fx *effects) {
	for _, n := range fx.notes {
		n.w.note(n)
	}
	for _, v := range fx.values {
		v.f(v.payload)
	}
	if s.onInvalidate != nil {
		for _, keys := range fx.invalidations {
			s.onInvalidate(keys)
		}
	}
	for _, n := range fx.notes {
		n.w.poke()
	}
	s.logWarnings(fx.warnings)
	if fx.lost != nil {
		s.log.Debug("memolock: the pub/sub connection failed; replacing it, and every waiter looks again", "error", fx.lost)
	}
	if fx.broke && s.onBreak != nil {
		s.onBreak()
	}
	if fx.moved && s.onMoved != nil {
		s.onMoved()
	}
	if fx.trackingRefused {
		s.stats.TrackingRefusals.Add(1)
	}
	if fx.tracking {
		s.mu.Lock()
		close(s.trackChanged)
		s.trackChanged = make(chan struct{})
		s.mu.Unlock()
	}
	if fx.wake {
		s.wake()
	}
}

// logWarnings logs each kind of refusal once as a warning, and again at
// debug level: it is tried again on the next connection.
func (s *Subscriber) logWarnings(ws []warning) {
	for _, w := range ws {
		key := w.what + ": " + w.err.Error()
		s.mu.Lock()
		seen := s.warned[key]
		if !seen && len(s.warned) < 64 {
			s.warned[key] = true
		}
		s.mu.Unlock()
		level := slog.LevelWarn
		if seen {
			level = slog.LevelDebug
		}
		args := []any{"command", w.what, "error", w.err}
		if w.channel != "" {
			args = append(args, "channel", w.channel)
		}
		s.log.Log(context.Background(), level, "memolock: Redis refused a pub/sub command; it is tried again on the next connection", args...)
	}
}

// LiveWatches returns how many watches of channel ch are live: a test's way
// to know that a waiter listens.
func (s *Subscriber) LiveWatches(ch string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for w := range s.m.byChan[ch] {
		if w.state.live {
			n++
		}
	}
	return n
}
