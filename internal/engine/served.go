package engine

import "errors"

// Served tells how a call was answered; package memolock documents the
// values under the same names.
type Served uint8

const (
	ServedRedis Served = iota + 1
	ServedL1
	ServedComputed
	ServedWaited
	ServedStale
	// servedMiss is how Lookup answers when nothing is cached; servedKinds
	// bounds the Served values that the answer counters keep.
	servedMiss
	servedKinds
)

// String names s in metrics and spans.
func (s Served) String() string {
	switch s {
	case ServedRedis:
		return "redis"
	case ServedL1:
		return "l1"
	case ServedComputed:
		return "computed"
	case ServedWaited:
		return "waited"
	case ServedStale:
		return "stale"
	case servedMiss:
		return "miss"
	}
	return "none"
}

// outcome is what a call got: a value, "not found", an error, or (Lookup's
// miss) nothing.
type outcome uint8

const (
	gotValue outcome = iota
	gotNotFound
	gotError
	gotNothing
	outcomes
)

var outcomeLabels = [outcomes]string{"value", "not_found", "error", "none"}

// outcomeOf classifies an answer. An error is served by nobody, whatever the
// flight had reached: fetch failures, holder failures and outages have
// counters of their own.
func outcomeOf(served Served, err error) (Served, outcome) {
	o := gotValue
	switch {
	case err == nil:
	case errors.Is(err, ErrNotFound):
		o = gotNotFound
	case errors.Is(err, ErrMiss):
		served, o = servedMiss, gotNothing
	default:
		served, o = 0, gotError
	}
	if served >= servedKinds {
		served = 0
	}
	return served, o
}
