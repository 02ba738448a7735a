// Package pubsub fans the messages of Redis pub/sub connections out to
// watches: a waiter's interest in a few channels. It is memolock's
// subscriber, and it imports nothing of memolock.
//
// # Who owns what
//
// A Subscriber serves one pub/sub connection (a go-redis *PubSub) at a time.
// Two goroutines work on it, and neither holds a lock across a network
// call:
//
//   - The owner (Subscriber.run) alone writes to the connection:
//     SUBSCRIBE, UNSUBSCRIBE, their sharded forms and PING. It alone opens,
//     closes and replaces the connection, and it alone sleeps (burst
//     gathering, the unsubscribe delay, the reconnect backoff).
//   - The reader (Subscriber.read), one per connection, only receives and
//     delivers: it hands each message to the watches of its channel, each
//     invalidation to Config.OnInvalidate, and each reply to the state
//     machine. It ends when its connection is replaced.
//
// The protocol state (which channels are subscribed on the current
// connection, which replies it still owes, which watches are live, whether
// it tracks) is a machine that does no I/O. It belongs to the Subscriber's
// mutex: the owner asks it what to send next, the reader tells it what
// arrived, and watchers add, stop and sync watches through it. Each call
// returns effects (mailbox entries, value callbacks, pokes, log lines)
// that the caller carries out after it has released the mutex.
//
// A Watch's mailbox has a mutex of its own; its signal channel has room for
// one wake-up and is poked without blocking. A slow waiter therefore never
// stalls the reader, and never loses a message: everything waits in the
// mailbox until Take. An onValue callback runs on the reader, outside
// every lock, before the watch is poked; it and OnInvalidate must not
// block.
//
// # Liveness
//
// Redis acknowledges SUBSCRIBE asynchronously and pub/sub is at-most-once,
// so a watch is live only once a marker PING sent after its SUBSCRIBE has
// come back (replies on one connection are ordered); it is then told to
// re-read. go-redis reconnects and resubscribes inside any PubSub call
// that meets a broken connection, and what was published in the gap is
// lost; so every error from any PubSub call, and every reply that the
// connection did not owe, means "connection replaced": the owner closes
// it, opens another with backoff, subscribes everything again, and every
// watch re-reads once its new marker is back. A connection that goes
// silent gets a probe PING after Config.Health, and is replaced if nothing
// arrives for as long again.
//
// A Router serves a Redis Cluster with one sharded Subscriber per master,
// and moves watches between them when slots move. Close stops every
// goroutine the package started, each within the time given.
package pubsub
