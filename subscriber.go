package memolock

import (
	"context"
	"errors"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// A subscriber owns one go-redis PubSub connection and fans its messages out
// to watches. One goroutine, loop, started by the first watch, reads the
// connection; everything else talks to it through mu, which guards the
// fields below it.
//
// Redis acknowledges SUBSCRIBE asynchronously, and pub/sub is at-most-once:
// anything published before the server has processed our SUBSCRIBE is lost.
// A watch therefore counts as subscribed only when a PING sent after its
// SUBSCRIBE has come back (replies on one connection are ordered), and it is
// told to re-read its key then. After any connection error go-redis dials
// again and re-sends SUBSCRIBE for every channel; the loop then sends a fresh
// PING, and every watch re-reads when its PONG arrives, because whatever was
// published during the gap is gone.
//
// A connection that dies without a reset raises no error. When the
// connection has been silent for health, loop sends a probe PING; if nothing
// arrives for health again, it replaces the PubSub and resyncs likewise.
//
// Marker PINGs are used instead of counting subscribe acknowledgements
// because acknowledgements of an earlier SUBSCRIBE of the same channel (before
// an UNSUBSCRIBE) are indistinguishable from the current one, and because
// go-redis may or may not have re-sent a channel whose SUBSCRIBE failed.
type subscriber struct {
	rdb    redis.UniversalClient
	health time.Duration // idle time after which loop probes the connection
	done   chan struct{} // closed when loop has returned
	stop   chan struct{} // closed by close

	mu       sync.Mutex
	ps       *redis.PubSub // replaced by loop when it finds it dead
	started  bool          // loop runs; it starts with the first watch
	closed   bool
	channels map[string]map[*watch]struct{} // subscribed channels and their watches
	watches  map[*watch]struct{}
	nextSeq  uint64 // sequence number of the next marker PING
	pongSeq  uint64 // highest marker PONG received on the current connection
	resync   bool   // a connection error happened; a marker PING is due

	stats *counters
}

// A watch is one waiter's interest in a few channels. Events accumulate in
// its mailbox and signal is poked without blocking, so a slow waiter never
// stalls the subscriber and never loses a message.
type watch struct {
	s        *subscriber
	channels []string
	signal   chan struct{} // capacity 1

	// Guarded by s.mu.
	needSeq  uint64 // marker that must come back before the watch is live
	live     bool   // subscribed, as far as the server is concerned
	reread   bool   // the watch became live: re-read the key
	messages []*redis.Message
	closed   bool // the subscriber was closed
}

// events is what a watch has collected since the last call to take.
type events struct {
	reread   bool
	messages []*redis.Message
	closed   bool
}

const markerPrefix = "memolock:"

// defaultHealth is how long the pub/sub connection may stay silent before
// loop sends a probe PING; with no answer for as long again, loop replaces the
// connection. It catches connections that died without a reset.
const defaultHealth = 3 * time.Second

func newSubscriber(rdb redis.UniversalClient, stats *counters) *subscriber {
	s := &subscriber{
		rdb:      rdb,
		health:   defaultHealth,
		ps:       rdb.Subscribe(context.Background()),
		done:     make(chan struct{}),
		stop:     make(chan struct{}),
		channels: make(map[string]map[*watch]struct{}),
		watches:  make(map[*watch]struct{}),
		nextSeq:  1,
		stats:    stats,
	}
	return s
}

// watch subscribes to channels (those not yet subscribed) and returns a watch
// that is signalled once the subscription is live and on every message.
func (s *subscriber) watch(channels ...string) *watch {
	w := &watch{s: s, channels: channels, signal: make(chan struct{}, 1)}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		w.closed = true
		w.poke()
		return w
	}
	if !s.started {
		// Connect only when somebody waits: a client that only hits holds
		// no pub/sub connection.
		s.started = true
		go s.loop()
	}
	s.watches[w] = struct{}{}
	var fresh []string
	for _, ch := range channels {
		ws := s.channels[ch]
		if ws == nil {
			ws = make(map[*watch]struct{})
			s.channels[ch] = ws
			fresh = append(fresh, ch)
		}
		ws[w] = struct{}{}
	}
	// Commands are written while holding mu so that SUBSCRIBE, UNSUBSCRIBE
	// and marker PINGs reach the server in the order of our state changes.
	if len(fresh) > 0 {
		s.stats.subscribes.Add(1)
		if err := s.ps.Subscribe(context.Background(), fresh...); err != nil {
			// go-redis remembers the channels even when the write failed,
			// but a reconnect that happened inside that call did not
			// include them yet. A second call either writes them on the
			// new connection or dials one that re-sends them all.
			_ = s.ps.Subscribe(context.Background(), fresh...)
		}
	}
	w.needSeq = s.markLocked()
	return w
}

// markLocked sends a marker PING and returns its sequence number. If the
// write fails the connection is broken, loop sees an error and resyncs.
func (s *subscriber) markLocked() uint64 {
	seq := s.nextSeq
	s.nextSeq++
	s.stats.pings.Add(1)
	_ = s.ps.Ping(context.Background(), markerPrefix+strconv.FormatUint(seq, 10))
	return seq
}

