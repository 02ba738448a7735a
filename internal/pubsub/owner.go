package pubsub

import (
	"context"
	"time"
)

// burstWindow and gatherDelay batch the subscriptions of a burst of
// watches (10,000 keys expiring at once): when the owner sent something
// less than burstWindow ago, it waits gatherDelay for more before it
// sends again, so that one SUBSCRIBE, one marker and one UNSUBSCRIBE serve
// many keys. A watch that comes alone is sent at once.
const (
	burstWindow = 5 * time.Millisecond
	gatherDelay = time.Millisecond
)

// owner is the state of the goroutine that owns the connection.
type owner struct {
	s        *Subscriber
	conn     conn          // nil until a batch needs one
	reading  bool          // a reader runs on conn
	backoff  time.Duration // the pause before the next replacement
	lastSend time.Time
	timer    *time.Timer // wakes the owner for work held back
}

// run owns the connection: it sends what watches need, and replaces the
// connection when it fails.
func (s *Subscriber) run() {
	defer close(s.done)
	o := &owner{s: s, timer: time.NewTimer(time.Hour)}
	o.timer.Stop()
	defer o.timer.Stop()
	defer o.drop()
	for {
		select {
		case <-s.kick:
		case <-o.timer.C:
		case <-s.stop:
			return
		}
		if time.Since(o.lastSend) < burstWindow && !s.sleep(gatherDelay) {
			return
		}
		if !o.sendAll() {
			return
		}
	}
}

// sendAll sends batches until the machine has nothing more to send. It
// returns false on close.
func (o *owner) sendAll() bool {
	s := o.s
	for {
		s.mu.Lock()
		b, wakeAt := s.m.plan(time.Now())
		s.mu.Unlock()
		if !wakeAt.IsZero() {
			o.timer.Reset(time.Until(wakeAt))
		}
		if b.heard {
			o.backoff = 0 // the connection works
		}
		if b.replace && !o.replace() {
			return false
		}
		if len(b.cmds) == 0 {
			return true
		}
		if o.conn == nil {
			o.conn = s.open(s.ctx) // no I/O until the first command
		}
		o.lastSend = time.Now()
		if err := o.send(b); err != nil {
			s.failed(b.gen, err)
			continue
		}
		if !o.reading {
			o.reading = true
			s.reads.Add(1)
			go s.read(o.conn, b.gen)
		}
	}
}

// replace closes the failed connection, which ends its reader, and waits
// before the next: not at all the first time, then from 5 ms doubling up
// to maxBackoff while replacements fail. It returns false on close.
func (o *owner) replace() bool {
	o.drop()
	o.s.stats.Reconnects.Add(1)
	d := o.backoff
	o.backoff = nextBackoff(d)
	return d == 0 || o.s.sleep(d)
}

// nextBackoff is the pause after d: 5 ms after none, then twice as long,
// up to maxBackoff.
func nextBackoff(d time.Duration) time.Duration {
	return min(max(2*d, 5*time.Millisecond), maxBackoff)
}

func (o *owner) drop() {
	if o.conn != nil {
		_ = o.conn.Close()
		o.conn, o.reading = nil, false
	}
}

// send writes b's commands in order, each call bounded in time. Any error
// means that the connection is no longer the one the machine describes.
func (o *owner) send(b batch) error {
	ctx, cancel := context.WithTimeout(o.s.ctx, callTimeout)
	defer cancel()
	st := o.s.stats
	for _, c := range b.cmds {
		var err error
		switch c.verb {
		case verbSubscribe:
			st.Subscribes.Add(1)
			err = o.conn.Subscribe(ctx, c.args...)
		case verbSSubscribe:
			st.Subscribes.Add(1)
			err = o.conn.SSubscribe(ctx, c.args...)
		case verbUnsubscribe:
			st.Unsubscribes.Add(1)
			err = o.conn.Unsubscribe(ctx, c.args...)
		case verbSUnsubscribe:
			st.Unsubscribes.Add(1)
			if c.all {
				err = o.conn.SUnsubscribe(ctx) // every shard channel
			} else {
				err = o.conn.SUnsubscribe(ctx, c.args...)
			}
		case verbPing:
			st.Pings.Add(1)
			err = o.conn.Ping(ctx, c.args[0])
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// failed records that a write on connection gen failed.
func (s *Subscriber) failed(gen uint64, err error) {
	var fx effects
	s.mu.Lock()
	s.m.sendFailed(gen, err, time.Now(), &fx)
	s.mu.Unlock()
	s.apply(&fx)
}

// sleep waits d; it returns false on close.
func (s *Subscriber) sleep(d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-s.stop:
		return false
	}
}

// read receives from c, connection gen, until it fails or is replaced.
func (s *Subscriber) read(c conn, gen uint64) {
	defer s.reads.Done()
	for {
		msg, err := c.ReceiveTimeout(context.Background(), s.health)
		var fx effects
		s.mu.Lock()
		s.m.receive(gen, msg, err, time.Now(), &fx)
		s.mu.Unlock()
		s.apply(&fx)
		if fx.stop {
			return
		}
	}
}
