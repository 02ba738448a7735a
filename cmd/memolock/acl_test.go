package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/memolock/memolock"
	"github.com/memolock/memolock/internal/redistest"
)

// The least-privilege recipe (aclRecipe, which the README prints and check
// names rules from), held to real ACL users: per feature, a user with
// exactly the recipe's rules can use the feature, and a user missing any
// one of them cannot, and memolock check names the rule it lacks.

const aclPassword = "acl-test-pw"

// setUser makes (or remakes) the ACL user name on every node with exactly
// rules.
func setUser(t *testing.T, nodes []*redistest.Server, name string, rules []string) {
	t.Helper()
	args := []any{"ACL", "SETUSER", name, "reset", "on", ">" + aclPassword}
	for _, r := range rules {
		args = append(args, r)
	}
	for _, n := range nodes {
		n.Do(t, args...)
		// As after a restart: the clients' scripts must be loaded again,
		// which takes EVAL, where EVALSHA served before.
		n.Do(t, "SCRIPT", "FLUSH")
	}
}

func userURL(name, addr string) string { return "redis://" + name + ":" + aclPassword + "@" + addr }

// without returns rules without its i-th.
func without(rules []string, i int) []string {
	return append(append([]string{}, rules[:i]...), rules[i+1:]...)
}

// waitFor polls cond until it holds or d passes, and reports whether it
// held: the missing-rule cases wait for what never comes, within d.
func waitFor(d time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(10 * time.Millisecond)
	}
	return true
}

var aclIDs atomic.Int64

// resetStats zeroes the command statistics of nodes.
func resetStats(t *testing.T, nodes []*redistest.Server) {
	t.Helper()
	for _, n := range nodes {
		n.Do(t, "CONFIG", "RESETSTAT")
	}
}

// refusals returns the commands that nodes refused since resetStats
// (ACL refusals count as rejected calls), but for those in tolerated,
// which the feature asks knowing that they may be refused.
func refusals(t *testing.T, nodes []*redistest.Server, tolerated ...string) []string {
	t.Helper()
	var out []string
	for _, n := range nodes {
		stats, _ := n.Do(t, "INFO", "commandstats").(string)
		for _, line := range strings.Split(stats, "\n") {
			name, rest, ok := strings.Cut(strings.TrimSpace(line), ":")
			name = strings.TrimPrefix(name, "cmdstat_")
			if !ok || !strings.Contains(rest, "rejected_calls=") || strings.Contains(rest, "rejected_calls=0,") || slices.Contains(tolerated, name) {
				continue
			}
			out = append(out, n.Addr+" "+name+": "+rest)
		}
	}
	return out
}

