package redistest

import (
	"bytes"
	"context"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
)

// Faults breaks the connections of a go-redis client on cue. Give its Dial
// to the client as redis.Options.Dialer; every connection it makes then
// goes through Faults, which can fail a write, drop or swallow the reply to
// a command, pause a reader, or hold new dials.
//
// A rule matches the bytes of one write (a command, or a pipeline of them)
// or one read, compared case-insensitively.
type Faults struct {
	dials atomic.Int64

	mu        sync.Mutex
	failWrite []byte // the next pub/sub write containing it fails
	failAll   []byte // every write containing it fails
	dropReply []byte // the reply to the next command containing it is lost
	swallow   []byte // replies to every command containing it never come
	pause     *gate  // the next pub/sub read containing pause.match waits
	dialGate  *gate  // dials wait
}

// gate holds goroutines until opened.
type gate struct {
	match   []byte
	reached chan struct{} // closed when a goroutine waits at the gate
	open    chan struct{}
	once    sync.Once
}

func newGate(match string) *gate {
	return &gate{match: bytes.ToLower([]byte(match)), reached: make(chan struct{}), open: make(chan struct{})}
}

func (g *gate) wait() {
	g.once.Do(func() { close(g.reached) })
	<-g.open
}

// ErrInjected is the error of a write that Faults fails.
var ErrInjected = errors.New("redistest: injected write failure")

// Dial dials addr (ignoring the address go-redis asks for, as
// redis.Options.Dialer may) and wraps the connection.
func (f *Faults) Dial(addr string) func(ctx context.Context, network, _ string) (net.Conn, error) {
	return func(ctx context.Context, network, _ string) (net.Conn, error) {
		f.mu.Lock()
		g := f.dialGate
		f.mu.Unlock()
		if g != nil {
			g.wait()
		}
		f.dials.Add(1)
		var d net.Dialer
		c, err := d.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return &faultConn{Conn: c, f: f}, nil
	}
}

// Dials returns how many connections were dialed.
func (f *Faults) Dials() int64 { return f.dials.Load() }

// FailPubSubWrite makes the next write containing match on a pub/sub
// connection fail with ErrInjected, without sending anything.
func (f *Faults) FailPubSubWrite(match string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.failWrite = bytes.ToLower([]byte(match))
}

// FailWrites makes every write containing match fail with ErrInjected,
// without sending anything, on any connection. An empty match ends it.
func (f *Faults) FailWrites(match string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.failAll = nil
	if match != "" {
		f.failAll = bytes.ToLower([]byte(match))
	}
}

// DropReply loses the reply to the next command containing match: the
// command reaches the server and runs, its reply is read and thrown away,
// and the connection is reset, as when it drops at the wrong moment.
func (f *Faults) DropReply(match string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.dropReply = bytes.ToLower([]byte(match))
}

// SwallowReplies makes every command containing match run on the server
// while its connection goes silent: the client sees a read timeout. An
// empty match ends it.
func (f *Faults) SwallowReplies(match string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.swallow = nil
	if match != "" {
		f.swallow = bytes.ToLower([]byte(match))
	}
}

// PausePubSubRead makes the next read on a pub/sub connection that
// contains match wait, holding its data, until resume is called. reached
// is closed once a reader waits.
func (f *Faults) PausePubSubRead(match string) (reached <-chan struct{}, resume func()) {
	g := newGate(match)
	f.mu.Lock()
	f.pause = g
	f.mu.Unlock()
	return g.reached, func() { close(g.open) }
}

// HoldDials makes new dials wait until release is called. reached is
// closed once a dial waits.
func (f *Faults) HoldDials() (reached <-chan struct{}, release func()) {
	g := newGate("")
	f.mu.Lock()
	f.dialGate = g
	f.mu.Unlock()
	return g.reached, func() {
		f.mu.Lock()
		if f.dialGate == g {
			f.dialGate = nil
		}
		f.mu.Unlock()
		close(g.open)
	}
}

type faultConn struct {
	net.Conn
	f      *Faults
	pubsub atomic.Bool
	drop   atomic.Bool // the next reply is lost
	silent atomic.Bool // replies never come
}

func (c *faultConn) Write(b []byte) (int, error) {
	low := bytes.ToLower(b)
	if bytes.Contains(low, []byte("subscribe")) {
		c.pubsub.Store(true)
	}
	f := c.f
	f.mu.Lock()
	fail := c.pubsub.Load() && f.failWrite != nil && bytes.Contains(low, f.failWrite)
	if fail {
		f.failWrite = nil
	}
	fail = fail || f.failAll != nil && bytes.Contains(low, f.failAll)
	if f.dropReply != nil && bytes.Contains(low, f.dropReply) {
		f.dropReply = nil
		c.drop.Store(true)
	}
	if f.swallow != nil && bytes.Contains(low, f.swallow) {
		c.silent.Store(true)
	}
	f.mu.Unlock()
	if fail {
		return 0, ErrInjected
	}
	return c.Conn.Write(b)
}

func (c *faultConn) Read(b []byte) (int, error) {
	if c.silent.Load() {
		// Read until the deadline go-redis set, throwing everything away.
		for {
			if _, err := c.Conn.Read(b); err != nil {
				return 0, err
			}
		}
	}
	n, err := c.Conn.Read(b)
	if n > 0 && c.drop.CompareAndSwap(true, false) {
		_ = c.Conn.Close()
		return 0, &net.OpError{Op: "read", Net: "tcp", Addr: c.RemoteAddr(), Err: syscall.ECONNRESET}
	}
	if n > 0 && c.pubsub.Load() {
		c.f.mu.Lock()
		g := c.f.pause
		if g != nil && bytes.Contains(bytes.ToLower(b[:n]), g.match) {
			c.f.pause = nil
		} else {
			g = nil
		}
		c.f.mu.Unlock()
		if g != nil {
			g.wait()
		}
	}
	return n, err
}
