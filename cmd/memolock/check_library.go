package main

// The library's side of check's core feature: the trial that runs the
// library's own calls on the probe id, and the reading of a refusal that
// Redis gives inside one of the library's scripts (which names the script
// and the line, not the command).

import (
	"context"
	"errors"
	"log/slog"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/memolock/memolock"
	"github.com/memolock/memolock/internal/wire"
)

// refusedAt finds the script and the line that Redis names in a refusal
// inside a script. Redis 7.0 says "The user executing the script can't run
// this command or subcommand script: <its SHA1>, on @user_script:7.";
// Redis 6.x (its scripting.c: luaPushError, the error handler of EVAL, and
// evalGenericCommand's reply) says "Error running script (call to f_<its
// SHA1>): @user_script:7: @user_script: 7: The user executing the script
// can't run this command or subcommand". The lines are the script's own in
// both.
var refusedAt = []*regexp.Regexp{
	regexp.MustCompile(`script: ([0-9a-f]{40}), on @user_script:([0-9]+)`),
	regexp.MustCompile(`\(call to f_([0-9a-f]{40})\): @user_script:([0-9]+):`),
}

// scriptCall finds the commands a Lua script calls: redis.call('GET', ...
// or redis.pcall("get", ...), and only so written. A test holds the
// library's scripts to it: every redis.call and redis.pcall in them is a
// call of this form, so that the command of a line that Redis refuses can
// be told (see scriptCommand), and core can try each on its own.
var scriptCall = regexp.MustCompile(`(?i)redis\.p?call\(\s*['"]([a-z0-9_|.-]+)['"]`)

// libraryScripts maps the SHA1 of each of the library's scripts, in both
// forms (see wire.Sources), to its text.
var libraryScripts = sync.OnceValue(func() map[string]string {
	out := map[string]string{}
	for _, sharded := range []bool{false, true} {
		for _, src := range wire.Sources(sharded) {
			out[redis.NewScript(src).Hash()] = src
		}
	}
	return out
})

// scriptCommand returns, in lower case, the command that the line named
// in msg, a refusal inside a script, calls: the command that Redis
// refused. It returns "" if the script is not the library's, or if that
// line calls no command, or more than one.
func scriptCommand(msg string) string {
	var m []string
	for _, at := range refusedAt {
		if m = at.FindStringSubmatch(msg); m != nil {
			break
		}
	}
	if m == nil {
		return ""
	}
	src, ok := libraryScripts()[m[1]]
	n, _ := strconv.Atoi(m[2])
	lines := strings.Split(src, "\n")
	if !ok || n < 1 || n > len(lines) {
		return ""
	}
	cmd := ""
	for _, c := range scriptCall.FindAllStringSubmatch(lines[n-1], -1) {
		if cmd != "" && !strings.EqualFold(c[1], cmd) {
			return ""
		}
		cmd = strings.ToLower(c[1])
	}
	return cmd
}

// libraryTrial runs what the library itself does, on the probe id: Redis
// checks every command that a script calls against the user's rules, which
// the trials of single commands cannot tell. Delete first (the value that
// the SET trial wrote goes), then a Get whose fetch returns a small value
// (the acquire script, then the store script, which publishes and leaves
// the lock lingering), Set, Delete again, and a lease of TryLock, renewed
// and released: every script the core recipe covers but peek (Peek's,
// which reads with GET and PTTL), publish, not found and resurrect (for a
// fetch that returns no value to keep, or fails), which call no command
// beyond those. Before Redis 7.0 there is no TryLock (see tryLock), and so
// no renewal or release script either: their commands are tried on their
// own all the same. It writes the probe's value (for 10 s), its lock
// (Get's, for LockTTL 5 s, lingering after the store) and TryLock's key,
// T/lock-mutex:<SHA-256 of the id> (for 5 s, renewed to 10 s): each lives
// 10 s at most, and cleanUp deletes it.
func (ck *checker) libraryTrial() trial {
	what := "Get, Set, Delete and TryLock (renewed, released) on " + show(ck.keys.Value(ck.probeID)) + " through the library"
	if !ck.tryLock() {
		what = "Get, Set and Delete on " + show(ck.keys.Value(ck.probeID)) + " through the library's scripts (not TryLock, which needs Redis 7.0)"
	}
	// The trials of single commands passed first, on T: too: a key that
	// the library's calls are refused can only be under T/ (the scripts
	// declare T/lock-notfound: and T/lock-stale: among their keys, and
	// TryLock takes T/lock-mutex:), which Redis does not name.
	return trial{what: what, keys: ck.rule("~{T}/*"), chans: ck.rule("&{T}/*"), try: ck.throughLibrary}
}