// coreWorks runs what a core user does, on the server (or cluster) that
// newClient reaches as the user, and says what went wrong, if anything: a
// holder whose fetch outlives its lock TTL (so its lease is renewed), and a
// waiter in another client that is woken by the holder's value and
// unsubscribes after. numsub counts a channel's subscribers, as an
// administrator sees them.
func coreWorks(newClient func() redis.UniversalClient, admin redis.UniversalClient, numsub func(string) int64, tag string) error {
	ctx := context.Background()
	id := fmt.Sprintf("core-%d", aclIDs.Add(1))
	r1, r2 := newClient(), newClient()
	defer r1.Close()
	defer r2.Close()
	// The lock TTL is long enough that a renewal held up by a loaded
	// machine (every lockTTL/3) does not let the lock expire: with a
	// second it did under .ci/under-load, and the waiter took over.
	const lockTTL = 3 * time.Second
	holder, err := memolock.New(r1, tag, &memolock.Options{LockTTL: lockTTL})
	if err != nil {
		return err
	}
	defer holder.Close()
	waiter, err := memolock.New(r2, tag, nil)
	if err != nil {
		return err
	}
	defer waiter.Close()
	keys := holder.Keys()
	wire := id
	if _, ok := admin.(*redis.ClusterClient); ok {
		wire, _ = memolock.PlaceID(id)
	}

	gate := make(chan struct{})
	held := make(chan error, 1)
	go func() {
		_, err := holder.Get(ctx, id, func(context.Context, *memolock.Lease) ([]byte, time.Duration, error) {
			<-gate
			return []byte("the value"), time.Minute, nil
		})
		held <- err
	}()
	opened := false
	open := func() {
		if !opened {
			opened = true
			close(gate)
		}
	}
	defer open()
	var early error
	waitFor(5*time.Second, func() bool {
		select {
		case early = <-held:
			return true
		default:
		}
		return admin.Exists(ctx, keys.Lock(wire)).Val() == 1
	})
	if early != nil || admin.Exists(ctx, keys.Lock(wire)).Val() == 0 {
		open()
		return fmt.Errorf("the holder took no lock: %v", early)
	}
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	waited := make(chan error, 1)
	var got []byte
	go func() {
		var err error
		got, err = waiter.Get(wctx, id, func(context.Context, *memolock.Lease) ([]byte, time.Duration, error) {
			return []byte("the waiter's value"), time.Minute, nil
		})
		waited <- err
	}()
	// The waiter listens, and the holder's lease has been renewed (its
	// PTTL went up), before the value comes; either may never happen. A
	// lease that cannot be renewed expires before the wait for a renewal
	// ends, and the waiter takes over.
	waitFor(3*time.Second, func() bool { return numsub(keys.Notif(wire)) >= 1 })
	last := admin.PTTL(ctx, keys.Lock(wire)).Val()
	waitFor(lockTTL+2*time.Second, func() bool {
		now := admin.PTTL(ctx, keys.Lock(wire)).Val()
		renewed := now > last
		last = now
		return renewed
	})
	open()
	herr, werr := <-held, <-waited
	s1, s2 := holder.Stats(), waiter.Stats()
	switch {
	case herr != nil:
		return fmt.Errorf("holder: %w", herr)
	case werr != nil:
		return fmt.Errorf("waiter: %w", werr)
	case string(got) != "the value":
		return fmt.Errorf("the waiter got %q, not the holder's value (holder: %d lease lost; waiter: %d takeovers)", got, s1.LeaseLost, s2.Takeovers)
	case s1.StoreErrors != 0 || s1.LeaseLost != 0:
		return fmt.Errorf("the holder's store failed (%d) or its lease was lost (%d)", s1.StoreErrors, s1.LeaseLost)
	}
	// The wake-up is counted as the flight ends, which may be after its
	// caller has the value.
	if !waitFor(2*time.Second, func() bool { return waiter.Stats().Wakeups > 0 }) {
		return fmt.Errorf("the waiter was not woken by the holder's value: %+v", waiter.Stats())
	}
	if !waitFor(5*time.Second, func() bool { return numsub(keys.Notif(wire)) == 0 }) {
		return fmt.Errorf("the waiter is still subscribed to %s after its wait", keys.Notif(wire))
	}
	return nil
}

// usable runs scenario, and returns its error, or else the commands that
// nodes refused meanwhile: with the recipe, Redis refuses nothing that
// memolock sends, whether or not memolock copes with the refusal.
func usable(t *testing.T, nodes []*redistest.Server, scenario func() error, tolerated ...string) error {
	t.Helper()
	resetStats(t, nodes)
	if err := scenario(); err != nil {
		return err
	}
	if r := refusals(t, nodes, tolerated...); len(r) > 0 {
		return fmt.Errorf("Redis refused commands: %s", strings.Join(r, "; "))
	}
	return nil
}

// checkNames runs memolock check with args and reports what is wrong with
// its answer: exit 0 when want is "", else exit 1 and "missing: want".
func checkNames(t *testing.T, want string, args ...string) string {
	t.Helper()
	inv := memolockCmd(t, nil, append([]string{"check"}, args...)...)
	if want == "" {
		if inv.code != 0 {
			return fmt.Sprintf("check: exit %d, want 0:\n%s%s", inv.code, inv.stdout, inv.stderr)
		}
		return ""
	}
	if inv.code != 1 || !strings.Contains(inv.stdout, "missing: "+want+"\n") && !strings.Contains(inv.stdout, "missing: "+want+" (") ||
		!strings.Contains(inv.stdout, "ACL SETUSER app ") {
		return fmt.Sprintf("check: exit %d, want 1 and %q named:\n%s%s", inv.code, want, inv.stdout, inv.stderr)
	}
	return ""
}

