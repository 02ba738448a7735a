package memolock

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// A subscriber fans the messages of one pub/sub connection out to watches.
//
// One goroutine, run, owns the connection: it alone makes the calls that
// write to it (SUBSCRIBE, UNSUBSCRIBE, PING) and it alone replaces it. A
// second goroutine, read, only receives, and hands each message to the
// watches of its channel. Both take mu to read or change the state below it,
// and neither holds mu across a network call. Watches ask for changes by
// editing that state and waking run, which sends whatever has accumulated as
// one SUBSCRIBE, one PING and one UNSUBSCRIBE.
//
// Redis acknowledges SUBSCRIBE asynchronously, and pub/sub is at-most-once:
// whatever is published before the server has processed our SUBSCRIBE is
// lost. A watch therefore counts as live only once a PING sent after its
// SUBSCRIBE has come back (replies on one connection are ordered), and it is
// told then to re-read its key.
//
// go-redis reconnects and resubscribes inside any PubSub call that meets a
// broken connection, Subscribe and Ping as well as Receive; a reader then
// goes on reading the new connection with no error in sight, and what was
// published in the gap is gone. So every error from every call, and every
// subscription acknowledgement we did not ask for, means "connection
// replaced": run closes that PubSub, opens a new one, subscribes every
// channel again, and every watch re-reads once the next PING comes back.
//
// A connection that dies without a reset raises no error. After health of
// silence run sends a probe PING, and if nothing arrives for health again,
// read gives the connection up.
type subscriber struct {
	open    func(context.Context) *redis.PubSub // a new PubSub, not yet connected
	onBreak func()                              // if set, called when a connection is found broken (the L1)
	// sharded is set for one node of a cluster: SSUBSCRIBE and SUNSUBSCRIBE,
	// one command per slot, and a channel whose slot the node does not
	// serve (any more) sends its watches elsewhere (see shards).
	sharded bool

	// With an L1: the watch of the invalidation channel, and whether the
	// current connection is known to track (its subscription to that
	// channel is live, and nothing broke or dialled since). trackEpoch
	// counts the times it stopped being so. Guarded by mu.
	trackWatch *watch
	trackLive  bool
	trackEpoch uint64
	stats      *counters
	log        *slog.Logger // debug lines on reconnects
	health     time.Duration

	ctx    context.Context // bounds run's calls; cancelled by close
	cancel context.CancelFunc
	kick   chan struct{} // capacity 1: run has work
	stop   chan struct{} // closed by close
	done   chan struct{} // closed when run has returned
	reads  sync.WaitGroup

	mu       sync.Mutex
	later    bool // a wake-up for run is due after unsubscribeDelay
	started  bool
	closed   bool
	all      map[*watch]struct{}
	watches  map[string]map[*watch]struct{} // channel: its watches; what must be subscribed
	dirty    map[string]struct{}            // channels whose watches changed since run last looked
	sent     map[string]struct{}            // channels subscribed on the current connection
	solo     map[string]struct{}            // channels to subscribe one per command: a SUBSCRIBE of several was refused
	unmarked []*watch                       // watches that need a marker PING
	marked   []marked                       // watches whose marker is out, in marker order
	acks     []sentCmd                      // commands whose replies are due on the current connection, in order
	gen      uint64                         // the current connection; every replacement adds one
	broken   bool                           // the current connection failed: replace it
	probe    bool                           // a probe PING is due
	heard    bool                           // something arrived since run last looked
	nextSeq  uint64                         // sequence number of the next marker
	pongSeq  uint64                         // highest marker back on the current connection
}

// A watch is one waiter's interest in a few channels. Events accumulate in
// its mailbox and signal is poked without blocking, so a slow waiter never
// stalls the subscriber and never loses a message.
type watch struct {
	channels []string
	signal   chan struct{} // capacity 1
	// onValue, if set, is called by read with each message on channels[0],
	// outside mu: the fast path by which a value reaches callers.
	onValue func(payload string)

	s *subscriber // the one that serves it

	// Guarded by subscriber.mu.
	seq      uint64 // the marker that makes the watch live; 0 until sent
	live     bool
	reread   bool
	moved    bool // sharded: the node does not serve its slot; watch again elsewhere
	messages []*redis.Message
	err      error // Redis refused to subscribe a channel of the watch
	closed   bool  // the subscriber was closed
	gone     bool  // unwatched
}

