package memolock

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/memolock/memolock/internal/redistest"
	"github.com/memolock/memolock/internal/wire"
)

// A caller's deadline holds whatever Redis does, while go-redis ignores
// context deadlines on reads (its default): here Redis stalls for the
// rest of the test, and 64 callers with 200ms deadlines, most of whose
// lookups travel in the batcher's pipelines, all return promptly.
func TestGet_DeadlineHoldsWhileRedisStalls(t *testing.T) {
	srv := redistest.Start(t, "--enable-debug-command", "yes")
	c := stalledClient(t, srv, "stall", func(c *testClient) {
		if _, err := c.Get(bg(), "warm", constFetch(new(atomic.Int64), "w", 0)); err != nil {
			t.Fatal(err)
		}
	})

	var wg sync.WaitGroup
	for i := range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(bg(), 200*time.Millisecond)
			defer cancel()
			t0 := time.Now()
			_, err := c.Get(ctx, fmt.Sprint("k", i%32), noFetch)
			if d := time.Since(t0); d > stalledBound {
				t.Errorf("caller %d returned after %v (deadline 200ms; go-redis would give up after %v)", i, d, stalledReadTimeout)
			}
			if !errors.Is(err, ErrTimeout) || !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("caller %d: %v, want ErrTimeout and DeadlineExceeded", i, err)
			}
		}()
	}
	wg.Wait()
}

