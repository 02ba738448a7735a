package pubsub

// Tests from a hostile review of the changes after review1. Each one fails
// on the code it was written against, and says what it requires.

import (
	"testing"

	"github.com/redis/go-redis/v9"
)

// A SUNSUBSCRIBE without channels is acknowledged by Redis once per shard
// channel that the connection still has (checked on redis-server 7.0.15:
// after a migration unsubscribed {7}n, SUNSUBSCRIBE alone acknowledged {3}n
// only), not per channel the machine thinks it has. A channel that Redis
// dropped before the command arrived (its slot migrated away, or its
// SSUBSCRIBE refused with MOVED) while the command was already owed is
// never acknowledged: the command stays owed, and the next reply on the
// connection (here a new wait's acknowledgement) is taken for one that
// nobody asked for, and the connection is torn down, with every watch, and
// the L1, on it. The per-slot form never had this: Redis acknowledges a
// named channel whether it was subscribed or not.
func TestMachineUnsubscribeAllOwesNoChannelRedisDropped(t *testing.T) {
	for _, tc := range []struct {
		name string
		// drop has Redis drop "{b}n" while the batch that subscribed it,
		// and then the SUNSUBSCRIBE of all, are owed.
		drop func(r *rig)
	}{
		{"migrated", func(r *rig) {
			r.feed(&redis.Subscription{Kind: verbSSubscribe, Channel: "{a}n", Count: 1}, nil)
			r.feed(&redis.Subscription{Kind: verbSSubscribe, Channel: "{b}n", Count: 2}, nil)
			// The slot of {b} moves to another master: Redis unsubscribes
			// its channel before it reads the marker.
			r.feed(&redis.Subscription{Kind: verbSUnsubscribe, Channel: "{b}n", Count: 1}, nil)
		}},
		{"moved", func(r *rig) {
			r.feed(&redis.Subscription{Kind: verbSSubscribe, Channel: "{a}n", Count: 1}, nil)
			r.feed(nil, errMoved) // {b}'s slot is elsewhere already
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t, true)
			a, b := r.watch("{a}n"), r.watch("{b}n")
			r.plan() // ssubscribe {a}n, ssubscribe {b}n, the marker
			// Both waits end before their replies came: a value pushed on
			// another client, a caller's deadline.
			r.do(func(fx *effects) { r.m.unwatch(a, r.now, fx) })
			r.do(func(fx *effects) { r.m.unwatch(b, r.now, fx) })
			r.now = r.now.Add(r.unsubWait())
			r.plan()
			if got := r.wired(); len(got) != 1 || got[0] != "sunsubscribe (all)" {
				t.Fatalf("sent %q; want one SUNSUBSCRIBE without channels (the case under test)", got)
			}
			r.wire = nil // Redis's replies, as it sends them:
			tc.drop(r)
			r.feed(&redis.Pong{Payload: marker(1)}, nil)
			fx := r.feed(&redis.Subscription{Kind: verbSUnsubscribe, Channel: "{a}n", Count: 0}, nil)
			if fx.broke {
				t.Fatal("the connection was given up at the SUNSUBSCRIBE's own acknowledgement")
			}
			// Nothing more comes for the SUNSUBSCRIBE. A new wait:
			c := r.watch("{c}n")
			r.plan()
			for r.serveOne() {
			}
			if r.fx.broke || r.m.broken {
				t.Errorf("the connection was given up (%d replies still owed, the first %q of %v): "+
					"the SUNSUBSCRIBE without channels still awaits an acknowledgement Redis never sends",
					len(r.m.owed), r.m.owed[0].verb, r.m.owed[0].args)
				return
			}
			if !c.state.live {
				t.Error("the new wait never went live")
			}
			r.check()
		})
	}
}