// events is what a watch has collected since the last call to take.
type events struct {
	reread   bool
	moved    bool // watch again, through shards
	messages []*redis.Message
	err      error
	closed   bool
}

// marked is a watch waiting for marker seq. A watch waits for a later
// marker when its subscription is tried again: the entry is then stale.
type marked struct {
	w   *watch
	seq uint64
}

// sentCmd is a command the connection owes replies for, in order: a
// SUBSCRIBE or UNSUBSCRIBE (one acknowledgement per channel) or a PING (one
// reply; args holds its payload), or else one error reply.
type sentCmd struct {
	kind  string
	args  []string
	acked int
}

const markerPrefix = "memolock:"

const (
	// defaultHealth is how long the connection may stay silent before run
	// sends a probe PING; with no answer for as long again, the connection
	// is replaced. It catches connections that died without a reset.
	defaultHealth = 3 * time.Second
	// pubsubTimeout bounds each call run makes: a dial, or a write.
	pubsubTimeout = 2 * time.Second
	// maxBackoff bounds the pause between two replacements that fail.
	maxBackoff = time.Second
)

func newSubscriber(rdb redis.UniversalClient, stats *counters) *subscriber {
	return newSubscriberOn(func(ctx context.Context) *redis.PubSub { return rdb.Subscribe(ctx) }, false, stats)
}

// newSubscriberOn is a subscriber whose connections open makes: a node's
// sharded pub/sub when sharded is set.
func newSubscriberOn(open func(context.Context) *redis.PubSub, sharded bool, stats *counters) *subscriber {
	ctx, cancel := context.WithCancel(context.Background())
	return &subscriber{
		open:    open,
		sharded: sharded,
		stats:   stats,
		log:     discard,
		health:  defaultHealth,
		ctx:     ctx,
		cancel:  cancel,
		kick:    make(chan struct{}, 1),
		stop:    make(chan struct{}),
		done:    make(chan struct{}),
		all:     make(map[*watch]struct{}),
		watches: make(map[string]map[*watch]struct{}),
		dirty:   make(map[string]struct{}),
		sent:    make(map[string]struct{}),
		solo:    make(map[string]struct{}),
		nextSeq: 1,
	}
}

// watch subscribes to channels and returns a watch that is told to re-read
// once the subscription is live, and gets every message on them. onValue
// may be nil.
func (s *subscriber) watch(onValue func(string), channels ...string) *watch {
	return s.addWatch(&watch{channels: channels, signal: make(chan struct{}, 1), onValue: onValue})
}

func (s *subscriber) addWatch(w *watch) *watch {
	w.s = s
	s.mu.Lock()
	if s.closed {
		w.closed = true
		s.mu.Unlock()
		w.poke()
		return w
	}
	if !s.started {
		// Connect only when somebody waits: a client that only hits holds
		// no pub/sub connection.
		s.started = true
		go s.run()
	}
	s.all[w] = struct{}{}
	for _, ch := range w.channels {
		ws := s.watches[ch]
		if ws == nil {
			ws = make(map[*watch]struct{})
			s.watches[ch] = ws
		}
		if _, ok := s.sent[ch]; !ok {
			s.dirty[ch] = struct{}{}
		}
		ws[w] = struct{}{}
	}
	s.unmarked = append(s.unmarked, w)
	s.mu.Unlock()
	s.wake()
	return w
}

// watchTracking is watch for the L1's invalidation channel: its
// subscription going live marks the connection as tracking.
func (s *subscriber) watchTracking(channel string) *watch {
	w := &watch{channels: []string{channel}, signal: make(chan struct{}, 1)}
	s.mu.Lock()
	s.trackWatch = w
	s.mu.Unlock()
	return s.addWatch(w)
}

// unwatch drops w; channels nobody watches any more are unsubscribed.
func (s *subscriber) unwatch(w *watch) {
	s.mu.Lock()
	if w.gone || w.closed {
		s.mu.Unlock()
		return
	}
	w.gone = true
	delete(s.all, w)
	for _, ch := range w.channels {
		ws := s.watches[ch]
		delete(ws, w)
		if len(ws) == 0 {
			delete(s.watches, ch)
			delete(s.solo, ch)
			s.dirty[ch] = struct{}{}
		}
	}
	s.mu.Unlock()
	s.wakeLater()
}

// take returns and clears the events collected for w.
func (s *subscriber) take(w *watch) events {
	s.mu.Lock()
	defer s.mu.Unlock()
	ev := events{reread: w.reread, moved: w.moved, messages: w.messages, err: w.err, closed: w.closed}
	w.reread, w.moved, w.messages = false, false, nil
	return ev
}

