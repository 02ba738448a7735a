package pubsub

import (
	"slices"
	"strconv"
	"sync/atomic"
	"time"
)

// markerPrefix starts the payload of every PING a subscriber sends, so
// that MONITOR shows whose they are.
const markerPrefix = "memolock:"

// probePayload is the payload of a probe PING, which only proves that the
// connection answers.
const probePayload = markerPrefix + "probe"

// invalidationChannel is where Redis sends the invalidations of a
// tracking connection in RESP2, redirected to a connection subscribed to
// it (always with a plain SUBSCRIBE, on a cluster too).
const invalidationChannel = "__redis__:invalidate"

// unsubscribeDelay is how long an UNSUBSCRIBE waits: long enough that the
// callers a value just woke run first, and that the ends of many watches
// go out as one command.
const unsubscribeDelay = 2 * time.Millisecond

const (
	verbSubscribe    = "subscribe"
	verbSSubscribe   = "ssubscribe"
	verbUnsubscribe  = "unsubscribe"
	verbSUnsubscribe = "sunsubscribe"
	verbPing         = "ping"
)

// command is one command for the owner to send.
type command struct {
	verb string   // one of the verbs above
	args []string // the channels, or the PING's payload
	// all, for a sharded unsubscription, sends it without channels: every
	// shard channel of the connection goes, with one command instead of
	// one per slot. args are the channels it is meant for.
	all bool
}

// owed is a command whose replies the connection still owes: one per
// channel for a (un)subscription, one for a PING, or one error reply.
// Sharded unsubscriptions are answered otherwise: see slot.go.
type owed struct {
	command
	acked int
	at    time.Time // when it was planned, before it was sent
}

// pending is a watch waiting for marker seq: to go live, or to be synced.
// The entry is stale if the watch waits for another marker since.
type pending struct {
	w   *Watch
	seq uint64
}

// batch is what the owner sends next, in order.
type batch struct {
	gen     uint64 // the connection it is meant for
	replace bool   // that connection failed: close it, and open another
	heard   bool   // a marker came back since the last batch: reset the backoff
	cmds    []command
}

// machine is the protocol state of one subscriber: which channels the
// current connection subscribes, which replies it owes, which watches are
// live. It does no I/O and starts nothing; see the package comment.
type machine struct {
	sharded bool   // SSUBSCRIBE, one command per slot
	tracker *Watch // the invalidation channel's watch, when tracking

	gen     uint64 // the current connection; every replacement adds one
	broken  bool   // the current connection failed: replace it
	closed  bool
	retired bool // closed because another subscriber replaces it

	attached map[*Watch]struct{}
	byChan   map[string]map[*Watch]struct{} // what must be subscribed
	dirty    map[string]struct{}            // channels whose watches changed
	unwanted map[string]struct{}            // subscribed, nobody watches: unsubscribed at unsubDue
	sent     map[string]struct{}            // subscribed on the current connection
	solo     map[string]struct{}            // to subscribe one per command: a batch was refused
	unsubDue time.Time                      // when unwanted channels are unsubscribed

	unmarked  []*Watch  // watches that need a marker
	marked    []pending // watches whose marker is out, in marker order
	syncAsked []*Watch  // Sync calls not planned yet
	syncs     []pending // Sync calls whose marker is out
	owed      []owed    // replies due on the current connection, in order
	nextSeq   uint64    // the next marker
	pongSeq   uint64    // the highest marker back on the current connection
	probeDue  bool      // a probe PING is to be sent
	probing   bool      // a probe is out, and nothing arrived since
	heard     bool      // a marker came back since the last batch

	track trackState
	// fresh is when the tracking connection last proved that it had
	// delivered every invalidation: the planning time of the last PING
	// whose PONG came back while tracking was live, with that state's
	// epoch. nil while tracking is not live. Read without the lock (Fresh).
	fresh    atomic.Pointer[freshness]
	freshOut bool      // a PING is out whose PONG refreshes fresh
	pingDue  time.Time // when the next freshness PING is due
}

func newMachine(sharded bool) *machine {
	return &machine{
		sharded:  sharded,
		attached: make(map[*Watch]struct{}),
		byChan:   make(map[string]map[*Watch]struct{}),
		dirty:    make(map[string]struct{}),
		unwanted: make(map[string]struct{}),
		sent:     make(map[string]struct{}),
		solo:     make(map[string]struct{}),
		nextSeq:  1,
	}
}

