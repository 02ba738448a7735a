// A small RESP2 client: one connection, raw bytes in and out.
//
// Replies come back as plain objects, so that their type carries meaning:
//   byte[]        bulk string (a value: a bulk "1" is not the integer 1)
//   string        simple status ("OK", "PONG")
//   long          integer
//   object[]      array (elements of these same types)
//   null          nil bulk string or nil array
//   RedisReplyException  an error reply, returned (not thrown) by Read
using System;
using System.Collections.Generic;
using System.IO;
using System.Net;
using System.Net.Sockets;
using System.Text;

namespace MemoLockNet
{
    /// <summary>One RESP2 connection over TCP or a unix socket. Not thread-safe.</summary>
    public sealed class RespConnection : IDisposable
    {
        readonly Socket sock;
        readonly byte[] buf = new byte[64 * 1024];
        int start, end; // unread bytes are buf[start..end)

        RespConnection(Socket s) { sock = s; }

        /// <summary>Connects, authenticates and selects the database of url.</summary>
        public static RespConnection Open(RedisUrl url, int timeoutMs)
        {
            Socket s;
            if (url.UnixPath != null)
            {
                s = new Socket(AddressFamily.Unix, SocketType.Stream, ProtocolType.Unspecified);
                ConnectWithin(s, new UnixEndPoint(url.UnixPath), timeoutMs);
            }
            else
            {
                IPAddress addr;
                if (!IPAddress.TryParse(url.Host, out addr))
                    addr = Dns.GetHostAddresses(url.Host)[0];
                s = new Socket(addr.AddressFamily, SocketType.Stream, ProtocolType.Tcp);
                s.NoDelay = true;
                ConnectWithin(s, new IPEndPoint(addr, url.Port), timeoutMs);
            }
            s.SendTimeout = timeoutMs;
            s.ReceiveTimeout = timeoutMs;
            var c = new RespConnection(s);
            try
            {
                if (url.Password != null)
                {
                    if (url.User != null) c.Call("AUTH", url.User, url.Password);
                    else c.Call("AUTH", url.Password);
                }
                if (url.Db != 0) c.Call("SELECT", url.Db.ToString());
            }
            catch { c.Dispose(); throw; }
            return c;
        }

        static void ConnectWithin(Socket s, EndPoint ep, int timeoutMs)
        {
            try
            {
                var ar = s.BeginConnect(ep, null, null);
                if (!ar.AsyncWaitHandle.WaitOne(timeoutMs))
                {
                    s.Close();
                    throw new RedisConnectionException("connecting: timed out after " + timeoutMs + " ms", null);
                }
                s.EndConnect(ar);
            }
            catch (SocketException e)
            {
                s.Close();
                throw new RedisConnectionException("connecting: " + e.Message, e);
            }
        }

        /// <summary>The receive timeout of later reads, in ms (0: none).</summary>
        public int ReadTimeoutMs { set { sock.ReceiveTimeout = value; } }

        /// <summary>Writes one command; every argument is a string (UTF-8) or byte[].</summary>
        public void Send(params object[] args)
        {
            var ms = new MemoryStream();
            WriteAscii(ms, "*" + args.Length + "\r\n");
            foreach (var a in args)
            {
                byte[] b = a as byte[] ?? Encoding.UTF8.GetBytes(a.ToString());
                WriteAscii(ms, "$" + b.Length + "\r\n");
                ms.Write(b, 0, b.Length);
                WriteAscii(ms, "\r\n");
            }
            try
            {
                sock.Send(ms.GetBuffer(), 0, (int)ms.Length, SocketFlags.None);
            }
            catch (Exception e) when (e is SocketException || e is ObjectDisposedException)
            {
                throw new RedisConnectionException("writing: " + Describe(e), e);
            }
        }

        // Mono reports a socket timeout as "Operation on non-blocking socket would block".
        static string Describe(Exception e)
        {
            var se = e as SocketException;
            if (se != null && (se.SocketErrorCode == SocketError.WouldBlock || se.SocketErrorCode == SocketError.TimedOut)) return "i/o timeout";
            return e.Message;
        }

        static void WriteAscii(Stream s, string t)
        {
            var b = Encoding.ASCII.GetBytes(t);
            s.Write(b, 0, b.Length);
        }

        /// <summary>Sends a command and reads its reply; an error reply is thrown.</summary>
        public object Call(params object[] args)
        {
            Send(args);
            var r = Read();
            var err = r as RedisReplyException;
            if (err != null) throw err;
            return r;
        }

