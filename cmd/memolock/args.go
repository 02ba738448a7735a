package main

import (
	"io"
	"sort"
	"strconv"
	"strings"
)

// mayHoldPassword reports whether a command-line argument may be a Redis
// URL with a password in it: it has "://" or "@".
func mayHoldPassword(arg string) bool {
	return strings.Contains(arg, "://") || strings.Contains(arg, "@")
}

// redactArg returns a command-line argument fit for an error message: as
// it is, or, if it may hold a password, redacted as redact does URLs.
func redactArg(arg string) string {
	if mayHoldPassword(arg) {
		return redact(arg)
	}
	return arg
}

// flagOutput returns the writer a FlagSet parsing args should print to:
// w, with every part of args that may hold a password redacted. The flag
// package quotes what it cannot parse as given, the value of
// --cluster=redis://:pw@host or the name of -redis://:pw@host.
func flagOutput(w io.Writer, args []string) io.Writer {
	seen := map[string]bool{}
	var secrets []string
	for _, arg := range args {
		name := strings.TrimLeft(arg, "-")
		parts := []string{arg, name}
		if before, after, ok := strings.Cut(name, "="); ok {
			parts = append(parts, before, after)
		}
		for _, p := range parts {
			if mayHoldPassword(p) && !seen[p] {
				seen[p] = true
				secrets = append(secrets, p)
			}
		}
	}
	if len(secrets) == 0 {
		return w
	}
	// The longest first: the replacer tries its pairs in order.
	sort.Slice(secrets, func(i, j int) bool { return len(secrets[i]) > len(secrets[j]) })
	var pairs []string
	for _, s := range secrets {
		pairs = append(pairs, strconv.Quote(s), strconv.Quote(redact(s)), s, redact(s))
	}
	return redactingWriter{w: w, r: strings.NewReplacer(pairs...)}
}

// redactingWriter writes through r. The flag package writes each message
// in one call, so a secret never straddles two writes.
type redactingWriter struct {
	w io.Writer
	r *strings.Replacer
}

func (rw redactingWriter) Write(p []byte) (int, error) {
	if _, err := io.WriteString(rw.w, rw.r.Replace(string(p))); err != nil {
		return 0, err
	}
	return len(p), nil
}
