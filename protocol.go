package memolock

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/redis/go-redis/v9"
)

// The whole protocol is the key scheme (keyscheme.go), these four scripts,
// and the events below. interop/PROTOCOL.md quotes the scripts verbatim, and
// a test keeps the two identical. Every script touches only the keys it
// declares; channels travel as arguments, as PUBLISH channels are not keys.

// acquireSrc returns the value, or a cached "not found", or takes the lock,
// or reports who holds it. The reply's type tells which, so a hit, the hot
// path, returns the bare value with no table to build. A lock left done by
// a store (see storeSrc), or stale by a resurrection (see resurrectSrc),
// whose value is gone (deleted, evicted, expired) guards nothing: it is
// taken over at once.
//
// Two optional arguments ask for more on a hit, at the cost of reading the
// lock: with an early window, a value with less time left than that, and no
// lock on it (a done one counts: see Client.linger), is returned with the
// lock taken for a refresh ahead of expiry
// (Options.RefreshAhead); with the stale flag, a value that a resurrection
// put back is returned flagged stale, and a busy reply carries the stale
// copy of the value, if any (Options.StaleTTL).
// KEYS: value, lock, not-found marker, stale copy.
// ARGV: token, lock TTL in ms, early window in ms (optional, 0: none),
// stale flag (optional, "1": on).
// Reply: value (bulk string) | 1 (integer: locked by us) | {not-found PTTL}
// | {value, 1: locked by us for a refresh | 2: stale}
// | {lock PTTL in ms, holder token[, stale copy]}.
const acquireSrc = `local v = redis.call('GET', KEYS[1])
local early = tonumber(ARGV[3]) or 0
if v then
  if early < 1 and ARGV[4] ~= '1' then return v end
  local h = redis.call('GET', KEYS[2])
  if early >= 1 then
    if h == ARGV[1] then return {v, 1} end
    local left = redis.call('PTTL', KEYS[1])
    if not h and left >= 0 and left < early then
      redis.call('SET', KEYS[2], ARGV[1], 'PX', ARGV[2])
      return {v, 1}
    end
  end
  if h and string.sub(h, 1, 6) == 'stale:' then return {v, 2} end
  return v
end
local gone = redis.call('PTTL', KEYS[3])
if gone ~= -2 then return {gone} end
if redis.call('SET', KEYS[2], ARGV[1], 'NX', 'PX', ARGV[2]) then return 1 end
local holder = redis.call('GET', KEYS[2])
if holder and (string.sub(holder, 1, 5) == 'done:' or string.sub(holder, 1, 6) == 'stale:') then
  redis.call('SET', KEYS[2], ARGV[1], 'PX', ARGV[2])
  return 1
end
if ARGV[4] == '1' then return {redis.call('PTTL', KEYS[2]), holder, redis.call('GET', KEYS[4])} end
return {redis.call('PTTL', KEYS[2]), holder}
`

// storeSrc stores the value and publishes it, but only while the lock still
// holds our token: a holder whose lease was lost never overwrites what an
// invalidation or a newer holder decided. Then it publishes an abandon event
// instead, so that waiters look again at once. A retry of a store that
// already ran finds its own value in place and answers 1 again.
//
// The lock is not deleted but kept for a short linger as "done:<token>", and
// never longer than the value: an original redis-memolock peer looks up with
// GET then SET NX, and one whose GET missed just before the store would
// otherwise win the freed lock and compute again. A memolock lookup reads
// the value first, and takes over a done lock whose value is gone, so the
// lingering lock costs memolock peers nothing. A linger under 1 ms deletes
// the lock.
//
// A "not found" recorded earlier goes. With a stale time, a copy of the
// value is kept for that much longer than the value (Options.StaleTTL);
// without one, an older copy goes, so that a copy is never older than the
// value last stored.
// KEYS: value, lock, not-found marker, stale copy. ARGV: token, value,
// value TTL in ms (0: no expiry), value channel, events channel, linger in
// ms, stale time in ms (optional, 0: none).
// Reply: 1 stored, 0 lease lost.
const storeSrc = `if redis.call('GET', KEYS[2]) ~= ARGV[1] then
  if redis.call('GET', KEYS[1]) == ARGV[2] then return 1 end
  redis.call('PUBLISH', ARGV[5], 'abandon\n' .. ARGV[1] .. '\n')
  return 0
end
local linger = tonumber(ARGV[6]) or 0
local ttl = tonumber(ARGV[3])
if ttl == 0 then
  redis.call('SET', KEYS[1], ARGV[2])
else
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ttl)
  linger = math.min(linger, ttl)
end
if linger >= 1 then
  redis.call('SET', KEYS[2], 'done:' .. ARGV[1], 'PX', linger)
else
  redis.call('DEL', KEYS[2])
end
local stale = tonumber(ARGV[7]) or 0
if stale >= 1 and ttl > 0 then
  redis.call('SET', KEYS[4], ARGV[2], 'PX', ttl + stale)
else
  redis.call('DEL', KEYS[4])
end
redis.call('DEL', KEYS[3])
redis.call('PUBLISH', ARGV[4], ARGV[2])
return 1
`

