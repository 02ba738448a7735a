package pubsub

import (
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// receive takes in what the reader of connection gen got from
// ReceiveTimeout. fx.stop tells the reader to end.
func (m *machine) receive(gen uint64, msg any, err error, now time.Time, fx *effects) {
	if gen != m.gen || m.broken || m.closed {
		fx.stop = true
		return
	}
	switch {
	case err == nil:
		m.probing = false
		m.arrived(msg, now, fx)
	case isTimeout(err):
		m.silence(now, fx)
	case isFlush(err) && m.tracker != nil:
		m.probing = false
		fx.invalidations = append(fx.invalidations, nil)
	case isReply(err):
		m.probing = false
		m.refused(err, now, fx)
	default:
		m.fail(now, err, fx)
	}
}

// sendFailed records that the owner's write on connection gen failed.
func (m *machine) sendFailed(gen uint64, err error, now time.Time, fx *effects) {
	if gen == m.gen && !m.broken && !m.closed {
		m.fail(now, err, fx)
	}
}

// fail marks the current connection broken. On a cluster the node may
// have stopped serving its slots (a failover), or be frozen, so that a
// new connection may well succeed and never hear a thing: every watch
// looks again, where the cluster says its slot is now.
func (m *machine) fail(now time.Time, cause error, fx *effects) {
	m.broken = true
	fx.lost = cause
	fx.stop, fx.wake, fx.broke = true, true, true
	m.endTracking(fx)
	m.track.refused = nil // the next connection asks again
	if m.sharded {
		m.moveAll(now, fx)
	}
}

// dialled records a dial of the connection's client. go-redis dials
// inside any call that meets a broken connection, and whatever was sent
// in the gap is lost: tracking is not known to be live until the tracker
// gets a marker back that was sent after this dial.
func (m *machine) dialled(fx *effects) {
	fx.broke = true
	m.endTracking(fx)
	m.track.refused = nil // each connection asks again
	if w := m.tracker; w != nil && w.state.attached {
		w.state.live, w.state.seq = false, 0
		m.unmarked = append(m.unmarked, w)
		fx.wake = true
	}
}

// trackingRefused records that Redis refused tracking on the connection
// being set up.
func (m *machine) trackingRefused(err error, fx *effects) {
	m.track.refused = err
	fx.tracking, fx.trackingRefused = true, true
	fx.warnings = append(fx.warnings, warning{what: "CLIENT TRACKING", err: err})
}

func (m *machine) endTracking(fx *effects) {
	m.fresh.Store(nil)
	m.track.live = false
	m.track.epoch++
	fx.tracking = true
}

// silence handles a read that timed out: the first asks for a probe, the
// second in a row gives the connection up.
func (m *machine) silence(now time.Time, fx *effects) {
	if m.probing {
		m.fail(now, errSilent, fx)
		return
	}
	m.probing, m.probeDue = true, true
	fx.wake = true
}

// arrived handles a message, a PONG or an acknowledgement.
func (m *machine) arrived(msg any, now time.Time, fx *effects) {
	switch msg := msg.(type) {
	case *redis.Message:
		m.message(msg, fx)
	case *redis.Pong:
		at := m.nextOwedAt()
		if !m.due("pong", msg.Payload) {
			m.fail(now, errUnasked, fx)
			return
		}
		m.markerBack(msg.Payload, fx)
		m.pongBack(at, fx)
	case *redis.Subscription:
		switch {
		case m.due(msg.Kind, msg.Channel):
		case m.sharded && msg.Kind == verbSUnsubscribe:
			// Not one that an unsubscription owes: the slot migrated
			// away, and Redis unsubscribed its channels.
			m.moveChannels([]string{msg.Channel}, now, fx)
		default:
			m.fail(now, errUnasked, fx) // go-redis subscribed again on a connection of its own
		}
	default:
		m.fail(now, errUnasked, fx)
	}
}

// message hands msg to the watches of its channel, and invalidations to
// the tracker's callback.
func (m *machine) message(msg *redis.Message, fx *effects) {
	if m.tracker != nil && msg.Channel == invalidationChannel {
		fx.invalidations = append(fx.invalidations, msg.PayloadSlice) // nil if not a list: every key
	}
	for w := range m.byChan[msg.Channel] {
		if w == m.tracker {
			continue
		}
		fx.notes = append(fx.notes, note{w: w, kind: noteMessage, msg: msg})
		if w.onValue != nil && msg.Channel == w.channels[0] {
			fx.values = append(fx.values, valueCall{f: w.onValue, payload: msg.Payload})
		}
	}
}

// due checks a reply against the first command still owed, and counts
// it. It reports false if the reply is not that command's. A sunsubscribe
// may answer any sharded unsubscription owed first (see slot.go); any
// other reply comes after the answers of the SUNSUBSCRIBEs that name
// channels owed before it.
func (m *machine) due(kind, arg string) bool {
	if kind == verbSUnsubscribe {
		return m.unsubscribed(arg)
	}
	n := m.undecided()
	if n == len(m.owed) {
		return false
	}
	c := &m.owed[n]
	reply := c.verb
	if reply == verbPing {
		reply = "pong"
	}
	if reply != kind || c.args[c.acked] != arg {
		return false
	}
	m.owed = m.owed[n:] // Redis ran those SUNSUBSCRIBEs: they were not refused
	if c.acked++; c.acked == len(c.args) {
		m.owed = m.owed[1:]
	}
	return true
}

// markerBack makes live the watches that marker payload covers, and
// answers the Sync calls it covers. A probe only proves the connection
// alive.
func (m *machine) markerBack(payload string, fx *effects) {
	p, ok := strings.CutPrefix(payload, markerPrefix)
	seq, err := strconv.ParseUint(p, 10, 64)
	if !ok || err != nil || seq <= m.pongSeq {
		return
	}
	m.pongSeq, m.heard = seq, true
	n := 0
	for _, e := range m.marked {
		if e.seq > seq {
			break
		}
		n++
		if w := e.w; w.state.attached && w.state.seq == e.seq {
			w.state.live = true
			m.wentLive(w, fx)
		}
	}
	m.marked = m.marked[n:]
	n = 0
	for _, e := range m.syncs {
		if e.seq > seq {
			break
		}
		n++
		// Live since before this marker was sent: nothing published
		// before Sync can still be on its way.
		if w := e.w; w.state.attached && w.state.live && w.state.seq < e.seq {
			fx.add(w, noteSynced)
		}
	}
	m.syncs = m.syncs[n:]
}

func (m *machine) wentLive(w *Watch, fx *effects) {
	if w != m.tracker {
		fx.add(w, noteReread)
		return
	}
	if m.track.refused == nil {
		m.track.live = true
		fx.tracking = true
	}
}
