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
// straight to Redis on the caller's goroutine. Under load, calls queue, and
// a few batcher goroutines send whatever has queued as one pipeline, so that
// Redis and the client pay one write and one read for many lookups instead
// of one each; nothing waits for a batch to fill. A batcher goroutine exits
// when the queue is empty, so an idle batcher holds none. This is the hit
// path, so it matters: see BenchmarkHit.
type batcher struct {
	rdb      redis.UniversalClient
	stats    *counters
	wg       *sync.WaitGroup // the client's: Close waits for the loops
	inflight atomic.Int32
	maxLoops int

	mu    sync.Mutex
	queue []*acquireCall
	loops int // batcher goroutines running
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

func newBatcher(rdb redis.UniversalClient, stats *counters, wg *sync.WaitGroup) *batcher {
	return &batcher{rdb: rdb, stats: stats, wg: wg, maxLoops: min(max(runtime.GOMAXPROCS(0), 2), 8)}
}

// run runs acquireScript with keys and args and returns its reply. It does
// not return before the reply is read: the reply may say that a lock was
// just taken. Callers that may leave early call it on a goroutine of their
// own.
func (b *batcher) run(ctx context.Context, keys []string, args ...any) (any, error) {
	defer b.inflight.Add(-1)
	if b.inflight.Add(1) == 1 {
		return acquireScript.Run(ctx, b.rdb, keys, args...).Result()
	}
	call := &acquireCall{keys: keys, args: args, done: make(chan struct{})}
	b.mu.Lock()
	b.queue = append(b.queue, call)
	start := b.loops < b.maxLoops
	if start {
		b.loops++
		b.wg.Add(1) // the caller is a flight, which holds the wait group above zero
	}
	b.mu.Unlock()
	if start {
		go b.loop()
	}
	<-call.done
	return call.res, call.err
}

// loop sends batches until the queue is empty.
func (b *batcher) loop() {
	defer b.wg.Done()
	for {
		b.mu.Lock()
		n := min(len(b.queue), maxBatch)
		if n == 0 {
			b.loops--
			b.mu.Unlock()
			return
		}
		batch := make([]*acquireCall, n)
		copy(batch, b.queue)
		clear(b.queue[:n])
		b.queue = b.queue[n:]
		if len(b.queue) == 0 {
			b.queue = nil
		}
		b.mu.Unlock()
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
