package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"os/signal"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/memolock/memolock"
)

// Exit codes, as shells use them.
const (
	exitFailure     = 1
	exitUsage       = 2
	exitWaitLimit   = 124 // --wait ran out, as timeout(1) does
	exitCannotExec  = 126
	exitNotFound    = 127
	exitSignalBase  = 128 // 128+N: killed by signal N
	defaultRedisURL = "redis://127.0.0.1:6379"
)

// killGrace is how long the command's processes have, after SIGTERM, before
// SIGKILL.
const killGrace = 2 * time.Second

// exitError is CMD's failure in the process that ran it.
type exitError struct {
	code   int
	signal syscall.Signal // set when a signal killed it
}

func (e *exitError) Error() string {
	if e.signal != 0 {
		return fmt.Sprintf("command killed by signal %d (%v)", int(e.signal), e.signal)
	}
	return fmt.Sprintf("command exited with status %d", e.code)
}

// startError is CMD failing to start: not found, or not executable.
type startError struct {
	code int
	err  error
}

func (e *startError) Error() string { return e.err.Error() }

// errInterrupted ends a run that a signal interrupted. It is a
// cancellation (it matches context.Canceled), so that the library hands the
// lock over to a waiter elsewhere instead of failing it.
var errInterrupted error = interrupted{}

type interrupted struct{}

func (interrupted) Error() string { return "interrupted" }
func (interrupted) Unwrap() error { return context.Canceled }

var runCommand = command{
	name:    "run",
	summary: "run a command once across machines, and print its output, cached in Redis",
	usage: []string{
		"run --tag T --id ID --ttl DURATION [flags] -- CMD [ARGS...]",
		"run --tag T (--id-hex HEX | --id-base64 B64) --ttl DURATION [flags] -- CMD [ARGS...]",
	},
	about: `Runs CMD at most once at a time per key across every process and machine that shares the Redis server, and prints its standard output. An invocation that comes while another one runs CMD waits for it, then prints the same bytes; one that comes later, within --ttl, prints them from Redis without running anything.

The key is --tag and --id, not the command: invocations with the same tag and id share one output whatever their commands are, so put in the id whatever the output depends on. Only standard output is cached. Standard error passes through, and the exit status is that of the run that computed; if CMD fails, nothing is cached, the invocation that ran it passes its output and status through, and the waiting ones exit 1 at once.

On a terminal, a status line on stderr shows whom the invocation waits for, or how long CMD has run here, updated in place; CMD's stderr then reaches the terminal through memolock, so that the line stays below it (--quiet hands CMD the terminal itself). Off a terminal, a waiting invocation says so once when the wait starts, then at most once every 30s, and once more if the lock came free and CMD runs here after all.

On a signal (SIGINT, SIGTERM, SIGHUP, SIGQUIT) memolock stops every process of CMD, SIGTERM first and SIGKILL 2s later (at once on a second signal), then releases the lock: a waiting invocation takes over at once.`,
	flags: []string{"tag", "id", "id-hex", "id-base64", "ttl", "lock-ttl", "wait", "redis", "cluster", "quiet"},
	env:   true,
	exits: [][2]string{
		{"0", "the output was printed: computed here, by another invocation, or from Redis"},
		{"N", "CMD's own status, when it ran here and failed (its output is printed too)"},
		{"1", "CMD failed where it ran, in another invocation; or Redis could not be reached, or refused"},
		{"2", "bad usage"},
		{"124", "--wait ran out (as timeout(1) exits)"},
		{"126", "CMD cannot be executed (or its #! interpreter is missing)"},
		{"127", "CMD was not found"},
		{"128+N", "CMD was killed by signal N, or signal N interrupted memolock: 130 for SIGINT, 143 for SIGTERM"},
	},
	example: [][2]string{
		{"Build a report once, whichever machine asks first; the others print the same bytes.", "memolock run --tag reports --id 2026-11 --ttl 1h -- ./build-report 2026-11"},
		{"Give up after 30s of waiting for another machine (exit 124).", "memolock run --tag reports --id 2026-11 --ttl 1h --wait 30s -- ./build-report 2026-11"},
		{"An id that is not text.", "memolock run --tag blobs --id-hex 00ff17 --ttl 10m -- ./fetch-blob 00ff17"},
		{"A server with a password: the colon before it matters.", "MEMOLOCK_REDIS=redis://:PASSWORD@cache:6379 memolock run --tag t --id x --ttl 1m -- date"},
	},
}