// The README prints aclRecipe, word for word.
func TestACL_TheReadmeHasTheRecipe(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range aclRecipe {
		// A pipe in a table cell is escaped, in a code span too.
		rules := strings.ReplaceAll(fillRule(f.rules, "T", 0), "|", `\|`)
		row := fmt.Sprintf("| %s | %s | `%s` |", f.name, f.what, rules)
		if !strings.Contains(string(readme), row) {
			t.Errorf("README.md has no row\n%s", row)
		}
	}
	example := "ACL SETUSER reports on >PASSWORD resetkeys resetchannels -@all " +
		strings.Join(append(rulesFor("core", "reports", 0), rulesFor("l1", "reports", 0)...), " ") + "\n"
	if !strings.Contains(string(readme), example) {
		t.Errorf("README.md has no example\n%s", example)
	}
}

func TestACL_Core(t *testing.T) {
	srv := redistest.Start(t)
	admin := srv.Client(t)
	numsub := func(ch string) int64 { return admin.PubSubNumSub(context.Background(), ch).Val()[ch] }
	const tag = "acl"
	rules := rulesFor("core", tag, 0)
	opts, err := redis.ParseURL(userURL("app", srv.Addr))
	if err != nil {
		t.Fatal(err)
	}
	newClient := func() redis.UniversalClient { return redis.NewClient(opts) }
	url := userURL("app", srv.Addr)

	nodes := []*redistest.Server{srv}
	works := func() error { return coreWorks(newClient, admin, numsub, tag) }
	setUser(t, nodes, "app", rules)
	if err := usable(t, nodes, works); err != nil {
		t.Fatalf("with the recipe's rules: %v", err)
	}
	inv := memolockCmd(t, nil, "run", "--redis", url, "--tag", tag, "--id", "run", "--ttl", "1m", "--", "echo", "ran")
	if inv.code != 0 || inv.stdout != "ran\n" {
		t.Errorf("memolock run with the recipe's rules: exit %d, %q, %q", inv.code, inv.stdout, inv.stderr)
	}
	if msg := checkNames(t, "", "--redis", url, "--tag", tag, "--features", "core"); msg != "" {
		t.Error(msg)
	}
	for i, rule := range rules {
		t.Run("without "+rule, func(t *testing.T) {
			setUser(t, nodes, "app", without(rules, i))
			if err := usable(t, nodes, works); err == nil {
				t.Errorf("works without %s", rule)
			}
			if msg := checkNames(t, rule, "--redis", url, "--tag", tag, "--features", "core"); msg != "" {
				t.Error(msg)
			}
		})
	}
}

// l1Works reports whether an L1 fills (L1 hits come) and is kept coherent
// (a write by somebody else reaches its readers).
func l1Works(opts *redis.Options, admin *redis.Client, tag, id string) error {
	ctx := context.Background()
	rdb := redis.NewClient(opts)
	defer rdb.Close()
	c, err := memolock.New(rdb, tag, &memolock.Options{L1Size: 100})
	if err != nil {
		return err
	}
	defer c.Close()
	get := func() ([]byte, error) {
		return c.Get(ctx, id, func(context.Context, *memolock.Lease) ([]byte, time.Duration, error) {
			return []byte("first"), time.Minute, nil
		})
	}
	var getErr error
	if !waitFor(3*time.Second, func() bool {
		_, getErr = get()
		return getErr == nil && c.Stats().L1Hits > 0
	}) {
		return fmt.Errorf("no L1 hit within 3s (last Get: %v; %+v)", getErr, c.Stats())
	}
	admin.Set(ctx, c.Keys().Value(id), "second", time.Minute)
	if !waitFor(3*time.Second, func() bool { v, err := get(); return err == nil && string(v) == "second" }) {
		return errors.New("the L1 still serves a value that was overwritten")
	}
	return nil
}

func TestACL_L1(t *testing.T) {
	srv := redistest.Start(t)
	admin := srv.Client(t)
	const tag = "acl"
	core, l1 := rulesFor("core", tag, 0), rulesFor("l1", tag, 0)
	url := userURL("app", srv.Addr)
	opts, err := redis.ParseURL(url)
	if err != nil {
		t.Fatal(err)
	}
	nodes := []*redistest.Server{srv}
	setUser(t, nodes, "app", append(append([]string{}, core...), l1...))
	if err := usable(t, nodes, func() error { return l1Works(opts, admin, tag, "with") }); err != nil {
		t.Fatalf("with the recipe's rules: %v", err)
	}
	if msg := checkNames(t, "", "--redis", url, "--tag", tag, "--features", "core,l1"); msg != "" {
		t.Error(msg)
	}
	for i, rule := range l1 {
		t.Run("without "+rule, func(t *testing.T) {
			setUser(t, nodes, "app", append(append([]string{}, core...), without(l1, i)...))
			if err := usable(t, nodes, func() error { return l1Works(opts, admin, tag, "without-"+rule) }); err == nil {
				t.Errorf("the L1 works without %s", rule)
			}
			if msg := checkNames(t, rule, "--redis", url, "--tag", tag, "--features", "l1"); msg != "" {
				t.Error(msg)
			}
		})
	}
}

