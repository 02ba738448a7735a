package engine

import (
	"sync"
	"time"
)

// work counts work under way that Close waits for, as a sync.WaitGroup
// does, but can be waited for with a bound and without a goroutine of its
// own, so that nothing outlives Close.
type work struct {
	mu sync.Mutex
	n  int
	// zero is closed when n drops to zero. idle makes it, while n is not
	// zero, for whoever waits: work that comes and goes with nobody
	// waiting (a hot key's flights, one after another) makes no channel.
	zero chan struct{}
}

func (w *work) add() {
	w.mu.Lock()
	w.n++
	w.mu.Unlock()
}

func (w *work) done() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.n--; w.n == 0 && w.zero != nil {
		close(w.zero)
		w.zero = nil
	}
}

// idle returns a channel closed once no work is under way.
func (w *work) idle() <-chan struct{} {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.n == 0 {
		return closedChan
	}
	if w.zero == nil {
		w.zero = make(chan struct{})
	}
	return w.zero
}

// wait waits until no work is under way, or d has passed (d < 0: no bound).
// It reports whether the work ended.
func (w *work) wait(d time.Duration) bool {
	idle := w.idle()
	if d < 0 {
		<-idle
		return true
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-idle:
		return true
	case <-t.C:
		return false
	}
}

var closedChan = func() chan struct{} {
	c := make(chan struct{})
	close(c)
	return c
}()
