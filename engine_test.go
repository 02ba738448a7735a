package memolock

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.uber.org/goleak"

	"github.com/memolock/memolock/internal/redistest"
)

// Tests of the flight engine's defects (issue 13). They use only the public
// API, so that they keep compiling while the engine is rewritten, and every
// wait is bounded: several of the defects hang a caller or Close, and the
// test must report that, not hang itself.

// engineClient is a Client on a go-redis client of its own, as a separate
// process would have. Its cleanup bounds Close: a hung Close is reported,
// not waited for.
type engineClient struct {
	*Client
	rdb     *redis.Client
	lookups *acquireLookups
	hung    atomic.Bool // a Close was found hung already: reported once
}

func newEngineClient(t *testing.T, addr, tag string, opts *Options) *engineClient {
	t.Helper()
	return newEngineClientOn(t, &redis.Options{Addr: addr}, tag, opts)
}

func newEngineClientOn(t *testing.T, o *redis.Options, tag string, opts *Options) *engineClient {
	t.Helper()
	rdb := redis.NewClient(o)
	c, err := New(rdb, tag, opts)
	if err != nil {
		t.Fatal(err)
	}
	ec := &engineClient{Client: c, rdb: rdb, lookups: &acquireLookups{n: make(map[string]int)}}
	rdb.AddHook(ec.lookups)
	t.Cleanup(func() {
		if !ec.hung.Load() && !ec.closes(5*time.Second) {
			t.Errorf("Close of a %q client (test cleanup) did not return within 5s", tag)
		}
		_ = rdb.Close()
	})
	return ec
}

// closes calls Close on a goroutine and reports whether it returned within d.
func (c *engineClient) closes(d time.Duration) bool {
	done := make(chan struct{})
	go func() {
		_ = c.Close()
		close(done)
	}()
	select {
	case <-done:
		return true
	case <-time.After(d):
		c.hung.Store(true)
		return false
	}
}

// answer is what a call returned.
type answer struct {
	val []byte
	err error
}

// getIn runs Get with a context that ends after d, in the background.
func (c *engineClient) getIn(d time.Duration, id string, fetch FetchFunc) <-chan answer {
	out := make(chan answer, 1)
	go func() {
		ctx, cancel := context.WithTimeout(bg(), d)
		defer cancel()
		v, err := c.Get(ctx, id, fetch)
		out <- answer{v, err}
	}()
	return out
}

// await returns what ch yields within d, and false if nothing came.
func await(ch <-chan answer, d time.Duration) (answer, bool) {
	select {
	case a := <-ch:
		return a, true
	case <-time.After(d):
		return answer{}, false
	}
}

// signalled waits up to d for ch, and ends the test if it does not come.
func signalled(t *testing.T, ch <-chan struct{}, d time.Duration, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(d):
		t.Fatalf("timed out after %v waiting for %s", d, what)
	}
}

// subscribed waits until n connections subscribe to ch on the server: a
// message published then reaches them.
func subscribed(t *testing.T, raw *redis.Client, ch string, n int64) {
	t.Helper()
	eventually(t, 5*time.Second, fmt.Sprintf("%d subscribers of %s", n, ch), func() bool {
		return raw.PubSubNumSub(bg(), ch).Val()[ch] >= n
	})
}

// live waits until the client's flight for id waits with a live
// subscription: a waiter looks its key up once, then again once its
// subscription is live (README, "re-reads its key once a marker PING comes
// back"). An event published after that reaches it; one published before
// may cross its second lookup.
func (c *engineClient) live(t *testing.T, id string) {
	t.Helper()
	key := c.Keys().Value(id)
	eventually(t, 5*time.Second, "a live wait on "+key, func() bool { return c.lookups.of(key) >= 2 })
}

// acquireLookups counts, by value key, the lookups that a go-redis client
// made: the acquire script, whose four keys start with the value's.
type acquireLookups struct {
	mu sync.Mutex
	n  map[string]int
}

func (l *acquireLookups) record(cmd redis.Cmder, err error) {
	if err == nil {
		err = cmd.Err() // go-redis sets a single command's error once its hooks return
	}
	args := cmd.Args()
	if err != nil || len(args) < 4 || (cmd.Name() != "evalsha" && cmd.Name() != "eval") || fmt.Sprint(args[2]) != "4" {
		return
	}
	if key, ok := args[3].(string); ok {
		l.mu.Lock()
		l.n[key]++
		l.mu.Unlock()
	}
}

func (l *acquireLookups) of(key string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.n[key]
}

func (l *acquireLookups) DialHook(next redis.DialHook) redis.DialHook { return next }
func (l *acquireLookups) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		l.record(cmd, err)
		return err
	}
}
func (l *acquireLookups) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		for _, cmd := range cmds {
			l.record(cmd, nil)
		}
		return err
	}
}

