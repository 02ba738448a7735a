package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/memolock/memolock"
	"github.com/memolock/memolock/internal/wire"
)

// aclFeature is what one feature of memolock needs of a Redis ACL user, for
// tag {T} (escaped for glob patterns) in database {DB}.
type aclFeature struct {
	name  string
	what  string
	rules string
}

// aclRecipe is the least-privilege recipe, per feature: the README's
// "Least privilege" section prints it, check names its rules, and the
// tests hold a user with exactly these rules to it (the feature works)
// and a user missing any one of them (it does not, and check says which).
var aclRecipe = []aclFeature{
	{"core", "run, Get, GetMany, Lookup, Set, Delete, TryLock on one server",
		"~{T}:* ~{T}/* &{T}/* +get +set +del +pttl +pexpire +eval +evalsha +publish +subscribe +unsubscribe +ping"},
	{"l1", "Options.L1Size, beside core (one server, Redis 6 or later)",
		"+client|id +client|tracking &__redis__:invalidate"},
	{"cluster", "core on a Redis Cluster, instead of core (every node)",
		"~{T}:* ~{T}/* &{T}/* +get +set +del +pttl +pexpire +eval +evalsha +spublish +ssubscribe +sunsubscribe +ping +cluster|slots +command"},
	{"inspect", "memolock inspect, read-only (one server, Redis 7)",
		"%R~{T}:* %R~{T}/* +eval_ro +evalsha_ro +strlen +get +pttl +pubsub|numsub"},
	{"watch", "memolock watch, read-only (one server)",
		"%R~{T}/* &{T}/notif:* &{T}/lock-event:* &__keyspace@{DB}__:{T}/lock:* +ping +psubscribe +subscribe +multi +exec +get +pttl"},
}

// rulesFor returns the rules of the feature called name, for tag and db.
func rulesFor(name, tag string, db int) []string {
	for _, f := range aclRecipe {
		if f.name == name {
			return strings.Fields(fillRule(f.rules, tag, db))
		}
	}
	panic("no feature " + name)
}

// fillRule puts tag, escaped as glob patterns want it, and db in rule.
func fillRule(rule, tag string, db int) string {
	return strings.NewReplacer("{T}", globEscape(tag), "{DB}", strconv.Itoa(db)).Replace(rule)
}

var checkCommand = command{
	name:    "check",
	summary: "tell what works on a Redis server for a tag, and which ACL rules are missing",
	usage:   []string{"check --tag T [--redis URL [--cluster]] [--features LIST]"},
	about: `Tries what memolock does on the server, as the user of the URL, for one tag: it reaches the server and authenticates, reads its version and mode (one server or a cluster node), then, feature by feature, runs the commands the feature needs on the keys and channels of a probe id of its own (memolock-check-...): it writes only that id's value and lock keys (T:memolock-check-... and T/lock:memolock-check-...) and the key of a TryLock of it (T/lock-mutex: and the id's SHA-256), each with a TTL of 10s at most, and deletes them.

Features: core (run and the library's Get: keys, scripts, pub/sub, command by command, then, if all of them passed, a Get, Set, Delete and TryLock (renewed, released) on the probe id through the library itself: all but TryLock run its scripts, and Redis checks each command a script calls (before Redis 7.0, which TryLock needs, a warning instead of TryLock); with --cluster, as a cluster client: CLUSTER SLOTS, sharded pub/sub, and the user on every master); l1 (Options.L1Size: CLIENT TRACKING, and an invalidation that arrives on __redis__:invalidate; one server only); inspect and watch (read-only; watch also needs notify-keyspace-events with K, $ and x to show takeovers, which check reads with CONFIG GET if the user may).

For every refusal it names the ACL rule to add, and ends with the ACL SETUSER command that adds them all. The recipe per feature (the README's "Least privilege" section):

` + recipeHelp(),
	flags: []string{"tag", "features", "redis", "cluster"},
	env:   true,
	exits: [][2]string{
		{"0", "every feature checked works (warnings aside)"},
		{"1", "a feature does not work, or the server could not be reached or refused the user"},
		{"2", "bad usage"},
	},
	example: [][2]string{
		{"What works for the reports' user, and what it lacks.", "memolock check --redis redis://reports:PASSWORD@cache:6379 --tag reports"},
		{"Only what run and the L1 need.", "memolock check --tag reports --features core,l1"},
		{"A cluster.", "memolock check --redis 'redis://10.0.0.1:7000?addr=10.0.0.2:7000' --cluster --tag reports"},
	},
}

// recipeHelp is the recipe laid out for the help page.
func recipeHelp() string {
	var b strings.Builder
	for _, f := range aclRecipe {
		b.WriteString(columnAt("  "+f.name, fillRule(f.rules, "T", 0), 11))
	}
	return strings.TrimRight(b.String(), "\n")
}

// The outcome of a feature's checks.
const (
	checkOK   = "ok"
	checkWarn = "warn"
	checkFail = "FAIL"
	checkSkip = "skip"
)