func runCmd(args []string, stdout, stderr io.Writer) int {
	c := &runCommand
	fs := flag.NewFlagSet("run", flag.ContinueOnError)
	tag := fs.String("tag", "", "the key's `TAG`, which every key and channel of the id starts with (required)")
	var ids idFlags
	ids.define(fs, "")
	ttl := newDuration(fs, "ttl", 0, "how long the output stays cached: a `DURATION` such as 30s, 10m or 1h; 0 keeps it for ever (required)")
	lockTTL := newDuration(fs, "lock-ttl", memolock.DefaultLockTTL, "how long others wait (a `DURATION`) before they take over from an invocation that died without a word; renewed while CMD runs")
	wait := newDuration(fs, "wait", 0, "give up waiting after this long (a `DURATION`) and exit 124; 0 waits as long as it takes")
	// The default is not the flag's default value: the help page would
	// print $MEMOLOCK_REDIS, password and all.
	redisURL := fs.String("redis", "", redisUsage)
	cluster := fs.Bool("cluster", false, clusterUsage)
	quiet := fs.Bool("quiet", false, quietUsage)
	if code, ok := parse(c, fs, args, stdout, stderr); !ok {
		return code
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	argv := fs.Args()
	id, given, idErr := ids.one()
	switch {
	case idErr != nil:
		return usageError(c, stderr, "%v", idErr)
	case *tag == "" || !given || id == "":
		return usageError(c, stderr, "--tag and --id (or --id-hex, --id-base64) are required")
	case !set["ttl"]:
		return usageError(c, stderr, "--ttl is required (0 caches for ever)")
	case *ttl < 0:
		return usageError(c, stderr, "--ttl %v is negative; give how long the output stays cached, or 0 for ever", *ttl)
	case *wait < 0:
		return usageError(c, stderr, "--wait %v is negative; give a limit, or 0 for none", *wait)
	case len(argv) == 0:
		return usageError(c, stderr, "no command given; put it after --")
	case strings.Contains(argv[0], "://") || mayHoldPassword(argv[0]) && strayBeforeDashes(args, argv):
		// A URL after --cluster, which takes none, would otherwise run
		// as the command, and be printed if it failed to start.
		return usageError(c, stderr, "unexpected argument %q before the command; give the URL with --redis, and the command after --", redactArg(argv[0]))
	}
	url := redisURLOrDefault(*redisURL)
	rdb, err := openRedis(url, *cluster)
	if err != nil {
		return usageError(c, stderr, "--redis %v", err)
	}
	defer rdb.Close()

	st := newStatus(stderr, show(*tag+":"+id), *quiet)
	var (
		holder  atomic.Value // whom we waited for, last
		fetched atomic.Bool  // the command ran here
	)
	onWait := func(id, h string) {
		holder.Store(h)
		st.waiting(id, h)
	}
	mc, err := memolock.New(rdb, *tag, &memolock.Options{LockTTL: *lockTTL, OnWait: onWait})
	if err != nil {
		st.done()
		return usageError(c, stderr, "%s", libError(err))
	}

	sig := catchSignals()
	defer sig.stop()
	ctx := sig.ctx
	if *wait > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, *wait)
		defer cancel()
	}

	started := time.Now()
	var partial []byte // the output of a command that failed here
	out, err := mc.Get(ctx, id, func(fctx context.Context, _ *memolock.Lease) ([]byte, time.Duration, error) {
		fetched.Store(true)
		st.computing()
		out, err := runGroup(fctx, sig, argv, stderr, st)
		if errors.Is(err, errInterrupted) {
			// Not a failure for waiters elsewhere to report: a fetch that
			// Close cancelled, and that fails for that (errInterrupted
			// matches context.Canceled), hands the lock over with an
			// abandon event, so that one of them runs the command.
			_ = mc.Close()
		}
		if err != nil {
			partial = out
			return nil, 0, err
		}
		return out, *ttl, nil
	})
	// Close releases our lock if we still hold one (on a signal, say), once
	// the command's processes are gone.
	_ = mc.Close()
	st.done()

	var (
		ee *exitError
		se *startError
	)
	switch {
	case err == nil:
		if _, err := stdout.Write(out); err != nil {
			fmt.Fprintf(stderr, "memolock run: writing output: %v\n", err)
			return exitFailure
		}
		return 0
	case sig.caught() != 0:
		fmt.Fprintf(stderr, "memolock run: interrupted by %v\n", sig.caught())
		return exitSignalBase + int(sig.caught())
	case errors.As(err, &ee):
		_, _ = stdout.Write(partial)
		if ee.signal != 0 {
			return exitSignalBase + int(ee.signal)
		}
		return ee.code
	case errors.As(err, &se):
		fmt.Fprintf(stderr, "memolock run: %v\n", se.err)
		return se.code
	case errors.Is(err, memolock.ErrHolderFailed):
		fmt.Fprintf(stderr, "memolock run: the command failed where it ran: %s\n", libError(err))
		return exitFailure
	case errors.Is(err, memolock.ErrTimeout) && errors.Is(err, context.DeadlineExceeded):
		h, _ := holder.Load().(string)
		switch {
		case fetched.Load():
			fmt.Fprintf(stderr, "memolock run: --wait %v ran out while the command ran here\n", *wait)
		case h != "":
			fmt.Fprintf(stderr, "memolock run: gave up waiting for %s after %.1fs (--wait %v): %s computes it, and has not finished\n",
				show(*tag+":"+id), time.Since(started).Seconds(), *wait, h)
		default:
			// Nobody was seen holding the lock: Redis never answered.
			fmt.Fprintf(stderr, "memolock run: Redis (%s) did not answer within --wait %v%s\n", redact(url), *wait, redisHint(err, url))
		}
		return exitWaitLimit
	}
	fmt.Fprintf(stderr, "memolock run: %s (redis %s)%s\n", libError(err), redact(url), redisHint(err, url))
	return exitFailure
}

