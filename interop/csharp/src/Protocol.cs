// The whole wire protocol (interop/PROTOCOL.md): the key scheme, the five
// Lua scripts a peer runs (byte for byte the text of internal/wire/scripts.go), tokens
// and events.
using System;
using System.Collections.Generic;
using System.Net;
using System.Security.Cryptography;
using System.Text;

namespace MemoLockNet
{
    /// <summary>Byte helpers. Latin1 maps bytes to chars one to one, so binary keys and tokens survive as dictionary keys.</summary>
    public static class Bytes
    {
        public static readonly Encoding Utf8 = new UTF8Encoding(false);
        public static string Latin1(byte[] b) { var c = new char[b.Length]; for (int i = 0; i < b.Length; i++) c[i] = (char)b[i]; return new string(c); }
        public static byte[] FromLatin1(string s) { var b = new byte[s.Length]; for (int i = 0; i < s.Length; i++) b[i] = (byte)s[i]; return b; }
        public static byte[] Concat(params byte[][] parts)
        {
            int n = 0;
            foreach (var p in parts) n += p.Length;
            var r = new byte[n];
            int o = 0;
            foreach (var p in parts) { Buffer.BlockCopy(p, 0, r, o, p.Length); o += p.Length; }
            return r;
        }
        public static string Hex(byte[] b)
        {
            var sb = new StringBuilder(b.Length * 2);
            foreach (var x in b) sb.Append(x.ToString("x2"));
            return sb.ToString();
        }
        public static bool Equal(byte[] a, byte[] b)
        {
            if (a == null || b == null || a.Length != b.Length) return false;
            for (int i = 0; i < a.Length; i++) if (a[i] != b[i]) return false;
            return true;
        }
    }

    /// <summary>
    /// The keys and channels of one tag: T:I value, T/lock:I lock, T/notif:I
    /// value channel, T/lock-event:I memolock events, T/lock-notfound:I a
    /// cached "not found", T/lock-stale:I a stale copy of the value (Go's StaleTTL).
    /// </summary>
    public sealed class KeyScheme
    {
        public string Tag { get; }
        readonly byte[] tag;

        /// <summary>Validates tag: non-empty, without "/lock" or "/notif".</summary>
        public KeyScheme(string tag)
        {
            if (tag == null) throw new ArgumentNullException("tag", "memolock: tag is null; pass a name such as \"likes\"");
            if (tag == "") throw new ArgumentException("memolock: tag is empty; pass a name such as \"likes\"", "tag");
            foreach (var part in new[] { "/lock", "/notif" })
            {
                int i = tag.IndexOf(part, StringComparison.Ordinal);
                if (i >= 0)
                    throw new ArgumentException("memolock: tag \"" + tag + "\" contains \"" + part +
                        "\", which would collide with the lock keys and channels of tag \"" + tag.Substring(0, i) + "\"", "tag");
            }
            Tag = tag;
            this.tag = Bytes.Utf8.GetBytes(tag);
        }

        byte[] Join(string sep, byte[] id) { return Bytes.Concat(tag, Bytes.Utf8.GetBytes(sep), id); }
        public byte[] Value(byte[] id) { return Join(":", id); }
        public byte[] Lock(byte[] id) { return Join("/lock:", id); }
        public byte[] Notif(byte[] id) { return Join("/notif:", id); }
        public byte[] Events(byte[] id) { return Join("/lock-event:", id); }
        public byte[] NotFound(byte[] id) { return Join("/lock-notfound:", id); }
        public byte[] Stale(byte[] id) { return Join("/lock-stale:", id); }
        /// <summary>The four keys acquire, store and not_found take: value, lock, not-found marker, stale copy.</summary>
        public byte[][] IdKeys(byte[] id) { return new[] { Value(id), Lock(id), NotFound(id), Stale(id) }; }

        /// <summary>The id HashIDs sends: lowercase hex SHA-256 of the id's bytes.</summary>
        public static byte[] HashID(byte[] id)
        {
            using (var h = SHA256.Create()) return Encoding.ASCII.GetBytes(Bytes.Hex(h.ComputeHash(id)));
        }
    }

