//go:build !unix

package memolock

import (
	"net"
	"testing"
)

// refusedAddr returns a loopback address that refuses connections: the
// port of a closed listener (which another server could take again).
func refusedAddr(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	_ = l.Close()
	return addr
}
