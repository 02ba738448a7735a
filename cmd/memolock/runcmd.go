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

// errInterrupted ends a run that a signal interrupted.
var errInterrupted = errors.New("interrupted")

func runCmd(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("memolock run", flag.ContinueOnError)
	fs.SetOutput(flagOutput(stderr, args))
	// The default is not the flag's default value: the usage text would
	// print $MEMOLOCK_REDIS, password and all.
	redisURL := fs.String("redis", "", "Redis URL (default $MEMOLOCK_REDIS, then "+defaultRedisURL+")")
	tag := fs.String("tag", "", "key tag (required)")
	id := fs.String("id", "", "key id (required)")
	ttl := fs.Duration("ttl", 0, "how long the output stays cached, 0 for ever (required)")
	lockTTL := fs.Duration("lock-ttl", memolock.DefaultLockTTL, "lock TTL: how soon others take over if this process dies")
	wait := fs.Duration("wait", 0, "give up waiting after this long, exit 124 (0: no limit)")
	cluster := fs.Bool("cluster", false, "--redis is a Redis Cluster: redis://host:port?addr=host2:port2&addr=... (seed nodes)")
	if err := fs.Parse(args); err != nil {
		return exitUsage
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	argv := fs.Args()
	switch {
	case *tag == "" || *id == "":
		fmt.Fprintln(stderr, "memolock run: --tag and --id are required")
		return exitUsage
	case !set["ttl"]:
		fmt.Fprintln(stderr, "memolock run: --ttl is required (0 caches for ever)")
		return exitUsage
	case *ttl < 0:
		fmt.Fprintf(stderr, "memolock run: --ttl %v is negative; give how long the output stays cached, or 0 for ever\n", *ttl)
		return exitUsage
	case *wait < 0:
		fmt.Fprintf(stderr, "memolock run: --wait %v is negative; give a limit, or 0 for none\n", *wait)
		return exitUsage
	case len(argv) == 0:
		fmt.Fprintln(stderr, "memolock run: no command given; put it after --")
		return exitUsage
	case strings.Contains(argv[0], "://") || mayHoldPassword(argv[0]) && strayBeforeDashes(args, argv):
		// A URL after --cluster, which takes none, would otherwise run
		// as the command, and be printed if it failed to start.
		fmt.Fprintf(stderr, "memolock run: unexpected argument %q before the command; give the URL with --redis, and the command after --\n", redactArg(argv[0]))
		return exitUsage
	}
	if *redisURL == "" {
		*redisURL = os.Getenv("MEMOLOCK_REDIS")
	}
	if *redisURL == "" {
		*redisURL = defaultRedisURL
	}

	rdb, err := openRedis(*redisURL, *cluster)
	if err != nil {
		fmt.Fprintf(stderr, "memolock run: --redis %v\n", err)
		return exitUsage
	}
	defer rdb.Close()

	p := &progress{stderr: stderr, name: *tag + ":" + *id, started: time.Now()}
	c, err := memolock.New(rdb, *tag, &memolock.Options{LockTTL: *lockTTL, OnWait: p.waiting})
	if err != nil {
		fmt.Fprintf(stderr, "memolock run: %v\n", err)
		return exitUsage
	}

	sig := catchSignals()
	defer sig.stop()
	ctx := sig.ctx
	if *wait > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, *wait)
		defer cancel()
	}

	var partial []byte // the output of a command that failed here
	out, err := c.Get(ctx, *id, func(fctx context.Context, _ *memolock.Lease) ([]byte, time.Duration, error) {
		out, err := runGroup(fctx, sig, argv, stderr)
		if errors.Is(err, errInterrupted) {
			// Not a failure for waiters elsewhere to report: closing from
			// inside fetch hands the lock over with an abandon event, so
			// that one of them runs the command.
			_ = c.Close()
		}
		if err != nil {
			partial = out
			return nil, 0, err
		}
		return out, *ttl, nil
	})
	// Close releases our lock if we still hold one (on a signal, say), once
	// the command's processes are gone.
	_ = c.Close()
	p.stop()

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
		fmt.Fprintf(stderr, "memolock run: the command failed where it ran: %v\n", err)
		return exitFailure
	case errors.Is(err, memolock.ErrTimeout) && errors.Is(err, context.DeadlineExceeded):
		fmt.Fprintf(stderr, "memolock run: gave up after %.1fs (--wait %v): %v\n", time.Since(p.started).Seconds(), *wait, err)
		return exitWaitLimit
	}
	fmt.Fprintf(stderr, "memolock run: %v (redis %s)\n", err, redact(*redisURL))
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
// signal). It returns only once they are all gone.
func runGroup(ctx context.Context, sig *signals, argv []string, stderr io.Writer) ([]byte, error) {
	select {
	case <-ctx.Done():
		return nil, errInterrupted
	case <-sig.first:
		return nil, errInterrupted
	default:
	}
	// Our own pipe rather than exec's: after stopping the command we must
	// not wait for a process that holds the pipe open.
	r, w, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	defer r.Close()
	cmd, err := start(argv, w, stderr)
	w.Close()
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

// progress says on stderr, once a second, that the invocation waits.
type progress struct {
	stderr  io.Writer
	name    string
	started time.Time

	mu   sync.Mutex
	quit chan struct{} // closed to stop the messages
	wg   sync.WaitGroup
}

func (p *progress) waiting(_, holder string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.quit != nil {
		return
	}
	p.quit = make(chan struct{})
	p.wg.Add(1)
	go func(quit chan struct{}) {
		defer p.wg.Done()
		tick := time.NewTicker(time.Second)
		defer tick.Stop()
		for {
			fmt.Fprintf(p.stderr, "memolock: waiting for %s, computed by %s (%.1fs)\n",
				p.name, holder, time.Since(p.started).Seconds())
			select {
			case <-tick.C:
			case <-quit:
				return
			}
		}
	}(p.quit)
}

func (p *progress) stop() {
	p.mu.Lock()
	if p.quit != nil {
		close(p.quit)
	}
	p.mu.Unlock()
	p.wg.Wait()
}
