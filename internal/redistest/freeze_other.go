//go:build !unix

package redistest

import (
	"fmt"
	"time"
)

// Freeze needs SIGSTOP, which this platform lacks.
func (s *Server) Freeze(time.Duration) error {
	return fmt.Errorf("freezing redis-server on %s: not supported on this platform", s.Addr)
}
