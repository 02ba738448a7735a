package memolock

import (
	"fmt"
	"strings"

	"github.com/memolock/memolock/internal/wire"
)

// KeyScheme names the Redis keys and channels of one tag. It is the scheme of
// the original redis-memolock, so its Go and C# peers interoperate:
//
//	<tag>:<id>            the value, a plain string
//	<tag>/lock:<id>       the lock, holding the holder's token
//	<tag>/notif:<id>      the channel on which the value is published
//
// memolock adds one channel that the original peers never read, and the
// keys of its standalone locks (Client.TryLock):
//
//	<tag>/lock-event:<id>      holder failures, for memolock peers only
//	<tag>/lock-notfound:<id>   a cached "not found" (Options.NegTTL)
//	<tag>/lock-stale:<id>      a copy of the value kept past its TTL (Options.StaleTTL)
//	<tag>/lock-mutex:<sha256>  the lock TryLock takes for a name
//
// Within one tag no id can make a value key equal a lock key. Across tags,
// a tag containing "/lock" or "/notif" could, so NewKeyScheme rejects it. One
// case remains: with tags "app" and "app:x", the id "x/lock:y" of "app" names
// the lock of id "y" of "app:x". If ids come from untrusted input and tags
// nest like that, set Options.HashIDs.
type KeyScheme struct {
	tag string
}

// NewKeyScheme validates tag and returns its scheme.
func NewKeyScheme(tag string) (KeyScheme, error) {
	if tag == "" {
		return KeyScheme{}, fmt.Errorf("%w: tag is empty; pass a name such as \"likes\"", ErrInvalid)
	}
	for _, part := range []string{"/lock", "/notif"} {
		if strings.Contains(tag, part) {
			return KeyScheme{}, fmt.Errorf("%w: tag %q contains %q, which would collide with the lock keys and channels of tag %q",
				ErrInvalid, tag, part, tag[:strings.Index(tag, part)])
		}
	}
	return KeyScheme{tag: tag}, nil
}

// wire is the scheme as the protocol names it.
func (k KeyScheme) wire() wire.Keys { return wire.NewKeys(k.tag) }

// Tag returns the scheme's tag.
func (k KeyScheme) Tag() string { return k.tag }

// Value returns the key holding the value of id.
func (k KeyScheme) Value(id string) string { return k.wire().Value(id) }

// Lock returns the key of the lock on id.
func (k KeyScheme) Lock(id string) string { return k.wire().Lock(id) }

// Notif returns the channel on which the value of id is published.
func (k KeyScheme) Notif(id string) string { return k.wire().Notif(id) }

// Events returns the channel on which memolock peers report that the holder
// of the lock on id gave up without a value.
func (k KeyScheme) Events(id string) string { return k.wire().Events(id) }

// NotFound returns the key that records that fetch found nothing for id
// (Options.NegTTL).
func (k KeyScheme) NotFound(id string) string { return k.wire().NotFound(id) }

// Stale returns the key holding a copy of the value of id that outlives it
// by Options.StaleTTL.
func (k KeyScheme) Stale(id string) string { return k.wire().Stale(id) }

// PlaceID returns the id that Options.HashTags sends to Redis in place of
// id (already hashed, with HashIDs): id in braces, so that every key and
// channel of id hashes by the same tag, and no two ids share one (an id
// that holds braces of its own is wrapped too: "{x}" goes as "{{x}}").
// Redis hashes what lies between a key's first "{" and the first "}" after
// it, and ignores an empty tag: it reports false for the ids that would
// make one, the empty id and ids that start with "}".
func PlaceID(id string) (string, bool) { return wire.PlaceID(id) }

// wireID returns id as the client sends it to Redis: hashed with
// Options.HashIDs, placed with Options.HashTags.
func (c *Client) wireID(id string) (string, error) {
	key := id
	if c.hashIDs {
		key = HashID(id)
	}
	if c.hashTags {
		placed, ok := PlaceID(key)
		if !ok {
			return "", fmt.Errorf("%w: id %s cannot be placed in a cluster slot (it is empty or starts with \"}\"); set Options.HashIDs to use it", ErrInvalid, wire.Quote(id))
		}
		key = placed
	}
	return key, nil
}

// HashID returns the id that Options.HashIDs sends to Redis in place of id:
// the lowercase hex SHA-256 of its bytes, 64 characters long.
func HashID(id string) string { return wire.HashID(id) }
