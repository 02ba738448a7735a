// The exceptions memolock throws. Bad input is an ArgumentException (or
// ArgumentNullException / ArgumentOutOfRangeException) naming the problem.
using System;

namespace MemoLockNet
{
    /// <summary>Base of memolock's own exceptions.</summary>
    public class MemoLockException : Exception
    {
        public MemoLockException(string message, Exception inner = null) : base(message, inner) { }
    }

    /// <summary>The lock holder in another process reported that its fetch failed; Message carries its text.</summary>
    public sealed class HolderFailedException : MemoLockException
    {
        /// <summary>The holder's own message, as it published it.</summary>
        public string HolderMessage { get; }
        public HolderFailedException(string holderMessage)
            : base("memolock: the lock holder's fetch failed: " + holderMessage) { HolderMessage = holderMessage; }
    }

    /// <summary>
    /// The id has no value. fetch throws it (or a subclass) to say so; every
    /// caller of that flight, here and in other processes, then gets a
    /// NotFoundException, and with the client's NegTtl Redis remembers it
    /// (T/lock-notfound:I): a Get in any process throws it at once, without
    /// calling fetch, until a value is stored. Not a failure (no fail event),
    /// and not an empty value. The holder's own callers get fetch's exception.
    /// </summary>
    public class NotFoundException : MemoLockException
    {
        public NotFoundException(string message = "memolock: not found", Exception inner = null) : base(message, inner) { }
    }

    /// <summary>The caller's timeout ran out before the value arrived.</summary>
    public sealed class MemoLockTimeoutException : MemoLockException
    {
        public MemoLockTimeoutException(TimeSpan after)
            : base("memolock: gave up waiting for the value after " + after.TotalSeconds.ToString("0.0##", System.Globalization.CultureInfo.InvariantCulture) + "s") { }
    }

    /// <summary>The client was closed, before or while the call waited.</summary>
    public sealed class MemoLockClosedException : MemoLockException
    {
        public MemoLockClosedException() : base("memolock: client closed") { }
    }

    /// <summary>Any failure talking to Redis.</summary>
    public class RedisException : MemoLockException
    {
        public RedisException(string message, Exception inner = null) : base(message, inner) { }
    }

    /// <summary>Redis answered with an error reply (WRONGTYPE, NOPERM, NOSCRIPT...): the connection is fine.</summary>
    public sealed class RedisReplyException : RedisException
    {
        public RedisReplyException(string message) : base(message) { }
    }

    /// <summary>The connection failed (refused, reset, timed out): a command may or may not have run.</summary>
    public sealed class RedisConnectionException : RedisException
    {
        public RedisConnectionException(string message, Exception inner) : base("redis: " + message, inner) { }
    }
}
