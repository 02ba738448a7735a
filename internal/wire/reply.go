package wire

import (
	"strconv"
	"time"
)

// Kind tells what the acquire script answered.
type Kind uint8

const (
	Hit      Kind = iota + 1 // the value is in Redis
	Locked                   // we took the lock
	Busy                     // somebody holds the lock
	NotFound                 // fetch found nothing, and that is cached
	Refresh                  // the value is in Redis, and we took the lock to refresh it
)

// Reply is what the acquire script answered.
type Reply struct {
	Kind  Kind
	Value []byte // Hit and Refresh: the value; Busy: the stale copy, if any
	// Resurrected is set on a Hit whose value is a stale copy put back
	// after a failed fetch (see ResurrectSrc).
	Resurrected bool
	// PTTL is, when Busy, the holder's remaining lock time (negative: no
	// expiry), and when NotFound, the marker's; when Locked, the lock's
	// remaining time if the lock was found already ours, else negative.
	PTTL   time.Duration
	Holder string // Busy: the holder's token
	// ValueTTL is, on a Hit or Refresh asked for it, the value's remaining
	// time (negative: no expiry); HasTTL says it was asked for.
	ValueTTL time.Duration
	HasTTL   bool
	// Elsewhere says that the reply may come from another node than the
	// one the lookup was sent to (a cluster's redirection followed, or a
	// read during a slot's migration): what it says must not enter an L1
	// tied to that node's invalidations.
	Elsewhere bool
}

// DecodeAcquire reads the acquire script's reply. Replies stay raw bytes: a
// bulk "1" is a value, the integer 1 is the lock.
func DecodeAcquire(res any) (Reply, bool) {
	switch res := res.(type) {
	case string:
		return Reply{Kind: Hit, Value: []byte(res)}, true
	case int64:
		return Reply{Kind: Locked, PTTL: -1}, res == 1
	case []any:
		return decodeTable(res)
	}
	return Reply{}, false
}

func decodeTable(res []any) (Reply, bool) {
	switch {
	case len(res) == 1:
		pttl, ok := res[0].(int64)
		return Reply{Kind: NotFound, PTTL: MsDuration(pttl)}, ok
	case len(res) < 2:
		return Reply{}, false
	}
	if v, ok := res[0].(string); ok {
		return decodeHit(v, res)
	}
	pttl, ok1 := res[0].(int64)
	holder, ok2 := res[1].(string)
	if !ok1 {
		return Reply{}, false
	}
	if !ok2 {
		// The lock expired between PTTL and GET: look again at once.
		pttl = 0
	}
	r := Reply{Kind: Busy, PTTL: MsDuration(pttl), Holder: holder}
	if len(res) > 2 {
		if s, ok := res[2].(string); ok {
			r.Value = []byte(s)
		}
	}
	return r, true
}

// decodeHit reads a hit's table: {value, flag} or, asked for the TTL,
// {value, flag, value PTTL}.
func decodeHit(v string, res []any) (Reply, bool) {
	var r Reply
	switch flag, _ := res[1].(int64); flag {
	case 0:
		r = Reply{Kind: Hit, Value: []byte(v)}
	case 1:
		r = Reply{Kind: Refresh, Value: []byte(v)}
	case 2:
		r = Reply{Kind: Hit, Value: []byte(v), Resurrected: true}
	default:
		return Reply{}, false
	}
	switch {
	case len(res) == 3:
		pttl, ok := res[2].(int64)
		r.ValueTTL, r.HasTTL = MsDuration(pttl), ok
		return r, ok
	case r.Kind == Hit && !r.Resurrected:
		return Reply{}, false // {value, 0} is never sent
	}
	return r, true
}

// MaxPTTL bounds a remaining time read from Redis (about 290 years).
const MaxPTTL = time.Duration(1<<63 - 1 - int64(time.Millisecond))

// MsDuration turns a PTTL into a Duration, negative ones (no expiry) kept.
// The original Go peer renews with nanoseconds as seconds: a PTTL of
// centuries must not overflow into a negative Duration.
func MsDuration(ms int64) time.Duration {
	return time.Duration(min(ms, int64(MaxPTTL/time.Millisecond))) * time.Millisecond
}

// TTLMillis is a value TTL as the scripts take it: whole milliseconds, at
// least 1, or "0" for none.
func TTLMillis(ttl time.Duration) string {
	if ttl <= 0 {
		return "0"
	}
	return strconv.FormatInt(max(ttl.Milliseconds(), 1), 10)
}
