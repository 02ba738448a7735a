"""The wire protocol: key scheme, tokens, events and the five Lua scripts.

Everything here is pure (no I/O) and shared by the sync and asyncio clients.
The script texts are byte for byte those of the Go reference (internal/wire/scripts.go).
"""

import hashlib
import os
import re
import secrets
import socket

from .errors import InvalidArgument

ACQUIRE_SRC = r"""local v = redis.call('GET', KEYS[1])
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
"""

STORE_SRC = r"""if redis.call('GET', KEYS[2]) ~= ARGV[1] then
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
"""

NOT_FOUND_SRC = r"""if redis.call('GET', KEYS[2]) ~= ARGV[1] then
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
"""

RELEASE_SRC = r"""if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
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
"""

RENEW_SRC = r"""if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  redis.call('PUBLISH', ARGV[3], 'abandon\n' .. ARGV[1] .. '\n')
  return 0
end
local left = redis.call('PTTL', KEYS[1])
if left >= 0 and left < tonumber(ARGV[2]) then redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return 1
"""

#: The scripts a peer runs, named as in vectors.json. Go's publish, resurrect
#: and control scripts (delete, set, peek) are not needed to interoperate.
SCRIPTS = {"acquire": ACQUIRE_SRC, "store": STORE_SRC, "release": RELEASE_SRC, "renew": RENEW_SRC,
           "not_found": NOT_FOUND_SRC}

#: How long (ms) a lock outlives a stored value, as "done:<token>".
LINGER_MS = 1000
#: Bound, in bytes, on the message of a fail event.
MAX_EVENT_TEXT = 4096
#: Payload prefix of the marker PINGs on the pub/sub connection.
MARKER_PREFIX = b"memolock:"

#: Bound on a PTTL read from Redis, as Go's maxPTTL (about 290 years).
MAX_PTTL_MS = (2**63 - 1 - 10**6) // 10**6
#: Longest single sleep of a waiter (threading's TIMEOUT_MAX is ~292 years).
MAX_SLEEP = 3600.0

EVENT_FAIL = b"fail"
EVENT_ABANDON = b"abandon"
EVENT_NOTFOUND = b"notfound"  # the holder's fetch found nothing: waiters fail with NotFound
EVENT_STALE = b"stale"  # the holder put a stale value back: waiters look again

DEFAULT_LOCK_TTL = 10.0
#: How long close() waits for Redis calls (releases, lookups under way).
CLOSE_WAIT = 1.0


def to_bytes(v, what):
    """Returns v (str as UTF-8, or bytes) as bytes; rejects anything else."""
    if isinstance(v, str):
        return v.encode("utf-8", "surrogatepass")
    if isinstance(v, (bytes, bytearray, memoryview)):
        return bytes(v)
    raise InvalidArgument(f"{what} must be str or bytes, not {type(v).__name__}")


class KeyScheme:
    """Names the keys and channels of one tag (see PROTOCOL.md)."""

    def __init__(self, tag):
        tag = to_bytes(tag, "tag")
        if not tag:
            raise InvalidArgument('tag is empty; pass a name such as "likes"')
        for part in (b"/lock", b"/notif"):
            if part in tag:
                raise InvalidArgument(
                    f"tag {tag!r} contains {part!r}, which would collide with the lock keys "
                    f"and channels of tag {tag[:tag.index(part)]!r}")
        self.tag = tag

    def value(self, id):
        return self.tag + b":" + id

    def lock(self, id):
        return self.tag + b"/lock:" + id

    def notif(self, id):
        return self.tag + b"/notif:" + id

    def events(self, id):
        return self.tag + b"/lock-event:" + id

    def not_found(self, id):
        """The key recording that fetch found nothing (a negative TTL)."""
        return self.tag + b"/lock-notfound:" + id

    def stale(self, id):
        """The key of a copy of the value kept past its TTL (Go's StaleTTL)."""
        return self.tag + b"/lock-stale:" + id

    def id_keys(self, id):
        """The four keys acquire, store and not_found take: value, lock,
        not-found marker, stale copy."""
        return [self.value(id), self.lock(id), self.not_found(id), self.stale(id)]


