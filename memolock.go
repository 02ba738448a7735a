// Package memolock computes a value once across processes and shares it
// through Redis: the caller that wins a lock runs fetch, and every other
// caller, in any process, waits for the value it publishes.
//
// It speaks the key scheme of the original redis-memolock (see KeyScheme and
// interop/PROTOCOL.md), so Go, C# and Python peers can share values.
//
// Within one process, concurrent calls for one id share a single flight, the
// way x/sync/singleflight does: N goroutines cost what one costs. Across
// processes, the flight that misses runs one script that returns the value or
// takes the lock. The winner runs fetch while a watchdog renews its lock, then
// one more script stores the value, deletes the lock and publishes the value,
// but only if the lock still holds its token. Everyone else subscribes to
// the value's channel and waits, without polling, until the value arrives,
// the holder reports a failure, or the holder's lock expires, at which point
// a waiter takes over.
package memolock

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// FetchFunc computes a value on a miss. It returns the value, how long Redis
// keeps it (0 keeps it forever), and an error.
//
// ctx carries the values of the first caller's context but not its deadline:
// fetch serves every caller of the flight, and waiters in other processes
// too. ctx is cancelled when the Client is closed.
//
// lease is the lock that fetch holds. The Client renews it while fetch runs;
// fetch may check it or extend it. lease is nil when Options.FailOpen runs
// fetch without a lock.
type FetchFunc func(ctx context.Context, lease *Lease) (value []byte, ttl time.Duration, err error)

// StartFunc starts work that another program finishes: that program SETs
// the value and PUBLISHes it on the value's channel (see KeyScheme). Used
// with GetExternal. The lease is not renewed automatically; StartFunc, or the
// program through Lease.Token, may extend it.
type StartFunc func(ctx context.Context, lease *Lease) error

// Options configure a Client. A nil *Options means all defaults.
type Options struct {
	// LockTTL is how long a lock lives when nobody renews it: how long
	// waiters wait for a holder that died before they take over. While fetch
	// runs, the lock is renewed every LockTTL/3. Redis gets it in whole
	// milliseconds. Default is 10 seconds; anything under 1ms is rejected.
	LockTTL time.Duration

	// FailOpen makes Get run fetch locally, without a lock and without
	// storing the value, when Redis cannot be reached. Callers in this
	// process still share one fetch, but every process computes on its own,
	// so an outage turns into a stampede on whatever fetch calls. By default
	// (false) Get returns an error wrapping ErrRedis instead.
	FailOpen bool

	// HashIDs replaces every id by its SHA-256 in hex (see HashID) before it
	// reaches Redis, which bounds key length at 64 bytes plus the tag. Peers
	// must hash the same way to share values.
	HashIDs bool

	// OnWait, if set, is called when a flight starts waiting for a lock held
	// by somebody else, with the id and the holder's token. It runs on the
	// flight's goroutine: keep it quick.
	OnWait func(id, holder string)
}

// DefaultLockTTL is the lock TTL used when Options.LockTTL is zero.
const DefaultLockTTL = 10 * time.Second

// A Client computes values of one tag once across processes. It is safe for
// concurrent use. Once it first waits for a value, a Client holds one pub/sub
// connection, made from the redis client's options, and one goroutine that
// reads it; once lookups first overlap, it keeps a few goroutines (one per
// CPU, 2 to 8) that send overlapping lookups as pipelines. Close stops them.
type Client struct {
	rdb      redis.UniversalClient
	keys     KeyScheme
	lockTTL  time.Duration
	failOpen bool
	hashIDs  bool
	onWait   func(id, holder string)

	sub     *subscriber
	batch   *batcher
	stats   counters
	closing chan struct{} // closed when Close starts
	closed  chan struct{} // closed when Close has finished
	wg      sync.WaitGroup

	mu        sync.Mutex
	isClosed  bool
	flights   map[string]*flight
	gets      int64 // counted here rather than in stats: the lock is held anyway
	coalesced int64
}

