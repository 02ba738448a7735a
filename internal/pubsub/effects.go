package pubsub

import "github.com/redis/go-redis/v9"

// effects is what a step of the machine asks its caller to do, after the
// caller has released the subscriber's mutex, in this order: the notes
// (mailboxes), then the value callbacks and invalidations, then a poke of
// every watch noted.
type effects struct {
	notes         []note
	values        []valueCall
	invalidations [][]string // keys invalidated, in order; nil: every key
	warnings      []warning

	lost     error // why the connection was given up, if it just was
	stop     bool  // the reader must stop: its connection is done
	wake     bool  // the owner has work
	broke    bool  // liveness ended: a broken connection, or a dial (OnBreak)
	moved    bool  // watches moved to another node (a Router reloads its slots)
	tracking bool  // the tracking state changed (WaitTracking looks again)
	// trackingRefused: Redis refused tracking on this connection.
	trackingRefused bool
}

type noteKind int

const (
	noteMessage noteKind = iota
	noteReread
	noteMoved
	noteSynced
	noteClosed
	noteErr
)

// note is one event for one watch's mailbox.
type note struct {
	w    *Watch
	kind noteKind
	msg  *redis.Message // noteMessage
	err  error          // noteErr
}

// valueCall is an onValue callback to run with payload.
type valueCall struct {
	f       func(string)
	payload string
}

// warning is a refusal to log.
type warning struct {
	what    string // the command Redis refused
	channel string // the channel it named, if one
	err     error
}

func (fx *effects) add(w *Watch, kind noteKind) {
	fx.notes = append(fx.notes, note{w: w, kind: kind})
}
