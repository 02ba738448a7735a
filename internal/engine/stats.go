package engine

import (
	"sync/atomic"

	"github.com/memolock/memolock/internal/pubsub"
)

// counters are an engine's live statistics: cheap atomics, safe to read at
// any time. Each is written where the thing it counts happens.
type counters struct {
	hits          atomic.Int64
	fetches       atomic.Int64
	fetchErrors   atomic.Int64
	fetchPanics   atomic.Int64
	fetchOther    atomic.Int64 // fetch errors neither panics nor time-outs
	fetchTimeouts atomic.Int64
	waits         atomic.Int64
	wakeups       atomic.Int64
	takeovers     atomic.Int64
	holderFails   atomic.Int64
	leaseLost     atomic.Int64
	storeErrors   atomic.Int64
	failOpen      atomic.Int64
	batched       atomic.Int64
	outages       atomic.Int64
	notFound      atomic.Int64
	servedStale   atomic.Int64
	refreshes     atomic.Int64
	pubsub        pubsub.Stats

	// answers counts the answers given to callers (Get and its variants,
	// Lookup, each GetMany id) by how they were served and what they were.
	answers [servedKinds][outcomes]atomic.Int64
	// waiting is the number of flights parked on another holder's lock.
	waiting atomic.Int64
}

// answered records one answer to a caller.
func (s *counters) answered(served Served, err error) {
	served, o := outcomeOf(served, err)
	s.answers[served][o].Add(1)
}

// Stats is what the engine has done; package memolock documents each field.
type Stats struct {
	Gets          int64
	Hits          int64
	L1Hits        int64
	Coalesced     int64
	Fetches       int64
	FetchErrors   int64
	FetchPanics   int64
	FetchTimeouts int64
	Waits         int64
	Wakeups       int64
	Takeovers     int64
	HolderFails   int64
	LeaseLost     int64
	StoreErrors   int64
	FailOpen      int64
	Batched       int64
	Outages       int64
	NotFound      int64
	Stale         int64
	Refreshes     int64

	Subscribes   int64
	Unsubscribes int64
	Pings        int64
	Reconnects   int64
	L1Refusals   int64
}

func (s *counters) snapshot() Stats {
	var gets int64
	for served := range servedKinds {
		for o := range outcomes {
			gets += s.answers[served][o].Load()
		}
	}
	return Stats{
		Gets:          gets,
		Hits:          s.hits.Load(),
		L1Hits:        s.answers[ServedL1][gotValue].Load() + s.answers[ServedL1][gotNotFound].Load(),
		Fetches:       s.fetches.Load(),
		FetchErrors:   s.fetchErrors.Load(),
		FetchPanics:   s.fetchPanics.Load(),
		FetchTimeouts: s.fetchTimeouts.Load(),
		Waits:         s.waits.Load(),
		Wakeups:       s.wakeups.Load(),
		Takeovers:     s.takeovers.Load(),
		HolderFails:   s.holderFails.Load(),
		LeaseLost:     s.leaseLost.Load(),
		StoreErrors:   s.storeErrors.Load(),
		FailOpen:      s.failOpen.Load(),
		Batched:       s.batched.Load(),
		Outages:       s.outages.Load(),
		NotFound:      s.notFound.Load(),
		Stale:         s.servedStale.Load(),
		Refreshes:     s.refreshes.Load(),
		Subscribes:    s.pubsub.Subscribes.Load(),
		Unsubscribes:  s.pubsub.Unsubscribes.Load(),
		Pings:         s.pubsub.Pings.Load(),
		Reconnects:    s.pubsub.Reconnects.Load(),
		L1Refusals:    s.pubsub.TrackingRefusals.Load(),
	}
}