// releaseSrc deletes the lock if it still holds our token and, if an event
// is given, publishes it on the events channel so that waiters need not
// wait for the lock to expire. With a linger, it keeps the lock as
// "done:<token>" instead, as the store script does, for at most as long as
// the value has left (and deletes it if there is no value): a winner in
// external mode releases so once the value has arrived.
// KEYS: lock, value. ARGV: token, events channel, event (an empty one
// publishes nothing), linger in ms (0: delete).
// Reply: 1 released, 0 not ours.
const releaseSrc = `if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
local linger = tonumber(ARGV[4]) or 0
if linger >= 1 then
  local left = redis.call('PTTL', KEYS[2])
  if left == -2 then linger = 0 elseif left >= 0 then linger = math.min(linger, left) end
end
if linger >= 1 then
  redis.call('SET', KEYS[1], 'done:' .. ARGV[1], 'PX', linger)
else
  redis.call('DEL', KEYS[1])
end
if ARGV[3] ~= '' then redis.call('PUBLISH', ARGV[2], ARGV[3]) end
return 1
`

// renewSrc makes the lock live at least TTL ms more if it still holds our
// token; it never shortens a lock. A TTL of 0 only checks. A lock found
// lost is reported to waiters with an abandon event.
// KEYS: lock. ARGV: token, TTL in ms, events channel.
// Reply: 1 held, 0 lost.
const renewSrc = `if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  redis.call('PUBLISH', ARGV[3], 'abandon\n' .. ARGV[1] .. '\n')
  return 0
end
local left = redis.call('PTTL', KEYS[1])
if left >= 0 and left < tonumber(ARGV[2]) then redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return 1
`

// publishSrc hands a value to waiters without storing it (a fetch that
// returned a negative TTL): it deletes the lock and publishes the value,
// but only while the lock still holds our token; otherwise it tells
// waiters the lock is gone, as store does.
// KEYS: lock. ARGV: token, value, value channel, events channel.
// Reply: 1 published, 0 lease lost.
const publishSrc = `if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  redis.call('PUBLISH', ARGV[4], 'abandon\n' .. ARGV[1] .. '\n')
  return 0
end
redis.call('DEL', KEYS[1])
redis.call('PUBLISH', ARGV[3], ARGV[2])
return 1
`

// notFoundSrc records that fetch found nothing (Options.NegTTL), if the
// lock still holds our token: the marker is set for the negative TTL (or
// deleted when 0), then the value, its stale copy and the lock go, and
// waiters get a notfound event. The one command that can refuse its
// arguments (a TTL out of range) runs first, as scripts do not roll back.
// Otherwise it tells waiters the lock is gone, as store does.
// KEYS: value, lock, not-found marker, stale copy. ARGV: token, negative
// TTL in ms (0: do not record), events channel.
// Reply: 1 done, 0 lease lost.
const notFoundSrc = `if redis.call('GET', KEYS[2]) ~= ARGV[1] then
  redis.call('PUBLISH', ARGV[3], 'abandon\n' .. ARGV[1] .. '\n')
  return 0
end
if (tonumber(ARGV[2]) or 0) >= 1 then
  redis.call('SET', KEYS[3], '', 'PX', ARGV[2])
else
  redis.call('DEL', KEYS[3])
end
redis.call('DEL', KEYS[1], KEYS[2], KEYS[4])
redis.call('PUBLISH', ARGV[3], 'notfound\n' .. ARGV[1] .. '\n')
return 1
`

