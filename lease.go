package memolock

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// A Lease is the right to compute one value: the lock key holding our token.
// The Client renews it while fetch runs; fetch may also check or extend it,
// for example before a long step or in external-producer mode.
//
// Methods on a nil *Lease, which fetch receives when Options.FailOpen ran it
// without a lock, report ErrLeaseLost.
type Lease struct {
	sc     *scripts
	rdb    redis.Scripter
	id     string // as sent to Redis
	lock   string // the lock key
	events string // the events channel, told when the lease is found lost
	token  string
}

// ID returns the id the lease is for, as sent to Redis.
func (l *Lease) ID() string {
	if l == nil {
		return ""
	}
	return l.id
}

// Token returns the value stored in the lock: 128 random bits in hex, then
// "@host:pid" of the holder for diagnostics, then, when the flight's Get is
// traced, "/" and its fetch span's W3C traceparent (interop/PROTOCOL.md,
// Token).
func (l *Lease) Token() string {
	if l == nil {
		return ""
	}
	return l.token
}

// Held reports whether the lock still holds the lease's token. A lease
// found lost is reported to waiters, so that they look again at once.
func (l *Lease) Held(ctx context.Context) (bool, error) {
	if l == nil {
		return false, nil
	}
	return renew(ctx, l.sc, l.rdb, l.lock, l.events, l.token, 0)
}

// Extend makes the lock live at least ttl from now. It never shortens the
// lock. It returns ErrLeaseLost if the lock no longer holds our token.
func (l *Lease) Extend(ctx context.Context, ttl time.Duration) error {
	if ttl < time.Millisecond {
		return fmt.Errorf("%w: lease extension %v is under 1ms", ErrInvalid, ttl)
	}
	if l == nil {
		return ErrLeaseLost
	}
	held, err := renew(ctx, l.sc, l.rdb, l.lock, l.events, l.token, ttl)
	if err == nil && !held {
		err = ErrLeaseLost
	}
	return err
}

// holderSuffix is appended to every token: "@host:pid".
var holderSuffix = func() string {
	host, _ := os.Hostname()
	return hostSuffix(host) + strconv.Itoa(os.Getpid())
}()

// hostSuffix returns "@host:" with the host reduced to characters that are
// safe in logs and in event payloads: every other character (not byte)
// becomes '_'.
func hostSuffix(host string) string {
	host = strings.Map(func(r rune) rune {
		if r == '.' || r == '-' || r == '_' || r >= '0' && r <= '9' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' {
			return r
		}
		return '_'
	}, host)
	if host == "" {
		host = "unknown"
	}
	return "@" + host + ":"
}

// newToken returns a token unique to one flight.
func newToken() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails on supported platforms
	return hex.EncodeToString(b[:]) + holderSuffix
}
