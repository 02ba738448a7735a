// Command memolock shows memolock working, memoizes commands through Redis,
// shows an operator what memolock keeps in Redis, and checks what a Redis
// user may do for it.
//
//	memolock demo [--redis URL [--cluster]] [--clients N] [--goroutines N] [--fetch D] [--metrics]
//	memolock run --tag T (--id ID | --id-hex HEX | --id-base64 B64) --ttl D [--redis URL [--cluster]] [--lock-ttl D] [--wait D] [--quiet] -- CMD [ARGS...]
//	memolock inspect --tag T (--id ID | --id-hex HEX | --id-base64 B64) [--redis URL [--cluster]] [--hash-ids] [--json]
//	memolock watch --tag T [--id ID ...] [--redis URL [--cluster]] [--hash-ids]
//	memolock check --tag T [--redis URL [--cluster]] [--features LIST]
//	memolock version | --version
//	memolock help [COMMAND] | COMMAND --help
//
// Each command's help page (cli.go has their common layout) is what a user
// reads; what follows is the detail behind it.
//
// check tries, as the URL's user, what each feature of memolock does on
// the server for one tag, and names the ACL rules that are missing (see
// aclRecipe in check.go, which the README prints).
//
// demo runs a stampede on one missing key, with memolock and without it, on
// an embedded miniredis unless --redis is given. With --metrics it then
// prints memolock's OpenTelemetry metrics for its run, as the SDK recorded
// them.
//
// run prints the standard output of CMD, running CMD at most once at a time
// per key across every machine that shares the Redis server: concurrent
// invocations wait for the running one and print its output. Output is
// cached for --ttl. --redis defaults to $MEMOLOCK_REDIS, then
// redis://127.0.0.1:6379, for run, inspect and watch alike; --cluster
// takes a cluster URL, redis://host:port?addr=host2:port2 (seed nodes).
// Passwords in URLs are never printed, nor is any argument that may hold
// one (with "://" or "@") in a usage error: such an argument is redacted
// as URLs are.
//
// inspect prints what Redis holds for one id, without computing, waiting
// or changing anything: the value's size (never the value, which may be
// secret, and which inspect does not even read: it asks Redis for STRLEN
// and PTTLs in one read-only script of its own, so a large value costs
// nothing) and remaining TTL, whether it is a stale value put back after a
// failed fetch, a cached "not found" and the stale copy kept for failures
// (Options.NegTTL, StaleTTL), the lock's holder and TTL, and how many
// processes wait for the value: PUBSUB NUMSUB of T/notif:I and
// T/lock-event:I, or on a cluster PUBSUB SHARDNUMSUB on the master of the
// id's slot. Waiters that listen by pattern (original redis-memolock
// peers, watch without --id) are not counted; watch with --id is. With
// --hash-ids, the id is hashed as Options.HashIDs hashes it. --id is
// given once. inspect exits 0 when Redis answered, whatever it holds, 1
// when it did not (within 5s), 2 on bad usage. --json prints one object:
//
//	tag, id              as given
//	key                  the value key, placed (T:{I} on a cluster) and hashed as the clients do
//	found, size          whether there is a value (an empty one counts), and its size in bytes
//	ttl_ms               the value's remaining TTL in ms, -1 if it never expires, null without a value
//	stale                the value is a stale copy put back after a failed fetch (served flagged stale)
//	stale_copy_ttl_ms    the TTL of the copy kept for failing fetches, null without one
//	not_found            fetch found nothing and that is cached ...
//	not_found_ttl_ms     ... for this long, null when not
//	lock                 "free"; "held" (computing); "done" (lingering after a store);
//	                     "stale" (a stale value is served and nobody fetches until the lock expires)
//	holder               the holder's token, without "done:" or "stale:"; "" when free
//	lock_ttl_ms          the lock's remaining TTL, null when free
//	value_subscribers    subscribers of T/notif:I
//	event_subscribers    subscribers of T/lock-event:I
//	waiters              the larger of the two
//	tag_base64, id_base64, key_base64, holder_base64
//	                     the bytes of tag, id, key or holder in base64, present only
//	                     when they are not valid UTF-8 (JSON strings are, so those
//	                     fields then have U+FFFD in place of the stray bytes)
//
// watch prints the traffic of a tag, one line per event,
// "<time> <kind> id=<id> ...", until SIGINT or SIGTERM (then it exits 0):
// value (published, with its size, never its bytes), fail (the holder's
// token and the first line of its message), abandon (the holder gave its
// lock up or found it lost: waiters look again), notfound, stale, and the
// ends of locks, below. With --id it watches those ids only (hashed first
// with --hash-ids; at most 100, an id given twice counting once). On one
// server it subscribes to the tag's channels by pattern (to the ids'
// channels with --id).
//
// Nobody publishes the end of a lock: watch learns it from keyspace
// events of lock keys, which need notify-keyspace-events with K, $ and x.
// When a lock is set, watch reads it at once (GET and PTTL, on a worker,
// so that the feed never waits) and remembers what it holds: a holder's
// token, "done:" (lingering after a store) or "stale:" (a stale value put
// back). When the lock expires it prints "takeover" for a holder's token
// (the holder is gone without a value; the next caller takes over),
// "refetch" for a stale value's (its time is up: the next caller fetches
// again), and nothing for a done lock, however late Redis expires it.
// When it does not know what the lock held (set before watch started,
// gone or set again before watch read it, or watch too busy to read it),
// it prints "expired", which claims no takeover. It forgets a lock that
// is deleted (with g in the flags), all locks when a connection is
// replaced, and the locks set longest ago beyond 50000. It checks the
// keyspace events at the start and after every reconnect and, if they are
// off or it cannot tell, says so on stderr with the CONFIG SET an operator
// could run; it never runs it. Pointed without --cluster at a node of a
// cluster, it says so.
//
// On a cluster, values and events travel on sharded channels, which no
// pattern matches: with --id, watch subscribes to each id's channels on
// the master of its slot; without, it shows only what keyspace events on
// every master tell: values set, each read at once with its lock and
// shown as "stored" with its size, or as "stale" when the lock then holds
// "stale:" (a stale value put back, which the resurrect script sets just
// before its lock; a plain SET beside such a lock shows so too); "not
// found" cached; and the ends of locks, as above. It does not follow slots
// that move or masters added while it runs. Pub/sub delivers at most once:
// what is published while a connection is down is missed, and watch says
// so on stderr. Lines wait for stdout in a queue of 4096, and later ones
// are dropped while it is full, so that a reader who stops reading never
// holds watch up: a signal ends it at once (it waits at most 0.5s for the
// queued lines), and it says on stderr how many lines were not written.
// It exits 1 if Redis cannot be reached or refuses the subscription at
// the start, 2 on bad usage.
package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"strings"

	"github.com/redis/go-redis/v9"
)

