package memolock

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/memolock/memolock/internal/redistest"
)

// newClusterClient is a memolock Client on a cluster client of its own, as
// a separate process would have.
func newClusterClient(t testing.TB, nodes []*redistest.Server, tag string, opts *Options) (*Client, *redis.ClusterClient) {
	t.Helper()
	rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{nodes[0].Addr}})
	c, err := New(rdb, tag, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = c.Close()
		// Close waits for Redis only so long; with a node killed, work
		// after the callers' answers (a store failure's release) may take
		// go-redis's own timeouts to end.
		c.e.WaitIdle(10 * time.Second)
		_ = rdb.Close()
	})
	return c, rdb
}

// commandCalls returns how many times a node ran cmd (INFO commandstats,
// which counts commands that scripts call too).
func commandCalls(t testing.TB, n *redistest.Server, cmd string) int64 {
	t.Helper()
	info, _ := n.Do(t, "INFO", "commandstats").(string)
	for _, line := range strings.Split(info, "\r\n") {
		rest, ok := strings.CutPrefix(line, "cmdstat_"+cmd+":calls=")
		if !ok {
			continue
		}
		calls, _, _ := strings.Cut(rest, ",")
		v, err := strconv.ParseInt(calls, 10, 64)
		if err != nil {
			t.Fatalf("commandstats line %q: %v", line, err)
		}
		return v
	}
	return 0
}

// On a cluster, values and events go out with SPUBLISH, on the node that
// owns the slot, and waiters receive them through sharded subscriptions:
// no node ever runs PUBLISH, which a cluster broadcasts to every node.
func TestCluster_StampedeUsesShardedPubSubOnly(t *testing.T) {
	nodes := redistest.StartCluster(t, 3)
	for _, n := range nodes {
		n.Do(t, "CONFIG", "RESETSTAT")
	}
	const ids = 100
	var calls atomic.Int64
	fetch := func(ctx context.Context, _ *Lease) ([]byte, time.Duration, error) {
		calls.Add(1)
		time.Sleep(50 * time.Millisecond) // long enough that the others wait
		return []byte("v"), time.Minute, nil
	}
	var clients []*Client
	for range 4 {
		c, _ := newClusterClient(t, nodes, "sh", &Options{LockTTL: 30 * time.Second})
		clients = append(clients, c)
	}
	var wg sync.WaitGroup
	for _, c := range clients {
		for g := range 5 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range ids {
					id := fmt.Sprint("id", (i+g*20)%ids)
					ctx, cancel := context.WithTimeout(bg(), 20*time.Second)
					v, err := c.Get(ctx, id, fetch)
					cancel()
					if err != nil || string(v) != "v" {
						t.Errorf("Get(%s) = %q, %v", id, v, err)
						return
					}
				}
			}()
		}
	}
	wg.Wait()
	if n := calls.Load(); n != ids {
		t.Errorf("%d ids fetched %d times", ids, n)
	}
	var wakeups int64
	for _, c := range clients {
		wakeups += c.Stats().Wakeups
	}
	if wakeups == 0 {
		t.Error("no waiter was woken by a notification: the test proves nothing")
	}
	// Each value is published once, by the node that owns its slot.
	owned := map[*redistest.Server]int64{}
	for i := range ids {
		n, _ := nodeOf(t, nodes, fmt.Sprintf("sh:{id%d}", i))
		owned[n]++
	}
	var spublished int64
	for _, n := range nodes {
		if p := commandCalls(t, n, "publish"); p != 0 {
			t.Errorf("node %s ran PUBLISH %d times", n.Addr, p)
		}
		s := commandCalls(t, n, "spublish")
		if s == 0 || s != owned[n] {
			t.Errorf("node %s ran SPUBLISH %d times; it owns %d of the ids", n.Addr, s, owned[n])
		}
		spublished += s
	}
	if spublished < ids {
		t.Errorf("%d SPUBLISH for %d stored values", spublished, ids)
	}
	t.Logf("%d SPUBLISH in all, %d wake-ups", spublished, wakeups)
}