// A flight is one process's pursuit of one value; its callers share it.
type flight struct {
	id    string // as sent to Redis
	fetch FetchFunc
	start StartFunc          // external-producer mode when set
	ctx   context.Context    // set when the flight leaves the caller's goroutine
	stop  context.CancelFunc // cancels ctx; guarded by Client.mu
	done  chan struct{}
	val   []byte
	err   error

	// Guarded by Client.mu.
	refs      int
	holding   bool // runs fetch under our lock: outlives its callers
	abandoned bool // every caller left before it held the lock
	finished  bool // done is closed
}

// New returns a Client for the values of tag, stored through rdb. It makes
// no connection itself: the first Get uses rdb, and the pub/sub connection
// is made when the client first waits for a value.
func New(rdb redis.UniversalClient, tag string, opts *Options) (*Client, error) {
	if rdb == nil || isNilPointer(rdb) {
		return nil, fmt.Errorf("%w: redis client is nil", ErrInvalid)
	}
	keys, err := NewKeyScheme(tag)
	if err != nil {
		return nil, err
	}
	if opts == nil {
		opts = &Options{}
	}
	lockTTL := opts.LockTTL
	switch {
	case lockTTL == 0:
		lockTTL = DefaultLockTTL
	case lockTTL < time.Millisecond:
		return nil, fmt.Errorf("%w: LockTTL %v is under 1ms; Redis locks are set in whole milliseconds", ErrInvalid, lockTTL)
	}
	c := &Client{
		rdb:      rdb,
		keys:     keys,
		lockTTL:  lockTTL.Truncate(time.Millisecond),
		failOpen: opts.FailOpen,
		hashIDs:  opts.HashIDs,
		onWait:   opts.OnWait,
		closing:  make(chan struct{}),
		closed:   make(chan struct{}),
		flights:  make(map[string]*flight),
	}
	c.sub = newSubscriber(rdb, &c.stats)
	c.batch = newBatcher(rdb, &c.stats)
	return c, nil
}

func isNilPointer(v any) bool {
	rv := reflect.ValueOf(v)
	return rv.Kind() == reflect.Pointer && rv.IsNil()
}

// Keys returns the client's key scheme.
func (c *Client) Keys() KeyScheme { return c.keys }

// Stats returns a copy of the client's counters.
func (c *Client) Stats() Stats {
	s := c.stats.snapshot()
	c.mu.Lock()
	s.Gets, s.Coalesced = c.gets, c.coalesced
	c.mu.Unlock()
	return s
}

// Get returns the value of id. If Redis holds it, that is the answer.
// Otherwise exactly one caller across all processes, the lock winner, runs
// fetch and stores its value, and every other caller waits for it.
//
// Concurrent calls for one id in this process share one flight and get the
// same slice, which callers must not modify. If ctx ends first, Get returns
// at once with an error matching both ErrTimeout and ctx.Err(); the flight
// goes on for the other callers.
//
// If fetch fails or panics, the lock is released, the callers of this flight
// get the error (a panic wraps ErrFetchPanicked), waiters in other processes
// get an error wrapping ErrHolderFailed within milliseconds, and nothing is
// stored. If the lock was lost while fetch ran, the value is returned but not
// stored. If storing fails, the value is returned and waiters elsewhere take
// over when the lock expires.
func (c *Client) Get(ctx context.Context, id string, fetch FetchFunc) ([]byte, error) {
	if fetch == nil {
		return nil, fmt.Errorf("%w: fetch is nil", ErrInvalid)
	}
	return c.get(ctx, id, fetch, nil)
}

// GetExternal is Get for values that another program produces: the lock
// winner calls start, which starts the work elsewhere, and then waits like
// everybody else for the value to be SET and PUBLISHed on KeyScheme.Notif.
// If the lock expires first, the next caller starts the work again. This is
// the original redis-memolock's GetResourceExternal.
func (c *Client) GetExternal(ctx context.Context, id string, start StartFunc) ([]byte, error) {
	if start == nil {
		return nil, fmt.Errorf("%w: start is nil", ErrInvalid)
	}
	return c.get(ctx, id, nil, start)
}

