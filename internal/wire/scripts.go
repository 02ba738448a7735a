package wire

import (
	"strings"

	"github.com/redis/go-redis/v9"
)

// The scripts, quoted verbatim in interop/PROTOCOL.md (a test keeps the two
// identical). Every script touches only the keys it declares; channels travel
// as arguments, as PUBLISH channels are not keys.

// AcquireSrc returns the value, or a cached "not found", or takes the lock,
// or reports who holds it. The reply's type tells which, so a hit, the hot
// path, returns the bare value with no table to build. A lock left done by
// a store (see StoreSrc), or stale by a resurrection (see ResurrectSrc),
// whose value is gone (deleted, evicted, expired) guards nothing: it is
// taken over at once.
//
// Optional arguments ask for more on a hit, at the cost of reading the lock
// (or the value's PTTL): with an early window, a value with less time left
// than that, and no lock on it (a done one counts: see Protocol.Linger), is
// returned with the lock taken for a refresh ahead of expiry
// (Options.RefreshAhead); with the stale flag, a value that a resurrection
// put back is returned flagged stale, and a busy reply carries the stale
// copy of the value, if any (Options.StaleTTL); with the TTL flag, a hit
// comes with the value's PTTL, so that it can enter an L1 without a second
// round trip (Options.L1Size).
// KEYS: value, lock, not-found marker, stale copy.
// ARGV: token, lock TTL in ms, early window in ms (optional, 0: none),
// stale flag (optional, "1": on), TTL flag (optional, "1": on).
// Reply: value (bulk string) | 1 (integer: locked by us) | {not-found PTTL}
// | {value, 1: locked by us for a refresh | 2: stale}
// | with the TTL flag, every hit: {value, 0 | 1 | 2 as above, value PTTL}
// | {lock PTTL in ms, holder token[, stale copy]}.
const AcquireSrc = `local v = redis.call('GET', KEYS[1])
local early = tonumber(ARGV[3]) or 0
if v then
  local flag = 0
  if early >= 1 or ARGV[4] == '1' then
    local h = redis.call('GET', KEYS[2])
    if early >= 1 then
      if h == ARGV[1] then
        flag = 1
      else
        local left = redis.call('PTTL', KEYS[1])
        if not h and left >= 0 and left < early then
          redis.call('SET', KEYS[2], ARGV[1], 'PX', ARGV[2])
          flag = 1
        end
      end
    end
    if flag == 0 and h and string.sub(h, 1, 6) == 'stale:' then flag = 2 end
  end
  if ARGV[5] == '1' then return {v, flag, redis.call('PTTL', KEYS[1])} end
  if flag == 0 then return v end
  return {v, flag}
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

// StoreSrc stores the value and publishes it, but only while the lock still
// holds our token: a holder whose lease was lost never overwrites what an
// invalidation or a newer holder decided. Then it publishes an abandon event
// instead, so that waiters look again at once. A retry of a store that
// already ran finds its own value in place and answers 1 again. (So does a
// lost lease whose next holder stored a value equal to ours: the value in
// place is then the one we would have stored, and that holder published it,
// so nothing is lost by calling it stored.)
//
// The lock is not deleted but kept for a short linger as "done:<token>", and
// never longer than the value: an original redis-memolock peer looks up with
// GET then SET NX, and one whose GET missed just before the store would
// otherwise win the freed lock and compute again. A memolock lookup reads
// the value first, and takes over a done lock whose value is gone, so the
// lingering lock costs memolock peers nothing. A linger under 1 ms deletes
// the lock.
//
// Redis before 7.2 reckons each PX from its clock when the command runs,
// also inside a script, so a lock set after the value could outlive it by
// the time between the two: a tick, or however long Redis stalled. So the
// script then reads the lock's PTTL and the value's, in that order (a
// stall between the two reads can only make the value's look shorter):
// the lock outlives a value with 1 ms or more left only if its PTTL is the
// longer, and then it is cut to the value's PTTL and checked again, or
// else deleted. A value that reads 0 (PTTL never reads less, even for a
// key that expired while the script ran) takes the lock with it. This uses
// no command beyond those of the other scripts (see the README's least
// privilege rules), where TIME and PEXPIREAT would need more. The value is
// written first, as its SET is the command that can refuse a conforming
// peer's argument (a TTL out of range), and scripts do not roll back.
//
// A "not found" recorded earlier goes. With a stale time, a copy of the
// value is kept for that much longer than the value (Options.StaleTTL);
// without one, an older copy goes, so that a copy is never older than the
// value last stored.
// KEYS: value, lock, not-found marker, stale copy. ARGV: token, value,
// value TTL in ms (0: no expiry), value channel, events channel, linger in
// ms, stale time in ms (optional, 0: none).
// Reply: 1 stored, 0 lease lost.
const StoreSrc = `if redis.call('GET', KEYS[2]) ~= ARGV[1] then
  if redis.call('GET', KEYS[1]) == ARGV[2] then return 1 end
  redis.call('PUBLISH', ARGV[5], 'abandon\n' .. ARGV[1] .. '\n')
  return 0
