// The test harness: a minimal runner (each test on its own thread with a
// timeout, failures reported by name) and real redis-server processes on
// free ports, killed after. Never the shared server on 6379.
using System;
using System.Collections.Generic;
using System.Diagnostics;
using System.IO;
using System.Linq;
using System.Net;
using System.Net.Sockets;
using System.Reflection;
using System.Text;
using System.Threading;
using MemoLockNet;

namespace MemoLockTests
{
    [AttributeUsage(AttributeTargets.Method)]
    sealed class TestAttribute : Attribute
    {
        public int TimeoutSeconds = 60;
    }

    sealed class AssertionException : Exception { public AssertionException(string m) : base(m) { } }

    static class Assert
    {
        public static void True(bool cond, string what) { if (!cond) throw new AssertionException(what); }
        public static void Equal<T>(T want, T got, string what)
        {
            if (!EqualityComparer<T>.Default.Equals(want, got)) throw new AssertionException(what + ": want " + want + ", got " + got);
        }
        public static void Bytes(byte[] want, byte[] got, string what)
        {
            if (!MemoLockNet.Bytes.Equal(want, got))
                throw new AssertionException(what + ": want " + Show(want) + ", got " + Show(got));
        }
        public static string Show(byte[] b) { return b == null ? "null" : "\"" + Encoding.UTF8.GetString(b).Replace("\n", "\\n") + "\" (" + b.Length + " bytes)"; }
        public static T Throws<T>(Action a, string what) where T : Exception
        {
            try { a(); }
            catch (T e) { return e; }
            catch (Exception e) { throw new AssertionException(what + ": want " + typeof(T).Name + ", got " + e.GetType().Name + ": " + e.Message); }
            throw new AssertionException(what + ": want " + typeof(T).Name + ", got no exception");
        }
        /// <summary>Waits until cond holds, up to seconds.</summary>
        public static void Eventually(Func<bool> cond, double seconds, string what)
        {
            var sw = Stopwatch.StartNew();
            while (!cond())
            {
                if (sw.Elapsed.TotalSeconds > seconds) throw new AssertionException("timed out after " + seconds + "s waiting for " + what);
                Thread.Sleep(20);
            }
        }
    }

    /// <summary>A redis-server of our own on a free port (and optionally a unix socket), killed on Dispose.</summary>
    sealed class RedisServer : IDisposable
    {
        static readonly List<RedisServer> live = new List<RedisServer>();
        readonly Process proc;
        public readonly int Port;
        public readonly string Socket;
        public readonly string Password;
        readonly string dir;

        public RedisServer(string password = null, bool unixSocket = false, int port = 0)
        {
            Port = port != 0 ? port : FreePort();
            Password = password;
            dir = Path.Combine(Path.GetTempPath(), "memolock-cs-" + Guid.NewGuid().ToString("N").Substring(0, 8));
            Directory.CreateDirectory(dir);
            var args = new List<string> { "--port", Port.ToString(), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", dir };
            if (password != null) { args.Add("--requirepass"); args.Add(password); }
            if (unixSocket) { Socket = Path.Combine(dir, "redis.sock"); args.Add("--unixsocket"); args.Add(Socket); args.Add("--unixsocketperm"); args.Add("700"); }
            var psi = new ProcessStartInfo("/usr/bin/redis-server", string.Join(" ", args.Select(a => "'" + a + "'")))
            {
                UseShellExecute = false,
                RedirectStandardOutput = true,
            };
            proc = Process.Start(psi);
            new Thread(() => { try { proc.StandardOutput.BaseStream.CopyTo(Stream.Null); } catch { } }) { IsBackground = true }.Start();
            lock (live) live.Add(this);
            var sw = Stopwatch.StartNew();
            while (true)
            {
                try
                {
                    using (var c = RespConnection.Open(Url(), 1000)) if ("PONG".Equals(c.Call("PING"))) break;
                }
                catch (Exception) when (sw.Elapsed.TotalSeconds < 10) { Thread.Sleep(20); }
            }
        }

        static int FreePort()
        {
            var l = new TcpListener(IPAddress.Loopback, 0);
            l.Start();
            int p = ((IPEndPoint)l.LocalEndpoint).Port;
            l.Stop();
            return p;
        }

        /// <summary>Sends the server a signal (STOP, CONT).</summary>
        public void Signal(string sig) { Process.Start("kill", "-" + sig + " " + proc.Id).WaitForExit(); }

        public string UrlText { get { return "redis://" + (Password != null ? ":" + Password + "@" : "") + "127.0.0.1:" + Port; } }
        public RedisUrl Url() { return RedisUrl.Parse(UrlText); }
        public RespTransport Transport() { return new RespTransport(Url()); }

        /// <summary>Runs one command on a fresh connection.</summary>
        public object Call(params object[] args)
        {
            using (var c = RespConnection.Open(Url(), 5000)) return c.Call(args);
        }

        public void Dispose()
        {
            lock (live) live.Remove(this);
            try { if (!proc.HasExited) { Signal("CONT"); proc.Kill(); } proc.WaitForExit(5000); } catch { }
            try { Directory.Delete(dir, true); } catch { }
        }

        public static void KillAll()
        {
            List<RedisServer> all;
            lock (live) all = new List<RedisServer>(live);
            foreach (var s in all) s.Dispose();
        }
    }

