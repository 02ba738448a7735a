package wire

import (
	"crypto/rand"
	"encoding/hex"
	"os"
	"strconv"
	"strings"
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
// then "@host:pid", built in one allocation.
//
// The bits come from crypto/rand on every call. A user-space generator
// (ChaCha8 seeded from crypto/rand) was tried and dropped: it saved 60 ns
// a token, but a process restored twice from one VM snapshot would repeat
// its tokens, host and pid included, where the kernel's getrandom reseeds
// after such a fork ([T2]).
func NewToken() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails on supported platforms
	var h [2 * len(b)]byte
	hex.Encode(h[:], b[:])
	var t strings.Builder
	t.Grow(len(h) + len(holderSuffix))
	t.Write(h[:])
	t.WriteString(holderSuffix)
	return t.String()
}
