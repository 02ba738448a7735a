package main

import (
	"context"
	"encoding/base64"
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

// inspectScript reads what Redis holds for one id without transferring
// the value, which may be large: its size and PTTL, the lock's holder and
// PTTL, and the PTTLs of the "not found" marker and the stale copy. KEYS:
// value, lock, not-found and stale keys. It only reads. One script, so
// that the answer is one moment's, as the library's peek script is.
var inspectScript = redis.NewScript(`return {redis.call('STRLEN', KEYS[1]), redis.call('PTTL', KEYS[1]),
  redis.call('GET', KEYS[2]), redis.call('PTTL', KEYS[2]), redis.call('PTTL', KEYS[3]), redis.call('PTTL', KEYS[4])}`)

// inspection is what inspect prints with --json, one object per run. The
// durations are milliseconds, -1 for a key without expiry, and null when
// the key is not there.
type inspection struct {
	Tag   string `json:"tag"`
	ID    string `json:"id"`
	Key   string `json:"key"` // the value key, as placed and hashed
	Found bool   `json:"found"`
	Size  int64  `json:"size"` // bytes; never the value itself
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
	// The bytes of the strings above that are not valid UTF-8, which JSON
	// cannot carry (they would come out with U+FFFD in place of bytes).
	TagBase64    string `json:"tag_base64,omitempty"`
	IDBase64     string `json:"id_base64,omitempty"`
	KeyBase64    string `json:"key_base64,omitempty"`
	HolderBase64 string `json:"holder_base64,omitempty"`
}

var inspectCommand = command{
	name:    "inspect",
	summary: "show what Redis holds for one id, changing nothing",
	usage: []string{
		"inspect --tag T --id ID [--redis URL [--cluster]] [--hash-ids] [--json]",
		"inspect --tag T (--id-hex HEX | --id-base64 B64) [flags]",
	},
	about: `Prints the value's size (never its bytes) and remaining TTL; whether it is a stale value put back after a failed fetch, or a cached "not found"; the stale copy kept for failing fetches; the lock's holder and TTL; and how many processes wait for the value (PUBSUB NUMSUB, or SHARDNUMSUB on the slot's master with --cluster; waiters that listen by pattern are not counted). It never computes, waits or writes: it reads in one read-only script (EVAL_RO, on Redis 7), so that a read-only ACL user can run it ('memolock check' tells), and asks for STRLEN rather than the value, so that a large value costs nothing.

--json prints one object: tag, id, key (as placed and hashed); found, size, ttl_ms (-1: no expiry; null: no value); stale, stale_copy_ttl_ms; not_found, not_found_ttl_ms; lock ("free", "held", "done" after a store, "stale"), holder, lock_ttl_ms; value_subscribers, event_subscribers, waiters; and tag_base64, id_base64, key_base64, holder_base64 for those that are not valid UTF-8.`,
	flags: []string{"tag", "id", "id-hex", "id-base64", "hash-ids", "json", "redis", "cluster"},
	env:   true,
	exits: [][2]string{
		{"0", "Redis answered, whatever it holds"},
		{"1", "Redis could not be reached, refused, or did not answer within 5s"},
		{"2", "bad usage"},
	},
	example: [][2]string{
		{"Who computes the November report, and how many wait for it.", "memolock inspect --tag reports --id 2026-11"},
		{"The same for a script.", "memolock inspect --tag reports --id 2026-11 --json | jq .waiters"},
	},
}

func inspect(args []string, stdout, stderr io.Writer) int {
	c := &inspectCommand
	fs := flag.NewFlagSet("inspect", flag.ContinueOnError)
	redisURL := fs.String("redis", "", redisUsage)
	cluster := fs.Bool("cluster", false, clusterUsage)
	tag := fs.String("tag", "", "the key's `TAG` (required)")
	var idArgs idFlags
	idArgs.define(fs, " (one of the three is required, once)")
	hashIDs := fs.Bool("hash-ids", false, "the id is hashed on the wire, as clients with Options.HashIDs hash it")
	asJSON := fs.Bool("json", false, "print one JSON object")
	if code, ok := parse(c, fs, args, stdout, stderr); !ok {
		return code
	}
	ids, err := idArgs.all()
	switch {
	case err != nil:
		return usageError(c, stderr, "%v", err)
	case *tag == "" || len(ids) == 0:
		return usageError(c, stderr, "--tag and --id (or --id-hex, --id-base64) are required")
	case len(ids) > 1:
		return usageError(c, stderr, "--id given %d times (counting --id-hex and --id-base64); inspect shows one id: run it once per id", len(ids))
	case fs.NArg() > 0:
		return usageError(c, stderr, "unexpected argument %q; give the id with --id (--cluster takes no value)", redactArg(fs.Arg(0)))
	}
	id := ids[0]
	keys, err := memolock.NewKeyScheme(*tag)
	if err != nil {
		return usageError(c, stderr, "%s", libError(err))
	}
	// The id as the clients send it: hashed with HashIDs, placed on a
	// cluster.
	wire := id
	if *hashIDs {
		wire = memolock.HashID(wire)
	}
	if *cluster {
		if strings.ContainsAny(*tag, "{}") {
			return usageError(c, stderr, "tag %q contains a brace; on a cluster the id's braces must be the first in every key", *tag)
		}
		var ok bool
		if wire, ok = memolock.PlaceID(wire); !ok {
			return usageError(c, stderr, "--id %s cannot be placed in a cluster slot (it is empty or starts with \"}\"); pass --hash-ids if the clients hash ids (Options.HashIDs), as they must to use it", show(id))
		}
	}
	url := redisURLOrDefault(*redisURL)
	rdb, err := openRedis(url, *cluster)
	if err != nil {
		return usageError(c, stderr, "--redis %v", err)
	}
	defer rdb.Close()

	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	in := inspection{Tag: *tag, ID: id, Key: keys.Value(wire), Lock: "free"}
	var res []any
	err = within(ctx, func(ctx context.Context) error {
		var err error
		ks := []string{keys.Value(wire), keys.Lock(wire), keys.NotFound(wire), keys.Stale(wire)}
		// Read-only, so that a user with read-only keys (%R~) may run it;
		// Redis before 7 has no EVAL_RO.
		res, err = inspectScript.RunRO(ctx, rdb, ks).Slice()
		if err != nil && strings.Contains(strings.ToLower(err.Error()), "unknown command") {
			res, err = inspectScript.Run(ctx, rdb, ks).Slice()
		}
		return err
	})
	if err == nil {
		err = in.read(res)
	}
	if err != nil {
		fmt.Fprintf(stderr, "memolock inspect: reading %s: %v (redis %s)%s\n", show(in.Key), err, redact(url), redisHint(err, url)+timedOut(err))
		return exitFailure
	}
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
		fmt.Fprintf(stderr, "memolock inspect: counting the subscribers of %s: %v (redis %s)%s\n", show(notif), err, redact(url), redisHint(err, url)+timedOut(err))
		return exitFailure
	}
	in.ValueListeners, in.EventListeners = subs[notif], subs[events]
	in.Waiters = max(in.ValueListeners, in.EventListeners)
	if *asJSON {
		for _, f := range []struct{ s, b64 *string }{{&in.Tag, &in.TagBase64}, {&in.ID, &in.IDBase64}, {&in.Key, &in.KeyBase64}, {&in.Holder, &in.HolderBase64}} {
			if !utf8.ValidString(*f.s) {
				*f.b64 = base64.StdEncoding.EncodeToString([]byte(*f.s))
			}
		}
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

// read fills in from inspectScript's reply.
func (in *inspection) read(res []any) error {
	var n [6]int64 // PTTLs: -2 no key, -1 no expiry
	ok := len(res) == len(n)
	for i := 0; ok && i < len(n); i++ {
		if i != 2 {
			n[i], ok = res[i].(int64)
		}
	}
	var (
		holder string
		held   bool
	)
	if ok {
		holder, held = res[2].(string)
		ok = held || res[2] == nil
	}
	if !ok {
		return fmt.Errorf("unexpected script reply %v", res)
	}
	if n[1] != -2 {
		in.Found, in.Size, in.TTL = true, n[0], millis(n[1])
	}
	if n[5] != -2 {
		in.StaleCopyTTL = millis(n[5])
	}
	if n[4] != -2 && !in.Found {
		in.NotFound, in.NotFoundTTL = true, millis(n[4])
	}
	if held {
		in.Lock, in.Holder, in.LockTTL = "held", holder, millis(n[3])
		for _, state := range []string{"done", "stale"} {
			if token, ok := strings.CutPrefix(holder, state+":"); ok {
				in.Lock, in.Holder = state, token
			}
		}
		in.Stale = in.Found && in.Lock == "stale"
	}
	return nil
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

// millis returns a PTTL for JSON: ms, or -1 for no expiry.
func millis(ms int64) *int64 {
	if ms < 0 {
		ms = -1
	}
	return &ms
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

// noAnswer says that Redis did not answer within the call's time: callTimeout
// for a command, libraryBudget for check's trial of the library.
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