func TestACL_Cluster(t *testing.T) {
	nodes := redistest.StartCluster(t, 3)
	admin := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{nodes[0].Addr}})
	defer admin.Close()
	numsub := func(ch string) int64 {
		ctx := context.Background()
		m, err := admin.MasterForKey(ctx, ch)
		if err != nil {
			return -1
		}
		return m.PubSubShardNumSub(ctx, ch).Val()[ch]
	}
	const tag = "acl"
	rules := rulesFor("cluster", tag, 0)
	url := userURL("app", nodes[0].Addr) + "?addr=" + nodes[1].Addr
	newClient := func() redis.UniversalClient {
		return redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{nodes[0].Addr}, Username: "app", Password: aclPassword})
	}
	works := func() error { return coreWorks(newClient, admin, numsub, tag) }
	setUser(t, nodes, "app", rules)
	if err := usable(t, nodes, works); err != nil {
		t.Fatalf("with the recipe's rules: %v", err)
	}
	inv := memolockCmd(t, nil, "run", "--redis", url, "--cluster", "--tag", tag, "--id", "run", "--ttl", "1m", "--", "echo", "ran")
	if inv.code != 0 || inv.stdout != "ran\n" {
		t.Errorf("memolock run --cluster with the recipe's rules: exit %d, %q, %q", inv.code, inv.stdout, inv.stderr)
	}
	if msg := checkNames(t, "", "--redis", url, "--cluster", "--tag", tag, "--features", "core"); msg != "" {
		t.Error(msg)
	}
	for i, rule := range rules {
		t.Run("without "+rule, func(t *testing.T) {
			setUser(t, nodes, "app", without(rules, i))
			if err := usable(t, nodes, works); err == nil {
				t.Errorf("works without %s", rule)
			}
			if msg := checkNames(t, rule, "--redis", url, "--cluster", "--tag", tag, "--features", "core"); msg != "" {
				t.Error(msg)
			}
		})
	}
	// A user that one master lacks: check names that master.
	setUser(t, nodes, "app", rules)
	nodes[2].Do(t, "ACL", "DELUSER", "app")
	inv = memolockCmd(t, nil, "check", "--redis", url, "--cluster", "--tag", tag, "--features", "core")
	if inv.code != 1 || !strings.Contains(inv.stdout, nodes[2].Addr+": ") || !strings.Contains(inv.stdout, "create the user on each") {
		t.Errorf("a master without the user: exit %d\n%s%s", inv.code, inv.stdout, inv.stderr)
	}
}

func TestACL_Inspect(t *testing.T) {
	srv := redistest.Start(t)
	admin := srv.Client(t)
	const tag = "acl"
	// A value, and a lock held over it, as an application leaves them.
	admin.Set(context.Background(), tag+":x", "hello", time.Minute)
	admin.Set(context.Background(), tag+"/lock:x", "a-holder", time.Minute)
	rules := rulesFor("inspect", tag, 0)
	url := userURL("app", srv.Addr)
	works := func() error {
		inv := memolockCmd(t, nil, "inspect", "--redis", url, "--tag", tag, "--id", "x")
		if inv.code != 0 || !strings.Contains(inv.stdout, "5 bytes") || !strings.Contains(inv.stdout, "held by a-holder") {
			return fmt.Errorf("exit %d, %q, %q", inv.code, inv.stdout, inv.stderr)
		}
		return nil
	}
	nodes := []*redistest.Server{srv}
	setUser(t, nodes, "app", rules)
	if err := usable(t, nodes, works); err != nil {
		t.Fatalf("with the recipe's rules: %v", err)
	}
	// Read-only: the user cannot write what it inspects.
	opts, _ := redis.ParseURL(url)
	ro := redis.NewClient(opts)
	defer ro.Close()
	if err := ro.Set(context.Background(), tag+":x", "overwritten", 0).Err(); err == nil || !strings.Contains(err.Error(), "NOPERM") {
		t.Errorf("the inspect user could write: %v", err)
	}
	if msg := checkNames(t, "", "--redis", url, "--tag", tag, "--features", "inspect"); msg != "" {
		t.Error(msg)
	}
	for i, rule := range rules {
		t.Run("without "+rule, func(t *testing.T) {
			setUser(t, nodes, "app", without(rules, i))
			if err := usable(t, nodes, works); err == nil {
				t.Errorf("inspect works without %s", rule)
			}
			if msg := checkNames(t, rule, "--redis", url, "--tag", tag, "--features", "inspect"); msg != "" {
				t.Error(msg)
			}
		})
	}
}

