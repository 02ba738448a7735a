package memolock

// Stats is a copy of what a Client has done since it was created, returned by
// Client.Stats.
type Stats struct {
	Gets          int64 // answers given to callers: Get and its variants (L1 hits included), Lookup, each distinct GetMany id; the memolock.gets counter counts the same
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
	// L1Refusals counts the connections on which Redis refused the L1's
	// tracking (CLIENT TRACKING refused, or the invalidation channel, as an
	// ACL user without it is): the L1 stays empty until a connection
	// tracks. Each refusal is logged too. See Options.L1Wait.
	L1Refusals int64
}

// PubSubCommands is the number of commands sent on the pub/sub connection.
func (s Stats) PubSubCommands() int64 {
	return s.Subscribes + s.Unsubscribes + s.Pings
}