// trial is one thing check tries, and the rules it needs: the command's,
// and those of the keys and channels it touches.
type trial struct {
	what  string
	cmd   string // the command's rule, "+get"
	keys  string // the key rule, if it touches keys
	chans string // the channel rule, if it touches channels
	try   func(context.Context) error
}

// problem is a trial that failed, and the rule it lacks, if that is why.
type problem struct {
	what string
	err  error
	rule string
	more int // other trials refused for the same rule
}

type featureResult struct {
	name     string
	status   string
	detail   string
	problems []problem
}

// checker runs the checks of one server and tag.
type checker struct {
	rdb     redis.UniversalClient
	single  *redis.Client        // one server; nil on a cluster
	cluster *redis.ClusterClient // a cluster; nil on one server
	seed    *redis.Client        // the cluster's first seed node
	url     string
	tag     string
	db      int
	user    string
	keys    memolock.KeyScheme
	probeID string // as placed on the wire
	id      string // the probe id as the library's calls take it, not placed
	token   string
	version string // the server's, as server read it ("" before)
	canSet  bool   // core could write the probe's value key
	// The calls that did not return in time, each closed when its call
	// has: cleanUp waits for them.
	late []chan struct{}
	// The URL names a user but no password: redis-cli would read the
	// name as the password, so it is never printed.
	userWithheld bool
}

// shownUser is the user name, as the report may show it.
func (ck *checker) shownUser() string {
	if ck.userWithheld {
		return "USER"
	}
	return show(ck.user)
}

func check(args []string, stdout, stderr io.Writer) int {
	c := &checkCommand
	fs := flag.NewFlagSet("check", flag.ContinueOnError)
	tag := fs.String("tag", "", "the `TAG` to check, as the clients use it (required)")
	features := fs.String("features", "", "the features to check, a comma-separated `LIST` of core, l1, inspect and watch (default: all; l1 only on one server)")
	redisURL := fs.String("redis", "", redisUsage)
	cluster := fs.Bool("cluster", false, clusterUsage)
	if code, ok := parse(c, fs, args, stdout, stderr); !ok {
		return code
	}
	switch {
	case *tag == "":
		return usageError(c, stderr, "--tag is required")
	case fs.NArg() > 0:
		return usageError(c, stderr, "unexpected argument %q (--cluster takes no value)", redactArg(fs.Arg(0)))
	}
	keys, err := memolock.NewKeyScheme(*tag)
	if err != nil {
		return usageError(c, stderr, "%s", libError(err))
	}
	if *cluster && strings.ContainsAny(*tag, "{}") {
		return usageError(c, stderr, "tag %q contains a brace; on a cluster the id's braces must be the first in every key", *tag)
	}
	want := []string{"core", "l1", "inspect", "watch"}
	if *cluster {
		want = []string{"core", "inspect", "watch"}
	}
	if *features != "" {
		want = nil
		for _, f := range strings.Split(*features, ",") {
			f = strings.TrimSpace(f)
			switch f {
			case "core", "inspect", "watch":
			case "l1":
				if *cluster {
					return usageError(c, stderr, "--features l1: the L1 needs one server (Options.L1Size refuses a cluster client)")
				}
			default:
				return usageError(c, stderr, "--features: unknown feature %q; the features are core, l1, inspect and watch", f)
			}
			want = append(want, f)
		}
	}
	url := redisURLOrDefault(*redisURL)
	ck := &checker{url: url, tag: *tag, keys: keys, user: "default"}
	var b [6]byte
	_, _ = rand.Read(b[:])
	ck.probeID, ck.token = "memolock-check-"+hex.EncodeToString(b[:]), "memolock-check-"+hex.EncodeToString(b[3:])
	ck.id = ck.probeID
	if *cluster {
		opts, err := parseClusterURL(url)
		if err != nil {
			return usageError(c, stderr, "--redis %v", err)
		}
		ck.cluster = redis.NewClusterClient(opts)
		ck.rdb = ck.cluster
		so := &redis.Options{Addr: opts.Addrs[0], Username: opts.Username, Password: opts.Password,
			TLSConfig: opts.TLSConfig, Dialer: opts.Dialer, DialTimeout: opts.DialTimeout}
		ck.seed = redis.NewClient(so)
		defer ck.seed.Close()
		if opts.Username != "" {
			ck.user, ck.userWithheld = opts.Username, opts.Password == ""
		}
		ck.probeID, _ = memolock.PlaceID(ck.probeID)
	} else {
		opts, err := parseRedisURL(url)
		if err != nil {
			return usageError(c, stderr, "--redis %v", err)
		}
		ck.single = redis.NewClient(opts)
		ck.rdb = ck.single
		ck.db = opts.DB
		if opts.Username != "" {
			ck.user, ck.userWithheld = opts.Username, opts.Password == ""
		}
	}
	defer ck.rdb.Close()
	return ck.run(want, stdout, stderr)
}

