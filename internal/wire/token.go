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
// then "@host:pid".
func NewToken() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails on supported platforms
	return hex.EncodeToString(b[:]) + holderSuffix
}
