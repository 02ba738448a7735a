package pubsub

import (
	"io"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// rig drives a machine by hand: it plans, keeps what was "sent" on the
// current connection, and answers it as Redis would, one reply at a time.
type rig struct {
	t     *testing.T
	m     *machine
	now   time.Time
	wire  []any // replies the current connection will give, in order
	gen   uint64
	fx    effects // everything the machine asked for so far
	batch batch   // the last batch planned
	woken bool    // the owner was woken since the last plan
	timer time.Time
}

func newRig(t *testing.T, sharded bool) *rig {
	return &rig{t: t, m: newMachine(sharded), now: time.Unix(1000, 0)}
}

// do runs one machine step and applies its notes to the mailboxes.
func (r *rig) do(step func(fx *effects)) effects {
	var fx effects
	step(&fx)
	for _, n := range fx.notes {
		n.w.note(n)
	}
	r.fx.notes = append(r.fx.notes, fx.notes...)
	r.fx.values = append(r.fx.values, fx.values...)
	r.fx.invalidations = append(r.fx.invalidations, fx.invalidations...)
	r.fx.warnings = append(r.fx.warnings, fx.warnings...)
	r.woken = r.woken || fx.wake
	r.fx.broke = r.fx.broke || fx.broke
	r.fx.moved = r.fx.moved || fx.moved
	return fx
}

func (r *rig) watch(channels ...string) *Watch {
	w := newWatch(nil, channels)
	r.do(func(fx *effects) { r.m.watch(w, fx) })
	return w
}

// plan plans a batch; the replies it will get go on the wire.
func (r *rig) plan() batch {
	b, wakeAt := r.m.plan(r.now)
	r.woken, r.timer = false, wakeAt
	if b.replace || b.gen != r.gen {
		r.wire, r.gen = nil, b.gen
	}
	for _, c := range b.cmds {
		r.wire = append(r.wire, replies(c)...)
	}
	r.batch = b
	return b
}

// replies are what Redis answers to c.
func replies(c command) []any {
	if c.verb == verbPing {
		return []any{&redis.Pong{Payload: c.args[0]}}
	}
	out := make([]any, len(c.args))
	for i, ch := range c.args {
		out[i] = &redis.Subscription{Kind: c.verb, Channel: ch, Count: i + 1}
	}
	if c.all {
		// Unsubscribed without channels: Redis acknowledges each in the
		// order of its own dict, not ours.
		slices.Reverse(out)
	}
	return out
}

// feed hands the machine one arrival on the current connection.
func (r *rig) feed(msg any, err error) effects {
	return r.do(func(fx *effects) { r.m.receive(r.gen, msg, err, r.now, fx) })
}

// serveOne delivers the next reply on the wire, an error being an error
// reply; false if there is none.
func (r *rig) serveOne() bool {
	if len(r.wire) == 0 {
		return false
	}
	msg, err := r.wire[0], error(nil)
	r.wire = r.wire[1:]
	if e, ok := msg.(error); ok {
		msg, err = nil, e
	}
	if fx := r.feed(msg, err); fx.stop {
		r.wire = nil
	}
	return true
}

// replace a reply owed on the wire by err: Redis refused the command.
func (r *rig) refuseNext(err error) effects {
	r.t.Helper()
	if len(r.m.owed) == 0 {
		r.t.Fatal("nothing owed to refuse")
	}
	r.wire = r.wire[len(replies(r.m.owed[0].command))-r.m.owed[0].acked:]
	return r.feed(nil, err)
}

// settle plans and serves until nothing is left to send or to receive,
// with time moving past every delay. Like the owner, it plans only when
// woken, or when its timer is due; work left behind without a wake-up
// fails the test.
func (r *rig) settle() {
	r.t.Helper()
	for range 300 {
		r.now = r.now.Add(10 * time.Millisecond)
		due := !r.timer.IsZero() && !r.now.Before(r.timer)
		if !r.woken && !due && len(r.wire) == 0 {
			if b, _ := r.m.plan(r.now); len(b.cmds) != 0 || b.replace {
				r.t.Fatalf("work left without waking the owner: %+v", b)
			}
			return
		}
		if r.woken || due {
			r.plan()
		}
		for r.serveOne() {
		}
	}
	r.t.Fatal("the machine never settles")
}

// unsubWait is how long the unsubscription of a channel nobody watches
// may wait, on this rig's machine, while other waits go on.
func (r *rig) unsubWait() time.Duration {
	if r.m.sharded {
		return shardLinger
	}
	return unsubscribeDelay
}

// publish delivers a message as the current connection would.
func (r *rig) publish(ch, payload string) effects {
	return r.feed(&redis.Message{Channel: ch, Payload: payload}, nil)
}

// wired returns the commands of the last batch, as "verb arg arg".
func (r *rig) wired() []string {
	var out []string
	for _, c := range r.batch.cmds {
		if c.all {
			out = append(out, c.verb+" (all)")
			continue
		}
		out = append(out, c.verb+" "+strings.Join(c.args, " "))
	}
	return out
}

// check asserts the invariants of a settled machine: every attached
// watch is live, exactly the wanted channels are subscribed, and nothing
// is owed.
func (r *rig) check() {
	r.t.Helper()
	m := r.m
	if len(m.owed) != 0 || m.broken {
		r.t.Fatalf("settled with %d replies owed, broken=%v", len(m.owed), m.broken)
	}
	for w := range m.attached {
		if w == m.tracker && m.track.refused != nil {
			continue
		}
		if !w.state.live && w.box.Err == nil {
			r.t.Fatalf("watch %v attached but not live", w.channels)
		}
	}
	for ch := range m.byChan {
		if _, ok := m.sent[ch]; !ok && !r.refusedChan(ch) {
			r.t.Fatalf("channel %s wanted, not subscribed", ch)
		}
	}
	for ch := range m.sent {
		if _, ok := m.byChan[ch]; ok {
			continue
		}
		// A shard channel may linger (see detach), if its unsubscription
		// is due and the owner's timer will wake it for that.
		_, unwanted := m.unwanted[ch]
		lingers := m.verb(ch, false) == verbSUnsubscribe && unwanted && !m.unsubDue.IsZero() &&
			!r.timer.IsZero() && !r.timer.After(m.unsubDue)
		if !lingers {
			r.t.Fatalf("channel %s subscribed, not wanted", ch)
		}
	}
}

func (r *rig) refusedChan(ch string) bool {
	for w := range r.m.byChan[ch] {
		if w.box.Err != nil || w == r.m.tracker {
			return true
		}
	}
	return false
}

var errEOF = io.EOF

func marker(seq uint64) string { return markerPrefix + strconv.FormatUint(seq, 10) }
