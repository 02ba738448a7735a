package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/memolock/memolock"
)

// exitError is CMD's failure in the process that ran it.
type exitError struct{ code int }

func (e *exitError) Error() string { return fmt.Sprintf("command exited with status %d", e.code) }

func runCmd(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("memolock run", flag.ContinueOnError)
	fs.SetOutput(stderr)
	defaultURL := os.Getenv("MEMOLOCK_REDIS")
	if defaultURL == "" {
		defaultURL = "redis://127.0.0.1:6379"
	}
	redisURL := fs.String("redis", defaultURL, "Redis URL (default $MEMOLOCK_REDIS, then redis://127.0.0.1:6379)")
	tag := fs.String("tag", "", "key tag (required)")
	id := fs.String("id", "", "key id (required)")
	ttl := fs.Duration("ttl", -1, "how long the output stays cached, 0 for ever (required)")
	lockTTL := fs.Duration("lock-ttl", memolock.DefaultLockTTL, "lock TTL: how soon others take over if this process dies")
	wait := fs.Duration("wait", 0, "give up waiting after this long (0: no limit)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	argv := fs.Args()
	switch {
	case *tag == "" || *id == "":
		fmt.Fprintln(stderr, "memolock run: --tag and --id are required")
		return 2
	case *ttl < 0:
		fmt.Fprintln(stderr, "memolock run: --ttl is required (0 caches for ever)")
		return 2
	case len(argv) == 0:
		fmt.Fprintln(stderr, "memolock run: no command given; put it after --")
		return 2
	}

	opts, err := redis.ParseURL(*redisURL)
	if err != nil {
		// The parse error may quote the URL, password and all.
		fmt.Fprintf(stderr, "memolock run: --redis %s is not a valid Redis URL\n", redact(*redisURL))
		return 2
	}
	rdb := redis.NewClient(opts)
	defer rdb.Close()

	var (
		mu      sync.Mutex
		waiting chan struct{} // closed to stop the progress messages
		started = time.Now()
	)
	progress := &sync.WaitGroup{}
	onWait := func(_, holder string) {
		mu.Lock()
		defer mu.Unlock()
		if waiting != nil {
			return
		}
		waiting = make(chan struct{})
		progress.Add(1)
		go func(stop chan struct{}) {
			defer progress.Done()
			tick := time.NewTicker(time.Second)
			defer tick.Stop()
			for {
				fmt.Fprintf(stderr, "memolock: waiting for %s:%s, computed by %s (%.1fs)\n",
					*tag, *id, holder, time.Since(started).Seconds())
				select {
				case <-tick.C:
				case <-stop:
					return
				}
			}
		}(waiting)
	}
	c, err := memolock.New(rdb, *tag, &memolock.Options{LockTTL: *lockTTL, OnWait: onWait})
	if err != nil {
		fmt.Fprintf(stderr, "memolock run: %v\n", err)
		return 2
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if *wait > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, *wait)
		defer cancel()
	}

	out, err := c.Get(ctx, *id, func(ctx context.Context, _ *memolock.Lease) ([]byte, time.Duration, error) {
		cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
		var buf bytes.Buffer
		cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, &buf, stderr
		if err := cmd.Run(); err != nil {
			var ee *exec.ExitError
			if errors.As(err, &ee) && ee.ExitCode() > 0 {
				return nil, 0, &exitError{ee.ExitCode()}
			}
			return nil, 0, err
		}
		return buf.Bytes(), *ttl, nil
	})
	// Close releases our lock if we still hold one (on a signal, say) and
	// kills CMD through its context.
	_ = c.Close()
	mu.Lock()
	if waiting != nil {
		close(waiting)
	}
	mu.Unlock()
	progress.Wait()

	var ee *exitError
	var execErr *exec.Error
	switch {
	case err == nil:
		if _, err := stdout.Write(out); err != nil {
			fmt.Fprintf(stderr, "memolock run: writing output: %v\n", err)
			return 1
		}
		return 0
	case errors.As(err, &ee):
		return ee.code
	case errors.As(err, &execErr):
		fmt.Fprintf(stderr, "memolock run: %v\n", err)
		return 127
	case errors.Is(err, memolock.ErrHolderFailed):
		fmt.Fprintf(stderr, "memolock run: the command failed where it ran: %v\n", err)
		return 1
	case errors.Is(err, memolock.ErrTimeout):
		fmt.Fprintf(stderr, "memolock run: gave up after %.1fs: %v\n", time.Since(started).Seconds(), err)
		return 124
	}
	fmt.Fprintf(stderr, "memolock run: %v (redis %s)\n", err, redact(*redisURL))
	return 1
}
