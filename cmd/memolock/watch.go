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
	// lingerSlack is how soon after a store the lock's expiry is taken for
	// the lock lingering after it (memolock's linger is at most 1s).
	lingerSlack = 2 * time.Second
	// staleMarkAge is how long a stale value put back is remembered, to
	// tell its lock's expiry from a takeover.
	staleMarkAge = 10 * time.Minute
	// probeEvery is how often each subscription connection is pinged, and
	// silentAfter how long it may stay silent before watch says so.
	probeEvery  = 5 * time.Second
	silentAfter = 15 * time.Second
	stampLayout = "2006-01-02T15:04:05.000000Z07:00"
)

// idList is a repeatable --id flag.
type idList []string

func (l *idList) String() string { return strings.Join(*l, ",") }

func (l *idList) Set(s string) error {
	*l = append(*l, s)
	return nil
}

// watcher prints the traffic of one tag. Its fields are set up by watch
// and then belong to the goroutine in run; the readers of the
// subscriptions hand it what they receive.
type watcher struct {
	rdb     redis.UniversalClient
	keys    memolock.KeyScheme
	cluster bool
	ids     map[string]string // wire id -> id as given; nil: every id
	stdout  io.Writer
	stderr  io.Writer
	marks   map[string]mark // wire id -> what came last before its lock expires
}

// mark is what the feed last saw of an id, to tell the expiry of a lock
// that lingers after a store, or that served a stale value, from a holder
// that died.
type mark struct {
	stale bool // a stale value was put back; else a value was stored
	at    time.Time
}

// source is one subscription connection, read by its own goroutine.
type source struct {
	ps    *redis.PubSub
	where string       // the node, or the id of a sharded subscription
	acks  int          // acknowledgements that confirm the subscription
	heard atomic.Int64 // when anything last came, in Unix nanoseconds
}

// item is what a source's reader hands the feed.
type item struct {
	src   *source
	msg   *redis.Message
	note  string // for stderr
	ready bool   // the subscription is confirmed
	err   error  // the subscription was refused
}

