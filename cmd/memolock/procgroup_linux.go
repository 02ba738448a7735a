package main

import (
	"os"
	"os/signal"
	"syscall"
	"unsafe"
)

// prSetChildSubreaper is PR_SET_CHILD_SUBREAPER from <linux/prctl.h>.
const prSetChildSubreaper = 36

// Processes the command leaves behind become our children when their parent
// dies, rather than init's, so that we can reap them and tell when they are
// gone: a zombie still counts as a member of its process group.
func init() {
	_, _, _ = syscall.RawSyscall(syscall.SYS_PRCTL, prSetChildSubreaper, 1, 0)
}

// foregroundTTY returns the controlling terminal if memolock's process
// group is in its foreground, nil otherwise (no terminal, or memolock runs
// in the background of one, whose terminal it must not take).
func foregroundTTY() *os.File {
	tty, err := os.OpenFile("/dev/tty", os.O_RDWR, 0)
	if err != nil {
		return nil
	}
	var pgrp int32
	if _, _, e := syscall.Syscall(syscall.SYS_IOCTL, tty.Fd(), syscall.TIOCGPGRP, uintptr(unsafe.Pointer(&pgrp))); e != 0 || int(pgrp) != syscall.Getpgrp() {
		tty.Close()
		return nil
	}
	// While the command's group has the terminal, memolock is in the
	// background: writing to the terminal must not stop it.
	signal.Ignore(syscall.SIGTTOU)
	return tty
}

// takeTTYBack makes memolock's process group the foreground of tty again,
// once the command's group has had it.
func takeTTYBack(tty *os.File) {
	pgrp := int32(syscall.Getpgrp())
	_, _, _ = syscall.Syscall(syscall.SYS_IOCTL, tty.Fd(), syscall.TIOCSPGRP, uintptr(unsafe.Pointer(&pgrp)))
}
