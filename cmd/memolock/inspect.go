package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/redis/go-redis/v9"

	"github.com/memolock/memolock"
)

// callTimeout bounds what inspect asks of Redis, and how long watch waits
// for Redis to answer before it starts to listen.
const callTimeout = 5 * time.Second

// inspection is what inspect prints with --json, one object per run. The
// durations are milliseconds, -1 for a key without expiry, and null when
// the key is not there.
type inspection struct {
	Tag   string `json:"tag"`
	ID    string `json:"id"`
	Key   string `json:"key"` // the value key, as placed and hashed
	Found bool   `json:"found"`
	Size  int    `json:"size"` // bytes; never the value itself
	TTL   *int64 `json:"ttl_ms"`
	// Stale: the value is a stale copy put back after a failed fetch.
	Stale          bool   `json:"stale"`
	StaleCopyTTL   *int64 `json:"stale_copy_ttl_ms"`
	NotFound       bool   `json:"not_found"`
	NotFoundTTL    *int64 `json:"not_found_ttl_ms"`
	Lock           string `json:"lock"`   // free, held, done or stale
	Holder         string `json:"holder"` // the token, without done: or stale:
	LockTTL        *int64 `json:"lock_ttl_ms"`
	ValueListeners int64  `json:"value_subscribers"`
	EventListeners int64  `json:"event_subscribers"`
	Waiters        int64  `json:"waiters"`
}

