package pubsub

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// nodeTable answers a Router's lookups: which client serves a key. It
// hands out go-redis clients that never connect (the subscribers use a
// fakeRedis) and can fail, or switch a node's client as go-redis does.
type nodeTable struct {
	mu      sync.Mutex
	clients map[string]*redis.Client // by address
	fail    error
	lookups atomic.Int64
}

func newNodeTable(t *testing.T, addrs ...string) *nodeTable {
	nt := &nodeTable{clients: make(map[string]*redis.Client)}
	for _, a := range addrs {
		nt.replace(t, a)
	}
	return nt
}

// replace gives addr a new client, as go-redis does for a node that left
// the slot map and came back.
func (nt *nodeTable) replace(t *testing.T, addr string) {
	c := redis.NewClient(&redis.Options{Addr: addr, Protocol: 2})
	t.Cleanup(func() { _ = c.Close() })
	nt.mu.Lock()
	defer nt.mu.Unlock()
	nt.clients[addr] = c
}

// lookup serves keys whose hash tag starts with "a" from the first node
// in address order, the others from the second.
func (nt *nodeTable) lookup(_ context.Context, key string) (*redis.Client, error) {
	nt.lookups.Add(1)
	nt.mu.Lock()
	defer nt.mu.Unlock()
	if nt.fail != nil {
		return nil, nt.fail
	}
	if strings.HasPrefix(hashTag(key), "a") {
		return nt.clients["n1:1"], nil
	}
	return nt.clients["n2:1"], nil
}

func fakeRouter(t *testing.T, f *fakeRedis, nt *nodeTable, reloads *atomic.Int64) *Router {
	r := &Router{cfg: Config{Stats: new(Stats), Health: time.Minute}, lookup: nt.lookup, nodes: make(map[string]routed)}
	r.reload = func() { reloads.Add(1) }
	r.newSub = func(*redis.Client) *Subscriber {
		s := newSubscriber(f.open, true, r.cfg)
		s.onMoved = r.moved
		return s
	}
	t.Cleanup(func() { r.Close(5 * time.Second) })
	return r
}

// footprint counts what the router and its subscribers hold.
func (r *Router) footprint() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := len(r.nodes)
	for _, nd := range r.nodes {
		s := nd.sub
		s.mu.Lock()
		m := s.m
		n += len(m.attached) + len(m.byChan) + len(m.dirty) + len(m.unwanted) + len(m.sent) + len(m.solo)
		n += len(m.unmarked) + len(m.marked) + len(m.syncs) + len(m.syncAsked) + len(m.owed)
		s.mu.Unlock()
	}
	return n
}

// TestRouterWatchesThatCannotBePlacedLeaveNothingBehind: a watch whose
// node lookup fails carries the error, and Stop leaves nothing behind.
// (Before: such watches went to an "idle" subscriber whose dirty set kept
// two entries per watch for ever.)
func TestRouterWatchesThatCannotBePlacedLeaveNothingBehind(t *testing.T) {
	f := newFakeRedis()
	nt := newNodeTable(t, "n1:1", "n2:1")
	var reloads atomic.Int64
	r := fakeRouter(t, f, nt, &reloads)
	nt.fail = errors.New("CLUSTERDOWN The cluster is down")
	for range 1000 {
		w := r.Watch(nil, "{a}n", "{a}e")
		ev := w.Take()
		if ev.Err == nil || !strings.Contains(ev.Err.Error(), "CLUSTERDOWN") || !strings.Contains(ev.Err.Error(), "{a}n") {
			t.Fatalf("an unplaced watch: %+v", ev)
		}
		w.Sync()
		w.Stop()
	}
	if n := r.footprint(); n != 0 {
		t.Fatalf("1000 unplaced watches left %d entries behind", n)
	}
	if f.opened() != 0 {
		t.Fatal("unplaced watches opened a connection")
	}
}

func TestRouterRefusesChannelsOfDifferentSlots(t *testing.T) {
	f := newFakeRedis()
	var reloads atomic.Int64
	r := fakeRouter(t, f, newNodeTable(t, "n1:1", "n2:1"), &reloads)
	w := r.Watch(nil, "{a}n", "{b}n")
	if err := w.Take().Err; err == nil || !strings.Contains(err.Error(), "different cluster slots") {
		t.Fatalf("channels of two slots: %v", err)
	}
	if err := r.Watch(nil).Take().Err; !errors.Is(err, errNoChannels) {
		t.Fatalf("no channels: %v", err)
	}
}

