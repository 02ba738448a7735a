package pubsub

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/memolock/memolock/internal/redistest"
)

// clusterRig is a 3-master cluster, a client of it and a Router.
type clusterRig struct {
	nodes []*redistest.Server
	cc    *redis.ClusterClient
	r     *Router
}

func startClusterRig(t *testing.T, cfg Config) *clusterRig {
	t.Helper()
	return rigOn(t, redistest.StartCluster(t, 3), cfg)
}

// rigOn is startClusterRig on a cluster of the caller's.
func rigOn(t *testing.T, nodes []*redistest.Server, cfg Config) *clusterRig {
	t.Helper()
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{nodes[0].Addr}}) // RESP3, the default
	if cfg.Health == 0 {
		cfg.Health = time.Minute
	}
	r := NewRouter(cc, cfg)
	t.Cleanup(func() {
		r.Close(5 * time.Second)
		_ = cc.Close()
	})
	return &clusterRig{nodes: nodes, cc: cc, r: r}
}

// tagsByNode returns one hash tag served by each master, by address.
func (cr *clusterRig) tagsByNode(t *testing.T) map[string]string {
	t.Helper()
	tags := make(map[string]string)
	for i := 0; len(tags) < len(cr.nodes) && i < 1000; i++ {
		tag := "k" + strconv.Itoa(i)
		node, err := cr.cc.MasterForKey(bg, "{"+tag+"}")
		if err != nil {
			t.Fatal(err)
		}
		if _, ok := tags[node.Options().Addr]; !ok {
			tags[node.Options().Addr] = tag
		}
	}
	return tags
}

func (cr *clusterRig) server(addr string) *redistest.Server {
	for _, n := range cr.nodes {
		if n.Addr == addr {
			return n
		}
	}
	return nil
}

func TestClusterValuesOnEveryMaster(t *testing.T) {
	cr := startClusterRig(t, Config{})
	var cs []*collector
	var ws []*Watch
	for _, tag := range cr.tagsByNode(t) {
		w := cr.r.Watch(nil, "{"+tag+"}n", "{"+tag+"}e")
		ws = append(ws, w)
		cs = append(cs, collect(t, w))
	}
	for i, c := range cs {
		waitFor(t, "live", func() bool { return c.get().Reread })
		if err := cr.cc.SPublish(bg, ws[i].channels[0], "v").Err(); err != nil {
			t.Fatal(err)
		}
		waitFor(t, "the value", func() bool { return c.has("v") })
	}
	if n := len(cr.r.subscribers()); n != 3 {
		t.Fatalf("%d subscribers for 3 masters", n)
	}
	for _, w := range ws {
		w.Stop()
	}
	waitFor(t, "every channel unsubscribed", func() bool { return cr.r.Channels() == 0 })
}

// TestClusterMigratedSlotMovesTheWatch migrates a watched slot to another
// master: Redis unsubscribes its channels there, the watch moves, and once
// watched again through the Router it gets the value on the new master.
func TestClusterMigratedSlotMovesTheWatch(t *testing.T) {
	cr := startClusterRig(t, Config{})
	tags := cr.tagsByNode(t)
	var from, to, tag string
	for addr, tg := range tags {
		if from == "" {
			from, tag = addr, tg
		} else if to == "" {
			to = addr
		}
	}
	ch := "{" + tag + "}n"
	w := cr.r.Watch(nil, ch)
	c := collect(t, w)
	waitFor(t, "live", func() bool { return c.get().Reread })
	cr.migrate(t, slot(ch), from, to)
	waitFor(t, "the move", func() bool { return c.get().Moved })
	w.Stop()
	w, c = cr.rewatch(t, ch)
	defer w.Stop()
	if addr := cr.addrOf(t, w); addr != to {
		t.Fatalf("watched again on %s, not on %s", addr, to)
	}
	if err := cr.cc.SPublish(bg, ch, "v").Err(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the value on the new master", func() bool { return c.has("v") })
}

// rewatch watches ch through the Router until the watch is live: while the
// client's slot map is stale, a watch lands on the old master and moves.
func (cr *clusterRig) rewatch(t *testing.T, ch string) (*Watch, *collector) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		w := cr.r.Watch(nil, ch)
		for {
			ev := w.Take()
			if ev.Reread {
				c := collect(t, w)
				return w, c
			}
			if ev.Moved || ev.Err != nil || ev.Closed {
				break
			}
			<-w.Signal()
		}
		w.Stop()
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("%s never went live again", ch)
	return nil, nil
}