func TestACL_Watch(t *testing.T) {
	srv := redistest.Start(t)
	srv.Do(t, "CONFIG", "SET", "notify-keyspace-events", "K$x")
	admin := srv.Client(t)
	const tag = "acl"
	rules := rulesFor("watch", tag, 0)
	url := userURL("app", srv.Addr)
	ids := 0
	// works watches the tag, and one id, as the user, while an
	// application publishes a value and a holder's lock expires: both
	// feeds must show both.
	works := func() error {
		ids++
		id := fmt.Sprintf("w%d", ids)
		var feeds []*background
		for _, args := range [][]string{{}, {"--id", id}} {
			b := startMemolock(t, append([]string{"watch", "--redis", url, "--tag", tag}, args...)...)
			defer func() { _ = b.cmd.Process.Kill() }()
			if !waitFor(10*time.Second, func() bool { return strings.Contains(b.errb.String(), "watching tag ") || len(b.done) > 0 }) ||
				!strings.Contains(b.errb.String(), "watching tag ") {
				return fmt.Errorf("watch %v did not start: %q", args, b.errb.String())
			}
			feeds = append(feeds, b)
		}
		ctx := context.Background()
		admin.Set(ctx, tag+"/lock:"+id, "a-holder", 300*time.Millisecond)
		admin.Publish(ctx, tag+"/notif:"+id, "abc")
		for _, b := range feeds {
			if !waitFor(5*time.Second, func() bool {
				out := b.out.String()
				return strings.Contains(out, "value    id="+id+" size=3") && strings.Contains(out, "takeover id="+id+" ")
			}) {
				return fmt.Errorf("feed %v: %q, stderr %q", b.cmd.Args[3:], b.out.String(), b.errb.String())
			}
		}
		return nil
	}
	// watch asks CONFIG GET (are keyspace events on?) and INFO (is this
	// a cluster node?), and copes with a refusal: the recipe leaves both
	// out, CONFIG GET because it would let the user read requirepass.
	tolerated := []string{"config|get", "info"}
	nodes := []*redistest.Server{srv}
	setUser(t, nodes, "app", rules)
	if err := usable(t, nodes, works, tolerated...); err != nil {
		t.Fatalf("with the recipe's rules: %v", err)
	}
	if msg := checkNames(t, "", "--redis", url, "--tag", tag, "--features", "watch"); msg != "" {
		t.Error(msg)
	}
	for i, rule := range rules {
		t.Run("without "+rule, func(t *testing.T) {
			setUser(t, nodes, "app", without(rules, i))
			if err := usable(t, nodes, works, tolerated...); err == nil {
				t.Errorf("watch works without %s", rule)
			}
			if msg := checkNames(t, rule, "--redis", url, "--tag", tag, "--features", "watch"); msg != "" {
				t.Error(msg)
			}
		})
	}
}

// probeChecker returns a checker of tag as the user app (see setUser) on
// nodes, a cluster if there are more than one, with a probe id of its own:
// for trials called one by one.
func probeChecker(t *testing.T, nodes []*redistest.Server, tag string) *checker {
	t.Helper()
	keys, err := memolock.NewKeyScheme(tag)
	if err != nil {
		t.Fatal(err)
	}
	id := fmt.Sprintf("probe-%d", aclIDs.Add(1))
	ck := &checker{tag: tag, keys: keys, user: "app", probeID: id, id: id, token: "check-" + id}
	if len(nodes) == 1 {
		opts, err := parseRedisURL(userURL("app", nodes[0].Addr))
		if err != nil {
			t.Fatal(err)
		}
		ck.single = redis.NewClient(opts)
		ck.rdb = ck.single
	} else {
		ck.cluster = redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{nodes[0].Addr}, Username: "app", Password: aclPassword})
		ck.rdb = ck.cluster
		ck.probeID, _ = memolock.PlaceID(id)
	}
	t.Cleanup(func() { ck.rdb.Close() })
	return ck
}

