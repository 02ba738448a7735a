package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/memolock/memolock"
)

const (
	// maxWatchIDs bounds --id: on a cluster each id costs a connection.
	maxWatchIDs = 100
	// maxLocks bounds the locks whose kind watch remembers.
	maxLocks = 50000
	// lookupWorkers read locks (and values' sizes) for the feed, from a
	// queue of lookupQueue reads; when it is full, the feed reads nothing.
	lookupWorkers = 4
	lookupQueue   = 1024
	// outQueue and errQueue are the lines that may wait for stdout and
	// stderr; flushWait is how long watch waits, when it stops, for them
	// to be written.
	outQueue  = 4096
	errQueue  = 256
	flushWait = 500 * time.Millisecond
	// probeEvery is how often each subscription connection is pinged, and
	// silentAfter how long it may stay silent before watch says so.
	probeEvery  = 5 * time.Second
	silentAfter = 15 * time.Second
	stampLayout = "2006-01-02T15:04:05.000000Z07:00"
)

// watcher prints the traffic of one tag. Its fields are set up by watch
// and then belong to the goroutine in run (the feed); the readers of the
// subscriptions hand it what they receive, and the lookup workers what
// they read.
type watcher struct {
	rdb     redis.UniversalClient
	keys    memolock.KeyScheme
	cluster bool
	ids     map[string]string // wire id -> id as given; nil: every id
	out     *lineQueue        // stdout
	errs    *lineQueue        // stderr
	locks   *lockBook
	url     string      // the --redis URL, for hints; never printed as it is
	lookups chan lookup // to the workers; the feed never waits to send
	answers chan answer // from the workers
}

// source is one subscription connection, read by its own goroutine.
type source struct {
	ps    *redis.PubSub
	node  *redis.Client // the node of a keyspace subscription; nil for a sharded one
	where string        // the node, or the id of a sharded subscription
	acks  int           // acknowledgements that confirm the subscription
	heard atomic.Int64  // when anything last came, in Unix nanoseconds
}

// item is what a source's reader hands the feed.
type item struct {
	src          *source
	msg          *redis.Message
	at           time.Time // when msg came
	note         string    // for stderr
	ready        bool      // the subscription is confirmed
	resubscribed bool      // go-redis subscribed again on a new connection
	err          error     // the subscription was refused
}

// lookup asks a worker to read the lock of wire after a keyspace "set"
// event: of the lock (gen is then the lock's generation in the lockBook),
// or of the value (its size is read too).
type lookup struct {
	wire  string
	gen   uint64
	value bool
}

// answer is what a worker read for a lookup.
type answer struct {
	lookup
	lock reading
	size int64 // the value's, for a value lookup
	err  error
}

var watchCommand = command{
	name:    "watch",
	summary: "print a tag's traffic as it happens: values, failures, takeovers",
	usage: []string{
		"watch --tag T [--id ID ...] [--redis URL [--cluster]] [--hash-ids]",
		"watch --tag T [--id-hex HEX ...] [--id-base64 B64 ...] [flags]",
	},
	about: `Prints one line per event on stdout, "<time> <kind> id=<id> ...", until SIGINT or SIGTERM: value (published, with its size, never its bytes), fail (the holder's token and message), abandon (the holder gave its lock up: waiters look again), notfound, stale; and the ends of locks: takeover (a holder's lock expired: it is gone without a value), refetch (a stale value's time is up), expired (watch did not see what the lock held). Notices go to stderr.

Nobody publishes the end of a lock: watch learns it from keyspace events, which need notify-keyspace-events with K, $ and x. When they are off, watch says so on stderr with the CONFIG SET to run; it never runs it. With --id, --id-hex or --id-base64 (each repeatable, 100 ids at most) it watches those ids only. On a cluster, values and events travel on sharded channels, which no pattern matches: pass the ids to see them. A reader that stops reading never holds watch up: lines that do not fit in its queue are dropped, and counted on stderr.`,
	flags: []string{"tag", "id", "id-hex", "id-base64", "hash-ids", "redis", "cluster"},
	env:   true,
	exits: [][2]string{
		{"0", "stopped by SIGINT or SIGTERM"},
		{"1", "Redis could not be reached, or refused the subscription, at the start"},
		{"2", "bad usage"},
	},
	example: [][2]string{
		{"Everything that happens to the reports.", "memolock watch --tag reports"},
		{"Two ids only.", "memolock watch --tag reports --id 2026-11 --id 2026-12"},
	},
}

