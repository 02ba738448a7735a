// Exact float64 conversions with BigInteger, because Mono's double.Parse and
// "R"/"E16" formatting are not reliably correctly rounded: the shortest
// decimal that reads back as the same double (Go's strconv 'g' -1 digits),
// and correctly rounded decimal to double parsing.
using System;
using System.Globalization;
using System.Numerics;

namespace MemoLockNet
{
    static class GoFloat
    {
        // x = mant * 2^exp exactly, mant < 2^53.
        static void Decompose(double x, out long mant, out int exp)
        {
            long bits = BitConverter.DoubleToInt64Bits(x) & long.MaxValue;
            int e = (int)(bits >> 52);
            long m = bits & ((1L << 52) - 1);
            if (e == 0) { mant = m; exp = -1074; }
            else { mant = m | (1L << 52); exp = e - 1075; }
        }

        // a / b as an exact fraction of BigIntegers for a * 2^e.
        static void Frac(BigInteger a, int e, out BigInteger num, out BigInteger den)
        {
            if (e >= 0) { num = a << e; den = BigInteger.One; }
            else { num = a; den = BigInteger.One << -e; }
        }

        static BigInteger Pow10(int k) { return BigInteger.Pow(10, k); }

        // Compares p/q with r/s.
        static int Cmp(BigInteger p, BigInteger q, BigInteger r, BigInteger s) { return (p * s).CompareTo(r * q); }

        /// <summary>The shortest digits d1d2...dn and exponent such that x (&gt; 0, finite) = 0.d1d2...dn * 10^exp reads back as x.</summary>
        public static void Shortest(double x, out string digits, out int exp)
        {
            long mant;
            int e2;
            Decompose(x, out mant, out e2);
            // The interval of reals that round to x: halfway to each neighbour.
            BigInteger xn, xd, lown, lowd, highn, highd;
            Frac(mant, e2, out xn, out xd);
            Frac(2 * (BigInteger)mant + 1, e2 - 1, out highn, out highd);
            bool boundary = mant == (1L << 52) && e2 > -1074; // the gap below is half as wide
            if (boundary) Frac(4 * (BigInteger)mant - 1, e2 - 2, out lown, out lowd);
            else Frac(2 * (BigInteger)mant - 1, e2 - 1, out lown, out lowd);
            bool inclusive = mant % 2 == 0; // a tie reads back as the even mantissa

            // k10 with 10^k10 <= x < 10^(k10+1).
            int k10 = (int)Math.Floor(Math.Log10(x));
            while (Cmp(xn, xd, Pow10Frac(k10, true), Pow10Frac(k10, false)) < 0) k10--;
            while (Cmp(xn, xd, Pow10Frac(k10 + 1, true), Pow10Frac(k10 + 1, false)) >= 0) k10++;

            for (int p = 1; p <= 17; p++)
            {
                int k = k10 - p + 1; // candidate = D * 10^k
                BigInteger sn, sd; // x / 10^k
                if (k >= 0) { sn = xn; sd = xd * Pow10(k); } else { sn = xn * Pow10(-k); sd = xd; }
                BigInteger rem;
                BigInteger d = BigInteger.DivRem(sn, sd, out rem);
                int c = (2 * rem).CompareTo(sd);
                if (c > 0 || (c == 0 && !d.IsEven)) d += 1;
                foreach (var cand in new[] { d, d - 1, d + 1 })
                {
                    if (cand <= 0) continue;
                    BigInteger cn, cd;
                    if (k >= 0) { cn = cand * Pow10(k); cd = BigInteger.One; } else { cn = cand; cd = Pow10(-k); }
                    int lo = Cmp(cn, cd, lown, lowd), hi = Cmp(cn, cd, highn, highd);
                    bool inside = inclusive ? (lo >= 0 && hi <= 0) : (lo > 0 && hi < 0);
                    if (!inside) continue;
                    string s = cand.ToString(CultureInfo.InvariantCulture);
                    exp = k + s.Length;
                    digits = s.TrimEnd('0');
                    return;
                }
            }
            throw new InvalidOperationException("no round-trip digits for " + x);
        }

        static BigInteger Pow10Frac(int k, bool numerator)
        {
            if (k >= 0) return numerator ? Pow10(k) : BigInteger.One;
            return numerator ? BigInteger.One : Pow10(-k);
        }

        /// <summary>Parses a JSON number to the nearest double (ties to even).</summary>
        public static double Parse(string s)
        {
            int i = 0;
            bool neg = false;
            if (i < s.Length && (s[i] == '-' || s[i] == '+')) { neg = s[i] == '-'; i++; }
            BigInteger d = BigInteger.Zero;
            int k = 0, digits = 0;
            bool dot = false;
            for (; i < s.Length; i++)
            {
                char c = s[i];
                if (c >= '0' && c <= '9') { d = d * 10 + (c - '0'); digits++; if (dot) k--; }
                else if (c == '.' && !dot) dot = true;
                else break;
            }
            if (digits == 0) throw new FormatException("json: bad number \"" + s + "\"");
            if (i < s.Length)
            {
                if (s[i] != 'e' && s[i] != 'E') throw new FormatException("json: bad number \"" + s + "\"");
                k += int.Parse(s.Substring(i + 1), NumberStyles.AllowLeadingSign, CultureInfo.InvariantCulture);
            }
            double r = ToDouble(d, k);
            return neg ? -r : r;
        }

        // The double nearest d * 10^k.
        static double ToDouble(BigInteger d, int k)
        {
            if (d.IsZero) return 0;
            if (k > 400) return double.PositiveInfinity;
            if (k < -800) return 0;
            BigInteger num = k >= 0 ? d * Pow10(k) : d, den = k >= 0 ? BigInteger.One : Pow10(-k);
            // e2 with 2^52 <= num/den / 2^e2 < 2^53.
            int e2 = (int)(BigInteger.Log(num, 2) - BigInteger.Log(den, 2)) - 52;
            while (true)
            {
                BigInteger n = num, q = den;
                if (e2 >= 0) q <<= e2; else n <<= -e2;
                if (n < (q << 52)) { e2--; continue; }
                if (n >= (q << 53)) { e2++; continue; }
                break;
            }
            if (e2 < -1074) e2 = -1074; // subnormal: fixed exponent
            BigInteger nn = num, qq = den;
            if (e2 >= 0) qq <<= e2; else nn <<= -e2;
            BigInteger rem;
            BigInteger m = BigInteger.DivRem(nn, qq, out rem);
            int c = (2 * rem).CompareTo(qq);
            if (c > 0 || (c == 0 && !m.IsEven)) m += 1;
            if (m == (BigInteger.One << 53)) { m >>= 1; e2++; }
            if (e2 > 971) return double.PositiveInfinity;
            long mant = (long)m;
            if (mant < (1L << 52)) return BitConverter.Int64BitsToDouble(mant); // subnormal (e2 == -1074)
            long bits = ((long)(e2 + 1075) << 52) | (mant & ((1L << 52) - 1));
            return BitConverter.Int64BitsToDouble(bits);
        }
    }
}