// resurrectSrc serves the stale copy of a value whose fetch failed
// (Options.StaleTTL), if the lock still holds our token and the copy is
// there: the copy goes back into the value key for the resurrection time,
// the lock stays that long as "stale:<token>" (a lookup then flags the
// value stale, and nobody computes it before the time is up), and waiters
// get a stale event, on which they look again. The copy keeps its own
// expiry.
// KEYS: value, lock, stale copy. ARGV: token, resurrection time in ms,
// events channel.
// Reply: the stale value | nil (lease lost, or no copy: nothing changed).
const resurrectSrc = `if redis.call('GET', KEYS[2]) ~= ARGV[1] then return false end
local s = redis.call('GET', KEYS[3])
if not s then return false end
redis.call('SET', KEYS[1], s, 'PX', ARGV[2])
redis.call('SET', KEYS[2], 'stale:' .. ARGV[1], 'PX', ARGV[2])
redis.call('PUBLISH', ARGV[3], 'stale\n' .. ARGV[1] .. '\n')
return s
`

// The control scripts: Delete, Set and Peek. Peers need none of them to
// interoperate; they only use the keys and channels above.

// deleteSrc deletes the value, its stale copy, a cached "not found" and
// the lock, so that a computation under way can never store afterwards
// (its store finds its token gone), and tells the waiters of that holder to
// look again.
// KEYS: value, lock, not-found marker, stale copy. ARGV: events channel.
// Reply: 1 if a value was deleted, else 0.
const deleteSrc = `local holder = redis.call('GET', KEYS[2])
local n = redis.call('DEL', KEYS[1])
redis.call('DEL', KEYS[2], KEYS[3], KEYS[4])
if holder and string.sub(holder, 1, 5) ~= 'done:' and string.sub(holder, 1, 6) ~= 'stale:' then
  redis.call('PUBLISH', ARGV[1], 'abandon\n' .. holder .. '\n')
end
return n
`

// setSrc writes a value as a store does, whoever holds the lock: the lock
// becomes "done:<token>" (killing any lease in flight, whose store then
// refuses), a cached "not found" goes, a stale copy is kept or dropped as
// store does, and the value is published to waiters.
// KEYS: value, lock, not-found marker, stale copy. ARGV: token, value,
// value TTL in ms (0: no expiry), value channel, linger in ms, stale time
// in ms (0: none).
// Reply: 1.
const setSrc = `local linger = tonumber(ARGV[5]) or 0
local ttl = tonumber(ARGV[3])
if ttl == 0 then
  redis.call('SET', KEYS[1], ARGV[2])
else
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ttl)
  linger = math.min(linger, ttl)
end
if linger >= 1 then
  redis.call('SET', KEYS[2], 'done:' .. ARGV[1], 'PX', linger)
else
  redis.call('DEL', KEYS[2])
end
local stale = tonumber(ARGV[6]) or 0
if stale >= 1 and ttl > 0 then
  redis.call('SET', KEYS[4], ARGV[2], 'PX', ttl + stale)
else
  redis.call('DEL', KEYS[4])
end
redis.call('DEL', KEYS[3])
redis.call('PUBLISH', ARGV[4], ARGV[2])
return 1
`

// peekSrc reads the value, the lock, the not-found marker and the stale
// copy, with their PTTLs, at one instant.
// KEYS: value, lock, not-found marker, stale copy.
// Reply: {value or nil, value PTTL, holder or nil, lock PTTL, marker PTTL,
// stale copy or nil, copy PTTL}.
const peekSrc = `return {redis.call('GET', KEYS[1]), redis.call('PTTL', KEYS[1]), redis.call('GET', KEYS[2]), redis.call('PTTL', KEYS[2]),
  redis.call('PTTL', KEYS[3]), redis.call('GET', KEYS[4]), redis.call('PTTL', KEYS[4])}
`

