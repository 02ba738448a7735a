// Ids given as text for bytes a shell cannot pass: --id-hex and --id-base64,
// decoded as Go's encoding/hex and encoding/base64 (StdEncoding, or
// RawStdEncoding without padding) decode them.
using System;

namespace MemoLockCli
{
    static class IdCodec
    {
        /// <summary>Hex digits of either case, two per byte; null, or what is wrong.</summary>
        public static string FromHex(string s, out byte[] b)
        {
            b = null;
            for (int i = 0; i < s.Length; i++)
                if (Nibble(s[i]) < 0) return "'" + s[i] + "' at " + i + " is not a hex digit";
            if (s.Length % 2 != 0) return "odd length: " + s.Length + " hex digits (two per byte)";
            b = new byte[s.Length / 2];
            for (int i = 0; i < b.Length; i++) b[i] = (byte)(Nibble(s[2 * i]) << 4 | Nibble(s[2 * i + 1]));
            return null;
        }

        static int Nibble(char c)
        {
            if (c >= '0' && c <= '9') return c - '0';
            if (c >= 'a' && c <= 'f') return c - 'a' + 10;
            if (c >= 'A' && c <= 'F') return c - 'A' + 10;
            return -1;
        }

        /// <summary>Standard base64 (A-Z a-z 0-9 + /), with or without its '=' padding; null, or what is wrong.</summary>
        public static string FromBase64(string s, out byte[] b)
        {
            b = null;
            int end = s.Length;
            while (end > 0 && s[end - 1] == '=') end--;
            int pad = s.Length - end;
            for (int i = 0; i < end; i++)
            {
                char c = s[i];
                bool ok = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '+' || c == '/';
                if (!ok) return "'" + c + "' at " + i + " is not in the standard base64 alphabet (A-Z a-z 0-9 + /, then = padding)";
            }
            if (end % 4 == 1) return "a length of " + end + " base64 characters cannot be decoded";
            int want = (4 - end % 4) % 4;
            if (pad != 0 && pad != want) return "wrong padding: " + pad + " '=' after " + end + " characters (want " + want + ")";
            b = Convert.FromBase64String(s.Substring(0, end) + new string('=', want));
            return null;
        }
    }
}
