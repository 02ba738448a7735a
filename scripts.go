package memolock

import "github.com/redis/go-redis/v9"

// The whole protocol is these four scripts plus the key scheme. The same
// texts appear in interop/PROTOCOL.md, and a test keeps the two identical.
// Every script touches only the keys it declares; the channel travels as an
// argument, as PUBLISH channels are not keys.

// acquireSrc returns the value, or takes the lock, or reports who holds it.
// The reply's type tells which, so a hit, the hot path, returns the bare
// value with no table to build.
// KEYS: value, lock. ARGV: token, lock TTL in ms.
// Reply: value (bulk string) | 1 (integer: locked by us) | {lock PTTL in ms, holder token}.
const acquireSrc = `local v = redis.call('GET', KEYS[1])
if v then return v end
if redis.call('SET', KEYS[2], ARGV[1], 'NX', 'PX', ARGV[2]) then return 1 end
return {redis.call('PTTL', KEYS[2]), redis.call('GET', KEYS[2])}
`

// storeSrc stores the value, deletes the lock and publishes the value,
// but only while the lock still holds our token: a holder whose lease was
// lost never overwrites what an invalidation or a newer holder decided.
// KEYS: value, lock. ARGV: token, value, value TTL in ms (0: no expiry), channel.
// Reply: 1 stored, 0 lease lost.
const storeSrc = `if redis.call('GET', KEYS[2]) ~= ARGV[1] then return 0 end
if ARGV[3] == '0' then
  redis.call('SET', KEYS[1], ARGV[2])
else
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
end
redis.call('DEL', KEYS[2])
redis.call('PUBLISH', ARGV[4], ARGV[2])
return 1
`

// releaseSrc deletes the lock if it still holds our token and, if an
// event is given, publishes it on the events channel so that waiters need
// not wait for the lock to expire.
// KEYS: lock. ARGV: token, events channel, event (an empty one publishes nothing).
// Reply: 1 released, 0 not ours.
const releaseSrc = `if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1])
if ARGV[3] ~= '' then redis.call('PUBLISH', ARGV[2], ARGV[3]) end
return 1
`

// renewSrc makes the lock live at least TTL ms more if it still holds
// our token; it never shortens a lock. A TTL of 0 only checks.
// KEYS: lock. ARGV: token, TTL in ms.
// Reply: 1 held, 0 lost.
const renewSrc = `if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
local left = redis.call('PTTL', KEYS[1])
if left >= 0 and left < tonumber(ARGV[2]) then redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return 1
`

var (
	acquireScript = redis.NewScript(acquireSrc)
	storeScript   = redis.NewScript(storeSrc)
	releaseScript = redis.NewScript(releaseSrc)
	renewScript   = redis.NewScript(renewSrc)
)

// Events published on KeyScheme.Events, one line of kind, one of token, then
// free text: "fail\n<token>\n<message>" when the holder's fetch failed, and
// "abandon\n<token>\n" when the holder gave up the lock for another reason
// (its client closed) and a waiter should take over at once.
const (
	eventFail    = "fail"
	eventAbandon = "abandon"
)
