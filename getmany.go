package memolock

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// Item is GetMany's answer for one id.
type Item struct {
	ID     string
	Value  []byte // shared with other callers of the same value: do not modify
	Served Served // how Value was served; 0 when Err is set, unless it matches ErrNotFound
	Err    error  // this id's error alone
}

// BatchValue is a BatchFetchFunc's answer for one id: what a FetchFunc
// returns for it. Err fails that id alone.
type BatchValue struct {
	Value []byte
	TTL   time.Duration
	Err   error
}

// BatchFetchFunc computes several values in one go, for GetMany. ids are
// the ids whose locks the call won: Batch holds each of them, and the
// Client renews them all while it runs. Its answer should hold every id;
// an id it leaves out fails with an error naming it. A returned error, or a
// panic, fails every id of the call.
//
// ctx carries the values of GetMany's context, but not its deadline (the
// values serve every caller of these ids, here and elsewhere). It is
// cancelled when every id of the call has run past its fetch time limit, or
// when the Client is closed.
type BatchFetchFunc func(ctx context.Context, ids []string) (map[string]BatchValue, error)

// FetchIDFunc is a FetchFunc told which id to compute, as the caller gave
// it: one serves every id of a GetMany call (lease.ID is the id as sent to
// Redis, hashed under Options.HashIDs).
type FetchIDFunc func(ctx context.Context, id string, lease *Lease) (value []byte, ttl time.Duration, err error)

// ManyOptions configure one GetMany call. A nil *ManyOptions means all
// defaults.
type ManyOptions struct {
	// Concurrency bounds how many missing ids are pursued at once (looked
	// up, waited for or computed), each as one Get. Default is 16; negative
	// is rejected. It does not apply with Batch.
	Concurrency int

	// Batch, if set, computes every missing id whose lock this call wins
	// in one call, instead of fetch. It runs once every lookup of the call
	// has answered, with every id won by then; an id won later (after
	// waiting for a holder elsewhere that failed or died) comes in a later
	// call.
	Batch BatchFetchFunc
}

// DefaultManyConcurrency is ManyOptions.Concurrency when it is zero.
const DefaultManyConcurrency = 16

// GetMany returns the values of ids, in the order of ids, each with how it
// was served or its own error: one id's failure never fails the others.
// Values that Redis holds cost one round trip for all of them: one MGET, or,
// on a cluster, one pipeline of GETs (go-redis sends one to each node).
// Each missing id is then pursued as Get pursues it: it joins a flight for
// the same id already running in this process, or waits for a holder in
// another process, or wins the lock and computes, with fetch or, if set,
// opts.Batch (fetch is then unused, and may be nil). An id given more than
// once is looked up once, and every position gets the same answer.
//
// ctx bounds the whole call: when it ends, ids still unanswered get an
// error matching ErrTimeout and ctx.Err(), whatever Redis does, and
// computations already under way go on for their other callers.
//
// The error is only for a call that attempts nothing: a nil or closed
// client, a nil ctx or one already done, no fetch and no Batch, or a
// negative Concurrency. Empty ids make no call to Redis.
func (c *Client) GetMany(ctx context.Context, ids []string, fetch FetchIDFunc, opts *ManyOptions) ([]Item, error) {
	if err := c.ready(ctx); err != nil {
		return nil, err
	}
	if opts == nil {
		opts = &ManyOptions{}
	}
	if fetch == nil && opts.Batch == nil {
		return nil, fmt.Errorf("%w: fetch is nil and ManyOptions.Batch is not set; pass one of them", ErrInvalid)
	}
	if opts.Concurrency < 0 {
		return nil, fmt.Errorf("%w: ManyOptions.Concurrency %d is negative; use 0 for the default of %d", ErrInvalid, opts.Concurrency, DefaultManyConcurrency)
	}
	items := make([]Item, len(ids))
	if len(ids) == 0 {
		return items, nil
	}
	index := make(map[string]int, len(ids)) // id: its place in distinct
	distinct := make([]string, 0, len(ids))
	for _, id := range ids {
		if _, ok := index[id]; !ok {
			index[id] = len(distinct)
			distinct = append(distinct, id)
		}
	}
	answers := make([]Item, len(distinct))
	for i, id := range distinct {
		answers[i].ID = id
	}
	counted := make([]bool, len(answers)) // by their flights, or get
	if missing := c.readHits(ctx, answers); len(missing) > 0 {
		for _, i := range missing {
			counted[i] = true
		}
		if opts.Batch != nil {
			c.batchMisses(ctx, answers, missing, opts.Batch)
		} else {
			limit := opts.Concurrency
			if limit == 0 {
				limit = DefaultManyConcurrency
			}
			c.fetchMisses(ctx, answers, missing, fetch, limit)
		}
	}
	for i, a := range answers {
		if !counted[i] {
			c.stats.count(a.Served, a.Err)
		}
	}
	for i, id := range ids {
		items[i] = answers[index[id]]
	}
	return items, nil
}