// Against a server that accepts connections and never answers, a caller's
// deadline holds, and so does Close. go-redis's read timeout is half a
// minute (as in stalledClient): only memolock can end either within the
// bound.
func TestGet_DeadlineAndCloseHoldAgainstASilentServer(t *testing.T) {
	addr := redistest.Silent(t)
	rdb := redis.NewClient(&redis.Options{Addr: addr, ReadTimeout: stalledReadTimeout, MaxRetries: -1})
	c, err := New(rdb, "silent", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer rdb.Close() // ends the calls go-redis still has blocked, after Close
	ctx, cancel := context.WithTimeout(bg(), 200*time.Millisecond)
	defer cancel()
	t0 := time.Now()
	_, err = c.Get(ctx, "k", noFetch)
	if d := time.Since(t0); d > stalledBound || !errors.Is(err, ErrTimeout) {
		t.Errorf("Get returned %v after %v; want ErrTimeout after 200ms", err, d)
	}
	t0 = time.Now()
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	// Close gives Redis about a second (closeWait) to release what a
	// lookup may have taken.
	if d := time.Since(t0); d > stalledBound {
		t.Errorf("Close took %v", d)
	}
}

// While Redis is down, Get answers at once instead of every caller dialing,
// and a probe notices promptly when Redis is back.
func TestGet_RedisDownFailsFastAndRecovers(t *testing.T) {
	srv := redistest.Start(t)
	c := newTestClient(t, srv.Addr, "down", nil)
	if _, err := c.Get(bg(), "warm", constFetch(new(atomic.Int64), "w", 0)); err != nil {
		t.Fatal(err)
	}
	srv.Kill()
	var calls atomic.Int64
	if _, err := c.Get(bg(), "k", constFetch(&calls, "v", 0)); !errors.Is(err, ErrRedis) {
		t.Fatalf("first Get = %v, want ErrRedis", err)
	}
	// At once: without a command to Redis (the probe's PINGs aside),
	// which counts where a time bound could not tell a quick answer from
	// go-redis's quick refusal on a loaded machine. Nor are the first
	// Get's commands counted: its lookup failed on the flight's first
	// try, the flight's goroutine answered it, and then releases the lock
	// the lookup may have taken, which under load comes while the 20 Gets
	// run (seen under .ci/under-load: the release of id k, with an
	// abandon event).
	releaseOfK := func(cmd redis.Cmder) bool {
		return slices.Contains(cmd.Args(), any("down/lock:k")) && slices.ContainsFunc(cmd.Args(), func(a any) bool {
			s, _ := a.(string)
			return strings.HasPrefix(s, "abandon\n")
		})
	}
	var mu sync.Mutex
	var sent []string
	c.rdb.AddHook(hookEach(func(cmd redis.Cmder) {
		if cmd.Name() != "ping" && !releaseOfK(cmd) {
			mu.Lock()
			sent = append(sent, fmt.Sprint(cmd.Args()))
			mu.Unlock()
		}
	}))
	for i := range 20 {
		_, err := c.Get(bg(), fmt.Sprint("k", i), constFetch(&calls, "v", 0))
		if !errors.Is(err, ErrRedis) || !strings.Contains(err.Error(), "connection refused") {
			t.Errorf("Get %d = %v, want ErrRedis naming the cause", i, err)
		}
	}
	mu.Lock()
	if len(sent) != 0 {
		t.Errorf("20 Gets sent %d commands to Redis while it was known to be down: %q", len(sent), sent)
	}
	mu.Unlock()
	if calls.Load() != 0 {
		t.Errorf("fetch ran %d times without FailOpen", calls.Load())
	}
	srv.Restart(t)
	t0 := time.Now()
	// The probe PINGs every 500ms: 5s tells "promptly" from a probe that
	// gave up or backed off to the outage log's 10s.
	eventually(t, 5*time.Second, "Get to work again", func() bool {
		_, err := c.Get(bg(), "back", constFetch(&calls, "v", 0))
		return err == nil
	})
	t.Logf("recovery noticed after %v", time.Since(t0))
	if s := c.Stats(); s.Outages != 1 {
		t.Errorf("Outages = %d, want 1", s.Outages)
	}
}

// fetching starts a Get of id on c whose fetch returns val once released,
// and waits until that fetch runs. release may be called more than once,
// and is called when the test ends.
func fetching(t *testing.T, c *testClient, ctx context.Context, id, val string) (got <-chan string, release func()) {
	t.Helper()
	started, ch := make(chan struct{}, 1), make(chan struct{})
	var once sync.Once
	release = func() { once.Do(func() { close(ch) }) }
	t.Cleanup(release)
	got = getAsync(c, ctx, id, blockingFetch(started, ch, val))
	select {
	case <-started:
	case <-ctx.Done():
		t.Fatal("fetch never ran")
	}
	return got, release
}

// killKnown kills srv, and has c find it down: from then on c's process
// knows it is.
func killKnown(t *testing.T, c *testClient, srv *redistest.Server, ctx context.Context) {
	t.Helper()
	srv.Kill()
	if _, err := c.Get(ctx, "other", constFetch(new(atomic.Int64), "w", 0)); !errors.Is(err, ErrRedis) {
		t.Fatalf("Get while Redis is down = %v, want ErrRedis", err)
	}
}

// A flight whose Redis went down while fetch ran, and that this process
// already knows to be down, hands its callers the value before it tries
// its store: they do not wait for go-redis's dial retries. The store is
// held here until the caller has the value; a store sent before the
// callers are answered would hold it for good.
func TestGet_StoreToANodeKnownDownWaitsForNoCaller(t *testing.T) {
	srv := redistest.Start(t)
	c := newTestClient(t, srv.Addr, "downstore", &Options{LockTTL: 30 * time.Second})
	var stores atomic.Int64
	answered := make(chan struct{})
	var answer sync.Once
	t.Cleanup(func() { answer.Do(func() { close(answered) }) }) // before the client's Close
	store := wire.ScriptsFor(false).Store
	c.rdb.AddHook(failHook{hold: func(cmd redis.Cmder) <-chan struct{} {
		if isScript(cmd, store, wire.StoreSrc) {
			stores.Add(1)
			return answered
		}
		return nil
	}})
	ctx, cancel := context.WithTimeout(bg(), 20*time.Second)
	defer cancel()
	first, release := fetching(t, c, ctx, "k", "v")
	killKnown(t, c, srv, ctx)
	release()
	select {
	case got := <-first:
		answer.Do(func() { close(answered) })
		if got != "v" {
			t.Fatalf("the flight's caller got %q, want %q", got, "v")
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("the flight's caller had no value after 10s (stores sent: %d)", stores.Load())
	}
	// The store, tried after, fails: Redis is down.
	eventually(t, 10*time.Second, "the store to fail", func() bool { return c.Stats().StoreErrors == 1 })
	if n := stores.Load(); n != 1 {
		t.Errorf("the store was sent %d times, want 1", n)
	}
}

// A store tried after the callers, to a node known down, may sit in
// go-redis's dial retries (held here, honouring its context, as a dial
// does). Close ends it: Close does not return with the store still
// writing through a client its owner closes next.
func TestClose_EndsAStoreTriedAfterTheCallers(t *testing.T) {
	srv := redistest.Start(t)
	c := newTestClient(t, srv.Addr, "closestore", &Options{LockTTL: 30 * time.Second})
	began, ended := holdFirst(t, c, wire.ScriptsFor(false).Store, wire.StoreSrc)
	ctx, cancel := context.WithTimeout(bg(), 20*time.Second)
	defer cancel()
	first, release := fetching(t, c, ctx, "k", "v")
	killKnown(t, c, srv, ctx)
	release()
	if got := <-first; got != "v" {
		t.Fatalf("the flight's caller got %q, want %q", got, "v")
	}
	closeWhileHeld(t, c, ctx, began, ended, "store")
}

// A write of a holder that failed is told to waiters elsewhere: a
// release (with a fail event after a store, an abandon event after a
// "not found") and, if that fails, an abandon event. Both may sit in
// go-redis's retries (held here, honouring their contexts). Close ends
// them as it ends the write itself: neither is still under way once Close
// has returned. For the store, the telling comes after the callers have
// the value; for "not found", before.
func TestClose_EndsTellingOfAFailedWrite(t *testing.T) {
	scripts := wire.ScriptsFor(false)
	cases := []struct {
		name   string
		script *redis.Script
		src    string
		fetch  FetchFunc
	}{
		{"store", scripts.Store, wire.StoreSrc, constFetch(new(atomic.Int64), "v", 0)},
		{"not found", scripts.NotFound, wire.NotFoundSrc, notFoundFetch(new(atomic.Int64))},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			srv := redistest.Start(t)
			c := newTestClient(t, srv.Addr, "closetell", &Options{LockTTL: 30 * time.Second, NegTTL: time.Minute})
			c.rdb.AddHook(failHook{fail: func(cmd redis.Cmder) error {
				if isScript(cmd, tc.script, tc.src) {
					return errors.New("injected: the write failed")
				}
				return nil
			}})
			began, unhold := make(chan struct{}), make(chan struct{})
			defer close(unhold)
			var mu sync.Mutex
			var held int          // release and abandon calls held now
			var lastEnd time.Time // when the last of them ended
			var abandonEnded bool
			events := "closetell/lock-event:k"
			var releases atomic.Int64
			c.rdb.AddHook(ctxHoldHook{hold: func(ctx context.Context, cmd redis.Cmder) {
				release := isScript(cmd, scripts.Release, wire.ReleaseSrc)
				abandon := cmd.Name() == "publish" && fmt.Sprint(cmd.Args()[1]) == events
				if !release && !abandon {
					return
				}
				mu.Lock()
				held++
				mu.Unlock()
				if release && releases.Add(1) == 1 {
					close(began)
				}
				select {
				case <-ctx.Done():
				case <-unhold:
				}
				mu.Lock()
				held--
				lastEnd = time.Now()
				abandonEnded = abandonEnded || abandon
				mu.Unlock()
			}})
			ctx, cancel := context.WithTimeout(bg(), 20*time.Second)
			defer cancel()
			got := getAsync(c, ctx, "k", tc.fetch)
			select {
			case <-began:
			case <-ctx.Done():
				t.Fatal("the failed write was never told")
			}
			if err := c.Close(); err != nil {
				t.Fatalf("Close = %v", err)
			}
			closed := time.Now()
			within(t, 5*time.Second, got, map[string]string{"store": "v", "not found": "error: " + ErrClosed.Error()}[tc.name], "the caller")
			eventually(t, 10*time.Second, "the abandon event to be tried", func() bool {
				mu.Lock()
				defer mu.Unlock()
				return abandonEnded && held == 0
			})
			mu.Lock()
			defer mu.Unlock()
			// The telling's bound ends as Close's own wait does (closeWait
			// after Close began), so that its goroutine returns a moment
			// after Close (with its context done: nothing is written
			// then): some slack for that and a loaded machine. Without the
			// bound the abandon event is held a full closeWait after the
			// release, past Close.
			if late := lastEnd.Sub(closed); late > 500*time.Millisecond {
				t.Errorf("telling of the failed write ran %v after Close returned", late)
			}
		})
	}
}

