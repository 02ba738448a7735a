package redistest

import (
	"bytes"
	"net"
	"sync"
	"sync/atomic"
	"testing"
)

// Proxy forwards TCP connections to a server. It can make the pub/sub
// connections go silent, as a connection does when the network drops it
// without a reset: bytes are swallowed both ways and nothing is closed.
type Proxy struct {
	Addr   string
	target string
	l      net.Listener
	wg     sync.WaitGroup

	mu    sync.Mutex
	conns []*proxyConn
}

type proxyConn struct {
	client, server net.Conn
	pubsub         atomic.Bool // a SUBSCRIBE went through it
	silent         atomic.Bool
}

// StartProxy starts a proxy to target and stops it when the test ends.
func StartProxy(t testing.TB, target string) *Proxy {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &Proxy{Addr: l.Addr().String(), target: target, l: l}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.close)
	return p
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		client, err := p.l.Accept()
		if err != nil {
			return
		}
		server, err := net.Dial("tcp", p.target)
		if err != nil {
			client.Close()
			continue
		}
		c := &proxyConn{client: client, server: server}
		p.mu.Lock()
		p.conns = append(p.conns, c)
		p.mu.Unlock()
		p.wg.Add(2)
		go p.pipe(c, client, server, true)
		go p.pipe(c, server, client, false)
	}
}

func (p *Proxy) pipe(c *proxyConn, from, to net.Conn, upstream bool) {
	defer p.wg.Done()
	defer c.client.Close()
	defer c.server.Close()
	buf := make([]byte, 32<<10)
	for {
		n, err := from.Read(buf)
		if err != nil {
			return
		}
		if upstream && bytes.Contains(bytes.ToLower(buf[:n]), []byte("subscribe")) {
			c.pubsub.Store(true)
		}
		if c.silent.Load() {
			continue
		}
		if _, err := to.Write(buf[:n]); err != nil {
			return
		}
	}
}

// SilencePubSub silences every open connection that has carried a
// SUBSCRIBE and returns how many it silenced. New connections work.
func (p *Proxy) SilencePubSub() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, c := range p.conns {
		if c.pubsub.Load() && !c.silent.Swap(true) {
			n++
		}
	}
	return n
}

func (p *Proxy) close() {
	p.l.Close()
	p.mu.Lock()
	for _, c := range p.conns {
		c.client.Close()
		c.server.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}
