package engine

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

// An outage remembers that one node could not be reached, so that calls
// for its keys fail at once instead of each paying for dials and timeouts,
// while a background probe notices when the node answers again. Other
// nodes' keys are not concerned.
type outage struct {
	addr   string
	client *redis.Client // the node's own: a probe reaches that node alone
	// reload, on a cluster, asks go-redis for a fresh slot map: the node
	// may be gone for good, its slots served by a promoted replica.
	reload func()
	// retire, on a cluster, forgets the node: nobody asked for it for
	// probeIdle, and its probe ends. Nil on a single node, whose probe
	// runs until it is answered.
	retire func()
	stats  *counters
	log    *slog.Logger
	work   *work
	every  time.Duration // pause between probes

	cause atomic.Pointer[error] // set while the node is unreachable
	asked atomic.Int64          // while it is: when a call last asked for the node, Unix ns

	mu      sync.Mutex
	probing bool
	// The log lines of outages, at most one pair per outageLogEvery, so
	// that a flapping network is not a line per failed call.
	logged   time.Time // when an outage's start was last logged
	quiet    int       // outages begun since, not logged
	loudThis bool      // the current outage's start was logged
	closed   bool
	stop     chan struct{}
}

// probeEvery is how often the probe PINGs an unreachable node, at most. A
// cluster's node that no call asked for during probeIdle is no longer
// probed: its slots have moved to other masters, or nobody needs them.
const (
	probeEvery  = 500 * time.Millisecond
	reloadEvery = time.Second
	probeIdle   = 5 * time.Second
)

// outageLogEvery is the least time between two logged outages; those
// between are counted in the next line.
const outageLogEvery = 10 * time.Second

func newOutage(client *redis.Client, addr string, reload, retire func(), stats *counters, log *slog.Logger, w *work) *outage {
	if reload != nil {
		log = log.With("node", addr)
	}
	return &outage{addr: addr, client: client, reload: reload, retire: retire, stats: stats, log: log, work: w, every: probeEvery, stop: make(chan struct{})}
}

// err returns an error wrapping ErrRedis while the node is unreachable, nil
// otherwise. It is one atomic load while the node is reachable.
func (o *outage) err() error {
	if p := o.cause.Load(); p != nil {
		o.asked.Store(time.Now().UnixNano())
		return &unreachableError{addr: o.addr, cause: *p, every: o.every}
	}
	return nil
}

// unreachableError is what calls get during an outage: ErrRedis, and the
// error that started or continued it.
type unreachableError struct {
	addr  string // the node's
	cause error
	every time.Duration
}

func (e *unreachableError) Error() string {
	cause := strings.TrimPrefix(e.cause.Error(), ErrRedis.Error()+": ")
	return fmt.Sprintf("%v: %s unreachable, probed every %v: %s", ErrRedis, e.addr, e.every, cause)
}

func (e *unreachableError) Unwrap() []error { return []error{ErrRedis, e.cause} }

// report looks at an error from a lookup on the node. If it says the node
// is unreachable, the outage starts and the probe runs until it answers.
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
				"error", err, "probe_every", o.every.String(), "outages_not_logged", o.quiet)
			o.logged, o.quiet = time.Now(), 0
		} else {
			o.quiet++
		}
	}
	o.cause.Store(&err)
	o.asked.Store(time.Now().UnixNano())
	if !o.probing {
		o.probing = true
		o.work.add()
		go o.probe()
	}
}

// probe PINGs the node until it answers, then ends the outage. A PING
// waits as long as the node's client lets it (a node just resumed from a
// freeze may take seconds to work through what queued meanwhile): no two
// are in flight at once. On a cluster, the probe also asks for a fresh
// slot map every reloadEvery, so that calls soon find a replica promoted
// in the node's place, and it ends when nobody has asked for the node
// during probeIdle.
func (o *outage) probe() {
	defer o.work.done()
	tick := time.NewTicker(o.every)
	defer tick.Stop()
	pings := make(chan error, 1)
	pinging := false
	var reloaded time.Time
	for {
		if o.reload != nil && time.Since(reloaded) >= reloadEvery {
			o.reload()
			reloaded = time.Now()
		}
		if !pinging {
			pinging = true
			o.work.add()
			go func() {
				defer o.work.done()
				pings <- o.client.Ping(context.Background()).Err()
			}()
		}
		select {
		case err := <-pings:
			pinging = false
			if o.answered(err) {
				return
			}
			continue // the next PING at once: the last one took its time
		case <-tick.C:
		case <-o.stop:
			return
		}
		if o.retire != nil && time.Since(time.Unix(0, o.asked.Load())) > probeIdle {
			o.close()
			o.retire()
			return
		}
	}
}

// answered ends the outage if the probe's PING got a reply, if only an
// error reply.
func (o *outage) answered(err error) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	var reply redis.Error
	if err != nil && !errors.As(err, &reply) {
		o.cause.Store(&err)
		return false
	}
	o.cause.Store(nil)
	if o.loudThis {
		o.log.Warn("memolock: Redis answers again; the outage is over")
	}
	o.probing = false
	return true
}

// close stops the probe; the engine's work counter says when it has ended.
func (o *outage) close() {
	o.mu.Lock()
	defer o.mu.Unlock()
	if !o.closed {
		o.closed = true
		close(o.stop)
	}
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

// mayHaveRun reports whether a command that failed with err may still have
// run on the server: always, unless Redis answered with an error. (A dial
// error says little: go-redis reports its last attempt's error, and an
// earlier attempt may have been sent.)
func mayHaveRun(err error) bool {
	var reply redis.Error
	return !errors.As(err, &reply)
}
