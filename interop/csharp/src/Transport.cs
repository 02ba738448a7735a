// The narrow view of Redis that memolock needs, so that another client
// library (StackExchange.Redis, see README.md) can stand in for RespTransport.
using System;
using System.Collections.Generic;

namespace MemoLockNet
{
    /// <summary>
    /// Commands memolock sends. Replies are raw (see Resp.cs for the types).
    /// Error replies throw RedisReplyException; network failures throw
    /// RedisConnectionException. Implementations must be thread-safe.
    /// </summary>
    public interface IRedisTransport : IDisposable
    {
        /// <summary>EVALSHA sha1, falling back to EVAL script on NOSCRIPT.</summary>
        object Eval(string script, string sha1, byte[][] keys, object[] args);
        /// <summary>GET key: the value, or null.</summary>
        byte[] Get(byte[] key);
        /// <summary>PUBLISH channel message: the number of receivers.</summary>
        long Publish(byte[] channel, byte[] message);
        /// <summary>Opens a new, dedicated pub/sub connection.</summary>
        IPubSubConnection OpenPubSub();
    }

    /// <summary>
    /// One pub/sub connection. memolock calls Subscribe, Unsubscribe and
    /// Ping from one thread and Receive from another (a reader blocked in
    /// it), so sends and receives must not share unguarded state; Dispose
    /// (from the sending thread) must make a blocked Receive return or
    /// throw. It must never reconnect by itself: every failure surfaces as
    /// an exception, and the caller opens a new connection.
    /// </summary>
    public interface IPubSubConnection : IDisposable
    {
        void Subscribe(params byte[][] channels);
        void Unsubscribe(params byte[][] channels);
        /// <summary>PING payload; its reply comes back through Receive, in order.</summary>
        void Ping(byte[] payload);
        /// <summary>The next push, or null if none arrives within timeoutMs.</summary>
        PubSubPush Receive(int timeoutMs);
    }

    /// <summary>What a pub/sub connection delivered.</summary>
    public sealed class PubSubPush
    {
        /// <summary>"message", "subscribe", "unsubscribe", "pong" or "error".</summary>
        public string Kind;
        public byte[] Channel;  // message, subscribe, unsubscribe
        public byte[] Payload;  // message, pong
        public string Error;    // error
    }

    /// <summary>IRedisTransport over RespConnection: a small pool of command connections.</summary>
    public sealed class RespTransport : IRedisTransport
    {
        readonly RedisUrl url;
        readonly int timeoutMs;
        readonly Stack<RespConnection> idle = new Stack<RespConnection>();
        bool disposed;

        /// <param name="timeoutMs">bounds every dial, read and write.</param>
        public RespTransport(RedisUrl url, int timeoutMs = 5000)
        {
            this.url = url ?? throw new ArgumentNullException("url");
            this.timeoutMs = timeoutMs;
        }

        public RespTransport(string url) : this(RedisUrl.Parse(url)) { }

        /// <summary>
        /// Runs one command on a pooled connection; a failed connection is
        /// dropped. A pooled connection may have died while idle (a server
        /// restart, CLIENT KILL, an idle timeout): a network failure on one
        /// is retried once on a new connection, as go-redis retries. Every
        /// command memolock sends may run twice (the scripts are made for
        /// it: a lookup or store that finds its own token or value answers
        /// as the first would have).
        /// </summary>
        public object Call(params object[] args)
        {
            RespConnection c = null;
            lock (idle)
            {
                if (disposed) throw new ObjectDisposedException("RespTransport");
                if (idle.Count > 0) c = idle.Pop();
            }
            if (c == null) return CallOn(RespConnection.Open(url, timeoutMs), args);
            try { return CallOn(c, args); }
            catch (RedisConnectionException e) when (!TimedOut(e))
            {
                lock (idle) if (disposed) throw;
                return CallOn(RespConnection.Open(url, timeoutMs), args);
            }
        }