// clusterNodeID returns the node's own id.
func clusterNodeID(t testing.TB, n *redistest.Server) string {
	t.Helper()
	id, _ := n.Do(t, "CLUSTER", "MYID").(string)
	if id == "" {
		t.Fatalf("no CLUSTER MYID from %s", n.Addr)
	}
	return id
}

// migrateSlot moves slot, with its keys, from src to dst, and tells every
// node.
func migrateSlot(t testing.TB, nodes []*redistest.Server, slot int64, src, dst *redistest.Server) {
	t.Helper()
	srcID, dstID := clusterNodeID(t, src), clusterNodeID(t, dst)
	dst.Do(t, "CLUSTER", "SETSLOT", slot, "IMPORTING", srcID)
	src.Do(t, "CLUSTER", "SETSLOT", slot, "MIGRATING", dstID)
	host, port, _ := strings.Cut(dst.Addr, ":")
	for {
		keys, _ := src.Do(t, "CLUSTER", "GETKEYSINSLOT", slot, 100).([]any)
		if len(keys) == 0 {
			break
		}
		args := []any{"MIGRATE", host, port, "", 0, 5000, "KEYS"}
		args = append(args, keys...)
		if r := src.Do(t, args...); r != "OK" {
			t.Fatalf("MIGRATE: %v", r)
		}
	}
	for _, n := range []*redistest.Server{dst, src} {
		n.Do(t, "CLUSTER", "SETSLOT", slot, "NODE", dstID)
	}
	for _, n := range nodes {
		if n != src && n != dst {
			n.Do(t, "CLUSTER", "SETSLOT", slot, "NODE", dstID)
		}
	}
}

// nodeOf returns the node that serves key's slot, and the slot.
func nodeOf(t testing.TB, nodes []*redistest.Server, key string) (*redistest.Server, int64) {
	t.Helper()
	slot, _ := nodes[0].Do(t, "CLUSTER", "KEYSLOT", key).(int64)
	slots, _ := nodes[0].Do(t, "CLUSTER", "SLOTS").([]any)
	for _, r := range slots {
		r := r.([]any)
		lo, hi := r[0].(int64), r[1].(int64)
		if slot < lo || slot > hi {
			continue
		}
		master := r[2].([]any)
		addr := fmt.Sprintf("%s:%d", master[0], master[1].(int64))
		for _, n := range nodes {
			if n.Addr == addr {
				return n, slot
			}
		}
	}
	t.Fatalf("no node serves slot %d", slot)
	return nil, 0
}

// A slot migrated to another master while waiters wait on it: Redis
// unsubscribes their shard channels, and they watch again where the slot
// is now, and get the value when the holder stores it there, promptly.
func TestCluster_SlotMigrationDuringWaitLosesNoWaiter(t *testing.T) {
	nodes := redistest.StartCluster(t, 3)
	opts := &Options{LockTTL: 30 * time.Second}
	holder, _ := newClusterClient(t, nodes, "mig", opts)
	waiter, _ := newClusterClient(t, nodes, "mig", opts)
	src, slot := nodeOf(t, nodes, "mig:{k}")
	dst := nodes[0]
	if dst == src {
		dst = nodes[1]
	}
	started, release := make(chan struct{}), make(chan struct{})
	go func() {
		_, _ = holder.Get(bg(), "k", gatedFetch(started, release))
	}()
	<-started
	got := make(chan string, 1)
	go func() {
		v, err := waiter.Get(bg(), "k", noFetch)
		if err != nil {
			t.Error(err)
		}
		got <- string(v)
	}()
	eventually(t, 10*time.Second, "the waiter's sharded subscription", func() bool {
		m, _ := src.Do(t, "PUBSUB", "SHARDNUMSUB", "mig/notif:{k}").([]any)
		return len(m) == 2 && m[1] == int64(1)
	})
	migrateSlot(t, nodes, slot, src, dst)
	eventually(t, 10*time.Second, "the waiter to subscribe where the slot is now", func() bool {
		m, _ := dst.Do(t, "PUBSUB", "SHARDNUMSUB", "mig/notif:{k}").([]any)
		return len(m) == 2 && m[1] == int64(1)
	})
	start := time.Now()
	close(release)
	select {
	case v := <-got:
		if v != "v" {
			t.Errorf("waiter got %q", v)
		}
		t.Logf("woken %v after the store", time.Since(start))
	case <-time.After(5 * time.Second):
		t.Fatal("the waiter was not woken within 5s (the lock TTL is 30s)")
	}
}