// unwatch drops w and unsubscribes the channels nobody else watches.
func (s *subscriber) unwatch(w *watch) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.watches[w]; !ok {
		return
	}
	delete(s.watches, w)
	var idle []string
	for _, ch := range w.channels {
		ws := s.channels[ch]
		delete(ws, w)
		if len(ws) == 0 {
			delete(s.channels, ch)
			idle = append(idle, ch)
		}
	}
	if len(idle) > 0 && !s.closed {
		s.stats.unsubscribes.Add(1)
		_ = s.ps.Unsubscribe(context.Background(), idle...)
	}
}

// take returns and clears the events collected for w.
func (w *watch) take() events {
	w.s.mu.Lock()
	defer w.s.mu.Unlock()
	ev := events{reread: w.reread, messages: w.messages, closed: w.closed}
	w.reread, w.messages = false, nil
	return ev
}

func (w *watch) poke() {
	select {
	case w.signal <- struct{}{}:
	default:
	}
}

// loop reads the connection until close. Only loop receives, and only loop
// replaces s.ps, so it may read s.ps without mu.
func (s *subscriber) loop() {
	defer close(s.done)
	backoff := time.Duration(0)
	probing := false // a probe PING is out and nothing has arrived since
	for {
		if s.resyncIfDue() != nil {
			if !s.sleep(&backoff) {
				return
			}
			continue
		}
		msg, err := s.ps.ReceiveTimeout(context.Background(), s.health)
		var nerr net.Error
		switch {
		case err == nil:
			backoff, probing = 0, false
			s.dispatch(msg)
		case errors.As(err, &nerr) && nerr.Timeout() && !probing:
			// Silent for a while: ask. go-redis keeps the connection
			// after a ReceiveTimeout timeout.
			probing = true
			s.probe()
		case s.isClosed():
			return
		default:
			if nerr != nil && nerr.Timeout() {
				// No answer to the probe either: the connection died
				// without a reset. Start again on a new one.
				s.replace()
			}
			probing = false
			s.lost()
			if !s.sleep(&backoff) {
				return
			}
		}
	}
}

// probe sends a PING that nothing waits for; any reply proves the
// connection alive.
func (s *subscriber) probe() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stats.pings.Add(1)
	_ = s.ps.Ping(context.Background(), markerPrefix+"probe")
}

// replace swaps a dead PubSub for a new one subscribed to every channel.
func (s *subscriber) replace() {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return
	}
	old := s.ps
	s.ps = s.rdb.Subscribe(context.Background())
	if len(s.channels) > 0 {
		chans := make([]string, 0, len(s.channels))
		for ch := range s.channels {
			chans = append(chans, ch)
		}
		s.stats.subscribes.Add(1)
		// If this write fails, the channels are remembered and the next
		// Receive dials and re-sends them.
		_ = s.ps.Subscribe(context.Background(), chans...)
	}
	s.mu.Unlock()
	_ = old.Close()
}

// sleep waits before the next attempt after an error: go-redis dials again on
// every Receive with no backoff of its own. It returns false on close.
func (s *subscriber) sleep(backoff *time.Duration) bool {
	switch {
	case *backoff == 0:
		*backoff = 5 * time.Millisecond
	case *backoff < 500*time.Millisecond:
		*backoff *= 2
	}
	t := time.NewTimer(*backoff)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-s.stop:
		return false
	}
}

// lost records a connection error: no watch is live until a marker sent on
// the new connection comes back.
func (s *subscriber) lost() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stats.reconnects.Add(1)
	s.resync = true
	s.pongSeq = 0
	for w := range s.watches {
		w.live = false
		w.needSeq = ^uint64(0)
	}
}

// resyncIfDue sends the marker PING that follows a reconnect. go-redis has
// re-sent SUBSCRIBE for every channel before it writes the PING.
func (s *subscriber) resyncIfDue() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.resync || s.closed {
		return nil
	}
	seq := s.nextSeq
	s.nextSeq++
	s.stats.pings.Add(1)
	if err := s.ps.Ping(context.Background(), markerPrefix+strconv.FormatUint(seq, 10)); err != nil {
		return err
	}
	s.resync = false
	for w := range s.watches {
		if !w.live {
			w.needSeq = seq
		}
	}
	return nil
}

func (s *subscriber) dispatch(msg any) {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch m := msg.(type) {
	case *redis.Message:
		for w := range s.channels[m.Channel] {
			w.messages = append(w.messages, m)
			w.poke()
		}
	case *redis.Pong:
		p, ok := strings.CutPrefix(m.Payload, markerPrefix)
		if !ok {
			return
		}
		seq, err := strconv.ParseUint(p, 10, 64)
		if err != nil || seq <= s.pongSeq {
			return
		}
		s.pongSeq = seq
		for w := range s.watches {
			if !w.live && w.needSeq <= seq {
				w.live = true
				w.reread = true
				w.poke()
			}
		}
	}
}

func (s *subscriber) isClosed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closed
}

// close stops loop, closes the connection and wakes every watch.
func (s *subscriber) close() {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		<-s.done
		return
	}
	s.closed = true
	for w := range s.watches {
		w.closed = true
		w.poke()
	}
	started, ps := s.started, s.ps
	s.mu.Unlock()
	close(s.stop)
	_ = ps.Close()
	if !started {
		close(s.done)
	}
	<-s.done
}