// run checks the server, then each feature in want, and prints the report.
func (ck *checker) run(want []string, stdout, stderr io.Writer) int {
	where := redact(ck.url)
	fmt.Fprintf(stdout, "memolock check: %s, user %s, tag %s\n", where, ck.shownUser(), show(ck.tag))
	server := ck.server()
	printResult(stdout, server)
	if server.status == checkFail {
		fmt.Fprintf(stderr, "memolock check: %s\n", server.detail)
		return exitFailure
	}
	var results []featureResult
	for _, f := range want {
		var r featureResult
		switch f {
		case "core":
			r = ck.core()
		case "l1":
			r = ck.l1()
		case "inspect":
			r = ck.inspect()
		case "watch":
			r = ck.watch()
		}
		printResult(stdout, r)
		results = append(results, r)
	}
	ck.cleanUp()

	var rules []string
	failed := false
	seen := map[string]bool{}
	for _, r := range results {
		failed = failed || r.status == checkFail
		for _, p := range r.problems {
			if p.rule != "" && !seen[p.rule] {
				seen[p.rule] = true
				rules = append(rules, p.rule)
			}
		}
	}
	if seen["+multi"] && !seen["+exec"] {
		// A refused MULTI hides EXEC's refusal, which always comes with it.
		rules = append(rules, "+exec")
	}
	if len(rules) > 0 {
		user := ck.shownUser()
		if strings.ContainsAny(user, " \"'") && !ck.userWithheld {
			user = strconv.Quote(user)
		}
		for i, r := range rules {
			if strings.ContainsAny(r, " \"'") {
				rules[i] = strconv.Quote(r)
			}
		}
		fmt.Fprintf(stdout, "\nTo grant what is missing, an administrator can run (in redis-cli; quote the rules in a shell):\n  ACL SETUSER %s %s\n", user, strings.Join(rules, " "))
		if ck.cluster != nil {
			fmt.Fprintln(stdout, "on every node of the cluster.")
		}
	}
	if failed {
		return exitFailure
	}
	return 0
}

func printResult(w io.Writer, r featureResult) {
	fmt.Fprintf(w, "%-5s %-8s %s\n", r.status, r.name, r.detail)
	for _, p := range r.problems {
		fmt.Fprintf(w, "      - %s: %v\n", p.what, p.err)
		if p.rule != "" {
			also := ""
			if p.more > 0 {
				also = fmt.Sprintf(" (and %d more of the commands tried)", p.more)
			}
			fmt.Fprintf(w, "        missing: %s%s\n", p.rule, also)
		}
	}
}

// server reaches the server, authenticates, and reads its version and
// mode: HELLO answers every user, ACL or not.
func (ck *checker) server() featureResult {
	r := featureResult{name: "server"}
	node := ck.single
	if ck.cluster != nil {
		node = ck.seed
	}
	t0 := time.Now()
	var info map[string]string
	// The first call dials: a TLS handshake that fails takes a dial
	// time-out before it can tell why.
	ctx, cancel := context.WithTimeout(context.Background(), 2*callTimeout)
	defer cancel()
	err := within(ctx, func(ctx context.Context) error {
		var err error
		info, err = hello(ctx, node)
		return err
	})
	took := time.Since(t0)
	if err != nil {
		r.status = checkFail
		r.detail = fmt.Sprintf("%v (redis %s)%s", err, redact(ck.url), redisHint(err, ck.url)+timedOut(err))
		return r
	}
	mode := info["mode"]
	ck.version = info["version"]
	r.status, r.detail = checkOK, fmt.Sprintf("Redis %s, %s, answered in %v", info["version"], mode, took.Round(time.Microsecond*100))
	switch {
	case mode == "cluster" && ck.cluster == nil:
		r.status, r.detail = checkFail, fmt.Sprintf("Redis %s is a Redis Cluster node: pass --cluster (with other seed nodes as addr parameters)", info["version"])
	case mode != "" && mode != "cluster" && ck.cluster != nil:
		r.status, r.detail = checkFail, fmt.Sprintf("Redis %s is not a cluster node (%s): drop --cluster", info["version"], mode)
	}
	return r
}

// hello returns what HELLO says of the server (version, mode), or what
// INFO says on a server without HELLO (before Redis 6).
func hello(ctx context.Context, node *redis.Client) (map[string]string, error) {
	v, err := node.Do(ctx, "HELLO", "3").Result()
	if err == nil {
		out := map[string]string{}
		switch m := v.(type) {
		case map[any]any:
			for k, v := range m {
				out[fmt.Sprint(k)] = fmt.Sprint(v)
			}
		case []any:
			for i := 0; i+1 < len(m); i += 2 {
				out[fmt.Sprint(m[i])] = fmt.Sprint(m[i+1])
			}
		}
		return out, nil
	}
	if !strings.Contains(strings.ToLower(err.Error()), "unknown command") {
		return nil, err
	}
	text, err := node.Info(ctx, "server").Result()
	if err != nil {
		var rerr redis.Error
		if errors.As(err, &rerr) {
			return map[string]string{"version": "(unknown)"}, nil
		}
		return nil, err
	}
	out := map[string]string{}
	for _, line := range strings.Split(text, "\n") {
		if k, v, ok := strings.Cut(strings.TrimSpace(line), ":"); ok {
			switch k {
			case "redis_version":
				out["version"] = v
			case "redis_mode":
				out["mode"] = v
			}
		}
	}
	return out, nil
}

