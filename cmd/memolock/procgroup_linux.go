package main

import "syscall"

// prSetChildSubreaper is PR_SET_CHILD_SUBREAPER from <linux/prctl.h>.
const prSetChildSubreaper = 36

// Processes the command leaves behind become our children when their parent
// dies, rather than init's, so that we can reap them and tell when they are
// gone: a zombie still counts as a member of its process group.
func init() {
	_, _, _ = syscall.RawSyscall(syscall.SYS_PRCTL, prSetChildSubreaper, 1, 0)
}