// readHits reads the values of items' ids in one round trip, fills in the
// hits, and returns the places of the others. If ctx ends first, every item
// gets the error and none is missing. Any other failure leaves every id to
// the path of Get, which reports errors as Get does (at once, during an
// outage, or computing under FailOpen).
func (c *Client) readHits(ctx context.Context, items []Item) (missing []int) {
	// The L1 first, if there is one; Redis for the rest.
	ids := make([]string, 0, len(items)) // as sent to Redis
	index := make([]int, 0, len(items))  // their places in items
	var l1Hits int64
	for i, it := range items {
		key, err := c.wireID(it.ID)
		if err != nil {
			items[i].Err = err
			continue
		}
		if c.l1 != nil {
			if v, notFound, ok := c.l1.get(key); ok {
				items[i].Value, items[i].Served = v, ServedL1
				if notFound {
					items[i].Err = c.notFoundErr(it.ID)
				}
				l1Hits++
				continue
			}
		}
		ids = append(ids, key)
		index = append(index, i)
	}
	c.flights.countHits(l1Hits)
	if len(ids) == 0 {
		return nil
	}
	all := func() []int { return append([]int(nil), index...) }
	if c.outage.err() != nil {
		return all()
	}
	var snaps []l1Snap
	if c.l1 != nil {
		snaps = make([]l1Snap, len(ids))
		for j, key := range ids {
			snaps[j] = c.l1.snap(key) // before the read
		}
	}
	keys := make([]string, len(ids))
	for j, key := range ids {
		keys[j] = c.keys.Value(key)
	}
	read := keys
	if c.staleTTL > 0 {
		// The locks too, in the same round trip: a value put back stale
		// has a lock that says so (see resurrectSrc).
		read = make([]string, 0, 2*len(ids))
		read = append(read, keys...)
		for _, key := range ids {
			read = append(read, c.keys.Lock(key))
		}
	}
	var vals, locks []any
	err := c.bounded(ctx, func(ctx context.Context) error {
		v, err := c.readValues(ctx, read)
		vals, locks = v[:min(len(v), len(keys))], v[min(len(v), len(keys)):]
		return err
	})
	switch {
	case errors.Is(err, ErrTimeout) || errors.Is(err, ErrClosed):
		for _, i := range index {
			items[i].Err = err
		}
		return nil
	case err != nil:
		c.outage.report(err)
		return all()
	}
	var hits int64
	var promote []int // places in ids
	for j, v := range vals {
		i := index[j]
		switch v := v.(type) {
		case string:
			if j < len(locks) {
				if h, _ := locks[j].(string); strings.HasPrefix(h, "stale:") {
					items[i].Value, items[i].Served = []byte(v), ServedStale
					c.stats.stale.Add(1)
					hits++
					continue
				}
			}
			items[i].Value, items[i].Served = []byte(v), ServedRedis
			hits++
			if c.l1 != nil && snaps[j].ok {
				promote = append(promote, j)
			}
		case error:
			c.outage.report(v)
			missing = append(missing, i)
		default:
			missing = append(missing, i)
		}
	}
	c.stats.hits.Add(hits)
	c.flights.countHits(hits)
	if len(promote) > 0 && c.flights.track(&c.wg) {
		values := make([][]byte, len(promote))
		for n, j := range promote {
			values[n] = items[index[j]].Value
		}
		go func() {
			defer c.wg.Done()
			c.promoteMany(ids, keys, values, promote, snaps)
		}()
	}
	return missing
}

// promoteMany puts the values that readHits found in Redis into the L1,
// with the time Redis has left on each (one pipeline of PTTLs), if nothing
// invalidated them since before the read.
func (c *Client) promoteMany(ids, keys []string, values [][]byte, promote []int, snaps []l1Snap) {
	ctx, cancel := context.WithTimeout(context.Background(), closeWait)
	defer cancel()
	cmds, err := c.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for _, j := range promote {
			p.PTTL(ctx, keys[j])
		}
		return nil
	})
	if err != nil {
		return
	}
	for n, j := range promote {
		ttl, err := cmds[n].(*redis.DurationCmd).Result()
		if err != nil || ttl == -2*time.Nanosecond || ttl == 0 {
			continue
		}
		c.l1.promote(ids[j], values[n], c.l1TTL(ttl), snaps[j])
	}
}

