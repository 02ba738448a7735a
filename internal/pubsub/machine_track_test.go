package pubsub

import (
	"errors"
	"slices"
	"testing"

	"github.com/redis/go-redis/v9"
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
