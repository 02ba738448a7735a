package memolock

import (
	"errors"
	"sync/atomic"
)

// counters are a Client's live statistics: cheap atomics, safe to read at any time.
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
	stale         atomic.Int64
	refreshes     atomic.Int64

	subscribes   atomic.Int64
	unsubscribes atomic.Int64
	pings        atomic.Int64
	reconnects   atomic.Int64

	// calls counts the answers given to callers (Get and its variants,
	// Lookup, each GetMany item) by how they were served and what they
	// were: the OpenTelemetry gets counter, and Stats.L1Hits.
	calls [servedKinds][outcomes]atomic.Int64
	// waiting is the number of flights parked on another holder's lock.
	waiting atomic.Int64
}

// outcome is what a call got: a value, "not found", or an error.
type outcome uint8

const (
	gotValue outcome = iota
	gotNotFound
	gotError
	gotNothing // Lookup's miss
	outcomes
)

// servedMiss is how Lookup answers when neither the L1 nor Redis holds
// the value; servedKinds bounds Served values in counters.calls.
const (
	servedMiss  = ServedStale + 1
	servedKinds = servedMiss + 1
)

// count records one answer to a caller.
func (s *counters) count(served Served, err error) {
	served, o := outcomeOf(served, err)
	s.calls[served][o].Add(1)
}

// outcomeOf classifies an answer: Lookup's miss is served as servedMiss.
func outcomeOf(served Served, err error) (Served, outcome) {
	o := gotValue
	switch {
	case err == nil:
	case errors.Is(err, ErrNotFound):
		o = gotNotFound
	case errors.Is(err, ErrMiss):
		served, o = servedMiss, gotNothing
	default:
		// An error was served by nobody, whatever the flight had
		// reached: fetch failures, holder failures and outages have
		// counters of their own.
		served, o = 0, gotError
	}
	if served >= servedKinds {
		served = 0
	}
	return served, o
}

// Stats is a copy of what a Client has done since it was created, returned by
// Client.Stats.
type Stats struct {
	Gets          int64 // calls to Get and its variants
	Hits          int64 // flights answered by a value already in Redis
	L1Hits        int64 // calls answered by the L1 (Options.L1Size)
	Coalesced     int64 // callers that joined a flight already running in this process
	Fetches       int64 // fetch functions run by this process
	FetchErrors   int64 // fetches that returned an error or panicked
	FetchPanics   int64 // fetches that panicked; also counted in FetchErrors
	FetchTimeouts int64 // fetches that ran past their time limit (Options.FetchTimeout); also counted in FetchErrors
	Waits         int64 // flights that waited for another holder
	Wakeups       int64 // flights answered by a pub/sub notification
	Takeovers     int64 // locks taken after the previous holder's lock expired
	HolderFails   int64 // errors received from a failed holder in another process
	LeaseLost     int64 // fetched values not stored because the lock was lost
	StoreErrors   int64 // fetched values not stored because Redis failed
	FailOpen      int64 // fetches run without a lock because Redis failed (Options.FailOpen)
	Batched       int64 // lookups sent in one pipeline with others, under load
	Outages       int64 // times Redis was found unreachable; each ends when a probe PING is answered
	NotFound      int64 // flights answered "not found" (Options.NegTTL), computed here, cached or received
	Stale         int64 // answers served stale (Options.StaleTTL): per flight, and per caller that gave up waiting
	Refreshes     int64 // values refreshed ahead of expiry by this process (Options.RefreshAhead)

	Subscribes   int64 // SUBSCRIBE commands sent
	Unsubscribes int64 // UNSUBSCRIBE commands sent
	Pings        int64 // marker and probe PINGs sent on the pub/sub connection
	Reconnects   int64 // pub/sub connections replaced after an error
}

func (s *counters) snapshot() Stats {
	return Stats{
		Hits:          s.hits.Load(),
		L1Hits:        s.calls[ServedL1][gotValue].Load() + s.calls[ServedL1][gotNotFound].Load(),
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
		Stale:         s.stale.Load(),
		Refreshes:     s.refreshes.Load(),
		Subscribes:    s.subscribes.Load(),
		Unsubscribes:  s.unsubscribes.Load(),
		Pings:         s.pings.Load(),
		Reconnects:    s.reconnects.Load(),
	}
}

// PubSubCommands is the number of commands sent on the pub/sub connection.
func (s Stats) PubSubCommands() int64 {
	return s.Subscribes + s.Unsubscribes + s.Pings
}
