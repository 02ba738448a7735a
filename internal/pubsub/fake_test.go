package pubsub

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// fakeRedis serves fake pub/sub connections: enough of Redis, and of
// go-redis's PubSub, to drive a Subscriber, with faults on cue.
type fakeRedis struct {
	mu     sync.Mutex
	conns  []*fakeConn
	faults []fault
	onDial func() // a tracking client's dial hook
	sent   []string
	hang   chan struct{} // a call that meets a hang fault waits for it to close
	hung   chan struct{} // closed when a call waits on hang
	once   sync.Once
}

type faultKind int

const (
	writeError faultKind = iota // the call fails, nothing is sent
	refuse                      // Redis answers with err instead
	redial                      // go-redis reconnects inside the call, resubscribing
	silence                     // the connection goes silent both ways
	hang                        // the call blocks until fakeRedis.hang closes
)

// fault hits the next command whose verb is verb ("" for any).
type fault struct {
	verb string
	kind faultKind
	err  error
}

var errFakeWrite = errors.New("fake: write failed")

func newFakeRedis() *fakeRedis {
	return &fakeRedis{hang: make(chan struct{}), hung: make(chan struct{})}
}

func (f *fakeRedis) inject(ft fault) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.faults = append(f.faults, ft)
}

// open is a Subscriber's opener: a new connection, not dialled yet.
func (f *fakeRedis) open(context.Context) conn {
	f.mu.Lock()
	defer f.mu.Unlock()
	c := &fakeConn{f: f, subs: make(map[string]string), ready: make(chan struct{}, 1)}
	f.conns = append(f.conns, c)
	return c
}

func (f *fakeRedis) opened() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.conns)
}

// count returns how many commands with verb were sent.
func (f *fakeRedis) count(verb string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, s := range f.sent {
		if strings.HasPrefix(s, verb+" ") {
			n++
		}
	}
	return n
}

// publish delivers payload to every connection subscribed to ch.
func (f *fakeRedis) publish(ch, payload string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, c := range f.conns {
		if _, ok := c.subs[ch]; ok && !c.closed && !c.silent {
			c.push(item{msg: &redis.Message{Channel: ch, Payload: payload}})
			n++
		}
	}
	return n
}

// migrate unsubscribes ch, as Redis does when its slot moves away.
func (f *fakeRedis) migrate(ch string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, c := range f.conns {
		if _, ok := c.subs[ch]; ok && !c.closed {
			delete(c.subs, ch)
			c.push(item{msg: &redis.Subscription{Kind: verbSUnsubscribe, Channel: ch}})
		}
	}
}

// last returns the newest connection.
func (f *fakeRedis) last() *fakeConn {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.conns[len(f.conns)-1]
}

// arrive makes the newest connection receive it.
func (f *fakeRedis) arrive(it item) {
	c := f.last()
	f.mu.Lock()
	defer f.mu.Unlock()
	c.push(it)
}

type item struct {
	msg any
	err error
}

type fakeConn struct {
	f       *fakeRedis
	dialled bool
	closed  bool
	silent  bool
	subs    map[string]string // channel: its subscribe verb
	queue   []item
	ready   chan struct{} // capacity 1: queue or closed changed
}

// push queues it for ReceiveTimeout; f.mu is held.
func (c *fakeConn) push(it item) {
	c.queue = append(c.queue, it)
	select {
	case c.ready <- struct{}{}:
	default:
	}
}

func (c *fakeConn) Subscribe(_ context.Context, chans ...string) error {
	return c.call(verbSubscribe, chans)
}
func (c *fakeConn) SSubscribe(_ context.Context, chans ...string) error {
	return c.call(verbSSubscribe, chans)
}
func (c *fakeConn) Unsubscribe(_ context.Context, chans ...string) error {
	return c.call(verbUnsubscribe, chans)
}
func (c *fakeConn) SUnsubscribe(_ context.Context, chans ...string) error {
	return c.call(verbSUnsubscribe, chans)
}
func (c *fakeConn) Ping(_ context.Context, payload ...string) error {
	return c.call(verbPing, payload)
}

// take returns the first fault for verb, removing it; f.mu is held.
func (f *fakeRedis) take(verb string) (fault, bool) {
	for i, ft := range f.faults {
		if ft.verb == "" || ft.verb == verb {
			f.faults = append(f.faults[:i], f.faults[i+1:]...)
			return ft, true
		}
	}
	return fault{}, false
}