// call runs one probe's call, bounded in time by callTimeout (see
// callWithin).
func (ck *checker) call(fn func(context.Context) error) error {
	return ck.callWithin(callTimeout, fn)
}

// callWithin runs one probe's call, bounded in time by budget (see within).
// A call that has not returned when within gives up goes on, its context
// cancelled: it is kept in late, for cleanUp to wait for.
func (ck *checker) callWithin(budget time.Duration, fn func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(context.Background(), budget)
	defer cancel()
	done := make(chan struct{})
	err := within(ctx, func(ctx context.Context) error {
		defer close(done)
		return fn(ctx)
	})
	select {
	case <-done:
	default:
		ck.late = append(ck.late, done)
	}
	return err
}

// rule returns a rule of feature for this server's tag and db.
func (ck *checker) rule(rule string) string { return fillRule(rule, ck.tag, ck.db) }

// runProbes runs ps in order, each within budget, and returns those that
// failed; of those that lack the same rule, the first, counting the others.
func (ck *checker) runProbes(budget time.Duration, ps []trial) []problem {
	var out []problem
	for _, p := range ps {
		err := ck.callWithin(budget, p.try)
		if err == nil {
			continue
		}
		pr := problem{what: p.what, err: err, rule: refusedRule(err, p)}
		dup := false
		for i := range out {
			if pr.rule != "" && out[i].rule == pr.rule {
				out[i].more++
				dup = true
			}
		}
		if !dup {
			out = append(out, pr)
		}
	}
	return out
}

var refusedCommand = regexp.MustCompile(`'([a-z_|.-]+)' command`)

// refusedRule returns the rule whose absence made Redis refuse p with err,
// or "" if err is no refusal. Redis names the command it refuses, or says
// that a key or a channel is out of bounds (the words vary with its
// version). Inside a script, Redis 6.x and 7.0 name no command, but the
// script and the line: that line of the library's script names it (see
// scriptCommand). Only Redis's reply is read, not what wraps it: the
// library's errors name keys, and so the tag, which may hold "key" or
// "channel".
func refusedRule(err error, p trial) string {
	var reply redis.Error
	if !errors.As(err, &reply) {
		return ""
	}
	msg := reply.Error()
	inScript := strings.Contains(msg, "The user executing the script")
	if !strings.Contains(msg, "NOPERM") && !strings.Contains(msg, "no permissions") && !inScript {
		return ""
	}
	low := strings.ToLower(msg)
	switch {
	case refusedCommand.MatchString(msg):
		return "+" + refusedCommand.FindStringSubmatch(msg)[1]
	case inScript && strings.Contains(msg, "can't run this command") && scriptCommand(msg) != "":
		return "+" + scriptCommand(msg)
	case strings.Contains(low, "key") && p.keys != "":
		return p.keys
	case strings.Contains(low, "channel") && p.chans != "":
		return p.chans
	}
	return p.cmd
}

// allowed turns a refusal-free error reply into success: NOSCRIPT, say,
// means that Redis let the user run EVALSHA.
func allowed(err error, replies ...string) error {
	if err == nil {
		return nil
	}
	for _, r := range replies {
		if strings.HasPrefix(err.Error(), r) {
			return nil
		}
	}
	return err
}

// verdict sums up a feature's problems.
func verdict(name, works, fails string, problems []problem) featureResult {
	if len(problems) == 0 {
		return featureResult{name: name, status: checkOK, detail: works}
	}
	return featureResult{name: name, status: checkFail, detail: fails, problems: problems}
}

// returnOne is the script of the EVAL probes: it runs nothing, so that
// only EVAL's own permission is tried.
var returnOne = redis.NewScript("return 1")

// core tries what run and the library's calls need: each command on its
// own, then, if all of them passed, the library's own calls (see
// libraryTrial). After a failure, the library's calls are not tried: they
// send only commands tried on their own, on the same keys and channels
// (a test holds the trials to the scripts), so they could only fail again
// for a refusal named already, and unnamed. Before Redis 7.0, TryLock
// cannot work (see tryLock): core warns.
func (ck *checker) core() featureResult {
	what := "keys, scripts and pub/sub of the tag: run and Get work"
	if ck.cluster != nil {
		what = "keys, scripts and sharded pub/sub of the tag, on every master: run and Get work"
	}
	fails := getFails
	problems := ck.runProbes(callTimeout, ck.coreTrials())
	if len(problems) == 0 {
		problems = ck.runProbes(libraryBudget, []trial{ck.libraryTrial()})
		var call *callFailed
		if len(problems) == 1 && errors.As(problems[0].err, &call) && call.fails != getFails {
			fails = call.fails + " (the trial stops at the first of the library's calls that fails)"
		}
	}
	r := verdict("core", what, fails, problems)
	if r.status == checkOK && !ck.tryLock() {
		r.status = checkWarn
		r.detail += fmt.Sprintf("; but not TryLock, which needs Redis 7.0 (SET with both NX and GET), and this is %s: not tried", ck.version)
	}
	return r
}

