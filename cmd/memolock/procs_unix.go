//go:build unix && !linux

package main

import (
	"errors"
	"os/exec"
	"syscall"
)

// Outside Linux the command runs in a process group of its own, which
// memolock signals as a whole: processes that leave the group are beyond
// its reach, and the command is in the background of a terminal.

func prepare(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
}

func signalAll(pid int, _ bool, sig syscall.Signal) {
	_ = syscall.Kill(-pid, sig)
}

func anyLeft(pid int) bool {
	return !errors.Is(syscall.Kill(-pid, 0), syscall.ESRCH)
}

// dieWithParent is Linux only: elsewhere the demo's children outlive a
// memolock that is killed.
func dieWithParent(*exec.Cmd) {}