// errNilClient answers calls on a nil *Client.
var errNilClient = fmt.Errorf("%w: memolock client is nil; make one with New", ErrInvalid)

func (c *Client) get(ctx context.Context, id string, fetch FetchFunc, start StartFunc) ([]byte, error) {
	if c == nil {
		return nil, errNilClient
	}
	if ctx == nil {
		return nil, fmt.Errorf("%w: context is nil", ErrInvalid)
	}
	key := id
	if c.hashIDs {
		key = HashID(id)
	}

	c.mu.Lock()
	c.gets++
	if c.isClosed {
		c.mu.Unlock()
		return nil, ErrClosed
	}
	if f := c.flights[key]; f != nil && !f.abandoned {
		f.refs++
		c.coalesced++
		c.mu.Unlock()
		return c.await(ctx, f)
	}
	f := &flight{id: key, fetch: fetch, start: start, done: make(chan struct{}), refs: 1}
	c.flights[key] = f
	c.wg.Add(1)
	c.mu.Unlock()

	// The first attempt runs on the caller's goroutine, so a hit costs no
	// goroutine. Anything longer continues on a goroutine of its own, which
	// the other callers can share and this caller can leave.
	r, err := c.acquire(ctx, f.id)
	if err == nil && r.kind == replyHit {
		c.stats.hits.Add(1)
		c.finish(f, r.value, nil)
		c.wg.Done()
		return r.value, nil
	}
	retry := err != nil && ctx.Err() != nil // only this caller gave up
	c.mu.Lock()
	f.ctx, f.stop = context.WithCancel(context.WithoutCancel(ctx))
	if c.isClosed {
		f.stop()
	}
	c.mu.Unlock()
	go func() {
		defer c.wg.Done()
		_, _ = c.resolve(f, r, err, retry) // it finishes f
	}()
	return c.await(ctx, f)
}

// await waits for f on behalf of one caller. Close finishes every flight at
// once, so f.done is all there is to wait for besides ctx.
func (c *Client) await(ctx context.Context, f *flight) ([]byte, error) {
	cancelled := ctx.Done()
	if cancelled == nil {
		<-f.done // a plain receive: many callers on a hot key contend less
		return f.val, f.err
	}
	select {
	case <-f.done:
		return f.val, f.err
	case <-cancelled:
		c.leave(f)
		return nil, fmt.Errorf("%w: %w", ErrTimeout, ctx.Err())
	}
}

// leave drops one caller. A flight nobody waits for stops, unless it holds
// the lock: then others, perhaps in other processes, wait for its value.
func (c *Client) leave(f *flight) {
	c.mu.Lock()
	defer c.mu.Unlock()
	f.refs--
	if f.refs == 0 && !f.holding && !f.finished {
		f.abandoned = true
		if c.flights[f.id] == f {
			delete(c.flights, f.id)
		}
		f.stop()
	}
}

// finish hands the flight's result to its callers. Only the first call
// counts: Close finishes flights early with ErrClosed.
func (c *Client) finish(f *flight, val []byte, err error) {
	c.mu.Lock()
	if f.finished {
		c.mu.Unlock()
		return
	}
	f.finished = true
	if c.flights[f.id] == f {
		delete(c.flights, f.id)
	}
	if f.stop != nil {
		f.stop()
	}
	c.mu.Unlock()
	f.val, f.err = val, err
	close(f.done)
}

// errAbandoned ends a flight that every caller left; nobody reads it.
var errAbandoned = errors.New("memolock: flight abandoned")

// ended returns the error for a flight whose context is done.
func (c *Client) ended(f *flight) error {
	if c.closingNow() {
		return ErrClosed
	}
	return errAbandoned
}

func (c *Client) closingNow() bool {
	select {
	case <-c.closing:
		return true
	default:
		return false
	}
}

