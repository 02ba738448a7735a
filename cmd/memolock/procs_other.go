//go:build !unix

package main

import (
	"os"
	"os/exec"
	"syscall"
)

// Without Unix processes, only the command itself is stopped.

func prepare(*exec.Cmd) {}

func signalAll(pid int, leader bool, _ syscall.Signal) {
	if p, err := os.FindProcess(pid); err == nil && leader {
		_ = p.Kill()
	}
}

func anyLeft(int) bool { return false }

// dieWithParent is Linux only: elsewhere the demo's children outlive a
// memolock that is killed.
func dieWithParent(*exec.Cmd) {}