// mustNotRun is a fetch for a client that must only wait.
func mustNotRun(calls *atomic.Int64) FetchFunc {
	return func(context.Context, *Lease) ([]byte, time.Duration, error) {
		calls.Add(1)
		return []byte("computed by the waiter"), time.Minute, nil
	}
}

// Defect 1. A batch function that calls runtime.Goexit must fail every id of
// its batch at once, release every lock with a failure event, leave no
// flight behind for later Gets to join, and let Close return.
func TestGetMany_BatchGoexitFailsEveryMember(t *testing.T) {
	b := miniBackend(t)
	opts := &Options{LockTTL: 30 * time.Second} // a lock that lapses would hide the missing failure event
	holder := newEngineClient(t, b.addr, "bgx", opts)
	waiter := newEngineClient(t, b.addr, "bgx", opts)
	ids := []string{"x", "y"}

	inBatch, goexit := make(chan struct{}), make(chan struct{})
	var once sync.Once
	batch := func(ctx context.Context, got []string) (map[string]BatchValue, error) {
		once.Do(func() { close(inBatch) })
		select {
		case <-goexit:
		case <-time.After(10 * time.Second):
		}
		runtime.Goexit() // as t.FailNow in a test's batch function would
		return nil, nil
	}
	many := make(chan []Item, 1)
	go func() {
		ctx, cancel := context.WithTimeout(bg(), 6*time.Second)
		defer cancel()
		items, err := holder.GetMany(ctx, ids, nil, &ManyOptions{Batch: batch})
		if err != nil {
			t.Errorf("GetMany = %v", err)
		}
		many <- items
	}()
	signalled(t, inBatch, 5*time.Second, "the batch function to run")

	// Another process waits on every lock of the batch.
	var waiterFetches atomic.Int64
	waits := make([]<-chan answer, len(ids))
	for i, id := range ids {
		waits[i] = waiter.getIn(5*time.Second, id, mustNotRun(&waiterFetches))
	}
	for _, id := range ids {
		waiter.live(t, id)
	}
	t0 := time.Now()
	close(goexit)

	select {
	case items := <-many:
		for _, it := range items {
			if it.Err == nil || errors.Is(it.Err, ErrTimeout) {
				t.Errorf("GetMany item %s: %q, %v after %v; want an error at once, not a wait until the context ends",
					it.ID, it.Value, it.Err, time.Since(t0).Round(time.Millisecond))
			}
		}
	case <-time.After(10 * time.Second):
		t.Errorf("GetMany did not return")
	}
	for i, id := range ids {
		a, ok := await(waits[i], 10*time.Second)
		if !ok || !errors.Is(a.err, ErrHolderFailed) {
			t.Errorf("a waiter elsewhere on %s got %q, %v (returned: %v); want ErrHolderFailed at once: the lock must be released with a failure event", id, a.val, a.err, ok)
		}
	}
	if n := waiterFetches.Load(); n != 0 {
		t.Errorf("the waiter elsewhere computed %d times; the lock must be released with a failure event", n)
	}
	// A later Get of each id starts afresh instead of joining a dead flight.
	for _, id := range ids {
		a, ok := await(holder.getIn(3*time.Second, id, constFetch(new(atomic.Int64), "fresh-"+id, 0)), 5*time.Second)
		if !ok || a.err != nil || string(a.val) != "fresh-"+id {
			t.Errorf("a later Get of %s = %q, %v (returned: %v); want %q", id, a.val, a.err, ok, "fresh-"+id)
		}
	}
	if !holder.closes(5 * time.Second) {
		t.Errorf("Close did not return within 5s after the batch function called runtime.Goexit")
	}
}