    /// <summary>One Lua script: its exact text and SHA-1.</summary>
    public sealed class Script
    {
        public readonly string Source;
        public readonly string Sha1;
        public Script(string src)
        {
            Source = src;
            using (var h = SHA1.Create()) Sha1 = Bytes.Hex(h.ComputeHash(Bytes.Utf8.GetBytes(src)));
        }
    }

    /// <summary>The five scripts a peer runs, copied byte for byte from internal/wire/scripts.go
    /// (Go's publish, resurrect and control scripts are not needed to interoperate).</summary>
    public static class Scripts
    {
        // KEYS: value, lock, not-found marker, stale copy. ARGV: token, lock
        // TTL in ms (this peer sends neither of Go's optional ARGV[3], the
        // refresh-ahead window, and ARGV[4], the stale flag).
        // Reply: value (bulk) | 1 (integer: locked by us) | {marker PTTL}
        // (a cached "not found") | {PTTL ms, holder token} (busy); only with
        // ARGV[3]/ARGV[4]: {value, 1|2} and a busy reply's third element;
        // ARGV[5] (Go's L1 only, never sent here): {value, flag, pttl}.
        // A done:<token> or stale:<token> lock whose value is gone guards
        // nothing: taken over at once.
        public static readonly Script Acquire = new Script(
"local v = redis.call('GET', KEYS[1])\n" +
"local early = tonumber(ARGV[3]) or 0\n" +
"if v then\n" +
"  local flag = 0\n" +
"  if early >= 1 or ARGV[4] == '1' then\n" +
"    local h = redis.call('GET', KEYS[2])\n" +
"    if early >= 1 then\n" +
"      if h == ARGV[1] then\n" +
"        flag = 1\n" +
"      else\n" +
"        local left = redis.call('PTTL', KEYS[1])\n" +
"        if not h and left >= 0 and left < early then\n" +
"          redis.call('SET', KEYS[2], ARGV[1], 'PX', ARGV[2])\n" +
"          flag = 1\n" +
"        end\n" +
"      end\n" +
"    end\n" +
"    if flag == 0 and h and string.sub(h, 1, 6) == 'stale:' then flag = 2 end\n" +
"  end\n" +
"  if ARGV[5] == '1' then return {v, flag, redis.call('PTTL', KEYS[1])} end\n" +
"  if flag == 0 then return v end\n" +
"  return {v, flag}\n" +
"end\n" +
"local gone = redis.call('PTTL', KEYS[3])\n" +
"if gone ~= -2 then return {gone} end\n" +
"if redis.call('SET', KEYS[2], ARGV[1], 'NX', 'PX', ARGV[2]) then return 1 end\n" +
"local holder = redis.call('GET', KEYS[2])\n" +
"if holder and (string.sub(holder, 1, 5) == 'done:' or string.sub(holder, 1, 6) == 'stale:') then\n" +
"  redis.call('SET', KEYS[2], ARGV[1], 'PX', ARGV[2])\n" +
"  return 1\n" +
"end\n" +
"if ARGV[4] == '1' then return {redis.call('PTTL', KEYS[2]), holder, redis.call('GET', KEYS[4])} end\n" +
"return {redis.call('PTTL', KEYS[2]), holder}\n");