// libraryBudget bounds libraryTrial in time, as core runs it: it makes
// some 8 round trips, 14 on a server that has not loaded the library's
// scripts yet (each EVALSHA refused with NOSCRIPT, then an EVAL), where a
// trial of one command makes one or two within callTimeout.
const libraryBudget = 3 * callTimeout

// throughLibrary makes libraryTrial's calls (TryLock's only from Redis
// 7.0), with a Client of its own over the checker's redis client, and
// returns the first failure. A store that fails does not fail Get, which
// returns the fetched value all the same: the Client's Logger tells it.
func (ck *checker) throughLibrary(ctx context.Context) error {
	logged := &firstError{}
	c, err := memolock.New(ck.rdb, ck.tag, &memolock.Options{LockTTL: 5 * time.Second, Logger: slog.New(logged)})
	if err != nil {
		return err
	}
	defer c.Close()
	value := []byte("memolock check")
	if _, err := c.Delete(ctx, ck.id); err != nil {
		return &callFailed{"Delete", getFails, err}
	}
	var fetched atomic.Bool
	_, err = c.Get(ctx, ck.id, func(context.Context, *memolock.Lease) ([]byte, time.Duration, error) {
		fetched.Store(true)
		return value, 10 * time.Second, nil
	})
	switch s := c.Stats(); {
	case err != nil:
		return &callFailed{"Get", getFails, err}
	case logged.get() != nil:
		return &callFailed{"Get", getFails, logged.get()}
	case !fetched.Load():
		return &callFailed{"Get", "whether Get works was not told: somebody else wrote the probe's value", errors.New("a value was there already (written by somebody else since Delete), so no store was tried")}
	case s.StoreErrors > 0 || s.LeaseLost > 0:
		return &callFailed{"Get", getFails, errors.New("the value was not stored")}
	}
	if err := c.Set(ctx, ck.id, value, 10*time.Second); err != nil {
		return &callFailed{"Set", getFails, err}
	}
	if _, err := c.Delete(ctx, ck.id); err != nil {
		return &callFailed{"Delete", getFails, err}
	}
	if !ck.tryLock() {
		return nil
	}
	lease, err := c.TryLock(ctx, ck.id, 5*time.Second)
	if err != nil {
		return &callFailed{"TryLock", "TryLock will fail", err}
	}
	if err := lease.Renew(ctx, 10*time.Second); err != nil {
		_ = lease.Release(ctx) // or cleanUp deletes it
		return &callFailed{"Renew", "TryLock's leases cannot be renewed (Renew, KeepAlive)", err}
	}
	if err := lease.Release(ctx); err != nil {
		return &callFailed{"Release", "TryLock's leases cannot be released: each lock stays until it expires", err}
	}
	return nil
}

// getFails is what core says fails when a command fails on its own, or
// the library's Get.
const getFails = "run and Get will fail, or wait for lock time-outs"

// callFailed is the failure of one of the library's calls in libraryTrial,
// and what fails for the user because of it. Get, Set and Delete run
// scripts on the keys and channels that run and Get use: what refuses one
// of them refuses run and Get too (getFails), and only the problem names
// the call.
type callFailed struct {
	call  string // the call, "TryLock"
	fails string // what fails, for core's detail: "TryLock will fail"
	err   error
}

// Error names the call, then says why it failed.
func (e *callFailed) Error() string { return e.call + ": " + e.err.Error() }

// Unwrap returns why the call failed.
func (e *callFailed) Unwrap() error { return e.err }

// firstError is a slog.Handler that keeps the error of the first warning
// that carries one: how a Client tells of a store that failed.
type firstError struct {
	mu  sync.Mutex
	err error
}

// Enabled takes warnings and worse: a failed store is a warning.
func (h *firstError) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelWarn }

// Handle keeps r's error, if it carries one and none was kept before.
func (h *firstError) Handle(_ context.Context, r slog.Record) error {
	r.Attrs(func(a slog.Attr) bool {
		err, ok := a.Value.Any().(error)
		if ok {
			h.mu.Lock()
			if h.err == nil {
				h.err = err
			}
			h.mu.Unlock()
		}
		return !ok
	})
	return nil
}

// WithAttrs returns h: only a record's own error matters.
func (h *firstError) WithAttrs([]slog.Attr) slog.Handler { return h }

// WithGroup returns h, as WithAttrs does.
func (h *firstError) WithGroup(string) slog.Handler { return h }

// get returns the error kept, if any.
func (h *firstError) get() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.err
}