// Defect 2. A start function that calls runtime.Goexit must fail its caller
// at once, release the lock with a failure event, and leave nothing for
// Close to wait for.
func TestGetExternal_StartGoexitFailsTheCallerAndReleasesTheLock(t *testing.T) {
	b := miniBackend(t)
	opts := &Options{LockTTL: 30 * time.Second}
	holder := newEngineClient(t, b.addr, "sgx", opts)
	waiter := newEngineClient(t, b.addr, "sgx", opts)

	inStart, goexit := make(chan struct{}), make(chan struct{})
	start := func(context.Context, *Lease) error {
		close(inStart)
		select {
		case <-goexit:
		case <-time.After(10 * time.Second):
		}
		runtime.Goexit()
		return nil
	}
	external := make(chan answer, 1)
	go func() {
		ctx, cancel := context.WithTimeout(bg(), 6*time.Second)
		defer cancel()
		v, err := holder.GetExternal(ctx, "k", start)
		external <- answer{v, err}
	}()
	signalled(t, inStart, 5*time.Second, "start to run")
	var waiterFetches atomic.Int64
	wait := waiter.getIn(5*time.Second, "k", mustNotRun(&waiterFetches))
	waiter.live(t, "k")
	t0 := time.Now()
	close(goexit)

	a, ok := await(external, 10*time.Second)
	if !ok || a.err == nil || errors.Is(a.err, ErrTimeout) {
		t.Errorf("GetExternal = %q, %v after %v (returned: %v); want an error at once, not a wait until the context ends",
			a.val, a.err, time.Since(t0).Round(time.Millisecond), ok)
	}
	w, ok := await(wait, 10*time.Second)
	if !ok || !errors.Is(w.err, ErrHolderFailed) {
		t.Errorf("a waiter elsewhere got %q, %v (returned: %v); want ErrHolderFailed at once: the lock must be released with a failure event", w.val, w.err, ok)
	}
	if n := waiterFetches.Load(); n != 0 {
		t.Errorf("the waiter elsewhere computed %d times; the lock must be released with a failure event", n)
	}
	later, ok := await(holder.getIn(3*time.Second, "k", constFetch(new(atomic.Int64), "fresh", 0)), 5*time.Second)
	if !ok || later.err != nil || string(later.val) != "fresh" {
		t.Errorf("a later Get = %q, %v (returned: %v); want \"fresh\": the flight of the dead start must be gone", later.val, later.err, ok)
	}
	if !holder.closes(5 * time.Second) {
		t.Errorf("Close did not return within 5s after start called runtime.Goexit")
	}
}

// Defect 3. An OnWait that calls runtime.Goexit must not strand its flight:
// the callers get an answer (the value, or an error) well before their
// deadline, a later Get of the id works, and Close returns.
func TestGet_OnWaitGoexitDoesNotStrandTheFlight(t *testing.T) {
	b := miniBackend(t)
	raw := rawClient(t, b.addr)
	inOnWait := make(chan struct{}, 1)
	c := newEngineClient(t, b.addr, "owx", &Options{LockTTL: 30 * time.Second, OnWait: func(string, string) {
		select {
		case inOnWait <- struct{}{}:
		default:
		}
		runtime.Goexit()
	}})
	keys := c.Keys()
	raw.Set(bg(), keys.Lock("k"), "someone", time.Minute)

	first := c.getIn(6*time.Second, "k", mustNotRun(new(atomic.Int64)))
	signalled(t, inOnWait, 5*time.Second, "OnWait")
	// The holder stores its value and publishes it, as the store script does.
	raw.Set(bg(), keys.Value("k"), "v", time.Minute)
	raw.Set(bg(), keys.Lock("k"), "done:someone", time.Second)
	raw.Publish(bg(), keys.Notif("k"), "v")

	a, answered := await(first, 3*time.Second)
	switch {
	case !answered:
		t.Errorf("Get still waits 3s after the holder stored and published its value: its flight is stranded")
	case errors.Is(a.err, ErrTimeout):
		t.Errorf("Get = %v; want the value or an error, not a wait until the context ends", a.err)
	case a.err == nil && string(a.val) != "v":
		t.Errorf("Get = %q, want \"v\"", a.val)
	}
	// Joins the first flight if it is still there.
	later, ok := await(c.getIn(2*time.Second, "k", mustNotRun(new(atomic.Int64))), 5*time.Second)
	if !ok || later.err != nil || string(later.val) != "v" {
		t.Errorf("a later Get = %q, %v (returned: %v); want \"v\", stored in Redis", later.val, later.err, ok)
	}
	if !answered {
		a, ok := await(first, 10*time.Second)
		t.Logf("the first Get finally returned %q, %v (returned: %v)", a.val, a.err, ok)
	}
	if !c.closes(5 * time.Second) {
		t.Errorf("Close did not return within 5s after OnWait called runtime.Goexit")
	}
}