        /// <summary>True if a reply (or part of one) can be read without waiting up to waitMs.</summary>
        public bool Poll(int waitMs)
        {
            if (end > start) return true;
            try { return sock.Poll(waitMs * 1000, SelectMode.SelectRead); }
            catch (Exception e) when (e is SocketException || e is ObjectDisposedException)
            {
                throw new RedisConnectionException("reading: " + e.Message, e);
            }
        }

        /// <summary>Reads one reply; see the file comment for its types.</summary>
        public object Read()
        {
            byte kind = ReadByte();
            string line = ReadLine();
            switch (kind)
            {
                case (byte)'+': return line;
                case (byte)'-': return new RedisReplyException(Encoding.UTF8.GetString(Encoding.GetEncoding(28591).GetBytes(line)));
                case (byte)':': return Num(line);
                case (byte)'$':
                    {
                        long n = Num(line);
                        if (n > int.MaxValue) throw new RedisConnectionException("protocol error: length " + line, null);
                        if (n < 0) return null;
                        var b = new byte[(int)n];
                        ReadExact(b, (int)n);
                        if (ReadLine() != "") throw new RedisConnectionException("protocol error: bulk string longer than its length", null);
                        return b;
                    }
                case (byte)'*':
                    {
                        long n = Num(line);
                        if (n > int.MaxValue) throw new RedisConnectionException("protocol error: length " + line, null);
                        if (n < 0) return null;
                        var a = new object[(int)n];
                        for (int i = 0; i < n; i++) a[i] = Read();
                        return a;
                    }
            }
            throw new RedisConnectionException("protocol error: unexpected reply type '" + (char)kind + "'", null);
        }

        static long Num(string line)
        {
            long n;
            if (!long.TryParse(line, System.Globalization.NumberStyles.AllowLeadingSign, System.Globalization.CultureInfo.InvariantCulture, out n))
                throw new RedisConnectionException("protocol error: bad number \"" + line + "\"", null);
            return n;
        }

        void Fill()
        {
            if (start == end) start = end = 0;
            if (end == buf.Length)
            {
                Buffer.BlockCopy(buf, start, buf, 0, end - start);
                end -= start;
                start = 0;
            }
            int n;
            try { n = sock.Receive(buf, end, buf.Length - end, SocketFlags.None); }
            catch (Exception e) when (e is SocketException || e is ObjectDisposedException)
            {
                throw new RedisConnectionException("reading: " + Describe(e), e);
            }
            if (n <= 0) throw new RedisConnectionException("reading: connection closed by the server", null);
            end += n;
        }

        byte ReadByte()
        {
            if (start == end) Fill();
            return buf[start++];
        }

        string ReadLine()
        {
            var sb = new StringBuilder();
            while (true)
            {
                if (start == end) Fill();
                byte b = buf[start++];
                if (b == (byte)'\r')
                {
                    if (ReadByte() != (byte)'\n') throw new RedisConnectionException("protocol error: CR without LF", null);
                    return sb.ToString();
                }
                sb.Append((char)b);
            }
        }

        void ReadExact(byte[] dst, int n)
        {
            int off = 0;
            while (off < n)
            {
                if (start == end) Fill();
                int k = Math.Min(n - off, end - start);
                Buffer.BlockCopy(buf, start, dst, off, k);
                start += k;
                off += k;
            }
        }

        public void Dispose()
        {
            try { sock.Shutdown(SocketShutdown.Both); } catch { }
            sock.Close();
        }
    }

    /// <summary>An EndPoint for unix domain sockets (Mono.Posix is not installed with mono-runtime).</summary>
    public sealed class UnixEndPoint : EndPoint
    {
        public string Path { get; }
        public UnixEndPoint(string path) { Path = path; }
        public override AddressFamily AddressFamily { get { return AddressFamily.Unix; } }

        public override SocketAddress Serialize()
        {
            byte[] p = Encoding.UTF8.GetBytes(Path);
            var sa = new SocketAddress(AddressFamily.Unix, 2 + p.Length + 1);
            for (int i = 0; i < p.Length; i++) sa[2 + i] = p[i];
            sa[2 + p.Length] = 0;
            return sa;
        }

        public override EndPoint Create(SocketAddress sa)
        {
            var b = new List<byte>();
            for (int i = 2; i < sa.Size && sa[i] != 0; i++) b.Add(sa[i]);
            return new UnixEndPoint(Encoding.UTF8.GetString(b.ToArray()));
        }

        public override string ToString() { return Path; }
    }
}
