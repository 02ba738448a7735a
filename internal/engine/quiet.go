package engine

import (
	"sync"
	"time"
)

// quietEvery is the least time between two log lines of one kind that may
// come once per id: those between are counted in the next line.
const quietEvery = 10 * time.Second

// A quiet log line is written at most once per quietEvery; it reports how
// many of its kind were not written since the last one.
type quiet struct {
	mu      sync.Mutex
	last    time.Time
	skipped int
}

// allow reports whether a line may be written now, and how many were not
// since the last one.
func (q *quiet) allow() (bool, int) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if !q.last.IsZero() && time.Since(q.last) < quietEvery {
		q.skipped++
		return false, 0
	}
	n := q.skipped
	q.last, q.skipped = time.Now(), 0
	return true, n
}