// Defect 5. Close of client B called inside client A's fetch waits for B's
// running fetch to return, as it does when called from outside any
// callback: only a Close called from inside one of B's own callbacks can
// not wait for them.
func TestClose_InsideAnotherClientsFetchWaitsForItsFetches(t *testing.T) {
	b := miniBackend(t)
	a := newEngineClient(t, b.addr, "cfa", nil)
	other := newEngineClient(t, b.addr, "cfb", nil)

	started, cancelled, letGo := make(chan struct{}), make(chan struct{}), make(chan struct{})
	var returned atomic.Bool
	otherGet := other.getIn(20*time.Second, "b", func(ctx context.Context, _ *Lease) ([]byte, time.Duration, error) {
		close(started)
		<-ctx.Done() // Close cancelled it
		close(cancelled)
		select {
		case <-letGo:
		case <-time.After(10 * time.Second):
		}
		returned.Store(true)
		return nil, 0, ctx.Err()
	})
	signalled(t, started, 5*time.Second, "B's fetch to start")

	closedWith := make(chan bool, 1) // whether B's fetch had returned when B.Close did
	aGet := a.getIn(20*time.Second, "a", func(context.Context, *Lease) ([]byte, time.Duration, error) {
		_ = other.Close()
		closedWith <- returned.Load()
		return []byte("a"), time.Minute, nil
	})
	signalled(t, cancelled, 5*time.Second, "B.Close to cancel B's fetch")
	// B's fetch holds on until B.Close has had a second to return too
	// early; a B.Close that waits, as it must, is still waiting then.
	select {
	case fetchDone := <-closedWith:
		t.Errorf("B.Close, called inside A's fetch, returned while B's fetch was still running (B's fetch had returned: %v)", fetchDone)
		close(letGo)
	case <-time.After(time.Second):
		close(letGo)
		select {
		case fetchDone := <-closedWith:
			if !fetchDone {
				t.Errorf("B.Close returned before B's fetch did")
			}
		case <-time.After(5 * time.Second):
			t.Errorf("B.Close did not return within 5s of B's fetch returning")
		}
	}
	if r, ok := await(aGet, 10*time.Second); !ok || r.err != nil {
		t.Errorf("A's Get = %q, %v (returned: %v)", r.val, r.err, ok)
	}
	if r, ok := await(otherGet, 10*time.Second); !ok || !errors.Is(r.err, ErrClosed) {
		t.Errorf("B's Get = %q, %v (returned: %v); want ErrClosed", r.val, r.err, ok)
	}
}

// Defect 8. A Ring routes each key by itself, while the scripts need the
// keys of one id on one server: New refuses it, saying why.
func TestNew_RefusesRing(t *testing.T) {
	one, two := miniBackend(t), miniBackend(t)
	ring := redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"one": one.addr, "two": two.addr}})
	defer ring.Close()
	c, err := New(ring, "ring", nil)
	if err == nil {
		_ = c.Close()
		t.Fatal("New accepted a *redis.Ring, whose shards would hold an id's value and lock apart")
	}
	if !errors.Is(err, ErrInvalid) || !strings.Contains(strings.ToLower(err.Error()), "ring") {
		t.Errorf("New(*redis.Ring) = %v; want an error wrapping ErrInvalid that names the Ring", err)
	}
}

// Suspected a. A value published while the flight computes (here under
// FailOpen, after a wait whose watch is still open) must not end the
// flight's hold on its fetch: Close still cancels that fetch and returns.
func TestGet_ValuePublishedWhileComputingLeavesTheFetchToClose(t *testing.T) {
	b := miniBackend(t)
	raw := rawClient(t, b.addr)
	faults := &redistest.Faults{}
	// No retries: the lookup whose reply is lost fails, as an outage.
	c := newEngineClientOn(t, &redis.Options{Addr: b.addr, Dialer: faults.Dial(b.addr), MaxRetries: -1},
		"vwc", &Options{FailOpen: true, LockTTL: 30 * time.Second})
	keys := c.Keys()
	raw.Set(bg(), keys.Lock("k"), "someone", time.Minute)

	computing, cancelled := make(chan struct{}), make(chan struct{})
	got := c.getIn(10*time.Second, "k", func(ctx context.Context, lease *Lease) ([]byte, time.Duration, error) {
		close(computing)
		select {
		case <-ctx.Done():
			close(cancelled)
			return nil, 0, ctx.Err()
		case <-time.After(15 * time.Second):
			return []byte("computed"), time.Minute, nil
		}
	})
	c.live(t, "k")
	// The holder gives up; the client looks again, loses the reply, and
	// computes on its own (FailOpen), its watch still open.
	faults.DropReply(keys.Value("k"))
	raw.Publish(bg(), keys.Events("k"), abandonText("someone"))
	signalled(t, computing, 5*time.Second, "fetch to run under FailOpen")
	raw.Publish(bg(), keys.Notif("k"), "published")
	// Today the value ends the flight at once. A flight that waits for its
	// fetch instead answers at Close.
	await(got, time.Second)
	if !c.closes(5 * time.Second) {
		t.Errorf("Close did not return within 5s: a value published while fetch ran dropped the flight, and Close no longer cancels its fetch")
	}
	select {
	case <-cancelled:
	default:
		t.Errorf("Close returned without cancelling the running fetch")
	}
}

// abandonText is the event a holder publishes when it gives up its lock
// (interop/PROTOCOL.md).
func abandonText(token string) string { return "abandon\n" + token + "\n" }

