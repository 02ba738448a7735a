package engine

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/memolock/memolock/internal/l1"
	"github.com/memolock/memolock/internal/wire"
)

// get returns the value of id, whose key (as sent to Redis) is key: from
// the L1, or through the flight for key, which it joins or starts. Exactly
// one of fetch and start is set; ctx is not nil and not done. It is a
// whole Get for the engine's own goroutines (GetMany's workers), which
// join and wait in one call. Its error is the engine's, where a
// calledError stands for a callback's (see reveal), so that asking it runs
// none of the callback error's methods. A user's Get joins with Join and
// waits in its own frame (see Wait.Done).
func (e *Engine) get(ctx context.Context, id, key string, fetch Fetcher, start StartFunc) ([]byte, Served, error) {
	w := Wait{raw: true}
	val, served, err := e.Join(&w, ctx, id, key, fetch, start)
	if w.Pending() {
		<-w.Done()
		return w.AnswerKept()
	}
	return val, served, err
}

// A Wait is a call that joined or led a flight and waits for its answer:
// Join hands it to its caller, whose own frame waits (see Join). A zero
// Wait is not Pending; call Done, Answer and Wait only on one that is.
type Wait struct {
	f       *flight
	observe bool // the call is timed or traced: Answer ends it (observed)
	raw     bool // the engine's own call (see Engine.get), or Unrevealed: its error is not revealed
	e       *Engine
	cl      callSpan
}

// Unrevealed makes the call that w waits for answer a callback's error as
// the engine keeps it, asking it nothing more, if Join answers it; if Join
// leaves w pending, take the answer with AnswerKept. Either way the caller
// takes the error back with Reveal. Call it before Join.
func (w *Wait) Unrevealed() { w.raw = true }

// Reveal returns the error that a caller gets for err, the answer of a
// call made Unrevealed, and whether it matches ErrNotFound: for a
// callback's error, from what tame asked it once (see calledError), so
// that no method of it runs again, here either.
func Reveal(err error) (error, bool) {
	if c, ok := err.(*calledError); ok {
		return c.err, c.Is(ErrNotFound)
	}
	return err, errors.Is(err, ErrNotFound)
}

// Pending reports whether w has an answer to wait for.
func (w *Wait) Pending() bool { return w.f != nil }

// Wait waits for the answer of the flight that w joined, and returns it:
// Done and Answer in one call, for callers that are not woken by the
// thousand.
func (w *Wait) Wait() ([]byte, Served, error) {
	<-w.Done()
	return w.Answer()
}

// Done is closed once w's answer is in. A caller that waits with a
// thousand others receives from it in its own frame, and returns through
// nothing else: each frame more was a cache line or two to fetch again
// for each caller, and a tenth more time for a process to wake them all
// (see BenchmarkWakeupProcesses). Done and Answer are small enough to be
// inlined there.
func (w *Wait) Done() <-chan struct{} { return w.f.done }

// Answer returns w's answer, once Done is closed, with a callback's error
// as the callback returned it (see reveal).
func (w *Wait) Answer() ([]byte, Served, error) {
	if w.observe {
		w.observed()
	}
	return w.f.val, w.f.served, w.f.revealed
}

// AnswerKept is Answer for a call made Unrevealed, or the engine's own:
// a callback's error comes as the engine keeps it, for Reveal.
func (w *Wait) AnswerKept() ([]byte, Served, error) {
	if w.observe {
		w.observed()
	}
	return w.f.val, w.f.served, w.f.err
}

// observed ends a timed or traced call that waited, once: a second Answer
// records nothing more.
//
//go:noinline
func (w *Wait) observed() {
	w.observe = false
	w.e.observe(&w.cl, w.f.served, w.f.err)
}

// Join is a Get (see get) up to the wait. It returns the answer, unless it leaves w
// pending: the call joined or led a flight, and its context has no Done
// channel. The caller then waits on w.Done and takes w.Answer in its own
// frame (see Done). Join keeps the call's observation in w, which must not
// be copied until then.
func (e *Engine) Join(w *Wait, ctx context.Context, id, key string, fetch Fetcher, start StartFunc) ([]byte, Served, error) {
	if e.l1 != nil {
		if val, served, ok, err := e.Cached(id, key); ok {
			return val, served, err
		}
	}
	// What only a flight's first caller does (lead) or a traced call
	// needs is done in frames of its own, which a waiting caller does not
	// keep on its stack (see BenchmarkMassExpiry's B/waiter).
	cl := &w.cl
	e.begin(cl, ctx)
	f, err := e.flights.find(key)
	switch {
	case f != nil:
		err = e.joinFound(cl, f)
	case err == nil:
		f, err = e.lead(cl, id, key, fetch, start)
	}
	if err != nil {
		e.stats.answered(0, err)
		e.observe(cl, 0, err)
		return nil, 0, err
	}
	if ctx.Done() == nil {
		w.f, w.observe, w.e = f, !cl.t0.IsZero() || cl.span != nil, e
		return nil, 0, nil
	}
	val, served, err := e.awaitOrLeave(ctx, f)
	e.observe(cl, served, err)
	if !w.raw {
		err = reveal(err)
	}
	return val, served, err
}