def hash_id(id):
    """The id HashIDs sends to Redis: lowercase hex SHA-256 of its bytes."""
    return hashlib.sha256(to_bytes(id, "id")).hexdigest().encode()


def _sanitize_host(b):
    """Go's strings.Map over the host: each rune (or invalid byte) outside
    [A-Za-z0-9._-] becomes "_"."""
    out, i = [], 0
    while i < len(b):
        c = b[i]
        if c < 0x80:
            ch = chr(c)
            out.append(ch if re.match(r"[A-Za-z0-9._-]", ch) else "_")
            i += 1
            continue
        n = 1
        for k in (2, 3, 4):
            try:
                if len(b[i:i + k].decode("utf-8")) == 1:
                    n = k
                    break
            except UnicodeDecodeError:
                pass
        out.append("_")
        i += n
    return "".join(out)


def holder_suffix(host=None, pid=None):
    """ "@host:pid" with host chars outside [A-Za-z0-9._-] replaced by "_"."""
    if host is None:
        host = socket.gethostname()
    if isinstance(host, str):
        host = host.encode("utf-8", "surrogateescape")
    host = _sanitize_host(host) or "unknown"
    suffix = "@" + host + ":"
    if pid is None:
        return suffix + str(os.getpid())
    return suffix + str(pid)


def new_token():
    """A token unique to one flight: 32 hex digits, then @host:pid."""
    return (secrets.token_hex(16) + holder_suffix()).encode()


def truncate_utf8(b, n):
    """Cuts bytes b to at most n bytes without splitting a UTF-8 character."""
    if len(b) <= n:
        return b
    while n > 0 and (b[n] & 0xC0) == 0x80:
        n -= 1
    return b[:n]


def event(kind, token):
    """An event without text: "<kind>\\n<token>\\n"."""
    return kind + b"\n" + token + b"\n"


def abandon_event(token):
    return event(EVENT_ABANDON, token)


def error_text(err):
    """What a fail event says of err: its message, else its type's name."""
    if isinstance(err, (bytes, bytearray)):
        return bytes(err)
    if isinstance(err, str):
        return err.encode("utf-8", "replace")
    text = str(err) if str(err) else type(err).__name__
    return text.encode("utf-8", "replace")


def fail_event(token, err):
    """The fail event for err: its first line, at most 4096 bytes."""
    msg = error_text(err).split(b"\n", 1)[0]
    return EVENT_FAIL + b"\n" + token + b"\n" + truncate_utf8(msg, MAX_EVENT_TEXT)


def parse_event(p):
    """Splits an event payload into (kind, token, text)."""
    kind, _, rest = p.partition(b"\n")
    token, _, text = rest.partition(b"\n")
    return kind, token, text


HIT, LOCKED, BUSY, NOT_FOUND = "hit", "locked", "busy", "not_found"


class Reply:
    """What acquire answered: kind HIT (value), LOCKED, BUSY (pttl ms,
    holder), or NOT_FOUND (pttl: the marker's, ms; -1 for ever)."""

    __slots__ = ("kind", "value", "pttl", "holder")

    def __init__(self, kind, value=None, pttl=-1, holder=b""):
        self.kind, self.value, self.pttl, self.holder = kind, value, pttl, holder

    def __repr__(self):
        return f"Reply({self.kind}, {self.value!r}, {self.pttl}, {self.holder!r})"


def _is_int(v):
    return isinstance(v, int) and not isinstance(v, bool)