// watch attaches w: its channels are subscribed, and it goes live once a
// marker sent after that comes back.
func (m *machine) watch(w *Watch, fx *effects) {
	if m.closed {
		m.refuseLate(w, fx)
		return
	}
	w.state = watchState{attached: true}
	m.attached[w] = struct{}{}
	for _, ch := range w.channels {
		ws := m.byChan[ch]
		if ws == nil {
			ws = make(map[*Watch]struct{})
			m.byChan[ch] = ws
		}
		ws[w] = struct{}{}
		if _, ok := m.sent[ch]; !ok {
			m.dirty[ch] = struct{}{}
		}
	}
	m.unmarked = append(m.unmarked, w)
	fx.wake = true
}

// unwatch detaches w.
func (m *machine) unwatch(w *Watch, now time.Time, fx *effects) {
	if !w.state.attached {
		return
	}
	m.detach(w, now, fx)
}

// detach stops serving w; its channels nobody else watches are to be
// unsubscribed after unsubscribeDelay. The owner is woken when this
// starts the delay; the ends that come meanwhile join it.
//
// On a sharded connection, Redis takes one SUNSUBSCRIBE per slot, so
// that unsubscribing channels as their waits end costs about one command
// per id; but one SUNSUBSCRIBE without channels drops them all once the
// connection has no wait left. So a shard channel nobody watches lingers,
// subscribed and unheeded, until the last wait of the connection ends
// (then, after unsubscribeDelay, one command drops them all), or for
// shardLinger at most, when they go slot by slot: a mass expiry, whose
// waits all end within moments, costs one command per connection.
func (m *machine) detach(w *Watch, now time.Time, fx *effects) {
	w.state = watchState{}
	delete(m.attached, w)
	lingering := false
	for _, ch := range w.channels {
		ws := m.byChan[ch]
		delete(ws, w)
		if len(ws) > 0 {
			continue
		}
		delete(m.byChan, ch)
		delete(m.solo, ch)
		if _, ok := m.sent[ch]; ok {
			m.unwanted[ch] = struct{}{}
			lingering = lingering || m.verb(ch, false) == verbSUnsubscribe
			delay := unsubscribeDelay
			if lingering {
				delay = shardLinger
			}
			m.unsubBy(now.Add(delay), fx)
		}
	}
	if lingering && !m.wantsShardChannels() {
		m.unsubBy(now.Add(unsubscribeDelay), fx) // the last wait ended
	}
}

// sync asks for a marker round trip for w (see Watch.Sync).
func (m *machine) sync(w *Watch, fx *effects) {
	if !w.state.attached {
		return
	}
	m.syncAsked = append(m.syncAsked, w)
	fx.wake = true
}

// moveAll tells every watch but the tracker's to watch again elsewhere,
// and detaches them.
func (m *machine) moveAll(now time.Time, fx *effects) {
	for w := range m.attached {
		if w != m.tracker {
			m.detach(w, now, fx)
			fx.add(w, noteMoved)
			fx.moved = true
		}
	}
}

// refuseLate answers a watch that comes after close.
func (m *machine) refuseLate(w *Watch, fx *effects) {
	if m.retired {
		fx.add(w, noteMoved)
		fx.moved = true
		return
	}
	fx.add(w, noteClosed)
}

// retire closes the machine for a subscriber that another replaces: its
// watches, and those that come late, are told to move.
func (m *machine) retire(now time.Time, fx *effects) {
	m.moveAll(now, fx)
	m.retired = true
	m.close(fx)
}

// close detaches every watch, telling it so.
func (m *machine) close(fx *effects) {
	m.closed = true
	for w := range m.attached {
		w.state = watchState{}
		fx.add(w, noteClosed)
	}
	clear(m.attached)
	clear(m.byChan)
	clear(m.dirty)
	clear(m.unwanted)
	m.unmarked, m.marked, m.syncAsked, m.syncs, m.owed = nil, nil, nil, nil, nil
	m.endTracking(fx)
}