// gatedFetch is a holder's fetch: it closes started, then returns "v" once
// release is closed, or fails when the client closes (if the test fails
// first).
func gatedFetch(started, release chan struct{}) FetchFunc {
	return func(ctx context.Context, _ *Lease) ([]byte, time.Duration, error) {
		close(started)
		select {
		case <-release:
		case <-ctx.Done():
			return nil, 0, ctx.Err()
		}
		return []byte("v"), time.Minute, nil
	}
}

// replicaOf returns the node that replicates master.
func replicaOf(t testing.TB, nodes []*redistest.Server, master *redistest.Server) *redistest.Server {
	t.Helper()
	id := clusterNodeID(t, master)
	var replica *redistest.Server
	eventually(t, 10*time.Second, "a replica of "+master.Addr, func() bool {
		out, _ := master.Do(t, "CLUSTER", "NODES").(string)
		for _, line := range strings.Split(out, "\n") {
			f := strings.Fields(line)
			if len(f) < 4 || !strings.Contains(f[2], "slave") || f[3] != id {
				continue
			}
			addr, _, _ := strings.Cut(f[1], "@")
			for _, n := range nodes {
				if n.Addr == addr {
					replica = n
					return true
				}
			}
		}
		return false
	})
	return replica
}

// replicated waits until replica has processed everything master had
// written when it was called (INFO replication offsets).
func replicated(t testing.TB, master, replica *redistest.Server) {
	t.Helper()
	want := replOffset(t, master, "master_repl_offset")
	eventually(t, 10*time.Second, "the replica to catch up with "+master.Addr, func() bool {
		return replOffset(t, replica, "slave_repl_offset") >= want
	})
}

// replOffset reads field, a replication offset, from n's INFO replication.
func replOffset(t testing.TB, n *redistest.Server, field string) int64 {
	t.Helper()
	info, _ := n.Do(t, "INFO", "replication").(string)
	for _, line := range strings.Split(info, "\r\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			off, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				t.Fatalf("%s %s: %q", n.Addr, field, v)
			}
			return off
		}
	}
	t.Fatalf("%s: no %s in INFO replication:\n%s", n.Addr, field, info)
	return 0
}

// failoverCase parks a waiter on id k, whose lock a holder holds, then
// runs fault, then lets the holder finish: the waiter must get a value (or
// a clear error) well within the lock TTL.
func failoverCase(t *testing.T, fault func(nodes []*redistest.Server, master *redistest.Server)) {
	failoverCaseWithin(t, 0, 15*time.Second, fault)
}