// tryLibrary runs ck's libraryTrial, as core does, and returns the rule
// that check names for its failure, how long it took, and its error.
func tryLibrary(ck *checker) (string, time.Duration, error) {
	tr := ck.libraryTrial()
	t0 := time.Now()
	err := ck.callWithin(libraryBudget, tr.try)
	took := time.Since(t0)
	if err == nil {
		return "", took, nil
	}
	return refusedRule(err, tr), took, err
}

// core's trial of the library's own calls (libraryTrial): a user with the
// core recipe passes it, and nothing is left behind; a user without a rule
// that the library's scripts need fails it at once, and check names the
// rule, though Redis 7.0 names no command that it refuses inside a script.
// A key refused among a script's keys does not tell which: check names
// ~T/*, as core runs the trial only after the GET and SET trials passed on
// T: (alone, without ~T:*, the trial fails, naming ~T/* wrongly). Without
// +pexpire, which of the trial's calls only the renewal script makes,
// check's core fails once, for PEXPIRE on its own: the trial is not run
// after a failure. Without a key rule, too, only the trials of single
// commands name it, and the trial does not repeat it. The tag is
// "channel": the library's errors name keys, and a key refused must not
// pass for a channel refused (see refusedRule).
func TestACL_CoreThroughTheLibrary(t *testing.T) {
	srv := redistest.Start(t)
	admin := srv.Client(t)
	ctx := context.Background()
	nodes := []*redistest.Server{srv}
	const tag = "channel"
	rules := rulesFor("core", tag, 0)
	setUser(t, nodes, "app", rules)
	if _, _, err := tryLibrary(probeChecker(t, nodes, tag)); err != nil {
		t.Fatalf("with the recipe's rules: %v", err)
	}
	if keys := admin.Keys(ctx, "*").Val(); len(keys) > 0 {
		t.Errorf("with the recipe's rules, the trial left %v", keys)
	}
	// Only the subscriber sends these, and the trial waits for nobody.
	unused := []string{"+ping", "+subscribe", "+unsubscribe"}
	for i, rule := range rules {
		t.Run("without "+rule, func(t *testing.T) {
			setUser(t, nodes, "app", without(rules, i))
			ck := probeChecker(t, nodes, tag)
			named, took, err := tryLibrary(ck)
			ck.cleanUp()
			switch {
			case slices.Contains(unused, rule):
				if err != nil {
					t.Errorf("fails: %v", err)
				}
			case err == nil:
				t.Errorf("passes")
			case took > 2*time.Second:
				t.Errorf("took %v to fail: %v", took, err)
			case rule == "~"+tag+":*":
				if named != "~"+tag+"/*" || !strings.Contains(err.Error(), "keys") {
					t.Errorf("names %q for %v", named, err)
				}
			case named != rule:
				t.Errorf("names %q for %v", named, err)
			}
			if keys := admin.Keys(ctx, "*").Val(); len(keys) > 0 {
				t.Errorf("left behind after cleanUp: %v", keys)
			}
		})
	}

	setUser(t, nodes, "app", without(rules, slices.Index(rules, "+pexpire")))
	ck := probeChecker(t, nodes, tag)
	r := ck.core()
	ck.cleanUp()
	if r.status != checkFail || len(r.problems) != 1 || r.problems[0].rule != "+pexpire" || r.problems[0].more != 0 {
		t.Errorf("core without +pexpire: %s %s, %+v; want FAIL, +pexpire missing for PEXPIRE alone", r.status, r.detail, r.problems)
	}
	url := userURL("app", srv.Addr)
	inv := memolockCmd(t, nil, "check", "--redis", url, "--tag", tag, "--features", "core")
	if inv.code != 1 || statusOf(inv.stdout, "core") != "FAIL" || !strings.Contains(inv.stdout, "missing: +pexpire\n") ||
		strings.Count(inv.stdout, "      - ") != 1 || inv.stderr != "" || strings.Contains(inv.stdout, aclPassword) {
		t.Errorf("check without +pexpire: exit %d; want 1 and one problem, +pexpire:\n%s%s", inv.code, inv.stdout, inv.stderr)
	}
	setUser(t, nodes, "app", without(rules, slices.Index(rules, "~"+tag+"/*")))
	inv = memolockCmd(t, nil, "check", "--redis", url, "--tag", tag, "--features", "core")
	if inv.code != 1 || statusOf(inv.stdout, "core") != "FAIL" || !strings.Contains(inv.stdout, "missing: ~"+tag+"/* (and 3 more of the commands tried)\n") ||
		strings.Count(inv.stdout, "      - ") != 1 || strings.Contains(inv.stdout, "through the library") {
		t.Errorf("check without ~%s/*: exit %d; want 1 and one problem, ~%s/* named:\n%s%s", tag, inv.code, tag, inv.stdout, inv.stderr)
	}
	if keys := admin.Keys(ctx, "*").Val(); len(keys) > 0 {
		t.Errorf("left behind: %v", keys)
	}
}