var (
	// acquire and peek publish nothing: one form serves both.
	acquireScript = redis.NewScript(acquireSrc)
	peekScript    = redis.NewScript(peekSrc)

	plainScripts   = newScripts(false)
	shardedScripts = newScripts(true)
)

// scripts are the scripts that publish, in one of two forms: with PUBLISH,
// or, for sharded pub/sub on a cluster, with SPUBLISH in its place (the
// channels of an id are in its keys' slot: see Options.HashTags).
type scripts struct {
	sharded                                                       bool
	store, release, renew, publish, del, set, notFound, resurrect *redis.Script
}

func newScripts(sharded bool) *scripts {
	mk := func(src string) *redis.Script {
		if sharded {
			src = shardedSrc(src)
		}
		return redis.NewScript(src)
	}
	return &scripts{sharded: sharded, store: mk(storeSrc), release: mk(releaseSrc), renew: mk(renewSrc),
		publish: mk(publishSrc), del: mk(deleteSrc), set: mk(setSrc), notFound: mk(notFoundSrc), resurrect: mk(resurrectSrc)}
}

// shardedSrc is src with SPUBLISH for PUBLISH.
func shardedSrc(src string) string {
	return strings.ReplaceAll(src, "redis.call('PUBLISH', ", "redis.call('SPUBLISH', ")
}

// lockLinger is how long a lock outlives a stored value (at most as long as
// the value): see storeSrc.
const lockLinger = time.Second

// maxPTTL bounds a lock's remaining time as a Duration (about 290 years).
const maxPTTL = time.Duration(1<<63 - 1 - int64(time.Millisecond))

// replyKind tells what acquire answered.
type replyKind uint8

const (
	replyHit      replyKind = iota + 1 // the value is in Redis
	replyLocked                        // we took the lock
	replyBusy                          // somebody holds the lock
	replyNotFound                      // fetch found nothing, and that is cached
	replyRefresh                       // the value is in Redis, and we took the lock to refresh it
)

// reply is what the acquire script answered.
type reply struct {
	kind   replyKind
	value  []byte        // when hit or refresh; the stale copy, if any, when busy
	stale  bool          // when hit: the value is a stale one put back
	pttl   time.Duration // when busy: the holder's remaining lock time; <0: no expiry. When not found: the marker's.
	holder string        // when busy: the holder's token
}

// protocol makes the protocol's calls for one tag. Acquire goes through the
// batcher; the others are rare enough to go straight to Redis.
type protocol struct {
	rdb   redis.UniversalClient
	keys  KeyScheme
	sc    *scripts
	batch *batcher
	stale time.Duration // Options.StaleTTL
	early time.Duration // Options.RefreshAhead
}

// linger is how long the lock stays done after a store or set of a value
// with ttl (see storeSrc). With RefreshAhead, the done lock also keeps a
// new value from being refreshed before it is due: it lasts until the
// value enters the window, and a value whose TTL is under twice the window
// keeps it for its whole life, so that it expires as usual instead of
// being refreshed again and again.
func (p *protocol) linger(ttl time.Duration) time.Duration {
	if p.early == 0 || ttl <= 0 {
		return lockLinger
	}
	if ttl <= 2*p.early {
		return ttl
	}
	return min(lockLinger, ttl-p.early)
}

// idKeys returns the four keys of id that the scripts take: value, lock,
// not-found marker and stale copy.
func (p *protocol) idKeys(id string) []string {
	return []string{p.keys.Value(id), p.keys.Lock(id), p.keys.NotFound(id), p.keys.Stale(id)}
}