func (w *watch) poke() {
	select {
	case w.signal <- struct{}{}:
	default:
	}
}

func (s *subscriber) wake() {
	select {
	case s.kick <- struct{}{}:
	default:
	}
}

// unsubscribeDelay is how long an UNSUBSCRIBE may wait: long enough that the
// callers a value just woke run first, and that the unsubscribes of many
// waits that end together go out as one command.
const unsubscribeDelay = 2 * time.Millisecond

// wakeLater wakes run after unsubscribeDelay, unless such a wake-up is
// due already.
func (s *subscriber) wakeLater() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.later || s.closed {
		return
	}
	s.later = true
	time.AfterFunc(unsubscribeDelay, func() {
		s.mu.Lock()
		s.later = false
		s.mu.Unlock()
		s.wake()
	})
}

// plan is what run sends next.
type plan struct {
	gen     uint64
	replace bool       // the connection failed: close it first
	heard   bool       // a marker came back since: the connection works
	subs    [][]string // SUBSCRIBE these, one command each
	marker  uint64     // then PING this marker (0: none)
	unsub   [][]string // then UNSUBSCRIBE these, one command each
	probe   bool       // then PING to probe
}

func (p *plan) empty() bool {
	return len(p.subs) == 0 && p.marker == 0 && len(p.unsub) == 0 && !p.probe
}

// run owns the connection: it sends what watches need, and replaces the
// connection when it fails.
func (s *subscriber) run() {
	defer close(s.done)
	var (
		ps      *redis.PubSub
		reading bool // read runs on ps
		backoff time.Duration
	)
	defer func() {
		if ps != nil {
			_ = ps.Close()
		}
	}()
	var lastSend time.Time
	for {
		select {
		case <-s.kick:
		case <-s.stop:
			return
		}
		if time.Since(lastSend) < burstWindow && !s.gather() {
			return
		}
		for {
			p := s.plan()
			if p.heard {
				backoff = 0
			}
			if p.replace {
				if ps != nil {
					_ = ps.Close() // ends its read
					ps, reading = nil, false
				}
				s.stats.reconnects.Add(1)
				s.log.Debug("memolock: replacing the pub/sub connection after an error; every waiter looks again")
				if !s.pause(&backoff) {
					return
				}
			}
			if p.empty() {
				break
			}
			if ps == nil {
				ps = s.open(s.ctx) // no channels: no I/O yet
			}
			lastSend = time.Now()
			if err := s.send(ps, p); err != nil {
				if s.sharded && p.replace {
					// The node does not answer on a new connection: it
					// may be gone for good (a failover). Its watches go
					// where the cluster now says their slots are.
					s.rehome()
				}
				s.fail(p.gen)
				continue
			}
			if !reading {
				reading = true
				s.reads.Add(1)
				go s.read(ps, p.gen)
			}
		}
	}
}

// burstWindow and gatherDelay batch the subscriptions of a burst of waits
// (10,000 keys expiring at once): when run sent something less than
// burstWindow ago, it waits gatherDelay for more before it sends again, so
// that one SUBSCRIBE, one marker and one UNSUBSCRIBE serve many keys. A
// wait that comes alone is sent at once.
const (
	burstWindow = 5 * time.Millisecond
	gatherDelay = time.Millisecond
)

// gather waits gatherDelay; it returns false on close.
func (s *subscriber) gather() bool {
	t := time.NewTimer(gatherDelay)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-s.stop:
		return false
	}
}

