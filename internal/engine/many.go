package engine

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/memolock/memolock/internal/wire"
	"github.com/redis/go-redis/v9"
)

// Item is one distinct id of a GetMany call: its id as the caller gave it,
// its key as sent to Redis (or Err, if it has none), and its answer.
type Item struct {
	ID     string
	Key    string
	Value  []byte
	Served Served
	Err    error
}

// BatchFunc computes several values in one go (ManyOptions.Batch).
type BatchFunc func(ctx context.Context, ids []string) (map[string]BatchValue, error)

// BatchValue is a BatchFunc's answer for one id.
type BatchValue struct {
	Value []byte
	TTL   time.Duration
	Err   error
}

// GetMany answers items: from the L1, then from one read per node, then
// each missing id the way of Get, limit at a time with fetchID, or through
// batch when it is set. A node's missing ids are pursued as soon as that
// node's read answers: a slow or frozen node holds up only its own ids.
// Every item's answer is counted.
func (e *Engine) GetMany(ctx context.Context, items []Item, fetchID func(id string) FetchFunc, batch BatchFunc, limit int) {
	counted := make([]bool, len(items)) // by their flights, or Get
	e.refuseReentry(items)
	misses := e.newMisses(ctx, items, fetchID, batch, limit)
	e.readHits(ctx, items, func(missing []int) {
		for _, i := range missing {
			counted[i] = true
		}
		misses.pursue(missing)
	})
	misses.wait()
	for i := range items {
		it := &items[i]
		if !counted[i] {
			e.stats.answered(it.Served, it.Err)
		}
		if c, ok := it.Err.(*calledError); ok {
			// The callback's own error, for the caller. Only a failed
			// fetch's item is written: promoteMany, which may still run,
			// reads the items of the hits it promotes.
			it.Err = c.err
		}
	}
}

// refuseReentry fails the items that a callback running on the calling
// goroutine serves (a fetch that asks GetMany for its own id, say): their
// flights would wait for themselves. GetMany pursues ids on goroutines of
// its own, where reentered cannot tell.
func (e *Engine) refuseReentry(items []Item) {
	cur, ok := e.callbacks.current()
	if !ok {
		return
	}
	for i := range items {
		it := &items[i]
		if it.Err != nil {
			continue
		}
		for _, f := range cur {
			if f.key == it.Key {
				it.Err = reentryError(it.ID)
				break
			}
		}
	}
}

// takeRead fills in the hits of one node's read, and returns the places of
// the others.
func (e *Engine) takeRead(items []Item, r nodeRead) (missing []int) {
	if r.missing {
		return r.places
	}
	if r.err != nil {
		if errors.Is(r.err, ErrClosed) {
			for _, i := range r.places {
				items[i].Err = ErrClosed
			}
			return nil
		}
		return r.places
	}
	var hits int64
	var promote []int // places in r
	for j, v := range r.vals {
		it := &items[r.places[j]]
		switch v := v.(type) {
		case string:
			hits++
			if j < len(r.locks) {
				if h, _ := r.locks[j].(string); strings.HasPrefix(h, "stale:") {
					it.Value, it.Served = []byte(v), ServedStale
					e.stats.servedStale.Add(1)
					if e.l1 != nil && r.snaps[j].Live() {
						promote = append(promote, j)
					}
					continue
				}
			}
			it.Value, it.Served = []byte(v), ServedRedis
			if e.l1 != nil && r.snaps[j].Live() {
				promote = append(promote, j)
			}
		case error:
			r.n.down.report(v)
			missing = append(missing, r.places[j])
		default:
			missing = append(missing, r.places[j])
		}
	}
	e.stats.hits.Add(hits)
	if len(promote) > 0 && e.flights.admit(&e.work) {
		go func() {
			defer e.work.done()
			e.promoteMany(items, r, promote)
		}()
	}
	return missing
}

// promoteMany puts the values that a read found into the L1, with the time
// Redis has left on each (one pipeline of PTTLs), if nothing invalidated
// them since before the read.
func (e *Engine) promoteMany(items []Item, r nodeRead, promote []int) {
	ctx, cancel := context.WithTimeout(context.Background(), closeWait)
	defer cancel()
	cmds, err := r.n.client.Pipelined(ctx, func(p redis.Pipeliner) error {
		for _, j := range promote {
			p.PTTL(ctx, e.keys.Value(items[r.places[j]].Key))
		}
		return nil
	})
	if err != nil {
		return
	}
	for k, j := range promote {
		ttl, err := cmds[k].(*redis.DurationCmd).Result()
		if err != nil || ttl == -2*time.Nanosecond || ttl == 0 {
			continue
		}
		it := items[r.places[j]]
		if it.Served == ServedStale {
			e.l1.PutStale(it.Key, it.Value, ttl, r.snaps[j])
			continue
		}
		e.l1.Put(it.Key, it.Value, e.l1TTL(ttl), r.snaps[j])
	}
}