// lead makes and launches the flight of a Get that found none.
//
//go:noinline
func (e *Engine) lead(cl *callSpan, id, key string, fetch Fetcher, start StartFunc) (*flight, error) {
	return e.newFlight(cl, &flightSpec{id: id, key: key, kind: forGet, fetch: fetch, start: start})
}

// joinFound joins f, a flight that find returned.
func (e *Engine) joinFound(cl *callSpan, f *flight) error {
	if err := e.reentered(f); err != nil {
		return err
	}
	if f.span != nil {
		e.joined(cl, f)
	}
	return nil
}

// Cached answers a Get from the L1, if it holds key, and counts the answer.
func (e *Engine) Cached(id, key string) ([]byte, Served, bool, error) {
	if e.l1 == nil || e.closing.Load() {
		return nil, 0, false, nil
	}
	// A value, the common hit, is served and counted without more ado.
	v, kind, ok := e.l1.Get(key)
	switch {
	case !ok:
		return nil, 0, false, nil
	case kind == l1.Value:
		e.stats.answers[ServedL1][gotValue].Add(1)
		return v, ServedL1, true, nil
	}
	a := e.l1Answer(id, v, kind)
	e.stats.answered(a.served, a.err)
	return a.val, a.served, true, a.err
}

// fromL1 answers from the L1, if it holds key. The caller counts the answer.
func (e *Engine) fromL1(id, key string) (answer, bool) {
	if e.l1 == nil || e.closing.Load() {
		return answer{}, false
	}
	v, kind, ok := e.l1.Get(key)
	if !ok {
		return answer{}, false
	}
	return e.l1Answer(id, v, kind), true
}

// l1Answer is the answer of an L1 entry of id.
func (e *Engine) l1Answer(id string, v []byte, kind l1.Kind) answer {
	switch kind {
	case l1.NotFound:
		return answer{served: ServedL1, err: e.notFoundErr(id)}
	case l1.Stale:
		e.stats.servedStale.Add(1)
		return answer{val: v, served: ServedStale}
	}
	return answer{val: v, served: ServedL1}
}

// flightSpec is what join makes a flight of, if it makes one.
type flightSpec struct {
	id, key string
	kind    flightKind
	fetch   Fetcher
	start   StartFunc
	member  batchPart
}

// join joins the flight for tmpl's key, or starts one like tmpl, which it
// launches. The flight is made outside the group's lock: making it runs the
// tracer's sampler and reads crypto/rand, and neither may hold up other
// callers.
func (e *Engine) join(cl *callSpan, tmpl *flightSpec) (*flight, error) {
	f, err := e.flights.find(tmpl.key)
	if err != nil || f != nil {
		if f != nil {
			err = e.joinFound(cl, f)
		}
		return f, err
	}
	return e.newFlight(cl, tmpl)
}

// newFlight makes a flight like tmpl and launches it, unless another caller
// made one meanwhile, which it joins.
func (e *Engine) newFlight(cl *callSpan, tmpl *flightSpec) (*flight, error) {
	if tmpl.kind == forGet {
		e.trace(cl, tmpl.id) // a GetMany batch's flights are not traced
	}
	f := &flight{id: tmpl.id, key: tmpl.key, kind: tmpl.kind, fetch: tmpl.fetch, start: tmpl.start, member: tmpl.member,
		span: cl.span, done: make(chan struct{})}
	f.token, f.claim = e.claimSpan(cl.ctx, f)
	led, leader, err := e.flights.lead(f, &e.work)
	if !leader {
		f.endClaim() // made for nothing: another caller made the flight meanwhile
		if led != nil {
			e.joined(cl, led)
		}
		return led, err
	}
	e.launch(f, cl.ctx)
	return f, nil
}

// reentered refuses a call made from inside one of f's own callbacks (a
// fetch, start or OnWait that asks for the id it serves): it would wait for
// itself. The call that joined is dropped from f again.
func (e *Engine) reentered(f *flight) error {
	if f.inCallback.Load() == 0 {
		return nil // none of f's callbacks runs: spare the stack read
	}
	if cur, ok := e.callbacks.current(); !ok || !slices.Contains(cur, f) {
		return nil
	}
	if _, left := e.flights.leave(f); !left {
		// Finished meanwhile (Close, or a value pushed while OnWait
		// ran), and counted with this call: it takes that answer,
		// which waits for nothing, as await does.
		return nil
	}
	return reentryError(f.id)
}

