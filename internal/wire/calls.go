package wire

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// ErrRedis wraps every error talking to Redis.
var ErrRedis = errors.New("memolock: redis")

// LockLinger is how long a lock outlives a stored value, as "done:<token>"
// (at most as long as the value): see StoreSrc.
const LockLinger = time.Second

// Protocol makes the protocol's calls for one tag, routed by key through rdb.
type Protocol struct {
	rdb          redis.UniversalClient
	keys         Keys
	sc           *Scripts
	staleTTL     time.Duration // a copy of each value is kept this much longer; 0: none
	refreshAhead time.Duration // the window of a refresh ahead of expiry; 0: none
}

// New returns the protocol of keys through rdb. sharded selects SPUBLISH.
func New(rdb redis.UniversalClient, keys Keys, sharded bool, staleTTL, refreshAhead time.Duration) *Protocol {
	return &Protocol{rdb: rdb, keys: keys, sc: ScriptsFor(sharded), staleTTL: staleTTL, refreshAhead: refreshAhead}
}

// Keys returns the names the protocol uses.
func (p *Protocol) Keys() Keys { return p.keys }

// Linger is how long the lock stays done after a store or set of a value
// with ttl (see StoreSrc). With a refresh window, the done lock also keeps a
// new value from being refreshed before it is due: it lasts until the value
// enters the window, and a value whose TTL is under twice the window keeps
// it for its whole life, so that it expires as usual instead of being
// refreshed again and again.
func (p *Protocol) Linger(ttl time.Duration) time.Duration {
	if p.refreshAhead == 0 || ttl <= 0 {
		return LockLinger
	}
	if ttl <= 2*p.refreshAhead {
		return ttl
	}
	return min(LockLinger, ttl-p.refreshAhead)
}

// Runner runs the acquire script: straight, or batched with others, on
// one node. It reports whether another node answered (a redirection
// followed: see Reply.Elsewhere).
type Runner func(ctx context.Context, keys []string, args ...any) (res any, elsewhere bool, err error)

// AcquireArgs are the acquire script's arguments for token: window asks
// for a refresh ahead of expiry (0: none), withTTL for a hit's PTTL
// (Reply.ValueTTL). A flight makes them once for all its lookups.
func (p *Protocol) AcquireArgs(token string, lockTTL, window time.Duration, withTTL bool) []any {
	args := []any{token, lockTTL.Milliseconds()}
	if window > 0 || p.staleTTL > 0 || withTTL {
		stale, ttl := "0", "0"
		if p.staleTTL > 0 {
			stale = "1"
		}
		if withTTL {
			ttl = "1"
		}
		args = append(args, window.Milliseconds(), stale, ttl)
	}
	return args
}

// Acquire runs the acquire script through run with keys (Keys.ID of the
// id) and args (AcquireArgs of token). A busy reply that names token
// itself (a retry of an attempt whose reply was lost) is turned into
// Locked, with the lock's remaining time.
func (p *Protocol) Acquire(ctx context.Context, run Runner, keys []string, args []any) (Reply, error) {
	res, elsewhere, err := run(ctx, keys, args...)
	if err != nil {
		return Reply{}, fmt.Errorf("%w: reading %s: %w", ErrRedis, Quote(keys[0]), err)
	}
	r, ok := DecodeAcquire(res)
	if !ok {
		return Reply{}, fmt.Errorf("%w: reading %s: unexpected script reply %v", ErrRedis, Quote(keys[0]), res)
	}
	if r.Kind == Busy && r.Holder == args[0] {
		r.Kind = Locked
	}
	r.Elsewhere = elsewhere
	return r, nil
}

