package wire

import (
	"strconv"
	"strings"
	"unicode/utf8"
)

// Events published on an id's events channel (PROTOCOL.md, "Events"): one
// line of kind, one of token, then free text, which may be any bytes.
const (
	EventFail     = "fail"     // the holder's fetch failed; the text is its message
	EventAbandon  = "abandon"  // the holder gave up or lost the lock: look again now
	EventNotFound = "notfound" // fetch found nothing
	EventStale    = "stale"    // a stale copy was put back: look again
)

// MaxEventText bounds the message of a fail event.
const MaxEventText = 4096

// AbandonEvent tells waiters of token to look again at once.
func AbandonEvent(token string) string { return EventAbandon + "\n" + token + "\n" }

// NotFoundEvent tells waiters of token that fetch found nothing.
func NotFoundEvent(token string) string { return EventNotFound + "\n" + token + "\n" }

// FailEvent reports err to waiters of token: its first line (a panic's stack
// stays local), at most MaxEventText bytes, cut at a UTF-8 boundary.
func FailEvent(token string, err error) string {
	msg, _, _ := strings.Cut(err.Error(), "\n")
	return FailText(token, msg)
}

// FailText is a fail event of token with msg, cut as FailEvent cuts it.
func FailText(token, msg string) string {
	return EventFail + "\n" + token + "\n" + TruncateUTF8(msg, MaxEventText)
}

// ParseEvent splits an event payload into kind, token and text.
func ParseEvent(p string) (kind, token, text string) {
	kind, rest, _ := strings.Cut(p, "\n")
	token, text, _ = strings.Cut(rest, "\n")
	return kind, token, text
}

// TruncateUTF8 cuts s to at most n bytes without splitting a character.
func TruncateUTF8(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

// Quote quotes a key or id for an error message, cut to a readable length.
func Quote(s string) string {
	if len(s) > 80 {
		return strconv.Quote(TruncateUTF8(s, 80)) + "..."
	}
	return strconv.Quote(s)
}
