package memolock

import (
	"context"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/redis/go-redis/v9"
)

// A batcher runs acquire scripts. A call with no other in flight goes
// straight to Redis on the caller's goroutine. Under load, calls queue and a
// few batcher goroutines send whatever has queued as one pipeline, so that
// Redis and the client pay one write and one read for many lookups instead
// of one each; nothing waits for a batch to fill. This is the hit path, so
// it matters: see BenchmarkHit.
type batcher struct {
	rdb      redis.UniversalClient
	stats    *counters
	inflight atomic.Int32
	queue    chan *acquireCall

	mu      sync.Mutex // guards started and stopped
	started bool
	stopped bool
	stop    chan struct{}
	wg      sync.WaitGroup
}

type acquireCall struct {
	keys []string
	args []any
	res  any
	err  error
	done chan struct{}
}

// maxBatch bounds one pipeline, so that one batch's replies do not delay
// the next batch for long.
const maxBatch = 128

func newBatcher(rdb redis.UniversalClient, stats *counters) *batcher {
	return &batcher{rdb: rdb, stats: stats, queue: make(chan *acquireCall, 4*maxBatch), stop: make(chan struct{})}
}

// run runs acquireScript with keys and args and returns its reply.
func (b *batcher) run(ctx context.Context, keys []string, args ...any) (any, error) {
	defer b.inflight.Add(-1)
	if b.inflight.Add(1) == 1 || !b.startOnce() {
		return acquireScript.Run(ctx, b.rdb, keys, args...).Result()
	}
	call := &acquireCall{keys: keys, args: args, done: make(chan struct{})}
	b.queue <- call
	// No select on ctx: the call is on its way, and its reply (perhaps a lock
	// just taken) must be read. go-redis would not abort a sent command on
	// cancellation either.
	<-call.done
	return call.res, call.err
}

// startOnce starts the batcher goroutines on first use; it reports false
// once the batcher is stopped.
func (b *batcher) startOnce() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.stopped {
		return false
	}
	if !b.started {
		b.started = true
		n := min(max(runtime.GOMAXPROCS(0), 2), 8)
		b.wg.Add(n)
		for range n {
			go b.loop()
		}
	}
	return true
}

func (b *batcher) loop() {
	defer b.wg.Done()
	batch := make([]*acquireCall, 0, maxBatch)
	for {
		batch = batch[:0]
		select {
		case call := <-b.queue:
			batch = append(batch, call)
		case <-b.stop:
			return
		}
	more:
		for len(batch) < maxBatch {
			select {
			case call := <-b.queue:
				batch = append(batch, call)
			default:
				break more
			}
		}
		b.send(batch)
	}
}

// send runs a batch as one pipeline of EVALSHA. Scripts that meet NOSCRIPT
// (a new or flushed server) run again through Script.Run, which loads them.
func (b *batcher) send(batch []*acquireCall) {
	ctx := context.Background()
	if len(batch) == 1 {
		call := batch[0]
		call.res, call.err = acquireScript.Run(ctx, b.rdb, call.keys, call.args...).Result()
		close(call.done)
		return
	}
	b.stats.batched.Add(int64(len(batch)))
	pipe := b.rdb.Pipeline()
	cmds := make([]*redis.Cmd, len(batch))
	for i, call := range batch {
		cmds[i] = acquireScript.EvalSha(ctx, pipe, call.keys, call.args...)
	}
	_, _ = pipe.Exec(ctx)
	for i, call := range batch {
		call.res, call.err = cmds[i].Result()
		if call.err != nil && strings.HasPrefix(call.err.Error(), "NOSCRIPT") {
			call.res, call.err = acquireScript.Run(ctx, b.rdb, call.keys, call.args...).Result()
		}
		close(call.done)
	}
}

// close stops the batcher goroutines. No call may be in flight.
func (b *batcher) close() {
	b.mu.Lock()
	b.stopped = true
	started := b.started
	b.mu.Unlock()
	if started {
		close(b.stop)
		b.wg.Wait()
	}
}
