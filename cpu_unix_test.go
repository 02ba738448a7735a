//go:build unix

package memolock

import (
	"syscall"
	"time"
)

// processCPU is the CPU time this process has used, user and system, and
// true; a benchmark reports it per call (see BenchmarkHotKey).
func processCPU() (time.Duration, bool) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0, false
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), true
}