end
local ttl = tonumber(ARGV[3])
if ttl == 0 then
  redis.call('SET', KEYS[1], ARGV[2])
else
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ttl)
end
local linger = tonumber(ARGV[6]) or 0
if ttl > 0 then linger = math.min(linger, ttl) end
if linger >= 1 then
  redis.call('SET', KEYS[2], 'done:' .. ARGV[1], 'PX', linger)
  if ttl > 0 then
    for i = 1, 2 do
      local lock = redis.call('PTTL', KEYS[2])
      local left = redis.call('PTTL', KEYS[1])
      if left < 1 or (i == 2 and lock > left) then
        redis.call('DEL', KEYS[2])
        break
      end
      if lock <= left then break end
      redis.call('PEXPIRE', KEYS[2], left)
    end
  end
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

// ReleaseSrc deletes the lock if it still holds our token and, if an event
// is given, publishes it on the events channel so that waiters need not
// wait for the lock to expire. With a linger, it keeps the lock as
// "done:<token>" instead, as the store script does, for at most as long as
// the value has left (and deletes it if there is no value): a winner in
// external mode releases so once the value has arrived. As in store, the
// lock's PTTL and the value's are then read and compared, so that no time
// passing inside the script makes the lock outlive the value.
// KEYS: lock, value. ARGV: token, events channel, event (an empty one
// publishes nothing), linger in ms (0: delete).
// Reply: 1 released, 0 not ours.
const ReleaseSrc = `if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
local linger = tonumber(ARGV[4]) or 0
local left = -1
if linger >= 1 then
  left = redis.call('PTTL', KEYS[2])
  if left == -2 then linger = 0 elseif left >= 0 then linger = math.min(linger, left) end
end
if linger >= 1 then
  redis.call('SET', KEYS[1], 'done:' .. ARGV[1], 'PX', linger)
  if left >= 0 then
    for i = 1, 2 do
      local lock = redis.call('PTTL', KEYS[1])
      left = redis.call('PTTL', KEYS[2])
      if left < 1 or (i == 2 and lock > left) then
        redis.call('DEL', KEYS[1])
        break
      end
      if lock <= left then break end
      redis.call('PEXPIRE', KEYS[1], left)
    end
  end
else
  redis.call('DEL', KEYS[1])
end
if ARGV[3] ~= '' then redis.call('PUBLISH', ARGV[2], ARGV[3]) end
return 1
`

