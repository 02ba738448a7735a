//go:build !unix

package memolock

import "time"

// processCPU reports false: getrusage is a unix call.
func processCPU() (time.Duration, bool) { return 0, false }