// Suspected b. One lost reply to a renewal must not cost a live holder its
// lease, even with a LockTTL under go-redis's ReadTimeout (3s): nobody else
// computes while the holder's fetch runs.
func TestLease_SurvivesOneLostRenewalReply(t *testing.T) {
	b := realBackend(t)
	const lockTTL = time.Second
	faults := &redistest.Faults{}
	keys, err := NewKeyScheme("lrr")
	if err != nil {
		t.Fatal(err)
	}
	lock := keys.Lock("k")
	// A renewal is the only script of one key, the lock.
	renewal := "$1\r\n1\r\n$" + strconv.Itoa(len(lock)) + "\r\n" + lock + "\r\n"
	lost := &loseOneReply{faults: faults, match: []byte(strings.ToLower(renewal)), ended: make(chan struct{})}
	faults.SwallowReplies(renewal)
	holder := newEngineClientOn(t, &redis.Options{Addr: b.addr, Dialer: lost.dial(b.addr)}, "lrr", &Options{LockTTL: lockTTL})
	waiter := newEngineClient(t, b.addr, "lrr", &Options{LockTTL: lockTTL})
	raw := rawClient(t, b.addr)

	tokens := make(chan string, 1)
	release := make(chan struct{})
	held := holder.getIn(30*time.Second, "k", func(ctx context.Context, lease *Lease) ([]byte, time.Duration, error) {
		tokens <- lease.Token()
		select {
		case <-release:
		case <-ctx.Done():
		}
		return []byte("holder's"), time.Minute, nil
	})
	var token string
	select {
	case token = <-tokens:
	case <-time.After(5 * time.Second):
		t.Fatal("the holder's fetch did not start")
	}
	var waiterFetches atomic.Int64
	waited := waiter.getIn(30*time.Second, "k", mustNotRun(&waiterFetches))
	signalled(t, lost.ended, 15*time.Second, "the renewal whose reply is lost to time out")
	if v := raw.Get(bg(), lock).Val(); v != token {
		t.Errorf("once the lost renewal timed out, the lock holds %q; want the live holder's token %q", v, token)
	}
	if n := waiterFetches.Load(); n != 0 {
		t.Errorf("a waiter elsewhere computed while the holder's fetch ran: one lost renewal reply lost the lease")
	}
	close(release)
	if a, ok := await(held, 10*time.Second); !ok || string(a.val) != "holder's" {
		t.Errorf("the holder's Get = %q, %v (returned: %v)", a.val, a.err, ok)
	}
	if a, ok := await(waited, 10*time.Second); !ok || string(a.val) != "holder's" {
		t.Errorf("the waiter's Get = %q, %v (returned: %v); want the holder's value", a.val, a.err, ok)
	}
}

// loseOneReply dials through a redistest.Faults that swallows the replies
// of commands matching match, and turns that off after the first such
// command: one reply is lost, on one connection. ended is closed once that
// connection's read has failed (go-redis's ReadTimeout).
type loseOneReply struct {
	faults *redistest.Faults
	match  []byte // lower case
	once   sync.Once
	ended  chan struct{}
}

func (l *loseOneReply) dial(addr string) func(ctx context.Context, network, _ string) (net.Conn, error) {
	dial := l.faults.Dial(addr)
	return func(ctx context.Context, network, a string) (net.Conn, error) {
		c, err := dial(ctx, network, a)
		if err != nil {
			return nil, err
		}
		return &loseOneConn{Conn: c, l: l}, nil
	}
}

type loseOneConn struct {
	net.Conn
	l      *loseOneReply
	silent atomic.Bool
}

func (c *loseOneConn) Write(b []byte) (int, error) {
	n, err := c.Conn.Write(b)
	if bytes.Contains(bytes.ToLower(b), c.l.match) {
		c.l.once.Do(func() {
			c.l.faults.SwallowReplies("") // this connection stays silent; the next ones answer
			c.silent.Store(true)
		})
	}
	return n, err
}

func (c *loseOneConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	if err != nil && c.silent.CompareAndSwap(true, false) {
		close(c.l.ended)
	}
	return n, err
}

// blockingProcessor is a span processor whose OnStart blocks, for spans
// started under a context that carries blockSpanKey, until release is
// closed. reached is closed when one blocks.
type blockingProcessor struct {
	reached, release chan struct{}
	once             sync.Once
}

type blockSpanKey struct{}

func (p *blockingProcessor) OnStart(parent context.Context, _ sdktrace.ReadWriteSpan) {
	if parent.Value(blockSpanKey{}) == nil {
		return
	}
	p.once.Do(func() { close(p.reached) })
	select {
	case <-p.release:
	case <-time.After(10 * time.Second):
	}
}
func (p *blockingProcessor) OnEnd(sdktrace.ReadOnlySpan)      {}
func (p *blockingProcessor) Shutdown(context.Context) error   { return nil }
func (p *blockingProcessor) ForceFlush(context.Context) error { return nil }