func inspect(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("memolock inspect", flag.ContinueOnError)
	fs.SetOutput(stderr)
	redisURL := fs.String("redis", "", "Redis URL (default $MEMOLOCK_REDIS, then "+defaultRedisURL+")")
	cluster := fs.Bool("cluster", false, "--redis is a Redis Cluster: redis://host:port?addr=host2:port2&addr=... (seed nodes)")
	tag := fs.String("tag", "", "key tag (required)")
	id := fs.String("id", "", "key id (required)")
	hashIDs := fs.Bool("hash-ids", false, "ids are hashed on the wire (the clients use Options.HashIDs)")
	asJSON := fs.Bool("json", false, "print one JSON object")
	if code, ok := parseFlags(fs, args); !ok {
		return code
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	switch {
	case *tag == "" || !set["id"]:
		fmt.Fprintln(stderr, "memolock inspect: --tag and --id are required")
		return exitUsage
	case fs.NArg() > 0:
		fmt.Fprintf(stderr, "memolock inspect: unexpected argument %q; give the id with --id\n", fs.Arg(0))
		return exitUsage
	}
	url := redisURLOrDefault(*redisURL)
	rdb, err := openRedis(url, *cluster)
	if err != nil {
		fmt.Fprintf(stderr, "memolock inspect: --redis %v\n", err)
		return exitUsage
	}
	defer rdb.Close()
	c, err := memolock.New(rdb, *tag, &memolock.Options{HashIDs: *hashIDs})
	if err != nil {
		fmt.Fprintf(stderr, "memolock inspect: %v\n", err)
		return exitUsage
	}
	defer c.Close()

	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	p, err := c.Peek(ctx, *id)
	if errors.Is(err, memolock.ErrInvalid) {
		fmt.Fprintf(stderr, "memolock inspect: %v\n", err)
		return exitUsage
	}
	if err != nil {
		hint := ""
		if msg := err.Error(); !*cluster && (strings.Contains(msg, "MOVED ") || strings.Contains(msg, "CROSSSLOT ")) {
			hint = "; this is a Redis Cluster: pass --cluster"
		}
		fmt.Fprintf(stderr, "memolock inspect: %v (redis %s)%s\n", err, redact(url), hint+timedOut(err))
		return exitFailure
	}
	// Peek placed the id; the channels are placed the same way.
	wire := *id
	if *hashIDs {
		wire = memolock.HashID(wire)
	}
	if *cluster {
		wire, _ = memolock.PlaceID(wire) // Peek has refused ids it cannot place
	}
	keys := c.Keys()
	notif, events := keys.Notif(wire), keys.Events(wire)
	var subs map[string]int64
	err = within(ctx, func(ctx context.Context) error {
		var err error
		if cc, ok := rdb.(*redis.ClusterClient); ok {
			// Sharded channels: only the master of their slot counts them.
			var node *redis.Client
			if node, err = cc.MasterForKey(ctx, notif); err == nil {
				subs, err = node.PubSubShardNumSub(ctx, notif, events).Result()
			}
		} else {
			subs, err = rdb.PubSubNumSub(ctx, notif, events).Result()
		}
		return err
	})
	if err != nil {
		fmt.Fprintf(stderr, "memolock inspect: counting the subscribers of %s: %v (redis %s)%s\n", show(notif), err, redact(url), timedOut(err))
		return exitFailure
	}

	in := inspection{Tag: *tag, ID: *id, Key: keys.Value(wire), Found: p.Found, Size: len(p.Value),
		Stale: p.Stale, NotFound: p.NotFound, Lock: "free",
		ValueListeners: subs[notif], EventListeners: subs[events]}
	in.Waiters = max(in.ValueListeners, in.EventListeners)
	if p.Found {
		in.TTL = millis(p.TTL)
	}
	if p.StaleCopyTTL != 0 {
		in.StaleCopyTTL = millis(p.StaleCopyTTL)
	}
	if p.NotFound {
		in.NotFoundTTL = millis(p.NotFoundTTL)
	}
	if p.Holder != "" {
		in.Lock, in.Holder = "held", p.Holder
		for _, state := range []string{"done", "stale"} {
			if token, ok := strings.CutPrefix(p.Holder, state+":"); ok {
				in.Lock, in.Holder = state, token
			}
		}
		in.LockTTL = millis(p.HolderTTL)
	}
	if *asJSON {
		if err := json.NewEncoder(stdout).Encode(in); err != nil {
			fmt.Fprintf(stderr, "memolock inspect: writing output: %v\n", err)
			return exitFailure
		}
		return 0
	}
	if err := printInspection(stdout, in, notif, events); err != nil {
		fmt.Fprintf(stderr, "memolock inspect: writing output: %v\n", err)
		return exitFailure
	}
	return 0
}

// printInspection prints in for people, one line per key.
func printInspection(w io.Writer, in inspection, notif, events string) error {
	var b strings.Builder
	fmt.Fprintf(&b, "key         %s\n", show(in.Key))
	switch {
	case !in.Found:
		b.WriteString("value       none\n")
	case in.Stale:
		fmt.Fprintf(&b, "value       %d bytes, %s; stale: put back after a failed fetch, served flagged stale until it expires\n", in.Size, expiry(*in.TTL))
	default:
		fmt.Fprintf(&b, "value       %d bytes, %s\n", in.Size, expiry(*in.TTL))
	}
	if in.StaleCopyTTL != nil {
		fmt.Fprintf(&b, "stale copy  kept for a failing fetch, %s\n", expiry(*in.StaleCopyTTL))
	}
	if in.NotFound {
		fmt.Fprintf(&b, "not found   cached: lookups answer \"not found\" without fetching, %s\n", expiry(*in.NotFoundTTL))
	}
	switch in.Lock {
	case "free":
		b.WriteString("lock        free\n")
	case "held":
		fmt.Fprintf(&b, "lock        held by %s, %s\n", show(in.Holder), expiry(*in.LockTTL))
	case "done":
		fmt.Fprintf(&b, "lock        lingering after %s stored the value, %s\n", show(in.Holder), expiry(*in.LockTTL))
	case "stale":
		fmt.Fprintf(&b, "lock        stale: %s failed and put a stale value back; nobody fetches until the lock %s\n", show(in.Holder), expiry(*in.LockTTL))
	}
	fmt.Fprintf(&b, "waiters     %d (subscribers: %s %d, %s %d)\n", in.Waiters, show(notif), in.ValueListeners, show(events), in.EventListeners)
	_, err := io.WriteString(w, b.String())
	return err
}

// expiry says when a key with ms milliseconds left expires.
func expiry(ms int64) string {
	if ms < 0 {
		return "never expires"
	}
	return "expires in " + (time.Duration(ms) * time.Millisecond).String()
}

func millis(d time.Duration) *int64 {
	ms := int64(-1)
	if d >= 0 {
		ms = d.Milliseconds()
	}
	return &ms
}

// parseFlags parses args into fs. It reports false, with the exit code,
// when the command should stop: 0 for -h, 2 for bad flags (fs has said
// why).
func parseFlags(fs *flag.FlagSet, args []string) (int, bool) {
	err := fs.Parse(args)
	switch {
	case errors.Is(err, flag.ErrHelp):
		return 0, false
	case err != nil:
		return exitUsage, false
	}
	return 0, true
}

// redisURLOrDefault is a --redis flag's value, or $MEMOLOCK_REDIS, or the
// default server.
func redisURLOrDefault(flagValue string) string {
	if flagValue != "" {
		return flagValue
	}
	if env := os.Getenv("MEMOLOCK_REDIS"); env != "" {
		return env
	}
	return defaultRedisURL
}

// within runs call, which talks to Redis, and returns when it does or when
// ctx ends. go-redis ignores context deadlines on reads (unless
// ContextTimeoutEnabled), so a server that accepts connections and never
// answers would hold a call for ReadTimeout times MaxRetries; a call left
// behind ends with the process.
func within(ctx context.Context, call func(context.Context) error) error {
	done := make(chan error, 1)
	go func() { done <- call(ctx) }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return fmt.Errorf("%s: %w", noAnswer, ctx.Err())
	}
}

// noAnswer says that Redis did not answer within callTimeout.
const noAnswer = "Redis did not answer in time"

// timedOut returns "; " and noAnswer if err is a time-out that does not
// say so already, else "": go-redis says "i/o timeout", memolock "context
// deadline exceeded".
func timedOut(err error) string {
	var ne net.Error
	if strings.Contains(err.Error(), noAnswer) ||
		!errors.Is(err, context.DeadlineExceeded) && !(errors.As(err, &ne) && ne.Timeout()) {
		return ""
	}
	return "; " + noAnswer
}

// show returns s as it is if it prints plainly on a terminal, else quoted
// with Go's escapes: ids, tokens and channel names are any bytes, and may
// hold spaces, newlines or terminal escapes.
func show(s string) string {
	if s == "" {
		return `""`
	}
	for _, r := range s {
		if r == utf8.RuneError || r == '"' || r == '\\' || !unicode.IsPrint(r) || unicode.IsSpace(r) {
			return strconv.Quote(s)
		}
	}
	return s
}
