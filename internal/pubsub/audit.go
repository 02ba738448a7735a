package pubsub

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// A move (a failover, a migrated slot) or a redirected lookup is followed
// by audits of where the Router's subscribers are. After a failover,
// go-redis's slot map may still name the old master for a while, and a
// watch placed by that map lands on a node that is now a replica. The
// replica takes the SSUBSCRIBE, and hears nothing: on redis-server 7.0.15,
// an old master subscribed right after a CLUSTER FAILOVER heard none of
// 1,200 SPUBLISHes that the new master sent over the next 7 s. A value
// published then never reaches the waiter, which waits until the holder's
// lock would expire (seen under load in the cluster fault suite: every
// caller of an id waited out its 20 s deadline). An audit reloads the
// slot map (ForEachMaster reloads it before it answers) and retires the
// subscriber of every node that is no longer a master: its watches move,
// and their waiters look again and watch where the map now says.
//
// An event asks for an audit auditSoon after it, and another auditLater
// after it, when the slot map is sure to have settled; events that come
// while audits are due move the first earlier and the last later. Moves
// come in bursts (every watch of a failed-over master at once), so events
// are taken at most once per eventEvery.
const (
	auditSoon  = 250 * time.Millisecond
	auditLater = 2 * time.Second
	eventEvery = 50 * time.Millisecond
)

// audit is the state of the audits of a Router, guarded by its mu but
// for lastEvent.
type audit struct {
	lastEvent atomic.Int64  // Unix ns of the last event taken
	running   bool          // the audit goroutine runs
	next      time.Time     // the next audit is due then
	last      time.Time     // and the last one then
	poke      chan struct{} // next moved earlier (capacity 1)
	ctx       context.Context
	cancel    context.CancelFunc // by Close: an audit under way stops asking
	wg        sync.WaitGroup
}

// scheduleAudit asks for audits after an event: a move or a redirection.
func (r *Router) scheduleAudit() {
	if r.masters == nil {
		return
	}
	now := time.Now()
	if l := r.audits.lastEvent.Load(); now.UnixNano()-l < int64(eventEvery) || !r.audits.lastEvent.CompareAndSwap(l, now.UnixNano()) {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return
	}
	soon, later := now.Add(auditSoon), now.Add(auditLater)
	if later.After(r.audits.last) {
		r.audits.last = later
	}
	if r.audits.running {
		if soon.Before(r.audits.next) {
			r.audits.next = soon
			select {
			case r.audits.poke <- struct{}{}:
			default:
			}
		}
		return
	}
	if r.audits.ctx == nil {
		r.audits.ctx, r.audits.cancel = context.WithCancel(context.Background())
		r.audits.poke = make(chan struct{}, 1)
	}
	r.audits.next = soon
	r.audits.running = true
	r.audits.wg.Add(1)
	go r.runAudits()
}

// runAudits audits when audits are due, until none is.
func (r *Router) runAudits() {
	defer r.audits.wg.Done()
	ctx := r.audits.ctx
	for {
		r.mu.Lock()
		if r.closed {
			r.audits.running = false
			r.mu.Unlock()
			return
		}
		wait := time.Until(r.audits.next)
		r.mu.Unlock()
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			continue // closed: the loop ends above
		case <-r.audits.poke:
			t.Stop()
			continue // an earlier audit is due
		case <-t.C:
		}
		r.auditNodes(ctx)
		r.mu.Lock()
		now := time.Now()
		if r.audits.last.After(now) {
			r.audits.next = r.audits.last
		} else {
			r.audits.running = false
			r.mu.Unlock()
			return
		}
		r.mu.Unlock()
	}
}

// auditNodes retires the subscribers of the nodes that are not masters
// any more: those that the slot map, reloaded now, does not name as
// masters, and that say so themselves. The map may come from a node that
// is not up to date (an old master frozen past its failover answers with
// its old view): a node is retired only if it answers ROLE as a replica,
// so a healthy master is never retired on the word of another.
func (r *Router) auditNodes(ctx context.Context) {
	var mu sync.Mutex
	masters := make(map[string]bool)
	err := r.masters(ctx, func(_ context.Context, node *redis.Client) error {
		mu.Lock()
		defer mu.Unlock()
		masters[node.Options().Addr] = true
		return nil
	})
	if err != nil || len(masters) == 0 {
		return
	}
	r.mu.Lock()
	var doubtful []routed
	for addr, n := range r.nodes {
		if !masters[addr] {
			doubtful = append(doubtful, n)
		}
	}
	r.mu.Unlock()
	for _, n := range doubtful {
		if ctx.Err() != nil || !r.isReplica(ctx, n.client) {
			continue
		}
		r.mu.Lock()
		if !r.closed && r.nodes[n.client.Options().Addr] == n {
			delete(r.nodes, n.client.Options().Addr)
			r.retiring.Add(1)
			go func() {
				defer r.retiring.Done()
				n.sub.retire(callTimeout)
			}()
		}
		r.mu.Unlock()
	}
}

// isReplica reports whether node answers ROLE as a replica. A node that
// does not answer is left to its subscriber, whose connection fails.
func (r *Router) isReplica(ctx context.Context, node *redis.Client) bool {
	if r.role != nil {
		return r.role(ctx, node)
	}
	role, err := node.Do(ctx, "ROLE").Slice()
	return err == nil && len(role) > 0 && role[0] == "slave"
}
