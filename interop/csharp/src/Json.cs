// A JSON codec whose output is byte-identical to Go's encoding/json for
// values made of Dictionary<string, object> (keys sorted by their UTF-8
// bytes, as Go sorts map keys), IList (arrays), double and other numbers,
// string, bool and null: compact, Go's escaping (<, >, & as \u003c \u003e
// \u0026; U+2028 and U+2029 escaped; \b \f \n \r \t; other control
// characters as \u00XX; invalid UTF-16 as \ufffd), and Go's float format
// (shortest round-trip digits, plain decimal for 1e-6 <= |x| < 1e21,
// otherwise exponent form such as 1e+21 or 1.5e-7).
using System;
using System.Collections;
using System.Collections.Generic;
using System.Globalization;
using System.Text;

namespace MemoLockNet
{
    public static class GoJson
    {
        /// <summary>Encodes v as Go's json.Marshal would encode the equivalent any value.</summary>
        public static byte[] Encode(object v)
        {
            var sb = new StringBuilder();
            Write(sb, v);
            return Bytes.Utf8.GetBytes(sb.ToString());
        }

        static void Write(StringBuilder sb, object v)
        {
            if (v == null) { sb.Append("null"); return; }
            if (v is bool) { sb.Append((bool)v ? "true" : "false"); return; }
            if (v is string) { WriteString(sb, (string)v); return; }
            if (v is double) { sb.Append(FormatFloat((double)v)); return; }
            if (v is float) { sb.Append(FormatFloat((float)v)); return; }
            if (v is int || v is long || v is short || v is sbyte || v is byte || v is ushort || v is uint || v is ulong)
            {
                sb.Append(Convert.ToString(v, CultureInfo.InvariantCulture));
                return;
            }
            if (v is IDictionary)
            {
                var d = (IDictionary)v;
                var keys = new List<string>();
                foreach (var k in d.Keys) keys.Add((string)k);
                keys.Sort(CompareUtf8);
                sb.Append('{');
                for (int i = 0; i < keys.Count; i++)
                {
                    if (i > 0) sb.Append(',');
                    WriteString(sb, keys[i]);
                    sb.Append(':');
                    Write(sb, d[keys[i]]);
                }
                sb.Append('}');
                return;
            }
            if (v is byte[])
            {
                // Go encodes []byte as a base64 string.
                WriteString(sb, Convert.ToBase64String((byte[])v));
                return;
            }
            if (v is IEnumerable)
            {
                sb.Append('[');
                bool first = true;
                foreach (var e in (IEnumerable)v)
                {
                    if (!first) sb.Append(',');
                    first = false;
                    Write(sb, e);
                }
                sb.Append(']');
                return;
            }
            throw new ArgumentException("memolock: cannot encode a " + v.GetType().Name + " as JSON");
        }

        /// <summary>Orders strings by their UTF-8 bytes (Go's string order).</summary>
        public static int CompareUtf8(string a, string b)
        {
            byte[] x = Bytes.Utf8.GetBytes(a), y = Bytes.Utf8.GetBytes(b);
            int n = Math.Min(x.Length, y.Length);
            for (int i = 0; i < n; i++) if (x[i] != y[i]) return x[i] - y[i];
            return x.Length - y.Length;
        }

        const string HexDigits = "0123456789abcdef";

        static void WriteString(StringBuilder sb, string s)
        {
            sb.Append('"');
            for (int i = 0; i < s.Length; i++)
            {
                char c = s[i];
                switch (c)
                {
                    case '"': sb.Append("\\\""); continue;
                    case '\\': sb.Append("\\\\"); continue;
                    case '\b': sb.Append("\\b"); continue;
                    case '\f': sb.Append("\\f"); continue;
                    case '\n': sb.Append("\\n"); continue;
                    case '\r': sb.Append("\\r"); continue;
                    case '\t': sb.Append("\\t"); continue;
                }
                if (c < 0x20 || c == '<' || c == '>' || c == '&' || c == '\u2028' || c == '\u2029')
                {
                    sb.Append("\\u").Append(((int)c).ToString("x4"));
                    continue;
                }
                if (char.IsHighSurrogate(c) && i + 1 < s.Length && char.IsLowSurrogate(s[i + 1]))
                {
                    sb.Append(c).Append(s[++i]);
                    continue;
                }
                if (char.IsSurrogate(c)) { sb.Append("\\ufffd"); continue; } // invalid UTF-16: Go writes U+FFFD for invalid UTF-8
                sb.Append(c);
            }
            sb.Append('"');
        }

