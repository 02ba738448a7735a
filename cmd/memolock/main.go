// Command memolock shows memolock working and memoizes commands through Redis.
//
//	memolock demo [--redis URL] [--clients N] [--goroutines N] [--fetch D]
//	memolock run --tag T --id ID --ttl D [--redis URL] [--lock-ttl D] [--wait D] -- CMD [ARGS...]
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
  memolock demo [--redis URL] [--clients N] [--goroutines N] [--fetch D]
  memolock run --tag T --id ID --ttl D [--redis URL] [--lock-ttl D] [--wait D] -- CMD [ARGS...]
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

// redact returns a Redis URL fit for output: without its password, be it
// in the user info (a lone user name is redis-cli's password form, as in
// redis://secret@host) or in the query (?password=...), and withheld
// entirely if it does not parse (the parse error would quote it).
func redact(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "(unparseable URL withheld)"
	}
	if u.User != nil {
		if _, ok := u.User.Password(); ok {
			u.User = url.UserPassword(u.User.Username(), "xxxxx")
		} else {
			u.User = url.User("xxxxx")
		}
	}
	if u.RawQuery != "" {
		q, err := url.ParseQuery(u.RawQuery)
		if err != nil {
			u.RawQuery = "(withheld)"
		} else {
			for k := range q {
				if secretParam(k) {
					q[k] = []string{"xxxxx"}
				}
			}
			u.RawQuery = q.Encode()
		}
	}
	return u.String()
}

// secretParam reports whether a URL query parameter may carry a secret.
func secretParam(name string) bool {
	name = strings.ToLower(name)
	for _, s := range []string{"pass", "secret", "token", "auth", "key", "cred"} {
		if strings.Contains(name, s) {
			return true
		}
	}
	return false
}
