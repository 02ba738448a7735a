package engine

import (
	"context"
	"errors"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/memolock/memolock/internal/wire"
	"github.com/redis/go-redis/v9"
)

// A batcher runs one node's lookups (the acquire script). A lookup with no
// other in flight goes straight to Redis on the caller's goroutine. Under
// load, lookups queue, and a few batcher goroutines send whatever has queued
// as one pipeline to the node, so that Redis and the client pay one write
// and one read for many lookups instead of one each; nothing waits for a
// batch to fill. A batcher goroutine exits when the queue is empty, so an
// idle batcher holds none. This is the hit path: see BenchmarkHit.
type batcher struct {
	client   *redis.Client         // the node's own: pipelines go to it alone
	single   redis.UniversalClient // lookups redirected elsewhere: the cluster's client, or the node's
	stats    *counters
	work     *work  // the engine's: Close waits for the loops
	moved    func() // told of a MOVED: the cluster's slot map is out of date (nil: nobody)
	inflight atomic.Int32
	maxLoops int

	mu    sync.Mutex
	queue []*lookupCall
	loops int // batcher goroutines running
}

type lookupCall struct {
	keys      []string
	args      []any // nil: a plain GET of keys[0] (see get)
	res       any
	elsewhere bool // a redirection was followed: another node answered
	err       error
	done      chan struct{}
}

// maxBatch bounds one pipeline, so that one batch's replies do not delay
// the next batch for long.
const maxBatch = 128

func newBatcher(client *redis.Client, single redis.UniversalClient, stats *counters, w *work) *batcher {
	return &batcher{client: client, single: single, stats: stats, work: w, maxLoops: min(max(runtime.GOMAXPROCS(0), 2), 8)}
}

// run runs the acquire script with keys and args and returns its reply,
// and whether another node gave it (see runAlone). It does not return
// before the reply is read: the reply may say that a lock was just taken.
// Callers that may leave early call it on a goroutine of their own.
func (b *batcher) run(ctx context.Context, keys []string, args ...any) (any, bool, error) {
	if args == nil {
		args = []any{} // nil asks for a GET
	}
	return b.call(ctx, keys, args)
}

// get reads key with a plain GET, batched as lookups are: see
// Engine.readFirst. It returns the value and whether there was one, and
// whether another node answered. A missing key is no error.
func (b *batcher) get(ctx context.Context, key string) (string, bool, bool, error) {
	defer b.inflight.Add(-1)
	if b.inflight.Add(1) == 1 {
		// The hot key's path: nothing is made for the queue.
		return b.getAlone(ctx, key)
	}
	res, elsewhere, err := b.queued(ctx, []string{key}, nil)
	v, ok := res.(string)
	return v, ok, elsewhere, err
}

func (b *batcher) call(ctx context.Context, keys []string, args []any) (any, bool, error) {
	defer b.inflight.Add(-1)
	if b.inflight.Add(1) == 1 {
		return b.runAlone(ctx, keys, args)
	}
	return b.queued(ctx, keys, args)
}

// queued hands a lookup to the batcher goroutines, starting one if need
// be, and waits for its reply.
func (b *batcher) queued(ctx context.Context, keys []string, args []any) (any, bool, error) {
	lc := &lookupCall{keys: keys, args: args, done: make(chan struct{})}
	b.mu.Lock()
	b.queue = append(b.queue, lc)
	start := b.loops < b.maxLoops
	if start {
		b.loops++
		b.work.add()
	}
	b.mu.Unlock()
	if start {
		go b.loop()
	}
	<-lc.done
	return lc.res, lc.elsewhere, lc.err
}

// runAlone runs one lookup on the node, which loads the script if need be.
// A redirection (a slot that moved, or is moving) is followed through the
// cluster's client, and reported: another node answered, whose tracking
// the L1 may not have.
func (b *batcher) runAlone(ctx context.Context, keys []string, args []any) (any, bool, error) {
	if args == nil {
		v, ok, elsewhere, err := b.getAlone(ctx, keys[0])
		if !ok {
			return nil, elsewhere, err
		}
		return v, elsewhere, err
	}
	res, err := wire.Acquire.Run(ctx, b.client, keys, args...).Result()
	if err == nil || !redirected(err) {
		return res, false, err
	}
	if b.moved != nil && strings.HasPrefix(err.Error(), "MOVED ") {
		// The slot has a new owner that the client's map does not know
		// (a failover, a finished migration): a watch placed by that map
		// may sit on a node that hears nothing of it. ASK and TRYAGAIN,
		// a migration under way, change no owner yet.
		b.moved()
	}
	res, err = wire.Acquire.Run(ctx, b.single, keys, args...).Result()
	return res, true, err
}

