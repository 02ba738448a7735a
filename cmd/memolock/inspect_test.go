//go:build unix

package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/memolock/memolock"
	"github.com/memolock/memolock/internal/redistest"
)

// inspected is inspect --json's object, as its documentation names the
// fields; null durations decode as nil.
type inspected struct {
	Tag            string `json:"tag"`
	ID             string `json:"id"`
	Key            string `json:"key"`
	Found          bool   `json:"found"`
	Size           int    `json:"size"`
	TTL            *int64 `json:"ttl_ms"`
	Stale          bool   `json:"stale"`
	StaleCopyTTL   *int64 `json:"stale_copy_ttl_ms"`
	NotFound       bool   `json:"not_found"`
	NotFoundTTL    *int64 `json:"not_found_ttl_ms"`
	Lock           string `json:"lock"`
	Holder         string `json:"holder"`
	LockTTL        *int64 `json:"lock_ttl_ms"`
	ValueListeners int64  `json:"value_subscribers"`
	EventListeners int64  `json:"event_subscribers"`
	Waiters        int64  `json:"waiters"`
	// Set only for strings that are not valid UTF-8.
	TagBase64    string `json:"tag_base64"`
	IDBase64     string `json:"id_base64"`
	KeyBase64    string `json:"key_base64"`
	HolderBase64 string `json:"holder_base64"`
}

// inspectJSON runs inspect --json and decodes its one object, strictly.
func inspectJSON(t *testing.T, args ...string) inspected {
	t.Helper()
	inv := memolockCmd(t, nil, append([]string{"inspect", "--json"}, args...)...)
	if inv.code != 0 {
		t.Fatalf("inspect %v: exit %d, stderr %q", args, inv.code, inv.stderr)
	}
	dec := json.NewDecoder(strings.NewReader(inv.stdout))
	dec.DisallowUnknownFields()
	var in inspected
	if err := dec.Decode(&in); err != nil || dec.More() {
		t.Fatalf("inspect %v: %v in %q", args, err, inv.stdout)
	}
	return in
}

// inTTL reports whether ms is a TTL above 0 and at most limit.
func inTTL(ms *int64, limit time.Duration) bool {
	return ms != nil && *ms > 0 && *ms <= limit.Milliseconds()
}

