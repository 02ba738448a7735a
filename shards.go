package memolock

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// shards serves the waits of a client on a Redis Cluster, which publishes
// with SPUBLISH (see scripts): one subscriber per master node that has
// waiters, each with one sharded pub/sub connection to that node, never one
// per slot or per key. go-redis re-sends all of a PubSub's shard channels
// in one SSUBSCRIBE when it reconnects, which Redis refuses when they span
// slots; a subscriber treats that, like any error, as a lost connection,
// and subscribes again on a new one, one command per hash tag.
//
// A watch goes to the node that serves its channels' slot now. When that
// node stops serving it (a migrated slot: Redis unsubscribes the channels,
// and a new SSUBSCRIBE answers MOVED; a failed-over master: it cannot be
// reached), its watches are told to move, and their waits look the value
// up again and watch again, here, where the cluster now says the slot is.
type shards struct {
	cc    *redis.ClusterClient
	stats *counters
	log   *slog.Logger // for the node subscribers

	// idle serves the watches that could not be placed: it never
	// connects, and only answers take and unwatch.
	idle *subscriber

	mu     sync.Mutex
	closed bool
	subs   map[string]nodeSub // by node address
}

// nodeSub is the subscriber of one node, and go-redis's client of that
// node, which go-redis may close and replace (a node that left the slot
// map and came back).
type nodeSub struct {
	sub    *subscriber
	client *redis.Client
}

func newShards(cc *redis.ClusterClient, stats *counters) *shards {
	return &shards{cc: cc, stats: stats, log: discard, subs: make(map[string]nodeSub), idle: newSubscriberOn(nil, true, stats)}
}

// watch is subscriber.watch on the node that serves channels (all in one
// slot). If the cluster cannot say which node that is, the watch carries
// the error.
func (r *shards) watch(onValue func(string), channels ...string) *watch {
	s, err := r.node(channels[0])
	if err != nil {
		w := &watch{channels: channels, signal: make(chan struct{}, 1), onValue: onValue, err: err}
		w.s = r.idle
		w.poke()
		return w
	}
	return s.watch(onValue, channels...)
}

// node returns the subscriber for the master that serves key's slot.
func (r *shards) node(key string) (*subscriber, error) {
	ctx, cancel := context.WithTimeout(context.Background(), pubsubTimeout)
	defer cancel()
	node, err := r.cc.MasterForKey(ctx, key)
	if err != nil {
		return nil, err
	}
	addr := node.Options().Addr
	r.mu.Lock()
	ns := r.subs[addr]
	var old *subscriber
	if ns.sub == nil || ns.client != node {
		old = ns.sub
		ns = nodeSub{sub: newSubscriberOn(func(ctx context.Context) *redis.PubSub { return node.SSubscribe(ctx) }, true, r.stats), client: node}
		ns.sub.log = r.log
		if r.closed {
			ns.sub.close(0) // a watch added now is told so at once
		}
		r.subs[addr] = ns
	}
	r.mu.Unlock()
	if old != nil {
		// go-redis replaced its client of that node: the old one may be
		// closed. Its watches move here.
		old.rehome()
		go old.close(closeWait)
	}
	return ns.sub, nil
}

// moved is called by a wait whose watch was told to move: the cluster's
// idea of its slots is out of date.
func (r *shards) moved() {
	r.cc.ReloadState(context.Background())
}

// close closes every node's subscriber, together, within d.
func (r *shards) close(d time.Duration) {
	r.mu.Lock()
	r.closed = true
	subs := make([]*subscriber, 0, len(r.subs))
	for _, ns := range r.subs {
		subs = append(subs, ns.sub)
	}
	r.mu.Unlock()
	var wg sync.WaitGroup
	for _, s := range subs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.close(d)
		}()
	}
	wg.Wait()
}

// channels returns the number of channels subscribed on every node.
func (r *shards) channels() int {
	r.mu.Lock()
	subs := make([]*subscriber, 0, len(r.subs))
	for _, ns := range r.subs {
		subs = append(subs, ns.sub)
	}
	r.mu.Unlock()
	n := 0
	for _, s := range subs {
		n += s.channels()
	}
	return n
}