    /// <summary>The output of a memolock.exe process.</summary>
    sealed class CliResult
    {
        public int Code;
        public byte[] Stdout;
        public string Stderr;
        public double Seconds;
        public override string ToString() { return "exit " + Code + ", stdout " + Assert.Show(Stdout) + ", stderr: " + Stderr; }
    }

    /// <summary>A running memolock (the launcher, bin/memolock, unless said otherwise); Dispose kills it if still running.</summary>
    sealed class Cli : IDisposable
    {
        /// <summary>bin/memolock: the launcher that passes argv on as raw bytes.</summary>
        public static string Launcher;
        /// <summary>bin/memolock.exe, for runs through mono without the launcher.</summary>
        public static string Exe;
        static readonly List<Cli> live = new List<Cli>();
        public readonly Process Proc;
        readonly MemoryStream stdout = new MemoryStream();
        readonly StringBuilder stderr = new StringBuilder();
        readonly Thread outT, errT;
        readonly Stopwatch sw = Stopwatch.StartNew();

        public Cli(params string[] args) : this(null, args) { }

        /// <summary>Starts memolock with args, and env set in its environment.</summary>
        public Cli(IDictionary<string, string> env, params string[] args) : this(env, Launcher, args) { }

        /// <summary>Starts program with args (quoted for Mono's command line), and env set in its environment.</summary>
        public Cli(IDictionary<string, string> env, string program, IEnumerable<string> args)
        {
            var psi = new ProcessStartInfo(program, string.Join(" ", args.Select(a => "'" + a.Replace("'", "'\\''") + "'")))
            {
                UseShellExecute = false,
                RedirectStandardOutput = true,
                RedirectStandardError = true,
            };
            psi.EnvironmentVariables.Remove("MEMOLOCK_REDIS");
            psi.EnvironmentVariables["MEMOLOCK"] = Launcher; // for Shell scripts
            if (env != null)
                foreach (var kv in env)
                {
                    if (kv.Value == null) psi.EnvironmentVariables.Remove(kv.Key);
                    else psi.EnvironmentVariables[kv.Key] = kv.Value;
                }
            Proc = Process.Start(psi);
            lock (live) live.Add(this);
            outT = new Thread(() => { try { Proc.StandardOutput.BaseStream.CopyTo(stdout); } catch { } }) { IsBackground = true };
            errT = new Thread(() =>
            {
                try
                {
                    string line;
                    while ((line = Proc.StandardError.ReadLine()) != null) lock (stderr) stderr.AppendLine(line);
                }
                catch { }
            }) { IsBackground = true };
            outT.Start();
            errT.Start();
        }

        public string StderrSoFar { get { lock (stderr) return stderr.ToString(); } }

        public CliResult Wait(int seconds = 60)
        {
            if (!Proc.WaitForExit(seconds * 1000)) { Dispose(); throw new AssertionException("memolock.exe still running after " + seconds + "s: " + StderrSoFar); }
            Proc.WaitForExit();
            outT.Join(5000);
            errT.Join(5000);
            lock (live) live.Remove(this);
            return new CliResult { Code = Proc.ExitCode, Stdout = stdout.ToArray(), Stderr = StderrSoFar, Seconds = sw.Elapsed.TotalSeconds };
        }

        public static CliResult Run(params string[] args) { using (var c = new Cli(args)) return c.Wait(); }

        /// <summary>
        /// Runs a shell script, with $MEMOLOCK naming the launcher: the way to
        /// hand memolock arguments that are not UTF-8, which this runner's
        /// Process.Start cannot pass ("$(printf '\\377')").
        /// </summary>
        public static CliResult Shell(string script, IDictionary<string, string> env = null)
        {
            using (var c = new Cli(env, "/bin/sh", new[] { "-c", script })) return c.Wait();
        }

        /// <summary>Runs memolock.exe through mono, without the launcher.</summary>
        public static CliResult RunMono(params string[] args)
        {
            using (var c = new Cli(null, "mono", new[] { Exe }.Concat(args))) return c.Wait();
        }

