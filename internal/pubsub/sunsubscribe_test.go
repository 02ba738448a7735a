package pubsub

// How Redis answers sharded unsubscriptions when the slots of their
// channels move away, as checked on redis-server 7.0.15 (RESP2 and RESP3):
//
//   - Redis unsubscribes the channels of a slot it stops serving itself,
//     with one sunsubscribe per channel: the same message as the
//     acknowledgement of a SUNSUBSCRIBE.
//   - SUNSUBSCRIBE without channels is acknowledged once per shard channel
//     that the connection still has, or, with none left, once with a nil
//     channel (go-redis reports it as "").
//   - SUNSUBSCRIBE with channels is a keyed command: Redis acknowledges
//     each channel, subscribed or not, if it serves their slot, and refuses
//     the command with MOVED (CLUSTERDOWN if nobody serves it) if not.

import (
	"slices"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"
)

// sunsub is a sunsubscribe of ch as Redis sends it: the acknowledgement
// of a SUNSUBSCRIBE, or the notice that ch's slot moved away.
func sunsub(ch string) *redis.Subscription {
	return &redis.Subscription{Kind: verbSUnsubscribe, Channel: ch}
}

// Redis dropped every channel that a SUNSUBSCRIBE without channels was
// sent for while it was owed: the only answer left for it is the one
// without a channel. Heard while earlier commands were owed (one slot
// migrated away, the other's SSUBSCRIBE refused with MOVED), the drops
// leave that answer owed; heard when the SUNSUBSCRIBE was owed first,
// Redis's notices are taken as its acknowledgements, and the answer
// without a channel that follows changes nothing.
func TestMachineUnsubscribeAllWhenRedisDroppedEveryChannel(t *testing.T) {
	ssubscribed := func(ch string) *redis.Subscription {
		return &redis.Subscription{Kind: verbSSubscribe, Channel: ch, Count: 1}
	}
	for _, tc := range []struct {
		name string
		wire []any // Redis's replies to the SSUBSCRIBEs, the marker and the SUNSUBSCRIBE
	}{
		{"heard before", []any{
			ssubscribed("{a}n"),
			sunsub("{a}n"), // {a}'s slot migrates away
			errMoved,       // {b}'s slot is elsewhere already
			&redis.Pong{Payload: marker(1)},
			sunsub(noChannel), // the SUNSUBSCRIBE
		}},
		{"heard when owed first", []any{
			ssubscribed("{a}n"),
			ssubscribed("{b}n"),
			&redis.Pong{Payload: marker(1)},
			sunsub("{b}n"), // both slots migrate away
			sunsub("{a}n"),
			sunsub(noChannel), // the SUNSUBSCRIBE
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t, true)
			a, b := r.watch("{a}n"), r.watch("{b}n")
			r.plan() // ssubscribe {a}n, ssubscribe {b}n, the marker
			r.do(func(fx *effects) { r.m.unwatch(a, r.now, fx) })
			r.do(func(fx *effects) { r.m.unwatch(b, r.now, fx) })
			r.now = r.now.Add(r.unsubWait())
			r.plan()
			if got := r.wired(); !slices.Equal(got, []string{"sunsubscribe (all)"}) {
				t.Fatalf("sent %q; want one SUNSUBSCRIBE without channels (the case under test)", got)
			}
			r.wire = tc.wire
			for r.serveOne() {
			}
			if r.fx.broke {
				t.Fatal("the connection was given up")
			}
			if len(r.m.owed) != 0 {
				t.Fatalf("Redis answered everything, and %d commands are still owed, the first %q of %q",
					len(r.m.owed), r.m.owed[0].verb, r.m.owed[0].args)
			}
			c := r.watch("{c}n")
			r.settle()
			if r.fx.broke || !c.state.live {
				t.Fatalf("a new wait: connection given up %v, live %v", r.fx.broke, c.state.live)
			}
			r.check()
		})
	}
}

