// Parsing and redacting Redis URLs: redis://[user:password@]host[:port][/db]
// and unix://[user:password@]/path/to/socket[?db=N]. rediss:// (TLS) is not
// supported. A lone user name (redis://secret@host) is the password, as
// redis-cli reads it. ?password= and ?username= are read too.
using System;
using System.Collections.Generic;

namespace MemoLockNet
{
    /// <summary>Where and how to connect to Redis.</summary>
    public sealed class RedisUrl
    {
        public string Host = "127.0.0.1";
        public int Port = 6379;
        public string UnixPath;   // set for unix:// URLs
        public string User;       // null: AUTH with the password alone
        public string Password;   // null: no AUTH
        public int Db;

        /// <summary>Parses raw; the exception never quotes the URL (it may hold a password).</summary>
        public static RedisUrl Parse(string raw)
        {
            if (raw == null) throw new ArgumentNullException("raw");
            if (raw.StartsWith("unix://", StringComparison.Ordinal)) return ParseUnix(raw);
            string redacted = Redact(raw);
            if (redacted == Withheld)
                throw new ArgumentException(Withheld + " is not of the form redis://[[user]:password@]host:port[/db] or unix:///path/to.sock");
            var r = new RedisUrl();
            Uri u = new Uri(raw);
            if (u.Scheme == "rediss")
                throw new ArgumentException(redacted + ": rediss:// (TLS) is not supported by this client");
            if (u.UserInfo != "")
            {
                string ui = u.UserInfo;
                int colon = ui.IndexOf(':');
                if (colon < 0) r.Password = Uri.UnescapeDataString(ui);
                else
                {
                    string user = Uri.UnescapeDataString(ui.Substring(0, colon));
                    r.User = user == "" ? null : user;
                    r.Password = Uri.UnescapeDataString(ui.Substring(colon + 1));
                }
            }
            var q = Query(u.Query);
            string v;
            if (q.TryGetValue("password", out v)) r.Password = v;
            if (q.TryGetValue("username", out v)) r.User = v == "" ? null : v;
            r.Host = u.Host.Trim('[', ']');
            if (!u.IsDefaultPort && u.Port > 0) r.Port = u.Port;
            string path = u.AbsolutePath.Trim('/');
            if (path != "" && !int.TryParse(path, out r.Db))
                throw new ArgumentException(redacted + ": the path must be a database number");
            if (q.TryGetValue("db", out v) && !int.TryParse(v, out r.Db))
                throw new ArgumentException(redacted + ": db is not a number");
            return r;
        }

        // unix://[user:password@]/path[?db=N&password=...], split by hand:
        // System.Uri rejects user info without a host.
        static void SplitUnix(string raw, out string userInfo, out string path, out string query)
        {
            string rest = raw.Substring("unix://".Length);
            int q = rest.IndexOf('?');
            query = q < 0 ? "" : rest.Substring(q);
            if (q >= 0) rest = rest.Substring(0, q);
            int slash = rest.IndexOf('/'), at = rest.IndexOf('@');
            userInfo = null;
            if (at >= 0 && (slash < 0 || at < slash)) { userInfo = rest.Substring(0, at); rest = rest.Substring(at + 1); }
            path = Uri.UnescapeDataString(rest);
        }

        static RedisUrl ParseUnix(string raw)
        {
            string ui, path, query;
            SplitUnix(raw, out ui, out path, out query);
            if (!path.StartsWith("/", StringComparison.Ordinal))
                throw new ArgumentException(Redact(raw) + ": a unix:// URL needs an absolute socket path, as in unix:///run/redis.sock");
            var r = new RedisUrl { UnixPath = path };
            if (ui != null)
            {
                int colon = ui.IndexOf(':');
                if (colon < 0) r.Password = Uri.UnescapeDataString(ui);
                else
                {
                    string user = Uri.UnescapeDataString(ui.Substring(0, colon));
                    r.User = user == "" ? null : user;
                    r.Password = Uri.UnescapeDataString(ui.Substring(colon + 1));
                }
            }
            var qd = Query(query);
            string v;
            if (qd.TryGetValue("password", out v)) r.Password = v;
            if (qd.TryGetValue("username", out v)) r.User = v == "" ? null : v;
            if (qd.TryGetValue("db", out v) && !int.TryParse(v, out r.Db))
                throw new ArgumentException(Redact(raw) + ": db is not a number");
            return r;
        }

        static string RedactQuery(string query)
        {
            if (query == "" || query == "?") return "";
            var keys = new List<string>(Query(query).Keys);
            keys.Sort(StringComparer.Ordinal);
            return "?" + string.Join("&", keys.ConvertAll(k => Uri.EscapeDataString(k) + "=xxxxx"));
        }

        static Dictionary<string, string> Query(string q)
        {
            var d = new Dictionary<string, string>();
            foreach (var part in q.TrimStart('?').Split('&'))
            {
                if (part == "") continue;
                int eq = part.IndexOf('=');
                string k = Uri.UnescapeDataString(eq < 0 ? part : part.Substring(0, eq));
                d[k] = eq < 0 ? "" : Uri.UnescapeDataString(part.Substring(eq + 1).Replace('+', ' '));
            }
            return d;
        }

        public const string Withheld = "(URL withheld)";

        /// <summary>
        /// Returns raw fit for output: scheme, host and path, with "xxxxx" for
        /// any user info and every query value. Anything unparsable is withheld.
        /// </summary>
        public static string Redact(string raw)
        {
            if (raw != null && raw.StartsWith("unix://", StringComparison.Ordinal))
            {
                string ui, sock, query;
                SplitUnix(raw, out ui, out sock, out query);
                return "unix://" + (ui != null ? "xxxxx@" : "") + sock + RedactQuery(query);
            }
            Uri u;
            if (raw == null || !Uri.TryCreate(raw, UriKind.Absolute, out u)) return Withheld;
            if (u.Scheme != "redis" && u.Scheme != "rediss" && u.Scheme != "unix") return Withheld;
            if (u.Fragment != "") return Withheld;
            if (u.Scheme != "unix" && u.Host == "") return Withheld;
            string path = u.AbsolutePath;
            if (u.Scheme != "unix" && path.Trim('/', '0', '1', '2', '3', '4', '5', '6', '7', '8', '9') != "") path = "/xxxxx";
            string s = u.Scheme + "://" + (u.UserInfo != "" ? "xxxxx@" : "") + (u.Scheme == "unix" ? "" : u.Authority.Substring(u.Authority.IndexOf('@') + 1));
            if (u.Scheme != "unix" && raw.IndexOf("@", StringComparison.Ordinal) >= 0 && u.UserInfo == "") return Withheld;
            s += path == "/" && u.Scheme != "unix" ? "" : path;
            if (u.Query != "")
            {
                var keys = new List<string>(Query(u.Query).Keys);
                keys.Sort(StringComparer.Ordinal);
                s += "?" + string.Join("&", keys.ConvertAll(k => Uri.EscapeDataString(k) + "=xxxxx"));
            }
            return s;
        }

        /// <summary>The redacted form of this URL's target, for messages.</summary>
        public override string ToString()
        {
            return UnixPath != null ? "unix://" + UnixPath : "redis://" + Host + ":" + Port + "/" + Db;
        }
    }
}