// A store tried after the callers that Close cuts (see
// TestClose_EndsAStoreTriedAfterTheCallers) failed for this process's
// shutdown, not for the value: waiters in another process, to whom the
// node is fine, take over ([C9]), rather than fail with the holder's
// "context canceled". The node is falsely known down here, as in
// TestGet_StoreWhileANodeIsFalselyKnownDownStillStores, and the store held
// until Close cuts it.
func TestClose_CuttingAStoreAfterTheCallersHandsTheLockOver(t *testing.T) {
	c, other, waiterLookups := holderAndWaiter(t, "cutstore")
	falselyDown := falselyDownOnCue(t, c, "cutstore")
	began, _ := holdFirst(t, c, wire.ScriptsFor(false).Store, wire.StoreSrc)
	ctx, cancel := context.WithTimeout(bg(), 20*time.Second)
	defer cancel()
	waiter, again := storeWhileFalselyDown(t, ctx, c, other, waiterLookups, falselyDown)
	select {
	case <-began:
	case <-ctx.Done():
		t.Fatal("the store was never tried")
	}
	if err := c.Close(); err != nil {
		t.Fatalf("Close = %v", err)
	}
	within(t, 10*time.Second, waiter, "computed by the waiter", "the waiter in another process (lock TTL 30s)")
	if n := again.Load(); n != 1 {
		t.Errorf("the waiter computed %d times; want once, after the hand-over", n)
	}
}