// acquire runs the acquire script with token. A busy reply that names token
// itself (a retry of an attempt whose reply was lost) is turned into
// replyLocked, with the lock's remaining time in pttl. early asks for a
// refresh ahead of expiry (0: none).
func (p *protocol) acquire(ctx context.Context, id, token string, lockTTL, early time.Duration) (reply, error) {
	args := []any{token, lockTTL.Milliseconds()}
	if early > 0 || p.stale > 0 {
		flag := "0"
		if p.stale > 0 {
			flag = "1"
		}
		args = append(args, early.Milliseconds(), flag)
	}
	res, err := p.batch.run(ctx, p.idKeys(id), args...)
	if err != nil {
		return reply{}, fmt.Errorf("%w: reading %s: %w", ErrRedis, quote(p.keys.Value(id)), err)
	}
	r, ok := decodeAcquire(res)
	if !ok {
		return reply{}, fmt.Errorf("%w: reading %s: unexpected script reply %v", ErrRedis, quote(p.keys.Value(id)), res)
	}
	if r.kind == replyBusy && r.holder == token {
		r.kind = replyLocked
	}
	return r, nil
}

// decodeAcquire reads the acquire script's reply. Replies stay raw bytes: a
// bulk "1" is a value, the integer 1 is the lock.
func decodeAcquire(res any) (reply, bool) {
	switch res := res.(type) {
	case string:
		return reply{kind: replyHit, value: []byte(res)}, true
	case int64:
		return reply{kind: replyLocked, pttl: -1}, res == 1
	case []any:
		if len(res) == 1 {
			pttl, ok := res[0].(int64)
			return reply{kind: replyNotFound, pttl: msDuration(pttl)}, ok
		}
		if len(res) < 2 {
			return reply{}, false
		}
		if v, ok := res[0].(string); ok {
			switch flag, _ := res[1].(int64); flag {
			case 1:
				return reply{kind: replyRefresh, value: []byte(v)}, true
			case 2:
				return reply{kind: replyHit, value: []byte(v), stale: true}, true
			}
			return reply{}, false
		}
		pttl, ok1 := res[0].(int64)
		holder, ok2 := res[1].(string)
		if !ok1 {
			return reply{}, false
		}
		if !ok2 {
			// The lock expired between PTTL and GET: look again at once.
			pttl = 0
		}
		r := reply{kind: replyBusy, pttl: msDuration(pttl), holder: holder}
		if len(res) > 2 {
			if s, ok := res[2].(string); ok {
				r.value = []byte(s)
			}
		}
		return r, true
	}
	return reply{}, false
}

// msDuration turns a PTTL into a Duration, negative ones (no expiry) kept.
// The original Go peer renews with nanoseconds as seconds: a PTTL of
// centuries must not overflow into a negative Duration.
func msDuration(ms int64) time.Duration {
	return time.Duration(min(ms, int64(maxPTTL/time.Millisecond))) * time.Millisecond
}

// store runs the store script. It reports whether the value is stored; when
// it is not, the lease was lost and the script told waiters so.
func (p *protocol) store(ctx context.Context, id, token string, val []byte, ttl time.Duration) (bool, error) {
	n, err := p.sc.store.Run(ctx, p.rdb, p.idKeys(id), token, val, ttlMillis(ttl),
		p.keys.Notif(id), p.keys.Events(id), p.linger(ttl).Milliseconds(), p.stale.Milliseconds()).Int()
	if err != nil {
		return false, fmt.Errorf("%w: storing %s: %w", ErrRedis, quote(p.keys.Value(id)), err)
	}
	return n == 1, nil
}

// publish runs the publish script: val goes to waiters, not into Redis.
// It reports whether the lease still held.
func (p *protocol) publish(ctx context.Context, id, token string, val []byte) (bool, error) {
	n, err := p.sc.publish.Run(ctx, p.rdb, []string{p.keys.Lock(id)}, token, val, p.keys.Notif(id), p.keys.Events(id)).Int()
	if err != nil {
		return false, fmt.Errorf("%w: publishing %s: %w", ErrRedis, quote(p.keys.Notif(id)), err)
	}
	return n == 1, nil
}

// notFound runs the not-found script: fetch found nothing, which is
// recorded for negTTL (0: not at all). It reports whether the lease still
// held.
func (p *protocol) notFound(ctx context.Context, id, token string, negTTL time.Duration) (bool, error) {
	n, err := p.sc.notFound.Run(ctx, p.rdb, p.idKeys(id), token, negTTL.Milliseconds(), p.keys.Events(id)).Int()
	if err != nil {
		return false, fmt.Errorf("%w: recording %s as not found: %w", ErrRedis, quote(p.keys.Value(id)), err)
	}
	return n == 1, nil
}

