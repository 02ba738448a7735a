package pubsub

import (
	"slices"
	"strconv"
	"strings"
	"time"
)

// slotCount is the number of hash slots of a Redis Cluster.
const slotCount = 16384

// hashTag returns the part of key that Redis Cluster hashes: what is
// between its first "{" and the "}" after it, if that is not empty, else
// key.
func hashTag(key string) string {
	if i := strings.IndexByte(key, '{'); i >= 0 {
		if j := strings.IndexByte(key[i+1:], '}'); j > 0 {
			return key[i+1 : i+1+j]
		}
	}
	return key
}

// slot returns the hash slot of key, as Redis Cluster computes it (CRC16,
// the XMODEM variant, of its hash tag).
func slot(key string) int {
	var crc uint16
	for _, b := range []byte(hashTag(key)) {
		crc ^= uint16(b) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return int(crc) % slotCount
}

// group makes commands of chans: one per verb and, sharded, one per slot
// (Redis refuses a command whose channels span slots).
func (m *machine) group(chans []string, subscribe bool) []command {
	slices.Sort(chans)
	var out []command
	index := make(map[string]int)
	for _, ch := range chans {
		verb := m.verb(ch, subscribe)
		key := verb
		if verb == verbSSubscribe || verb == verbSUnsubscribe {
			key += strconv.Itoa(slot(ch))
		}
		i, ok := index[key]
		if !ok {
			i = len(out)
			index[key] = i
			out = append(out, command{verb: verb})
		}
		out[i].args = append(out[i].args, ch)
	}
	return out
}

// unsubscriptions makes the commands that unsubscribe chans: one per verb
// and slot, or, when a sharded connection is left with no shard channel at
// all (a burst of waits that all ended, the common case after a mass
// expiry), one SUNSUBSCRIBE without channels for every slot at once.
func (m *machine) unsubscriptions(chans []string) []command {
	cmds := m.group(chans, false)
	if !m.sharded || len(cmds) < 2 {
		return cmds
	}
	for ch := range m.sent {
		if m.verb(ch, false) == verbSUnsubscribe {
			return cmds // some stay: only their slots' commands can go
		}
	}
	var all []string
	out := cmds[:0]
	for _, c := range cmds {
		if c.verb == verbSUnsubscribe {
			all = append(all, c.args...)
		} else {
			out = append(out, c)
		}
	}
	return append(out, command{verb: verbSUnsubscribe, args: all, all: true})
}

// Redis does not answer a sharded unsubscription reply for reply, as it
// answers other commands. When a slot moves away, Redis unsubscribes its
// channels itself, with a sunsubscribe each that looks just like an
// acknowledgement; and (checked on redis-server 7.0.15):
//
//   - A SUNSUBSCRIBE without channels is acknowledged once per shard
//     channel the connection has when Redis runs it, in no set order, or
//     once without a channel if it has none. A channel that Redis is heard
//     to drop before then is taken out of what it owes (dropped).
//   - A SUNSUBSCRIBE that names channels is a keyed command: it is
//     acknowledged once per channel, subscribed or not, if Redis serves
//     their slot, and refused with MOVED (CLUSTERDOWN if nobody serves it)
//     after Redis's own sunsubscribes if the slot moved away. Which of the
//     two came is known only from the reply after them: a redirection is
//     its refusal, anything else a later command's. A PING (a probe's)
//     follows it in its batch (plan), so that the reply after it is never
//     the redirection of a later SSUBSCRIBE of the same slot.
//
// A sunsubscribe that none of them owes is Redis's notice that the slot of
// a channel still wanted moved away.

// noChannel is the channel of the one acknowledgement of a SUNSUBSCRIBE
// without channels on a connection that has none: Redis sends a nil
// channel, which go-redis reports as "".
const noChannel = ""

// named reports whether o is a SUNSUBSCRIBE that names its channels.
func (o *owed) named() bool { return o.verb == verbSUnsubscribe && !o.all }

// unsubscribesByName reports whether cmds hold a SUNSUBSCRIBE that names
// channels: a PING must follow it.
func unsubscribesByName(cmds []command) bool {
	return slices.ContainsFunc(cmds, func(c command) bool { return c.verb == verbSUnsubscribe && !c.all })
}

// undecided returns how many of the commands owed first are SUNSUBSCRIBEs
// that name channels: Redis may still refuse them with a redirection.
func (m *machine) undecided() int {
	n := 0
	for n < len(m.owed) && m.owed[n].named() {
		n++
	}
	return n
}

// unsubscribed takes a sunsubscribe of ch as an answer to the sharded
// unsubscriptions owed first, before any other command, and reports
// whether one of them counts on ch.
func (m *machine) unsubscribed(ch string) bool {
	for i := range m.owed {
		o := &m.owed[i]
		if o.verb != verbSUnsubscribe {
			return false
		}
		j := slices.Index(o.args, ch)
		if j < 0 {
			continue
		}
		if j >= o.acked { // not counted yet
			o.args[o.acked], o.args[j] = o.args[j], o.args[o.acked]
			o.acked++
		}
		if o.all && o.acked == len(o.args) {
			m.owed = slices.Delete(m.owed, i, i+1)
		}
		return true
	}
	return false
}

// dropped records that the connection no longer has ch: Redis said so
// (its slot moved away), or refused to subscribe it. The first
// SUNSUBSCRIBE without channels still owed that counts on ch will not be
// acknowledged for it.
func (m *machine) dropped(ch string) {
	delete(m.sent, ch)
	delete(m.unwanted, ch)
	for i := range m.owed {
		o := &m.owed[i]
		if !o.all {
			continue
		}
		if j := slices.Index(o.args[o.acked:], ch); j >= 0 {
			o.args = slices.Delete(o.args, o.acked+j, o.acked+j+1)
			if len(o.args) == 0 {
				o.args = []string{noChannel}
			}
			return
		}
	}
}

// shardLinger is how long a shard channel nobody watches may stay
// subscribed while other waits of its connection go on (see detach).
const shardLinger = time.Second

// unsubBy makes the unsubscriptions due by t at the latest, and wakes the
// owner if that moves them earlier.
func (m *machine) unsubBy(t time.Time, fx *effects) {
	if m.unsubDue.IsZero() || t.Before(m.unsubDue) {
		m.unsubDue = t
		fx.wake = true
	}
}

// wantsShardChannels reports whether a watch wants a shard channel.
func (m *machine) wantsShardChannels() bool {
	n := len(m.byChan)
	if _, ok := m.byChan[invalidationChannel]; ok {
		n--
	}
	return m.sharded && n > 0
}