// A store begun before Close, held (honouring its context, as go-redis's
// timeouts against a stalled server would, only later): Close ends it as
// it ends one tried after the callers, instead of returning with it still
// writing, and a waiter in another process takes over.
func TestClose_EndsAStoreBegunBeforeIt(t *testing.T) {
	c, other, waiterLookups := holderAndWaiter(t, "closeinline")
	began, ended := holdFirst(t, c, wire.ScriptsFor(false).Store, wire.StoreSrc)
	ctx, cancel := context.WithTimeout(bg(), 20*time.Second)
	defer cancel()
	first, release := fetching(t, c, ctx, "k", "v")
	var again atomic.Int64
	waiter := getAsync(other, ctx, "k", constFetch(&again, "computed by the waiter", 0))
	parkedAndLive(t, waiterLookups, 2)
	release()
	closeWhileHeld(t, c, ctx, began, ended, "store")
	within(t, 5*time.Second, first, "error: "+ErrClosed.Error(), "the flight's caller")
	within(t, 10*time.Second, waiter, "computed by the waiter", "the waiter in another process (lock TTL 30s)")
}

// A renewal of a running fetch's lock, begun before Close and held
// (honouring its context, as go-redis's timeouts against a stalled server
// would, only later): Close ends it too, instead of returning with it
// still writing.
func TestClose_EndsARenewalUnderWay(t *testing.T) {
	srv := redistest.Start(t)
	c := newTestClient(t, srv.Addr, "closerenew", &Options{LockTTL: 300 * time.Millisecond})
	began, ended := holdFirst(t, c, wire.ScriptsFor(false).Renew, wire.RenewSrc)
	ctx, cancel := context.WithTimeout(bg(), 20*time.Second)
	defer cancel()
	_, _ = fetching(t, c, ctx, "k", "v")
	closeWhileHeld(t, c, ctx, began, ended, "renewal")
}

