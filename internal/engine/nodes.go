package engine

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"

	"github.com/memolock/memolock/internal/wire"
	"github.com/redis/go-redis/v9"
)

// A node is one Redis server that owns a share of the keys: the only one, or
// a master of a cluster. Its lookups are batched apart from other nodes',
// and it is found unreachable on its own, so that one sick node holds up,
// and fails, only the ids it owns.
type node struct {
	addr   string
	client *redis.Client // the node's own client: pipelines and probes
	batch  *batcher
	down   *outage
}

// nodes finds the node of a key.
type nodes struct {
	single *node                // a single-node client's only node
	cc     *redis.ClusterClient // a cluster's client, which knows its slots
	stats  *counters
	log    *slog.Logger
	work   *work // the engine's: Close waits for batches and probes
	// moved is told of a lookup answered MOVED (see batcher.moved); set
	// by New before any node is made.
	moved func()

	mu     sync.Mutex
	closed bool
	byAddr map[string]*node
}

func newNodes(cfg *Config, stats *counters, w *work) *nodes {
	ns := &nodes{cc: cfg.Cluster, stats: stats, log: cfg.Log.With("tag", cfg.Keys.Tag()), work: w, byAddr: make(map[string]*node)}
	if cfg.Single != nil {
		ns.single = ns.newNode(cfg.Single, cfg.Single)
	}
	return ns
}

// newNode makes the node served by client; run carries its single lookups
// (the cluster client, which follows redirections, on a cluster).
func (ns *nodes) newNode(client *redis.Client, run redis.UniversalClient) *node {
	addr := client.Options().Addr
	n := &node{
		addr:   addr,
		client: client,
		batch:  newBatcher(client, run, ns.stats, ns.work),
	}
	n.batch.moved = ns.moved
	n.down = newOutage(client, addr, ns.reload(), ns.retirer(n), ns.stats, ns.log, ns.work)
	return n
}

// retirer returns what forgets n, on a cluster (nil on a single node): a
// later call for its address, if any, makes a node anew.
func (ns *nodes) retirer(n *node) func() {
	if ns.cc == nil {
		return nil
	}
	return func() {
		ns.mu.Lock()
		defer ns.mu.Unlock()
		if ns.byAddr[n.addr] == n {
			delete(ns.byAddr, n.addr)
		}
	}
}

// reload returns what asks for a fresh slot map on a cluster; nil on a
// single node.
func (ns *nodes) reload() func() {
	if ns.cc == nil {
		return nil
	}
	return func() { ns.cc.ReloadState(context.Background()) }
}

// of returns the node that owns key.
func (ns *nodes) of(ctx context.Context, key string) (*node, error) {
	if ns.single != nil {
		return ns.single, nil
	}
	client, err := ns.cc.MasterForKey(ctx, key)
	if err != nil {
		return nil, fmt.Errorf("%w: finding the master of %s: %w", ErrRedis, wire.Quote(key), err)
	}
	addr := client.Options().Addr
	ns.mu.Lock()
	defer ns.mu.Unlock()
	n := ns.byAddr[addr]
	if n == nil || n.client != client {
		// New, or go-redis replaced its client of that node: the old
		// client may be closed, and its probe with it.
		if n != nil {
			n.down.close()
		}
		n = ns.newNode(client, ns.cc)
		if ns.closed {
			n.down.close()
		}
		ns.byAddr[addr] = n
	}
	return n, nil
}

// all returns every node known so far.
func (ns *nodes) all() []*node {
	if ns.single != nil {
		return []*node{ns.single}
	}
	ns.mu.Lock()
	defer ns.mu.Unlock()
	out := make([]*node, 0, len(ns.byAddr))
	for _, n := range ns.byAddr {
		out = append(out, n)
	}
	return out
}

// check returns the error of the node that owns key while it is down; a
// key whose node cannot be found fails with that error.
func (ns *nodes) check(ctx context.Context, key string) (*node, error) {
	n, err := ns.of(ctx, key)
	if err != nil {
		return nil, err
	}
	return n, n.down.err()
}

// report reports err from a call about key to the node that owns it.
func (ns *nodes) report(ctx context.Context, key string, err error) {
	if !isOutage(err) {
		return
	}
	if n, nerr := ns.of(ctx, key); nerr == nil {
		n.down.report(err)
	}
}

// close stops every node's probe.
func (ns *nodes) close() {
	ns.mu.Lock()
	ns.closed = true
	ns.mu.Unlock()
	for _, n := range ns.all() {
		n.down.close()
	}
}

// redirected reports whether err is a cluster redirection or state error
// that go-redis follows for a single command but not inside a pipeline.
func redirected(err error) bool {
	msg := err.Error()
	for _, p := range []string{"MOVED ", "ASK ", "TRYAGAIN", "CLUSTERDOWN"} {
		if strings.HasPrefix(msg, p) {
			return true
		}
	}
	return false
}
