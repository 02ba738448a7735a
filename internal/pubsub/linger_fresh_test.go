package pubsub

import (
	"testing"
	"time"
)

// A freshness PING that Redis refuses (BUSY during a long script, an ACL
// without PING) answers in order just as a PONG does: it renews freshness,
// and the next freshness PING goes out (found by a review: freshOut stayed
// true, and the L1 served nothing again on that connection).
func TestMachineRefusedFreshnessPingStillRenewsFreshness(t *testing.T) {
	r, _ := trackRig(t, false)
	r.plan()
	r.dial()
	r.settle()
	if !r.m.track.live || r.m.fresh.Load() == nil {
		t.Fatal("not live")
	}
	r.now = r.timer
	r.plan()
	if got := r.wired(); len(got) != 1 || got[0] != "ping "+probePayload {
		t.Fatalf("sent %q, want the freshness PING", got)
	}
	r.refuseNext(errBusy)
	before := r.m.fresh.Load()
	pings := 0
	for range 50 { // 5 s of a healthy, answering connection
		r.now = r.now.Add(100 * time.Millisecond)
		r.plan()
		for _, c := range r.batch.cmds {
			if c.verb == verbPing {
				pings++
			}
		}
		for r.serveOne() {
		}
	}
	if pings == 0 || r.m.fresh.Load() == before {
		t.Fatalf("5 s after a refused freshness PING: %d PINGs sent, fresh never moved (freshOut=%v): the L1 serves nothing", pings, r.m.freshOut)
	}
}

// Lingering shard channels: a new wait reuses one without a command; a
// migration notice for one is not taken as an answer; a broken connection
// forgets them; the last wait's end sends one SUNSUBSCRIBE without channels.
func TestMachineLingeringShardChannels(t *testing.T) {
	r, _ := trackRig(t, true)
	r.plan()
	r.dial()
	r.settle()
	a, b, c := r.watch("{a}n"), r.watch("{b}n"), r.watch("{c}n")
	r.settle()
	r.do(func(fx *effects) { r.m.unwatch(a, r.now, fx) })
	r.do(func(fx *effects) { r.m.unwatch(b, r.now, fx) })
	r.settle()
	r.check()
	// a new wait on a lingering channel
	a2 := r.watch("{a}n")
	r.plan()
	for _, got := range r.wired() {
		if got == "ssubscribe {a}n" {
			t.Fatalf("re-subscribed a lingering channel: %q", r.wired())
		}
	}
	for r.serveOne() {
	}
	if !a2.state.live {
		t.Fatal("the new wait on a lingering channel is not live")
	}
	// {b}'s slot migrates away while it lingers
	r.fx = effects{}
	r.feed(sunsub("{b}n"), nil)
	if r.fx.broke || r.fx.moved {
		t.Fatalf("a migration notice for a lingering channel: broke %v moved %v", r.fx.broke, r.fx.moved)
	}
	r.do(func(fx *effects) { r.m.unwatch(a2, r.now, fx) })
	r.do(func(fx *effects) { r.m.unwatch(c, r.now, fx) })
	r.now = r.now.Add(unsubscribeDelay)
	r.plan()
	for r.serveOne() {
	}
	if r.fx.broke {
		t.Fatal("broke")
	}
	r.settle()
	r.check()
	if len(r.m.sent) != 1 {
		t.Fatalf("sent %v", r.m.sent)
	}
	// a broken connection while channels linger
	d, e := r.watch("{d}n"), r.watch("{e}n")
	r.settle()
	r.do(func(fx *effects) { r.m.unwatch(d, r.now, fx) })
	r.feed(nil, errEOF)
	r.plan()
	r.dial()
	r.settle()
	r.check()
	_ = e
}

// How much one plan costs while n shard channels linger: it must not walk
// them (it did, 198 µs a plan with 5,000, under Subscriber.mu).
func BenchmarkPlanWhileLingering(b *testing.B) {
	for _, n := range []int{0, 5000} {
		b.Run(itoa(n), func(b *testing.B) {
			t := &testing.T{}
			r := newRig(t, true)
			keep := r.watch("{keep}n")
			_ = keep
			var ws []*Watch
			for i := range n {
				ws = append(ws, r.watch("{"+itoa(i)+"}n"))
			}
			r.plan()
			for r.serveOne() {
			}
			for _, w := range ws {
				r.do(func(fx *effects) { r.m.unwatch(w, r.now, fx) })
			}
			b.ResetTimer()
			for range b.N {
				r.m.plan(r.now)
			}
		})
	}
}