        /// <summary>Kills the process, and the command it runs if any.</summary>
        public void Dispose()
        {
            try
            {
                if (!Proc.HasExited)
                {
                    var below = Descendants(Proc.Id);
                    Proc.Kill();
                    Proc.WaitForExit(5000);
                    foreach (var pid in below) { try { Process.GetProcessById(pid).Kill(); } catch { } }
                }
            }
            catch { }
            lock (live) live.Remove(this);
        }

        /// <summary>Every process below root, from /proc.</summary>
        public static List<int> Descendants(int root)
        {
            var parent = new Dictionary<int, int>();
            foreach (var dir in Directory.GetDirectories("/proc"))
            {
                int pid;
                if (!int.TryParse(Path.GetFileName(dir), out pid)) continue;
                try
                {
                    string stat = File.ReadAllText(dir + "/stat");
                    parent[pid] = int.Parse(stat.Substring(stat.LastIndexOf(')') + 2).Split(' ')[1]);
                }
                catch { }
            }
            var res = new List<int>();
            foreach (var pid in parent.Keys)
                for (int p = pid; parent.ContainsKey(p) && p > 1; p = parent[p])
                    if (parent[p] == root) { res.Add(pid); break; }
            return res;
        }

        public static void KillAll()
        {
            List<Cli> all;
            lock (live) all = new List<Cli>(live);
            foreach (var c in all) c.Dispose();
        }
    }

    static class Runner
    {
        public static string Root; // interop/csharp

        static int Main(string[] args)
        {
            Root = Path.GetFullPath(Path.Combine(Path.GetDirectoryName(typeof(Runner).Assembly.Location), ".."));
            Cli.Exe = Path.Combine(Root, "bin", "memolock.exe");
            Cli.Launcher = Path.Combine(Root, "bin", "memolock");
            var tests = typeof(Runner).Assembly.GetTypes()
                .SelectMany(t => t.GetMethods(BindingFlags.Static | BindingFlags.Public | BindingFlags.NonPublic))
                .Where(m => m.GetCustomAttribute<TestAttribute>() != null)
                .Where(m => args.Length == 0 || args.Any(a => m.Name.Contains(a)))
                .OrderBy(m => m.DeclaringType.Name).ThenBy(m => m.MetadataToken)
                .ToList();
            // Should a test's own thread throw, Mono ends the process: kill
            // what we started first.
            AppDomain.CurrentDomain.UnhandledException += (o, e) => { Cli.KillAll(); RedisServer.KillAll(); };
            var failed = new List<string>();
            var total = Stopwatch.StartNew();
            try
            {
                // Independent tests run a few at a time: most of their time is waiting.
                var queue = new Queue<MethodInfo>(tests);
                var workers = new List<Thread>();
                for (int k = 0; k < 4; k++)
                {
                    var t = new Thread(() =>
                    {
                        while (true)
                        {
                            MethodInfo m;
                            lock (queue) { if (queue.Count == 0) return; m = queue.Dequeue(); }
                            string result = RunOne(m);
                            lock (queue)
                            {
                                Console.WriteLine(result);
                                if (!result.StartsWith("ok")) failed.Add(m.Name);
                            }
                        }
                    });
                    t.Start();
                    workers.Add(t);
                }
                foreach (var t in workers) t.Join();
            }
            finally
            {
                Cli.KillAll();
                RedisServer.KillAll();
            }
            Console.WriteLine((failed.Count == 0 ? "PASS" : "FAIL") + ": " + (tests.Count - failed.Count) + "/" + tests.Count + " tests passed in " + total.Elapsed.TotalSeconds.ToString("0.0") + "s");
            foreach (var f in failed) Console.WriteLine("  failed: " + f);
            return failed.Count == 0 ? 0 : 1;
        }

        static string RunOne(MethodInfo m)
        {
            int timeout = m.GetCustomAttribute<TestAttribute>().TimeoutSeconds;
            Exception err = null;
            var sw = Stopwatch.StartNew();
            var t = new Thread(() =>
            {
                try { m.Invoke(null, null); }
                catch (TargetInvocationException e) { err = e.InnerException; }
                catch (Exception e) { err = e; }
            }) { IsBackground = true };
            t.Start();
            string time = "";
            if (!t.Join(timeout * 1000)) err = new AssertionException("timed out after " + timeout + "s");
            time = " (" + sw.Elapsed.TotalSeconds.ToString("0.00") + "s)";
            if (err == null) return "ok   " + m.Name + time;
            return "FAIL " + m.Name + time + "\n     " + (err is AssertionException ? err.Message : err.ToString()).Replace("\n", "\n     ");
        }
    }
}
