package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// parseRedisURL parses a --redis URL. Only redis://, rediss:// and
// unix:// URLs with a host (or socket path) are taken: go-redis reads other
// forms, such as "user:pass@host" or a bare word, as localhost:6379. Its
// errors never quote the URL, nor any part of it that may be secret; they
// say which part is wrong.
func parseRedisURL(raw string) (*redis.Options, error) {
	if redact(raw) == withheld {
		return nil, fmt.Errorf("%s is not of the form redis://[[user]:password@]host:port[/db]%s", withheld, whyWithheld(raw))
	}
	opts, err := redis.ParseURL(raw)
	if err != nil {
		return nil, fmt.Errorf("%s is not a valid Redis URL: %s", redact(raw), urlProblem(raw, err))
	}
	if opts.TLSConfig != nil {
		opts.Dialer = tlsDialer(opts.DialTimeout, opts.TLSConfig)
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
	opts, err := parseClusterURL(raw)
	if err != nil {
		return nil, err
	}
	return redis.NewClusterClient(opts), nil
}

// parseClusterURL parses a --redis URL given with --cluster.
func parseClusterURL(raw string) (*redis.ClusterOptions, error) {
	if redact(raw) == withheld {
		return nil, fmt.Errorf("%s is not of the form redis://[[user]:password@]host:port?addr=host2:port2%s", withheld, whyWithheld(raw))
	}
	opts, err := redis.ParseClusterURL(raw)
	if err != nil {
		return nil, fmt.Errorf("%s is not a valid Redis Cluster URL: %s", redact(raw), urlProblem(raw, err))
	}
	if opts.TLSConfig != nil {
		opts.Dialer = tlsDialer(opts.DialTimeout, opts.TLSConfig)
	}
	return opts, nil
}

// whyWithheld says, as "; ...", what keeps raw from being a URL at all,
// when net/url can tell.
func whyWithheld(raw string) string {
	u, err := url.Parse(raw)
	switch {
	case err != nil:
		return ": " + urlProblem(raw, err)
	case u.Scheme == "":
		return ": it has no scheme"
	case u.Opaque != "":
		// user:password@host, say: what looks like a scheme may be a
		// user name, and is not shown.
		return ": it has no // after its scheme"
	case u.Scheme != "redis" && u.Scheme != "rediss" && u.Scheme != "unix":
		return ": its scheme is not redis://, rediss:// (TLS) or unix://"
	case u.Host == "":
		return ": it has no host"
	}
	return ""
}

var (
	unknownParams = regexp.MustCompile(`unexpected option: (.*)$`)
	badParam      = regexp.MustCompile(`invalid (\w+) (number|duration|boolean)`)
)

// urlProblem says what go-redis (or net/url) found wrong in raw, naming
// the part but never quoting a value: any of them may be a password.
func urlProblem(raw string, err error) string {
	var uerr *url.Error
	if errors.As(err, &uerr) {
		var esc url.EscapeError
		var host url.InvalidHostError
		switch {
		case errors.As(uerr.Err, &esc):
			return "it has a bad %-escape (a % must be followed by two hex digits: write a % in a password as %25)"
		case errors.As(uerr.Err, &host):
			return "its host has a character a host cannot have"
		case strings.Contains(uerr.Err.Error(), "port"):
			return "its port is not a number"
		}
		return "it does not parse as a URL"
	}
	msg := err.Error()
	if m := unknownParams.FindStringSubmatch(msg); m != nil {
		names := strings.Split(m[1], ", ")
		hint := ""
		for _, n := range names {
			switch n {
			case "password":
				hint = "; a password goes in the URL itself: redis://:PASSWORD@host:port, or redis://USER:PASSWORD@host:port"
			case "username", "user":
				hint = "; a user goes in the URL itself: redis://USER:PASSWORD@host:port"
			}
		}
		return fmt.Sprintf("unknown parameter %s%s", strings.Join(quoteAll(names), ", "), hint)
	}
	if m := badParam.FindStringSubmatch(msg); m != nil {
		kind := map[string]string{"number": "a whole number", "duration": "a duration such as 5s or 500ms", "boolean": "true or false"}[m[2]]
		if m[1] == "database" {
			return "the database (its path) is not a number: redis://host:port/0"
		}
		return fmt.Sprintf("parameter %q is not %s", m[1], kind)
	}
	switch {
	case strings.Contains(msg, "invalid URL scheme"):
		return "its scheme is not redis://, rediss:// (TLS) or unix://"
	case strings.Contains(msg, "invalid URL path"), strings.Contains(msg, "database number"):
		return "the path is not a database number: redis://host:port/0"
	case strings.Contains(msg, "addr param"):
		return "an addr parameter is not host:port"
	case strings.Contains(msg, "unix socket path"):
		return "it names no socket: unix:///path/to/redis.sock"
	}
	return "go-redis cannot read it"
}

func quoteAll(ss []string) []string {
	out := make([]string, len(ss))
	for i, s := range ss {
		out[i] = fmt.Sprintf("%q", s)
	}
	return out
}

// tlsError is a failed TLS handshake. It is no net.Error, so that go-redis
// does not retry it as a time-out: a server that does not speak TLS never
// will, and the invocation should say so within one dial time-out.
type tlsError struct {
	addr string
	msg  string
	err  error
}

func (e *tlsError) Error() string { return e.msg }
func (e *tlsError) Unwrap() error { return e.err }

// plainServers remembers the addresses found to be Redis servers without
// TLS: go-redis dials five times before it gives up, and each failed
// handshake would cost a dial time-out more.
var plainServers sync.Map // addr -> error

// tlsDialer dials addr and makes the TLS handshake within timeout, as
// go-redis does for rediss://, but says what a failed handshake means.
func tlsDialer(timeout time.Duration, cfg *tls.Config) func(context.Context, string, string) (net.Conn, error) {
	if timeout <= 0 {
		timeout = 5 * time.Second // go-redis's default
	}
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		if err, ok := plainServers.Load(addr); ok {
			return nil, err.(error)
		}
		d := &net.Dialer{Timeout: timeout, KeepAlive: 5 * time.Minute}
		raw, err := d.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		c := cfg
		if c.ServerName == "" && !c.InsecureSkipVerify {
			c = cfg.Clone()
			c.ServerName, _, _ = net.SplitHostPort(addr)
		}
		conn := tls.Client(raw, c)
		hctx, cancel := context.WithTimeout(ctx, timeout)
		defer cancel()
		if err := conn.HandshakeContext(hctx); err != nil {
			_ = raw.Close()
			return nil, handshakeError(network, addr, timeout, err)
		}
		return conn, nil
	}
}

