package memolock

import (
	"context"
	"fmt"
	"time"

	"github.com/memolock/memolock/internal/engine"
	"github.com/memolock/memolock/internal/wire"
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
	distinct := make([]engine.Item, 0, len(ids))
	for _, id := range ids {
		if _, ok := index[id]; !ok {
			index[id] = len(distinct)
			key, err := c.wireID(id)
			distinct = append(distinct, engine.Item{ID: id, Key: key, Err: err})
		}
	}
	limit := opts.Concurrency
	if limit == 0 {
		limit = DefaultManyConcurrency
	}
	c.e.GetMany(ctx, distinct, manyFetch(fetch), manyBatch(opts.Batch), limit)
	for i, id := range ids {
		a := distinct[index[id]]
		items[i] = Item{ID: id, Value: a.Value, Served: Served(a.Served), Err: a.Err}
	}
	return items, nil
}

// manyFetch makes fetch the engine's, for each id.
func manyFetch(fetch FetchIDFunc) func(string) engine.FetchFunc {
	if fetch == nil {
		return nil
	}
	return func(id string) engine.FetchFunc {
		return func(ctx context.Context, l *wire.Lease) ([]byte, time.Duration, error) {
			return fetch(ctx, id, leaseOf(l))
		}
	}
}

// manyBatch makes batch the engine's.
func manyBatch(batch BatchFetchFunc) engine.BatchFunc {
	if batch == nil {
		return nil
	}
	return func(ctx context.Context, ids []string) (map[string]engine.BatchValue, error) {
		res, err := batch(ctx, ids)
		out := make(map[string]engine.BatchValue, len(res))
		for id, v := range res {
			out[id] = engine.BatchValue(v)
		}
		return out, err
	}
}