// holdFirst holds the first run on c of the script (src) until its
// context ends, as go-redis's dials and retries against a node that does
// not answer would, or the test ends. began is closed once it is held;
// ended then gets its context's error (nil if the test let it go).
func holdFirst(t *testing.T, c *testClient, script *redis.Script, src string) (began <-chan struct{}, ended <-chan error) {
	t.Helper()
	held, done, unhold := make(chan struct{}), make(chan error, 1), make(chan struct{})
	t.Cleanup(func() { close(unhold) })
	var runs atomic.Int64
	c.rdb.AddHook(ctxHoldHook{hold: func(ctx context.Context, cmd redis.Cmder) {
		if !isScript(cmd, script, src) || runs.Add(1) != 1 {
			return
		}
		close(held)
		select {
		case <-ctx.Done():
			done <- ctx.Err()
		case <-unhold:
			done <- nil
		}
	}})
	return held, done
}

// closeWhileHeld closes c once what (a write that holdFirst holds) is
// held, and fails unless what ended by its context (Close's bound) by the
// time Close returned. Its bound (half of closeWait) ends well before
// Close's wait does (closeWait); a second's slack is for a loaded machine,
// and a bound past Close's (3 × closeWait, say) still fails.
func closeWhileHeld(t *testing.T, c *testClient, ctx context.Context, began <-chan struct{}, ended <-chan error, what string) {
	t.Helper()
	select {
	case <-began:
	case <-ctx.Done():
		t.Fatalf("the %s was never tried", what)
	}
	if err := c.Close(); err != nil {
		t.Fatalf("Close = %v", err)
	}
	select {
	case err := <-ended:
		if err == nil {
			t.Fatalf("the %s ended only when the test let it go", what)
		}
	case <-time.After(time.Second):
		t.Fatalf("the %s still ran 1s after Close returned", what)
	}
}

// ctxHoldHook runs hold before each command, with the command's context.
type ctxHoldHook struct {
	hold func(context.Context, redis.Cmder)
}