        /// <summary>Formats f as Go's encoding/json does (float64).</summary>
        public static string FormatFloat(double f)
        {
            if (double.IsNaN(f) || double.IsInfinity(f))
                throw new ArgumentException("memolock: JSON cannot encode " + f.ToString(CultureInfo.InvariantCulture));
            if (f == 0) return BitConverter.DoubleToInt64Bits(f) < 0 ? "-0" : "0";
            string digits;
            int exp; // f = 0.digits * 10^exp
            Shortest(Math.Abs(f), out digits, out exp);
            string sign = f < 0 ? "-" : "";
            double abs = Math.Abs(f);
            if (abs < 1e-6 || abs >= 1e21)
            {
                // d.ddde±x, exponent at least one digit.
                string mant = digits.Length == 1 ? digits : digits[0] + "." + digits.Substring(1);
                int e = exp - 1;
                return sign + mant + "e" + (e < 0 ? "-" : "+") + Math.Abs(e).ToString(CultureInfo.InvariantCulture);
            }
            if (exp <= 0) return sign + "0." + new string('0', -exp) + digits;
            if (exp >= digits.Length) return sign + digits + new string('0', exp - digits.Length);
            return sign + digits.Substring(0, exp) + "." + digits.Substring(exp);
        }

        static void Shortest(double x, out string digits, out int exp) { GoFloat.Shortest(x, out digits, out exp); }

        /// <summary>Parses JSON text into Dictionary&lt;string, object&gt;, List&lt;object&gt;, double, string, bool and null.</summary>
        public static object Parse(string text)
        {
            int i = 0;
            var v = ParseValue(text, ref i);
            SkipWs(text, ref i);
            if (i != text.Length) throw new FormatException("json: trailing data at offset " + i);
            return v;
        }

        static void SkipWs(string s, ref int i) { while (i < s.Length && (s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r')) i++; }

        static object ParseValue(string s, ref int i)
        {
            SkipWs(s, ref i);
            if (i >= s.Length) throw new FormatException("json: unexpected end");
            char c = s[i];
            if (c == '{')
            {
                i++;
                var d = new Dictionary<string, object>();
                SkipWs(s, ref i);
                if (s[i] == '}') { i++; return d; }
                while (true)
                {
                    SkipWs(s, ref i);
                    string k = ParseString(s, ref i);
                    SkipWs(s, ref i);
                    Expect(s, ref i, ':');
                    d[k] = ParseValue(s, ref i);
                    SkipWs(s, ref i);
                    if (s[i] == ',') { i++; continue; }
                    Expect(s, ref i, '}');
                    return d;
                }
            }
            if (c == '[')
            {
                i++;
                var l = new List<object>();
                SkipWs(s, ref i);
                if (s[i] == ']') { i++; return l; }
                while (true)
                {
                    l.Add(ParseValue(s, ref i));
                    SkipWs(s, ref i);
                    if (s[i] == ',') { i++; continue; }
                    Expect(s, ref i, ']');
                    return l;
                }
            }
            if (c == '"') return ParseString(s, ref i);
            if (Lit(s, ref i, "true")) return true;
            if (Lit(s, ref i, "false")) return false;
            if (Lit(s, ref i, "null")) return null;
            int start = i;
            while (i < s.Length && "+-0123456789.eE".IndexOf(s[i]) >= 0) i++;
            if (start == i) throw new FormatException("json: unexpected '" + c + "' at offset " + i);
            return GoFloat.Parse(s.Substring(start, i - start));
        }

        static bool Lit(string s, ref int i, string lit)
        {
            if (string.CompareOrdinal(s, i, lit, 0, lit.Length) != 0) return false;
            i += lit.Length;
            return true;
        }

        static void Expect(string s, ref int i, char c)
        {
            if (i >= s.Length || s[i] != c) throw new FormatException("json: expected '" + c + "' at offset " + i);
            i++;
        }

        static string ParseString(string s, ref int i)
        {
            Expect(s, ref i, '"');
            var sb = new StringBuilder();
            while (true)
            {
                char c = s[i++];
                if (c == '"') return sb.ToString();
                if (c != '\\') { sb.Append(c); continue; }
                char e = s[i++];
                switch (e)
                {
                    case '"': sb.Append('"'); break;
                    case '\\': sb.Append('\\'); break;
                    case '/': sb.Append('/'); break;
                    case 'b': sb.Append('\b'); break;
                    case 'f': sb.Append('\f'); break;
                    case 'n': sb.Append('\n'); break;
                    case 'r': sb.Append('\r'); break;
                    case 't': sb.Append('\t'); break;
                    case 'u':
                        sb.Append((char)int.Parse(s.Substring(i, 4), NumberStyles.HexNumber));
                        i += 4;
                        break;
                    default: throw new FormatException("json: bad escape \\" + e);
                }
            }
        }
    }
}