// resurrect runs the resurrect script: it returns the stale copy, now put
// back for d, or false if there is none or the lease was lost.
func (p *protocol) resurrect(ctx context.Context, id, token string, d time.Duration) ([]byte, bool, error) {
	v, err := p.sc.resurrect.Run(ctx, p.rdb, []string{p.keys.Value(id), p.keys.Lock(id), p.keys.Stale(id)},
		token, d.Milliseconds(), p.keys.Events(id)).Text()
	switch {
	case err == redis.Nil:
		return nil, false, nil
	case err != nil:
		return nil, false, fmt.Errorf("%w: serving the stale copy of %s: %w", ErrRedis, quote(p.keys.Value(id)), err)
	}
	return []byte(v), true, nil
}

// release deletes the lock if it still holds token (or, with a linger,
// keeps it as done for at most that long, see releaseSrc), and publishes
// event. It reports whether it did.
func (p *protocol) release(ctx context.Context, id, token, event string, linger time.Duration) (bool, error) {
	n, err := p.sc.release.Run(ctx, p.rdb, []string{p.keys.Lock(id), p.keys.Value(id)}, token, p.keys.Events(id), event, linger.Milliseconds()).Int()
	if err != nil {
		return false, fmt.Errorf("%w: releasing %s: %w", ErrRedis, quote(p.keys.Lock(id)), err)
	}
	return n == 1, nil
}

// abandoned tells waiters that the lock with token is gone, whoever holds
// the lock now: waiters of another holder ignore it.
func (p *protocol) abandoned(ctx context.Context, id, token string) error {
	publish := p.rdb.Publish
	if p.sc.sharded {
		publish = p.rdb.SPublish
	}
	if err := publish(ctx, p.keys.Events(id), abandonEvent(token)).Err(); err != nil {
		return fmt.Errorf("%w: publishing on %s: %w", ErrRedis, quote(p.keys.Events(id)), err)
	}
	return nil
}

// renew runs the renew script: rdb is all a Lease needs.
func renew(ctx context.Context, sc *scripts, rdb redis.Scripter, lock, events, token string, ttl time.Duration) (bool, error) {
	n, err := sc.renew.Run(ctx, rdb, []string{lock}, token, ttl.Milliseconds(), events).Int()
	if err != nil {
		return false, fmt.Errorf("%w: renewing lock %s: %w", ErrRedis, quote(lock), err)
	}
	return n == 1, nil
}

// Events published on KeyScheme.Events, one line of kind, one of token, then
// free text: "fail\n<token>\n<message>" when the holder's fetch failed, and
// "abandon\n<token>\n" when the holder gave up or lost the lock without a
// value and a waiter should look again at once.
const (
	eventFail     = "fail"
	eventAbandon  = "abandon"
	eventNotFound = "notfound"
	eventStale    = "stale"
)

// maxEventText bounds the message of a fail event.
const maxEventText = 4096

func abandonEvent(token string) string { return eventAbandon + "\n" + token + "\n" }

// failEvent reports err to waiters in other processes: its first line (a
// panic's stack stays local), at most maxEventText bytes, cut at a UTF-8
// boundary.
func failEvent(token string, err error) string {
	msg, _, _ := strings.Cut(err.Error(), "\n")
	return eventFail + "\n" + token + "\n" + truncateUTF8(msg, maxEventText)
}

// parseEvent splits an event payload into kind, token and text.
func parseEvent(p string) (kind, token, text string) {
	kind, rest, _ := strings.Cut(p, "\n")
	token, text, _ = strings.Cut(rest, "\n")
	return kind, token, text
}

// truncateUTF8 cuts s to at most n bytes without splitting a character.
func truncateUTF8(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

// quote quotes a key or id for an error message, cut to a readable length.
func quote(s string) string {
	if len(s) > 80 {
		return strconv.Quote(truncateUTF8(s, 80)) + "..."
	}
	return strconv.Quote(s)
}