func (h ctxHoldHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h ctxHoldHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.hold(ctx, cmd)
		return next(ctx, cmd)
	}
}
func (h ctxHoldHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// FailOpen is for outages only: an error reply from Redis is an answer, and
// is returned with the server's text.
func TestGet_FailOpenReturnsErrorReplies(t *testing.T) {
	b := miniBackend(t)
	rawClient(t, b.addr).HSet(bg(), "fo:k", "f", "v")
	c := newTestClient(t, b.addr, "fo", &Options{FailOpen: true})
	var calls atomic.Int64
	_, err := c.Get(bg(), "k", constFetch(&calls, "local", 0))
	if !errors.Is(err, ErrRedis) || !strings.Contains(err.Error(), "WRONGTYPE") {
		t.Errorf("Get = %v, want ErrRedis with the server's WRONGTYPE", err)
	}
	if calls.Load() != 0 || c.Stats().FailOpen != 0 {
		t.Errorf("fetch ran %d times on an error reply", calls.Load())
	}
}

// Under FailOpen, fetch runs without a lock during an outage; callers that
// leave must not cancel it, since others in the process share it.
func TestGet_FailOpenFetchOutlivesItsCaller(t *testing.T) {
	addr := refusedAddr(t)
	c := newTestClient(t, addr, "fo2", &Options{FailOpen: true})
	started, release := make(chan struct{}), make(chan struct{})
	var releaseOnce sync.Once
	t.Cleanup(func() { releaseOnce.Do(func() { close(release) }) })
	var calls atomic.Int64
	fetchCtx := make(chan error, 1)
	fetch := func(ctx context.Context, _ *Lease) ([]byte, time.Duration, error) {
		calls.Add(1)
		close(started)
		<-release
		fetchCtx <- ctx.Err()
		return []byte("local"), time.Minute, nil
	}
	ctx, cancel := context.WithCancel(bg())
	left := make(chan error, 1)
	go func() { _, err := c.Get(ctx, "k", fetch); left <- err }()
	<-started
	cancel()
	if err := <-left; !errors.Is(err, ErrTimeout) {
		t.Fatalf("leaving caller: %v", err)
	}
	joined := make(chan string, 1)
	go func() { v, _ := c.Get(bg(), "k", fetch); joined <- string(v) }()
	eventually(t, 5*time.Second, "a second caller to join", func() bool { return c.Stats().Coalesced == 1 })
	releaseOnce.Do(func() { close(release) })
	if err := <-fetchCtx; err != nil {
		t.Errorf("fetch's context: %v, want it alive", err)
	}
	if v := <-joined; v != "local" || calls.Load() != 1 {
		t.Errorf("joined caller got %q; fetch ran %d times", v, calls.Load())
	}
}

// A value larger than the server's proto-max-bulk-len makes Redis reset the
// connection that carries it (512 MB by default; 1 MB here, so that the
// test needs no 513 MB value). That is this store's failure, not an
// outage: the caller gets its value, the store is counted as failed, and
// every other call goes on, without an "unreachable" in between.
func TestGet_OversizedValueIsNotAnOutage(t *testing.T) {
	srv := redistest.Start(t, "--proto-max-bulk-len", "1mb")
	c := newTestClient(t, srv.Addr, "big", &Options{LockTTL: 10 * time.Second})
	if _, err := c.Get(bg(), "small", constFetch(new(atomic.Int64), "s", 0)); err != nil {
		t.Fatal(err)
	}
	big := strings.Repeat("x", 8<<20)
	v, err := c.Get(bg(), "big", constFetch(new(atomic.Int64), big, 0))
	if err != nil || len(v) != len(big) {
		t.Fatalf("Get(big) = %d bytes, %v; want the computed value, though Redis cannot store it", len(v), err)
	}
	if s := c.Stats(); s.StoreErrors != 1 {
		t.Fatalf("StoreErrors = %d, want 1: the store did not fail, and the test proves nothing", s.StoreErrors)
	}
	for i := range 20 {
		if v, err := c.Get(bg(), "small", failFetch); err != nil || string(v) != "s" {
			t.Fatalf("Get %d of a stored id after the failed store = %q, %v; want its value", i, v, err)
		}
	}
	if s := c.Stats(); s.Outages != 0 {
		t.Errorf("Outages = %d after one value could not be stored; want 0", s.Outages)
	}
}

// failHook is a go-redis hook that fails, without sending it, every
// command (or pipeline holding one) for which fail returns an error, and
// holds every command for which hold returns a channel until it closes.
type failHook struct {
	fail func(redis.Cmder) error
	hold func(redis.Cmder) <-chan struct{}
}

func (h failHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h failHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if h.hold != nil {
			if ch := h.hold(cmd); ch != nil {
				<-ch
			}
		}
		if h.fail != nil {
			if err := h.fail(cmd); err != nil {
				cmd.SetErr(err)
				return err
			}
		}
		return next(ctx, cmd)
	}
}
func (h failHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, cmd := range cmds {
			if h.fail == nil {
				break
			}
			if err := h.fail(cmd); err != nil {
				for _, c := range cmds {
					c.SetErr(err)
				}
				return err
			}
		}
		return next(ctx, cmds)
	}
}