// strayBeforeDashes reports whether the flags of args ended at an argument
// that is not a flag, with a "--" after it: argv, the arguments left, is
// then not the command.
func strayBeforeDashes(args, argv []string) bool {
	if i := len(args) - len(argv) - 1; i >= 0 && args[i] == "--" {
		return false // the flags ended at "--"
	}
	return slices.Contains(argv, "--")
}

// runGroup runs argv and returns its standard output. If ctx ends (Close)
// or a signal arrives, it stops every process of the command (see
// stopAll): SIGTERM, then SIGKILL after killGrace (at once on a second
// signal). It returns only once they are all gone. With a status line on
// a terminal, the command's stderr passes through st, below the line.
func runGroup(ctx context.Context, sig *signals, argv []string, stderr io.Writer, st *status) ([]byte, error) {
	select {
	case <-ctx.Done():
		return nil, errInterrupted
	case <-sig.first:
		return nil, errInterrupted
	default:
	}
	// Our own pipes rather than exec's: after stopping the command we must
	// not wait for a process that holds a pipe open.
	r, w, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	defer r.Close()
	cmdStderr := stderr
	relayed := make(chan struct{})
	close(relayed)
	if st.onTerminal() {
		er, ew, err := os.Pipe()
		if err != nil {
			w.Close()
			return nil, err
		}
		defer er.Close()
		relayed = st.stderrRelay(er)
		cmdStderr = ew
		defer func() {
			// The last of the command's stderr, before anything memolock
			// says about its end; a process it left behind that holds
			// stderr open does not hold memolock up for long.
			t := time.NewTimer(200 * time.Millisecond)
			defer t.Stop()
			select {
			case <-relayed:
			case <-t.C:
			}
		}()
	}
	cmd, err := start(argv, w, cmdStderr)
	w.Close()
	if f, ok := cmdStderr.(*os.File); ok && f != stderr {
		f.Close()
	}
	if err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	read := make(chan struct{})
	go func() {
		_, _ = io.Copy(&buf, r)
		close(read)
	}()
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	stop := func() ([]byte, error) {
		stopAll(cmd.Process.Pid, exited, sig.second)
		r.Close()
		<-read
		return buf.Bytes(), errInterrupted
	}

	// All of the output, as a shell's $(...) has it: the command's exit,
	// and the end of its output, which processes it left behind may hold.
	var (
		waitErr    error
		leaderDone bool
		reading    = read
	)
	for !leaderDone || reading != nil {
		select {
		case waitErr = <-exited:
			leaderDone, exited = true, nil
			if killedLike(waitErr) && signalled(sig) {
				// ^C on a terminal reaches the command and memolock alike:
				// the command did not fail, it was interrupted.
				return stop()
			}
		case <-reading:
			reading = nil
		case <-ctx.Done():
			return stop()
		case <-sig.first:
			return stop()
		}
	}
	return buf.Bytes(), exitErr(waitErr)
}

