package redistest

import (
	"os/exec"
	"syscall"
)

// dieWithParent makes a server die with the test binary that started it,
// even when the binary is killed (a test timeout): no orphaned servers.
func dieWithParent(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
