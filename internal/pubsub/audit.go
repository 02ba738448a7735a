package pubsub

import (
	"context"
	"sync"
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
// The audits run auditDelays after the event that started them, and
// again after the last delay for as long as such events keep coming.
var auditDelays = []time.Duration{250 * time.Millisecond, 2 * time.Second}

// audit is the state of the audits of a Router, guarded by its mu.
type audit struct {
	running bool          // an audit goroutine is running
	again   bool          // a move came while it ran: one more round
	stop    chan struct{} // closed by Close
	wg      sync.WaitGroup
}

// scheduleAudit starts the audits, unless they run already, in which case
// they go on for one more round.
func (r *Router) scheduleAudit() {
	if r.masters == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return
	}
	if r.audits.running {
		r.audits.again = true
		return
	}
	if r.audits.stop == nil {
		r.audits.stop = make(chan struct{})
	}
	r.audits.running = true
	r.audits.wg.Add(1)
	go r.runAudits(r.audits.stop)
}

// runAudits audits after each of auditDelays, then once more after the
// last one for each move that came meanwhile.
func (r *Router) runAudits(stop <-chan struct{}) {
	defer r.audits.wg.Done()
	for round := 0; ; round++ {
		t := time.NewTimer(auditDelays[min(round, len(auditDelays)-1)])
		select {
		case <-stop:
			t.Stop()
			return
		case <-t.C:
		}
		r.auditNodes()
		r.mu.Lock()
		more := round < len(auditDelays)-1 || r.audits.again
		r.audits.again = false
		if !more || r.closed {
			r.audits.running = false
			r.mu.Unlock()
			return
		}
		r.mu.Unlock()
	}
}

// auditNodes retires the subscribers of the nodes that the cluster, asked
// now, does not name as masters. If it cannot be asked, nothing changes.
func (r *Router) auditNodes() {
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
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
	defer r.mu.Unlock()
	if r.closed {
		return
	}
	for addr, n := range r.nodes {
		if masters[addr] {
			continue
		}
		delete(r.nodes, addr)
		r.retiring.Add(1)
		go func() {
			defer r.retiring.Done()
			n.sub.retire(callTimeout)
		}()
	}
}