// ReadMigrating reads id with single-key commands, for a lookup that the
// acquire script cannot make while the id's slot is being migrated (see
// PROTOCOL.md, [Q4]): each command is answered by the source or redirected
// to the destination, whichever holds its key. It returns a Hit (flagged
// stale when a resurrection put the value back and stale copies are kept)
// or a cached NotFound, both Elsewhere; or false if there is neither: the
// caller must then wait for the migration and run the acquire script.
func (p *Protocol) ReadMigrating(ctx context.Context, id string) (Reply, bool, error) {
	var val, lock *redis.StringCmd
	var marker *redis.DurationCmd
	cmds, _ := p.rdb.Pipelined(ctx, func(pipe redis.Pipeliner) error {
		val = pipe.Get(ctx, p.keys.Value(id))
		lock = pipe.Get(ctx, p.keys.Lock(id))
		marker = pipe.PTTL(ctx, p.keys.NotFound(id))
		return nil
	})
	for _, c := range cmds {
		if err := c.Err(); err != nil && !errors.Is(err, redis.Nil) {
			return Reply{}, false, fmt.Errorf("%w: reading %s: %w", ErrRedis, Quote(p.keys.Value(id)), err)
		}
	}
	if v, err := val.Result(); err == nil {
		stale := p.staleTTL > 0 && strings.HasPrefix(lock.Val(), "stale:")
		return Reply{Kind: Hit, Value: []byte(v), Resurrected: stale, Elsewhere: true}, true, nil
	}
	if ttl := marker.Val(); ttl != -2 {
		return Reply{Kind: NotFound, PTTL: pttlOf(ttl), Elsewhere: true}, true, nil
	}
	return Reply{}, false, nil
}

// pttlOf turns go-redis's PTTL reply into the protocol's: negative for no
// expiry.
func pttlOf(d time.Duration) time.Duration {
	if d < 0 {
		return -1
	}
	return d
}

// Store runs the store script. It reports whether the value is stored; when
// it is not, the lease was lost and the script told waiters so.
// keys are Keys.ID of id, if the caller has them (nil: made here).
func (p *Protocol) Store(ctx context.Context, id string, keys []string, token string, val []byte, ttl time.Duration) (bool, error) {
	if keys == nil {
		keys = p.keys.ID(id)
	}
	n, err := p.sc.Store.Run(ctx, p.rdb, keys, token, val, TTLMillis(ttl),
		p.keys.Notif(id), p.keys.Events(id), p.Linger(ttl).Milliseconds(), p.staleTTL.Milliseconds()).Int()
	if err != nil {
		return false, fmt.Errorf("%w: storing %s: %w", ErrRedis, Quote(p.keys.Value(id)), err)
	}
	return n == 1, nil
}

// Publish runs the publish script: val goes to waiters, not into Redis. It
// reports whether the lease still held.
func (p *Protocol) Publish(ctx context.Context, id, token string, val []byte) (bool, error) {
	n, err := p.sc.Publish.Run(ctx, p.rdb, []string{p.keys.Lock(id)}, token, val, p.keys.Notif(id), p.keys.Events(id)).Int()
	if err != nil {
		return false, fmt.Errorf("%w: publishing %s: %w", ErrRedis, Quote(p.keys.Notif(id)), err)
	}
	return n == 1, nil
}

// NotFound runs the not-found script: fetch found nothing, which is
// recorded for negTTL (0: not at all). It reports whether the lease held.
func (p *Protocol) NotFound(ctx context.Context, id, token string, negTTL time.Duration) (bool, error) {
	n, err := p.sc.NotFound.Run(ctx, p.rdb, p.keys.ID(id), token, negTTL.Milliseconds(), p.keys.Events(id)).Int()
	if err != nil {
		return false, fmt.Errorf("%w: recording %s as not found: %w", ErrRedis, Quote(p.keys.Value(id)), err)
	}
	return n == 1, nil
}

// Resurrect runs the resurrect script: it returns the stale copy, now put
// back for d, or false if there is none or the lease was lost.
func (p *Protocol) Resurrect(ctx context.Context, id, token string, d time.Duration) ([]byte, bool, error) {
	v, err := p.sc.Resurrect.Run(ctx, p.rdb, []string{p.keys.Value(id), p.keys.Lock(id), p.keys.Stale(id)},
		token, d.Milliseconds(), p.keys.Events(id)).Text()
	switch {
	case errors.Is(err, redis.Nil):
		return nil, false, nil
	case err != nil:
		return nil, false, fmt.Errorf("%w: serving the stale copy of %s: %w", ErrRedis, Quote(p.keys.Value(id)), err)
	}
	return []byte(v), true, nil
}