// RenewSrc makes the lock live at least TTL ms more if it still holds our
// token; it never shortens a lock. A TTL of 0 only checks. A lock found
// lost is reported to waiters with an abandon event.
// KEYS: lock. ARGV: token, TTL in ms, events channel.
// Reply: 1 held, 0 lost.
const RenewSrc = `if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  redis.call('PUBLISH', ARGV[3], 'abandon\n' .. ARGV[1] .. '\n')
  return 0
end
local left = redis.call('PTTL', KEYS[1])
if left >= 0 and left < tonumber(ARGV[2]) then redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return 1
`

// PublishSrc hands a value to waiters without storing it (a fetch that
// returned a negative TTL): it deletes the lock and publishes the value,
// but only while the lock still holds our token; otherwise it tells
// waiters the lock is gone, as store does.
// KEYS: lock. ARGV: token, value, value channel, events channel.
// Reply: 1 published, 0 lease lost.
const PublishSrc = `if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  redis.call('PUBLISH', ARGV[4], 'abandon\n' .. ARGV[1] .. '\n')
  return 0
end
redis.call('DEL', KEYS[1])
redis.call('PUBLISH', ARGV[3], ARGV[2])
return 1
`

// NotFoundSrc records that fetch found nothing (Options.NegTTL), if the
// lock still holds our token: the marker is set for the negative TTL (or
// deleted when 0), then the value, its stale copy and the lock go, and
// waiters get a notfound event. The one command that can refuse its
// arguments (a TTL out of range) runs first, as scripts do not roll back.
// Otherwise it tells waiters the lock is gone, as store does.
// KEYS: value, lock, not-found marker, stale copy. ARGV: token, negative
// TTL in ms (0: do not record), events channel.
// Reply: 1 done, 0 lease lost.
const NotFoundSrc = `if redis.call('GET', KEYS[2]) ~= ARGV[1] then
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

// ResurrectSrc serves the stale copy of a value whose fetch failed
// (Options.StaleTTL), if the lock still holds our token and the copy is
// there: the copy goes back into the value key for the resurrection time,
// the lock stays that long as "stale:<token>" (a lookup then flags the
// value stale, and nobody computes it before the time is up), and waiters
// get a stale event, on which they look again. The copy keeps its own
// expiry.
// KEYS: value, lock, stale copy. ARGV: token, resurrection time in ms,
// events channel.
// Reply: the stale value | nil (lease lost, or no copy: nothing changed).
const ResurrectSrc = `if redis.call('GET', KEYS[2]) ~= ARGV[1] then return false end
local s = redis.call('GET', KEYS[3])
if not s then return false end
redis.call('SET', KEYS[1], s, 'PX', ARGV[2])
redis.call('SET', KEYS[2], 'stale:' .. ARGV[1], 'PX', ARGV[2])
redis.call('PUBLISH', ARGV[3], 'stale\n' .. ARGV[1] .. '\n')
return s
`

// The control scripts: Delete, Set and Peek. Peers need none of them to
// interoperate; they only use the keys and channels above.

// DeleteSrc deletes the value, its stale copy, a cached "not found" and
// the lock, so that a computation under way can never store afterwards
// (its store finds its token gone), and tells the waiters of that holder to
// look again.
// KEYS: value, lock, not-found marker, stale copy. ARGV: events channel.
// Reply: 1 if a value was deleted, else 0.
const DeleteSrc = `local holder = redis.call('GET', KEYS[2])
local n = redis.call('DEL', KEYS[1])
redis.call('DEL', KEYS[2], KEYS[3], KEYS[4])
if holder and string.sub(holder, 1, 5) ~= 'done:' and string.sub(holder, 1, 6) ~= 'stale:' then
  redis.call('PUBLISH', ARGV[1], 'abandon\n' .. holder .. '\n')
end
return n
`

// SetSrc writes a value as a store does, whoever holds the lock: the lock
// becomes "done:<token>" (killing any lease in flight, whose store then
// refuses), a cached "not found" goes, a stale copy is kept or dropped as
// store does, and the value is published to waiters.
// KEYS: value, lock, not-found marker, stale copy. ARGV: token, value,
// value TTL in ms (0: no expiry), value channel, linger in ms, stale time
// in ms (0: none).
// Reply: 1.
const SetSrc = `local ttl = tonumber(ARGV[3])
if ttl == 0 then
  redis.call('SET', KEYS[1], ARGV[2])