// killedLike reports whether the command ended as an interrupted command
// does: killed by a signal, or with a status above 128.
func killedLike(err error) bool {
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		return false
	}
	ws, ok := ee.Sys().(syscall.WaitStatus)
	return ok && ws.Signaled() || ee.ExitCode() > exitSignalBase
}

// signalled reports whether memolock gets a signal now or very soon: a
// terminal's ^C reaches the command and memolock at the same moment, but
// their news may come in either order.
func signalled(sig *signals) bool {
	t := time.NewTimer(100 * time.Millisecond)
	defer t.Stop()
	select {
	case <-sig.first:
		return true
	case <-t.C:
		return false
	}
}

// start starts argv with stdout and stderr. A file that is executable but
// no binary runs with /bin/sh, as a shell would run it.
func start(argv []string, stdout *os.File, stderr io.Writer) (*exec.Cmd, error) {
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, stdout, stderr
	prepare(cmd)
	err := cmd.Start()
	if errors.Is(err, syscall.ENOEXEC) {
		return start(append([]string{"/bin/sh", cmd.Path}, argv[1:]...), stdout, stderr)
	}
	if err != nil {
		return nil, classifyStart(cmd.Path, err)
	}
	return cmd, nil
}

// stopAll stops the command whose leader is pid, and every process it
// started: SIGTERM, then SIGKILL after killGrace or when force is closed.
// It returns once the leader has exited (exited yields, or is nil) and no
// process of the command is left.
func stopAll(pid int, exited <-chan error, force <-chan struct{}) {
	leaderDone := exited == nil
	sig := syscall.SIGTERM
	signalAll(pid, !leaderDone, sig)
	grace := time.NewTimer(killGrace)
	defer grace.Stop()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-exited:
			leaderDone, exited = true, nil
		case <-grace.C:
			sig = syscall.SIGKILL
		case <-force:
			force, sig = nil, syscall.SIGKILL
		case <-tick.C:
		}
		if !leaderDone {
			signalAll(pid, true, sig)
			continue
		}
		if !anyLeft(pid) {
			return
		}
		// Processes orphaned since are ours now (see procs_linux.go).
		signalAll(pid, false, sig)
	}
}

// exitErr turns what cmd.Wait returned into the command's exit status.
func exitErr(err error) error {
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		return err
	}
	if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return &exitError{signal: ws.Signal()}
	}
	return &exitError{code: ee.ExitCode()}
}

// classifyStart gives the shell's exit status to a command at path that
// could not start: 127 not found, 126 found but not executable (or its
// interpreter, after #!, is not found).
func classifyStart(path string, err error) error {
	switch {
	case errors.Is(err, exec.ErrNotFound):
		return &startError{code: exitNotFound, err: err}
	case errors.Is(err, fs.ErrNotExist):
		if _, serr := os.Stat(path); serr == nil {
			return &startError{code: exitCannotExec, err: fmt.Errorf("%s: bad interpreter: %w", path, err)}
		}
		return &startError{code: exitNotFound, err: err}
	case errors.Is(err, fs.ErrPermission), errors.Is(err, syscall.ENOEXEC), errors.Is(err, syscall.EISDIR):
		return &startError{code: exitCannotExec, err: err}
	}
	return &startError{code: exitCannotExec, err: err}
}

// signals tracks SIGINT, SIGTERM, SIGHUP and SIGQUIT: the first cancels ctx
// and closes first, a second closes second.
type signals struct {
	ctx    context.Context
	cancel context.CancelFunc
	ch     chan os.Signal
	first  chan struct{}
	second chan struct{}
	done   chan struct{}
	wg     sync.WaitGroup

	mu  sync.Mutex
	got syscall.Signal
}

func catchSignals() *signals {
	s := &signals{ch: make(chan os.Signal, 2), first: make(chan struct{}), second: make(chan struct{}), done: make(chan struct{})}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	signal.Notify(s.ch, os.Interrupt, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT)
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		select {
		case v := <-s.ch:
			s.mu.Lock()
			s.got, _ = v.(syscall.Signal)
			s.mu.Unlock()
			s.cancel()
			close(s.first)
		case <-s.done:
			return
		}
		select {
		case <-s.ch:
			close(s.second)
		case <-s.done:
		}
	}()
	return s
}

func (s *signals) caught() syscall.Signal {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.got
}

func (s *signals) stop() {
	signal.Stop(s.ch)
	close(s.done)
	s.wg.Wait()
	s.cancel()
}