// blockedHolder starts a Get of id on holder whose fetch waits for the
// returned func, and a Get of id on waiter that waits for it; it returns
// once the lock is taken and the waiter listens on the value channel, as
// count reports. The func releases the fetch and waits for both Gets.
func blockedHolder(t *testing.T, holder, waiter *memolock.Client, id string, lock func() bool, count func() int64) func() {
	t.Helper()
	release := make(chan struct{})
	done := make(chan error, 2)
	fetch := func(context.Context, *memolock.Lease) ([]byte, time.Duration, error) {
		<-release
		return []byte("computed-s3cret"), time.Minute, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	go func() {
		_, err := holder.Get(ctx, id, fetch)
		done <- err
	}()
	var once bool
	finish := func() {
		if once {
			return
		}
		once = true
		close(release)
		for range 2 {
			if err := <-done; err != nil {
				t.Errorf("Get %s: %v", id, err)
			}
		}
		cancel()
	}
	t.Cleanup(finish)
	eventually(t, 10*time.Second, "the holder to take the lock", lock)
	go func() {
		_, err := waiter.Get(ctx, id, func(context.Context, *memolock.Lease) ([]byte, time.Duration, error) {
			return nil, 0, errors.New("the waiter computed")
		})
		done <- err
	}()
	eventually(t, 10*time.Second, "the waiter to subscribe", func() bool { return count() >= 1 })
	return finish
}

func newClient(t *testing.T, rdb redis.UniversalClient, tag string, opts *memolock.Options) *memolock.Client {
	t.Helper()
	c, err := memolock.New(rdb, tag, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// inspect shows each state memolock leaves in Redis, by size and never by
// content: a value with its TTL, a held lock with its waiters, a cached
// "not found", a stale value put back, and nothing at all.
func TestInspect_ShowsWhatRedisHolds(t *testing.T) {
	srv := redistest.Start(t)
	url := "redis://" + srv.Addr
	rdb := srv.Client(t)
	ctx := context.Background()
	c := newClient(t, rdb, "insp", &memolock.Options{NegTTL: time.Minute, StaleTTL: time.Hour, ResurrectTTL: 30 * time.Second})

	secret := "the-value-s3cret"
	if err := c.Set(ctx, "v", []byte(secret), time.Minute); err != nil {
		t.Fatal(err)
	}
	in := inspectJSON(t, "--redis", url, "--tag", "insp", "--id", "v")
	if !in.Found || in.Size != len(secret) || !inTTL(in.TTL, time.Minute) || in.Stale || in.NotFound ||
		in.Key != "insp:v" || in.Tag != "insp" || in.ID != "v" || !inTTL(in.StaleCopyTTL, time.Minute+time.Hour) {
		t.Errorf("value: %+v", in)
	}
	if in.Lock != "done" || in.Holder == "" || !inTTL(in.LockTTL, time.Second) {
		t.Errorf("after Set the lock lingers as done for up to 1s: %+v", in)
	}
	human := memolockCmd(t, nil, "inspect", "--redis", url, "--tag", "insp", "--id", "v")
	if human.code != 0 || !strings.Contains(human.stdout, "16 bytes, expires in ") || strings.Contains(human.stdout+human.stderr, secret) {
		t.Errorf("human output: exit %d, %q %q", human.code, human.stdout, human.stderr)
	}

	// A held lock, and a second client waiting for it.
	holder := newClient(t, srv.Client(t), "insp", nil)
	waiter := newClient(t, srv.Client(t), "insp", nil)
	finish := blockedHolder(t, holder, waiter, "busy",
		func() bool { return rdb.Exists(ctx, "insp/lock:busy").Val() == 1 },
		func() int64 { return rdb.PubSubNumSub(ctx, "insp/notif:busy").Val()["insp/notif:busy"] })
	in = inspectJSON(t, "--redis", url, "--tag", "insp", "--id", "busy")
	if in.Found || in.TTL != nil || in.Lock != "held" || !strings.Contains(in.Holder, "@") || !inTTL(in.LockTTL, memolock.DefaultLockTTL) ||
		in.ValueListeners < 1 || in.EventListeners < 1 || in.Waiters < 1 {
		t.Errorf("held lock with a waiter: %+v", in)
	}
	human = memolockCmd(t, nil, "inspect", "--redis", url, "--tag", "insp", "--id", "busy")
	if !strings.Contains(human.stdout, "lock        held by "+in.Holder) || !strings.Contains(human.stdout, "waiters     1 ") {
		t.Errorf("human output: %q", human.stdout)
	}
	finish()
	if in = inspectJSON(t, "--redis", url, "--tag", "insp", "--id", "busy"); in.Size != len("computed-s3cret") {
		t.Errorf("after the fetch: %+v", in)
	}

	// A cached "not found".
	_, err := c.Get(ctx, "nf", func(context.Context, *memolock.Lease) ([]byte, time.Duration, error) {
		return nil, 0, memolock.ErrNotFound
	})
	if !errors.Is(err, memolock.ErrNotFound) {
		t.Fatal(err)
	}
	in = inspectJSON(t, "--redis", url, "--tag", "insp", "--id", "nf")
	if in.Found || !in.NotFound || !inTTL(in.NotFoundTTL, time.Minute) || in.Lock != "free" || in.LockTTL != nil {
		t.Errorf("not found: %+v", in)
	}
	human = memolockCmd(t, nil, "inspect", "--redis", url, "--tag", "insp", "--id", "nf")
	if !strings.Contains(human.stdout, "not found   cached") {
		t.Errorf("human output: %q", human.stdout)
	}

	// A stale value put back: the value expires, then fetch fails.
	if _, err := c.Get(ctx, "st", func(context.Context, *memolock.Lease) ([]byte, time.Duration, error) {
		return []byte("old-s3cret"), 50 * time.Millisecond, nil
	}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "the value to expire", func() bool { return rdb.Exists(ctx, "insp:st").Val() == 0 })
	r, err := c.GetResult(ctx, "st", func(context.Context, *memolock.Lease) ([]byte, time.Duration, error) {
		return nil, 0, errors.New("the database is down")
	})
	if err != nil || r.Served != memolock.ServedStale {
		t.Fatalf("stale Get: %v, %v", r.Served, err)
	}
	in = inspectJSON(t, "--redis", url, "--tag", "insp", "--id", "st")
	if !in.Found || !in.Stale || in.Size != len("old-s3cret") || in.Lock != "stale" || !inTTL(in.LockTTL, 30*time.Second) ||
		!inTTL(in.StaleCopyTTL, time.Hour) || strings.HasPrefix(in.Holder, "stale:") {
		t.Errorf("stale: %+v", in)
	}
	human = memolockCmd(t, nil, "inspect", "--redis", url, "--tag", "insp", "--id", "st")
	if !strings.Contains(human.stdout, "stale: put back after a failed fetch") || !strings.Contains(human.stdout, "nobody fetches until the lock expires in") ||
		strings.Contains(human.stdout, "s3cret") {
		t.Errorf("human output: %q", human.stdout)
	}

	// Nothing there is no failure.
	in = inspectJSON(t, "--redis", url, "--tag", "insp", "--id", "nothing here")
	if in.Found || in.NotFound || in.Lock != "free" || in.Waiters != 0 || in.TTL != nil || in.StaleCopyTTL != nil || in.Key != "insp:nothing here" {
		t.Errorf("nothing: %+v", in)
	}

	// --hash-ids finds what a client with HashIDs stored, under the hash.
	hashed := newClient(t, rdb, "insp", &memolock.Options{HashIDs: true})
	if err := hashed.Set(ctx, "user@example.com", []byte("x"), 0); err != nil {
		t.Fatal(err)
	}
	in = inspectJSON(t, "--redis", url, "--tag", "insp", "--id", "user@example.com", "--hash-ids")
	if !in.Found || in.TTL == nil || *in.TTL != -1 || in.Key != "insp:"+memolock.HashID("user@example.com") {
		t.Errorf("--hash-ids: %+v", in)
	}
	if in = inspectJSON(t, "--redis", url, "--tag", "insp", "--id", "user@example.com"); in.Found {
		t.Errorf("without --hash-ids: %+v", in)
	}
}

// On a cluster, inspect places the id as the clients do (insp:{id}) and
// counts waiters with SHARDNUMSUB on the master of the id's slot.
func TestInspect_Cluster(t *testing.T) {
	nodes := redistest.StartCluster(t, 3)
	url := "redis://" + nodes[0].Addr + "?addr=" + nodes[1].Addr
	newCC := func() *redis.ClusterClient {
		cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{nodes[0].Addr}})
		t.Cleanup(func() { _ = cc.Close() })
		return cc
	}
	cc := newCC()
	ctx := context.Background()
	c := newClient(t, cc, "insp", nil)
	if err := c.Set(ctx, "v", []byte("cluster-s3cret"), time.Minute); err != nil {
		t.Fatal(err)
	}
	in := inspectJSON(t, "--redis", url, "--cluster", "--tag", "insp", "--id", "v")
	if !in.Found || in.Size != len("cluster-s3cret") || !inTTL(in.TTL, time.Minute) || in.Key != "insp:{v}" {
		t.Errorf("value: %+v", in)
	}

	shardSubs := func() int64 {
		node, err := cc.MasterForKey(ctx, "insp/notif:{busy}")
		if err != nil {
			return 0
		}
		return node.PubSubShardNumSub(ctx, "insp/notif:{busy}").Val()["insp/notif:{busy}"]
	}
	finish := blockedHolder(t, newClient(t, newCC(), "insp", nil), newClient(t, newCC(), "insp", nil), "busy",
		func() bool { return cc.Exists(ctx, "insp/lock:{busy}").Val() == 1 }, shardSubs)
	in = inspectJSON(t, "--redis", url, "--cluster", "--tag", "insp", "--id", "busy")
	if in.Lock != "held" || !strings.Contains(in.Holder, "@") || in.ValueListeners < 1 || in.EventListeners < 1 || in.Waiters < 1 || in.Key != "insp:{busy}" {
		t.Errorf("held lock with a waiter: %+v", in)
	}
	finish()

	// Without --cluster, a cluster node refuses the keys of an id (they
	// span slots: CROSSSLOT), and inspect suggests --cluster.
	inv := memolockCmd(t, nil, "inspect", "--redis", "redis://"+nodes[0].Addr, "--tag", "insp", "--id", "v")
	if inv.code != 1 || !strings.Contains(inv.stderr, "this is a Redis Cluster: pass --cluster") {
		t.Errorf("without --cluster: exit %d, %q", inv.code, inv.stderr)
	}

	// An id that cannot be placed is bad usage.
	inv = memolockCmd(t, nil, "inspect", "--redis", url, "--cluster", "--tag", "insp", "--id", "}x")
	if inv.code != 2 || !strings.Contains(inv.stderr, "cannot be placed") {
		t.Errorf("unplaceable id: exit %d, %q", inv.code, inv.stderr)
	}
}

// The password in a URL never shows, whether inspect works or fails.
func TestInspect_PasswordNeverPrinted(t *testing.T) {
	srv := redistest.Start(t)
	// The harness PINGs without a password: set it once the server runs.
	srv.Do(t, "CONFIG", "SET", "requirepass", "s3cret-pw")
	ok := memolockCmd(t, nil, "inspect", "--redis", "redis://:s3cret-pw@"+srv.Addr, "--tag", "t", "--id", "i")
	if ok.code != 0 || strings.Contains(ok.stdout+ok.stderr, "s3cret-pw") {
		t.Errorf("right password: exit %d, %q %q", ok.code, ok.stdout, ok.stderr)
	}
	for _, args := range [][]string{
		{"inspect", "--redis", "redis://:wrong-s3cret-pw@" + srv.Addr, "--tag", "t", "--id", "i", "--json"},
		{"inspect", "--redis", "redis://u:s3cret-pw@127.0.0.1:1", "--tag", "t", "--id", "i"},
		{"inspect", "--redis", "redis://127.0.0.1:1/0?password=s3cret-pw", "--tag", "t", "--id", "i"},
		{"inspect", "--redis", "redis://:s3cret-pw@127.0.0.1:1?addr=127.0.0.1:2", "--cluster", "--tag", "t", "--id", "i"},
		{"inspect", "--redis", "s3cret-pw", "--tag", "t", "--id", "i"},
		{"watch", "--redis", "redis://:wrong-s3cret-pw@" + srv.Addr, "--tag", "t"},
		{"watch", "--redis", "redis://u:s3cret-pw@127.0.0.1:1", "--tag", "t"},
		{"watch", "--redis", "redis://:s3cret-pw@127.0.0.1:1?addr=127.0.0.1:2", "--cluster", "--tag", "t"},
		{"watch", "--redis", "bogus://u:s3cret-pw@127.0.0.1:1", "--tag", "t"},
	} {
		inv := memolockCmd(t, nil, args...)
		if inv.code == 0 || strings.Contains(inv.stdout+inv.stderr, "s3cret-pw") {
			t.Errorf("%v: exit %d, %q %q", args, inv.code, inv.stdout, inv.stderr)
		}
	}
	env := []string{"MEMOLOCK_REDIS=redis://:s3cret-pw@" + srv.Addr}
	if inv := memolockCmd(t, env, "inspect", "--tag", "t", "--id", "i", "--json"); inv.code != 0 || strings.Contains(inv.stdout+inv.stderr, "s3cret-pw") {
		t.Errorf("$MEMOLOCK_REDIS: exit %d, %q %q", inv.code, inv.stdout, inv.stderr)
	}
	if inv := memolockCmd(t, env, "inspect", "-h"); inv.code != 0 || strings.Contains(inv.stdout+inv.stderr, "s3cret-pw") {
		t.Errorf("-h: exit %d, %q %q", inv.code, inv.stdout, inv.stderr)
	}
}

// A server that is down, or that never answers, is a clear error (exit 1)
// within seconds.
func TestInspect_RedisDownOrSilent(t *testing.T) {
	silent := redistest.Silent(t)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--redis", "redis://127.0.0.1:1"}, "connection refused"},
		{[]string{"--redis", "redis://127.0.0.1:1?addr=127.0.0.1:2", "--cluster"}, "connection refused"},
		{[]string{"--redis", "redis://" + silent}, "Redis did not answer in time"},
		{[]string{"--redis", "redis://" + silent, "--cluster"}, "Redis did not answer in time"},
	} {
		inv := memolockCmd(t, nil, append([]string{"inspect", "--tag", "t", "--id", "i"}, tc.args...)...)
		if inv.code != 1 || !strings.Contains(inv.stderr, tc.want) || strings.Contains(inv.stderr, "waiting for the value") || inv.took > 15*time.Second {
			t.Errorf("%v: exit %d after %v, %q; want 1 and %q within seconds", tc.args, inv.code, inv.took, inv.stderr, tc.want)
		}
	}
}