        // KEYS: value, lock, not-found marker, stale copy. ARGV: token, value,
        // value TTL ms (0: none), value channel, events channel, linger ms
        // (under 1: delete the lock), and Go's optional stale time (this peer
        // sends none: a stale copy goes). A cached "not found" goes.
        // Reply: 1 stored, 0 lease lost (abandon published).
        public static readonly Script Store = new Script(
"if redis.call('GET', KEYS[2]) ~= ARGV[1] then\n" +
"  if redis.call('GET', KEYS[1]) == ARGV[2] then return 1 end\n" +
"  redis.call('PUBLISH', ARGV[5], 'abandon\\n' .. ARGV[1] .. '\\n')\n" +
"  return 0\n" +
"end\n" +
"local ttl = tonumber(ARGV[3])\n" +
"if ttl == 0 then\n" +
"  redis.call('SET', KEYS[1], ARGV[2])\n" +
"else\n" +
"  redis.call('SET', KEYS[1], ARGV[2], 'PX', ttl)\n" +
"end\n" +
"local linger = tonumber(ARGV[6]) or 0\n" +
"if ttl > 0 then linger = math.min(linger, ttl) end\n" +
"if linger >= 1 then\n" +
"  redis.call('SET', KEYS[2], 'done:' .. ARGV[1], 'PX', linger)\n" +
"  if ttl > 0 then\n" +
"    for i = 1, 2 do\n" +
"      local lock = redis.call('PTTL', KEYS[2])\n" +
"      local left = redis.call('PTTL', KEYS[1])\n" +
"      if left < 1 or (i == 2 and lock > left) then\n" +
"        redis.call('DEL', KEYS[2])\n" +
"        break\n" +
"      end\n" +
"      if lock <= left then break end\n" +
"      redis.call('PEXPIRE', KEYS[2], left)\n" +
"    end\n" +
"  end\n" +
"else\n" +
"  redis.call('DEL', KEYS[2])\n" +
"end\n" +
"local stale = tonumber(ARGV[7]) or 0\n" +
"if stale >= 1 and ttl > 0 then\n" +
"  redis.call('SET', KEYS[4], ARGV[2], 'PX', ttl + stale)\n" +
"else\n" +
"  redis.call('DEL', KEYS[4])\n" +
"end\n" +
"redis.call('DEL', KEYS[3])\n" +
"redis.call('PUBLISH', ARGV[4], ARGV[2])\n" +
"return 1\n");

        // KEYS: value, lock, not-found marker, stale copy. ARGV: token,
        // negative TTL ms (0: record nothing), events channel. Deletes the
        // value, the lock and the stale copy, sets the marker for the negative
        // TTL, publishes notfound. Reply: 1 done, 0 lease lost (abandon published).
        public static readonly Script NotFound = new Script(
"if redis.call('GET', KEYS[2]) ~= ARGV[1] then\n" +
"  redis.call('PUBLISH', ARGV[3], 'abandon\\n' .. ARGV[1] .. '\\n')\n" +
"  return 0\n" +
"end\n" +
"if (tonumber(ARGV[2]) or 0) >= 1 then\n" +
"  redis.call('SET', KEYS[3], '', 'PX', ARGV[2])\n" +
"else\n" +
"  redis.call('DEL', KEYS[3])\n" +
"end\n" +
"redis.call('DEL', KEYS[1], KEYS[2], KEYS[4])\n" +
"redis.call('PUBLISH', ARGV[3], 'notfound\\n' .. ARGV[1] .. '\\n')\n" +
"return 1\n");

        // KEYS: lock, value. ARGV: token, events channel, event ('' publishes
        // nothing), linger ms (0: delete; else at most what the value has left,
        // and none without a value). Reply: 1 released, 0 not ours.
        public static readonly Script Release = new Script(
"if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end\n" +
"local linger = tonumber(ARGV[4]) or 0\n" +
"local left = -1\n" +
"if linger >= 1 then\n" +
"  left = redis.call('PTTL', KEYS[2])\n" +
"  if left == -2 then linger = 0 elseif left >= 0 then linger = math.min(linger, left) end\n" +
"end\n" +
"if linger >= 1 then\n" +
"  redis.call('SET', KEYS[1], 'done:' .. ARGV[1], 'PX', linger)\n" +
"  if left >= 0 then\n" +
"    for i = 1, 2 do\n" +
"      local lock = redis.call('PTTL', KEYS[1])\n" +
"      left = redis.call('PTTL', KEYS[2])\n" +
"      if left < 1 or (i == 2 and lock > left) then\n" +
"        redis.call('DEL', KEYS[1])\n" +
"        break\n" +
"      end\n" +
"      if lock <= left then break end\n" +
"      redis.call('PEXPIRE', KEYS[1], left)\n" +
"    end\n" +
"  end\n" +
"else\n" +
"  redis.call('DEL', KEYS[1])\n" +
"end\n" +
"if ARGV[3] ~= '' then redis.call('PUBLISH', ARGV[2], ARGV[3]) end\n" +
"return 1\n");

