// How the command line reached Main, and how strings go back out to exec.
//
// Go's CLI takes its arguments as raw bytes: an id may be any bytes. Mono
// decodes the process's argv at start-up through MONO_EXTERNAL_ENCODINGS
// (the encodings it names first, then UTF-8) and exits 255 before Main
// ("Cannot determine the text encoding for argument N") on one it cannot
// decode. The launcher (memolock.sh, installed as bin/memolock) sets it to
// latin1, which decodes every byte to the char of the same number, and sets
// MEMOLOCK_ARGV_ENCODING=latin1 to say so: Main then has the exact bytes.
//
// The command is started with posix_spawn (Spawn.cs), its argv as the bytes
// they came as. The file APIs still speak UTF-8, so paths are decoded before
// they are looked at.
using System;
using System.Collections.Generic;
using System.Diagnostics;
using System.Text;
using MemoLockNet;

namespace MemoLockCli
{
    static class Argv
    {
        const string ModeVar = "MEMOLOCK_ARGV_ENCODING", MonoVar = "MONO_EXTERNAL_ENCODINGS", CallerMonoVar = "MEMOLOCK_CALLER_MONO_EXTERNAL_ENCODINGS";
        static readonly Encoding strictUtf8 = new UTF8Encoding(false, true);

        /// <summary>True when argv arrived as latin1 (through the launcher): one char per byte.</summary>
        public static readonly bool Latin1 = Environment.GetEnvironmentVariable(ModeVar) == "latin1" && Environment.GetEnvironmentVariable(MonoVar) == "latin1";

        /// <summary>The bytes an argument had on the command line.</summary>
        public static byte[] Bytes(string arg) { return Latin1 ? MemoLockNet.Bytes.FromLatin1(arg) : MemoLockNet.Bytes.Utf8.GetBytes(arg); }

        /// <summary>An argument as text: its bytes decoded as UTF-8; false if they are not UTF-8.</summary>
        public static bool TryText(string arg, out string text)
        {
            if (!Latin1) { text = arg; return true; }
            try { text = strictUtf8.GetString(Bytes(arg)); return true; }
            catch (DecoderFallbackException) { text = null; return false; }
        }

        /// <summary>An argument for messages: invalid UTF-8 shows as U+FFFD.</summary>
        public static string Show(string arg) { return Latin1 ? MemoLockNet.Bytes.Utf8.GetString(Bytes(arg)) : arg; }

        /// <summary>Text in the form the arguments came in (one char per byte through the launcher), which Bytes turns back into bytes for exec.</summary>
        public static string ForExec(string text) { return Latin1 ? MemoLockNet.Bytes.Latin1(MemoLockNet.Bytes.Utf8.GetBytes(text)) : text; }

        /// <summary>A path in exec form as the file APIs take it; null if it is not UTF-8 (they cannot name it).</summary>
        public static string ForFiles(string execForm)
        {
            string text;
            return TryText(execForm, out text) ? text : null;
        }
    }
}
