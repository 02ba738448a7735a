// Go's time.ParseDuration: "10s", "1m30s", "500ms", "1.5h", "-2s", "0".
using System;
using System.Globalization;

namespace MemoLockNet
{
    public static class GoDuration
    {
        /// <summary>Parses s as Go does; false for anything Go rejects. Result in nanoseconds.</summary>
        public static bool TryParseNanos(string s, out long nanos)
        {
            nanos = 0;
            if (s == null) return false;
            bool neg = false;
            if (s != "" && (s[0] == '-' || s[0] == '+')) { neg = s[0] == '-'; s = s.Substring(1); }
            if (s == "0") return true;
            if (s == "") return false;
            decimal total = 0;
            int i = 0;
            while (i < s.Length)
            {
                int start = i;
                while (i < s.Length && char.IsDigit(s[i]) && s[i] < 128) i++;
                string whole = s.Substring(start, i - start);
                string frac = "";
                if (i < s.Length && s[i] == '.')
                {
                    i++;
                    int fs = i;
                    while (i < s.Length && s[i] >= '0' && s[i] <= '9') i++;
                    frac = s.Substring(fs, i - fs);
                }
                if (whole == "" && frac == "") return false; // no digits
                int us = i;
                while (i < s.Length && s[i] != '.' && !(s[i] >= '0' && s[i] <= '9')) i++;
                string unit = s.Substring(us, i - us);
                long mult;
                switch (unit)
                {
                    case "ns": mult = 1; break;
                    case "us": case "\u00b5s": case "\u03bcs": mult = 1000; break;
                    case "ms": mult = 1000000; break;
                    case "s": mult = 1000000000; break;
                    case "m": mult = 60L * 1000000000; break;
                    case "h": mult = 3600L * 1000000000; break;
                    default: return false; // missing or unknown unit
                }
                decimal num;
                try
                {
                    num = decimal.Parse((whole == "" ? "0" : whole) + (frac == "" ? "" : "." + frac), CultureInfo.InvariantCulture);
                    total += decimal.Truncate(num * mult);
                }
                catch (OverflowException) { return false; }
                if (total > long.MaxValue) return false;
            }
            if (neg) total = -total;
            if (total > long.MaxValue || total < long.MinValue) return false;
            nanos = (long)total;
            return true;
        }

        /// <summary>Parses s as Go does; throws ArgumentException naming s otherwise.</summary>
        public static TimeSpan Parse(string s)
        {
            long n;
            if (!TryParseNanos(s, out n)) throw new ArgumentException("invalid duration \"" + s + "\"");
            return TimeSpan.FromTicks(n / 100);
        }
    }
}