// failoverCaseWithin is failoverCase with a pause between the fault and the
// holder's store, and a bound on the waiter's answer after the store.
func failoverCaseWithin(t *testing.T, pause, bound time.Duration, fault func(nodes []*redistest.Server, master *redistest.Server)) {
	nodes := redistest.StartClusterWithReplicas(t, 3, 1)
	opts := &Options{LockTTL: 20 * time.Second}
	holder, _ := newClusterClient(t, nodes, "fo", opts)
	waiter, _ := newClusterClient(t, nodes, "fo", opts)
	master, _ := nodeOf(t, nodes, "fo:{k}")
	started, release := make(chan struct{}), make(chan struct{})
	go func() {
		_, _ = holder.Get(bg(), "k", gatedFetch(started, release))
	}()
	<-started
	type answer struct {
		v   string
		err error
	}
	got := make(chan answer, 1)
	go func() {
		v, err := waiter.Get(bg(), "k", func(context.Context, *Lease) ([]byte, time.Duration, error) {
			return []byte("recomputed"), time.Minute, nil
		})
		got <- answer{string(v), err}
	}()
	eventually(t, 10*time.Second, "the waiter's sharded subscription", func() bool {
		m, _ := master.Do(t, "PUBSUB", "SHARDNUMSUB", "fo/notif:{k}").([]any)
		return len(m) == 2 && m[1] == int64(1)
	})
	fault(nodes, master)
	time.Sleep(pause)
	start := time.Now()
	close(release)
	select {
	case a := <-got:
		// The holder's lock may be lost with the old master (replication
		// is asynchronous): then the waiter computes. A lookup that meets
		// the dead master before its replica took over fails, as any
		// command would then: a clear error, at once, is an answer too.
		ok := a.err == nil && (a.v == "v" || a.v == "recomputed")
		if !ok && !errors.Is(a.err, ErrRedis) {
			t.Errorf("waiter: %q, %v", a.v, a.err)
		}
		t.Logf("waiter answered %q %v after the holder finished", a.v, time.Since(start))
	case <-time.After(bound):
		t.Fatalf("the waiter had no answer %v after the holder finished (the lock TTL is 20s)", bound)
	}
}

// A master's replica takes over with CLUSTER FAILOVER while a waiter waits
// on a slot of that master.
func TestCluster_FailoverDuringWaitLosesNoWaiter(t *testing.T) {
	failoverCase(t, func(nodes []*redistest.Server, master *redistest.Server) {
		replica := replicaOf(t, nodes, master)
		replica.Do(t, "CLUSTER", "FAILOVER")
		eventually(t, 10*time.Second, "the replica to take over", func() bool {
			role, _ := replica.Do(t, "ROLE").([]any)
			return len(role) > 0 && role[0] == "master"
		})
	})
}

// A graceful failover whose new master the waiter's client has not learned
// of when it subscribes again: the old master, a replica now, accepts the
// subscription and never hears the value (the new master forwards sharded
// messages only to the replicas it knows). The waiter still answers within
// seconds, not at the holder's lock TTL (issue 14).
func TestCluster_FailoverThenAStoreLosesNoWaiter(t *testing.T) {
	failoverCaseWithin(t, 200*time.Millisecond, 8*time.Second, func(nodes []*redistest.Server, master *redistest.Server) {
		replica := replicaOf(t, nodes, master)
		replica.Do(t, "CLUSTER", "FAILOVER")
		eventually(t, 10*time.Second, "the replica to take over", func() bool {
			role, _ := replica.Do(t, "ROLE").([]any)
			return len(role) > 0 && role[0] == "master"
		})
	})
}

// A master killed with SIGKILL while a waiter waits on one of its slots:
// its replica takes over.
func TestCluster_MasterKilledDuringWaitLosesNoWaiter(t *testing.T) {
	failoverCase(t, func(nodes []*redistest.Server, master *redistest.Server) {
		replica := replicaOf(t, nodes, master)
		master.Kill()
		deadline := time.Now().Add(15 * time.Second)
		for {
			role, _ := replica.Do(t, "ROLE").([]any)
			if len(role) > 0 && role[0] == "master" {
				break
			}
			if time.Now().After(deadline) {
				nodesInfo, _ := replica.Do(t, "CLUSTER", "NODES").(string)
				t.Fatalf("the replica did not take over within 15s: role %v\n%s", role, nodesInfo)
			}
			time.Sleep(10 * time.Millisecond)
		}
	})
}