// falselyDownOnCue returns a function that has c count its node down
// while it is not: a lookup of tag's id "trigger" fails as a reset
// connection, and the probe's PING is held from then until the test ends,
// as a slow dial to a node that is coming back holds it.
func falselyDownOnCue(t *testing.T, c *testClient, tag string) func(ctx context.Context) {
	t.Helper()
	pings := make(chan struct{})
	var holdPings atomic.Bool
	t.Cleanup(func() {
		if holdPings.Swap(false) {
			close(pings)
		}
	})
	c.rdb.AddHook(failHook{
		fail: func(cmd redis.Cmder) error {
			if slices.Contains(cmd.Args(), any(tag+":trigger")) {
				return &net.OpError{Op: "read", Net: "tcp", Err: errors.New("injected: connection reset")}
			}
			return nil
		},
		hold: func(cmd redis.Cmder) <-chan struct{} {
			if cmd.Name() == "ping" && holdPings.Load() {
				return pings
			}
			return nil
		},
	})
	return func(ctx context.Context) {
		t.Helper()
		holdPings.Store(true)
		if _, err := c.Get(ctx, "trigger", noFetch); !errors.Is(err, ErrRedis) {
			t.Fatalf("Get of the failing id = %v, want ErrRedis", err)
		}
		if s := c.Stats(); s.Outages != 1 {
			t.Fatalf("Outages = %d, want 1", s.Outages)
		}
	}
}

// A node this process counts as down may be back already: its probe's
// PING has not been answered yet (held here, as a slow dial to a node that
// is coming back holds it). A flight whose fetch returns then still stores
// its value, which a waiter in another process, to whom the node is
// fine, gets: not a failure that the store never tried.
func TestGet_StoreWhileANodeIsFalselyKnownDownStillStores(t *testing.T) {
	c, other, waiterLookups := holderAndWaiter(t, "falsedown")
	falselyDown := falselyDownOnCue(t, c, "falsedown")
	ctx, cancel := context.WithTimeout(bg(), 20*time.Second)
	defer cancel()
	waiter, again := storeWhileFalselyDown(t, ctx, c, other, waiterLookups, falselyDown)
	within(t, 10*time.Second, waiter, "v", "the waiter in another process")
	if v, err := other.rdb.Get(ctx, "falsedown:k").Result(); err != nil || v != "v" {
		t.Errorf("GET falsedown:k = %q, %v; want the value stored", v, err)
	}
	if n := again.Load(); n != 0 {
		t.Errorf("the waiter computed %d times", n)
	}
}

// Close cancels a running fetch and waits for it, however long it takes to
// return ("Close still waits for such a fetch"), and closeWait more for the
// writes after it. A fetch that honours its cancellation only 1.5 s later
// still hands its lock over ([C9]): the release with its abandon event runs
// within what Close waits, not cut at once because more than closeWait has
// passed since Close began; a waiter elsewhere takes over at once rather
// than when the lock expires.
func TestClose_HandsOverTheLockOfAFetchSlowToCancel(t *testing.T) {
	c, other, waiterLookups := holderAndWaiter(t, "closeslow")
	ctx, cancel := context.WithTimeout(bg(), 25*time.Second)
	defer cancel()
	started := make(chan struct{})
	first := getAsync(c, ctx, "k", func(fctx context.Context, _ *Lease) ([]byte, time.Duration, error) {
		close(started)
		<-fctx.Done()
		time.Sleep(1500 * time.Millisecond) // cleaning up before it returns
		return nil, 0, fctx.Err()
	})
	select {
	case <-started:
	case <-ctx.Done():
		t.Fatal("fetch never ran")
	}
	var again atomic.Int64
	waiter := getAsync(other, ctx, "k", constFetch(&again, "computed by the waiter", 0))
	parkedAndLive(t, waiterLookups, 2)
	t0 := time.Now()
	if err := c.Close(); err != nil {
		t.Fatalf("Close = %v", err)
	}
	t.Logf("Close took %v", time.Since(t0))
	within(t, 5*time.Second, first, "error: "+ErrClosed.Error(), "the flight's caller")
	within(t, 5*time.Second, waiter, "computed by the waiter", "the waiter in another process (lock TTL 30s)")
}