func TestInspect_BadUsage(t *testing.T) {
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"inspect"}, "--tag and --id (or --id-hex, --id-base64) are required"},
		{[]string{"inspect", "--tag", "t"}, "--tag and --id (or --id-hex, --id-base64) are required"},
		{[]string{"inspect", "--id", "i"}, "--tag and --id (or --id-hex, --id-base64) are required"},
		{[]string{"inspect", "--tag", "t", "--id", "i", "--bogus"}, "unknown flag --bogus"},
		{[]string{"inspect", "--tag", "t", "--id", "i", "extra"}, `unexpected argument "extra"`},
		{[]string{"inspect", "--tag", "a/lock", "--id", "i"}, `contains "/lock"`},
		{[]string{"inspect", "--tag", "t", "--id", "i", "--redis", "bogus://h:1"}, "not of the form"},
		{[]string{"inspect", "--tag", "t", "--id", "i", "--redis", "redis://h:1/0?dial_timeout=bogus"}, "not a valid Redis URL"},
		{[]string{"inspect", "--tag", "t", "--id", "i", "--redis", "redis://h:1?dial_timeout=bogus", "--cluster"}, "not a valid Redis Cluster URL"},
		{[]string{"inspect", "--tag", "t{x}", "--id", "i", "--redis", "redis://127.0.0.1:1", "--cluster"}, "contains a brace"},
		{[]string{"inspect", "--tag", "t", "--id", "a", "--id", "b", "--redis", "redis://127.0.0.1:1"}, "--id given 2 times"},
		{[]string{"inspect", "--tag", "t", "--id", "", "--redis", "redis://127.0.0.1:1", "--cluster"}, "cannot be placed in a cluster slot (it is empty or starts with \"}\"); pass --hash-ids"},
	}
	for _, tc := range cases {
		inv := memolockCmd(t, nil, tc.args...)
		if inv.code != 2 || !strings.Contains(inv.stderr, tc.want) || inv.stdout != "" {
			t.Errorf("%v: exit %d, stdout %q, stderr %q; want 2 and %q", tc.args, inv.code, inv.stdout, inv.stderr, tc.want)
		}
	}
}