// getAlone is runAlone's GET: the value and whether there was one, and
// whether another node answered.
func (b *batcher) getAlone(ctx context.Context, key string) (string, bool, bool, error) {
	v, err := b.client.Get(ctx, key).Result()
	switch {
	case err == nil:
		return v, true, false, nil
	case errors.Is(err, redis.Nil):
		return "", false, false, nil
	case !redirected(err):
		return "", false, false, err
	}
	if b.moved != nil && strings.HasPrefix(err.Error(), "MOVED ") {
		b.moved()
	}
	v, err = b.single.Get(ctx, key).Result()
	switch {
	case err == nil:
		return v, true, true, nil
	case errors.Is(err, redis.Nil):
		return "", false, true, nil
	}
	return "", false, true, err
}

// nilIfMissing is a GET's reply as the batcher gives it: the value, or nil.
func nilIfMissing(v string, err error) any {
	if err != nil {
		return nil
	}
	return v
}

// loop sends batches until the queue is empty.
func (b *batcher) loop() {
	defer b.work.done()
	for {
		b.mu.Lock()
		n := min(len(b.queue), maxBatch)
		if n == 0 {
			b.loops--
			b.mu.Unlock()
			return
		}
		batch := make([]*lookupCall, n)
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

// send runs a batch as one pipeline of EVALSHA to the node. A lookup that
// meets NOSCRIPT (a new or flushed server), or a redirection (a slot that
// moved or is moving, which go-redis follows only for single commands),
// runs again alone, which loads the script and follows redirections, once
// the rest of the batch has its replies.
func (b *batcher) send(batch []*lookupCall) {
	ctx := context.Background()
	if len(batch) == 1 {
		lc := batch[0]
		lc.res, lc.elsewhere, lc.err = b.runAlone(ctx, lc.keys, lc.args)
		close(lc.done)
		return
	}
	pipe := b.client.Pipeline()
	cmds := make([]redis.Cmder, len(batch))
	scripts := 0
	for i, lc := range batch {
		if lc.args == nil {
			cmds[i] = pipe.Get(ctx, lc.keys[0])
		} else {
			cmds[i] = wire.Acquire.EvalSha(ctx, pipe, lc.keys, lc.args...)
			scripts++
		}
	}
	b.stats.batched.Add(int64(scripts)) // lookups (Stats.Batched): reads first are not
	_, _ = pipe.Exec(ctx)
	// Every reply that needs no second run is handed out before any second
	// run starts. A second run may follow a redirection to a node that
	// refuses connections, and wait out go-redis's dial retries (a second
	// and more): the members behind it, whose replies are read already,
	// would have them that much later and that much staler (a value read
	// before a newer write, given out after it). The second runs go one
	// after another on this goroutine, which Close already waits for
	// (b.work): a goroutine each would need counting of its own, to gain
	// only that a fault's few second runs overlap; the queue meanwhile has
	// the other batcher goroutines.
	var again []*lookupCall
	for i, lc := range batch {
		if readReply(lc, cmds[i]) {
			again = append(again, lc)
			continue
		}
		close(lc.done)
	}
	for _, lc := range again {
		lc.res, lc.elsewhere, lc.err = b.runAlone(ctx, lc.keys, lc.args)
		close(lc.done)
	}
}

// readReply sets lc's reply from its command in a pipeline, and reports
// whether lc must run again alone: it met NOSCRIPT, or a redirection.
func readReply(lc *lookupCall, cmd redis.Cmder) bool {
	switch c := cmd.(type) {
	case *redis.StringCmd:
		v, err := c.Result()
		lc.res, lc.err = nilIfMissing(v, err), err
		if errors.Is(err, redis.Nil) {
			lc.err = nil
		}
	case *redis.Cmd:
		lc.res, lc.err = c.Result()
	}
	return lc.err != nil && (strings.HasPrefix(lc.err.Error(), "NOSCRIPT") || redirected(lc.err))
}
