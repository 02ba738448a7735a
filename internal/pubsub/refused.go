package pubsub

import (
	"fmt"
	"time"
)

// refused handles an error reply: Redis refused the first command still
// owed replies. A refused PING still answers in order, so its marker
// counts as back. A transient refusal (BUSY, LOADING) is retried on a new
// connection, with backoff. A refused SSUBSCRIBE that names another node
// moves its watches. A refused SUBSCRIBE of several channels (an ACL may
// allow some and not others) subscribes them again one by one; of one
// channel, it gives its watches the error: no value will come that way.
// A SUNSUBSCRIBE that names channels may be refused with a redirection
// after Redis's own sunsubscribes, which were taken as its answers; once
// acknowledged, it is refused no more (see slot.go).
func (m *machine) refused(err error, now time.Time, fx *effects) {
	if len(m.owed) > 0 && m.owed[0].named() && isMoved(err) {
		m.owed = m.owed[1:] // nothing waits for its channels
		return
	}
	for len(m.owed) > 0 && m.owed[0].named() && m.owed[0].acked > 0 {
		m.owed = m.owed[1:] // acknowledged: the error is a later command's (a PING that an ACL forbids)
	}
	if len(m.owed) == 0 || m.owed[0].acked != 0 {
		m.fail(now, fmt.Errorf("%w: %w", errUnasked, err), fx)
		return
	}
	c, at := m.owed[0].command, m.owed[0].at
	m.owed = m.owed[1:]
	switch {
	case c.verb == verbPing:
		// A refused PING answers in order, as a PONG does.
		m.markerBack(c.args[0], fx)
		m.pongBack(at, fx)
	case c.verb == verbSSubscribe && isMoved(err):
		m.moveChannels(c.args, now, fx)
	case isTransient(err):
		m.fail(now, err, fx)
	case c.verb == verbUnsubscribe || c.verb == verbSUnsubscribe:
		// Nothing waits for these channels; a new connection drops them.
	case len(c.args) > 1:
		m.subscribeAlone(c.args, fx)
	default:
		m.reject(c.args[0], err, fx)
	}
}

// moveChannels tells the watches of chans that their slot is elsewhere,
// and detaches them.
func (m *machine) moveChannels(chans []string, now time.Time, fx *effects) {
	for _, ch := range chans {
		m.dropped(ch)
		for w := range m.byChan[ch] {
			m.detach(w, now, fx)
			fx.add(w, noteMoved)
			fx.moved = true
		}
	}
}

// subscribeAlone has chans subscribed again one per command; their
// watches are not live until a marker sent after that comes back.
func (m *machine) subscribeAlone(chans []string, fx *effects) {
	for _, ch := range chans {
		m.dropped(ch)
		ws, ok := m.byChan[ch]
		if !ok {
			continue // nobody wants it any more
		}
		m.solo[ch] = struct{}{}
		m.dirty[ch] = struct{}{}
		for w := range ws {
			if w.state.seq != 0 || w.state.live {
				w.state.live, w.state.seq = false, 0
				m.unmarked = append(m.unmarked, w)
			}
		}
	}
	fx.wake = true
}

// reject gives the watches of ch the refusal err. The channel is tried
// again on the next connection, if still wanted.
func (m *machine) reject(ch string, err error, fx *effects) {
	m.dropped(ch)
	fx.warnings = append(fx.warnings, warning{what: m.verb(ch, true), channel: ch, err: err})
	for w := range m.byChan[ch] {
		w.state.live, w.state.seq = false, 0 // until the next connection
		if w == m.tracker {
			m.track.refused = err
			fx.tracking, fx.trackingRefused = true, true
			continue
		}
		fx.notes = append(fx.notes, note{w: w, kind: noteErr, err: err})
	}
}