// Suspected c. User code (a span processor) runs when a Get starts its
// span: it must not run under a lock that every other call of the client
// needs.
func TestGet_SpanProcessorDoesNotHoldUpOtherIDs(t *testing.T) {
	b := miniBackend(t)
	p := &blockingProcessor{reached: make(chan struct{}), release: make(chan struct{})}
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(p))
	defer func() { _ = tp.Shutdown(bg()) }()
	c := newEngineClient(t, b.addr, "spb", &Options{TracerProvider: tp})
	defer func() {
		select {
		case <-p.release:
		default:
			close(p.release)
		}
	}()

	slow := make(chan answer, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.WithValue(bg(), blockSpanKey{}, true), 10*time.Second)
		defer cancel()
		v, err := c.Get(ctx, "slow", constFetch(new(atomic.Int64), "s", 0))
		slow <- answer{v, err}
	}()
	signalled(t, p.reached, 5*time.Second, "the span processor to block")

	if a, ok := await(c.getIn(5*time.Second, "other", constFetch(new(atomic.Int64), "o", 0)), 3*time.Second); !ok || string(a.val) != "o" {
		t.Errorf("a Get of another id = %q, %v (returned: %v) while a span processor blocked in OnStart; want \"o\" at once: user code runs under the flight group's lock", a.val, a.err, ok)
	}
	stats := make(chan Stats, 1)
	go func() { stats <- c.Stats() }()
	select {
	case <-stats:
	case <-time.After(3 * time.Second):
		t.Errorf("Stats did not return while a span processor blocked in OnStart: a processor that calls Stats deadlocks")
	}
	close(p.release)
	if a, ok := await(slow, 10*time.Second); !ok || string(a.val) != "s" {
		t.Errorf("the traced Get = %q, %v (returned: %v)", a.val, a.err, ok)
	}
}

// Suspected e. A value published by an earlier holder while start runs
// (GetExternal) may answer the callers, but the lock just taken for the
// external work stays taken: it is not deleted with an abandon event while
// that work runs. Each round is a coin toss today (a select between two
// ready cases), so the test plays several at once.
func TestGetExternal_LateValueDuringStartKeepsTheLock(t *testing.T) {
	b := miniBackend(t)
	raw := rawClient(t, b.addr)
	c := newEngineClient(t, b.addr, "lvs", &Options{LockTTL: 30 * time.Second})
	keys := c.Keys()
	const rounds = 16
	var wg sync.WaitGroup
	for i := range rounds {
		id := fmt.Sprint("k", i)
		raw.Set(bg(), keys.Lock(id), "someone", time.Minute)
		wg.Add(1)
		go func() {
			defer wg.Done()
			lateValueDuringStart(t, c, raw, id)
		}()
	}
	wg.Wait()
}

func lateValueDuringStart(t *testing.T, c *engineClient, raw *redis.Client, id string) {
	keys := c.Keys()
	tokens := make(chan string, 1)
	release := make(chan struct{})
	external := make(chan answer, 1)
	go func() {
		ctx, cancel := context.WithTimeout(bg(), 10*time.Second)
		defer cancel()
		v, err := c.GetExternal(ctx, id, func(_ context.Context, lease *Lease) error {
			tokens <- lease.Token()
			select {
			case <-release:
			case <-time.After(10 * time.Second):
			}
			return nil
		})
		external <- answer{v, err}
	}()
	ctx, cancel := context.WithTimeout(bg(), 5*time.Second)
	defer cancel()
	for raw.PubSubNumSub(ctx, keys.Events(id)).Val()[keys.Events(id)] < 1 {
		if ctx.Err() != nil {
			t.Errorf("%s: the client did not subscribe to wait", id)
			close(release)
			return
		}
		time.Sleep(2 * time.Millisecond)
	}
	// The earlier holder gives the lock up; the client takes it and starts.
	raw.Del(bg(), keys.Lock(id))
	raw.Publish(bg(), keys.Events(id), abandonText("someone"))
	var token string
	select {
	case token = <-tokens:
	case <-time.After(5 * time.Second):
		t.Errorf("%s: start was not called", id)
		close(release)
		return
	}
	// The earlier holder's work finishes late, while start runs.
	raw.Set(bg(), keys.Value(id), "late", time.Minute)
	raw.Publish(bg(), keys.Notif(id), "late")
	a, answered := await(external, time.Second) // at once today; after start, for a flight that ignores it meanwhile
	close(release)
	if !answered {
		a, answered = await(external, 5*time.Second)
	}
	if !answered || a.err != nil || string(a.val) != "late" {
		t.Errorf("%s: GetExternal = %q, %v (returned: %v); want \"late\"", id, a.val, a.err, answered)
	}
	// The lock is the client's as long as the work may run, or left done
	// once the value is in; it is not deleted.
	lock := raw.Get(bg(), keys.Lock(id)).Val()
	for deadline := time.Now().Add(2 * time.Second); lock == token && time.Now().Before(deadline); {
		time.Sleep(5 * time.Millisecond)
		lock = raw.Get(bg(), keys.Lock(id)).Val()
	}
	if lock != token && lock != "done:"+token {
		t.Errorf("%s: the lock taken for the external work holds %q once the late value came; want %q or %q", id, lock, token, "done:"+token)
	}
}

