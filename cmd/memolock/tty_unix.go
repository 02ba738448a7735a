//go:build unix

package main

import (
	"os"

	"golang.org/x/sys/unix"
)

// foreground reports whether this process's group is the foreground of the
// terminal f: a job in the background must not draw over the shell's
// prompt, nor over the job that has the terminal.
func foreground(f *os.File) bool {
	pgrp, err := unix.IoctlGetInt(int(f.Fd()), unix.TIOCGPGRP)
	return err == nil && pgrp == unix.Getpgrp()
}
