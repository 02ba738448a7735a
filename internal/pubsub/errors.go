package pubsub

import (
	"errors"
	"net"
	"strings"

	"github.com/redis/go-redis/v9"
)

// ErrClosed is the error of WaitTracking on a closed Subscriber, and of
// SubscriberFor on a closed Router.
var ErrClosed = errors.New("subscriber closed")

// errUnasked is the cause of a connection given up for a reply that no
// command asked for: go-redis replaced it behind our back.
var errUnasked = errors.New("a reply nobody asked for (the connection was replaced)")

// errSilent is the cause of a connection given up for its silence.
var errSilent = errors.New("no answer to a probe PING")

// errNoChannels is the error of a watch of no channels.
var errNoChannels = errors.New("Watch needs at least one channel")

// isReply reports whether err is an error reply from Redis: the
// connection answered, and works.
func isReply(err error) bool {
	var reply redis.Error
	return errors.As(err, &reply)
}

// isTransient reports whether an error reply is a passing state of the
// server (a long script, a dataset loading, a replica without its
// master): the same command may succeed a little later.
func isTransient(err error) bool {
	return hasPrefix(err, "BUSY", "LOADING", "MASTERDOWN", "TRYAGAIN")
}

// isMoved reports whether an error reply means that the node does not
// serve the slot now.
func isMoved(err error) bool {
	return hasPrefix(err, "MOVED ", "ASK ", "CLUSTERDOWN", "TRYAGAIN")
}

func hasPrefix(err error, prefixes ...string) bool {
	msg := err.Error()
	for _, p := range prefixes {
		if strings.HasPrefix(msg, p) {
			return true
		}
	}
	return false
}

// isTimeout reports whether err is a read that timed out: go-redis keeps
// the connection after a ReceiveTimeout that expires.
func isTimeout(err error) bool {
	var nerr net.Error
	return errors.As(err, &nerr) && nerr.Timeout()
}

// isFlush reports whether err is go-redis failing to decode a tracking
// invalidation with a nil payload, which Redis sends on FLUSHALL and
// FLUSHDB: "every key changed". go-redis read the whole reply and keeps
// the connection.
func isFlush(err error) bool {
	return strings.Contains(err.Error(), "unsupported pubsub message payload: <nil>")
}