// reentryError is the error of a call for id from inside a callback that
// serves it.
func reentryError(id string) error {
	return fmt.Errorf("%w: id %s asked for from inside the fetch (or start, or batch, or OnWait) that serves it, which would wait for itself", ErrInvalid, wire.Quote(id))
}

// joined marks a call that joined a flight another caller leads.
func (e *Engine) joined(cl *callSpan, f *flight) {
	if f.span == nil {
		// Untraced flights: a thousand callers joining one that nobody
		// traces must not each start a span for nothing.
		return
	}
	if cl.span == nil {
		e.trace(cl, f.id)
	}
	cl.joined(f)
}

// launch makes f's first lookup and pursues the rest. A caller that cannot
// leave (its context has no Done channel) does both on its own goroutine,
// so that neither a hit nor a miss that waits on another holder costs a
// goroutine (but a GetMany member's pursuit has one, and so has one that
// calls back into the user's code: see pursueHere); a caller that may
// leave must not wait on Redis itself, as go-redis ignores context
// deadlines by default, and its flight gets a goroutine of its own.
func (e *Engine) launch(f *flight, ctx context.Context) {
	if f.member != nil {
		f.member.launched(f)
	}
	if ctx.Done() != nil {
		e.flights.launch(f, ctx)
		go e.run(f, nil)
		return
	}
	a := e.first(ctx, f)
	if a.hit() {
		p := pursuit{e: e, f: f, ctx: ctx}
		val, err := p.found(a.r)
		if later := e.conclude(&p, val, err); later != nil {
			go func() {
				defer e.work.done()
				later()
			}()
		} else {
			e.work.done()
		}
		return
	}
	e.flights.launch(f, ctx)
	if f.member != nil {
		// A GetMany batch starts its members one after another on its
		// goroutine: each pursues on its own.
		later := a
		go e.run(f, &later)
		return
	}
	e.pursueHere(f, a)
}

// pursueHere pursues f past its first lookup, a, on its leader's goroutine,
// which cannot leave (its context has no Done channel) and would only wait
// for f's answer: a miss that waits on another holder then costs no
// goroutine of its own (see BenchmarkMassMiss). The leader pursues only
// while the pursuit watches for its answer (Close, or a value pushed to
// it): before a user callback (fetch, start, OnWait), which Close waits
// for but must not make the leader wait for, the rest of the pursuit goes
// on a goroutine, and so does the work that can wait until the callers
// have their answer, so that the leader returns with the others.
//
//go:noinline
func (e *Engine) pursueHere(f *flight, a attempt) {
	p := &pursuit{e: e, f: f, ctx: f.ctx, inline: true}
	val, err, rest := p.pursueFrom(&a)
	if rest {
		p.inline = false
		go e.resume(p, a)
		return
	}
	if p.own || p.maybeLocked || p.after != nil {
		// Its end has Redis to write to once the callers have their
		// answer (a lock to release, a failure to tell): the leader, a
		// caller too, must not wait for that. Rare: a failed lookup or
		// fetch, or an external producer's lock.
		go func() {
			defer e.work.done()
			if later := e.conclude(p, val, err); later != nil {
				later()
			}
		}()
		return
	}
	if later := e.conclude(p, val, err); later != nil {
		go func() {
			defer e.work.done()
			later()
		}()
		return
	}
	e.work.done()
}

// resume is the goroutine of a flight whose leader pursued it up to a,
// an outcome that calls back into the user's code: it pursues the rest,
// answers the callers, then does what could wait.
func (e *Engine) resume(p *pursuit, a attempt) {
	defer e.work.done()
	val, err := p.pursue(a)
	if later := e.conclude(p, val, err); later != nil {
		later()
	}
}

// run is a flight's goroutine: it pursues the value from the first
// lookup's outcome (making that lookup if the caller did not), answers the
// callers, then does what could wait.
func (e *Engine) run(f *flight, a *attempt) {
	defer e.work.done()
	if a == nil {
		first := e.first(f.ctx, f)
		a = &first
	}
	p := &pursuit{e: e, f: f, ctx: f.ctx}
	val, err := p.pursue(*a)
	if later := e.conclude(p, val, err); later != nil {
		later()
	}
}

// first makes a flight's first lookup, and tells a batch member its outcome.
func (e *Engine) first(ctx context.Context, f *flight) attempt {
	a := e.lookup(ctx, f)
	if f.member != nil {
		f.member.looked(a.won(e.cfg.FailOpen))
	}
	return a
}

