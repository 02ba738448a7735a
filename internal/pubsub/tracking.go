package pubsub

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"
)

// errNotTracking is the error of WaitTracking on a subscriber made without
// Config.Track.
var errNotTracking = errors.New("WaitTracking on a subscriber that does not track (Config.Track is nil)")

// newTracking returns a subscriber that tracks the keys of cfg.Track on
// its own connection, which it opens at once.
func newTracking(base *redis.Client, sharded bool, cfg Config) *Subscriber {
	s := newSubscriber(nil, sharded, cfg)
	s.trackClient = trackingClient(base, cfg.Track, s)
	s.open = func(ctx context.Context) conn { return s.trackClient.Subscribe(ctx) }
	s.startTracker()
	return s
}

// startTracker watches the invalidation channel, and so connects at once.
func (s *Subscriber) startTracker() {
	w := newWatch(nil, []string{invalidationChannel})
	w.sub = s
	var fx effects
	s.mu.Lock()
	s.m.tracker = w
	s.m.watch(w, &fx)
	s.startLocked()
	s.mu.Unlock()
	s.apply(&fx)
}

// trackingClient returns a client for the subscriber alone, made from
// base's options: RESP2, so that invalidations arrive as pub/sub
// messages, and every connection it makes turns tracking on, in
// broadcasting mode for prefixes, redirected to itself, before it
// subscribes. Its dial hook tells the subscriber of every dial.
func trackingClient(base *redis.Client, prefixes []string, s *Subscriber) *redis.Client {
	o := *base.Options()
	// go-redis shares this setting with base, and turns it off on base's
	// first connection to a server without maintenance notifications,
	// under a lock of base's: reading it here, as NewClient would, races
	// with that. Notifications need RESP3, which this client does not
	// speak.
	o.MaintNotificationsConfig = &maintnotifications.Config{Mode: maintnotifications.ModeDisabled}
	o.Protocol = 2
	o.PoolSize = 1
	o.MinIdleConns, o.MaxIdleConns = 0, 0
	userConnect := o.OnConnect
	o.OnConnect = func(ctx context.Context, cn *redis.Conn) error {
		if userConnect != nil {
			if err := userConnect(ctx, cn); err != nil {
				return err
			}
		}
		return s.startTracking(ctx, cn, prefixes)
	}
	tc := redis.NewClient(&o)
	tc.AddHook(dialHook{s})
	return tc
}

// startTracking turns tracking on for the connection cn, being set up.
// A transient refusal (BUSY while a script runs, LOADING) fails the dial:
// the subscriber tries again on a new connection, with backoff. A
// permanent one (NOPERM, a server without CLIENT TRACKING) lets the
// connection serve its watches without tracking, and is asked again on
// the next connection.
func (s *Subscriber) startTracking(ctx context.Context, cn *redis.Conn, prefixes []string) error {
	id, err := cn.ClientID(ctx).Result()
	if err == nil {
		args := []any{"CLIENT", "TRACKING", "on", "REDIRECT", id, "BCAST"}
		for _, p := range prefixes {
			args = append(args, "PREFIX", p)
		}
		err = cn.Do(ctx, args...).Err()
	}
	if err == nil || !isReply(err) || isTransient(err) {
		return err
	}
	var fx effects
	s.mu.Lock()
	s.m.trackingRefused(err, &fx)
	s.mu.Unlock()
	s.apply(&fx)
	return nil
}

// dialHook tells the subscriber of every dial of its tracking client,
// before it happens.
type dialHook struct{ s *Subscriber }

func (h dialHook) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		h.s.dialled()
		return next(ctx, network, addr)
	}
}
func (dialHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (dialHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// dialled ends tracking liveness: go-redis may be replacing the
// connection inside a call, and invalidations sent in the gap are lost.
func (s *Subscriber) dialled() {
	var fx effects
	s.mu.Lock()
	s.m.dialled(&fx)
	s.mu.Unlock()
	s.apply(&fx)
}

// Tracking reports whether the current connection is known to receive
// every invalidation, and the epoch of that state: a later call that
// returns the same epoch and true proves that no invalidation was missed
// in between. It is always false for a subscriber made without
// Config.Track.
func (s *Subscriber) Tracking() (epoch uint64, live bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.m.track.epoch, s.m.track.live
}

// Heard returns when (mono time) the connection last proved, by a PONG,
// that it had delivered every invalidation Redis sent until then, if it
// has been tracking since epoch (a Tracking result). It takes no lock.
func (s *Subscriber) Heard(epoch uint64) (at time.Duration, ok bool) {
	f := s.m.fresh.Load()
	if f == nil || f.epoch != epoch {
		return 0, false
	}
	return f.at, true
}

// WaitTracking waits until tracking is live. It returns an error if Redis
// refused tracking on the current connection (it is asked again on the
// next one), if the subscriber does not track or is closed, or if ctx
// ends first.
func (s *Subscriber) WaitTracking(ctx context.Context) error {
	for {
		s.mu.Lock()
		tracker, closed, track, changed := s.m.tracker, s.m.closed, s.m.track, s.trackChanged
		s.mu.Unlock()
		switch {
		case tracker == nil:
			return errNotTracking
		case closed:
			return ErrClosed
		case track.live:
			return nil
		case track.refused != nil:
			return fmt.Errorf("redis refused tracking: %w", track.refused)
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}
