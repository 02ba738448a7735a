// What `run` says on stderr while it works, as the Go CLI says it
// (cmd/memolock/status.go).
//
// On a terminal: one line drawn again in place, what the invocation waits
// for and who computes it, or how long the command has run here; the
// command's stderr reaches the terminal through Relay, so that the line
// stays below it, and the line is erased before anything else is written.
// Off a terminal (a cron or CI log): a line when a wait starts, then at most
// one every 30 s, and one if the lock came free and the command runs here
// after all; the holder says nothing there, its command's output is its log.
//
// Mono ships no isatty (Mono.Posix.dll, which has one, is not installed with
// mono-runtime): the C library's isatty, tcgetpgrp, getpgrp and the
// TIOCGWINSZ ioctl are called directly, as Go's x/term does.
using System;
using System.Diagnostics;
using System.Globalization;
using System.IO;
using System.Runtime.InteropServices;
using System.Text;
using System.Threading;

namespace MemoLockCli
{
    /// <summary>stderr as bytes: run's own lines, each starting "PROG CMD: " once, and the command's bytes relayed.</summary>
    sealed class ErrOut
    {
        static readonly Stream s = Console.OpenStandardError();
        static readonly object mu = new object();
        public readonly string Prefix;
        /// <summary>Held while a line is drawn or written: one writer at a time, whichever ErrOut.</summary>
        public object Mu { get { return mu; } }

        public ErrOut(string prefix) { Prefix = prefix; }

        public void Write(byte[] b)
        {
            lock (Mu)
            {
                try { s.Write(b, 0, b.Length); s.Flush(); } catch (IOException) { }
            }
        }

        public void Write(string text) { Write(Encoding.UTF8.GetBytes(text)); }

        public void Line(string line) { Write(Prefix + line + "\n"); }
    }

    sealed class Status
    {
        [DllImport("libc")] static extern int isatty(int fd);
        [DllImport("libc")] static extern int tcgetpgrp(int fd);
        [DllImport("libc")] static extern int getpgrp();
        [DllImport("libc", SetLastError = true)] static extern int ioctl(int fd, ulong request, ushort[] winsize);
        const int StderrFd = 2;
        const ulong TIOCGWINSZ = 0x5413;
        const int RedrawEveryMs = 200, StillWaitEveryMs = 30000;

        readonly ErrOut err;
        readonly string name;
        bool tty;
        string holder = "";
        Stopwatch since;      // the command's time here; null while it does not run here
        Stopwatch waitedFor;  // since the wait started
        bool drawn, held;
        readonly Stopwatch sinceLog = new Stopwatch();
        readonly ManualResetEvent quit = new ManualResetEvent(false);
        readonly Thread loop;

        public Status(ErrOut err, string name)
        {
            this.err = err;
            this.name = name;
            try { tty = isatty(StderrFd) == 1; } catch (Exception) { tty = false; } // no libc to ask: a log
            loop = new Thread(Loop) { IsBackground = true, Name = "memolock-status" };
            loop.Start();
        }

        /// <summary>Whether the status is a line drawn in place: the command's stderr should then reach the terminal through Relay.</summary>
        public bool OnTerminal { get { lock (err.Mu) return tty; } }

        void Loop()
        {
            int every = tty ? RedrawEveryMs : StillWaitEveryMs;
            while (!quit.WaitOne(every))
            {
                lock (err.Mu)
                {
                    if (tty) Draw();
                    else if (holder != "" && since == null && sinceLog.ElapsedMilliseconds >= StillWaitEveryMs - 1000)
                        Log("still waiting for " + name + ", computed by " + holder + " (" + Seconds(waitedFor) + ")");
                }
            }
        }

        static string Seconds(Stopwatch sw) { return sw.Elapsed.TotalSeconds.ToString("0.0", CultureInfo.InvariantCulture) + "s"; }

        /// <summary>OnWait: a lookup found the lock held by h.</summary>
        public void Waiting(string id, string h)
        {
            lock (err.Mu)
            {
                if (holder == "") waitedFor = Stopwatch.StartNew();
                holder = h;
                since = null;
                if (tty) Draw();
                else Log("waiting for " + name + ", computed by " + h);
            }
        }

        /// <summary>The command starts here.</summary>
        public void Computing()
        {
            lock (err.Mu)
            {
                since = Stopwatch.StartNew();
                if (tty) Draw();
                else if (holder != "") Log("the lock of " + name + " came free without a value after " + Seconds(waitedFor) + ": running the command here");
            }
        }

        /// <summary>Erases the line and stops: what the command writes from now on passes as it is.</summary>
        public void Done()
        {
            quit.Set();
            loop.Join();
            lock (err.Mu)
            {
                Erase();
                tty = false;
            }
        }

        /// <summary>Passes b, from the command's stderr, to the terminal below the line, and draws the line again after a whole line.</summary>
        public void Relay(byte[] b)
        {
            lock (err.Mu)
            {
                Erase();
                err.Write(b);
                held = b.Length > 0 && b[b.Length - 1] != '\n';
                if (tty) Draw();
            }
        }

        void Log(string line)
        {
            sinceLog.Restart();
            err.Line(line);
        }

        static bool Foreground()
        {
            // A job in the background must not draw over the shell's prompt,
            // nor over the job that has the terminal.
            try { int pg = tcgetpgrp(StderrFd); return pg > 0 && pg == getpgrp(); }
            catch (Exception) { return false; }
        }

        static int Width()
        {
            var ws = new ushort[4];
            try { if (ioctl(StderrFd, TIOCGWINSZ, ws) == 0 && ws[1] > 1) return ws[1]; } catch (Exception) { }
            return 80;
        }

        void Draw()
        {
            if (held || !Foreground()) return;
            // A line longer than the terminal wraps, and \r then goes back to
            // its last row only: keep it on one, shortening the holder's token
            // first, so that the elapsed time stays in sight.
            int width = Width();
            string line;
            if (since != null) line = err.Prefix + "computing " + name + " (" + Seconds(since) + ")";
            else if (holder != "")
            {
                string before = err.Prefix + "waiting for " + name + ", computed by ", after = " (" + Seconds(waitedFor) + ")";
                int room = width - 1 - (before + after).Length;
                line = room < 9 ? err.Prefix + "waiting for " + name + after : before + Shorten(holder, room) + after;
            }
            else return;
            err.Write("\r" + Truncate(line, width - 1) + "\x1b[K");
            drawn = true;
        }

        void Erase()
        {
            if (!drawn) return;
            err.Write("\r\x1b[K");
            drawn = false;
        }

        /// <summary>s with its middle cut out, to at most n chars: a token's start and its host and pid tell holders apart.</summary>
        static string Shorten(string s, int n)
        {
            if (s.Length <= n || n < 9) return s;
            int keep = n - 3;
            return s.Substring(0, keep - keep / 2) + "..." + s.Substring(s.Length - keep / 2);
        }

        static string Truncate(string s, int n) { return s.Length <= n || n < 4 ? s : s.Substring(0, n - 3) + "..."; }
    }
}