// plan decides, under mu, what run sends next, and records it as sent.
func (s *subscriber) plan() plan {
	s.mu.Lock()
	defer s.mu.Unlock()
	var p plan
	if s.broken {
		// Start again on a new connection: every channel is subscribed
		// again and every watch waits for a new marker.
		s.broken, s.probe = false, false
		s.gen++
		p.replace = true
		clear(s.sent)
		s.acks, s.marked, s.unmarked, s.pongSeq = nil, nil, s.unmarked[:0], 0
		for ch := range s.watches {
			s.dirty[ch] = struct{}{}
		}
		for w := range s.all {
			w.live, w.seq = false, 0
			s.unmarked = append(s.unmarked, w)
		}
	}
	p.gen, p.heard, s.heard = s.gen, s.heard, false
	var batch []string
	var unsub []string
	for ch := range s.dirty {
		_, want := s.watches[ch]
		_, have := s.sent[ch]
		_, solo := s.solo[ch]
		switch {
		case want && !have && solo:
			p.subs = append(p.subs, []string{ch})
			s.sent[ch] = struct{}{}
		case want && !have:
			batch = append(batch, ch)
			s.sent[ch] = struct{}{}
		case !want && have:
			unsub = append(unsub, ch)
			delete(s.sent, ch)
		}
	}
	clear(s.dirty)
	p.subs = append(s.group(batch), p.subs...)
	p.unsub = s.group(unsub)
	for _, chans := range p.subs {
		s.acks = append(s.acks, sentCmd{kind: s.kind("subscribe"), args: chans})
	}
	for _, w := range s.unmarked {
		if w.gone {
			continue
		}
		if p.marker == 0 {
			p.marker = s.nextSeq
			s.nextSeq++
		}
		w.seq = p.marker
		s.marked = append(s.marked, marked{w, p.marker})
	}
	clear(s.unmarked)
	s.unmarked = s.unmarked[:0]
	if p.marker != 0 {
		s.acks = append(s.acks, sentCmd{kind: "ping", args: []string{markerPrefix + strconv.FormatUint(p.marker, 10)}})
	}
	for _, chans := range p.unsub {
		s.acks = append(s.acks, sentCmd{kind: s.kind("unsubscribe"), args: chans})
	}
	p.probe, s.probe = s.probe, false
	if p.probe {
		s.acks = append(s.acks, sentCmd{kind: "ping", args: []string{markerPrefix + "probe"}})
	}
	return p
}

// group makes commands of chans: one, or, sharded, one per hash tag (a
// command whose channels span slots is refused; channels with one hash tag
// share a slot, and the channels of one id share its tag).
func (s *subscriber) group(chans []string) [][]string {
	if len(chans) == 0 {
		return nil
	}
	if !s.sharded {
		return [][]string{chans}
	}
	bySlot := make(map[string][]string)
	var order []string
	for _, ch := range chans {
		slot := hashTag(ch)
		if _, ok := bySlot[slot]; !ok {
			order = append(order, slot)
		}
		bySlot[slot] = append(bySlot[slot], ch)
	}
	out := make([][]string, 0, len(order))
	for _, slot := range order {
		out = append(out, bySlot[slot])
	}
	return out
}

// hashTag returns the part of key that Redis Cluster hashes: what is
// between its first "{" and the "}" after it, if not empty, else key.
func hashTag(key string) string {
	if i := strings.IndexByte(key, '{'); i >= 0 {
		if j := strings.IndexByte(key[i+1:], '}'); j > 0 {
			return key[i+1 : i+1+j]
		}
	}
	return key
}

// isMoved reports whether err is a cluster redirection or state error: the
// node does not serve the slot now.
func isMoved(err error) bool {
	msg := err.Error()
	for _, p := range []string{"MOVED ", "ASK ", "CLUSTERDOWN", "TRYAGAIN"} {
		if strings.HasPrefix(msg, p) {
			return true
		}
	}
	return false
}

// kind is the name of a subscription command, and of its replies:
// "subscribe", or, sharded, "ssubscribe".
func (s *subscriber) kind(k string) string {
	if s.sharded {
		return "s" + k
	}
	return k
}

// rehome tells every watch to watch again elsewhere (see shards).
func (s *subscriber) rehome() {
	s.mu.Lock()
	var poke []*watch
	for w := range s.all {
		if !w.moved {
			w.moved = true
			poke = append(poke, w)
		}
	}
	s.mu.Unlock()
	for _, w := range poke {
		w.poke()
	}
}

// send writes p on ps, each call bounded in time. Any error means the
// connection is no longer the one our state describes.
func (s *subscriber) send(ps *redis.PubSub, p plan) error {
	ctx, cancel := context.WithTimeout(s.ctx, pubsubTimeout)
	defer cancel()
	subscribe, unsubscribe := ps.Subscribe, ps.Unsubscribe
	if s.sharded {
		subscribe, unsubscribe = ps.SSubscribe, ps.SUnsubscribe
	}
	for _, chans := range p.subs {
		s.stats.subscribes.Add(1)
		if err := subscribe(ctx, chans...); err != nil {
			return err
		}
	}
	if p.marker != 0 {
		s.stats.pings.Add(1)
		if err := ps.Ping(ctx, markerPrefix+strconv.FormatUint(p.marker, 10)); err != nil {
			return err
		}
	}
	for _, chans := range p.unsub {
		s.stats.unsubscribes.Add(1)
		if err := unsubscribe(ctx, chans...); err != nil {
			return err
		}
	}
	if p.probe {
		s.stats.pings.Add(1)
		if err := ps.Ping(ctx, markerPrefix+"probe"); err != nil {
			return err
		}
	}
	return nil
}

