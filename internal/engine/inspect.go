package engine

import (
	"context"
	"errors"
	"time"

	"github.com/memolock/memolock/internal/l1"
)

// What the engine's tests, and its callers' tests, may look at: states that
// no public API reports and that a test must wait for.

// L1Live reports whether the L1 can take values now: tracking is live (on
// every master, on a cluster).
func (e *Engine) L1Live() bool {
	switch {
	case e.l1 == nil:
		return false
	case e.single != nil:
		_, live := e.single.Tracking()
		return live
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel()
	return e.router.TrackMasters(ctx) == nil
}

// L1Entry returns the L1's entry for key, and how long it has left.
func (e *Engine) L1Entry(key string) (val []byte, notFound bool, ttl time.Duration, ok bool) {
	if e.l1 == nil {
		return nil, false, 0, false
	}
	val, kind, ttl, ok := e.l1.Entry(key)
	return val, kind == l1.NotFound, ttl, ok
}

// LiveWatches returns how many watches of channel ch are live, on a single
// node.
func (e *Engine) LiveWatches(ch string) int {
	if e.single == nil {
		return 0
	}
	return e.single.LiveWatches(ch)
}

// WaitIdle waits up to d for the work Close waits for (flights, batches,
// probes, user callbacks) to end, and reports whether it did.
func (e *Engine) WaitIdle(d time.Duration) bool {
	deadline := time.Now().Add(d)
	return e.callbacks.pending.wait(d) && e.work.wait(time.Until(deadline))
}

// Unreachable reports whether err is the error of a call refused at once
// because its node is known to be unreachable.
func Unreachable(err error) bool {
	var u *unreachableError
	return errors.As(err, &u)
}

// UnreachableNode returns the address of the node that a call refused at
// once (see Unreachable) was refused for.
func UnreachableNode(err error) (string, bool) {
	var u *unreachableError
	if !errors.As(err, &u) {
		return "", false
	}
	return u.addr, true
}

// L1Refused reports whether Redis refused the L1's tracking on the current
// connection (no CLIENT TRACKING, or an ACL that refuses the invalidation
// channel).
func (e *Engine) L1Refused() bool {
	if e.l1 == nil || e.single == nil {
		return false
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Millisecond)
	defer cancel()
	err := e.single.WaitTracking(ctx)
	return err != nil && ctx.Err() == nil
}

// AnswerCounts returns the answers counted so far, by "served/result" (as
// the memolock.gets counter's attributes name them: "redis/value",
// "none/error", ...), and in all.
func (e *Engine) AnswerCounts() (map[string]int64, int64) {
	counts := map[string]int64{}
	var total int64
	for s := range servedKinds {
		for o := range outcomes {
			if n := e.stats.answers[s][o].Load(); n != 0 {
				counts[s.String()+"/"+outcomeLabels[o]] = n
				total += n
			}
		}
	}
	return counts, total
}
