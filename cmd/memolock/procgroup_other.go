//go:build !unix

package main

import (
	"os"
	"os/exec"
	"syscall"
)

// Without process groups, only the command itself is stopped.

func newGroup(*exec.Cmd, *os.File) {}

func signalGroup(target int, sig syscall.Signal) error {
	p, err := os.FindProcess(max(target, -target))
	if err != nil {
		return err
	}
	return p.Kill()
}

func groupAlive(int) bool { return false }

func reapOrphans() {}
