//go:build unix

package redistest

import (
	"fmt"
	"syscall"
	"time"
)

// Freeze stops the server's process for d (SIGSTOP, then SIGCONT), as a
// scheduler, a page fault or a fork would: whatever command or script it
// was running stalls midway, with its clock moving on.
func (s *Server) Freeze(d time.Duration) error {
	if s.cmd == nil {
		return fmt.Errorf("redis-server on %s is not running", s.Addr)
	}
	p := s.cmd.Process
	if err := p.Signal(syscall.SIGSTOP); err != nil {
		return fmt.Errorf("stopping redis-server on %s: %w", s.Addr, err)
	}
	time.Sleep(d)
	if err := p.Signal(syscall.SIGCONT); err != nil {
		return fmt.Errorf("resuming redis-server on %s: %w", s.Addr, err)
	}
	return nil
}