// tryLock reports whether TryLock can work on the server: it sends SET
// with both NX and GET, which Redis 6.2 refuses ("ERR syntax error") and
// Redis 6.0 does not know. Redis 7.0's release candidates say 6.9.240 to
// 6.9.242. A version that server could not read is tried.
func (ck *checker) tryLock() bool {
	var major, minor, patch int
	n, _ := fmt.Sscanf(ck.version, "%d.%d.%d", &major, &minor, &patch)
	return n == 0 || major >= 7 || major == 6 && minor == 9 && patch >= 240
}

// coreTrials are core's trials of the commands memolock sends, one by one
// (a test holds them to every command the library's scripts call); core
// then tries the library's calls themselves (see libraryTrial).
func (ck *checker) coreTrials() []trial {
	k := ck.keys
	id := ck.probeID
	rdb := ck.rdb
	var ps []trial
	if ck.cluster != nil {
		ps = append(ps,
			trial{what: "CLUSTER SLOTS", cmd: "+cluster|slots", try: func(ctx context.Context) error {
				// What go-redis sends to learn the slots.
				return ck.seed.Do(ctx, "CLUSTER", "SLOTS").Err()
			}},
			// go-redis asks COMMAND before it routes; refused, it asks
			// again before every command, and logs each time.
			trial{what: "COMMAND", cmd: "+command", try: func(ctx context.Context) error {
				return ck.seed.Do(ctx, "COMMAND").Err()
			}})
	}
	ps = append(ps,
		trial{"GET " + k.Value(id), "+get", ck.rule("~{T}:*"), "", func(ctx context.Context) error {
			return allowed(rdb.Get(ctx, k.Value(id)).Err(), "redis: nil")
		}},
		trial{"SET " + k.Value(id) + " PX 10000", "+set", ck.rule("~{T}:*"), "", func(ctx context.Context) error {
			err := rdb.Set(ctx, k.Value(id), "memolock check", 10*time.Second).Err()
			ck.canSet = err == nil
			return err
		}},
		trial{"SET " + k.Lock(id) + " NX PX 10000", "+set", ck.rule("~{T}/*"), "", func(ctx context.Context) error {
			return allowed(rdb.SetNX(ctx, k.Lock(id), ck.token, 10*time.Second).Err(), "redis: nil")
		}},
		trial{"PTTL " + k.Lock(id), "+pttl", ck.rule("~{T}/*"), "", func(ctx context.Context) error {
			return rdb.PTTL(ctx, k.Lock(id)).Err()
		}},
		trial{"PEXPIRE " + k.Lock(id), "+pexpire", ck.rule("~{T}/*"), "", func(ctx context.Context) error {
			return rdb.PExpire(ctx, k.Lock(id), 10*time.Second).Err()
		}},
		trial{"DEL " + k.Lock(id), "+del", ck.rule("~{T}/*"), "", func(ctx context.Context) error {
			return rdb.Del(ctx, k.Lock(id)).Err()
		}},
		trial{"EVAL", "+eval", "", "", func(ctx context.Context) error {
			return rdb.Eval(ctx, "return 1", nil).Err()
		}},
		trial{"EVALSHA", "+evalsha", "", "", func(ctx context.Context) error {
			return allowed(rdb.EvalSha(ctx, returnOne.Hash(), nil).Err(), "NOSCRIPT")
		}},
		// The subscriber PINGs to learn when a subscription is live, and
		// whether its connection is.
		trial{"PING", "+ping", "", "", func(ctx context.Context) error {
			return rdb.Ping(ctx).Err()
		}},
	)
	event := "check\n" + ck.token + "\n"
	if ck.cluster == nil {
		ps = append(ps,
			trial{"PUBLISH " + k.Events(id), "+publish", "", ck.rule("&{T}/*"), func(ctx context.Context) error {
				return rdb.Publish(ctx, k.Events(id), event).Err()
			}},
			trial{"SUBSCRIBE " + k.Notif(id), "+subscribe", "", ck.rule("&{T}/*"), func(ctx context.Context) error {
				return subscribeAndBack(ctx, rdb.Subscribe(ctx), false, k.Notif(id))
			}},
			trial{"UNSUBSCRIBE " + k.Notif(id), "+unsubscribe", "", ck.rule("&{T}/*"), func(ctx context.Context) error {
				return unsubscribeAfter(ctx, rdb.Subscribe(ctx), false, k.Notif(id))
			}},
		)
	} else {
		ps = append(ps,
			trial{"SPUBLISH " + k.Events(id), "+spublish", "", ck.rule("&{T}/*"), func(ctx context.Context) error {
				return ck.cluster.SPublish(ctx, k.Events(id), event).Err()
			}},
			trial{"SSUBSCRIBE " + k.Notif(id), "+ssubscribe", "", ck.rule("&{T}/*"), func(ctx context.Context) error {
				return subscribeAndBack(ctx, ck.cluster.SSubscribe(ctx), true, k.Notif(id))
			}},
			trial{"SUNSUBSCRIBE " + k.Notif(id), "+sunsubscribe", "", ck.rule("&{T}/*"), func(ctx context.Context) error {
				return unsubscribeAfter(ctx, ck.cluster.SSubscribe(ctx), true, k.Notif(id))
			}},
			trial{"the user on every master", "", "", "", func(ctx context.Context) error {
				var mu sync.Mutex
				var failed []string
				err := ck.cluster.ForEachMaster(ctx, func(ctx context.Context, n *redis.Client) error {
					if _, err := hello(ctx, n); err != nil {
						mu.Lock()
						failed = append(failed, fmt.Sprintf("%s: %v", n.Options().Addr, err))
						mu.Unlock()
					}
					return nil
				})
				if err != nil {
					return err
				}
				if len(failed) > 0 {
					sort.Strings(failed)
					return fmt.Errorf("%s (ACL users are per node: create the user on each)", strings.Join(failed, "; "))
				}
				return nil
			}},
		)
	}
	return ps
}

