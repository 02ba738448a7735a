package engine

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/memolock/memolock/internal/l1"
	"github.com/memolock/memolock/internal/wire"
	"github.com/redis/go-redis/v9"
)

// bounded runs fn, a call to Redis, and returns when it does or when ctx
// ends, whichever comes first: go-redis ignores context deadlines on reads
// unless ContextTimeoutEnabled is set, and callers' deadlines must hold. A
// call left behind ends with go-redis's own timeouts; Close cancels its
// context and waits for it, boundedly.
func (e *Engine) bounded(ctx context.Context, fn func(context.Context) error) error {
	fctx, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(e.lifetime, cancel) // Close stops a long Purge
	if ctx.Done() == nil {
		defer stop()
		defer cancel()
		return fn(fctx)
	}
	if !e.flights.admit(&e.work) {
		stop()
		cancel()
		return ErrClosed
	}
	done := make(chan error, 1)
	go func() {
		defer e.work.done()
		defer stop()
		defer cancel()
		done <- fn(fctx)
	}()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return fmt.Errorf("%w: %w", ErrTimeout, ctx.Err())
	}
}

// Delete runs the delete script for key.
func (e *Engine) Delete(ctx context.Context, key string) (bool, error) {
	var deleted bool
	err := e.bounded(ctx, func(ctx context.Context) error {
		if _, err := e.nodes.check(ctx, key); err != nil {
			return err
		}
		return e.throughMigration(ctx, func() (err error) {
			deleted, err = e.proto.Delete(ctx, key)
			return err
		})
	})
	e.forget(key) // whatever happened, as the write may have run
	e.hints.missed(key)
	if err != nil {
		return false, err // deleted may still be written by the call left behind
	}
	return deleted, nil
}

// Set runs the set script for key.
func (e *Engine) Set(ctx context.Context, key string, val []byte, ttl time.Duration) error {
	err := e.bounded(ctx, func(ctx context.Context) error {
		if _, err := e.nodes.check(ctx, key); err != nil {
			return err
		}
		token := wire.NewToken()
		return e.throughMigration(ctx, func() error { return e.proto.Set(ctx, key, token, val, ttl) })
	})
	e.forget(key)
	return err
}

// forget drops key from the L1 at once, for this process's own writes (the
// invalidation Redis sends may come a moment later), and detaches its
// flight, so that this process never hands out a value computed before the
// write.
func (e *Engine) forget(key string) {
	e.flights.detach(key)
	if e.l1 != nil {
		e.l1.Forget(key)
	}
}

// Peek runs the peek script for key.
func (e *Engine) Peek(ctx context.Context, key string) (wire.Peeked, error) {
	pk, _, err := e.peek(ctx, key, false)
	return pk, err
}

// peek runs the peek script for key. For the L1 (forL1), it runs on the
// node that owns key, after a snap of that node's invalidations, which it
// returns; a snap that is not live if the read had to go elsewhere (a
// redirection), whose value must not enter the L1.
func (e *Engine) peek(ctx context.Context, key string, forL1 bool) (wire.Peeked, l1.Snap, error) {
	var pk wire.Peeked
	var snap l1.Snap
	err := e.bounded(ctx, func(ctx context.Context) error {
		n, err := e.nodes.check(ctx, key)
		if err != nil {
			return err
		}
		if forL1 && e.l1 != nil {
			snap = e.snap(n, key)
			if pk, err = e.proto.PeekOn(ctx, n.client, key); err == nil || !slotMoving(err) {
				return err
			}
			snap = l1.Snap{}
		}
		return e.throughMigration(ctx, func() (err error) {
			pk, err = e.proto.Peek(ctx, key)
			return err
		})
	})
	if err != nil {
		return wire.Peeked{}, l1.Snap{}, err // pk and snap may still be written by the call left behind
	}
	return pk, snap, nil
}

// Lookup answers from the L1, then Redis, and never computes or waits.
func (e *Engine) Lookup(ctx context.Context, id, key string) ([]byte, Served, error) {
	val, served, err := e.lookupOnly(ctx, id, key)
	e.stats.answered(served, err)
	return val, served, err
}