// The slots of channels unwatched move away before Redis runs their
// SUNSUBSCRIBEs, which name them: Redis's notices that it unsubscribed
// them look like acknowledgements, and a MOVED for each command follows.
// Neither is the reply of the wait sent meanwhile, and nobody else is
// disturbed.
func TestMachineNamedUnsubscribeOfAMigratedSlot(t *testing.T) {
	for _, tc := range []struct {
		name    string
		gone    []string // channels unwatched, whose slots move away
		notices []string // the order of Redis's notices
	}{
		{"one slot", []string{"{a}n"}, []string{"{a}n"}},
		{"two slots", []string{"{a}n", "{b}n"}, []string{"{a}n", "{b}n"}},
		{"two slots, noticed in the other order", []string{"{a}n", "{b}n"}, []string{"{b}n", "{a}n"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t, true)
			k := r.watch("{k}n") // stays, so the unsubscriptions name their channels
			var gone []*Watch
			for _, ch := range tc.gone {
				gone = append(gone, r.watch(ch))
			}
			r.settle()
			for _, w := range gone {
				r.do(func(fx *effects) { r.m.unwatch(w, r.now, fx) })
			}
			r.now = r.now.Add(r.unsubWait())
			r.plan()
			named := 0
			for _, c := range r.batch.cmds {
				if c.verb == verbSUnsubscribe && !c.all {
					named++
				}
			}
			if named != len(tc.gone) {
				t.Fatalf("sent %q; want one SUNSUBSCRIBE per slot (the case under test)", r.wired())
			}
			c := r.watch("{c}n") // a new wait, sent before any reply came
			r.plan()
			// Redis's replies: the notices and the refusals instead of
			// the acknowledgements, then the rest as planned.
			var wire []any
			for _, ch := range tc.notices {
				wire = append(wire, sunsub(ch))
			}
			for range tc.gone {
				wire = append(wire, errMoved)
			}
			r.wire = append(wire, r.wire[len(tc.gone):]...)
			for r.serveOne() {
			}
			if r.fx.broke || r.m.broken {
				t.Fatal("the connection was given up")
			}
			if ev := c.Take(); !ev.Reread || ev.Moved {
				t.Fatalf("the new wait: %+v; want it live, not moved", ev)
			}
			if ev := k.Take(); ev.Moved || ev.Err != nil || !k.state.live {
				t.Fatalf("the wait that stayed was disturbed: %+v", ev)
			}
			r.check()
			for _, w := range []*Watch{k, c} {
				r.publish(w.channels[0], "v")
				if ev := w.Take(); len(ev.Messages) != 1 {
					t.Fatalf("watch %v: %+v after the unsubscriptions", w.channels, ev)
				}
			}
		})
	}
}

// A SUNSUBSCRIBE that names a channel was acknowledged; then the channel's
// slot moved away, and the SSUBSCRIBE of a new wait in that slot was
// refused with MOVED. That refusal is the SSUBSCRIBE's: its wait moves,
// and the connection goes on.
func TestMachineMovedAfterANamedUnsubscribeIsTheNextCommands(t *testing.T) {
	r := newRig(t, true)
	k, a := r.watch("{k}n"), r.watch("{a}n")
	r.settle()
	r.do(func(fx *effects) { r.m.unwatch(a, r.now, fx) })
	r.now = r.now.Add(r.unsubWait())
	r.plan()
	if got := r.wired(); len(got) == 0 || got[0] != "sunsubscribe {a}n" {
		t.Fatalf("sent %q; want a SUNSUBSCRIBE of {a}n first (the case under test)", got)
	}
	again := r.watch("{a}e") // the same slot
	r.plan()
	i := slices.IndexFunc(r.wire, func(x any) bool {
		s, ok := x.(*redis.Subscription)
		return ok && s.Kind == verbSSubscribe
	})
	r.wire[i] = errMoved
	for r.serveOne() {
	}
	if r.fx.broke || r.m.broken {
		t.Fatal("the connection was given up")
	}
	if ev := again.Take(); !ev.Moved || again.state.attached {
		t.Fatalf("the wait whose SSUBSCRIBE was refused: %+v; want it moved", ev)
	}
	if ev := k.Take(); ev.Moved || !k.state.live {
		t.Fatalf("the wait that stayed was disturbed: %+v", ev)
	}
	r.check()
}