func watch(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("memolock watch", flag.ContinueOnError)
	fs.SetOutput(stderr)
	redisURL := fs.String("redis", "", "Redis URL (default $MEMOLOCK_REDIS, then "+defaultRedisURL+")")
	cluster := fs.Bool("cluster", false, "--redis is a Redis Cluster: redis://host:port?addr=host2:port2&addr=... (seed nodes)")
	tag := fs.String("tag", "", "key tag (required)")
	var ids idList
	fs.Var(&ids, "id", "watch only this id (repeatable; on a cluster, needed to see values and events)")
	hashIDs := fs.Bool("hash-ids", false, "hash the --id values, as clients with Options.HashIDs do")
	if code, ok := parseFlags(fs, args); !ok {
		return code
	}
	switch {
	case *tag == "":
		fmt.Fprintln(stderr, "memolock watch: --tag is required")
		return exitUsage
	case fs.NArg() > 0:
		fmt.Fprintf(stderr, "memolock watch: unexpected argument %q; give ids with --id\n", fs.Arg(0))
		return exitUsage
	case len(ids) > maxWatchIDs:
		fmt.Fprintf(stderr, "memolock watch: %d ids given; watch at most %d at a time, or none to watch them all\n", len(ids), maxWatchIDs)
		return exitUsage
	}
	keys, err := memolock.NewKeyScheme(*tag)
	if err != nil {
		fmt.Fprintf(stderr, "memolock watch: %v\n", err)
		return exitUsage
	}
	if *cluster && strings.ContainsAny(*tag, "{}") {
		fmt.Fprintf(stderr, "memolock watch: tag %q contains a brace; on a cluster the id's braces must be the first in every key\n", *tag)
		return exitUsage
	}
	w := &watcher{keys: keys, cluster: *cluster, stdout: stdout, stderr: stderr, marks: map[string]mark{}}
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
				fmt.Fprintf(stderr, "memolock watch: --id %s cannot be placed in a cluster slot (it is empty or starts with \"}\"); the clients must use HashIDs for it (then pass --hash-ids)\n", show(id))
				return exitUsage
			}
		}
		w.ids[wire] = id
	}
	url := redisURLOrDefault(*redisURL)
	w.rdb, err = openRedis(url, *cluster)
	if err != nil {
		fmt.Fprintf(stderr, "memolock watch: --redis %v\n", err)
		return exitUsage
	}
	defer w.rdb.Close()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return w.run(ctx, redact(url))
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
		fmt.Fprintf(w.stderr, "memolock watch: %v (redis %s)%s\n", err, where, timedOut(err))
		return exitFailure
	}
	w.checkKeyspaceEvents(setup, nodes)
	if w.cluster && w.ids == nil {
		fmt.Fprintln(w.stderr, `memolock watch: on a cluster, values and holder events (fail, abandon, notfound, stale) travel on sharded channels, which no pattern can match: this feed shows values stored, "not found" cached and lock expiries from keyspace events; pass --id to see everything about given ids`)
	}

	// The readers and probes end with rctx; each reader's PubSub is closed
	// to unblock it.
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
		fmt.Fprintf(w.stderr, "memolock watch: subscribing: %v (redis %s)%s\n", err, where, timedOut(err))
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
			fmt.Fprintf(w.stderr, "memolock watch: no subscription confirmed within %v by %s (redis %s)\n", callTimeout, strings.Join(late, ", "), where)
			return exitFailure
		case it := <-items:
			switch {
			case it.err != nil:
				fmt.Fprintf(w.stderr, "memolock watch: %s refused the subscription: %v (redis %s)\n", it.src.where, it.err, where)
				return exitFailure
			case it.ready:
				if confirmed[it.src] = true; len(confirmed) == len(sources) {
					deadline = nil
					fmt.Fprintf(w.stderr, "memolock watch: watching tag %s on %s; Ctrl-C stops\n", show(w.keys.Tag()), where)
				}
			case it.note != "":
				fmt.Fprintf(w.stderr, "memolock watch: %s\n", it.note)
			default:
				w.report(ctx, it.msg)
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

// checkKeyspaceEvents says on stderr, once, what the feed cannot show
// because the nodes' notify-keyspace-events lack what it needs, and the
// CONFIG SET that would turn them on (keeping the flags already set). It
// never changes them.
func (w *watcher) checkKeyspaceEvents(ctx context.Context, nodes []*redis.Client) {
	need := "Kx" // expired lock keys: takeovers
	if w.cluster && w.ids == nil {
		need = "Kx$" // and value keys set: values stored
	}
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
		fmt.Fprintf(w.stderr, "memolock watch: could not check notify-keyspace-events on %s (%v): takeovers show only if it has the flags K and x\n",
			strings.Join(refused, ", "), reason)
	}
	if len(lacking) == 0 {
		return
	}
	var lost []string
	if strings.ContainsAny(missing, "Kx") {
		lost = append(lost, "takeovers (locks that expire)")
	}
	if strings.ContainsAny(missing, "K$") && need == "Kx$" {
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
	fmt.Fprintf(w.stderr, "memolock watch: the keyspace events this feed needs are off (%s), so %s will not be shown; an operator can turn them on with: %s\n",
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
		s := &source{ps: n.Subscribe(ctx), where: n.Options().Addr}
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
			s := &source{ps: n.Subscribe(ctx), where: n.Options().Addr, acks: len(patterns)}
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
				if !send(item{note: fmt.Sprintf("subscribed again on %s; whatever was published in the gap was missed", s.where)}) {
					return
				}
			}
		case *redis.Message:
			if !send(item{msg: m}) {
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

// report prints one message of the feed.
func (w *watcher) report(ctx context.Context, m *redis.Message) {
	if ctx.Err() != nil {
		return // stopping
	}
	if key, ok := keyspaceKey(m.Channel); ok {
		w.keyspace(ctx, key, m.Payload)
		return
	}
	if wire, ok := strings.CutPrefix(m.Channel, w.keys.Notif("")); ok && w.wanted(wire) {
		w.mark(wire, false)
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
		w.line("abandon", wire, holder+": the lock is gone without a value; waiters look again")
	case "notfound":
		w.line("notfound", wire, holder+": fetch found nothing")
	case "stale":
		w.mark(wire, true)
		w.line("stale", wire, holder+": fetch failed; a stale value is served")
	default:
		w.line("event", wire, "kind="+show(kind)+" "+holder)
	}
}

// keyspace prints a keyspace event of key.
func (w *watcher) keyspace(ctx context.Context, key, event string) {
	if wire, ok := strings.CutPrefix(key, w.keys.Lock("")); ok {
		if event == "expired" && w.wanted(wire) {
			w.lockExpired(ctx, wire)
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
		w.mark(wire, false)
		size := "size=?"
		var n int64
		if err := w.call(ctx, func(ctx context.Context) (err error) {
			n, err = w.rdb.StrLen(ctx, key).Result()
			return err
		}); err == nil {
			size = fmt.Sprintf("size=%d", n)
		}
		w.line("stored", wire, size)
	}
}

// lockExpired tells a takeover (the holder died, the next caller takes
// the lock) from the end of a lock that lingered after a store, or that
// served a stale value.
func (w *watcher) lockExpired(ctx context.Context, wire string) {
	m, had := w.marks[wire]
	delete(w.marks, wire)
	if had && m.stale && time.Since(m.at) < staleMarkAge {
		w.line("refetch", wire, "the stale value's time is up: the next caller fetches again")
		return
	}
	if had && !m.stale && time.Since(m.at) < lingerSlack {
		return
	}
	// A lock beside a value lingered after a store (an original peer's
	// lingers until its TTL): nobody takes over.
	var n int64
	err := w.call(ctx, func(ctx context.Context) (err error) {
		n, err = w.rdb.Exists(ctx, w.keys.Value(wire)).Result()
		return err
	})
	switch {
	case err != nil:
		w.line("takeover", wire, fmt.Sprintf("lock expired: holder gone, next caller takes over (unless a value is there: checking failed: %v)", err))
	case n == 0:
		w.line("takeover", wire, "lock expired: holder gone, next caller takes over")
	}
}

// call runs one command of the feed, bounded to a second.
func (w *watcher) call(ctx context.Context, fn func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	return within(ctx, fn)
}

// mark remembers that a value of wire was stored, or a stale one put back.
func (w *watcher) mark(wire string, stale bool) {
	if len(w.marks) >= 10000 {
		for k, m := range w.marks {
			if age := time.Since(m.at); age > staleMarkAge || !m.stale && age > lingerSlack {
				delete(w.marks, k)
			}
		}
		if len(w.marks) >= 10000 {
			clear(w.marks)
		}
	}
	w.marks[wire] = mark{stale: stale, at: time.Now()}
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
	fmt.Fprintf(w.stdout, "%s %-8s id=%s %s\n", time.Now().Format(stampLayout), kind, show(id), rest)
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
