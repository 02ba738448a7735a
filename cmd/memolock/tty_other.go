//go:build !unix

package main

import "os"

// foreground is always true without Unix job control.
func foreground(*os.File) bool { return true }