func watch(args []string, stdout, stderr io.Writer) int {
	c := &watchCommand
	fs := flag.NewFlagSet("watch", flag.ContinueOnError)
	redisURL := fs.String("redis", "", redisUsage)
	cluster := fs.Bool("cluster", false, clusterUsage)
	tag := fs.String("tag", "", "the keys' `TAG` (required)")
	var idArgs idFlags
	idArgs.define(fs, "; repeatable: watch only the ids given (on a cluster, needed to see values and events)")
	hashIDs := fs.Bool("hash-ids", false, "hash the ids, as clients with Options.HashIDs do")
	if code, ok := parse(c, fs, args, stdout, stderr); !ok {
		return code
	}
	ids, err := idArgs.all()
	switch {
	case err != nil:
		return usageError(c, stderr, "%v", err)
	case *tag == "":
		return usageError(c, stderr, "--tag is required")
	case fs.NArg() > 0:
		return usageError(c, stderr, "unexpected argument %q; give ids with --id (--cluster takes no value)", redactArg(fs.Arg(0)))
	}
	keys, err := memolock.NewKeyScheme(*tag)
	if err != nil {
		return usageError(c, stderr, "%s", libError(err))
	}
	if *cluster && strings.ContainsAny(*tag, "{}") {
		return usageError(c, stderr, "tag %q contains a brace; on a cluster the id's braces must be the first in every key", *tag)
	}
	w := &watcher{keys: keys, cluster: *cluster, locks: newLockBook(maxLocks),
		lookups: make(chan lookup, lookupQueue), answers: make(chan answer)}
	if len(ids) > 0 {
		w.ids = map[string]string{}
	}
	for _, id := range ids {
		wire := id
		if *hashIDs {
			wire = memolock.HashID(id)
		}
		if *cluster {
			var ok bool
			if wire, ok = memolock.PlaceID(wire); !ok {
				return usageError(c, stderr, "--id %s cannot be placed in a cluster slot (it is empty or starts with \"}\"); the clients must use HashIDs for it (then pass --hash-ids)", show(id))
			}
		}
		w.ids[wire] = id
	}
	if len(w.ids) > maxWatchIDs {
		return usageError(c, stderr, "%d ids given; watch at most %d at a time, or none to watch them all", len(w.ids), maxWatchIDs)
	}
	url := redisURLOrDefault(*redisURL)
	w.rdb, err = openRedis(url, *cluster)
	if err != nil {
		return usageError(c, stderr, "--redis %v", err)
	}
	defer w.rdb.Close()

	// From here on nothing writes to stdout or stderr but the queues, so
	// that a reader who stops reading cannot keep a signal from ending
	// watch.
	w.out, w.errs = newLineQueue(stdout, outQueue), newLineQueue(stderr, errQueue)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	w.url = url
	code := w.run(ctx, redact(url))
	if lost := w.out.close(time.Now().Add(flushWait)); lost > 0 {
		w.errf("%d lines of the feed were not written: its output was not read fast enough", lost)
	}
	w.errs.close(time.Now().Add(flushWait))
	return code
}