// readValues reads keys, all owned by n, in one round trip: MGET on a
// single node whose ids are not placed in slots of their own, else a
// pipeline of GETs to the node (keys in many slots cannot share an MGET).
// Each value is a string, nil for a miss, or the error of that key's GET.
func (e *Engine) readValues(ctx context.Context, n *node, keys []string) ([]any, error) {
	if e.cfg.Cluster == nil && !e.cfg.Placed {
		vals, err := n.client.MGet(ctx, keys...).Result()
		if err == nil && len(vals) != len(keys) {
			err = fmt.Errorf("MGET of %d keys answered %d values", len(keys), len(vals))
		}
		if err != nil {
			return nil, fmt.Errorf("%w: reading %d values with MGET: %w", ErrRedis, len(keys), err)
		}
		return vals, nil
	}
	pipe := n.client.Pipeline()
	cmds := make([]*redis.StringCmd, len(keys))
	for i, key := range keys {
		cmds[i] = pipe.Get(ctx, key)
	}
	_, _ = pipe.Exec(ctx) // each command keeps its own error
	vals := make([]any, len(keys))
	for i, cmd := range cmds {
		v, err := cmd.Result()
		if err != nil && redirected(err) && e.cfg.Cluster != nil {
			// A slot that moved, or is moving: go-redis follows the
			// redirection for a single command.
			v, err = e.cfg.Cluster.Get(ctx, keys[i]).Result()
		}
		switch {
		case err == nil:
			vals[i] = v
		case errors.Is(err, redis.Nil):
		default:
			vals[i] = fmt.Errorf("%w: reading %s: %w", ErrRedis, wire.Quote(keys[i]), err)
		}
	}
	return vals, nil
}

// misses pursues the missing items of one GetMany call as Get does, as
// they come: limit at a time with a fetch per id, or through one collector
// whose batches serve them all.
type misses struct {
	e       *Engine
	ctx     context.Context
	items   []Item
	fetchID func(string) FetchFunc
	limit   int
	col     *collector // batch mode

	places  chan int       // fetch mode: the places still to pursue
	workers sync.WaitGroup // fetch mode
	started int
	flights []memberFlight // batch mode: the flights to await
}

type memberFlight struct {
	place int
	f     *flight
}

func (e *Engine) newMisses(ctx context.Context, items []Item, fetchID func(string) FetchFunc, batch BatchFunc, limit int) *misses {
	ms := &misses{e: e, ctx: ctx, items: items, fetchID: fetchID, limit: limit}
	if batch != nil {
		ms.col = &collector{e: e, batch: batch}
	} else {
		ms.places = make(chan int, len(items))
	}
	return ms
}

// pursue starts pursuing the items at places.
func (ms *misses) pursue(places []int) {
	if ms.col != nil {
		ms.startMembers(places)
		return
	}
	for _, i := range places {
		ms.places <- i
		if ms.started < ms.limit {
			ms.started++
			ms.workers.Add(1)
			go ms.work()
		}
	}
}

// work pursues places, one Get at a time, until there are none left.
func (ms *misses) work() {
	defer ms.workers.Done()
	for i := range ms.places {
		it := &ms.items[i]
		it.Value, it.Served, it.Err = ms.e.get(ms.ctx, it.ID, it.Key, fetcherOf(ms.fetchID(it.ID)), nil) // revealed by GetMany
		if it.Err != nil && !errors.Is(it.Err, ErrNotFound) {
			it.Value, it.Served = nil, 0
		}
	}
}

// wait waits for every pursued item's answer.
func (ms *misses) wait() {
	if ms.col == nil {
		close(ms.places)
		ms.workers.Wait()
		return
	}
	for _, mf := range ms.flights {
		it := &ms.items[mf.place]
		a := ms.e.await(ms.ctx, mf.f)
		it.Value, it.Served, it.Err = a.val, a.served, a.err
		if it.Err != nil && !isNotFound(it.Err) {
			it.Served = 0
		}
	}
}