const (
	replyBusy = iota
	replyHit
	replyLocked
)

// reply is what acquireScript answered.
type reply struct {
	kind   int
	value  []byte
	token  string        // ours, when locked
	pttl   time.Duration // the holder's remaining lock time, when busy; <0: none
	holder string        // the holder's token, when busy
}

func (c *Client) acquire(ctx context.Context, id string) (reply, error) {
	token := newToken()
	res, err := c.batch.run(ctx, []string{c.keys.Value(id), c.keys.Lock(id)}, token, c.lockTTL.Milliseconds())
	if err != nil {
		// The script may have run and taken the lock with this token
		// before the error (a deadline during the read): keep it.
		return reply{token: token}, fmt.Errorf("%w: reading %s: %w", ErrRedis, quote(c.keys.Value(id)), err)
	}
	switch res := res.(type) {
	case string:
		return reply{kind: replyHit, value: []byte(res)}, nil
	case int64:
		return reply{kind: replyLocked, token: token}, nil
	case []any:
		if len(res) == 2 {
			pttl, _ := res[0].(int64)
			holder, _ := res[1].(string)
			return reply{kind: replyBusy, pttl: time.Duration(pttl) * time.Millisecond, holder: holder}, nil
		}
	}
	return reply{}, fmt.Errorf("%w: reading %s: unexpected script reply %v", ErrRedis, quote(c.keys.Value(id)), res)
}

// resolve runs a flight to its end and finishes it, starting from the reply of the first
// attempt (or its error; retry means that error was the first caller's own
// cancellation and the attempt must be made again).
func (c *Client) resolve(f *flight, r reply, err error, retry bool) (val []byte, ferr error) {
	var (
		w       *watch
		timer   *time.Timer
		waited  bool
		holder  string
		ownLock string // our token while external work runs under our lock
		release bool   // ownLock must go: the external value arrived
	)
	defer func() {
		if release {
			c.release(f.id, ownLock, "") // before callers look at Redis again
		}
		// Callers next; UNSUBSCRIBE can wait.
		c.finish(f, val, ferr)
		if w != nil {
			c.sub.unwatch(w)
		}
		if timer != nil {
			timer.Stop()
		}
	}()
	// gotValue finishes a flight that got its value while waiting; in
	// external-producer mode our lock is still there and must go.
	gotValue := func(v []byte) ([]byte, error) {
		release = ownLock != ""
		return v, nil
	}

	notif := c.keys.Notif(f.id)
	var unsure string // token of an attempt whose reply was lost
	for {
		if retry {
			if err != nil {
				unsure = r.token
			}
			r, err = c.acquire(f.ctx, f.id)
		}
		retry = true
		if err == nil && r.kind == replyBusy && r.holder != "" && r.holder == unsure {
			// That attempt did take the lock: it is ours.
			r = reply{kind: replyLocked, token: unsure}
		}
		if err != nil {
			if f.ctx.Err() != nil {
				// These attempts may have taken the lock: hand it over.
				for _, tok := range []string{unsure, r.token} {
					if tok != "" {
						c.release(f.id, tok, abandonEvent(tok))
					}
				}
				return nil, c.ended(f)
			}
			if c.failOpen && f.fetch != nil {
				c.stats.failOpen.Add(1)
				return c.compute(f, nil)
			}
			return nil, err
		}

		switch r.kind {
		case replyHit:
			if waited {
				c.stats.wakeups.Add(1)
			} else {
				c.stats.hits.Add(1)
			}
			return gotValue(r.value)

		case replyLocked:
			if waited {
				c.stats.takeovers.Add(1)
			}
			if w != nil {
				c.sub.unwatch(w) // our own value needs no notification
				w = nil
			}
			if f.start == nil {
				return c.hold(f, r.token)
			}
			if err := c.startExternal(f, r.token); err != nil {
				return nil, err
			}
			// Wait for the external producer as for any other holder.
			ownLock = r.token
			r = reply{kind: replyBusy, pttl: c.lockTTL, holder: r.token}
		}

		// Busy: somebody holds the lock. Subscribe, and wait for the value,
		// a failure event, the subscription going live (re-read, as the
		// value may have been published before), or the lock's expiry.
		if r.holder != holder {
			holder = r.holder
			if r.holder != ownLock && c.onWait != nil {
				c.onWait(f.id, r.holder)
			}
		}
		if !waited {
			waited = true
			c.stats.waits.Add(1)
		}
		if w == nil {
			w = c.sub.watch(notif, c.keys.Events(f.id))
		}
		d := r.pttl + time.Millisecond
		if r.pttl < 0 {
			d = c.lockTTL // a lock without expiry, set by somebody else: look again later
		}
		if timer == nil {
			timer = time.NewTimer(d)
		} else {
			timer.Reset(d)
		}

	wait:
		for {
			select {
			case <-w.signal:
				ev := w.take()
				if ev.closed {
					return nil, ErrClosed
				}
				for _, m := range ev.messages {
					if m.Channel == notif {
						c.stats.wakeups.Add(1)
						return gotValue([]byte(m.Payload))
					}
					kind, token, text := parseEvent(m.Payload)
					if token != holder {
						continue
					}
					switch kind {
					case eventFail:
						c.stats.holderFails.Add(1)
						if token == ownLock {
							// Our external producer reported failure itself.
							c.release(f.id, ownLock, "")
						}
						return nil, fmt.Errorf("%w: %s", ErrHolderFailed, text)
					case eventAbandon:
						break wait
					}
				}
				if ev.reread {
					break wait
				}
			case <-timer.C:
				break wait
			case <-f.ctx.Done():
				return nil, c.ended(f)
			}
		}
	}
}