// run checks the server, subscribes, and prints the feed until ctx ends.
func (w *watcher) run(ctx context.Context, where string) int {
	setup, cancelSetup := context.WithTimeout(ctx, callTimeout)
	defer cancelSetup()
	nodes, err := w.nodes(setup)
	if ctx.Err() != nil {
		return 0
	}
	if err != nil {
		w.errf("%v (redis %s)%s", err, where, redisHint(err, w.url)+timedOut(err))
		return exitFailure
	}
	if !w.cluster {
		w.clusterHint(setup, nodes[0])
	}
	w.checkKeyspaceEvents(setup, nodes)
	if w.cluster && w.ids == nil {
		w.errf(`on a cluster, values and holder events (fail, abandon, notfound, stale) travel on sharded channels, which no pattern can match: this feed shows values stored (or stale values put back), "not found" cached and lock expiries from keyspace events; pass --id to see everything about given ids`)
	}

	// The readers, probes, workers and checks end with rctx; each reader's
	// PubSub is closed to unblock it.
	rctx, cancel := context.WithCancel(ctx)
	var (
		sources []*source
		wg      sync.WaitGroup
	)
	defer func() {
		cancel()
		for _, s := range sources {
			_ = s.ps.Close()
		}
		wg.Wait()
	}()
	sources, err = w.subscribe(setup, nodes)
	if ctx.Err() != nil {
		return 0
	}
	if err != nil {
		w.errf("subscribing: %v (redis %s)%s", err, where, redisHint(err, w.url)+timedOut(err))
		return exitFailure
	}
	items := make(chan item)
	for _, s := range sources {
		s.heard.Store(time.Now().UnixNano())
		wg.Add(2)
		go func() {
			defer wg.Done()
			read(rctx, s, items)
		}()
		go func() {
			defer wg.Done()
			probe(rctx, s, items)
		}()
	}
	for range lookupWorkers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			w.lookupLoop(rctx)
		}()
	}

	confirmed, deadline := map[*source]bool{}, setup.Done()
	for {
		select {
		case <-ctx.Done():
			return 0
		case <-deadline:
			if ctx.Err() != nil {
				return 0
			}
			var late []string
			for _, s := range sources {
				if !confirmed[s] {
					late = append(late, s.where)
				}
			}
			w.errf("no subscription confirmed within %v by %s (redis %s)", callTimeout, strings.Join(late, ", "), where)
			return exitFailure
		case a := <-w.answers:
			w.answered(a)
		case it := <-items:
			switch {
			case it.err != nil:
				w.errf("%s refused the subscription: %v (redis %s)%s", it.src.where, it.err, where, redisHint(it.err, w.url))
				return exitFailure
			case it.ready:
				if confirmed[it.src] = true; len(confirmed) == len(sources) {
					deadline = nil
					w.errf("watching tag %s on %s; Ctrl-C stops", show(w.keys.Tag()), where)
				}
			case it.resubscribed:
				w.errf("%s", it.note)
				// Keyspace events may have been missed, and a server
				// that restarted may have them off.
				for _, wire := range w.locks.reset() {
					w.expiry(wire, lockUnknown)
				}
				if node := it.src.node; node != nil {
					wg.Add(1)
					go func() {
						defer wg.Done()
						check, cancel := context.WithTimeout(rctx, callTimeout)
						defer cancel()
						w.checkKeyspaceEvents(check, []*redis.Client{node})
					}()
				}
			case it.note != "":
				w.errf("%s", it.note)
			default:
				w.report(it.msg, it.at)
			}
		}
	}
}

// nodes returns the clients to subscribe with: the server, or every
// master of the cluster.
func (w *watcher) nodes(ctx context.Context) ([]*redis.Client, error) {
	var (
		mu    sync.Mutex
		nodes []*redis.Client
	)
	err := within(ctx, func(ctx context.Context) error {
		cc, ok := w.rdb.(*redis.ClusterClient)
		if !ok {
			c := w.rdb.(*redis.Client)
			nodes = []*redis.Client{c}
			return c.Ping(ctx).Err()
		}
		return cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error {
			mu.Lock()
			defer mu.Unlock()
			nodes = append(nodes, c)
			return nil
		})
	})
	if err != nil {
		return nil, err
	}
	mu.Lock()
	defer mu.Unlock()
	sort.Slice(nodes, func(i, j int) bool { return nodes[i].Options().Addr < nodes[j].Options().Addr })
	return nodes, nil
}

// clusterHint says on stderr if node, given without --cluster, is a
// cluster node: the clients of a cluster spread keys over every master and
// publish on sharded channels, which this feed would not see.
func (w *watcher) clusterHint(ctx context.Context, node *redis.Client) {
	var info string
	err := within(ctx, func(ctx context.Context) error {
		var err error
		info, err = node.Info(ctx, "cluster").Result()
		return err
	})
	if err == nil && strings.Contains(info, "cluster_enabled:1") {
		w.errf("%s is a Redis Cluster node: pass --cluster (the clients of a cluster spread keys over every master, and publish on sharded channels, which this feed does not see without it)", node.Options().Addr)
	}
}