// TestRouterReplacedNodeClientMovesWatchesNeverClosesThem: when go-redis
// replaces its client of a node, the old subscriber's watches get Moved,
// even if they take their events only after it has closed, and once
// watched again they get values. (Before: "closed" from an open client.)
func TestRouterReplacedNodeClientMovesWatchesNeverClosesThem(t *testing.T) {
	f := newFakeRedis()
	nt := newNodeTable(t, "n1:1", "n2:1")
	var reloads atomic.Int64
	r := fakeRouter(t, f, nt, &reloads)
	old := r.Watch(nil, "{a1}n")
	waitFor(t, "live", func() bool { return peek(old).Reread })
	nt.replace(t, "n1:1")
	other := r.Watch(nil, "{a2}n") // finds the new client: the old subscriber retires
	r.retiring.Wait()
	ev := old.Take()
	if !ev.Moved || ev.Closed {
		t.Fatalf("a watch of a replaced client: %+v", ev)
	}
	old.Stop()
	again := r.Watch(nil, "{a1}n")
	waitFor(t, "live again", func() bool { return peek(again).Reread && peek(other).Reread })
	f.publish("{a1}n", "v")
	waitFor(t, "the value", func() bool { return len(peek(again).Messages) == 1 })
	if r.Channels() != 2 {
		t.Fatalf("%d channels subscribed", r.Channels())
	}
}

func TestRouterMigratedSlotMovesWatchesAndReloads(t *testing.T) {
	f := newFakeRedis()
	var reloads atomic.Int64
	r := fakeRouter(t, f, newNodeTable(t, "n1:1", "n2:1"), &reloads)
	w := r.Watch(nil, "{b}n", "{b}e")
	waitFor(t, "live", func() bool { return peek(w).Reread })
	f.migrate("{b}n")
	waitFor(t, "moved", func() bool { return peek(w).Moved })
	if reloads.Load() == 0 {
		t.Fatal("a move did not reload the slots")
	}
	waitFor(t, "the other channel to go", func() bool { return r.Channels() == 0 })
}

func TestRouterCloseClosesEveryNodeAndRefusesLaterWatches(t *testing.T) {
	f := newFakeRedis()
	var reloads atomic.Int64
	r := fakeRouter(t, f, newNodeTable(t, "n1:1", "n2:1"), &reloads)
	a, b := r.Watch(nil, "{a}n"), r.Watch(nil, "{b}n")
	r.Close(time.Second)
	if !peek(a).Closed || !peek(b).Closed {
		t.Fatal("a watch was not closed")
	}
	if !r.Watch(nil, "{a}n").Take().Closed {
		t.Fatal("a watch after Close was not told so")
	}
	if _, err := r.SubscriberFor("{a}n"); !errors.Is(err, ErrClosed) {
		t.Fatalf("SubscriberFor after Close: %v", err)
	}
}

// TestRouterAuditRetiresOnlyNodesThatSayTheyAreReplicas: the slot map an
// audit reloads may come from a node with an old view (an old master
// frozen past its failover answers with itself as master). A node missing
// from the map's masters is retired only once it answers ROLE as a
// replica; a healthy master named wrongly keeps its watches.
func TestRouterAuditRetiresOnlyNodesThatSayTheyAreReplicas(t *testing.T) {
	f := newFakeRedis()
	var reloads atomic.Int64
	nt := newNodeTable(t, "n1:1", "n2:1")
	r := fakeRouter(t, f, nt, &reloads)
	r.masters = func(ctx context.Context, fn func(context.Context, *redis.Client) error) error {
		nt.mu.Lock()
		n1 := nt.clients["n1:1"]
		nt.mu.Unlock()
		return fn(ctx, n1) // a stale map: n2 is not named a master
	}
	var n2Replica atomic.Bool
	var asked atomic.Int64
	r.role = func(_ context.Context, node *redis.Client) bool {
		asked.Add(1)
		return node.Options().Addr == "n2:1" && n2Replica.Load()
	}
	w1 := r.Watch(nil, "{a}n")
	w2 := r.Watch(nil, "{b}n")
	waitFor(t, "live", func() bool { return peek(w1).Reread && peek(w2).Reread })

	r.Redirected()
	waitFor(t, "the audit to ask n2", func() bool { return asked.Load() > 0 })
	if peek(w2).Moved || peek(w1).Moved {
		t.Fatal("an audit retired a node that says it is a master")
	}
	time.Sleep(2 * eventEvery) // past the events' rate limit
	n2Replica.Store(true)
	r.Redirected()
	waitFor(t, "n2's watch to move", func() bool { return peek(w2).Moved })
	if peek(w1).Moved {
		t.Fatal("the audit moved a master's watch")
	}
}