// readValues reads keys in one round trip: MGET on one server, a pipeline
// of GETs elsewhere (a cluster's keys are in many slots; go-redis splits
// the pipeline by node). Each value is a string, nil for a miss, or, from
// a pipeline, the error of that key's GET.
func (c *Client) readValues(ctx context.Context, keys []string) ([]any, error) {
	if rdb, ok := c.rdb.(*redis.Client); ok {
		vals, err := rdb.MGet(ctx, keys...).Result()
		if err == nil && len(vals) != len(keys) {
			err = fmt.Errorf("MGET of %d keys answered %d values", len(keys), len(vals))
		}
		if err != nil {
			return nil, fmt.Errorf("%w: reading %d values with MGET: %w", ErrRedis, len(keys), err)
		}
		return vals, nil
	}
	pipe := c.rdb.Pipeline()
	cmds := make([]*redis.StringCmd, len(keys))
	for i, key := range keys {
		cmds[i] = pipe.Get(ctx, key)
	}
	_, _ = pipe.Exec(ctx) // each command keeps its own error
	vals := make([]any, len(keys))
	for i, cmd := range cmds {
		v, err := cmd.Result()
		switch {
		case err == nil:
			vals[i] = v
		case errors.Is(err, redis.Nil):
		default:
			vals[i] = fmt.Errorf("%w: reading %s: %w", ErrRedis, quote(keys[i]), err)
		}
	}
	return vals, nil
}

// countHits counts hits that GetMany answered without a flight as calls.
func (g *group) countHits(n int64) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.gets += n
}

// fetchMisses pursues the missing items as GetResult does, limit at a time.
func (c *Client) fetchMisses(ctx context.Context, items []Item, missing []int, fetch FetchIDFunc, limit int) {
	var next atomic.Int64
	var wg sync.WaitGroup
	for range min(limit, len(missing)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				n := int(next.Add(1)) - 1
				if n >= len(missing) {
					return
				}
				it := &items[missing[n]]
				var cl call
				f, val, served, err := c.get(ctx, it.ID, func(ctx context.Context, lease *Lease) ([]byte, time.Duration, error) {
					return fetch(ctx, it.ID, lease)
				}, nil, &cl)
				if f != nil {
					val, served, err = c.flights.await(ctx, f)
				}
				c.observe(cl, served, err) // get or the flight counted it
				it.Value, it.Served, it.Err = val, served, err
				if err != nil && !errors.Is(err, ErrNotFound) {
					it.Value, it.Served = nil, 0
				}
			}
		}()
	}
	wg.Wait()
}

// batchMisses pursues every missing item at once, as Get does, except that
// the flights this call starts fetch through one collector, which hands
// their ids to batch together.
func (c *Client) batchMisses(ctx context.Context, items []Item, missing []int, batch BatchFetchFunc) {
	col := &collector{batch: batch}
	flights := make([]*flight, len(missing))
	// Counted as pending while members start, so that a member that wins
	// and reaches fetch at once does not run a batch of its own before the
	// others have even looked.
	col.add()
	for n, i := range missing {
		flights[n], items[i].Err = c.startMember(ctx, items[i].ID, col)
	}
	col.started()
	for n, i := range missing {
		f := flights[n]
		if f == nil {
			continue
		}
		it := &items[i]
		it.Value, it.Served, it.Err = c.flights.await(ctx, f)
		if it.Err != nil && !errors.Is(it.Err, ErrNotFound) {
			it.Served = 0
		}
	}
}

// startMember starts or joins the flight for id, as get does. A flight it
// starts fetches through col, and tells col what its first lookup found,
// so that col knows which of its flights will enter fetch soon.
func (c *Client) startMember(ctx context.Context, id string, col *collector) (*flight, error) {
	key, err := c.wireID(id)
	if err != nil {
		return nil, err
	}
	m := &member{col: col, id: id, run: make(chan []*member, 1), answer: make(chan BatchValue, 1)}
	f, leader, err := c.flights.join(key, func() *flight {
		return &flight{id: id, key: key, token: newToken(), fetch: m.fetch, done: make(chan struct{}), batched: true}
	}, &c.wg)
	if err != nil {
		c.stats.count(0, err) // no flight to count it
		return nil, err
	}
	if !leader {
		return f, nil
	}
	col.add()
	c.flights.launch(f, ctx)
	c.wg.Add(1) // the flight holds wg above zero until resolve returns
	go func() {
		defer c.wg.Done()
		// The first lookup is made here rather than in resolve, so that
		// col learns its outcome: a caller that may leave must not wait on
		// Redis itself (see get).
		a := c.lookup(f.ctx, f)
		won := (a.err == nil && a.r.kind == replyLocked) || (a.err != nil && c.failOpen && isOutage(a.err))
		col.looked(m, won)
		c.resolve(f, &a)
		col.settled(m)
	}()
	return f, nil
}