// checkKeyspaceEvents says on stderr what the feed cannot show because
// the nodes' notify-keyspace-events lack what it needs, and the CONFIG SET
// that would turn them on (keeping the flags already set). It never
// changes them. watch checks at the start and after every reconnect.
func (w *watcher) checkKeyspaceEvents(ctx context.Context, nodes []*redis.Client) {
	// Locks set ($) and expired (x): what a lock held, and when it ends.
	// On a cluster without --id, values set ($) too.
	const need = "K$x"
	var (
		refused []string
		reason  error
		lacking = map[string][]string{} // flags to set -> nodes
		missing string                  // what any node lacks
		current string                  // a lacking node's flags
	)
	for _, n := range nodes {
		var flags map[string]string
		err := within(ctx, func(ctx context.Context) error {
			var err error
			flags, err = n.ConfigGet(ctx, "notify-keyspace-events").Result()
			return err
		})
		f, ok := flags["notify-keyspace-events"]
		if err == nil && !ok {
			err = errors.New("no such setting")
		}
		if err != nil {
			refused, reason = append(refused, n.Options().Addr), err
			continue
		}
		if m := missingFlags(f, need); m != "" {
			lacking[f+m] = append(lacking[f+m], n.Options().Addr)
			missing += missingFlags(missing, m)
			current = f
		}
	}
	if len(refused) > 0 {
		w.errf("could not check notify-keyspace-events on %s (%v): takeovers show only if it has the flags K, $ and x",
			strings.Join(refused, ", "), reason)
	}
	if len(lacking) == 0 {
		return
	}
	var lost []string
	if strings.ContainsAny(missing, "K$x") {
		lost = append(lost, "takeovers (locks that expire)")
	}
	if strings.ContainsAny(missing, "K$") && w.cluster && w.ids == nil {
		lost = append(lost, `values stored and "not found" cached`)
	}
	var sets []string
	for flags, addrs := range lacking {
		if strings.Contains(flags, "$") {
			flags = "'" + flags + "'" // as a shell would need it
		}
		set := "CONFIG SET notify-keyspace-events " + flags
		if w.cluster {
			set += " on " + strings.Join(addrs, ", ")
		}
		sets = append(sets, set)
	}
	sort.Strings(sets)
	what := fmt.Sprintf("notify-keyspace-events is %q", current)
	if w.cluster {
		what = "notify-keyspace-events lacks " + missing
	}
	w.errf("the keyspace events this feed needs are off (%s), so %s will not be shown; an operator can turn them on with: %s",
		what, strings.Join(lost, " and "), strings.Join(sets, "; "))
}

// missingFlags returns the letters of need that the notify-keyspace-events
// flags lack ("A" stands for every class of event, not for K or E).
func missingFlags(flags, need string) string {
	var miss strings.Builder
	for _, c := range need {
		if strings.ContainsRune(flags, c) || c != 'K' && c != 'E' && strings.ContainsRune(flags, 'A') {
			continue
		}
		miss.WriteRune(c)
	}
	return miss.String()
}

// subscribe opens the feed's subscriptions. On one server: the value and
// event channels and the locks' keyspace channels, by pattern or, with
// ids, by name. On a cluster: with ids, each id's sharded channels on the
// master of its slot; and on every master, the keyspace events of locks
// (and, without ids, of values and "not found" markers).
func (w *watcher) subscribe(ctx context.Context, nodes []*redis.Client) ([]*source, error) {
	// Each source with what it subscribes to; no I/O yet.
	var (
		sources []*source
		subs    []func(context.Context) error
	)
	esc := globEscape(w.keys.Tag())
	if !w.cluster {
		n := nodes[0]
		space := fmt.Sprintf("__keyspace@%d__:", n.Options().DB)
		s := &source{ps: n.Subscribe(ctx), node: n, where: n.Options().Addr}
		if w.ids == nil {
			patterns := []string{esc + "/notif:*", esc + "/lock-event:*", space + esc + "/lock:*"}
			s.acks = len(patterns)
			subs = append(subs, func(ctx context.Context) error { return s.ps.PSubscribe(ctx, patterns...) })
		} else {
			var channels []string
			for _, wire := range w.sortedIDs() {
				channels = append(channels, w.keys.Notif(wire), w.keys.Events(wire), space+w.keys.Lock(wire))
			}
			s.acks = len(channels)
			subs = append(subs, func(ctx context.Context) error { return s.ps.Subscribe(ctx, channels...) })
		}
		sources = append(sources, s)
	} else {
		cc := w.rdb.(*redis.ClusterClient)
		for _, wire := range w.sortedIDs() {
			// One SSUBSCRIBE carries the channels of one slot only.
			notif, events := w.keys.Notif(wire), w.keys.Events(wire)
			s := &source{ps: cc.SSubscribe(ctx), where: "the master of " + show(notif), acks: 2}
			sources = append(sources, s)
			subs = append(subs, func(ctx context.Context) error { return s.ps.SSubscribe(ctx, notif, events) })
		}
		patterns := []string{"__keyspace@0__:" + esc + "/lock:*"}
		if w.ids == nil {
			patterns = append(patterns, "__keyspace@0__:"+esc+":*", "__keyspace@0__:"+esc+"/lock-notfound:*")
		}
		for _, n := range nodes {
			s := &source{ps: n.Subscribe(ctx), node: n, where: n.Options().Addr, acks: len(patterns)}
			sources = append(sources, s)
			subs = append(subs, func(ctx context.Context) error { return s.ps.PSubscribe(ctx, patterns...) })
		}
	}
	err := within(ctx, func(ctx context.Context) error {
		for i, sub := range subs {
			if err := sub(ctx); err != nil {
				return fmt.Errorf("%s: %w", sources[i].where, err)
			}
		}
		return nil
	})
	return sources, err
}