// inspect measures a value without reading it: a 1 MB value costs Redis
// no 1 MB reply.
func TestInspect_BigValueIsNotTransferred(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	ctx := context.Background()
	c := newClient(t, rdb, "big", nil)
	if err := c.Set(ctx, "v", bytes.Repeat([]byte("x"), 1<<20), time.Hour); err != nil {
		t.Fatal(err)
	}
	sent := func() int64 {
		var n int64
		for _, line := range strings.Split(rdb.Info(ctx, "stats").Val(), "\n") {
			if v, ok := strings.CutPrefix(strings.TrimSpace(line), "total_net_output_bytes:"); ok {
				n, _ = strconv.ParseInt(v, 10, 64)
			}
		}
		return n
	}
	before := sent()
	in := inspectJSON(t, "--redis", "redis://"+srv.Addr, "--tag", "big", "--id", "v")
	if n := sent() - before; n > 64<<10 {
		t.Errorf("Redis sent %d bytes for inspect", n)
	}
	// Set leaves its lock as done:<token> for a second at most; on a
	// loaded machine inspect may come after that, and find it free.
	lockOK := in.Lock == "done" && inTTL(in.LockTTL, time.Second) || in.Lock == "free" && in.LockTTL == nil
	if !in.Found || in.Size != 1<<20 || !inTTL(in.TTL, time.Hour) || !lockOK || in.Key != "big:v" {
		t.Errorf("1 MB value: %+v", in)
	}
}

// --json gives strings that are not UTF-8 (ids are any bytes) in base64
// too, since JSON would turn their stray bytes into U+FFFD.
func TestInspect_JSONKeepsBinaryIDs(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	id := "bin\xff\xfeid"
	c := newClient(t, rdb, "bin", nil)
	if err := c.Set(context.Background(), id, []byte("v"), time.Minute); err != nil {
		t.Fatal(err)
	}
	b64 := func(s string) string { return base64.StdEncoding.EncodeToString([]byte(s)) }
	in := inspectJSON(t, "--redis", "redis://"+srv.Addr, "--tag", "bin", "--id", id)
	if !in.Found || in.IDBase64 != b64(id) || in.KeyBase64 != b64("bin:"+id) || in.TagBase64 != "" || in.HolderBase64 != "" {
		t.Errorf("binary id: %+v", in)
	}
	if in = inspectJSON(t, "--redis", "redis://"+srv.Addr, "--tag", "bin", "--id", "plain"); in.IDBase64 != "" || in.KeyBase64 != "" {
		t.Errorf("UTF-8 id: %+v", in)
	}
}