// Every key and channel of an id placed by PlaceID must land in one slot,
// by Redis's own rule (CLUSTER KEYSLOT).
func TestPlaceID_KeysShareOneSlot(t *testing.T) {
	nodes := redistest.StartCluster(t, 3)
	ids := []string{"a", "{", "}", "{}", "}{", "{}{}", "}x", "}}", "}{x}", "x}", "a{b}c", "{a}", "{{}}", "{}x{y}", "}{}", "a}{", "{x", "x{", "{}}", "}{{}"}
	keys, _ := NewKeyScheme("t")
	for _, id := range ids {
		placed, ok := PlaceID(id)
		if !ok {
			if !strings.HasPrefix(id, "}") {
				t.Errorf("id %q refused", id)
			}
			continue
		}
		all := []string{keys.Value(placed), keys.Lock(placed), keys.Notif(placed), keys.Events(placed), keys.NotFound(placed), keys.Stale(placed)}
		slots := map[int64][]string{}
		for _, k := range all {
			s, _ := nodes[0].Do(t, "CLUSTER", "KEYSLOT", k).(int64)
			slots[s] = append(slots[s], k)
		}
		if len(slots) != 1 {
			t.Errorf("id %q placed as %q: its keys span %d slots: %v", id, placed, len(slots), slots)
		}
	}
}

// Two different ids never share keys: "x" is placed as "{x}", and the id
// "{x}" as "{{x}}".
func TestPlaceID_IDsNeverShareKeys(t *testing.T) {
	for _, pair := range [][2]string{{"x", "{x}"}, {"{}x", "{{}x}"}, {"a}b", "{a}b}"}} {
		a, _ := PlaceID(pair[0])
		b, _ := PlaceID(pair[1])
		if a == b {
			t.Errorf("ids %q and %q are both sent as %q: they share value, lock and channels", pair[0], pair[1], a)
		}
	}
}

// The same, end to end on a cluster: Get of "{x}" computes its own value.
func TestCluster_BracedIDIsItsOwn(t *testing.T) {
	nodes := redistest.StartCluster(t, 3)
	c, _ := newClusterClient(t, nodes, "col", &Options{LockTTL: 5 * time.Second})
	ctx := bg()
	if _, err := c.Get(ctx, "x", func(context.Context, *Lease) ([]byte, time.Duration, error) {
		return []byte("value of x"), time.Minute, nil
	}); err != nil {
		t.Fatal(err)
	}
	var fetched atomic.Bool
	v, err := c.Get(ctx, "{x}", func(context.Context, *Lease) ([]byte, time.Duration, error) {
		fetched.Store(true)
		return []byte("value of {x}"), time.Minute, nil
	})
	if err != nil || !fetched.Load() {
		t.Errorf("Get({x}) = %q, %v, fetched %v: want its own value", v, err, fetched.Load())
	}
}

// An id beginning with "}" would be placed as "{}…}", whose braces Redis
// ignores (an empty tag), so that its keys span slots: it is refused, and
// works hashed.
func TestCluster_IDStartingWithCloseBraceIsRejected(t *testing.T) {
	nodes := redistest.StartCluster(t, 3)
	c, _ := newClusterClient(t, nodes, "br", &Options{LockTTL: 5 * time.Second})
	for _, id := range []string{"}", "}{", "}x"} {
		ctx, cancel := context.WithTimeout(bg(), 5*time.Second)
		v, err := c.Get(ctx, id, func(context.Context, *Lease) ([]byte, time.Duration, error) {
			return []byte("v"), time.Minute, nil
		})
		cancel()
		if !errors.Is(err, ErrInvalid) {
			t.Errorf("Get(%q) = %q, %v; want ErrInvalid", id, v, err)
		}
	}
	hashed, _ := newClusterClient(t, nodes, "br", &Options{HashIDs: true})
	if v, err := hashed.Get(bg(), "}x", constFetch(new(atomic.Int64), "v", 0)); err != nil || string(v) != "v" {
		t.Errorf("hashed: %q, %v", v, err)
	}
}