func (w *watcher) sortedIDs() []string {
	var wires []string
	for wire := range w.ids {
		wires = append(wires, wire)
	}
	sort.Strings(wires)
	return wires
}

// read hands what s receives to the feed, until ctx ends. go-redis
// reconnects and subscribes again by itself; read says so, and waits a
// second between failures.
func read(ctx context.Context, s *source, items chan<- item) {
	send := func(it item) bool {
		it.src = s
		select {
		case items <- it:
			return true
		case <-ctx.Done():
			return false
		}
	}
	acks, lost := 0, false
	for {
		m, err := s.ps.Receive(ctx)
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			var rerr redis.Error
			if acks < s.acks && errors.As(err, &rerr) {
				send(item{err: err})
				return
			}
			if !lost {
				lost = true
				if !send(item{note: fmt.Sprintf("lost the connection to %s (%v); retrying, and whatever is published meanwhile is missed", s.where, err)}) {
					return
				}
			}
			select {
			case <-time.After(time.Second):
			case <-ctx.Done():
				return
			}
			continue
		}
		s.heard.Store(time.Now().UnixNano())
		switch m := m.(type) {
		case *redis.Subscription:
			if strings.HasSuffix(m.Kind, "unsubscribe") {
				// Unasked for: Redis dropped a sharded channel whose slot
				// moved.
				if !send(item{note: fmt.Sprintf("Redis ended the subscription to %s (its slot moved?); restart watch to follow it", show(m.Channel))}) {
					return
				}
				continue
			}
			acks++
			switch {
			case acks == s.acks:
				if !send(item{ready: true}) {
					return
				}
			case acks > s.acks && m.Count == 1:
				// go-redis subscribed again on a new connection, perhaps
				// without an error in sight.
				lost = false
				if !send(item{resubscribed: true, note: fmt.Sprintf("subscribed again on %s; whatever was published in the gap was missed", s.where)}) {
					return
				}
			}
		case *redis.Message:
			if !send(item{msg: m, at: time.Now()}) {
				return
			}
		}
	}
}

// probe pings s every probeEvery, so that a dead connection fails (and
// go-redis dials again), and says when s has been silent for silentAfter:
// a connection can die without an error.
func probe(ctx context.Context, s *source, items chan<- item) {
	tick := time.NewTicker(probeEvery)
	defer tick.Stop()
	silent := false
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		_ = s.ps.Ping(ctx, "memolock-watch")
		quiet := time.Since(time.Unix(0, s.heard.Load())) > silentAfter
		var note string
		switch {
		case quiet && !silent:
			note = fmt.Sprintf("no reply from %s for %v; the feed may be stalled", s.where, silentAfter)
		case !quiet && silent:
			note = fmt.Sprintf("%s answers again", s.where)
		default:
			continue
		}
		silent = quiet
		select {
		case items <- item{src: s, note: note}:
		case <-ctx.Done():
			return
		}
	}
}