// Suspected f. GetMany on a plain client with HashTags, in front of a
// cluster node, reads its hits without a multi-key command across slots,
// which a cluster refuses.
func TestGetMany_HashTagsOnAPlainClientReadsWithoutCrossSlot(t *testing.T) {
	srv := redistest.Start(t, "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf")
	srv.Do(t, "CLUSTER", "ADDSLOTSRANGE", "0", "16383")
	eventually(t, 10*time.Second, "the one-node cluster to be ok", func() bool {
		info, _ := srv.Do(t, "CLUSTER", "INFO").(string)
		return strings.Contains(info, "cluster_state:ok")
	})
	c := newEngineClient(t, srv.Addr, "htp", &Options{HashTags: true})
	refused := &refusedCommands{}
	c.rdb.AddHook(refused)
	ids := []string{"a", "b", "c", "d"}
	for _, id := range ids {
		if err := c.Set(bg(), id, []byte("v-"+id), time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	for range 2 { // every call, not only the first
		items, err := c.GetMany(bg(), ids, func(context.Context, string, *Lease) ([]byte, time.Duration, error) {
			return nil, 0, errors.New("stored already: fetch must not run")
		}, nil)
		if err != nil {
			t.Fatal(err)
		}
		for _, it := range items {
			if it.Err != nil || string(it.Value) != "v-"+it.ID || it.Served != ServedRedis {
				t.Errorf("item %s = %q, %v, %v; want %q from Redis", it.ID, it.Value, it.Served, it.Err, "v-"+it.ID)
			}
		}
	}
	if got := refused.list(); len(got) > 0 {
		t.Errorf("Redis refused %d commands of GetMany: %s", len(got), strings.Join(got, "; "))
	}
}

// refusedCommands records the commands that Redis answered with a
// CROSSSLOT error.
type refusedCommands struct {
	mu   sync.Mutex
	cmds []string
}

// record records cmd if err, or else its own error, is a CROSSSLOT one
// (go-redis sets a single command's error only once its hooks return).
func (r *refusedCommands) record(cmd redis.Cmder, err error) {
	if err == nil {
		err = cmd.Err()
	}
	if err != nil && strings.Contains(err.Error(), "CROSSSLOT") {
		r.mu.Lock()
		r.cmds = append(r.cmds, cmd.Name()+": "+err.Error())
		r.mu.Unlock()
	}
}

func (r *refusedCommands) list() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.cmds...)
}

func (r *refusedCommands) DialHook(next redis.DialHook) redis.DialHook { return next }
func (r *refusedCommands) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		r.record(cmd, err)
		return err
	}
}
func (r *refusedCommands) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		for _, cmd := range cmds {
			r.record(cmd, nil)
		}
		return err
	}
}

// Suspected g. A fetch that fails for a reason of its own while Close runs
// (its error does not wrap the cancellation) is a failure like any other:
// waiters elsewhere get ErrHolderFailed, and do not compute again.
func TestClose_FetchErrorOfItsOwnStillFailsWaitersElsewhere(t *testing.T) {
	b := miniBackend(t)
	opts := &Options{LockTTL: 30 * time.Second}
	holder := newEngineClient(t, b.addr, "fec", opts)
	waiter := newEngineClient(t, b.addr, "fec", opts)

	started := make(chan struct{})
	holder.getIn(10*time.Second, "k", func(ctx context.Context, _ *Lease) ([]byte, time.Duration, error) {
		close(started)
		<-ctx.Done()
		return nil, 0, errors.New("inventory service answered 503")
	})
	signalled(t, started, 5*time.Second, "the holder's fetch to start")
	var waiterFetches atomic.Int64
	wait := waiter.getIn(5*time.Second, "k", mustNotRun(&waiterFetches))
	waiter.live(t, "k")
	if !holder.closes(5 * time.Second) {
		t.Fatal("Close did not return")
	}
	a, ok := await(wait, 10*time.Second)
	if !ok || !errors.Is(a.err, ErrHolderFailed) || !strings.Contains(a.err.Error(), "503") {
		t.Errorf("the waiter elsewhere got %q, %v (returned: %v); want ErrHolderFailed with the fetch's error", a.val, a.err, ok)
	}
	if n := waiterFetches.Load(); n != 0 {
		t.Errorf("the waiter elsewhere computed %d times after the holder's fetch failed", n)
	}
}