func abandonEvent(token string) string { return eventAbandon + "\n" + token + "\n" }

// failEvent reports err to waiters in other processes: its first line (a
// panic's stack stays local), at most 4096 bytes.
func failEvent(token string, err error) string {
	msg, _, _ := strings.Cut(err.Error(), "\n")
	return eventFail + "\n" + token + "\n" + truncate(msg, 4096)
}

// parseEvent splits an event payload into kind, token and text.
func parseEvent(p string) (kind, token, text string) {
	kind, rest, _ := strings.Cut(p, "\n")
	token, text, _ = strings.Cut(rest, "\n")
	return kind, token, text
}

// hold runs fetch under the lock held with token.
func (c *Client) hold(f *flight, token string) ([]byte, error) {
	c.mu.Lock()
	if f.abandoned || c.isClosed {
		c.mu.Unlock()
		// Somebody elsewhere may already wait on this lock: hand it over.
		c.release(f.id, token, abandonEvent(token))
		return nil, c.ended(f)
	}
	f.holding = true
	c.mu.Unlock()
	return c.compute(f, &Lease{c: c, id: f.id, key: c.keys.Lock(f.id), token: token})
}

type fetchResult struct {
	val []byte
	ttl time.Duration
	err error
}

var errGoexit = errors.New("memolock: fetch called runtime.Goexit")

