package pubsub

import (
	"fmt"
	"testing"
)

func TestSyncComesAfterEverythingPublishedBefore(t *testing.T) {
	f := newFakeRedis()
	s := fakeSubscriber(t, f, false, Config{})
	w, c := liveWatch(t, s, nil, "a")
	for i := range 100 {
		f.publish("a", fmt.Sprint(i))
	}
	w.Sync()
	waitFor(t, "synced", func() bool { return c.get().Synced })
	if ev := c.get(); len(ev.Messages) != 100 || ev.Reread {
		t.Fatalf("synced with %d of 100 messages (reread %v)", len(ev.Messages), ev.Reread)
	}
}

func TestSyncAcrossABreakIsARereadInstead(t *testing.T) {
	f := newFakeRedis()
	s := fakeSubscriber(t, f, false, Config{})
	w, c := liveWatch(t, s, nil, "a")
	f.inject(fault{verb: verbPing, kind: writeError})
	w.Sync()
	waitFor(t, "a reread", func() bool { return c.get().Reread })
	if c.get().Synced {
		t.Fatal("synced across a broken connection")
	}
	w.Sync() // on the new connection
	waitFor(t, "synced", func() bool { return c.get().Synced })
}

func TestSyncOnAShardedBreakIsAMove(t *testing.T) {
	f := newFakeRedis()
	s := fakeSubscriber(t, f, true, Config{})
	w, c := liveWatch(t, s, nil, "{a}n")
	f.inject(fault{verb: verbPing, kind: writeError})
	w.Sync()
	waitFor(t, "a move", func() bool { return c.get().Moved })
	if c.get().Synced {
		t.Fatal("synced across a broken connection")
	}
	w.Sync() // moved: nothing to sync, and no hang
	w.Stop()
}
