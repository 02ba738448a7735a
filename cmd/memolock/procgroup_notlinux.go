//go:build !linux

package main

import "os"

// Outside Linux the command's group does not take the terminal over.

func foregroundTTY() *os.File { return nil }

func takeTTYBack(*os.File) {}
