//go:build unix

package main

import (
	"errors"
	"os"
	"os/exec"
	"syscall"
)

// newGroup makes cmd the leader of a process group of its own, so that a
// signal can reach every process it starts. With a terminal, the group is
// put in its foreground, as a shell puts a job: its processes can read the
// terminal and get the terminal's signals (^C).
func newGroup(cmd *exec.Cmd, tty *os.File) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if tty != nil {
		cmd.SysProcAttr.Foreground = true
		cmd.SysProcAttr.Ctty = int(tty.Fd())
	}
}

// signalGroup sends sig to target as kill(2) takes it: a process, or with
// a minus sign a process group.
func signalGroup(target int, sig syscall.Signal) error {
	return syscall.Kill(target, sig)
}

// groupAlive reports whether any process of group pgid is left.
func groupAlive(pgid int) bool {
	return !errors.Is(syscall.Kill(-pgid, 0), syscall.ESRCH)
}

// reapOrphans reaps children that are left: the command's own processes,
// which become ours once the command's leader is gone (see subreaper).
func reapOrphans() {
	for {
		var ws syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
		if pid <= 0 || err != nil {
			return
		}
	}
}