// handshakeError explains a failed TLS handshake with addr.
func handshakeError(network, addr string, timeout time.Duration, err error) error {
	var rec tls.RecordHeaderError
	var ne net.Error
	switch {
	case errors.As(err, &rec):
		e := &tlsError{addr, fmt.Sprintf("%s does not speak TLS: it answered the TLS handshake in plain text (for a server without TLS, write redis:// rather than rediss://)", addr), err}
		plainServers.Store(addr, e)
		return e
	case errors.Is(err, context.DeadlineExceeded) || errors.Is(err, os.ErrDeadlineExceeded) || errors.As(err, &ne) && ne.Timeout():
		// A Redis server without TLS waits for the end of a line that a
		// TLS hello never sends: ask it a plain PING to be sure.
		if speaksRESP(network, addr, timeout) {
			e := &tlsError{addr, fmt.Sprintf("%s is a Redis server without TLS: it answers a plain PING, and not the TLS handshake (write redis:// rather than rediss:// for it)", addr), err}
			plainServers.Store(addr, e)
			return e
		}
		return &tlsError{addr, fmt.Sprintf("%s does not answer the TLS handshake within %v (raise dial_timeout if it is a slow TLS server)", addr, timeout), err}
	}
	return &tlsError{addr, fmt.Sprintf("TLS handshake with %s: %v", addr, err), err}
}

// speaksRESP reports whether the server at addr answers a plain PING as
// Redis does, with a RESP reply (a password it wants counts).
func speaksRESP(network, addr string, timeout time.Duration) bool {
	c, err := net.DialTimeout(network, addr, timeout)
	if err != nil {
		return false
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(timeout))
	if _, err := c.Write([]byte("PING\r\n")); err != nil {
		return false
	}
	var b [1]byte
	if _, err := io.ReadFull(c, b[:]); err != nil {
		return false
	}
	return strings.IndexByte("+-:$*", b[0]) >= 0
}

// redisHint returns what an operator may do about err, a failure talking
// to the Redis server at raw (a --redis URL), as "; ...", or "".
func redisHint(err error, raw string) string {
	msg := err.Error()
	u, _ := url.Parse(raw)
	userOnly := false
	if u != nil && u.User != nil {
		_, hasPassword := u.User.Password()
		userOnly = !hasPassword
	}
	switch {
	case (strings.Contains(msg, "NOAUTH") || strings.Contains(msg, "WRONGPASS")) && userOnly:
		return "; the URL has a user name but no password: if that name is the password (redis-cli's redis://PASSWORD@host), write redis://:PASSWORD@host"
	case strings.Contains(msg, "NOAUTH"):
		return "; the server wants a password: redis://:PASSWORD@host, or redis://USER:PASSWORD@host for an ACL user"
	case strings.Contains(msg, "WRONGPASS"):
		return "; the user name or the password is wrong, or the user is disabled"
	case strings.Contains(msg, "NOPERM"), strings.Contains(msg, "user executing the script can't run"):
		if m := refusedCommand.FindStringSubmatch(msg); m != nil {
			rule := "+" + m[1]
			if rule == "+select" {
				return "; the Redis user may not run SELECT, which a database other than 0 in the URL needs: add +select to its ACL rules"
			}
			return "; the Redis user may not run " + strings.ToUpper(m[1]) + ": add " + rule + " to its ACL rules ('memolock check' names every rule a feature needs)"
		}
		return "; the Redis user lacks a permission: 'memolock check' names the ACL rules to add"
	case strings.Contains(msg, "MOVED "), strings.Contains(msg, "CROSSSLOT "):
		return "; this is a Redis Cluster: pass --cluster"
	}
	return ""
}

// libError returns the text of an error from the memolock library without
// its "memolock: " prefixes: the CLI's own prefix says where it comes from.
func libError(err error) string {
	msg := err.Error()
	for {
		rest, ok := strings.CutPrefix(msg, "memolock: ")
		if !ok {
			break
		}
		msg = rest
	}
	return strings.ReplaceAll(msg, ": memolock: ", ": ")
}