def decode_acquire(res, token):
    """Reads acquire's raw reply. A busy reply naming token is our own lock."""
    if isinstance(res, bytes):
        return Reply(HIT, value=res)
    if _is_int(res):
        if res != 1:
            raise ValueError(f"unexpected acquire reply {res!r}")
        return Reply(LOCKED)
    if isinstance(res, list) and len(res) == 1 and _is_int(res[0]):
        # A cached "not found", for res[0] ms more.
        return Reply(NOT_FOUND, pttl=min(res[0], MAX_PTTL_MS))
    if isinstance(res, list) and len(res) == 2 and isinstance(res[0], bytes) and res[1] in (1, 2):
        # {value, 1}: a hit, the lock taken for a refresh ahead of expiry;
        # {value, 2}: a hit flagged stale. Only Go's optional ARGV[3]/ARGV[4]
        # ask for these, and this peer sends neither; should one come
        # anyway, it is a plain hit. (For 1 the lock it took stays until
        # its TTL, guarding a value that is there: lookups keep hitting.)
        return Reply(HIT, value=res[0])
    if isinstance(res, list) and len(res) >= 2 and _is_int(res[0]):
        # {pttl, holder[, stale copy]}: the third element comes only with
        # Go's stale flag (ARGV[4]), which this peer never sends; ignored.
        pttl, holder = res[0], res[1]
        if not isinstance(holder, bytes):
            return Reply(BUSY, pttl=0, holder=b"")  # expired between PTTL and GET
        # The original Go peer renews with nanoseconds as seconds: bound a
        # PTTL of centuries as Go does (maxPTTL), so that timers never overflow.
        pttl = min(pttl, MAX_PTTL_MS)
        if holder == token:
            return Reply(LOCKED, pttl=pttl)
        return Reply(BUSY, pttl=pttl, holder=holder)
    raise ValueError(f"unexpected acquire reply {res!r}")


# MAX_SECONDS is Go's longest time.Duration in whole seconds, about 292
# years: longer times overflow Redis's expiry arithmetic.
MAX_SECONDS = 9223372036


def duration_ms(seconds, what, allow_zero=True):
    """Seconds (int, float or timedelta) to whole ms, for a TTL sent to Redis.

    Rounds like Go's Duration.Milliseconds (down), with anything positive
    under 1 ms sent as 1 ms. Rejects negatives, NaN, infinity and non-numbers.
    """
    if hasattr(seconds, "total_seconds"):
        seconds = seconds.total_seconds()
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)):
        raise InvalidArgument(f"{what} must be a number of seconds, not {type(seconds).__name__}")
    if seconds != seconds or seconds in (float("inf"), float("-inf")):
        raise InvalidArgument(f"{what} {seconds!r} is not a finite number of seconds")
    if seconds < 0:
        raise InvalidArgument(f"{what} {seconds!r} is negative")
    if seconds > MAX_SECONDS:
        raise InvalidArgument(f"{what} {seconds!r}s is too long; at most {MAX_SECONDS}s (Go's longest duration)")
    if seconds == 0:
        if not allow_zero:
            raise InvalidArgument(f"{what} is 0; it must be at least 1ms")
        return 0
    us = int(round(seconds * 1e6))
    ms = us // 1000
    if ms < 1:
        if not allow_zero:
            raise InvalidArgument(f"{what} {seconds!r}s is under 1ms; Redis locks are set in whole milliseconds")
        ms = 1
    return ms


def optional_ms(seconds, what):
    """duration_ms for an option where 0 turns it off: 0 stays 0, anything
    positive must be at least 1 ms (as Go rejects a NegTTL under 1ms)."""
    if hasattr(seconds, "total_seconds"):
        seconds = seconds.total_seconds()
    if _is_int(seconds) and seconds == 0 or isinstance(seconds, float) and seconds == 0.0:
        return 0
    return duration_ms(seconds, what, allow_zero=False)


def check_value(val, ttl):
    """Validates what a fetch returned: (bytes, ttl) -> (bytes, ttl ms)."""
    if isinstance(val, (bytearray, memoryview)):
        val = bytes(val)
    if not isinstance(val, bytes):
        raise InvalidArgument(
            f"fetch returned a value of type {type(val).__name__}, not bytes (encode it, e.g. with memolock.gojson.dumps)")
    if isinstance(ttl, (int, float)) and not isinstance(ttl, bool) and ttl < 0:
        raise InvalidArgument(f"fetch returned negative TTL {ttl!r}")
    return val, duration_ms(ttl, "fetch TTL")


def quote(b):
    """A key or id for an error message, quoted and cut to a readable length."""
    more = "..." if len(b) > 80 else ""
    text = truncate_utf8(b, 80).decode("utf-8", "backslashreplace").replace('"', '\\"')
    return '"' + text + '"' + more