        // KEYS: lock. ARGV: token, TTL ms (0 only checks), events channel.
        // Reply: 1 held, 0 lost (abandon published).
        public static readonly Script Renew = new Script(
"if redis.call('GET', KEYS[1]) ~= ARGV[1] then\n" +
"  redis.call('PUBLISH', ARGV[3], 'abandon\\n' .. ARGV[1] .. '\\n')\n" +
"  return 0\n" +
"end\n" +
"local left = redis.call('PTTL', KEYS[1])\n" +
"if left >= 0 and left < tonumber(ARGV[2]) then redis.call('PEXPIRE', KEYS[1], ARGV[2]) end\n" +
"return 1\n");

        /// <summary>How long a lock outlives a stored value (at most the value's TTL).</summary>
        public const long LingerMs = 1000;
    }

    /// <summary>What acquire answered.</summary>
    public enum ReplyKind { Hit, Locked, Busy, NotFound }

    public struct AcquireReply
    {
        public ReplyKind Kind;
        public byte[] Value;   // Hit
        public long Pttl;      // Busy, or Locked when found already ours, or NotFound (the marker's); -1: no expiry
        public string Holder;  // Busy: the holder's token (Latin1 of its bytes)

        /// <summary>Decodes the raw reply; replies stay raw: a bulk "1" is a value, the integer 1 is the lock.</summary>
        public static AcquireReply Decode(object res)
        {
            if (res is byte[]) return new AcquireReply { Kind = ReplyKind.Hit, Value = (byte[])res };
            if (res is long && (long)res == 1) return new AcquireReply { Kind = ReplyKind.Locked, Pttl = -1 };
            var a = res as object[];
            // {pttl}: a cached "not found", for pttl ms more.
            if (a != null && a.Length == 1 && a[0] is long) return new AcquireReply { Kind = ReplyKind.NotFound, Pttl = (long)a[0] };
            // {value, 1}: a hit with the lock taken for a refresh ahead of
            // expiry; {value, 2}: a hit flagged stale. Only Go's optional
            // ARGV[3]/ARGV[4] ask for them, and this peer sends neither;
            // should one come anyway, it is a plain hit (for 1, the lock it
            // took stays until its TTL, guarding a value that is there).
            if (a != null && a.Length == 2 && a[0] is byte[] && a[1] is long && ((long)a[1] == 1 || (long)a[1] == 2))
                return new AcquireReply { Kind = ReplyKind.Hit, Value = (byte[])a[0] };
            // {pttl, holder[, stale copy]}: the third element comes only with
            // Go's stale flag (ARGV[4]), which this peer never sends; ignored.
            if (a != null && a.Length >= 2 && a[0] is long)
            {
                long pttl = (long)a[0];
                var holder = a[1] as byte[];
                if (holder == null) return new AcquireReply { Kind = ReplyKind.Busy, Pttl = 0, Holder = "" }; // expired meanwhile: look again
                return new AcquireReply { Kind = ReplyKind.Busy, Pttl = pttl, Holder = Bytes.Latin1(holder) };
            }
            throw new RedisException("memolock: redis: unexpected acquire reply " + Describe(res));
        }

        static string Describe(object r) { return r == null ? "nil" : r.GetType().Name; }
    }

    /// <summary>Tokens and events.</summary>
    public static class Tokens
    {
        /// <summary>"@host:pid" with the host's characters outside [A-Za-z0-9._-] replaced by '_'.</summary>
        public static string HolderSuffix(string host, int pid) { return "@" + SanitizeHost(host) + ":" + pid; }

        public static string SanitizeHost(string host) { return SanitizeHost(Bytes.Utf8.GetBytes(host ?? "")); }