// plan decides what the owner sends next, and records it as sent. wakeAt,
// if not zero, is when the owner must plan again for work held back.
func (m *machine) plan(now time.Time) (b batch, wakeAt time.Time) {
	if m.closed {
		return batch{gen: m.gen}, time.Time{}
	}
	if m.broken {
		m.restart()
		b.replace = true
	}
	b.gen, b.heard, m.heard = m.gen, m.heard, false
	subs, solo, unsubs, wakeAt := m.diff(now)
	b.cmds = m.group(subs, true)
	for _, ch := range solo {
		b.cmds = append(b.cmds, command{verb: m.verb(ch, true), args: []string{ch}})
	}
	if seq := m.mark(); seq != 0 {
		b.cmds = append(b.cmds, command{verb: verbPing, args: []string{markerPrefix + strconv.FormatUint(seq, 10)}})
		m.probeDue = false // any reply will do as well
	}
	unsubCmds := m.unsubscriptions(unsubs)
	b.cmds = append(b.cmds, unsubCmds...)
	if m.probeDue || unsubscribesByName(unsubCmds) {
		m.probeDue = false
		b.cmds = append(b.cmds, command{verb: verbPing, args: []string{probePayload}})
	}
	wakeAt = m.planFreshness(&b, now, wakeAt)
	for _, c := range b.cmds {
		if c.verb == verbSUnsubscribe {
			// Its answers are counted in any order, and its channels taken
			// out as Redis drops them: it needs a copy of its own, apart
			// from the one the owner sends.
			c.args = slices.Clone(c.args)
		}
		m.owed = append(m.owed, owed{command: c, at: now})
	}
	return b, wakeAt
}

// restart starts again on a new connection: every channel is to be
// subscribed again, and every watch waits for a new marker.
func (m *machine) restart() {
	m.gen++
	m.broken, m.probeDue, m.probing, m.freshOut = false, false, false, false
	clear(m.sent)
	clear(m.unwanted)
	m.owed, m.marked, m.syncs, m.syncAsked, m.pongSeq = nil, nil, nil, nil, 0
	for ch := range m.byChan {
		m.dirty[ch] = struct{}{}
	}
	m.unmarked = m.unmarked[:0]
	for w := range m.attached {
		w.state.live, w.state.seq = false, 0
		m.unmarked = append(m.unmarked, w)
	}
}

// diff returns the channels to subscribe (in a batch, or one by one) and
// to unsubscribe now, and records them as sent. Unsubscriptions wait
// until unsubDue, returned as wakeAt while they do; the channels that wait
// are kept apart (unwanted), so that planning meanwhile does not walk them.
func (m *machine) diff(now time.Time) (subs, solo, unsubs []string, wakeAt time.Time) {
	for ch := range m.dirty {
		_, want := m.byChan[ch]
		_, have := m.sent[ch]
		_, alone := m.solo[ch]
		switch {
		case want && !have && alone:
			solo = append(solo, ch)
			m.sent[ch] = struct{}{}
		case want && !have:
			subs = append(subs, ch)
			m.sent[ch] = struct{}{}
		case !want && have:
			m.unwanted[ch] = struct{}{}
		}
		delete(m.dirty, ch)
	}
	switch {
	case len(m.unwanted) == 0:
		m.unsubDue = time.Time{} // nothing waits: the next end starts a delay of its own
	case now.Before(m.unsubDue):
		wakeAt = m.unsubDue
	default:
		for ch := range m.unwanted {
			_, want := m.byChan[ch]
			if _, have := m.sent[ch]; have && !want {
				unsubs = append(unsubs, ch)
				delete(m.sent, ch)
			}
		}
		clear(m.unwanted)
		m.unsubDue = time.Time{}
	}
	slices.Sort(solo)
	return subs, solo, unsubs, wakeAt
}

// verb names the command that (un)subscribes ch: sharded on a cluster,
// except for the invalidation channel.
func (m *machine) verb(ch string, subscribe bool) string {
	sharded := m.sharded && ch != invalidationChannel
	switch {
	case subscribe && sharded:
		return verbSSubscribe
	case subscribe:
		return verbSubscribe
	case sharded:
		return verbSUnsubscribe
	default:
		return verbUnsubscribe
	}
}

// mark assigns the next marker to the watches that need one and to the
// Sync calls not planned yet. It returns that marker, or 0 for none.
func (m *machine) mark() uint64 {
	var seq uint64
	next := func() uint64 {
		if seq == 0 {
			seq = m.nextSeq
			m.nextSeq++
		}
		return seq
	}
	for _, w := range m.unmarked {
		if w.state.attached && w.state.seq == 0 {
			w.state.seq = next()
			m.marked = append(m.marked, pending{w, seq})
		}
	}
	clear(m.unmarked)
	m.unmarked = m.unmarked[:0]
	for _, w := range m.syncAsked {
		if w.state.attached {
			m.syncs = append(m.syncs, pending{w, next()})
		}
	}
	clear(m.syncAsked)
	m.syncAsked = m.syncAsked[:0]
	return seq
}
