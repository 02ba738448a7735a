package main

import (
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"golang.org/x/term"
)

// How often the status line is drawn again on a terminal, and how often,
// at most, a waiting invocation says that it still waits elsewhere: a
// 10-minute wait in a cron or CI log is then a line at the start and 20
// more, not 600.
const (
	redrawEvery    = 200 * time.Millisecond
	stillWaitEvery = 30 * time.Second
)

// status tells on stderr what run is doing. On a terminal, one line that
// is drawn again in place: what it waits for and who computes it, or how
// long the command has run here. Off a terminal, lines for a log: one when
// a wait starts, then at most one every stillWaitEvery, and one if the
// lock came free and the command runs here after all. The holder says
// nothing off a terminal: the command's own output is its log.
type status struct {
	w       io.Writer
	tty     *os.File // set when w is a terminal: draw in place
	name    string   // tag:id, as shown
	started time.Time

	mu       sync.Mutex
	holder   string    // whom we wait for; "" until we wait
	since    time.Time // when the command started here; zero while we do not compute
	waitedAt time.Time // when the wait started
	drawn    bool      // a status line is on the terminal
	held     bool      // the command left a partial line: do not draw over it
	lastLog  time.Time // the last line off a terminal
	stop     chan struct{}
	wg       sync.WaitGroup
}

// newStatus returns the status of run for name on stderr; nil with quiet,
// where nothing is said.
func newStatus(stderr io.Writer, name string, quiet bool) *status {
	if quiet {
		return nil
	}
	s := &status{w: stderr, name: name, started: time.Now(), stop: make(chan struct{})}
	if f, ok := stderr.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
		s.tty = f
	}
	s.wg.Add(1)
	go s.loop()
	return s
}

// onTerminal reports whether the status is a line drawn in place, in
// which case the command's stderr should reach the terminal through relay.
func (s *status) onTerminal() bool { return s != nil && s.tty != nil }

func (s *status) loop() {
	defer s.wg.Done()
	every := stillWaitEvery
	if s.tty != nil {
		every = redrawEvery
	}
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-tick.C:
		}
		s.mu.Lock()
		if s.tty != nil {
			s.draw()
		} else if s.holder != "" && s.since.IsZero() && time.Since(s.lastLog) >= stillWaitEvery-time.Second {
			s.log(fmt.Sprintf("still waiting for %s, computed by %s (%s)", s.name, s.holder, seconds(time.Since(s.waitedAt))))
		}
		s.mu.Unlock()
	}
}

// waiting is Options.OnWait: the lookup found the lock held by holder.
func (s *status) waiting(_, holder string) {
	if s == nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	first := s.holder == ""
	s.holder, s.since = holder, time.Time{}
	if first {
		s.waitedAt = time.Now()
	}
	if s.tty != nil {
		s.draw()
		return
	}
	s.log(fmt.Sprintf("waiting for %s, computed by %s", s.name, holder))
}

// computing says that the command starts here.
func (s *status) computing() {
	if s == nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.since = time.Now()
	if s.tty != nil {
		s.draw()
		return
	}
	if s.holder != "" {
		s.log(fmt.Sprintf("the lock of %s came free without a value after %s: running the command here", s.name, seconds(time.Since(s.waitedAt))))
	}
}

// done erases the status line and stops.
func (s *status) done() {
	if s == nil {
		return
	}
	close(s.stop)
	s.wg.Wait()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.erase()
	s.tty = nil // whatever the command writes from now on passes as it is
}

// relay passes p, from the command's stderr, to the terminal below the
// status line, and draws the line again after a whole line.
func (s *status) relay(p []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.erase()
	_, _ = s.w.Write(p)
	s.held = len(p) > 0 && p[len(p)-1] != '\n'
	if s.tty != nil {
		s.draw()
	}
}

// log writes one line off a terminal. s.mu is held.
func (s *status) log(line string) {
	s.lastLog = time.Now()
	fmt.Fprintf(s.w, "memolock run: %s\n", line)
}

// draw draws the status line in place, if there is anything to say and
// the terminal is ours to draw on. s.mu is held.
func (s *status) draw() {
	if s.held || !foreground(s.tty) {
		return
	}
	// A line longer than the terminal wraps, and \r then goes back to its
	// last row only: keep it on one, shortening the holder's token (a long
	// hex string) first, so that the elapsed time stays in sight.
	width := 80
	if w, _, err := term.GetSize(int(s.tty.Fd())); err == nil && w > 1 {
		width = w
	}
	var line string
	switch {
	case !s.since.IsZero():
		line = fmt.Sprintf("memolock run: computing %s (%s)", s.name, seconds(time.Since(s.since)))
	case s.holder != "":
		before := fmt.Sprintf("memolock run: waiting for %s, computed by ", s.name)
		after := fmt.Sprintf(" (%s)", seconds(time.Since(s.waitedAt)))
		room := width - 1 - utf8.RuneCountInString(before+after)
		line = before + shorten(s.holder, room) + after
	default:
		return
	}
	fmt.Fprintf(s.w, "\r%s\x1b[K", truncate(line, width-1))
	s.drawn = true
}

// erase clears the status line. s.mu is held.
func (s *status) erase() {
	if s.drawn {
		_, _ = io.WriteString(s.w, "\r\x1b[K")
		s.drawn = false
	}
}

func seconds(d time.Duration) string { return fmt.Sprintf("%.1fs", d.Seconds()) }

// shorten cuts the middle out of s, to at most n runes: a token's start
// and its host and pid are what tell holders apart.
func shorten(s string, n int) string {
	r := []rune(s)
	if len(r) <= n || n < 9 {
		return s
	}
	keep := n - 3
	return string(r[:keep-keep/2]) + "..." + string(r[len(r)-keep/2:])
}

// truncate cuts s to at most n runes, ending with "..." if it was cut.
func truncate(s string, n int) string {
	if utf8.RuneCountInString(s) <= n || n < 4 {
		return s
	}
	var b strings.Builder
	for i, r := range []rune(s) {
		if i == n-3 {
			break
		}
		b.WriteRune(r)
	}
	return b.String() + "..."
}

// stderrRelay copies the command's stderr, from r, through s until r
// ends; done is closed then.
func (s *status) stderrRelay(r io.Reader) (done chan struct{}) {
	done = make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, 32*1024)
		for {
			n, err := r.Read(buf)
			if n > 0 {
				s.relay(buf[:n])
			}
			if err != nil {
				return
			}
		}
	}()
	return done
}