func (cr *clusterRig) addrOf(t *testing.T, w *Watch) string {
	cr.r.mu.Lock()
	defer cr.r.mu.Unlock()
	for addr, n := range cr.r.nodes {
		if n.sub == w.sub {
			return addr
		}
	}
	t.Fatal("the watch's subscriber is not the router's")
	return ""
}

// migrate moves an empty slot from one master to another.
func (cr *clusterRig) migrate(t *testing.T, slot int, from, to string) {
	t.Helper()
	src, dst := cr.server(from), cr.server(to)
	srcID, _ := src.Do(t, "CLUSTER", "MYID").(string)
	dstID, _ := dst.Do(t, "CLUSTER", "MYID").(string)
	s := strconv.Itoa(slot)
	dst.Do(t, "CLUSTER", "SETSLOT", s, "IMPORTING", srcID)
	src.Do(t, "CLUSTER", "SETSLOT", s, "MIGRATING", dstID)
	for _, n := range cr.nodes {
		n.Do(t, "CLUSTER", "SETSLOT", s, "NODE", dstID)
	}
}

// TestClusterDeadMasterMovesItsWatches kills a master: its subscriber's
// connection breaks and cannot be made again, and its watches move.
func TestClusterDeadMasterMovesItsWatches(t *testing.T) {
	cr := startClusterRig(t, Config{})
	tags := cr.tagsByNode(t)
	addr := cr.nodes[1].Addr
	w := cr.r.Watch(nil, "{"+tags[addr]+"}n")
	c := collect(t, w)
	waitFor(t, "live", func() bool { return c.get().Reread })
	cr.nodes[1].Kill()
	waitFor(t, "the move", func() bool { return c.get().Moved })
	w.Stop()
}