// Close while waiters wait on a cluster: they end with ErrClosed, promptly.
func TestCluster_CloseWhileWaiting(t *testing.T) {
	nodes := redistest.StartCluster(t, 3)
	holder, _ := newClusterClient(t, nodes, "cw", &Options{LockTTL: 20 * time.Second})
	waiter, _ := newClusterClient(t, nodes, "cw", &Options{LockTTL: 20 * time.Second})
	started, release := make(chan struct{}), make(chan struct{})
	go func() {
		_, _ = holder.Get(bg(), "k", gatedFetch(started, release))
	}()
	<-started
	defer close(release)
	errs := make(chan error, 3)
	for _, id := range []string{"k", "k", "k"} {
		go func() {
			_, err := waiter.Get(bg(), id, noFetch)
			errs <- err
		}()
	}
	eventually(t, 5*time.Second, "waits", func() bool { return waiter.Stats().Waits > 0 })
	time.Sleep(200 * time.Millisecond)
	start := time.Now()
	_ = waiter.Close()
	for range 3 {
		select {
		case err := <-errs:
			if !errors.Is(err, ErrClosed) {
				t.Errorf("waiter: %v", err)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("waiter not ended by Close")
		}
	}
	t.Logf("closed in %v", time.Since(start))
}

// A master frozen (SIGSTOP: a hung host, a network partition that drops
// packets) while a waiter waits on one of its slots: its replica takes
// over and the holder stores the value there. Nothing tells the waiter:
// the frozen node sends no unsubscribe, and go-redis may still route its
// lookups there. Its lock timer is the backstop: it answers within the
// lock TTL of its last lookup, never later.
func TestCluster_FrozenMasterDuringWait(t *testing.T) {
	nodes := redistest.StartClusterWithReplicas(t, 3, 1)
	opts := &Options{LockTTL: 30 * time.Second}
	holder, hrdb := newClusterClient(t, nodes, "fz", opts)
	waiter, _ := newClusterClient(t, nodes, "fz", opts)
	master, _ := nodeOf(t, nodes, "fz:{k}")
	replica := replicaOf(t, nodes, master)
	started, release := make(chan struct{}), make(chan struct{})
	stored := make(chan error, 1)
	go func() {
		_, err := holder.Get(bg(), "k", gatedFetch(started, release))
		stored <- err
	}()
	<-started
	got := make(chan error, 1)
	waitStart := time.Now()
	go func() {
		_, err := waiter.Get(bg(), "k", noFetch)
		got <- err
	}()
	eventually(t, 10*time.Second, "the waiter's sharded subscription", func() bool {
		m, _ := master.Do(t, "PUBSUB", "SHARDNUMSUB", "fz/notif:{k}").([]any)
		return len(m) == 2 && m[1] == int64(1)
	})
	// Replication is asynchronous: a lock lost with the frozen master
	// would make the holder's store fail and the waiter rightly compute.
	// The replica has the holder's lock before the master freezes.
	replicated(t, master, replica)
	info, _ := master.Do(t, "INFO", "server").(string)
	pid := 0
	for _, line := range strings.Split(info, "\r\n") {
		if v, ok := strings.CutPrefix(line, "process_id:"); ok {
			pid, _ = strconv.Atoi(v)
		}
	}
	if pid == 0 {
		t.Fatal("no pid")
	}
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGCONT) })
	eventually(t, 15*time.Second, "the replica to take over", func() bool {
		role, _ := replica.Do(t, "ROLE").([]any)
		return len(role) > 0 && role[0] == "master"
	})
	// The holder's client learns the new map before it stores.
	eventually(t, 10*time.Second, "the holder's client to know the new master", func() bool {
		hrdb.ReloadState(bg())
		n, err := hrdb.MasterForKey(bg(), "fz:{k}")
		return err == nil && n.Options().Addr == replica.Addr
	})
	start := time.Now()
	close(release)
	if err := <-stored; err != nil {
		t.Logf("holder: %v", err)
	}
	t.Logf("holder done %v after release (leases lost: %d); value on new master: %v", time.Since(start), holder.Stats().LeaseLost, replica.Do(t, "GET", "fz:{k}"))
	select {
	case err := <-got:
		t.Logf("waiter answered %v after the store, %v after it began: %v", time.Since(start), time.Since(waitStart), err)
		if err != nil && !errors.Is(err, ErrRedis) {
			t.Errorf("waiter: %v", err)
		}
	case <-time.After(time.Until(waitStart.Add(35 * time.Second))):
		t.Fatalf("the waiter had no answer 35s after it began (lock TTL 30s); stats %+v", waiter.Stats())
	}
}

