// Command memolock shows memolock working and memoizes commands through Redis.
//
//	memolock demo [--redis URL [--cluster]] [--clients N] [--goroutines N] [--fetch D]
//	memolock run --tag T --id ID --ttl D [--redis URL [--cluster]] [--lock-ttl D] [--wait D] -- CMD [ARGS...]
//
// demo runs a stampede on one missing key, with memolock and without it, on
// an embedded miniredis unless --redis is given.
//
// run prints the standard output of CMD, running CMD at most once at a time
// per key across every machine that shares the Redis server: concurrent
// invocations wait for the running one and print its output. Output is
// cached for --ttl. --redis defaults to $MEMOLOCK_REDIS, then
// redis://127.0.0.1:6379.
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

const usage = `usage:
  memolock demo [--redis URL [--cluster]] [--clients N] [--goroutines N] [--fetch D]
  memolock demo --interop [--redis URL] [--processes N] [--interop-dir DIR]
  memolock run --tag T --id ID --ttl D [--redis URL [--cluster]] [--lock-ttl D] [--wait D] -- CMD [ARGS...]
`

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	switch args[0] {
	case "demo":
		return demo(args[1:], stdout, stderr)
	case "run":
		return runCmd(args[1:], stdout, stderr)
	case "-h", "--help", "help":
		fmt.Fprint(stdout, usage)
		return 0
	}
	fmt.Fprintf(stderr, "memolock: unknown command %q\n%s", args[0], usage)
	return 2
}

// parseRedisURL parses a --redis URL. Only redis://, rediss:// and
// unix:// URLs with a host (or socket path) are taken: go-redis reads other
// forms, such as "user:pass@host" or a bare word, as localhost:6379. Its
// errors never quote the URL.
func parseRedisURL(raw string) (*redis.Options, error) {
	if redact(raw) == withheld {
		return nil, fmt.Errorf("%s is not of the form redis://[user:password@]host:port/db", withheld)
	}
	opts, err := redis.ParseURL(raw)
	if err != nil {
		// The parse error may quote the URL, password and all.
		return nil, fmt.Errorf("%s is not a valid Redis URL", redact(raw))
	}
	return opts, nil
}

// openRedis returns a client for a --redis URL: a cluster client, with
// the URL's host and each addr parameter as seed nodes, if cluster is set.
func openRedis(raw string, cluster bool) (redis.UniversalClient, error) {
	if !cluster {
		opts, err := parseRedisURL(raw)
		if err != nil {
			return nil, err
		}
		return redis.NewClient(opts), nil
	}
	if redact(raw) == withheld {
		return nil, fmt.Errorf("%s is not of the form redis://[user:password@]host:port?addr=host2:port2", withheld)
	}
	opts, err := redis.ParseClusterURL(raw)
	if err != nil {
		return nil, fmt.Errorf("%s is not a valid Redis Cluster URL", redact(raw))
	}
	return redis.NewClusterClient(opts), nil
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
