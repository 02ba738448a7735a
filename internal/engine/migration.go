package engine

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// Slot migrations. While a cluster moves a slot from one master to another,
// Redis refuses a script whose keys are not all on the slot's source node
// (TRYAGAIN), and go-redis gives up following MOVED and ASK after a few
// redirections. A migration of a slot with many keys can take seconds: the
// protocol's calls wait for it, with short pauses, instead of failing.

// migrationPause is the longest pause between two lookups of an id whose
// slot is being migrated.
const migrationPause = 100 * time.Millisecond

// lookupMigrating looks up an id whose slot is being migrated. Redis
// refuses a script whose keys are not all on the slot's source node with
// TRYAGAIN, for as long as the migration takes: the acquire script declares
// four keys, of which usually only the value exists. A stored value (or a
// cached "not found") is read with single-key commands, which Redis answers
// or redirects with ASK, which go-redis follows: a read of a stored id
// never fails during resharding. A missing one is looked up again, with
// pauses, until the migration of its keys is over, or the flight ends.
func (e *Engine) lookupMigrating(ctx context.Context, f *flight, n *node) attempt {
	pause := 5 * time.Millisecond
	for {
		r, found, err := e.proto.ReadMigrating(ctx, f.key)
		switch {
		case found:
			return attempt{r: r}
		case err != nil && !slotMoving(err):
			n.down.report(err)
			return attempt{err: err}
		}
		t := time.NewTimer(pause)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return attempt{err: fmt.Errorf("%w: %w", ErrTimeout, ctx.Err())}
		}
		pause = min(2*pause, migrationPause)
		r, err = e.proto.Acquire(ctx, n.batch.run, f.look.keys, f.look.args)
		switch {
		case err == nil:
			return attempt{r: r}
		case !slotMoving(err):
			n.down.report(err)
			return attempt{err: err, sent: mayHaveRun(err)}
		}
	}
}

// slotMoving reports whether err is a reply of a node whose slot is being
// migrated: TRYAGAIN (a multi-key command whose keys are not all there),
// or a MOVED or ASK redirection that go-redis stopped following. go-redis
// follows at most MaxRedirects (3) of them for a command, and counts a
// TRYAGAIN among them: a lookup sent to the source, asked to the
// destination, refused there with TRYAGAIN, and so on, runs out of them
// and returns the last reply. None of these replies ran the command.
func slotMoving(err error) bool {
	var reply redis.Error
	if !errors.As(err, &reply) {
		return false
	}
	msg := reply.Error()
	return strings.HasPrefix(msg, "TRYAGAIN") || strings.HasPrefix(msg, "MOVED ") || strings.HasPrefix(msg, "ASK ")
}

// passing reports whether a write refused with err may be made again
// once a slot has settled: slotMoving, or CLUSTERDOWN, which a node
// answers for a moment while a failover hands its slots over (go-redis's
// own few retries may not outlast it: seen under load, in a store). A
// cluster that stays down is reported after clusterDownFor.
func passing(err error) bool { return slotMoving(err) || clusterDown(err) }

// clusterDown reports whether err is a CLUSTERDOWN reply.
func clusterDown(err error) bool {
	var reply redis.Error
	return errors.As(err, &reply) && strings.HasPrefix(reply.Error(), "CLUSTERDOWN")
}

// clusterDownFor bounds how long a call waits out CLUSTERDOWN replies: a
// graceful failover shows them for a moment (go-redis's own few retries
// may not outlast it, seen under load in a store), a cluster that is down
// for longer is reported.
const clusterDownFor = 2 * time.Second

// throughMigration runs call, and again while it meets a slot migration
// or a failover (passing), with pauses growing to migrationPause, for at most LockTTL
// (a lease cannot outlive it; nor should any call wait longer for a slot),
// or until ctx ends or Close begins. It returns call's last error. On a
// single node it runs call once.
func (e *Engine) throughMigration(ctx context.Context, call func() error) error {
	err := call()
	if err == nil || e.cfg.Cluster == nil || !passing(err) {
		return err
	}
	bound := time.NewTimer(e.cfg.LockTTL)
	defer bound.Stop()
	pause := 5 * time.Millisecond
	var downSince time.Time
	for {
		if clusterDown(err) {
			if downSince.IsZero() {
				downSince = time.Now()
			} else if time.Since(downSince) > clusterDownFor {
				return err
			}
		} else {
			downSince = time.Time{}
		}
		t := time.NewTimer(pause)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return err
		case <-bound.C:
			t.Stop()
			return err
		case <-e.lifetime.Done():
			t.Stop()
			return err
		}
		pause = min(2*pause, migrationPause)
		if err = call(); err == nil || !passing(err) {
			return err
		}
	}
}
