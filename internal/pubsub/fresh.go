package pubsub

import (
	"slices"
	"time"

	"github.com/memolock/memolock/internal/mono"
)

// The L1's freshness: while tracking is live, the owner sends a PING every
// freshEvery, and each reply records when its PING was planned (see
// machine.fresh and Subscriber.Heard).

// freshness is the content of machine.fresh.
type freshness struct {
	epoch uint64
	at    time.Duration // mono time
}

// freshEvery is how often a tracking subscriber whose tracking is live
// sends a PING, so that the L1 may keep serving: an L1 entry is served
// only while the PONG of a PING planned less than l1.FreshFor (1 s) ago
// has come back on the connection of its epoch. A PONG comes after every
// invalidation that Redis sent before it answered the PING, so that a
// value the L1 serves is never older than that bound, even when the
// process was frozen with invalidations unread in its socket.
const freshEvery = 200 * time.Millisecond

// trackState is whether the current connection is known to receive
// invalidations. epoch counts the times that stopped being so.
type trackState struct {
	live    bool
	epoch   uint64
	refused error // Redis refused tracking on the current connection
}

// planFreshness adds a PING to b when tracking is live and none went out
// for freshEvery, and returns when the owner must plan again for the next
// (wakeAt, or earlier).
func (m *machine) planFreshness(b *batch, now, wakeAt time.Time) time.Time {
	if m.tracker == nil || !m.track.live {
		return wakeAt
	}
	pinged := slices.ContainsFunc(b.cmds, func(c command) bool { return c.verb == verbPing })
	if !pinged && !m.freshOut {
		if now.Before(m.pingDue) {
			if wakeAt.IsZero() || m.pingDue.Before(wakeAt) {
				wakeAt = m.pingDue
			}
			return wakeAt
		}
		b.cmds = append(b.cmds, command{verb: verbPing, args: []string{probePayload}})
		pinged = true
	}
	if pinged {
		m.freshOut, m.pingDue = true, now.Add(freshEvery)
	}
	return wakeAt
}

// nextOwedAt is when the next reply owed was planned (zero if none is).
func (m *machine) nextOwedAt() time.Time {
	if n := m.undecided(); n < len(m.owed) {
		return m.owed[n].at
	}
	return time.Time{}
}

// pongBack records the PONG of a PING planned at at: every invalidation
// Redis sent before it answered has been handed on (the reader applies
// what it receives in order), so the L1 is fresh as of at. The owner is
// woken to plan the next freshness PING.
func (m *machine) pongBack(at time.Time, fx *effects) {
	if m.tracker == nil {
		return
	}
	m.freshOut = false
	fx.wake = true
	if m.track.live {
		m.fresh.Store(&freshness{epoch: m.track.epoch, at: mono.At(at)})
	}
}
