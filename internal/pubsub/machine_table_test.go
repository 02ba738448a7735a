package pubsub

import (
	"errors"
	"fmt"
	"testing"

	"github.com/redis/go-redis/v9"
)

// The table below crosses every step of a connection's life with every
// way a connection can fail at that step, on a plain and on a sharded
// machine, and checks what each failure must lead to once everything has
// settled.

type tableScene struct {
	r    *rig
	a, b *Watch // a has channels n and e of id a; b one channel of id b
}

func newScene(t *testing.T, sharded bool) *tableScene {
	r := newRig(t, sharded)
	sc := &tableScene{r: r}
	if sharded {
		sc.a, sc.b = r.watch("{a}n", "{a}e"), r.watch("{b}n")
	} else {
		sc.a, sc.b = r.watch("n:a", "e:a"), r.watch("n:b")
	}
	return sc
}

var tableSteps = []struct {
	name string
	run  func(sc *tableScene)
}{
	{"planned", func(sc *tableScene) { sc.r.plan() }},
	{"half-acknowledged", func(sc *tableScene) { sc.r.plan(); sc.r.serveOne() }},
	{"subscribed", func(sc *tableScene) {
		sc.r.plan()
		for len(sc.r.wire) > 1 {
			sc.r.serveOne()
		}
	}},
	{"subscribing alone", func(sc *tableScene) {
		// A batch was refused: its channels go one per command.
		sc.r.plan()
		sc.r.refuseNext(errNoPerm)
		for sc.r.serveOne() {
		}
		sc.r.plan()
	}},
	{"live", func(sc *tableScene) { sc.r.settle() }},
	{"messaged", func(sc *tableScene) { sc.r.settle(); sc.r.publish(sc.a.channels[0], "v") }},
	{"syncing", func(sc *tableScene) {
		sc.r.settle()
		sc.r.do(func(fx *effects) { sc.r.m.sync(sc.a, fx) })
		sc.r.plan()
	}},
	{"unsubscribing", func(sc *tableScene) {
		sc.r.settle()
		sc.r.do(func(fx *effects) { sc.r.m.unwatch(sc.b, sc.r.now, fx) })
		sc.r.now = sc.r.now.Add(sc.r.unsubWait())
		sc.r.plan()
	}},
	{"probing", func(sc *tableScene) {
		sc.r.settle()
		sc.r.feed(nil, timeoutError{})
		sc.r.plan()
	}},
}

var tableFailures = []struct {
	name string
	run  func(sc *tableScene)
}{
	{"write error", func(sc *tableScene) {
		sc.r.do(func(fx *effects) { sc.r.m.sendFailed(sc.r.gen, errFakeWrite, sc.r.now, fx) })
	}},
	{"reconnect inside a call", func(sc *tableScene) {
		// go-redis dialled again and re-sent every subscription.
		sc.r.feed(&redis.Subscription{Kind: sc.r.m.verb(sc.a.channels[0], true), Channel: sc.a.channels[0], Count: 1}, nil)
	}},
	{"unexpected ack", func(sc *tableScene) {
		sc.r.feed(&redis.Subscription{Kind: verbUnsubscribe, Channel: "stray"}, nil)
	}},
	{"unexpected pong", func(sc *tableScene) { sc.r.feed(&redis.Pong{Payload: marker(999)}, nil) }},
	{"BUSY", func(sc *tableScene) { sc.refuse(errBusy) }},
	{"LOADING", func(sc *tableScene) { sc.refuse(errLoading) }},
	{"NOPERM", func(sc *tableScene) { sc.refuse(errNoPerm) }},
	{"MOVED", func(sc *tableScene) { sc.refuse(errMoved) }},
	{"silence", func(sc *tableScene) {
		sc.r.feed(nil, timeoutError{})
		sc.r.feed(nil, timeoutError{})
	}},
	{"connection lost", func(sc *tableScene) { sc.r.feed(nil, errEOF) }},
	{"close", func(sc *tableScene) { sc.r.do(func(fx *effects) { sc.r.m.close(fx) }) }},
}

// refuse answers the command owed first with err, or, if none is owed
// (or it is half answered), sends err unasked.
func (sc *tableScene) refuse(err error) {
	r := sc.r
	if len(r.m.owed) == 0 || r.m.owed[0].acked != 0 {
		r.wire = nil
		r.feed(nil, err)
		return
	}
	r.refuseNext(err)
}

type outcome int

const (
	reconnects   outcome = iota // a new connection; every watch looks again (sharded: moves)
	retriesAlone                // the channels are subscribed again, one per command
	markerBack                  // a refused PING: its marker counts as back
	ignored                     // a refused UNSUBSCRIBE
	rejects                     // the watches of the channel get the error
	moves                       // the watches of the channels move
	closes
)