// A collector gathers the fetches of the flights that one GetMany call
// started, and runs its batch function for them together. It waits for
// nothing but those flights' first lookups and the fetches of the flights
// that won their locks, neither of which waits on anyone: a batch never
// waits for a flight that waits for another holder, which might itself be
// waiting in a batch for one of ours. A flight that wins its lock later
// joins a later batch.
//
// The member whose fetch heads a batch runs it, on its fetch's goroutine,
// which Close waits for.
type collector struct {
	batch BatchFetchFunc

	mu      sync.Mutex
	pending int       // members looking up, or won and not yet in fetch
	queue   []*member // members in fetch, waiting for a batch
	running bool      // a batch is running
}

// A member is one flight that a collector serves.
type member struct {
	col    *collector
	id     string
	run    chan []*member  // capacity 1: run the batch for these members
	answer chan BatchValue // capacity 1: this member's answer

	// Guarded by col.mu.
	state memberState
	ctx   context.Context // its fetch's, once in fetch
}

// memberState is where a member stands with its collector.
type memberState uint8

const (
	memberLooking  memberState = iota // its first lookup is under way
	memberWon                         // it won the lock: fetch is due
	memberAway                        // another holder computes, or it failed
	memberFetching                    // in fetch, queued or in a batch
	memberSettled                     // its flight ended without fetching
)

func (col *collector) add() {
	col.mu.Lock()
	defer col.mu.Unlock()
	col.pending++
}

// started ends the count that add made while members were starting.
func (col *collector) started() {
	col.mu.Lock()
	defer col.mu.Unlock()
	col.pending--
	col.startLocked()
}

// looked records the outcome of a member's first lookup.
func (col *collector) looked(m *member, won bool) {
	col.mu.Lock()
	defer col.mu.Unlock()
	if won {
		m.state = memberWon
		return
	}
	m.state = memberAway
	col.pending--
	col.startLocked()
}

// settled records that a member's flight has ended.
func (col *collector) settled(m *member) {
	col.mu.Lock()
	defer col.mu.Unlock()
	switch m.state {
	case memberWon:
		col.pending--
	case memberFetching:
		return
	}
	m.state = memberSettled
	col.startLocked()
}

// enter queues a member whose fetch was called.
func (col *collector) enter(m *member, ctx context.Context) {
	col.mu.Lock()
	defer col.mu.Unlock()
	if m.state == memberWon {
		col.pending--
	}
	m.state, m.ctx = memberFetching, ctx
	col.queue = append(col.queue, m)
	col.startLocked()
}

// startLocked hands the queue to its first member to run as a batch, if
// no batch runs and no member is still due.
func (col *collector) startLocked() {
	if col.running || col.pending > 0 || len(col.queue) == 0 {
		return
	}
	col.running = true
	round := col.queue
	col.queue = nil
	round[0].run <- round // never blocks: a member heads one batch at most
}

// fetch is a member flight's FetchFunc: it waits in the collector for its
// answer, and runs the batch if it heads one.
func (m *member) fetch(ctx context.Context, _ *Lease) ([]byte, time.Duration, error) {
	m.col.enter(m, ctx)
	for {
		select {
		case round := <-m.run:
			m.col.runBatch(round)
		case a := <-m.answer:
			return a.Value, a.TTL, a.Err
		}
	}
}

// runBatch runs the batch function for round and answers each member, then
// starts the next batch if one is due.
func (col *collector) runBatch(round []*member) {
	ids := make([]string, len(round))
	for i, m := range round {
		ids[i] = m.id
	}
	// The batch serves its members: it ends when all of their fetch
	// contexts have (Close, or each one's time limit).
	ctx, cancel := context.WithCancel(context.WithoutCancel(round[0].ctx))
	defer cancel()
	left := int64(len(round))
	for _, m := range round {
		stop := context.AfterFunc(m.ctx, func() {
			if atomic.AddInt64(&left, -1) == 0 {
				cancel()
			}
		})
		defer stop()
	}
	var res map[string]BatchValue
	var err error
	if p := callUser(func() { res, err = col.batch(ctx, ids) }); p != nil {
		err = fmt.Errorf("%w: batch fetch: %v\n%s", ErrFetchPanicked, p, debug.Stack())
	}
	for _, m := range round {
		a, ok := res[m.id]
		switch {
		case err != nil:
			a = BatchValue{Err: err}
		case !ok:
			a = BatchValue{Err: fmt.Errorf("%w: batch fetch returned no value for id %s; answer every id it is given, with Err set to fail one", ErrInvalid, quote(m.id))}
		}
		m.answer <- a
	}
	col.mu.Lock()
	defer col.mu.Unlock()
	col.running = false
	col.startLocked()
}