func (c *fakeConn) call(verb string, args []string) error {
	f := c.f
	f.mu.Lock()
	ft, faulty := f.take(verb)
	dial := !c.dialled || faulty && ft.kind == redial
	c.dialled = true
	f.mu.Unlock()
	if dial && f.onDial != nil {
		f.onDial()
	}
	if faulty && ft.kind == hang {
		f.once.Do(func() { close(f.hung) })
		<-f.hang
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if c.closed {
		return errors.New("redis: client is closed")
	}
	f.sent = append(f.sent, verb+" "+strings.Join(args, " "))
	if faulty {
		if done, err := c.fault(ft); done {
			return err
		}
	}
	if !c.silent {
		c.answer(verb, args)
	}
	return nil
}

// fault applies ft; done reports that the command went no further.
func (c *fakeConn) fault(ft fault) (done bool, err error) {
	switch ft.kind {
	case writeError:
		c.f.sent = c.f.sent[:len(c.f.sent)-1]
		return true, errFakeWrite
	case refuse:
		c.push(item{err: ft.err})
		return true, nil
	case redial:
		for ch, verb := range c.subs {
			c.push(item{msg: &redis.Subscription{Kind: verb, Channel: ch, Count: 1}})
		}
	case silence:
		c.silent = true
	}
	return false, nil
}

// answer queues Redis's replies to a command that went through.
func (c *fakeConn) answer(verb string, args []string) {
	if verb == verbPing {
		c.push(item{msg: &redis.Pong{Payload: args[0]}})
		return
	}
	for i, ch := range args {
		switch verb {
		case verbSubscribe, verbSSubscribe:
			c.subs[ch] = verb
		default:
			delete(c.subs, ch)
		}
		c.push(item{msg: &redis.Subscription{Kind: verb, Channel: ch, Count: i + 1}})
	}
}

func (c *fakeConn) ReceiveTimeout(_ context.Context, d time.Duration) (any, error) {
	t := time.NewTimer(d)
	defer t.Stop()
	for {
		c.f.mu.Lock()
		if len(c.queue) > 0 && !c.silent {
			it := c.queue[0]
			c.queue = c.queue[1:]
			c.f.mu.Unlock()
			return it.msg, it.err
		}
		closed := c.closed
		c.f.mu.Unlock()
		if closed {
			return nil, errors.New("redis: client is closed")
		}
		select {
		case <-c.ready:
		case <-t.C:
			return nil, timeoutError{}
		}
	}
}

func (c *fakeConn) Close() error {
	c.f.mu.Lock()
	defer c.f.mu.Unlock()
	c.closed = true
	select {
	case c.ready <- struct{}{}:
	default:
	}
	return nil
}

// fakeSubscriber returns a subscriber on f, closed when the test ends.
func fakeSubscriber(t *testing.T, f *fakeRedis, sharded bool, cfg Config) *Subscriber {
	if cfg.Health == 0 {
		cfg.Health = time.Minute // silence tests set their own
	}
	s := newSubscriber(f.open, sharded, cfg)
	t.Cleanup(func() { s.Close(5 * time.Second) })
	return s
}

// waitFor waits until cond holds, failing the test after 10 s.
func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// collector takes a watch's events as they come, into one Events.
type collector struct {
	w   *Watch
	mu  sync.Mutex
	all Events
}

func collect(t *testing.T, w *Watch) *collector {
	c := &collector{w: w}
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-w.Signal():
				c.add(w.Take())
			case <-stop:
				return
			}
		}
	}()
	t.Cleanup(func() { close(stop); <-done })
	return c
}

func (c *collector) add(ev Events) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.all.Reread = c.all.Reread || ev.Reread
	c.all.Moved = c.all.Moved || ev.Moved
	c.all.Synced = c.all.Synced || ev.Synced
	c.all.Closed = c.all.Closed || ev.Closed
	c.all.Messages = append(c.all.Messages, ev.Messages...)
	if c.all.Err == nil {
		c.all.Err = ev.Err
	}
}

// get returns what was collected so far.
func (c *collector) get() Events {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.all
}

// reset clears what was collected.
func (c *collector) reset() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.all = Events{}
}

// has reports whether a message with payload was collected.
func (c *collector) has(payload string) bool {
	for _, m := range c.get().Messages {
		if m.Payload == payload {
			return true
		}
	}
	return false
}