// pause waits before a replacement after one that failed; the first waits
// not at all. It returns false on close.
func (s *subscriber) pause(backoff *time.Duration) bool {
	d := *backoff
	*backoff = min(max(2*d, 5*time.Millisecond), maxBackoff)
	if d == 0 {
		return true
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-s.stop:
		return false
	}
}

// fail marks connection gen as broken, if it is still the current one.
func (s *subscriber) fail(gen uint64) {
	s.mu.Lock()
	first := gen == s.gen && !s.broken
	if gen == s.gen {
		s.broken = true
		s.untrackLocked()
	}
	s.mu.Unlock()
	if first && s.onBreak != nil {
		s.onBreak()
	}
	if first && s.sharded {
		// The node may have stopped serving the slots (a failover), or be
		// frozen: a new connection to it may well succeed and never hear
		// a thing. The watches look again, and go where the cluster says.
		s.rehome()
	}
	s.wake()
}

// untrackLocked records that the current connection may not track any
// more. Called under mu.
func (s *subscriber) untrackLocked() {
	if s.trackLive {
		s.trackLive = false
	}
	s.trackEpoch++
}

// dialled is called before every dial of the subscriber's client (with an
// L1): go-redis may have replaced the connection inside a call, and
// invalidations sent in the gap are lost.
func (s *subscriber) dialled() {
	s.mu.Lock()
	s.untrackLocked()
	s.mu.Unlock()
	if s.onBreak != nil {
		s.onBreak()
	}
}

// tracking reports whether the current connection is known to receive
// invalidations, and the epoch of that state: a later call that returns
// the same epoch and true proves that no invalidation was missed between.
func (s *subscriber) tracking() (uint64, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.trackEpoch, s.trackLive
}

// read receives from ps, connection gen, until it fails or is replaced.
func (s *subscriber) read(ps *redis.PubSub, gen uint64) {
	defer s.reads.Done()
	probing := false // a probe is out and nothing has arrived since
	for {
		msg, err := ps.ReceiveTimeout(context.Background(), s.health)
		var reply redis.Error
		if errors.As(err, &reply) && s.refused(gen, err) {
			probing = false // a reply, if an error: the connection lives
			continue
		}
		if err != nil {
			var nerr net.Error
			if errors.As(err, &nerr) && nerr.Timeout() && !probing {
				// Silent for a while: ask. go-redis keeps the connection
				// after a ReceiveTimeout timeout.
				probing = true
				s.mu.Lock()
				s.probe = s.probe || gen == s.gen
				s.mu.Unlock()
				s.wake()
				continue
			}
			s.fail(gen)
			return
		}
		probing = false
		if !s.deliver(gen, msg) {
			s.fail(gen)
			return
		}
	}
}

// deliver hands msg, read on connection gen, to the watches. It returns
// false if gen is no longer current, or if msg shows that the connection
// was replaced behind our back.
func (s *subscriber) deliver(gen uint64, msg any) bool {
	var (
		buf     [4]*watch
		poke    = buf[:0] // poked after the fast path has run
		onValue []func(string)
		payload string
	)
	s.mu.Lock()
	if gen != s.gen || s.closed {
		s.mu.Unlock()
		return false
	}
	switch m := msg.(type) {
	case *redis.Message:
		payload = m.Payload
		for w := range s.watches[m.Channel] {
			w.messages = append(w.messages, m)
			poke = append(poke, w)
			if w.onValue != nil && m.Channel == w.channels[0] {
				onValue = append(onValue, w.onValue)
			}
		}
	case *redis.Pong:
		if !s.due("ping", m.Payload) {
			s.mu.Unlock()
			return false
		}
		poke = s.markerBack(m.Payload, poke)
	case *redis.Subscription:
		if !s.due(m.Kind, m.Channel) {
			// go-redis subscribed again on a new connection of its own.
			s.mu.Unlock()
			return false
		}
	}
	s.mu.Unlock()
	// The value's callers first: waking the waits' own goroutines can wait.
	for _, f := range onValue {
		f(payload)
	}
	for _, w := range poke {
		w.poke()
	}
	return true
}