// lookup runs the acquire script for f on the node that owns its key, or
// fails at once while that node is unreachable.
func (e *Engine) lookup(ctx context.Context, f *flight) attempt {
	n, err := e.nodes.check(ctx, f.key)
	if err != nil {
		return attempt{err: err}
	}
	if e.l1 != nil && f.look == nil {
		f.look = &lookupState{l1: e.snap(n, f.key), l1From: n} // before anything is read
	}
	reads := e.readsFirst(f)
	if reads && !f.looked {
		if a, ok := e.readFirst(ctx, f, n); ok {
			f.looked = true
			return a
		}
	}
	f.looked = true
	if f.lookupKeys() == nil {
		// Made at the first script: a hit read first needs none of it.
		window := e.cfg.RefreshAhead
		if f.kind != forGet || f.start != nil {
			window = 0 // only Get refreshes ahead: see refresh
		}
		if f.token == "" {
			f.token = wire.NewToken()
		}
		look := f.looks()
		look.keys = e.keys.ID(f.key)
		look.args = e.proto.AcquireArgs(f.token, e.cfg.LockTTL, window, e.l1 != nil)
	}
	a := e.lookupOn(ctx, f, n)
	if reads && a.err == nil && a.r.Kind == wire.Hit {
		e.hints.found(f.key, e.keys.Value, time.Now().UnixNano())
	}
	if e.l1 != nil && (n != f.look.l1From || a.r.Elsewhere) {
		// Read from a node whose invalidations the snap did not follow.
		f.look.l1 = l1.Snap{}
	}
	return a
}

// lookupOn runs the acquire script for f on node n.
func (e *Engine) lookupOn(ctx context.Context, f *flight, n *node) attempt {
	r, err := e.proto.Acquire(ctx, n.batch.run, f.look.keys, f.look.args)
	if err != nil && slotMoving(err) {
		return e.lookupMigrating(ctx, f, n)
	}
	if err != nil {
		n.down.report(err)
		return attempt{err: err, sent: mayHaveRun(err)}
	}
	return attempt{r: r}
}

// conclude answers the callers of p's flight with what p found, then
// returns the work that can wait until they have it (nil if none): a
// refresh ahead of expiry, or filling the L1.
func (e *Engine) conclude(p *pursuit, val []byte, err error) func() {
	f := p.f
	n := e.finish(f, answer{val: val, err: err, served: p.served})
	f.endClaim()
	_, o := outcomeOf(p.served, err)
	p.recordWait(o)
	p.end()
	if f.member != nil {
		f.member.settled()
	}
	switch {
	case p.refresh:
		ctx := p.ctx // not p, which a first lookup made inline keeps on its stack
		return func() { e.refresh(f, ctx) }
	case e.l1 == nil || n < 0:
	case p.served == ServedStale && p.resurrected && err == nil:
		// A stale copy put back after a failed fetch, read from Redis:
		// readers here get it from the L1 too, flagged stale.
		return e.promotion(p, f, val, true)
	case p.served != ServedRedis:
	case p.notFound:
		e.l1.PutNotFound(f.key, p.notFoundTTL, f.l1Snap())
	case err == nil:
		// A value that came while waiting was just stored by its holder,
		// whose write invalidates it: promoting it would be a wasted
		// round trip. One found at once enters with the time it has left.
		return e.promotion(p, f, val, false)
	}
	return nil
}

// promotion puts a value found in Redis into the L1 with the time it has
// left, which the lookup's reply brought (every lookup asks for it when
// there is an L1).
func (e *Engine) promotion(p *pursuit, f *flight, val []byte, stale bool) func() {
	switch {
	case !p.hasTTL || p.valueTTL == 0:
	case stale:
		e.l1.PutStale(f.key, val, p.valueTTL, f.l1Snap())
	default:
		e.l1.Put(f.key, val, e.l1TTL(p.valueTTL), f.l1Snap())
	}
	return nil
}

// finish answers f's callers, and counts their answers; it returns how many
// it answered, or -1 if f was finished already (by Close, or by a value
// pushed while it waited).
func (e *Engine) finish(f *flight, a answer) int { return e.flights.finish(f, a) }

// deliver is finish for a value pushed to a waiting flight (see
// group.deliver).
func (e *Engine) deliver(f *flight, a answer) int { return e.flights.deliver(f, a) }

// attempt is the outcome of one lookup.
type attempt struct {
	r   wire.Reply
	err error
	// sent is set when the acquire script may have run despite err: the
	// lock may hold the flight's token.
	sent bool
}

// hit reports whether the lookup found the value.
func (a attempt) hit() bool {
	return a.err == nil && (a.r.Kind == wire.Hit || a.r.Kind == wire.Refresh)
}

// won reports whether the flight is about to compute: it took the lock, or
// Redis is out of reach and failOpen computes without one.
func (a attempt) won(failOpen bool) bool {
	return (a.err == nil && a.r.Kind == wire.Locked) || (a.err != nil && failOpen && isOutage(a.err))
}
