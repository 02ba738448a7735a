package memolock

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// An outage remembers that Redis could not be reached, so that callers fail
// at once instead of each paying for dials and timeouts, and a background
// probe notices when Redis answers again.
type outage struct {
	rdb   redis.UniversalClient
	stats *counters
	log   *slog.Logger
	every time.Duration // pause between probes

	cause atomic.Pointer[error] // set while Redis is unreachable

	mu      sync.Mutex
	probing bool
	// The log lines of outages, at most one pair per outageLogEvery, so
	// that a flapping network is not a line per failed call.
	logged   time.Time // when an outage's start was last logged
	quiet    int       // outages begun since, not logged
	loudThis bool      // the current outage's start was logged
	closed   bool
	stop     chan struct{}
	wg       sync.WaitGroup
}

// probeEvery is how often the probe PINGs an unreachable Redis; each PING
// is bounded by probeTimeout (dial and retries; go-redis bounds the read).
const (
	probeEvery   = 500 * time.Millisecond
	probeTimeout = 500 * time.Millisecond
)

// outageLogEvery is the least time between two logged outages; those
// between are counted in the next line.
const outageLogEvery = 10 * time.Second

func newOutage(rdb redis.UniversalClient, stats *counters) *outage {
	return &outage{rdb: rdb, stats: stats, log: discard, every: probeEvery, stop: make(chan struct{})}
}

// err returns an error wrapping ErrRedis while Redis is unreachable, nil
// otherwise. It is one atomic load.
func (o *outage) err() error {
	if p := o.cause.Load(); p != nil {
		return &unreachableError{cause: *p, every: o.every}
	}
	return nil
}

// unreachableError is what Get returns during an outage: ErrRedis, and the
// error that started or continued it.
type unreachableError struct {
	cause error
	every time.Duration
}

func (e *unreachableError) Error() string {
	cause := strings.TrimPrefix(e.cause.Error(), ErrRedis.Error()+": ")
	return fmt.Sprintf("%v: unreachable, probed every %v: %s", ErrRedis, e.every, cause)
}

func (e *unreachableError) Unwrap() []error { return []error{ErrRedis, e.cause} }

// report looks at an error from a Redis call. If it says Redis is
// unreachable, the outage starts and the probe runs until Redis answers.
func (o *outage) report(err error) {
	if !isOutage(err) {
		return
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.closed {
		return
	}
	if o.cause.Load() == nil {
		o.stats.outages.Add(1)
		o.loudThis = time.Since(o.logged) >= outageLogEvery
		if o.loudThis {
			o.log.Warn("memolock: Redis is unreachable; calls fail at once until a probe is answered",
				"error", err, "probe_every", o.every, "outages_not_logged", o.quiet)
			o.logged, o.quiet = time.Now(), 0
		} else {
			o.quiet++
		}
	}
	o.cause.Store(&err)
	if !o.probing {
		o.probing = true
		o.wg.Add(1)
		go o.probe()
	}
}

// probe PINGs Redis until it answers, then ends the outage.
func (o *outage) probe() {
	defer o.wg.Done()
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-t.C:
		case <-o.stop:
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), probeTimeout)
		err := o.rdb.Ping(ctx).Err()
		cancel()
		o.mu.Lock()
		var reply redis.Error
		if err == nil || errors.As(err, &reply) {
			// Redis answers, if only with an error reply: reachable.
			o.cause.Store(nil)
			if o.loudThis {
				o.log.Warn("memolock: Redis answers again; the outage is over")
			}
			o.probing = false
			o.mu.Unlock()
			return
		}
		o.cause.Store(&err)
		o.mu.Unlock()
		t.Reset(o.every)
	}
}

// close stops the probe and waits for it up to d.
func (o *outage) close(d time.Duration) {
	o.mu.Lock()
	if !o.closed {
		o.closed = true
		close(o.stop)
	}
	o.mu.Unlock()
	waitTimeout(&o.wg, d)
}

// isOutage reports whether err means Redis could not be reached or did not
// answer in time: network errors, timeouts, a dead connection, an exhausted
// pool. Error replies from the server (WRONGTYPE, CROSSSLOT, READONLY, OOM,
// ...) are answers, not outages, and so is the caller's own cancellation.
func isOutage(err error) bool {
	if err == nil || errors.Is(err, redis.Nil) || errors.Is(err, redis.ErrClosed) {
		return false
	}
	var reply redis.Error
	if errors.As(err, &reply) {
		return false
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	var nerr net.Error
	return errors.As(err, &nerr) ||
		errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, redis.ErrPoolTimeout) || errors.Is(err, redis.ErrPoolExhausted)
}

// waitTimeout waits for wg, but no longer than d. It reports whether wg
// finished.
func waitTimeout(wg *sync.WaitGroup, d time.Duration) bool {
	done := make(chan struct{})
	go func() {
		wg.Wait()
		close(done)
	}()
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-done:
		return true
	case <-t.C:
		return false
	}
}

// mayHaveRun reports whether a command that failed with err may still have
// run on the server: always, unless Redis answered with an error. (A dial
// error says little: go-redis reports its last attempt's error, and an
// earlier attempt may have been sent.)
func mayHaveRun(err error) bool {
	var reply redis.Error
	return !errors.As(err, &reply)
}