func (e *Engine) lookupOnly(ctx context.Context, id, key string) ([]byte, Served, error) {
	if a, ok := e.fromL1(id, key); ok {
		return a.val, a.served, a.err
	}
	pk, snap, err := e.peek(ctx, key, true)
	if err != nil {
		e.nodes.report(ctx, key, err)
		return nil, 0, err
	}
	switch {
	case pk.Found && pk.Resurrected:
		e.stats.servedStale.Add(1)
		if e.l1 != nil {
			e.l1.PutStale(key, pk.Value, pk.TTL, snap)
		}
		return pk.Value, ServedStale, nil
	case pk.Found:
		e.stats.hits.Add(1)
		if e.l1 != nil {
			e.l1.Put(key, pk.Value, e.l1TTL(pk.TTL), snap)
		}
		return pk.Value, ServedRedis, nil
	case pk.NotFound:
		if e.l1 != nil {
			e.l1.PutNotFound(key, pk.NotFoundTTL, snap)
		}
		return nil, ServedRedis, e.notFoundErr(id)
	}
	return nil, 0, fmt.Errorf("%w: id %s", ErrMiss, wire.Quote(id))
}

// purgeBatch is how many keys Purge asks SCAN for, and unlinks, at a time.
const purgeBatch = 500

// Purge removes every key of the tag, on every master of a cluster, and
// reports how many it removed.
func (e *Engine) Purge(ctx context.Context) (int64, error) {
	var n atomic.Int64
	prefixes := []string{e.keys.Value(""), e.keys.Lock(""), e.keys.NotFound(""), e.keys.Stale("")}
	purge := func(ctx context.Context, node redis.Cmdable) error {
		for _, prefix := range prefixes {
			if err := purgeNode(ctx, node, globEscape(prefix)+"*", &n); err != nil {
				return err
			}
		}
		return nil
	}
	err := e.bounded(ctx, func(ctx context.Context) error {
		if e.cfg.Cluster != nil {
			return e.cfg.Cluster.ForEachMaster(ctx, func(ctx context.Context, node *redis.Client) error { return purge(ctx, node) })
		}
		return purge(ctx, e.cfg.Single)
	})
	e.flights.detach("")
	if e.l1 != nil {
		e.l1.Flush()
	}
	if err != nil {
		return n.Load(), fmt.Errorf("%w: purging tag %s: %w", ErrRedis, wire.Quote(e.keys.Tag()), err)
	}
	return n.Load(), nil
}

// purgeNode unlinks the keys matching pattern on one node, adding their
// number to n.
func purgeNode(ctx context.Context, node redis.Cmdable, pattern string, n *atomic.Int64) error {
	var cursor uint64
	for {
		keys, next, err := node.Scan(ctx, cursor, pattern, purgeBatch).Result()
		if err != nil {
			return err
		}
		if len(keys) > 0 {
			// One UNLINK per key, in one pipeline: on a cluster the keys of
			// one node span slots, and a multi-key UNLINK across slots is
			// refused (CROSSSLOT).
			cmds, err := node.Pipelined(ctx, func(p redis.Pipeliner) error {
				for _, k := range keys {
					p.Unlink(ctx, k)
				}
				return nil
			})
			for _, cmd := range cmds {
				if m, ok := cmd.(*redis.IntCmd); ok {
					n.Add(m.Val())
				}
			}
			if err != nil {
				return err
			}
		}
		if next == 0 {
			return nil
		}
		cursor = next
		if err := ctx.Err(); err != nil {
			return err
		}
	}
}

// globEscape escapes the characters that SCAN MATCH patterns treat
// specially.
func globEscape(s string) string {
	var b []byte
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case '*', '?', '[', ']', '\\', '^', '-':
			b = append(b, '\\')
		}
		b = append(b, s[i])
	}
	return string(b)
}

// Down returns the error of the node that owns key while it is down.
func (e *Engine) Down(ctx context.Context, key string) error {
	_, err := e.nodes.check(ctx, key)
	return err
}

// Report reports err from a call about key to the node that owns it.
func (e *Engine) Report(ctx context.Context, key string, err error) {
	e.nodes.report(ctx, key, err)
}
