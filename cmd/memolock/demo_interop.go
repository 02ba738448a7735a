package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"
)

// demoLimit bounds the whole interop demo.
const demoLimit = 3 * time.Minute

// A peer is one implementation's `run` command, as the interop demo finds
// it on this machine.
type peer struct {
	name    string
	argv    []string
	env     []string
	missing string // why it cannot run, if it cannot
}

// findPeers looks for the Go peer (this binary), the Python peer (Debian's
// python3 with python3-redis) and the C# peer (mono; built with mcs if
// need be) under dir, the repository's interop directory.
func findPeers(dir string, stderr io.Writer) []*peer {
	self, err := os.Executable()
	goPeer := &peer{name: "Go", argv: []string{self}}
	if err != nil {
		goPeer.missing = fmt.Sprintf("cannot find this binary: %v", err)
	}

	const python = "/usr/bin/python3" // Debian's, which has python3-redis
	py := &peer{name: "Python", argv: []string{python, "-m", "memolock"},
		env: []string{"PYTHONPATH=" + filepath.Join(dir, "python"), "PYTHONDONTWRITEBYTECODE=1"}}
	switch {
	case !exists(filepath.Join(dir, "python", "memolock", "__main__.py")):
		py.missing = fmt.Sprintf("no Python peer in %s (pass --interop-dir with the interop directory of a memolock clone)", filepath.Join(dir, "python"))
	case !exists(python):
		py.missing = python + " not found (apt-get install -y python3 python3-redis)"
	default:
		if out, err := exec.Command(python, "-c", "import redis").CombinedOutput(); err != nil {
			py.missing = fmt.Sprintf("%s cannot import redis: %s (apt-get install -y python3-redis)", python, lastLine(out, err))
		}
	}

	exe := filepath.Join(dir, "csharp", "bin", "memolock.exe")
	cs := &peer{name: "C#", argv: []string{"mono", exe}}
	_, monoErr := exec.LookPath("mono")
	switch {
	case !exists(filepath.Join(dir, "csharp", "build.sh")):
		cs.missing = fmt.Sprintf("no C# peer in %s (pass --interop-dir with the interop directory of a memolock clone)", filepath.Join(dir, "csharp"))
	case monoErr != nil:
		cs.missing = "mono not found (apt-get install -y mono-runtime mono-mcs)"
	default:
		// Build it whenever mcs is here, so that a stale build never runs.
		if _, err := exec.LookPath("mcs"); err != nil {
			if !exists(exe) {
				cs.missing = "the C# peer is not built and mcs is not found (apt-get install -y mono-mcs)"
			}
			break
		}
		if out, err := exec.Command("bash", filepath.Join(dir, "csharp", "build.sh")).CombinedOutput(); err != nil {
			cs.missing = "building the C# peer failed: " + lastLine(out, err)
		}
	}
	return []*peer{goPeer, py, cs}
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

func lastLine(out []byte, err error) string {
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if l := lines[len(lines)-1]; l != "" {
		return l
	}
	return err.Error()
}

// demoInterop starts perPeer `run` processes of every peer it finds on one
// key, all at once, and shows that one of them ran the command and all of
// them printed its output. redisURL reaches the children through
// MEMOLOCK_REDIS, never their command lines, since it may hold a password.
// On SIGINT or SIGTERM, or after demoLimit, it stops the children (each
// stops its command) and returns.
func demoInterop(dir, redisURL, where, id string, perPeer int, fetch time.Duration, stdout, stderr io.Writer) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, demoLimit)
	defer cancel()

	if !exists(dir) {
		fmt.Fprintf(stderr, "memolock demo: no interop directory at %q: run the demo from the repository's root, or pass --interop-dir\n", dir)
		return 2
	}
	var found, missing []*peer
	for _, p := range findPeers(dir, stderr) {
		if p.missing != "" {
			fmt.Fprintf(stdout, "  %-7s cannot run: %s\n", p.name, p.missing)
			missing = append(missing, p)
			continue
		}
		found = append(found, p)
	}
	if len(found) < 2 {
		// One language alone shows nothing about interoperation.
		var names []string
		for _, p := range found {
			names = append(names, p.name)
		}
		can := "no language can"
		if len(names) > 0 {
			can = "only " + strings.Join(names, " and ") + " can"
		}
		fmt.Fprintf(stderr, "memolock demo: --interop needs two languages at least, and %s run here (see above)\n", can)
		return 1
	}
	tmp, err := os.MkdirTemp("", "memolock-demo")
	if err != nil {
		fmt.Fprintf(stderr, "memolock demo: %v\n", err)
		return 1
	}
	defer os.RemoveAll(tmp)
	runs := filepath.Join(tmp, "runs")

	fmt.Fprintf(stdout, "memolock demo --interop: %d processes in %d languages ask for one missing key at once;\n",
		perPeer*len(found), len(found)) // two at least: see above
	fmt.Fprintf(stdout, "its command takes %v. Redis: %s.\n\n", fetch, where)

	type outcome struct {
		who  string
		out  []byte
		err  string
		code int
		took time.Duration
	}
	outcomes := make([]outcome, perPeer*len(found))
	var wg sync.WaitGroup
	for i := range outcomes {
		p := found[i%len(found)]
		who := fmt.Sprintf("%s #%d", p.name, i/len(found)+1)
		// Paths and names travel as arguments, never inside the script.
		const script = `echo run >> "$1"; sleep "$2"; printf 'the report, computed by %s (pid %d)\n' "$3" "$PPID"`
		argv := append(append([]string{}, p.argv...), "run", "--tag", "memolock-demo", "--id", id, "--ttl", "1m",
			"--lock-ttl", "10s", "--wait", "2m", "--", "sh", "-c", script, "sh", runs, fmt.Sprintf("%.3f", fetch.Seconds()), who)
		wg.Add(1)
		go func() {
			defer wg.Done()
			cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
			cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) } // it stops its command
			cmd.WaitDelay = 5 * time.Second
			dieWithParent(cmd)
			cmd.Env = append(append(os.Environ(), p.env...), "MEMOLOCK_REDIS="+redisURL)
			var out, errb bytes.Buffer
			cmd.Stdout, cmd.Stderr = &out, &errb
			t0 := time.Now()
			err := cmd.Run()
			o := outcome{who: who, out: out.Bytes(), took: time.Since(t0)}
			var ee *exec.ExitError
			if errors.As(err, &ee) {
				o.code = ee.ExitCode()
			} else if err != nil {
				o.code = -1
			}
			if o.code != 0 {
				o.err = lastLine(errb.Bytes(), err)
			}
			outcomes[i] = o
		}()
	}
	wg.Wait()

	if ctx.Err() != nil {
		fmt.Fprintf(stderr, "memolock demo: stopped: %v\n", context.Cause(ctx))
		return 1
	}
	code := 0
	for _, o := range outcomes {
		if o.code != 0 {
			fmt.Fprintf(stdout, "  %-10s exit %d after %v: %s\n", o.who, o.code, o.took.Round(time.Millisecond), o.err)
			code = 1
			continue
		}
		fmt.Fprintf(stdout, "  %-10s %6v  %s", o.who, o.took.Round(time.Millisecond), o.out)
		if !bytes.HasSuffix(o.out, []byte("\n")) {
			fmt.Fprintln(stdout)
		}
		if !bytes.Equal(o.out, outcomes[0].out) {
			code = 1
		}
	}
	data, _ := os.ReadFile(runs)
	n := bytes.Count(data, []byte("\n"))
	fmt.Fprintf(stdout, "\nThe command ran %d time(s) for %d processes.\n", n, len(outcomes))
	if n != 1 || code != 0 {
		fmt.Fprintln(stderr, "memolock demo: expected one run and the same output everywhere")
		return 1
	}
	var names []string
	for _, p := range found {
		names = append(names, p.name)
	}
	fmt.Fprintf(stdout, "One computation, shared byte for byte by %s.\n", strings.Join(names, ", "))
	if len(missing) > 0 {
		fmt.Fprintf(stdout, "%d of the 3 languages could not run here: see above.\n", len(missing))
	}
	return 0
}