// A store that fails with a dial timeout, which Go's net package makes an
// error that errors.Is takes for context.DeadlineExceeded, failed: Close
// cut nothing (it has not begun). Waiters elsewhere are told so with a
// fail event ([C5]), not handed the lock with an abandon event as for a
// store that Close cut: they fail with the store's error rather than
// compute again.
func TestGet_StoreFailingWithADialTimeoutTellsAFailure(t *testing.T) {
	srv := redistest.Start(t)
	expired, cancelExpired := context.WithDeadline(bg(), time.Now().Add(-time.Second))
	cancelExpired()
	_, dialErr := (&net.Dialer{}).DialContext(expired, "tcp", srv.Addr)
	if dialErr == nil || !errors.Is(dialErr, context.DeadlineExceeded) {
		t.Fatalf("dial with a deadline passed = %v: not the net package's timeout", dialErr)
	}
	t.Logf("the store fails with %q", dialErr)
	opts := &Options{LockTTL: 30 * time.Second}
	holder := newTestClient(t, srv.Addr, "dialto", opts)
	store := wire.ScriptsFor(false).Store
	holder.rdb.AddHook(failHook{fail: func(cmd redis.Cmder) error {
		if isScript(cmd, store, wire.StoreSrc) {
			return dialErr
		}
		return nil
	}})
	waiter := newTestClient(t, srv.Addr, "dialto", opts)
	looks := countLookups(waiter.rdb, "dialto:k")
	ctx, cancel := context.WithTimeout(bg(), 20*time.Second)
	defer cancel()
	first, release := fetching(t, holder, ctx, "k", "v")
	var again atomic.Int64
	got := getAsync(waiter, ctx, "k", constFetch(&again, "computed by the waiter", 0))
	parkedAndLive(t, looks, 2)
	release()
	within(t, 5*time.Second, first, "v", "the holder's caller")
	select {
	case v := <-got:
		if !strings.Contains(v, ErrHolderFailed.Error()) || !strings.Contains(v, "i/o timeout") {
			t.Errorf("waiter got %q, want the holder's store failure", v)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the waiter had nothing after 5s (lock TTL 30s)")
	}
	if n := again.Load(); n != 0 {
		t.Errorf("the waiter fetched %d times, want 0", n)
	}
}

// storeWhileFalselyDown has c fetch id "k" while other waits on it, then
// makes c take the node for down (falselyDown) and lets the fetch return
// "v", which c's caller gets; it returns other's Get and a count of its
// fetches.
func storeWhileFalselyDown(t *testing.T, ctx context.Context, c, other *testClient, waiterLookups *lookups, falselyDown func(context.Context)) (waiter <-chan string, again *atomic.Int64) {
	t.Helper()
	first, release := fetching(t, c, ctx, "k", "v")
	again = &atomic.Int64{}
	waiter = getAsync(other, ctx, "k", constFetch(again, "computed by the waiter", 0))
	parkedAndLive(t, waiterLookups, 2)
	falselyDown(ctx)
	release()
	within(t, 10*time.Second, first, "v", "the flight's caller")
	return waiter, again
}

// holderAndWaiter starts a redis-server with two clients of tag on it: c,
// whose lock lives 30 s (only a hand-over ends it in time), and other, a
// process waiting on the same ids, with a count of its lookups of id "k".
func holderAndWaiter(t *testing.T, tag string) (c, other *testClient, waiterLookups *lookups) {
	t.Helper()
	srv := redistest.Start(t)
	c = newTestClient(t, srv.Addr, tag, &Options{LockTTL: 30 * time.Second})
	other = newTestClient(t, srv.Addr, tag, nil)
	return c, other, countLookups(other.rdb, tag+":k")
}
