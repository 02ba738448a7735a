package pubsub

import (
	"errors"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

func TestMachineWatchGoesLiveWhenItsMarkerReturns(t *testing.T) {
	r := newRig(t, false)
	w := r.watch("n:a", "e:a")
	r.plan()
	if got, want := r.wired(), []string{"subscribe e:a n:a", "ping " + marker(1)}; !slices.Equal(got, want) {
		t.Fatalf("sent %q, want %q", got, want)
	}
	r.serveOne()
	r.serveOne() // both acks: subscribed, not yet known to be
	if ev := w.Take(); ev.Reread {
		t.Fatal("reread before the marker came back")
	}
	r.serveOne()
	if ev := w.Take(); !ev.Reread {
		t.Fatal("no reread once the marker came back")
	}
	r.check()
}

func TestMachineBurstIsOneSubscribeAndOneMarker(t *testing.T) {
	r := newRig(t, false)
	for i := range 1000 {
		r.watch("n:"+itoa(i), "e:"+itoa(i))
	}
	r.plan()
	if len(r.batch.cmds) != 2 || len(r.batch.cmds[0].args) != 2000 {
		t.Fatalf("a burst of 1000 watches sent %d commands", len(r.batch.cmds))
	}
	r.settle()
	r.check()
}

func TestMachineUnsubscribesWaitAndGoOutTogether(t *testing.T) {
	r := newRig(t, false)
	ws := []*Watch{r.watch("a"), r.watch("b"), r.watch("c")}
	r.settle()
	var fx effects
	r.m.unwatch(ws[0], r.now, &fx)
	if !fx.wake {
		t.Fatal("the first stop of a burst does not wake the owner")
	}
	fx = effects{}
	r.m.unwatch(ws[1], r.now, &fx)
	if fx.wake {
		t.Fatal("a later stop of the same burst wakes the owner again")
	}
	b, wakeAt := r.m.plan(r.now)
	if len(b.cmds) != 0 || !wakeAt.Equal(r.now.Add(unsubscribeDelay)) {
		t.Fatalf("unsubscribed at once (%v), or wakes at %v", b.cmds, wakeAt)
	}
	r.now = wakeAt
	r.plan()
	if got := r.wired(); !slices.Equal(got, []string{"unsubscribe a b"}) {
		t.Fatalf("sent %q", got)
	}
	r.settle()
	r.check()
}

func TestMachineResubscribeBeforeTheDelayKeepsTheChannel(t *testing.T) {
	r := newRig(t, false)
	w := r.watch("a")
	r.settle()
	r.do(func(fx *effects) { r.m.unwatch(w, r.now, fx) })
	w2 := r.watch("a")
	r.settle()
	for _, c := range r.batch.cmds {
		if c.verb == verbUnsubscribe {
			t.Fatal("unsubscribed a channel watched again")
		}
	}
	if !w2.Take().Reread {
		t.Fatal("the new watch never went live")
	}
	r.check()
}

func TestMachineDeliversMessagesAndValues(t *testing.T) {
	r := newRig(t, false)
	var got []string
	w := newWatch(func(p string) { got = append(got, p) }, []string{"n:a", "e:a"})
	r.do(func(fx *effects) { r.m.watch(w, fx) })
	r.settle()
	fx := r.publish("n:a", "v1")
	r.publish("e:a", "ev")
	r.publish("other", "x")
	for _, v := range fx.values {
		v.f(v.payload)
	}
	if !slices.Equal(got, []string{"v1"}) {
		t.Fatalf("onValue got %q, want only the first channel's payload", got)
	}
	ev := w.Take()
	if len(ev.Messages) != 2 || ev.Messages[0].Payload != "v1" || ev.Messages[1].Payload != "ev" {
		t.Fatalf("messages %v", ev.Messages)
	}
}

func TestMachineShardedGroupsBySlotAndKeepsInvalidationsPlain(t *testing.T) {
	r := newRig(t, true)
	tracker := newWatch(nil, []string{invalidationChannel})
	r.m.tracker = tracker
	r.do(func(fx *effects) { r.m.watch(tracker, fx) })
	r.watch("{a}n", "{a}e")
	r.watch("{b}n")
	r.plan()
	want := []string{"subscribe " + invalidationChannel, "ssubscribe {a}e {a}n", "ssubscribe {b}n", "ping " + marker(1)}
	if got := r.wired(); !slices.Equal(got, want) {
		t.Fatalf("sent %q, want %q", got, want)
	}
	r.settle()
	r.check()
}

// A burst of sharded waits in many slots that all end (a mass expiry) is
// unsubscribed with one SUNSUBSCRIBE without channels, whose
// acknowledgements come in Redis's order; while one wait stays, the ended
// ones linger, then go slot by slot after shardLinger.
func TestMachineShardedBurstEndsWithOneUnsubscribe(t *testing.T) {
	r := newRig(t, true)
	var ws []*Watch
	for i := range 50 {
		ws = append(ws, r.watch("{"+itoa(i)+"}n", "{"+itoa(i)+"}e"))
	}
	r.settle()
	for _, w := range ws[:10] {
		r.do(func(fx *effects) { r.m.unwatch(w, r.now, fx) })
	}
	r.now = r.now.Add(unsubscribeDelay)
	if b := r.plan(); len(b.cmds) != 0 {
		t.Fatalf("10 ended waits in 10 slots, 40 left: sent %q at once, want them to linger", r.wired())
	}
	r.now = r.now.Add(shardLinger)
	r.plan()
	got := r.wired()
	var want []string
	for i := range 10 {
		want = append(want, "sunsubscribe {"+itoa(i)+"}e {"+itoa(i)+"}n")
	}
	want = append(want, "ping "+probePayload) // after SUNSUBSCRIBEs that name channels: see slot.go
	if !slices.Equal(got, want) {
		t.Fatalf("10 ended waits in 10 slots, 40 left: sent %q, want one SUNSUBSCRIBE per slot, then a PING", got)
	}
	r.settle()
	for _, w := range ws[10:] {
		r.do(func(fx *effects) { r.m.unwatch(w, r.now, fx) })
	}
	r.now = r.now.Add(unsubscribeDelay)
	r.plan()
	if got := r.wired(); !slices.Equal(got, []string{"sunsubscribe (all)"}) {
		t.Fatalf("the last 40 waits ended: sent %q, want one SUNSUBSCRIBE without channels", got)
	}
	r.settle()
	r.check()
	w := r.watch("{x}n") // and the connection serves new waits after it
	r.settle()
	if !w.state.live {
		t.Fatal("a wait after the unsubscription never went live")
	}
	r.check()
}

func TestMachineSyncAnswersOnceItsMarkerIsBack(t *testing.T) {
	r := newRig(t, false)
	w := r.watch("a")
	r.settle()
	w.Take()
	r.do(func(fx *effects) { r.m.sync(w, fx) })
	r.plan()
	r.publish("a", "before") // published before the marker's PING was processed
	if w.box.Synced {
		t.Fatal("synced before the marker came back")
	}
	r.serveOne()
	ev := w.Take()
	if !ev.Synced || ev.Reread || len(ev.Messages) != 1 {
		t.Fatalf("after the sync marker: %+v", ev)
	}
}

func TestMachineSyncOfAWatchNotLiveYetIsAReread(t *testing.T) {
	r := newRig(t, false)
	w := r.watch("a")
	r.do(func(fx *effects) { r.m.sync(w, fx) })
	r.settle()
	ev := w.Take()
	if !ev.Reread || ev.Synced {
		t.Fatalf("a sync asked before the watch was live: %+v", ev)
	}
}

func TestMachineSyncAcrossABreakIsAReread(t *testing.T) {
	r := newRig(t, false)
	w := r.watch("a")
	r.settle()
	w.Take()
	r.do(func(fx *effects) { r.m.sync(w, fx) })
	r.plan()
	r.feed(nil, errEOF)
	r.settle()
	ev := w.Take()
	if !ev.Reread || ev.Synced {
		t.Fatalf("a sync across a break: %+v", ev)
	}
}

func TestMachineRefusedPingStillCountsAsItsMarker(t *testing.T) {
	r := newRig(t, false)
	w := r.watch("a")
	r.plan()
	r.serveOne()
	r.refuseNext(errNoPerm)
	if !w.Take().Reread {
		t.Fatal("a refused marker PING did not count as back")
	}
}

func TestMachineRefusedBatchIsRetriedOnePerCommand(t *testing.T) {
	r := newRig(t, false)
	a, b := r.watch("a"), r.watch("b")
	r.plan()
	r.refuseNext(errNoPerm)
	r.serveOne() // the marker: a and b are not live, their retry is due
	if a.Take().Reread || b.Take().Reread {
		t.Fatal("live though their SUBSCRIBE was refused")
	}
	r.plan()
	if got := r.wired(); !slices.Equal(got, []string{"subscribe a", "subscribe b", "ping " + marker(2)}) {
		t.Fatalf("retry sent %q", got)
	}
	r.serveOne()
	r.refuseNext(errNoPerm) // b is refused on its own
	r.serveOne()
	if !a.Take().Reread {
		t.Fatal("a never went live")
	}
	if ev := b.Take(); !errors.Is(ev.Err, errNoPerm) || ev.Reread {
		t.Fatalf("b, refused alone: %+v", ev)
	}
	r.settle()
	r.check()
}

func TestMachineShardedMovedAndMigratedSlots(t *testing.T) {
	r := newRig(t, true)
	a, b := r.watch("{a}n", "{a}e"), r.watch("{b}n")
	r.plan()
	r.refuseNext(errMoved) // {a}'s SSUBSCRIBE
	if ev := a.Take(); !ev.Moved || a.state.attached {
		t.Fatalf("a after MOVED: %+v", ev)
	}
	r.settle()
	if !b.Take().Reread {
		t.Fatal("b never went live")
	}
	fx := r.feed(&redis.Subscription{Kind: verbSUnsubscribe, Channel: "{b}n"}, nil)
	if ev := b.Take(); !ev.Moved || fx.stop {
		t.Fatalf("b after its slot migrated: %+v (reader stopped: %v)", ev, fx.stop)
	}
	r.settle()
	r.check()
	if len(r.m.sent) != 0 || len(r.m.dirty) != 0 || len(r.m.unwanted) != 0 {
		t.Fatalf("left behind: sent %v, dirty %v, unwanted %v", r.m.sent, r.m.dirty, r.m.unwanted)
	}
}

func TestMachineProbesASilentConnectionThenGivesItUp(t *testing.T) {
	r := newRig(t, false)
	w := r.watch("a")
	r.settle()
	w.Take()
	timeout := timeoutError{}
	r.feed(nil, timeout)
	r.plan()
	if got := r.wired(); !slices.Equal(got, []string{"ping " + probePayload}) {
		t.Fatalf("after a silence sent %q", got)
	}
	r.serveOne()
	r.feed(nil, timeout) // answered: a new silence asks again
	if r.m.broken {
		t.Fatal("gave up a connection that answered its probe")
	}
	r.plan()
	if fx := r.feed(nil, timeout); !fx.stop || !r.m.broken {
		t.Fatal("kept a connection silent through its probe")
	}
	r.settle()
	if !w.Take().Reread {
		t.Fatal("no reread on the new connection")
	}
}

func TestMachineIgnoresAnOldConnection(t *testing.T) {
	r := newRig(t, false)
	r.watch("a")
	r.settle()
	old := r.gen
	r.feed(nil, errEOF)
	r.settle()
	var fx effects
	r.m.receive(old, &redis.Message{Channel: "a"}, nil, r.now, &fx)
	if !fx.stop || len(fx.notes) != 0 {
		t.Fatalf("an old connection's reader was not stopped: %+v", fx)
	}
}

func TestMachineCloseTellsEveryWatchAndRefusesLateOnes(t *testing.T) {
	r := newRig(t, false)
	w := r.watch("a")
	r.settle()
	r.do(func(fx *effects) { r.m.close(fx) })
	late := r.watch("b")
	if !w.Take().Closed || !late.Take().Closed {
		t.Fatal("a watch was not told of the close")
	}
	if b, _ := r.m.plan(r.now); len(b.cmds) != 0 {
		t.Fatalf("planned %v after close", b.cmds)
	}
}

func TestMachineRetireMovesWatchesAndLateOnes(t *testing.T) {
	r := newRig(t, true)
	w := r.watch("{a}n")
	r.settle()
	r.do(func(fx *effects) { r.m.retire(r.now, fx) })
	late := r.watch("{a}n")
	for _, x := range []*Watch{w, late} {
		if ev := x.Take(); !ev.Moved || ev.Closed {
			t.Fatalf("a watch of a retired subscriber: %+v", ev)
		}
	}
}

// timeoutError is a read that timed out, as net reports it.
type timeoutError struct{}

func (timeoutError) Error() string   { return "i/o timeout" }
func (timeoutError) Timeout() bool   { return true }
func (timeoutError) Temporary() bool { return true }

func itoa(i int) string { return strconv.Itoa(i) }

func TestMachineUnsubscribeDelayIsNotLeftOverByAWatchThatCameBack(t *testing.T) {
	r := newRig(t, false)
	a, b := r.watch("a"), r.watch("b")
	r.settle()
	r.do(func(fx *effects) { r.m.unwatch(a, r.now, fx) })
	r.watch("a") // back before the delay: nothing to unsubscribe
	r.plan()     // at once, before the delay is over
	for r.serveOne() {
	}
	r.now = r.now.Add(time.Second)
	r.do(func(fx *effects) { r.m.unwatch(b, r.now, fx) })
	r.settle() // fails if b's end starts no delay, and wakes nobody
	if _, ok := r.m.sent["b"]; ok {
		t.Fatal("b is still subscribed")
	}
}

// Waits in many slots that end one after another, within shardLinger of
// the first (the callers a mass expiry wakes), cost one SUNSUBSCRIBE
// without channels in all: the ended ones linger until the last ends.
func TestMachineShardedWaitsEndingInTurnLingerIntoOneUnsubscribe(t *testing.T) {
	r := newRig(t, true)
	var ws []*Watch
	for i := range 50 {
		ws = append(ws, r.watch("{"+itoa(i)+"}n"))
	}
	r.settle()
	var sent []string
	for _, w := range ws {
		r.do(func(fx *effects) { r.m.unwatch(w, r.now, fx) })
		r.now = r.now.Add(10 * time.Millisecond)
		if r.woken || (!r.timer.IsZero() && !r.now.Before(r.timer)) {
			r.plan()
			sent = append(sent, r.wired()...)
			for r.serveOne() {
			}
		}
	}
	r.now = r.now.Add(unsubscribeDelay)
	r.plan()
	sent = append(sent, r.wired()...)
	for r.serveOne() {
	}
	if !slices.Equal(sent, []string{"sunsubscribe (all)"}) {
		t.Fatalf("50 waits ended 10 ms apart: sent %q, want one SUNSUBSCRIBE without channels", sent)
	}
	r.check()
}
