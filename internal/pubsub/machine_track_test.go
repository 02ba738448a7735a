package pubsub

import (
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/memolock/memolock/internal/mono"
)

// trackRig is a rig whose machine tracks, as newTracking sets it up.
func trackRig(t *testing.T, sharded bool) (*rig, *Watch) {
	r := newRig(t, sharded)
	w := newWatch(nil, []string{invalidationChannel})
	r.m.tracker = w
	r.do(func(fx *effects) { r.m.watch(w, fx) })
	return r, w
}

// dial is what the tracking client's dial hook does.
func (r *rig) dial() { r.do(func(fx *effects) { r.m.dialled(fx) }) }

func TestMachineTrackingIsLiveOnlyAfterAMarkerSentAfterTheDial(t *testing.T) {
	r, _ := trackRig(t, false)
	r.plan()
	r.dial() // the first command dials: the marker already planned does not count
	for r.serveOne() {
	}
	if r.m.track.live {
		t.Fatal("live on a marker planned before the dial")
	}
	epoch := r.m.track.epoch
	r.settle()
	if !r.m.track.live || r.m.track.epoch != epoch {
		t.Fatalf("after a marker sent after the dial: live %v, epoch %d (was %d)", r.m.track.live, r.m.track.epoch, epoch)
	}
	r.dial() // go-redis redials inside a call
	if r.m.track.live || r.m.track.epoch == epoch {
		t.Fatal("a dial did not end liveness")
	}
	epoch = r.m.track.epoch
	r.feed(nil, errEOF)
	if r.m.track.epoch == epoch {
		t.Fatal("a break did not bump the epoch")
	}
	r.plan()
	r.dial()
	r.settle()
	if !r.m.track.live {
		t.Fatal("not live again on the new connection")
	}
	r.check()
}

func TestMachineTrackingRefusedOnOneConnectionIsAskedAgainOnTheNext(t *testing.T) {
	r, _ := trackRig(t, false)
	r.plan()
	r.dial()
	r.do(func(fx *effects) { r.m.trackingRefused(errNoPerm, fx) })
	r.settle()
	if r.m.track.live || r.m.track.refused == nil {
		t.Fatal("live although CLIENT TRACKING was refused")
	}
	if len(r.fx.warnings) != 1 {
		t.Fatalf("warnings %v", r.fx.warnings)
	}
	r.feed(nil, errEOF)
	r.plan()
	r.dial()
	r.settle()
	if !r.m.track.live {
		t.Fatal("a refusal was remembered past the next connection")
	}
}

func TestMachineRefusedInvalidationChannelEndsTrackingUntilTheNextConnection(t *testing.T) {
	r, _ := trackRig(t, false)
	r.plan()
	r.dial()
	r.refuseNext(errNoPerm)
	r.settle()
	if r.m.track.live || !errors.Is(r.m.track.refused, errNoPerm) {
		t.Fatalf("after NOPERM on the invalidation channel: live %v, refused %v", r.m.track.live, r.m.track.refused)
	}
	r.feed(nil, errEOF)
	r.plan()
	r.dial()
	r.settle()
	if !r.m.track.live {
		t.Fatal("the invalidation channel was not asked for again")
	}
	r.check()
}

func TestMachineInvalidationsAndFlushes(t *testing.T) {
	r, tracker := trackRig(t, false)
	r.plan()
	r.dial()
	r.settle()
	fx := r.feed(&redis.Message{Channel: invalidationChannel, PayloadSlice: []string{"t:a", "t:b"}}, nil)
	if len(fx.invalidations) != 1 || !slices.Equal(fx.invalidations[0], []string{"t:a", "t:b"}) {
		t.Fatalf("invalidations %v", fx.invalidations)
	}
	flush := errors.New("redis: unsupported pubsub message payload: <nil>")
	fx = r.feed(nil, flush)
	if len(fx.invalidations) != 1 || fx.invalidations[0] != nil || fx.stop || r.m.broken {
		t.Fatalf("a FLUSHALL invalidation: %+v, broken %v", fx, r.m.broken)
	}
	if !r.m.track.live {
		t.Fatal("a flush ended tracking")
	}
	if ev := tracker.Take(); len(ev.Messages) != 0 {
		t.Fatal("invalidations pile up in the tracker's mailbox")
	}
}

func TestMachineNilPayloadWithoutTrackingIsABreak(t *testing.T) {
	r := newRig(t, false)
	r.watch("a")
	r.settle()
	if fx := r.feed(nil, errors.New("redis: unsupported pubsub message payload: <nil>")); !fx.stop {
		t.Fatal("an undecodable message on a connection that does not track was taken in")
	}
}

// A tracking machine whose tracking is live sends a PING every
// freshEvery, one at a time, and each PONG records, for the epoch, when
// its PING was planned: the L1 serves only while that is recent. A dial
// forgets it.
func TestMachineFreshnessPingsAndTheirPongs(t *testing.T) {
	r, _ := trackRig(t, false)
	r.plan()
	r.dial()
	r.settle()
	if !r.m.track.live {
		t.Fatal("tracking not live")
	}
	f := r.m.fresh.Load()
	if f == nil || f.epoch != r.m.track.epoch {
		t.Fatalf("after the marker's PONG: fresh %+v, epoch %d", f, r.m.track.epoch)
	}
	if r.timer.IsZero() || r.timer.After(r.now.Add(freshEvery)) {
		t.Fatalf("owner timer %v, want a freshness PING within %v of %v", r.timer, freshEvery, r.now)
	}
	r.now = r.timer
	planned := r.now
	r.plan()
	if got := r.wired(); !slices.Equal(got, []string{"ping " + probePayload}) {
		t.Fatalf("at the due time the owner sent %q, want one probe PING", got)
	}
	r.now = r.now.Add(5 * freshEvery) // its PONG is late
	if b := r.plan(); len(b.cmds) != 0 {
		t.Fatalf("a second freshness PING while one is out: %q", r.wired())
	}
	if f := r.m.fresh.Load(); f.at >= mono.At(planned) {
		t.Fatal("fresh moved before the PONG came")
	}
	if !r.serveOne() {
		t.Fatal("nothing on the wire")
	}
	if f := r.m.fresh.Load(); f == nil || f.at != mono.At(planned) {
		t.Fatalf("after the PONG: fresh %+v, want the PING's planning time %v", f, mono.At(planned))
	}
	if !r.woken {
		t.Fatal("the PONG did not wake the owner to plan the next PING")
	}
	r.dial()
	if r.m.fresh.Load() != nil {
		t.Fatal("a dial left the connection fresh")
	}
}

// Heard answers only for the epoch it was proved in.
func TestSubscriberHeardIsPerEpoch(t *testing.T) {
	s := &Subscriber{m: newMachine(false)}
	if _, ok := s.Heard(0); ok {
		t.Fatal("heard with nothing heard")
	}
	at := mono.Now() - time.Minute
	s.m.fresh.Store(&freshness{epoch: 3, at: at})
	if got, ok := s.Heard(3); !ok || got != at {
		t.Fatalf("Heard(3) = %v, %v; want %v, true", got, ok, at)
	}
	if _, ok := s.Heard(4); ok {
		t.Fatal("heard in an epoch that was not proved")
	}
}