        /// <summary>
        /// Go's strings.Map over the host's bytes: one '_' per character
        /// outside [A-Za-z0-9._-], a byte that is not valid UTF-8 counting as
        /// one character.
        /// </summary>
        public static string SanitizeHost(byte[] host)
        {
            var sb = new StringBuilder();
            for (int i = 0; i < host.Length; i += RuneLength(host, i))
            {
                byte c = host[i];
                bool ok = c == '.' || c == '-' || c == '_' || (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
                sb.Append(ok ? (char)c : '_');
            }
            return sb.Length == 0 ? "unknown" : sb.ToString();
        }

        // The length of the UTF-8 sequence at s[i] as Go decodes it: 1 for an
        // invalid byte (overlong forms, surrogates and stray continuations included).
        static int RuneLength(byte[] s, int i)
        {
            byte b = s[i];
            if (b < 0x80) return 1;
            int n, lo = 0x80, hi = 0xBF;
            if (b >= 0xC2 && b <= 0xDF) n = 2;
            else if (b >= 0xE0 && b <= 0xEF) { n = 3; if (b == 0xE0) lo = 0xA0; if (b == 0xED) hi = 0x9F; }
            else if (b >= 0xF0 && b <= 0xF4) { n = 4; if (b == 0xF0) lo = 0x90; if (b == 0xF4) hi = 0x8F; }
            else return 1;
            if (i + n > s.Length || s[i + 1] < lo || s[i + 1] > hi) return 1;
            for (int k = 2; k < n; k++) if (s[i + k] < 0x80 || s[i + k] > 0xBF) return 1;
            return n;
        }

        static readonly string suffix = HolderSuffix(HostName(), System.Diagnostics.Process.GetCurrentProcess().Id);
        static readonly RandomNumberGenerator rng = RandomNumberGenerator.Create();

        static string HostName() { try { return Dns.GetHostName(); } catch { return ""; } }

        /// <summary>A token unique to one flight: 32 lowercase hex random digits, then "@host:pid".</summary>
        public static string New()
        {
            var b = new byte[16];
            lock (rng) rng.GetBytes(b);
            return Bytes.Hex(b) + suffix;
        }

        public const int MaxEventText = 4096;

        /// <summary>Event kinds on T/lock-event:I. A waiter fails on fail (HolderFailedException)
        /// and notfound (NotFoundException), and looks again on abandon, stale and any other kind.</summary>
        public const string EventFail = "fail", EventAbandon = "abandon", EventNotFound = "notfound", EventStale = "stale";

        /// <summary>An event without text: "&lt;kind&gt;\n&lt;token&gt;\n".</summary>
        public static byte[] Event(string kind, string token) { return Bytes.Concat(Bytes.Utf8.GetBytes(kind + "\n"), Bytes.FromLatin1(token), new byte[] { 10 }); }

        public static byte[] AbandonEvent(string token) { return Event(EventAbandon, token); }

        /// <summary>"fail\n&lt;token&gt;\n&lt;first line of message, at most 4096 bytes cut at a UTF-8 boundary&gt;".</summary>
        public static byte[] FailEvent(string token, string message) { return FailEvent(token, Bytes.Utf8.GetBytes(message ?? "")); }

        /// <summary>FailEvent for a message given as raw bytes (which need not be UTF-8).</summary>
        public static byte[] FailEvent(string token, byte[] message)
        {
            int nl = Array.IndexOf(message, (byte)10);
            if (nl >= 0) { var m = new byte[nl]; Buffer.BlockCopy(message, 0, m, 0, nl); message = m; }
            return Bytes.Concat(Bytes.Utf8.GetBytes("fail\n"), Bytes.FromLatin1(token), new byte[] { 10 }, TruncateUtf8(message, MaxEventText));
        }

        public static byte[] TruncateUtf8(byte[] s, int n)
        {
            if (s.Length <= n) return s;
            while (n > 0 && (s[n] & 0xC0) == 0x80) n--;
            var r = new byte[n];
            Buffer.BlockCopy(s, 0, r, 0, n);
            return r;
        }

        /// <summary>Splits an event into kind, token (Latin1) and text (UTF-8).</summary>
        public static void ParseEvent(byte[] p, out string kind, out string token, out string text)
        {
            int a = Array.IndexOf(p, (byte)10);
            if (a < 0) { kind = Bytes.Latin1(p); token = ""; text = ""; return; }
            kind = Bytes.Latin1(Slice(p, 0, a));
            int b = Array.IndexOf(p, (byte)10, a + 1);
            if (b < 0) { token = Bytes.Latin1(Slice(p, a + 1, p.Length)); text = ""; return; }
            token = Bytes.Latin1(Slice(p, a + 1, b));
            text = Bytes.Utf8.GetString(Slice(p, b + 1, p.Length));
        }

        /// <summary>An event's message as raw bytes: everything after its second '\n' (empty without one).</summary>
        public static byte[] EventMessage(byte[] p)
        {
            int a = Array.IndexOf(p, (byte)10);
            int b = a < 0 ? -1 : Array.IndexOf(p, (byte)10, a + 1);
            return b < 0 ? new byte[0] : Slice(p, b + 1, p.Length);
        }

        static byte[] Slice(byte[] p, int from, int to) { var r = new byte[to - from]; Buffer.BlockCopy(p, from, r, 0, r.Length); return r; }
    }