        // A stalled server is not retried: that would only double the wait.
        static bool TimedOut(Exception e)
        {
            var se = e.InnerException as System.Net.Sockets.SocketException;
            return se != null && (se.SocketErrorCode == System.Net.Sockets.SocketError.TimedOut || se.SocketErrorCode == System.Net.Sockets.SocketError.WouldBlock);
        }

        object CallOn(RespConnection c, object[] args)
        {
            object r;
            try
            {
                c.Send(args);
                r = c.Read();
            }
            catch
            {
                c.Dispose();
                throw;
            }
            var err = r as RedisReplyException;
            // After a protocol error (a bulk over proto-max-bulk-len) Redis
            // closes the connection: never pool it.
            bool reusable = err == null || !err.Message.StartsWith("ERR Protocol error", StringComparison.Ordinal);
            lock (idle)
            {
                if (!reusable || disposed || idle.Count >= 16) c.Dispose();
                else idle.Push(c);
            }
            if (err != null) throw err;
            return r;
        }

        public object Eval(string script, string sha1, byte[][] keys, object[] args)
        {
            var a = new List<object> { "EVALSHA", sha1, keys.Length.ToString() };
            a.AddRange(keys);
            a.AddRange(args);
            try
            {
                return Call(a.ToArray());
            }
            catch (RedisReplyException e) when (e.Message.StartsWith("NOSCRIPT", StringComparison.Ordinal))
            {
                a[0] = "EVAL";
                a[1] = script;
                return Call(a.ToArray());
            }
        }

        public byte[] Get(byte[] key) { return (byte[])Call("GET", key); }

        public long Publish(byte[] channel, byte[] message) { return (long)Call("PUBLISH", channel, message); }

        public IPubSubConnection OpenPubSub() { return new RespPubSub(RespConnection.Open(url, timeoutMs)); }

        public void Dispose()
        {
            lock (idle)
            {
                disposed = true;
                while (idle.Count > 0) idle.Pop().Dispose();
            }
        }
    }

    /// <summary>IPubSubConnection over one RespConnection.</summary>
    public sealed class RespPubSub : IPubSubConnection
    {
        readonly RespConnection c;
        public RespPubSub(RespConnection c) { this.c = c; }

        public void Subscribe(params byte[][] channels) { Send("SUBSCRIBE", channels); }
        public void Unsubscribe(params byte[][] channels) { Send("UNSUBSCRIBE", channels); }
        public void Ping(byte[] payload) { c.Send("PING", payload); }

        void Send(string cmd, byte[][] channels)
        {
            var a = new object[channels.Length + 1];
            a[0] = cmd;
            Array.Copy(channels, 0, a, 1, channels.Length);
            c.Send(a);
        }

        public PubSubPush Receive(int timeoutMs)
        {
            if (!c.Poll(timeoutMs)) return null;
            object r = c.Read();
            var err = r as RedisReplyException;
            if (err != null) return new PubSubPush { Kind = "error", Error = err.Message };
            // PING outside subscribed mode answers a bare bulk string.
            if (r is byte[]) return new PubSubPush { Kind = "pong", Payload = (byte[])r };
            if (r is string) return new PubSubPush { Kind = "pong", Payload = new byte[0] };
            var a = r as object[];
            if (a == null || a.Length < 2 || !(a[0] is byte[]))
                throw new RedisConnectionException("protocol error: unexpected pub/sub reply", null);
            string kind = Bytes.Latin1((byte[])a[0]);
            switch (kind)
            {
                case "message":
                    return new PubSubPush { Kind = kind, Channel = (byte[])a[1], Payload = (byte[])a[2] };
                case "subscribe":
                case "unsubscribe":
                    return new PubSubPush { Kind = kind, Channel = a[1] as byte[] };
                case "pong":
                    return new PubSubPush { Kind = kind, Payload = (byte[])a[1] };
            }
            return new PubSubPush { Kind = kind, Channel = a[1] as byte[] }; // pmessage etc.: ignored by memolock
        }

        public void Dispose() { c.Dispose(); }
    }
}