// Suspected j. FLUSHALL sends an invalidation with no keys ("everything"):
// the L1 drops everything, and the pub/sub connection is not replaced.
func TestL1_FlushAllDropsTheL1WithoutReconnecting(t *testing.T) {
	b := realBackend(t)
	raw := rawClient(t, b.addr)
	c := newEngineClient(t, b.addr, "fla", &Options{L1Size: 100, LockTTL: 30 * time.Second})
	keys := c.Keys()
	fetch := constFetch(new(atomic.Int64), "v", 0)
	eventually(t, 5*time.Second, "the value to be served from the L1", func() bool {
		r, err := c.GetResult(bg(), "k", fetch)
		return err == nil && r.Served == ServedL1
	})
	before := c.Stats().Reconnects
	if err := raw.FlushAll(bg()).Err(); err != nil { // a server of this test's own
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "the L1 to drop the flushed value", func() bool {
		_, err := c.Lookup(bg(), "k")
		return errors.Is(err, ErrMiss)
	})
	// A wait that subscribes now goes out after any replacement that the
	// flush caused: once it has its value, Reconnects counts it.
	raw.Set(bg(), keys.Lock("w"), "someone", time.Minute)
	waited := c.getIn(5*time.Second, "w", mustNotRun(new(atomic.Int64)))
	subscribed(t, raw, keys.Notif("w"), 1)
	raw.Set(bg(), keys.Value("w"), "w-value", time.Minute)
	raw.Publish(bg(), keys.Notif("w"), "w-value")
	if a, ok := await(waited, 10*time.Second); !ok || string(a.val) != "w-value" {
		t.Fatalf("the waiter got %q, %v (returned: %v)", a.val, a.err, ok)
	}
	if n := c.Stats().Reconnects - before; n != 0 {
		t.Errorf("FLUSHALL made the client replace its pub/sub connection %d times; want 0", n)
	}
}

// Suspected h. Once Close has returned, no goroutine that the client started
// is left but calls blocked in go-redis, even when Redis stopped answering in
// the middle of a call, and those end by go-redis's own timeouts: here a
// server that accepts and never answers, behind a go-redis client whose
// timeouts end every call within 3s (go-redis's default ReadTimeout, no
// retries), later than Close's own bound of about a second. (Before, a
// helper goroutine of Close's bounded wait was left too.)
func TestClose_LeavesNoGoroutineBehind(t *testing.T) {
	addr := redistest.Silent(t)
	before := goleak.IgnoreCurrent()
	rdb := redis.NewClient(&redis.Options{Addr: addr, Protocol: 2, DialTimeout: time.Second,
		ReadTimeout: 3 * time.Second, WriteTimeout: 3 * time.Second, MaxRetries: -1})
	t.Cleanup(func() { _ = rdb.Close() })
	c, err := New(rdb, "lgb", nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(bg(), 300*time.Millisecond)
	defer cancel()
	if _, err := c.Get(ctx, "k", constFetch(new(atomic.Int64), "v", 0)); !errors.Is(err, ErrTimeout) {
		t.Fatalf("Get = %v; want ErrTimeout from a server that never answers", err)
	}
	closed := make(chan struct{})
	go func() {
		_ = c.Close()
		close(closed)
	}()
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Fatal("Close did not return within 10s")
	}
	// Close returns in about a second whatever Redis does: what may be
	// left is a call blocked in go-redis, which ends by go-redis's own
	// timeouts, and nothing else.
	if err := goleak.Find(before, goleak.IgnoreAnyFunction("github.com/redis/go-redis/v9.(*baseClient).withConn")); err != nil {
		t.Errorf("goroutines outlive Close, not blocked in go-redis:\n%s", goroutineOrigins(err))
	}
	deadline := time.Now().Add(10 * time.Second)
	for err := goleak.Find(before); err != nil; err = goleak.Find(before) {
		if time.Now().After(deadline) {
			t.Errorf("goroutines outlive go-redis's own timeouts:\n%s", goroutineOrigins(err))
			break
		}
	}
}

// goroutineOrigins cuts goleak's report down to each goroutine's first
// line and the function that started it.
func goroutineOrigins(err error) string {
	var out []string
	for _, line := range strings.Split(err.Error(), "\n") {
		line = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(line), "["))
		if strings.HasPrefix(line, "Goroutine ") || strings.HasPrefix(line, "created by ") {
			out = append(out, line)
		}
	}
	return strings.Join(out, "\n")
}