// Release deletes the lock if it still holds token (or, with a linger,
// keeps it as done for at most that long, see ReleaseSrc), and publishes
// event (none if empty). It reports whether it did.
func (p *Protocol) Release(ctx context.Context, id, token, event string, linger time.Duration) (bool, error) {
	n, err := p.sc.Release.Run(ctx, p.rdb, []string{p.keys.Lock(id), p.keys.Value(id)}, token, p.keys.Events(id), event, linger.Milliseconds()).Int()
	if err != nil {
		return false, fmt.Errorf("%w: releasing %s: %w", ErrRedis, Quote(p.keys.Lock(id)), err)
	}
	return n == 1, nil
}

// Abandoned tells waiters that the lock with token is gone, whoever holds
// the lock now: waiters of another holder ignore it.
func (p *Protocol) Abandoned(ctx context.Context, id, token string) error {
	return p.Event(ctx, id, AbandonEvent(token))
}

// Event publishes an event on id's events channel, whoever holds the lock.
func (p *Protocol) Event(ctx context.Context, id, event string) error {
	publish := p.rdb.Publish
	if p.sc.Sharded {
		publish = p.rdb.SPublish
	}
	if err := publish(ctx, p.keys.Events(id), event).Err(); err != nil {
		return fmt.Errorf("%w: publishing on %s: %w", ErrRedis, Quote(p.keys.Events(id)), err)
	}
	return nil
}

// Delete runs the delete script; it reports whether a value was there.
func (p *Protocol) Delete(ctx context.Context, id string) (bool, error) {
	n, err := p.sc.Del.Run(ctx, p.rdb, p.keys.ID(id), p.keys.Events(id)).Int()
	if err != nil {
		return false, fmt.Errorf("%w: deleting %s: %w", ErrRedis, Quote(p.keys.Value(id)), err)
	}
	return n == 1, nil
}

// Set runs the set script with a token of its own.
func (p *Protocol) Set(ctx context.Context, id, token string, val []byte, ttl time.Duration) error {
	err := p.sc.Set.Run(ctx, p.rdb, p.keys.ID(id), token, val, TTLMillis(ttl), p.keys.Notif(id),
		p.Linger(ttl).Milliseconds(), p.staleTTL.Milliseconds()).Err()
	if err != nil {
		return fmt.Errorf("%w: setting %s: %w", ErrRedis, Quote(p.keys.Value(id)), err)
	}
	return nil
}

// Peeked is what the peek script read for one id.
type Peeked struct {
	Value        []byte
	Found        bool
	TTL          time.Duration // -1: no expiry
	Resurrected  bool          // the value is a stale copy put back
	NotFound     bool
	NotFoundTTL  time.Duration
	StaleCopyTTL time.Duration // 0: no copy
	Holder       string
	HolderTTL    time.Duration
}

// Peek runs the peek script.
func (p *Protocol) Peek(ctx context.Context, id string) (Peeked, error) {
	return p.PeekOn(ctx, p.rdb, id)
}

// PeekOn runs the peek script through c: on a cluster, one node's own
// client, which answers a redirection with an error instead of following
// it.
func (p *Protocol) PeekOn(ctx context.Context, c redis.Scripter, id string) (Peeked, error) {
	res, err := Peek.Run(ctx, c, p.keys.ID(id)).Slice()
	if err == nil && len(res) != 7 {
		err = fmt.Errorf("unexpected script reply %v", res)
	}
	if err != nil {
		return Peeked{}, fmt.Errorf("%w: peeking at %s: %w", ErrRedis, Quote(p.keys.Value(id)), err)
	}
	var pk Peeked
	if v, ok := res[0].(string); ok {
		pk.Value, pk.Found, pk.TTL = []byte(v), true, peekTTL(res[1])
	}
	if h, ok := res[2].(string); ok {
		pk.Holder, pk.HolderTTL = h, peekTTL(res[3])
		pk.Resurrected = pk.Found && strings.HasPrefix(h, "stale:")
	}
	if ms, _ := res[4].(int64); ms != -2 && !pk.Found {
		pk.NotFound, pk.NotFoundTTL = true, peekTTL(res[4])
	}
	if _, ok := res[5].(string); ok {
		pk.StaleCopyTTL = peekTTL(res[6])
	}
	return pk, nil
}

func peekTTL(v any) time.Duration {
	ms, _ := v.(int64)
	if ms < 0 {
		return -1
	}
	return MsDuration(ms)
}