// subscribeAndBack subscribes ps to ch and waits for Redis to confirm, or
// refuse.
func subscribeAndBack(ctx context.Context, ps *redis.PubSub, sharded bool, ch string) error {
	defer ps.Close()
	var err error
	if sharded {
		err = ps.SSubscribe(ctx, ch)
	} else {
		err = ps.Subscribe(ctx, ch)
	}
	if err != nil {
		return err
	}
	_, err = ps.ReceiveTimeout(ctx, 2*time.Second)
	return err
}

// unsubscribeAfter subscribes ps to ch, then unsubscribes, and waits for
// Redis to confirm, or refuse, the second. A refused subscription is not
// this probe's to report.
func unsubscribeAfter(ctx context.Context, ps *redis.PubSub, sharded bool, ch string) error {
	defer ps.Close()
	sub, unsub := ps.Subscribe, ps.Unsubscribe
	if sharded {
		sub, unsub = ps.SSubscribe, ps.SUnsubscribe
	}
	if err := sub(ctx, ch); err != nil {
		return err
	}
	if _, err := ps.ReceiveTimeout(ctx, 2*time.Second); err != nil {
		return nil
	}
	if err := unsub(ctx, ch); err != nil {
		return err
	}
	_, err := ps.ReceiveTimeout(ctx, 2*time.Second)
	return err
}

// l1 tries what the L1 does, as the library does it: a connection of its
// own runs CLIENT ID and CLIENT TRACKING (redirected to itself, for the
// tag's prefix), then subscribes to __redis__:invalidate; then a write of
// the probe's value must arrive there as an invalidation.
func (ck *checker) l1() featureResult {
	if ck.single == nil {
		return featureResult{name: "l1", status: checkSkip, detail: "the L1 needs one server"}
	}
	o := *ck.single.Options()
	o.Protocol, o.PoolSize, o.MinIdleConns, o.MaxIdleConns = 2, 1, 0, 0
	var (
		mu               sync.Mutex
		idErr, trackErr  error
		connected        bool
		prefix           = ck.keys.Value("")
		invalidation     = "__redis__:invalidate"
		trackingRule     = "+client|tracking"
		trackingRequest  = "CLIENT TRACKING on REDIRECT <its id> BCAST PREFIX " + strconv.Quote(prefix)
		subscribeRequest = "SUBSCRIBE " + invalidation
	)
	o.OnConnect = func(ctx context.Context, cn *redis.Conn) error {
		id, err := cn.ClientID(ctx).Result()
		var terr error
		if err == nil {
			terr = cn.Do(ctx, "CLIENT", "TRACKING", "on", "REDIRECT", id, "BCAST", "PREFIX", prefix).Err()
		} else {
			// Without its id, tracking cannot be redirected here; ask
			// anyway, so that a refusal of its own shows too.
			if terr = cn.Do(ctx, "CLIENT", "TRACKING", "on", "BCAST", "PREFIX", prefix).Err(); terr == nil {
				_ = cn.Do(ctx, "CLIENT", "TRACKING", "off").Err()
			}
		}
		mu.Lock()
		idErr, trackErr, connected = err, terr, true
		mu.Unlock()
		return nil // as the library: the subscription goes on without tracking
	}
	tc := redis.NewClient(&o)
	defer tc.Close()
	ps := tc.Subscribe(context.Background())
	defer ps.Close()
	subErr := ck.call(func(ctx context.Context) error {
		if err := ps.Subscribe(ctx, invalidation); err != nil {
			return err
		}
		_, err := ps.ReceiveTimeout(ctx, 2*time.Second)
		return err
	})
	mu.Lock()
	defer mu.Unlock()
	var problems []problem
	if connected && idErr != nil {
		problems = append(problems, problem{what: "CLIENT ID", err: idErr, rule: refusedRule(idErr, trial{cmd: "+client|id"})})
	}
	if connected && trackErr != nil {
		p := problem{what: trackingRequest, err: trackErr, rule: refusedRule(trackErr, trial{cmd: trackingRule})}
		if p.rule == "" && strings.Contains(strings.ToLower(trackErr.Error()), "unknown") {
			p.err = fmt.Errorf("%w (CLIENT TRACKING needs Redis 6 or later)", trackErr)
		}
		problems = append(problems, p)
	}
	if subErr != nil {
		problems = append(problems, problem{what: subscribeRequest, err: subErr, rule: refusedRule(subErr, trial{cmd: "+subscribe", chans: "&" + invalidation})})
	}
	if len(problems) > 0 {
		return verdict("l1", "", "the L1 would stay empty, silently: every read goes to Redis", problems)
	}
	// The proof: a write of the tag's key comes back as an invalidation.
	if !ck.canSet {
		return featureResult{name: "l1", status: checkWarn, detail: "tracking is allowed; not tried end to end, as the user may not write the probe's key (see core)"}
	}
	key := ck.keys.Value(ck.probeID)
	err := ck.call(func(ctx context.Context) error {
		if err := ck.rdb.Set(ctx, key, "memolock check, again", 10*time.Second).Err(); err != nil {
			return err
		}
		for {
			m, err := ps.ReceiveTimeout(ctx, 2*time.Second)
			if err != nil {
				return fmt.Errorf("no invalidation of %s arrived: %w", show(key), err)
			}
			if msg, ok := m.(*redis.Message); ok && msg.Channel == invalidation && (slicesContain(msg.PayloadSlice, key) || msg.Payload == key) {
				return nil
			}
		}
	})
	if err != nil {
		return verdict("l1", "", "the L1 would serve values that changed", []problem{{what: "a write of " + show(key) + ", then its invalidation", err: err}})
	}
	return verdict("l1", "CLIENT TRACKING, and invalidations on __redis__:invalidate: the L1 fills", "", nil)
}