// expected is what failure must lead to, given the command owed first.
func expected(failure string, sharded bool, head *owed) outcome {
	switch failure {
	case "close":
		return closes
	case "BUSY", "LOADING", "NOPERM", "MOVED":
	default:
		return reconnects
	}
	switch {
	case head == nil || head.acked != 0:
		return reconnects // an error reply nobody asked for
	case head.verb == verbPing:
		return markerBack
	case sharded && head.verb == verbSSubscribe && failure == "MOVED":
		return moves
	case failure == "BUSY" || failure == "LOADING":
		return reconnects
	case head.verb == verbUnsubscribe || head.verb == verbSUnsubscribe:
		return ignored
	case len(head.args) > 1:
		return retriesAlone
	default:
		return rejects
	}
}

func TestMachineEveryStepCrossedWithEveryFailure(t *testing.T) {
	seen := make(map[outcome]int)
	for _, sharded := range []bool{false, true} {
		for _, step := range tableSteps {
			for _, failure := range tableFailures {
				name := fmt.Sprintf("sharded=%v/%s/%s", sharded, step.name, failure.name)
				t.Run(name, func(t *testing.T) {
					sc := newScene(t, sharded)
					step.run(sc)
					var head *owed
					if len(sc.r.m.owed) > 0 {
						h := sc.r.m.owed[0]
						head = &h
					}
					want := expected(failure.name, sharded, head)
					seen[want]++
					sc.a.Take()
					sc.b.Take()
					gen, attached := sc.r.m.gen, sc.attached()
					failure.run(sc)
					sc.r.settle()
					sc.verify(want, head, gen, attached)
				})
			}
		}
	}
	for o := reconnects; o <= closes; o++ {
		if seen[o] == 0 {
			t.Errorf("no cell of the table leads to outcome %d", o)
		}
	}
}

func (sc *tableScene) attached() map[*Watch]bool {
	return map[*Watch]bool{sc.a: sc.a.state.attached, sc.b: sc.b.state.attached}
}

// verify checks the settled scene against the outcome wanted.
func (sc *tableScene) verify(want outcome, head *owed, gen uint64, attached map[*Watch]bool) {
	r, t := sc.r, sc.r.t
	t.Helper()
	evs := map[*Watch]Events{sc.a: sc.a.Take(), sc.b: sc.b.Take()}
	if want == closes {
		for w, was := range attached {
			if was && !evs[w].Closed {
				t.Fatalf("watch %v not closed", w.channels)
			}
		}
		return
	}
	r.check()
	if replaced := r.m.gen != gen; replaced != (want == reconnects) {
		t.Fatalf("outcome %d: connection replaced = %v", want, replaced)
	}
	for w, was := range attached {
		if was {
			sc.verifyWatch(w, evs[w], want, head)
		}
	}
	sc.deliversAfterwards()
}

func (sc *tableScene) verifyWatch(w *Watch, ev Events, want outcome, head *owed) {
	t := sc.r.t
	t.Helper()
	hit := head != nil && sharesChannel(w, head.args)
	switch {
	case want == reconnects && sc.r.m.sharded, want == moves && hit:
		if !ev.Moved || w.state.attached {
			t.Fatalf("watch %v should have moved: %+v", w.channels, ev)
		}
	case want == reconnects:
		if !ev.Reread || !w.state.live {
			t.Fatalf("watch %v should look again on the new connection: %+v", w.channels, ev)
		}
	case want == rejects && hit:
		if !errors.Is(ev.Err, errNoPerm) && !errors.Is(ev.Err, errMoved) {
			t.Fatalf("watch %v should carry the refusal: %+v", w.channels, ev)
		}
	case want == retriesAlone && hit:
		if !ev.Reread || !w.state.live || len(sc.r.m.solo) == 0 {
			t.Fatalf("watch %v should be live after a retry alone: %+v", w.channels, ev)
		}
	default:
		if ev.Err != nil || ev.Moved || !w.state.live {
			t.Fatalf("watch %v disturbed by a failure that concerned it not: %+v", w.channels, ev)
		}
	}
}

func sharesChannel(w *Watch, chans []string) bool {
	for _, ch := range chans {
		for _, c := range w.channels {
			if c == ch {
				return true
			}
		}
	}
	return false
}

// deliversAfterwards publishes on every attached, unrefused watch's first
// channel, and checks that the message and its value arrive.
func (sc *tableScene) deliversAfterwards() {
	t := sc.r.t
	t.Helper()
	for _, w := range []*Watch{sc.a, sc.b} {
		if !w.state.attached || w.box.Err != nil {
			continue
		}
		sc.r.publish(w.channels[0], "after")
		if ev := w.Take(); len(ev.Messages) != 1 || ev.Messages[0].Payload != "after" {
			t.Fatalf("watch %v lost a message published after recovery: %+v", w.channels, ev)
		}
	}
}