// A user who may not PING: the PING after a SUNSUBSCRIBE that names
// channels is refused, after the SUNSUBSCRIBE was acknowledged. That
// refusal is the PING's, and the connection goes on.
func TestMachineRefusedPingAfterANamedUnsubscribe(t *testing.T) {
	r := newRig(t, true)
	k, a := r.watch("{k}n"), r.watch("{a}n")
	r.settle()
	r.do(func(fx *effects) { r.m.unwatch(a, r.now, fx) })
	r.now = r.now.Add(r.unsubWait())
	r.plan()
	if got := r.wired(); !slices.Equal(got, []string{"sunsubscribe {a}n", "ping " + probePayload}) {
		t.Fatalf("sent %q; want a SUNSUBSCRIBE of {a}n, then a PING (the case under test)", got)
	}
	r.wire[1] = errNoPerm
	for r.serveOne() {
	}
	if r.fx.broke || r.m.broken {
		t.Fatal("the connection was given up")
	}
	c := r.watch("{c}n")
	r.settle()
	if !c.state.live || !k.state.live {
		t.Fatalf("live: the new wait %v, the one that stayed %v", c.state.live, k.state.live)
	}
	r.check()
}

// A wait ends while its SSUBSCRIBE is still owed, another wait stays, and
// the slot of the first moves away: before Redis runs the SSUBSCRIBE, or
// after, Redis's notice coming before or after the SUNSUBSCRIBE that
// names the channel is owed first. A wait sent meanwhile goes live.
func TestMachineNamedUnsubscribeOfAWaitNotYetSubscribed(t *testing.T) {
	ssubscribed := func(ch string) *redis.Subscription {
		return &redis.Subscription{Kind: verbSSubscribe, Channel: ch, Count: 1}
	}
	pong := func(payload string) *redis.Pong { return &redis.Pong{Payload: payload} }
	for _, tc := range []struct {
		name string
		wire []any // Redis's replies once the new wait is sent
	}{
		{"moved before the SSUBSCRIBE", []any{
			errMoved, pong(marker(2)), errMoved, pong(probePayload),
			ssubscribed("{c}n"), pong(marker(3)),
		}},
		{"moved after the SSUBSCRIBE, noticed before its marker", []any{
			ssubscribed("{a}n"), sunsub("{a}n"), pong(marker(2)), errMoved, pong(probePayload),
			ssubscribed("{c}n"), pong(marker(3)),
		}},
		{"moved after the SSUBSCRIBE, noticed after its marker", []any{
			ssubscribed("{a}n"), pong(marker(2)), sunsub("{a}n"), errMoved, pong(probePayload),
			ssubscribed("{c}n"), pong(marker(3)),
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t, true)
			k := r.watch("{k}n")
			r.settle()
			a := r.watch("{a}n")
			r.plan() // ssubscribe {a}n, marker 2
			r.do(func(fx *effects) { r.m.unwatch(a, r.now, fx) })
			r.now = r.now.Add(r.unsubWait())
			r.plan() // sunsubscribe {a}n, a PING
			c := r.watch("{c}n")
			r.plan() // ssubscribe {c}n, marker 3
			want := []string{"ssubscribe {a}n", "ping " + marker(2), "sunsubscribe {a}n", "ping " + probePayload,
				"ssubscribe {c}n", "ping " + marker(3)}
			var got []string // what was sent, since nothing was answered
			for _, o := range r.m.owed {
				got = append(got, o.verb+" "+strings.Join(o.args, " "))
			}
			if !slices.Equal(got, want) {
				t.Fatalf("sent %q, want %q (the case under test)", got, want)
			}
			r.wire = tc.wire
			for r.serveOne() {
			}
			if r.fx.broke || r.m.broken {
				t.Fatal("the connection was given up")
			}
			if !c.state.live || !k.state.live {
				t.Fatalf("live: the new wait %v, the one that stayed %v", c.state.live, k.state.live)
			}
			r.check()
		})
	}
}