func slicesContain(ss []string, s string) bool {
	for _, x := range ss {
		if x == s {
			return true
		}
	}
	return false
}

// inspect tries what memolock inspect reads, read-only.
func (ck *checker) inspect() featureResult {
	k := ck.keys
	id := ck.probeID
	rdb := ck.rdb
	evalRO, evalshaRO := "+eval_ro", "+evalsha_ro"
	ps := []trial{
		{"EVAL_RO", evalRO, "", "", func(ctx context.Context) error {
			err := rdb.EvalRO(ctx, "return 1", nil).Err()
			if err != nil && strings.Contains(strings.ToLower(err.Error()), "unknown command") {
				// Before Redis 7, inspect falls back to EVAL.
				return rdb.Eval(ctx, "return 1", nil).Err()
			}
			return err
		}},
		{"EVALSHA_RO", evalshaRO, "", "", func(ctx context.Context) error {
			err := allowed(rdb.EvalShaRO(ctx, returnOne.Hash(), nil).Err(), "NOSCRIPT")
			if err != nil && strings.Contains(strings.ToLower(err.Error()), "unknown command") {
				return allowed(rdb.EvalSha(ctx, returnOne.Hash(), nil).Err(), "NOSCRIPT")
			}
			return err
		}},
		{"STRLEN " + k.Value(id), "+strlen", ck.rule("%R~{T}:*"), "", func(ctx context.Context) error {
			return rdb.StrLen(ctx, k.Value(id)).Err()
		}},
		{"GET " + k.Lock(id), "+get", ck.rule("%R~{T}/*"), "", func(ctx context.Context) error {
			return allowed(rdb.Get(ctx, k.Lock(id)).Err(), "redis: nil")
		}},
		{"PTTL " + k.Lock(id), "+pttl", ck.rule("%R~{T}/*"), "", func(ctx context.Context) error {
			return rdb.PTTL(ctx, k.Lock(id)).Err()
		}},
	}
	if ck.cluster == nil {
		ps = append(ps, trial{"PUBSUB NUMSUB " + k.Notif(id), "+pubsub|numsub", "", "", func(ctx context.Context) error {
			return rdb.PubSubNumSub(ctx, k.Notif(id)).Err()
		}})
	} else {
		ps = append(ps, trial{"PUBSUB SHARDNUMSUB " + k.Notif(id), "+pubsub|shardnumsub", "", "", func(ctx context.Context) error {
			node, err := ck.cluster.MasterForKey(ctx, k.Notif(id))
			if err != nil {
				return err
			}
			return node.PubSubShardNumSub(ctx, k.Notif(id)).Err()
		}})
	}
	return verdict("inspect", "reads what Redis holds for an id: memolock inspect works", "memolock inspect will fail", ck.runProbes(callTimeout, ps))
}