else
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ttl)
end
local linger = tonumber(ARGV[5]) or 0
if ttl > 0 then linger = math.min(linger, ttl) end
if linger >= 1 then
  redis.call('SET', KEYS[2], 'done:' .. ARGV[1], 'PX', linger)
  if ttl > 0 then
    for i = 1, 2 do
      local lock = redis.call('PTTL', KEYS[2])
      local left = redis.call('PTTL', KEYS[1])
      if left < 1 or (i == 2 and lock > left) then
        redis.call('DEL', KEYS[2])
        break
      end
      if lock <= left then break end
      redis.call('PEXPIRE', KEYS[2], left)
    end
  end
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

// PeekSrc reads the value, the lock, the not-found marker and the stale
// copy, with their PTTLs, at one instant.
// KEYS: value, lock, not-found marker, stale copy.
// Reply: {value or nil, value PTTL, holder or nil, lock PTTL, marker PTTL,
// stale copy or nil, copy PTTL}.
const PeekSrc = `return {redis.call('GET', KEYS[1]), redis.call('PTTL', KEYS[1]), redis.call('GET', KEYS[2]), redis.call('PTTL', KEYS[2]),
  redis.call('PTTL', KEYS[3]), redis.call('GET', KEYS[4]), redis.call('PTTL', KEYS[4])}
`

// Scripts are the scripts that publish, in one of two forms: with PUBLISH,
// or, for sharded pub/sub on a cluster, with SPUBLISH in its place (the
// channels of an id are in its keys' slot, see PlaceID). Acquire and peek
// publish nothing, so one form of each serves both.
type Scripts struct {
	Sharded                                                       bool
	Store, Release, Renew, Publish, Del, Set, NotFound, Resurrect *redis.Script
}

var (
	// Acquire is the lookup; Peek reads everything at one instant.
	Acquire = redis.NewScript(AcquireSrc)
	Peek    = redis.NewScript(PeekSrc)

	plain   = newScripts(false)
	sharded = newScripts(true)
)

// ScriptsFor returns the scripts for plain or sharded pub/sub.
func ScriptsFor(shardedPubSub bool) *Scripts {
	if shardedPubSub {
		return sharded
	}
	return plain
}

func newScripts(shardedPubSub bool) *Scripts {
	mk := func(src string) *redis.Script {
		if shardedPubSub {
			src = ShardedSrc(src)
		}
		return redis.NewScript(src)
	}
	return &Scripts{Sharded: shardedPubSub, Store: mk(StoreSrc), Release: mk(ReleaseSrc), Renew: mk(RenewSrc),
		Publish: mk(PublishSrc), Del: mk(DeleteSrc), Set: mk(SetSrc), NotFound: mk(NotFoundSrc), Resurrect: mk(ResurrectSrc)}
}

// Sources returns the text of every script that clients run, as Redis
// gets it: with SPUBLISH for PUBLISH when sharded. memolock check reads
// the commands they call, which Redis checks against the user's ACL rules
// one by one as a script runs.
func Sources(shardedPubSub bool) []string {
	srcs := []string{AcquireSrc, PeekSrc}
	for _, src := range []string{StoreSrc, ReleaseSrc, RenewSrc, PublishSrc, DeleteSrc, SetSrc, NotFoundSrc, ResurrectSrc} {
		if shardedPubSub {
			src = ShardedSrc(src)
		}
		srcs = append(srcs, src)
	}
	return srcs
}

// ShardedSrc is src with SPUBLISH for PUBLISH.
func ShardedSrc(src string) string {
	return strings.ReplaceAll(src, "redis.call('PUBLISH', ", "redis.call('SPUBLISH', ")
}