// due checks a reply against the command it must answer, the first one
// still owed, and counts it. It reports false if the reply is not that
// command's: the connection is not the one our state describes.
func (s *subscriber) due(kind, arg string) bool {
	if len(s.acks) == 0 {
		return false
	}
	cmd := &s.acks[0]
	if cmd.kind != kind || cmd.args[cmd.acked] != arg {
		return false
	}
	if cmd.acked++; cmd.acked == len(cmd.args) {
		s.acks = s.acks[1:]
	}
	return true
}

// markerBack makes live the watches a returning marker PING (payload)
// covers, and adds them to poke. A probe's reply only proves the
// connection alive.
func (s *subscriber) markerBack(payload string, poke []*watch) []*watch {
	p, ok := strings.CutPrefix(payload, markerPrefix)
	seq, err := strconv.ParseUint(p, 10, 64)
	if !ok || err != nil || seq <= s.pongSeq {
		return poke
	}
	s.pongSeq, s.heard = seq, true
	n := 0
	for _, m := range s.marked {
		if m.seq > seq {
			break
		}
		n++
		if w := m.w; w.seq == m.seq && !w.gone && !w.closed {
			w.live, w.reread = true, true
			poke = append(poke, w)
			if w == s.trackWatch && w.err == nil && !s.broken {
				s.trackLive = true
			}
		}
	}
	s.marked = s.marked[n:]
	return poke
}

// refused handles an error reply read on connection gen: Redis refused the
// first command still owed replies. A refused PING still answers in order,
// so a marker counts as back. A refused SUBSCRIBE of one channel ends the
// watches of that channel with the error; one of several channels (an ACL
// may allow some and not others) has them subscribed again one by one. It
// returns false if the reply cannot be matched to a command: the
// connection must start again.
func (s *subscriber) refused(gen uint64, err error) bool {
	s.mu.Lock()
	if gen != s.gen || len(s.acks) == 0 || s.acks[0].acked != 0 {
		s.mu.Unlock()
		return false
	}
	cmd := s.acks[0]
	s.acks = s.acks[1:]
	var poke []*watch
	switch {
	case cmd.kind == "ping":
		poke = s.markerBack(cmd.args[0], poke)
	case cmd.kind == "ssubscribe" && isMoved(err):
		// The node does not serve the slot (any more): those watches
		// go where the cluster now says it is.
		for _, ch := range cmd.args {
			delete(s.sent, ch)
			for w := range s.watches[ch] {
				if !w.moved {
					w.moved = true
					poke = append(poke, w)
				}
			}
		}
	case cmd.kind == s.kind("subscribe") && len(cmd.args) > 1:
		for _, ch := range cmd.args {
			delete(s.sent, ch)
			if _, ok := s.watches[ch]; !ok {
				continue // nobody wants it any more
			}
			s.solo[ch] = struct{}{}
			s.dirty[ch] = struct{}{}
			// Not live until a marker sent after the retry comes back.
			for w := range s.watches[ch] {
				if w.seq != 0 || w.live {
					w.live, w.seq = false, 0
					s.unmarked = append(s.unmarked, w)
				}
			}
		}
	case cmd.kind == s.kind("subscribe"):
		ch := cmd.args[0]
		delete(s.sent, ch)
		for w := range s.watches[ch] {
			if w.err == nil {
				w.err = err
				poke = append(poke, w)
			}
		}
	}
	s.mu.Unlock()
	for _, w := range poke {
		w.poke()
	}
	s.wake()
	return true
}

// liveWatches returns how many watches of ch are live (for tests).
func (s *subscriber) liveWatches(ch string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for w := range s.watches[ch] {
		if w.live {
			n++
		}
	}
	return n
}

// close stops run and read, closes the connection and wakes every watch.
// It waits for its goroutines up to d: a call stuck in go-redis ends by
// go-redis's own timeouts.
func (s *subscriber) close(d time.Duration) {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return
	}
	s.closed = true
	for w := range s.all {
		w.closed = true
		w.poke()
	}
	started := s.started
	s.mu.Unlock()
	s.cancel()
	close(s.stop)
	if !started {
		return
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-s.done:
		waitTimeout(&s.reads, d)
	case <-t.C:
	}
}

// channels returns the number of channels subscribed on the connection.
func (s *subscriber) channels() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.sent)
}