// report prints one message of the feed, which came at.
func (w *watcher) report(m *redis.Message, at time.Time) {
	if key, ok := keyspaceKey(m.Channel); ok {
		w.keyspace(key, m.Payload, at)
		return
	}
	if wire, ok := strings.CutPrefix(m.Channel, w.keys.Notif("")); ok && w.wanted(wire) {
		w.line("value", wire, fmt.Sprintf("size=%d published", len(m.Payload)))
		return
	}
	wire, ok := strings.CutPrefix(m.Channel, w.keys.Events(""))
	if !ok || !w.wanted(wire) {
		return
	}
	kind, token, msg := parseEvent(m.Payload)
	holder := "holder=" + show(token)
	switch kind {
	case "fail":
		w.line("fail", wire, holder+" message="+strconv.Quote(msg))
	case "abandon":
		w.line("abandon", wire, holder+": the lock is gone (given up or found lost); waiters look again")
	case "notfound":
		w.line("notfound", wire, holder+": fetch found nothing")
	case "stale":
		w.line("stale", wire, holder+": fetch failed; a stale value is served")
	default:
		w.line("event", wire, "kind="+show(kind)+" "+holder)
	}
}

// keyspace handles a keyspace event of key, which came at.
func (w *watcher) keyspace(key, event string, at time.Time) {
	if wire, ok := strings.CutPrefix(key, w.keys.Lock("")); ok {
		if !w.wanted(wire) {
			return
		}
		switch event {
		case "set":
			gen, undecided := w.locks.set(wire)
			if undecided {
				w.expiry(wire, lockUnknown)
			}
			if !w.ask(lookup{wire: wire, gen: gen}) {
				w.answered(answer{lookup: lookup{wire: wire, gen: gen}})
			}
		case "del":
			w.locks.forget(wire)
		case "expired":
			if kind, ok := w.locks.expire(wire, at); ok {
				w.expiry(wire, kind)
			}
		}
		return
	}
	if wire, ok := strings.CutPrefix(key, w.keys.NotFound("")); ok {
		if event == "set" && w.wanted(wire) {
			w.line("notfound", wire, `cached: lookups answer "not found" without fetching`)
		}
		return
	}
	if wire, ok := strings.CutPrefix(key, w.keys.Value("")); ok && event == "set" && w.wanted(wire) {
		if l := (lookup{wire: wire, value: true}); !w.ask(l) {
			w.answered(answer{lookup: l, err: errors.New("too busy to read it")})
		}
	}
}

// ask queues l for a worker, unless the queue is full.
func (w *watcher) ask(l lookup) bool {
	select {
	case w.lookups <- l:
		return true
	default:
		return false
	}
}

// answered prints what a lookup found: a value set, stored or put back
// stale; or the expiry of a lock that waited for the read.
func (w *watcher) answered(a answer) {
	if !a.value {
		if kind, ok := w.locks.answer(a.wire, a.gen, a.lock); ok {
			w.expiry(a.wire, kind)
		}
		return
	}
	switch {
	case a.err != nil:
		w.line("set", a.wire, fmt.Sprintf("a value was set; watch could not read whether it is stored or a stale one put back (%v)", a.err))
	case a.lock.kind == lockStale:
		// The resurrect script sets the value, then the lock; both are
		// there when the read comes.
		w.line("stale", a.wire, fmt.Sprintf("size=%d: a stale value put back after a failed fetch, served until its lock expires", a.size))
	default:
		w.line("stored", a.wire, fmt.Sprintf("size=%d", a.size))
	}
}

// expiry prints the end of the lock of wire, which held kind.
func (w *watcher) expiry(wire string, kind lockKind) {
	switch kind {
	case lockHeld:
		w.line("takeover", wire, "lock expired: holder gone, next caller takes over")
	case lockStale:
		w.line("refetch", wire, "the stale value's time is up: the next caller fetches again")
	case lockUnknown:
		w.line("expired", wire, "lock expired; watch did not read what it held (set before watch started, or gone when read), so it cannot tell a takeover")
	}
}

// lookupLoop reads what the feed asks, until ctx ends.
func (w *watcher) lookupLoop(ctx context.Context) {
	for {
		var l lookup
		select {
		case <-ctx.Done():
			return
		case l = <-w.lookups:
		}
		a := w.look(ctx, l)
		select {
		case w.answers <- a:
		case <-ctx.Done():
			return
		}
	}
}