// The same trial on a cluster, whose scripts publish with SPUBLISH.
func TestACL_ClusterThroughTheLibrary(t *testing.T) {
	nodes := redistest.StartCluster(t, 3)
	admin := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{nodes[0].Addr}})
	defer admin.Close()
	left := func() []string {
		var mu sync.Mutex
		var keys []string
		_ = admin.ForEachMaster(context.Background(), func(ctx context.Context, n *redis.Client) error {
			k := n.Keys(ctx, "*").Val()
			mu.Lock()
			keys = append(keys, k...)
			mu.Unlock()
			return nil
		})
		return keys
	}
	const tag = "acl"
	rules := rulesFor("cluster", tag, 0)
	setUser(t, nodes, "app", rules)
	if _, _, err := tryLibrary(probeChecker(t, nodes, tag)); err != nil {
		t.Fatalf("with the recipe's rules: %v", err)
	}
	if keys := left(); len(keys) > 0 {
		t.Errorf("with the recipe's rules, the trial left %v", keys)
	}
	for _, rule := range []string{"+spublish", "+pexpire"} {
		setUser(t, nodes, "app", without(rules, slices.Index(rules, rule)))
		ck := probeChecker(t, nodes, tag)
		named, _, err := tryLibrary(ck)
		ck.cleanUp()
		if err == nil || named != rule {
			t.Errorf("without %s: names %q for %v", rule, named, err)
		}
		if keys := left(); len(keys) > 0 {
			t.Errorf("without %s: left behind after cleanUp: %v", rule, keys)
		}
	}
}

// A user who may touch T: and T/lock: but no other key under T/ passes
// every trial of a single command, and fails the library's calls: each
// script declares T/lock-notfound: and T/lock-stale: among its keys, and
// TryLock takes T/lock-mutex:. Check names ~T/* for it, in the ACL SETUSER
// line too, and says that run and Get fail, not only Delete, the first
// call tried.
func TestACL_CoreKeysOfTheLibraryRefused(t *testing.T) {
	srv := redistest.Start(t)
	admin := srv.Client(t)
	const tag = "t"
	setUser(t, []*redistest.Server{srv}, "app", []string{"resetkeys", "resetchannels", "-@all", "~t:*", "~t/lock:*", "&t/*",
		"+get", "+set", "+del", "+pttl", "+pexpire", "+eval", "+evalsha", "+publish", "+subscribe", "+unsubscribe", "+ping"})
	inv := memolockCmd(t, nil, "check", "--redis", userURL("app", srv.Addr), "--tag", tag, "--features", "core")
	if inv.code != 1 || statusOf(inv.stdout, "core") != "FAIL" || !strings.Contains(inv.stdout, "FAIL  core     "+getFails) ||
		!strings.Contains(inv.stdout, "missing: ~t/*\n") || !strings.Contains(inv.stdout, "ACL SETUSER app ~t/*\n") ||
		strings.Count(inv.stdout, "      - ") != 1 || !strings.Contains(inv.stdout, ": Delete: ") {
		t.Errorf("exit %d; want 1, core FAIL for run and Get, Delete's refusal, and ~t/* named:\n%s%s", inv.code, inv.stdout, inv.stderr)
	}
	if keys := admin.Keys(context.Background(), "*").Val(); len(keys) > 0 {
		t.Errorf("left behind: %v", keys)
	}
}