const clusterChildEnv = "MEMOLOCK_CLUSTER_CHILD"

// runClusterChild is one process of TestCluster_StampedeAcrossProcesses:
// once told "go" on stdin, 200 goroutines each get the 100 ids, and it
// prints one "fetched <id>" line per fetch it ran, then "errors <n>".
func runClusterChild(spec string) {
	f := strings.Fields(spec) // hashed addr tag
	rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{f[1]}})
	defer rdb.Close()
	c, err := New(rdb, f[2], &Options{LockTTL: 30 * time.Second, HashIDs: f[0] == "true"})
	if err != nil {
		panic(err)
	}
	defer c.Close()
	fmt.Println("ready")
	in := make([]byte, 3)
	_, _ = os.Stdin.Read(in)
	var mu sync.Mutex
	var fetched []string
	var errs atomic.Int64
	var wg sync.WaitGroup
	for g := range 200 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 100 {
				id := fmt.Sprint("id", (i+g)%100)
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				v, err := c.Get(ctx, id, func(context.Context, *Lease) ([]byte, time.Duration, error) {
					mu.Lock()
					fetched = append(fetched, id)
					mu.Unlock()
					time.Sleep(50 * time.Millisecond)
					return []byte("v of " + id), time.Minute, nil
				})
				cancel()
				if err != nil || string(v) != "v of "+id {
					errs.Add(1)
					fmt.Fprintf(os.Stderr, "Get(%s) = %q, %v\n", id, v, err)
				}
			}
		}()
	}
	wg.Wait()
	for _, id := range fetched {
		fmt.Println("fetched", id)
	}
	fmt.Println("errors", errs.Load())
}

// 8 processes x 200 goroutines over 100 ids, without hash tags from the
// caller, with and without HashIDs: each id is computed exactly once, across
// all of them, and every call gets its value.
func TestCluster_StampedeAcrossProcesses(t *testing.T) {
	nodes := redistest.StartCluster(t, 3)
	for _, hashed := range []bool{false, true} {
		t.Run(fmt.Sprint("HashIDs=", hashed), func(t *testing.T) {
			tag := fmt.Sprint("procs", hashed)
			var children []*child
			for range 8 {
				ch := startChild(t, fmt.Sprintf("%s=%v %s %s", clusterChildEnv, hashed, nodes[0].Addr, tag))
				if !ch.out.Scan() || ch.out.Text() != "ready" {
					t.Fatalf("a child did not start: %q", ch.out.Text())
				}
				children = append(children, ch)
			}
			for _, ch := range children {
				_, _ = io.WriteString(ch.in, "go\n")
			}
			fetches := map[string]int{}
			for _, ch := range children {
				for ch.out.Scan() {
					line := ch.out.Text()
					if id, ok := strings.CutPrefix(line, "fetched "); ok {
						fetches[id]++
					} else if n, ok := strings.CutPrefix(line, "errors "); ok && n != "0" {
						t.Errorf("a child had %s failed Gets", n)
					}
				}
			}
			if len(fetches) != 100 {
				t.Errorf("%d ids fetched; want 100", len(fetches))
			}
			for id, n := range fetches {
				if n != 1 {
					t.Errorf("%s fetched %d times", id, n)
				}
			}
		})
	}
}