func TestClusterTrackingOnEveryMaster(t *testing.T) {
	var iv invalidations
	cr := startClusterRig(t, Config{Track: []string{"t:"}, OnInvalidate: iv.add})
	ctx, cancel := context.WithTimeout(bg, 10*time.Second)
	defer cancel()
	if err := cr.r.TrackMasters(ctx); err != nil {
		t.Fatal(err)
	}
	if n := len(cr.r.subscribers()); n != 3 {
		t.Fatalf("%d tracking subscribers for 3 masters", n)
	}
	for _, tag := range cr.tagsByNode(t) {
		key := "t:{" + tag + "}"
		s, err := cr.r.SubscriberFor(key)
		if err != nil {
			t.Fatal(err)
		}
		if _, live := s.Tracking(); !live {
			t.Fatalf("the subscriber of %s does not track", key)
		}
		if err := cr.cc.Set(bg, key, "1", 0).Err(); err != nil {
			t.Fatal(err)
		}
		waitFor(t, fmt.Sprint("the invalidation of ", key), func() bool { return iv.has(key) })
	}
	// Watches work beside tracking, with SSUBSCRIBE and SUBSCRIBE on one
	// connection.
	w := cr.r.Watch(nil, "{x}n")
	c := collect(t, w)
	waitFor(t, "live", func() bool { return c.get().Reread })
	if err := cr.cc.SPublish(bg, "{x}n", "v").Err(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the value", func() bool { return c.has("v") })
}

// channelsOn returns n channels of distinct slots that the master at addr
// serves, according to the client's map of the slots.
func (cr *clusterRig) channelsOn(t *testing.T, addr string, n int) []string {
	t.Helper()
	var chans []string
	for i := 0; len(chans) < n && i < 1000; i++ {
		ch := "{u" + strconv.Itoa(i) + "}n"
		node, err := cr.cc.MasterForKey(bg, ch)
		if err != nil {
			t.Fatal(err)
		}
		if node.Options().Addr == addr {
			chans = append(chans, ch)
		}
	}
	if len(chans) < n {
		t.Fatalf("found %d channels on %s", len(chans), addr)
	}
	return chans
}

// shardedOn returns a sharded subscriber of one master alone, a client of
// it made with opt, not a Router: every watch goes there, whatever its
// slot.
func shardedOn(t *testing.T, opt *redis.Options, st *Stats) *Subscriber {
	t.Helper()
	node := redis.NewClient(opt)
	s := newSubscriber(func(ctx context.Context) conn { return node.Subscribe(ctx) }, true, Config{Stats: st, Health: time.Minute})
	t.Cleanup(func() {
		s.Close(5 * time.Second)
		_ = node.Close()
	})
	return s
}

// liveOrMoved waits until w is live or moved, and fails the test unless
// it is live.
func liveOrMoved(t *testing.T, what string, c *collector) {
	t.Helper()
	waitFor(t, what+" live or moved", func() bool { ev := c.get(); return ev.Reread || ev.Moved })
	if ev := c.get(); ev.Moved {
		t.Fatalf("%s moved: the connection was given up", what)
	}
}

// While the replies to two waits are held, one's slot migrates away and
// the other's SSUBSCRIBE is refused with MOVED (its slot is on another
// master); both waits end, and the one SUNSUBSCRIBE without channels that
// ends them finds no shard channel left. Once the replies come, the
// connection serves a new wait without being given up.
func TestClusterUnsubscribeAllAfterRedisDroppedEveryChannel(t *testing.T) {
	cr := startClusterRig(t, Config{})
	from, to := cr.nodes[0].Addr, cr.nodes[1].Addr
	var f redistest.Faults
	var st Stats
	s := shardedOn(t, &redis.Options{Addr: from, Dialer: f.Dial(from)}, &st)
	here := cr.channelsOn(t, from, 2)
	elsewhere := cr.channelsOn(t, to, 1)[0]

	paused, resume := f.PausePubSubRead("ssubscribe")
	migrated := s.Watch(nil, here[0])
	<-paused // Redis subscribed it; the reader holds the acknowledgement
	cr.migrate(t, slot(here[0]), from, to)
	refused := s.Watch(nil, elsewhere)
	// Both are subscribed as far as the subscriber knows, so that their
	// ends go out as one SUNSUBSCRIBE without channels.
	waitFor(t, "both subscriptions sent", func() bool { return st.Subscribes.Load() == 2 })
	migrated.Stop()
	refused.Stop()
	waitFor(t, "the unsubscription sent", func() bool { return st.Unsubscribes.Load() == 1 })
	resume()

	w := s.Watch(nil, here[1])
	c := collect(t, w)
	liveOrMoved(t, "a new wait", c)
	if n := st.Reconnects.Load(); n != 0 {
		t.Fatalf("%d reconnects", n)
	}
	if err := cr.cc.SPublish(bg, here[1], "v").Err(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the value", func() bool { return c.has("v") })
}

// A wait ends while its slot migrates away, another wait stays: the
// SUNSUBSCRIBE that names the channel gets Redis's notice that it
// unsubscribed the channel, then MOVED. A wait sent meanwhile goes live on
// the same connection, and the wait that stayed is undisturbed.
func TestClusterNamedUnsubscribeOfAMigratedSlot(t *testing.T) {
	cr := startClusterRig(t, Config{})
	from, to := cr.nodes[0].Addr, cr.nodes[1].Addr
	var f redistest.Faults
	var st Stats
	s := shardedOn(t, &redis.Options{Addr: from, Dialer: f.Dial(from)}, &st)
	here := cr.channelsOn(t, from, 3)
	stays, ends := s.Watch(nil, here[0]), s.Watch(nil, here[1])
	cs := collect(t, stays)
	ce := collect(t, ends)
	liveOrMoved(t, "the wait that stays", cs)
	liveOrMoved(t, "the wait that ends", ce)

	paused, resume := f.PausePubSubRead("sunsubscribe")
	cr.migrate(t, slot(here[1]), from, to)
	<-paused // the reader holds Redis's notice
	ends.Stop()
	waitFor(t, "the unsubscription sent", func() bool { return st.Unsubscribes.Load() == 1 })
	subs := st.Subscribes.Load()
	w := s.Watch(nil, here[2])
	waitFor(t, "the new subscription sent", func() bool { return st.Subscribes.Load() > subs })
	resume()

	c := collect(t, w)
	liveOrMoved(t, "the new wait", c)
	if n := st.Reconnects.Load(); n != 0 || cs.get().Moved {
		t.Fatalf("%d reconnects; the wait that stayed moved: %v", n, cs.get().Moved)
	}
	for _, x := range []struct {
		ch string
		c  *collector
	}{{here[0], cs}, {here[2], c}} {
		if err := cr.cc.SPublish(bg, x.ch, "v").Err(); err != nil {
			t.Fatal(err)
		}
		waitFor(t, "the value on "+x.ch, func() bool { return x.c.has("v") })
	}
}

// A user who may not PING (markers are refused, and count all the same):
// the PING after a SUNSUBSCRIBE that names a channel is refused too, and
// the connection goes on serving new waits.
func TestClusterNamedUnsubscribeForAUserWhoMayNotPing(t *testing.T) {
	cr := startClusterRig(t, Config{})
	addr := cr.nodes[0].Addr
	cr.nodes[0].Do(t, "ACL", "SETUSER", "noping", "on", ">pw", "~*", "&*", "+@all", "-ping")
	var st Stats
	s := shardedOn(t, &redis.Options{Addr: addr, Username: "noping", Password: "pw"}, &st)
	here := cr.channelsOn(t, addr, 3)
	stays, ends := s.Watch(nil, here[0]), s.Watch(nil, here[1])
	cs := collect(t, stays)
	liveOrMoved(t, "the wait that stays", cs)
	liveOrMoved(t, "the wait that ends", collect(t, ends))
	ends.Stop()
	waitFor(t, "the unsubscription sent", func() bool { return st.Unsubscribes.Load() == 1 })
	c := collect(t, s.Watch(nil, here[2]))
	liveOrMoved(t, "a new wait", c)
	if n := st.Reconnects.Load(); n != 0 || cs.get().Moved {
		t.Fatalf("%d reconnects; the wait that stayed moved: %v", n, cs.get().Moved)
	}
	if err := cr.cc.SPublish(bg, here[2], "v").Err(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the value", func() bool { return c.has("v") })
}

// TestClusterWatchOnADemotedMasterMoves fails a master over gracefully,
// then places a watch where a stale slot map says the slot is: on the old
// master, now a replica, which takes the SSUBSCRIBE but would hear the
// new master's SPUBLISH only once that master knows it as its replica. The
// move that the failover caused sets off an audit, which finds the old
// master is not one any more: the watch moves, and watching again lands on
// the new master, which hears the value.
func TestClusterWatchOnADemotedMasterMoves(t *testing.T) {
	nodes := redistest.StartClusterWithReplicas(t, 3, 1)
	cr := rigOn(t, nodes, Config{})
	cc, r := cr.cc, cr.r
	old, err := cc.MasterForKey(bg, "{x}")
	if err != nil {
		t.Fatal(err)
	}
	oldAddr := old.Options().Addr
	replica := replicaOf(t, nodes, cr.server(oldAddr))
	// The slot map as go-redis may hold it for a while after a failover:
	// the first watch after the move is placed on the old master.
	stale := true
	r.lookup = func(ctx context.Context, key string) (*redis.Client, error) {
		if stale {
			stale = false
			return old, nil
		}
		return cc.MasterForKey(ctx, key)
	}
	before := r.Watch(nil, "{x}n")
	cb := collect(t, before)
	waitFor(t, "live", func() bool { return cb.get().Reread })

	replica.Do(t, "CLUSTER", "FAILOVER")
	waitFor(t, "the failover's move", func() bool { return cb.get().Moved })
	before.Stop()
	stale = true
	w := r.Watch(nil, "{x}n")
	c := collect(t, w)
	waitFor(t, "the watch on the old master to be live or moved", func() bool { return c.get().Reread || c.get().Moved })
	if !c.get().Reread {
		t.Fatalf("the old master refused the watch (%+v): the test proves nothing", c.get())
	}
	if got := cr.addrOf(t, w); got != oldAddr {
		t.Fatalf("the stale watch went to %s, not to the old master %s: the test proves nothing", got, oldAddr)
	}
	waitFor(t, "the watch on a replica to move", func() bool { return c.get().Moved })
	w.Stop()

	again, ca := cr.rewatch(t, "{x}n")
	defer again.Stop()
	if got := cr.addrOf(t, again); got != replica.Addr {
		t.Fatalf("watching again went to %s; want the new master %s", got, replica.Addr)
	}
	if err := cc.SPublish(bg, "{x}n", "v").Err(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the value", func() bool { return ca.has("v") })
}

// replicaOf returns the node that replicates master.
func replicaOf(t *testing.T, nodes []*redistest.Server, master *redistest.Server) *redistest.Server {
	t.Helper()
	var replica *redistest.Server
	waitFor(t, "a replica of "+master.Addr, func() bool {
		for _, n := range nodes {
			info, _ := n.Do(t, "INFO", "replication").(string)
			if strings.Contains(info, "role:slave") && strings.Contains(info, "master_port:"+master.Addr[strings.LastIndexByte(master.Addr, ':')+1:]) {
				replica = n
				return true
			}
		}
		time.Sleep(10 * time.Millisecond)
		return false
	})
	return replica
}

// TestClusterRedirectAuditsWatches places a watch on a master demoted by
// a failover that moved no watch (nobody watched that slot then), by a
// stale slot map; a redirected command, which Redirected reports, sets off
// the audit that moves it.
func TestClusterRedirectAuditsWatches(t *testing.T) {
	nodes := redistest.StartClusterWithReplicas(t, 3, 1)
	cr := rigOn(t, nodes, Config{})
	cc, r := cr.cc, cr.r
	old, err := cc.MasterForKey(bg, "{y}")
	if err != nil {
		t.Fatal(err)
	}
	replica := replicaOf(t, nodes, cr.server(old.Options().Addr))
	replica.Do(t, "CLUSTER", "FAILOVER")
	demoted := cr.server(old.Options().Addr)
	waitFor(t, "the failover, as both nodes see it", func() bool {
		role, _ := replica.Do(t, "ROLE").([]any)
		was, _ := demoted.Do(t, "ROLE").([]any)
		return len(role) > 0 && role[0] == "master" && len(was) > 0 && was[0] == "slave"
	})
	r.lookup = func(context.Context, string) (*redis.Client, error) { return old, nil }
	w := r.Watch(nil, "{y}n")
	c := collect(t, w)
	// Once under .ci/under-load this timed out; what the watch got then
	// says whether it went live elsewhere, moved, or heard nothing.
	waitFor(t, "the watch on the old master to be live", func() bool {
		ev := c.get()
		if ev.Reread {
			return true
		}
		if ev.Moved || ev.Closed || ev.Err != nil {
			t.Fatalf("the watch on the old master ended before it was live: %+v", ev)
		}
		return false
	})
	if got := cr.addrOf(t, w); got != old.Options().Addr {
		t.Fatalf("the watch went to %s, not to the old master: the test proves nothing", got)
	}
	r.lookup = cc.MasterForKey
	r.Redirected()
	waitFor(t, "the watch on a replica to move", func() bool { return c.get().Moved })
	w.Stop()
}