    /// <summary>The protocol's calls for one tag.</summary>
    public sealed class Protocol
    {
        readonly IRedisTransport rdb;
        public readonly KeyScheme Keys;
        public Protocol(IRedisTransport rdb, KeyScheme keys) { this.rdb = rdb; Keys = keys; }

        static string Ms(long ms) { return ms.ToString(System.Globalization.CultureInfo.InvariantCulture); }

        /// <summary>Runs acquire; a busy reply naming our own token means the lock is ours.</summary>
        public AcquireReply Acquire(byte[] id, string token, long lockTtlMs)
        {
            var r = AcquireReply.Decode(rdb.Eval(Scripts.Acquire.Source, Scripts.Acquire.Sha1,
                Keys.IdKeys(id), new object[] { Bytes.FromLatin1(token), Ms(lockTtlMs) }));
            if (r.Kind == ReplyKind.Busy && r.Holder == token) r.Kind = ReplyKind.Locked;
            return r;
        }

        /// <summary>Runs store; false: the lease was lost (the script told waiters).</summary>
        public bool Store(byte[] id, string token, byte[] val, long ttlMs)
        {
            var n = rdb.Eval(Scripts.Store.Source, Scripts.Store.Sha1, Keys.IdKeys(id),
                new object[] { Bytes.FromLatin1(token), val, Ms(ttlMs), Keys.Notif(id), Keys.Events(id), Ms(Scripts.LingerMs) });
            return n is long && (long)n == 1;
        }

        /// <summary>Runs not_found: fetch found nothing, recorded for negTtlMs (0: not at all);
        /// waiters get a notfound event. False: the lease was lost (the script told waiters).</summary>
        public bool NotFound(byte[] id, string token, long negTtlMs)
        {
            var n = rdb.Eval(Scripts.NotFound.Source, Scripts.NotFound.Sha1, Keys.IdKeys(id),
                new object[] { Bytes.FromLatin1(token), Ms(negTtlMs), Keys.Events(id) });
            return n is long && (long)n == 1;
        }

        /// <summary>Runs release with event (empty: none) and linger (0: delete).</summary>
        public bool Release(byte[] id, string token, byte[] evt, long lingerMs)
        {
            var n = rdb.Eval(Scripts.Release.Source, Scripts.Release.Sha1, new[] { Keys.Lock(id), Keys.Value(id) },
                new object[] { Bytes.FromLatin1(token), Keys.Events(id), evt ?? new byte[0], Ms(lingerMs) });
            return n is long && (long)n == 1;
        }

        /// <summary>Runs renew: true while the lock holds token.</summary>
        public bool Renew(byte[] id, string token, long ttlMs)
        {
            var n = rdb.Eval(Scripts.Renew.Source, Scripts.Renew.Sha1, new[] { Keys.Lock(id) },
                new object[] { Bytes.FromLatin1(token), Ms(ttlMs), Keys.Events(id) });
            return n is long && (long)n == 1;
        }

        /// <summary>Publishes an abandon event for token.</summary>
        public void Abandoned(byte[] id, string token) { Event(id, Tokens.AbandonEvent(token)); }

        /// <summary>Publishes evt on id's events channel, whoever holds the lock.</summary>
        public void Event(byte[] id, byte[] evt) { rdb.Publish(Keys.Events(id), evt); }
    }
}
