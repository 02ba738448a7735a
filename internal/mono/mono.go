// Package mono is the process's monotonic clock as durations since a base,
// for times that are stored in atomics and compared on hot paths: Now reads
// the clock once (time.Since on a monotonic base reads no wall clock).
package mono

import "time"

var base = time.Now()

// Now is the time now.
func Now() time.Duration { return time.Since(base) }

// At is t (which must carry a monotonic reading, as time.Now's does).
func At(t time.Time) time.Duration { return t.Sub(base) }
