package pubsub

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// A Router serves the watches of a Redis Cluster client, whose values are
// published with SPUBLISH: one sharded Subscriber per master that has
// watches, never one per slot or per key. A watch goes to the master that
// serves its channels' slot now; when that master stops serving it (a
// migrated slot, a failover, a client that go-redis replaced), the watch
// gets Moved, and its waiter looks again and watches again here, where the
// cluster now says the slot is.
type Router struct {
	cfg     Config
	lookup  func(ctx context.Context, key string) (*redis.Client, error)
	masters func(ctx context.Context, fn func(ctx context.Context, node *redis.Client) error) error
	reload  func()
	newSub  func(node *redis.Client) *Subscriber // a sharded subscriber of node
	// role, if set, stands in for asking a node ROLE (see isReplica).
	role func(ctx context.Context, node *redis.Client) bool

	mu       sync.Mutex
	closed   bool
	nodes    map[string]routed // by node address
	retiring sync.WaitGroup    // subscribers replaced, closing
	audits   audit             // see audit.go
}

// routed is the subscriber of one master, and go-redis's client of that
// master, which go-redis may close and replace.
type routed struct {
	sub    *Subscriber
	client *redis.Client
}

// NewRouter returns a Router over cc's masters. With cfg.Track, every
// master's subscriber tracks the keys of its own node, and starts at once.
func NewRouter(cc *redis.ClusterClient, cfg Config) *Router {
	r := &Router{
		cfg:     cfg,
		lookup:  cc.MasterForKey,
		masters: cc.ForEachMaster,
		reload:  func() { cc.ReloadState(context.Background()) },
		nodes:   make(map[string]routed),
	}
	if r.cfg.Stats == nil {
		r.cfg.Stats = new(Stats) // shared by the masters' subscribers
	}
	r.newSub = func(node *redis.Client) *Subscriber { return newNode(node, r.cfg, r.moved) }
	return r
}

// newNode returns the sharded subscriber of one master.
func newNode(node *redis.Client, cfg Config, onMoved func()) *Subscriber {
	var s *Subscriber
	if cfg.Track != nil {
		s = newTracking(node, true, cfg)
	} else {
		s = newSubscriber(func(ctx context.Context) conn { return node.Subscribe(ctx) }, true, cfg)
	}
	s.onMoved = onMoved
	return s
}

// moved is called when watches were told to move: the client's idea of
// the slots is out of date.
func (r *Router) moved() {
	if r.reload != nil {
		r.reload()
	}
	r.scheduleAudit()
}

// Redirected tells the Router that a command of its client was redirected
// to another node: the slot map it places watches by may be out of date,
// and watches placed by it may sit on a node that no longer serves their
// slot. The map is reloaded, and the placements audited (see audit.go).
func (r *Router) Redirected() { r.moved() }

// Watch watches channels, which must share one slot, on the master that
// serves it; see Watcher. If the cluster cannot say which master that is,
// the watch has Err.
func (r *Router) Watch(onValue func(payload string), channels ...string) *Watch {
	if err := sameSlot(channels); err != nil {
		return unplaced(onValue, channels, err)
	}
	s, err := r.SubscriberFor(channels[0])
	if errors.Is(err, ErrClosed) {
		w := newWatch(onValue, channels)
		w.box.Closed = true
		w.poke()
		return w
	}
	if err != nil {
		return unplaced(onValue, channels, err)
	}
	return s.Watch(onValue, channels...)
}

// unplaced returns a watch that no subscriber serves, with err: Stop has
// nothing to undo, so nothing of it stays behind.
func unplaced(onValue func(string), channels []string, err error) *Watch {
	w := newWatch(onValue, channels)
	w.box.Err = err
	w.poke()
	return w
}

func sameSlot(channels []string) error {
	if len(channels) == 0 {
		return errNoChannels
	}
	for _, ch := range channels[1:] {
		if slot(ch) != slot(channels[0]) {
			return fmt.Errorf("channels %q and %q are in different cluster slots; a watch needs one", channels[0], ch)
		}
	}
	return nil
}

// SubscriberFor returns the subscriber of the master that serves key's
// slot now, making it if need be. An L1 entry of key can be tied to that
// subscriber's Tracking epoch.
func (r *Router) SubscriberFor(key string) (*Subscriber, error) {
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	node, err := r.lookup(ctx, key)
	if err != nil {
		return nil, fmt.Errorf("finding the master of %q: %w", key, err)
	}
	return r.subscriberOf(node)
}

// SubscriberOf returns the subscriber of node, a master's client from the
// cluster client, making it if need be: an L1 entry read from that node
// (and from no other) can be tied to its Tracking epoch.
func (r *Router) SubscriberOf(node *redis.Client) (*Subscriber, error) {
	return r.subscriberOf(node)
}

// subscriberOf returns node's subscriber. If go-redis replaced its client
// of that address, the old subscriber retires: its watches move here.
func (r *Router) subscriberOf(node *redis.Client) (*Subscriber, error) {
	addr := node.Options().Addr
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return nil, ErrClosed
	}
	n := r.nodes[addr]
	if n.sub != nil && n.client == node {
		return n.sub, nil
	}
	if old := n.sub; old != nil {
		r.retiring.Add(1)
		go func() {
			defer r.retiring.Done()
			old.retire(callTimeout)
		}()
	}
	n = routed{sub: r.newSub(node), client: node}
	r.nodes[addr] = n
	return n.sub, nil
}

// TrackMasters makes a tracking subscriber for every master now in the
// cluster, and waits until each one tracks. Masters that appear later get
// theirs on their first watch or SubscriberFor.
func (r *Router) TrackMasters(ctx context.Context) error {
	if r.cfg.Track == nil {
		return errNotTracking
	}
	return r.masters(ctx, func(ctx context.Context, node *redis.Client) error {
		s, err := r.subscriberOf(node)
		if err != nil {
			return err
		}
		return s.WaitTracking(ctx)
	})
}

// Channels returns the number of channels subscribed on every master.
func (r *Router) Channels() int {
	n := 0
	for _, s := range r.subscribers() {
		n += s.Channels()
	}
	return n
}

func (r *Router) subscribers() []*Subscriber {
	r.mu.Lock()
	defer r.mu.Unlock()
	subs := make([]*Subscriber, 0, len(r.nodes))
	for _, n := range r.nodes {
		subs = append(subs, n.sub)
	}
	return subs
}

// Close closes every master's subscriber, together, within d; see Watcher.
func (r *Router) Close(d time.Duration) {
	deadline := time.Now().Add(d)
	r.mu.Lock()
	r.closed = true
	if r.audits.cancel != nil {
		r.audits.cancel()
	}
	r.mu.Unlock()
	var wg sync.WaitGroup
	for _, s := range r.subscribers() {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.Close(time.Until(deadline))
		}()
	}
	wg.Wait()
	waitUntil(&r.audits.wg, deadline)
	waitUntil(&r.retiring, deadline)
}