// watch tries what memolock watch subscribes to and reads, read-only, and
// whether the keyspace events it needs for takeovers are on.
func (ck *checker) watch() featureResult {
	k := ck.keys
	id := ck.probeID
	rdb := ck.rdb
	esc := globEscape(ck.tag)
	space := fmt.Sprintf("__keyspace@%d__:", ck.db)
	ps := []trial{{"PING", "+ping", "", "", func(ctx context.Context) error { return rdb.Ping(ctx).Err() }}}
	if ck.cluster == nil {
		for _, pattern := range []string{esc + "/notif:*", esc + "/lock-event:*", space + esc + "/lock:*"} {
			ps = append(ps, trial{"PSUBSCRIBE " + pattern, "+psubscribe", "", "&" + pattern, func(ctx context.Context) error {
				p := rdb.Subscribe(ctx)
				defer p.Close()
				if err := p.PSubscribe(ctx, pattern); err != nil {
					return err
				}
				_, err := p.ReceiveTimeout(ctx, 2*time.Second)
				return err
			}})
		}
		ps = append(ps, trial{"SUBSCRIBE " + k.Notif(id) + " (--id)", "+subscribe", "", ck.rule("&{T}/notif:*"), func(ctx context.Context) error {
			return subscribeAndBack(ctx, rdb.Subscribe(ctx), false, k.Notif(id))
		}})
	} else {
		ps = append(ps, trial{"SSUBSCRIBE " + k.Notif(id) + " (--id)", "+ssubscribe", "", ck.rule("&{T}/notif:*"), func(ctx context.Context) error {
			return subscribeAndBack(ctx, ck.cluster.SSubscribe(ctx), true, k.Notif(id))
		}})
	}
	ps = append(ps,
		trial{"MULTI, GET and PTTL " + k.Lock(id) + ", EXEC", "+multi", ck.rule("%R~{T}/*"), "", ck.transaction},
		trial{"GET " + k.Lock(id), "+get", ck.rule("%R~{T}/*"), "", func(ctx context.Context) error {
			return allowed(rdb.Get(ctx, k.Lock(id)).Err(), "redis: nil")
		}},
		trial{"PTTL " + k.Lock(id), "+pttl", ck.rule("%R~{T}/*"), "", func(ctx context.Context) error {
			return rdb.PTTL(ctx, k.Lock(id)).Err()
		}},
	)
	r := verdict("watch", "subscribes and reads locks: memolock watch works", "memolock watch will fail, or not tell takeovers", ck.runProbes(callTimeout, ps))
	if r.status != checkOK {
		return r
	}
	// Takeovers need keyspace events, a setting of the server's.
	var flags map[string]string
	err := ck.call(func(ctx context.Context) error {
		var err error
		if ck.cluster != nil {
			flags, err = ck.seed.ConfigGet(ctx, "notify-keyspace-events").Result()
		} else {
			flags, err = ck.single.ConfigGet(ctx, "notify-keyspace-events").Result()
		}
		return err
	})
	switch {
	case err != nil:
		r.status = checkWarn
		r.detail += fmt.Sprintf("; whether notify-keyspace-events has K, $ and x (for takeovers) cannot be told: CONFIG GET: %v (granting +config|get would let the user read requirepass too: ask an administrator instead)", err)
	case missingFlags(flags["notify-keyspace-events"], "K$x") != "":
		f := flags["notify-keyspace-events"]
		r.status = checkWarn
		r.detail += fmt.Sprintf("; but notify-keyspace-events is %q, so it will not show takeovers: an administrator can run CONFIG SET notify-keyspace-events '%s'", f, f+missingFlags(f, "K$x"))
		if ck.cluster != nil {
			r.detail += " on every node"
		}
	default:
		r.detail += "; notify-keyspace-events has K, $ and x: takeovers show"
	}
	return r
}

// transaction reads the probe's lock in a transaction, as watch does, and
// returns the first refusal: of MULTI or EXEC themselves, or of a command
// queued between them.
func (ck *checker) transaction(ctx context.Context) error {
	var cmds []redis.Cmder
	_, err := ck.rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
		cmds = []redis.Cmder{p.Get(ctx, ck.keys.Lock(ck.probeID)), p.PTTL(ctx, ck.keys.Lock(ck.probeID))}
		return nil
	})
	for _, c := range cmds {
		if e := c.Err(); e != nil && strings.Contains(e.Error(), "NOPERM") {
			return e
		}
	}
	return allowed(err, "redis: nil")
}

// cleanUp deletes the probe's keys, if the user may; they expire anyway.
// The library's calls write the value and the lock, and TryLock a key of
// its own. A call that did not return in time may still write one: cleanUp
// first waits for such calls to return (their contexts are cancelled, so
// they do soon), for callTimeout at most.
func (ck *checker) cleanUp() {
	wait := time.NewTimer(callTimeout)
	defer wait.Stop()
waiting:
	for _, done := range ck.late {
		select {
		case <-done:
		case <-wait.C:
			break waiting
		}
	}
	_ = ck.call(func(ctx context.Context) error {
		for _, key := range []string{ck.keys.Value(ck.probeID), ck.keys.Lock(ck.probeID), wire.NewKeys(ck.tag).Mutex(ck.id)} {
			_ = ck.rdb.Del(ctx, key).Err()
		}
		return nil
	})
}