// compute runs fetch on a goroutine of its own, so that a panic or Goexit in
// fetch becomes an error, while this goroutine renews the lock. With a nil
// lease (fail-open) it only runs fetch.
func (c *Client) compute(f *flight, lease *Lease) ([]byte, error) {
	c.stats.fetches.Add(1)
	results := make(chan fetchResult, 1)
	go func() {
		res := fetchResult{err: errGoexit}
		defer func() {
			if p := recover(); p != nil {
				res = fetchResult{err: fmt.Errorf("%w: %v\n%s", ErrFetchPanicked, p, debug.Stack())}
			}
			results <- res
		}()
		val, ttl, err := f.fetch(f.ctx, lease)
		res = fetchResult{val: val, ttl: ttl, err: err}
	}()

	var renew <-chan time.Time
	if lease != nil {
		t := time.NewTicker(c.lockTTL / 3)
		defer t.Stop()
		renew = t.C
	}
	for {
		select {
		case res := <-results:
			if c.closingNow() {
				// fetch most likely failed because Close cancelled it.
				if lease != nil {
					c.release(f.id, lease.token, abandonEvent(lease.token))
				}
				return nil, ErrClosed
			}
			if res.err == nil && res.ttl < 0 {
				res.err = fmt.Errorf("%w: fetch returned negative TTL %v for id %s", ErrInvalid, res.ttl, quote(f.id))
			}
			if res.err != nil {
				c.stats.fetchErrors.Add(1)
				if lease != nil {
					c.release(f.id, lease.token, failEvent(lease.token, res.err))
				}
				return nil, res.err
			}
			if lease != nil {
				c.store(f.id, lease.token, res.val, res.ttl)
			}
			return res.val, nil
		case <-renew:
			if err := lease.renew(f.ctx, c.lockTTL); err == ErrLeaseLost {
				renew = nil // the store script will refuse; nothing left to renew
			}
		case <-c.closing:
			if lease != nil {
				c.release(f.id, lease.token, abandonEvent(lease.token))
			}
			<-results // Close waits for fetch to see its cancelled context
			return nil, ErrClosed
		}
	}
}

// startExternal runs start under our lock, turning a panic into an error.
func (c *Client) startExternal(f *flight, token string) (err error) {
	lease := &Lease{c: c, id: f.id, key: c.keys.Lock(f.id), token: token}
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("%w: %v\n%s", ErrFetchPanicked, p, debug.Stack())
		}
		if err != nil {
			c.stats.fetchErrors.Add(1)
			c.release(f.id, token, failEvent(token, err))
		}
	}()
	c.stats.fetches.Add(1)
	return f.start(f.ctx, lease)
}

// store writes the value if our lease still holds. Failures are counted, not
// returned: the caller has its value either way.
func (c *Client) store(id, token string, val []byte, ttl time.Duration) {
	ms := "0"
	if ttl > 0 {
		ms = strconv.FormatInt(max(ttl.Milliseconds(), 1), 10)
	}
	n, err := storeScript.Run(context.Background(), c.rdb, []string{c.keys.Value(id), c.keys.Lock(id)},
		token, val, ms, c.keys.Notif(id)).Int()
	switch {
	case err != nil:
		c.stats.storeErrors.Add(1)
	case n == 0:
		c.stats.leaseLost.Add(1)
	}
}

// release deletes our lock and publishes event, if the lock is still ours.
// A failure is harmless: the lock expires by itself.
func (c *Client) release(id, token, event string) {
	_ = releaseScript.Run(context.Background(), c.rdb, []string{c.keys.Lock(id)},
		token, c.keys.Events(id), event).Err()
}

// quote quotes a key or id for an error message, cut to a readable length.
func quote(s string) string {
	if len(s) > 80 {
		return strconv.Quote(s[:80]) + "..."
	}
	return strconv.Quote(s)
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n]
}

// Close releases the locks this client holds, so waiters elsewhere take over
// at once, cancels the context of running fetches and waits for them to
// return, and closes the pub/sub connection. Callers still waiting get
// ErrClosed at once. Close does not close the redis client. It is safe to
// call more than once and concurrently; every call returns when the client
// is closed.
func (c *Client) Close() error {
	if c == nil {
		return errNilClient
	}
	c.mu.Lock()
	if c.isClosed {
		c.mu.Unlock()
		<-c.closed
		return nil
	}
	c.isClosed = true
	close(c.closing)
	flights := make([]*flight, 0, len(c.flights))
	for _, f := range c.flights {
		flights = append(flights, f)
		if f.stop != nil {
			f.stop() // also the context of running fetches
		}
	}
	c.mu.Unlock()
	for _, f := range flights {
		c.finish(f, nil, ErrClosed)
	}
	c.sub.close()
	c.wg.Wait()
	c.batch.close() // after the flights, which may still be reading
	close(c.closed)
	return nil
}