// look reads the lock of l.wire, with its PTTL, and the value's size for
// a value lookup, in one transaction.
func (w *watcher) look(ctx context.Context, l lookup) answer {
	a := answer{lookup: l, lock: reading{sent: time.Now(), pttl: -1}}
	// Filled by the call, and read only if it returned in time.
	var got answer
	a.err = w.call(ctx, func(ctx context.Context) error {
		var (
			size *redis.IntCmd
			get  *redis.StringCmd
			pttl *redis.DurationCmd
		)
		_, err := w.rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
			if l.value {
				size = p.StrLen(ctx, w.keys.Value(l.wire))
			}
			get, pttl = p.Get(ctx, w.keys.Lock(l.wire)), p.PTTL(ctx, w.keys.Lock(l.wire))
			return nil
		})
		if err != nil && !errors.Is(err, redis.Nil) {
			return err
		}
		if size != nil {
			got.size = size.Val()
		}
		if get.Err() == nil { // else no lock: its kind stays unknown
			got.lock = reading{kind: kindOf(get.Val()), pttl: pttl.Val()}
		}
		return nil
	})
	if a.err == nil {
		a.size = got.size
		if got.lock.kind != lockUnknown {
			a.lock.kind, a.lock.pttl = got.lock.kind, got.lock.pttl
		}
	}
	return a
}

// call runs one command of the feed, bounded to a second.
func (w *watcher) call(ctx context.Context, fn func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	return within(ctx, fn)
}

// wanted reports whether the feed shows wire: one of --id, or any id
// (placed in braces, on a cluster: other keys that match the patterns
// belong to nested tags).
func (w *watcher) wanted(wire string) bool {
	if w.ids != nil {
		_, ok := w.ids[wire]
		return ok
	}
	return !w.cluster || len(wire) >= 2 && wire[0] == '{' && wire[len(wire)-1] == '}'
}

// line prints one line of the feed: time, kind, id, and the rest.
func (w *watcher) line(kind, wire, rest string) {
	id, ok := w.ids[wire]
	if !ok {
		id = wire
		if w.cluster {
			id = wire[1 : len(wire)-1]
		}
	}
	w.out.print(fmt.Sprintf("%s %-8s id=%s %s\n", time.Now().Format(stampLayout), kind, show(id), rest))
}

// errf prints a line on stderr.
func (w *watcher) errf(format string, args ...any) {
	w.errs.print("memolock watch: " + fmt.Sprintf(format, args...) + "\n")
}

// lineQueue writes lines to w from its own goroutine, so that a reader
// who stops reading blocks neither the feed nor the end of watch on a
// signal: the lines that do not fit in the queue are dropped.
type lineQueue struct {
	lines   chan string
	printed atomic.Int64 // lines handed to print
	written atomic.Int64 // lines written
	done    chan struct{}
}

func newLineQueue(w io.Writer, size int) *lineQueue {
	q := &lineQueue{lines: make(chan string, size), done: make(chan struct{})}
	go func() {
		defer close(q.done)
		for line := range q.lines {
			if _, err := io.WriteString(w, line); err == nil {
				q.written.Add(1)
			}
		}
	}()
	return q
}

// print queues line, or drops it if the queue is full. Not after close.
func (q *lineQueue) print(line string) {
	q.printed.Add(1)
	select {
	case q.lines <- line:
	default:
	}
}

// close waits until the queued lines are written or deadline passes, and
// returns how many lines were not written.
func (q *lineQueue) close(deadline time.Time) int64 {
	close(q.lines)
	t := time.NewTimer(time.Until(deadline))
	defer t.Stop()
	select {
	case <-q.done:
	case <-t.C:
	}
	return q.printed.Load() - q.written.Load()
}

// keyspaceKey returns the key of a keyspace notification's channel,
// __keyspace@<db>__:<key>.
func keyspaceKey(channel string) (string, bool) {
	rest, ok := strings.CutPrefix(channel, "__keyspace@")
	if !ok {
		return "", false
	}
	_, key, ok := strings.Cut(rest, "__:")
	return key, ok
}

// parseEvent splits an event at its first two newlines: kind, token and
// message. The message is cut to its first line and 4096 bytes, as
// holders send it.
func parseEvent(payload string) (kind, token, msg string) {
	kind, rest, _ := strings.Cut(payload, "\n")
	token, msg, _ = strings.Cut(rest, "\n")
	msg, _, _ = strings.Cut(msg, "\n")
	if len(msg) > 4096 {
		msg = msg[:4096]
	}
	return kind, token, msg
}

// globEscape escapes the characters that Redis patterns (PSUBSCRIBE,
// SCAN MATCH) give a meaning.
func globEscape(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case '*', '?', '[', ']', '\\':
			b.WriteByte('\\')
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
