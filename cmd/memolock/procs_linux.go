package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// On Linux the command stays in memolock's process group, so that job
// control and terminals work for it as for any command (^C and ^Z reach
// both, a background job that reads the terminal stops as a whole). To
// stop it, memolock signals every process descended from it, which it
// finds in /proc; being a child subreaper, it also gets as children the
// processes the command leaves behind, daemons that called setsid
// included, and reaps them.

// prSetChildSubreaper is PR_SET_CHILD_SUBREAPER from <linux/prctl.h>.
const prSetChildSubreaper = 36

func init() {
	_, _, _ = syscall.RawSyscall(syscall.SYS_PRCTL, prSetChildSubreaper, 1, 0)
}

func prepare(*exec.Cmd) {}

// signalAll sends sig to every process descended from memolock, and to the
// command's leader pid if leader is set (it is one of them until reaped).
func signalAll(pid int, leader bool, sig syscall.Signal) {
	for _, p := range descendants() {
		if p != pid || leader {
			_ = syscall.Kill(p, sig)
		}
	}
}

// anyLeft reaps the processes left to memolock and reports whether any of
// the command's processes is still there.
func anyLeft(int) bool {
	reapOrphans()
	return len(descendants()) > 0
}

// reapOrphans reaps memolock's children that have exited. The command's
// leader must have been reaped (by cmd.Wait) already.
func reapOrphans() {
	for {
		var ws syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
		if pid <= 0 || err != nil {
			return
		}
	}
}

// descendants returns the processes descended from memolock that are not
// zombies, from /proc.
func descendants() []int {
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	kids := map[int][]int{}
	for _, f := range stats {
		data, err := os.ReadFile(f)
		if err != nil {
			continue // gone meanwhile
		}
		// pid (comm) state ppid ...: comm may hold spaces and parentheses.
		s := string(data)
		end := strings.LastIndexByte(s, ')')
		if end < 0 {
			continue
		}
		fields := strings.Fields(s[end+1:])
		if len(fields) < 2 || fields[0] == "Z" {
			continue
		}
		pid, err1 := strconv.Atoi(strings.Fields(s[:end])[0])
		ppid, err2 := strconv.Atoi(fields[1])
		if err1 == nil && err2 == nil {
			kids[ppid] = append(kids[ppid], pid)
		}
	}
	var out []int
	queue := kids[os.Getpid()]
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		out = append(out, p)
		queue = append(queue, kids[p]...)
	}
	return out
}

// dieWithParent has the kernel send cmd SIGTERM if memolock dies first
// (the interop demo's children).
func dieWithParent(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
}
