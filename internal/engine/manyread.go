package engine

// GetMany's reads: the L1 first, then one read per node, each node's
// answer handed over as it comes.

import (
	"context"
	"fmt"

	"github.com/memolock/memolock/internal/l1"
)

// readHits fills in the items that the L1 or Redis holds, and hands the
// places of the others to onMissing, a node at a time, as each node's read
// answers. Ids whose node is down, or cannot be read, go the way of Get,
// which reports errors as Get does (at once during an outage, or computing
// under FailOpen). If ctx ends first, the ids still unread get the error.
// Everything runs on the caller's goroutine but the reads themselves, and
// the search for each id's node, which may wait on go-redis.
func (e *Engine) readHits(ctx context.Context, items []Item, onMissing func([]int)) {
	wanted := make([]int, 0, len(items))
	for i := range items {
		it := &items[i]
		if it.Err != nil {
			continue
		}
		if a, ok := e.fromL1(it.ID, it.Key); ok {
			it.Value, it.Served, it.Err = a.val, a.served, a.err
			continue
		}
		wanted = append(wanted, i)
	}
	if len(wanted) == 0 {
		return
	}
	if ctx.Done() == nil && e.single != nil {
		e.readInline(ctx, items, wanted, onMissing)
		return
	}
	// One answer per node, handed over as it comes: stop releases the
	// senders left when ctx ends first.
	reads, stop := make(chan nodeRead), make(chan struct{})
	defer close(stop)
	if !e.flights.admit(&e.work) {
		for _, i := range wanted {
			items[i].Err = ErrClosed
		}
		return
	}
	go func() {
		defer e.work.done()
		e.readNodes(ctx, items, wanted, nodeReads{reads, stop})
	}()
	read := make([]bool, len(items)) // places whose node answered
	for answered := 0; answered < len(wanted); {
		select {
		case r := <-reads:
			for _, i := range r.places {
				if !read[i] {
					read[i] = true
					answered++
				}
			}
			if missing := e.takeRead(items, r); len(missing) > 0 {
				onMissing(missing)
			}
		case <-ctx.Done():
			e.timedOut(ctx, items, wanted, read)
			return
		}
	}
}

// readInline is readHits on one node for a caller without a deadline or
// cancellation, who has nothing to leave early for: the read runs on the
// caller's goroutine, which spares two goroutine hand-overs.
func (e *Engine) readInline(ctx context.Context, items []Item, wanted []int, onMissing func([]int)) {
	if !e.flights.admit(&e.work) {
		for _, i := range wanted {
			items[i].Err = ErrClosed
		}
		return
	}
	defer e.work.done()
	r := nodeRead{places: wanted, missing: true}
	if n, err := e.nodes.check(ctx, items[wanted[0]].Key); err == nil {
		r = e.readNode(ctx, n, items, wanted)
	}
	if missing := e.takeRead(items, r); len(missing) > 0 {
		onMissing(missing)
	}
}

// readNodes groups the wanted items by the node that owns them, reads each
// node's on a goroutine of its own, and sends every node's read to reads.
// Items whose node is down or cannot be found are sent as missing.
func (e *Engine) readNodes(ctx context.Context, items []Item, wanted []int, reads nodeReads) {
	byNode := map[*node][]int{}
	var lost []int
	for _, i := range wanted {
		n, err := e.nodes.check(ctx, items[i].Key)
		if err != nil {
			lost = append(lost, i)
			continue
		}
		byNode[n] = append(byNode[n], i)
	}
	if len(lost) > 0 {
		reads.send(nodeRead{places: lost, missing: true})
	}
	for n, places := range byNode {
		if !e.flights.admit(&e.work) {
			reads.send(nodeRead{places: places, err: ErrClosed})
			continue
		}
		go func() {
			defer e.work.done()
			reads.send(e.readNode(ctx, n, items, places))
		}()
	}
}

// nodeReads carries the nodes' answers to readHits, until it stops
// listening.
type nodeReads struct {
	c    chan<- nodeRead
	stop <-chan struct{}
}

func (r nodeReads) send(nr nodeRead) {
	select {
	case r.c <- nr:
	case <-r.stop:
	}
}

// nodeRead is one node's answer to a GetMany read.
type nodeRead struct {
	n       *node
	places  []int // in items
	vals    []any // per place: string, nil (missing) or error
	locks   []any // per place, with StaleTTL: the lock
	snaps   []l1.Snap
	missing bool // nothing was read: every place is missing
	err     error
}

// timedOut fails with ctx's error every wanted item whose node has not
// answered (the others are answered, or pursued).
func (e *Engine) timedOut(ctx context.Context, items []Item, wanted []int, read []bool) {
	err := fmt.Errorf("%w: %w", ErrTimeout, ctx.Err())
	for _, i := range wanted {
		if !read[i] {
			items[i].Err = err
		}
	}
}

// readNode reads the values (and, with StaleTTL, the locks) of the items at
// places, all owned by n, in one round trip.
func (e *Engine) readNode(ctx context.Context, n *node, items []Item, places []int) nodeRead {
	r := nodeRead{n: n, places: places}
	keys := make([]string, 0, 2*len(places))
	for _, i := range places {
		keys = append(keys, e.keys.Value(items[i].Key))
	}
	if e.cfg.StaleTTL > 0 {
		// The locks too, in the same round trip: a value put back stale
		// has a lock that says so (see wire.ResurrectSrc).
		for _, i := range places {
			keys = append(keys, e.keys.Lock(items[i].Key))
		}
	}
	if e.l1 != nil {
		r.snaps = make([]l1.Snap, len(places))
		for j, i := range places {
			r.snaps[j] = e.snap(n, items[i].Key) // before the read, on the node read
		}
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(e.lifetime, cancel) // Close ends the read
	defer stop()
	vals, err := e.readValues(ctx, n, keys)
	if err != nil {
		n.down.report(err)
		r.err = err
		return r
	}
	r.vals, r.locks = vals[:len(places)], vals[len(places):]
	return r
}
