package wire

import (
	crand "crypto/rand"
	"encoding/hex"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync"
)

// holderSuffix is appended to every token: "@host:pid" (PROTOCOL.md, Token).
var holderSuffix = func() string {
	host, _ := os.Hostname()
	return HostSuffix(host) + strconv.Itoa(os.Getpid())
}()

// HostSuffix returns "@host:" with the host reduced to characters that are
// safe in logs and in event payloads: every other character (not byte)
// becomes '_'.
func HostSuffix(host string) string {
	host = strings.Map(func(r rune) rune {
		if r == '.' || r == '-' || r == '_' || r >= '0' && r <= '9' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' {
			return r
		}
		return '_'
	}, host)
	if host == "" {
		host = "unknown"
	}
	return "@" + host + ":"
}

// NewToken returns a token unique to one flight: 128 random bits in hex,
// then "@host:pid".
//
// The bits come from ChaCha8 generators seeded from crypto/rand, each used
// by one goroutine at a time. ChaCha8 is a cryptographically strong
// generator ([T2]), and it spares every flight a getrandom call: in a mass
// miss that call, and the stack growth its frame forces on a fresh flight
// goroutine, took about 7% of a process's CPU.
func NewToken() string {
	var b [16]byte
	g := tokenBits.Get().(*rand.ChaCha8)
	_, _ = g.Read(b[:]) // never fails
	tokenBits.Put(g)
	var t strings.Builder
	t.Grow(2*len(b) + len(holderSuffix))
	var h [2 * len(b)]byte
	hex.Encode(h[:], b[:])
	t.Write(h[:])
	t.WriteString(holderSuffix)
	return t.String()
}

// tokenBits holds ChaCha8 generators, each seeded with 256 bits from
// crypto/rand when made.
var tokenBits = sync.Pool{New: func() any {
	var seed [32]byte
	_, _ = crand.Read(seed[:]) // crypto/rand.Read never fails on supported platforms
	return rand.NewChaCha8(seed)
}}
