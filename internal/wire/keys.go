// Package wire is memolock's wire protocol, as interop/PROTOCOL.md specifies
// it: the names of an id's keys and channels, the Lua scripts, the calls that
// run them, their replies and the events published on an id's events
// channel. It is the one place that speaks to Redis in the protocol's terms;
// it knows nothing of flights, waits or callers.
package wire

import (
	"crypto/sha256"
	"encoding/hex"
)

// Keys names the Redis keys and channels of one tag (PROTOCOL.md, "Keys and
// channels"). The tag is validated by the caller.
type Keys struct {
	tag string
}

// NewKeys returns the names of tag's keys.
func NewKeys(tag string) Keys { return Keys{tag: tag} }

// Tag returns the tag.
func (k Keys) Tag() string { return k.tag }

// Value is the key holding the value of id: the original peers' key.
func (k Keys) Value(id string) string { return k.tag + ":" + id }

// Lock is the key of the lock on id, holding the holder's token.
func (k Keys) Lock(id string) string { return k.tag + "/lock:" + id }

// Notif is the channel on which the value of id is published.
func (k Keys) Notif(id string) string { return k.tag + "/notif:" + id }

// Events is the channel of the holders' events for id (failures,
// abandons), which the original peers never read.
func (k Keys) Events(id string) string { return k.tag + "/lock-event:" + id }

// NotFound is the key that records that fetch found nothing for id.
func (k Keys) NotFound(id string) string { return k.tag + "/lock-notfound:" + id }

// Stale is the key holding a copy of the value of id kept past its TTL.
func (k Keys) Stale(id string) string { return k.tag + "/lock-stale:" + id }

// Mutex is the key of the standalone lock called name.
func (k Keys) Mutex(name string) string { return k.tag + "/lock-mutex:" + HashID(name) }

// ID returns the four keys of id that most scripts take, in their order:
// value, lock, not-found marker, stale copy.
func (k Keys) ID(id string) []string {
	return []string{k.Value(id), k.Lock(id), k.NotFound(id), k.Stale(id)}
}

// HashID is the id sent in place of id when ids are hashed: the lowercase
// hex SHA-256 of its bytes.
func HashID(id string) string {
	sum := sha256.Sum256([]byte(id))
	return hex.EncodeToString(sum[:])
}

// PlaceID is the id sent in place of id when ids are placed in one cluster
// slot each: id in braces, so that every key and channel of id hashes by the
// same tag and no two ids share one ("{x}" goes as "{{x}}"). Redis hashes
// what lies between a key's first "{" and the first "}" after it, and
// ignores an empty tag: PlaceID reports false for the ids that would make
// one, the empty id and ids that start with "}".
func PlaceID(id string) (string, bool) {
	if id == "" || id[0] == '}' {
		return "", false
	}
	return "{" + id + "}", true
}