func main() {
	// go-redis logs every failed dial; memolock reports errors itself.
	redis.SetLogger(quiet{})
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

type quiet struct{}

func (quiet) Printf(context.Context, string, ...any) {}

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		mainHelp(stderr)
		return exitUsage
	}
	switch args[0] {
	case "-h", "--help", "-help":
		mainHelp(stdout)
		return 0
	case "--version", "-version":
		return version(args[1:], stdout, stderr)
	}
	if c := findCommand(args[0]); c != nil {
		return dispatch(c.name, args[1:], stdout, stderr)
	}
	fmt.Fprintf(stderr, "memolock: unknown command %q\nRun 'memolock --help' for the list of commands.\n", redactArg(args[0]))
	return exitUsage
}

// dispatch runs the command called name.
func dispatch(name string, args []string, stdout, stderr io.Writer) int {
	switch name {
	case "demo":
		return demo(args, stdout, stderr)
	case "run":
		return runCmd(args, stdout, stderr)
	case "inspect":
		return inspect(args, stdout, stderr)
	case "watch":
		return watch(args, stdout, stderr)
	case "check":
		return check(args, stdout, stderr)
	case "version":
		return version(args, stdout, stderr)
	case "help":
		return help(args, stdout, stderr)
	}
	panic("no command " + name)
}

const withheld = "(URL withheld)"

// redact returns a Redis URL fit for output: its scheme, host and path
// (the database, or a unix socket), with "xxxxx" for whatever user info
// it has (a lone user name is redis-cli's password form, as in
// redis://secret@host) and every query parameter's value. Anything else,
// a URL without a scheme and host say, is withheld entirely: go-redis
// reads "user:pass@host" and bare words in ways that may hide a secret.
func redact(raw string) string {
	u, err := url.Parse(raw)
	if err != nil || u.Opaque != "" || u.Fragment != "" ||
		(u.Scheme != "redis" && u.Scheme != "rediss" && u.Scheme != "unix") ||
		(u.Host == "" && u.Scheme != "unix") {
		return withheld
	}
	out := url.URL{Scheme: u.Scheme, Host: u.Host, Path: u.Path}
	if u.Scheme != "unix" && strings.Trim(u.Path, "/0123456789") != "" {
		out.Path = "/xxxxx" // a database is a number; anything else is not shown
	}
	if u.User != nil {
		out.User = url.User("xxxxx")
	}
	if u.RawQuery != "" {
		q, err := url.ParseQuery(u.RawQuery)
		if err != nil {
			return withheld
		}
		for k, vs := range q {
			for i, v := range vs {
				// A cluster URL's seed nodes are no secret, if that is
				// all they are: host:port.
				if _, _, err := net.SplitHostPort(v); k != "addr" || err != nil || strings.ContainsAny(v, "@/") {
					vs[i] = "xxxxx"
				}
			}
		}
		out.RawQuery = q.Encode()
	}
	return out.String()
}
