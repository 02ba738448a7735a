"""What `run` says on stderr while it works, as the Go CLI says it
(cmd/memolock/status.go).

On a terminal: one line drawn again in place, what the invocation waits for
and who computes it, or how long the command has run here; the command's
stderr reaches the terminal through relay(), so that the line stays below
it, and the line is erased before anything else is written. Off a terminal
(a cron or CI log): a line when a wait starts, then at most one every 30 s,
and one if the lock came free and the command runs here after all; the
holder says nothing there, its command's output is its log.
"""

import os
import threading
import time

#: How often the line is drawn again on a terminal.
REDRAW_EVERY = 0.2
#: At most this often, off a terminal, a waiting invocation says it still waits.
STILL_WAIT_EVERY = 30.0


def seconds(d):
    return f"{d:.1f}s"


def shorten(s, n):
    """s with its middle cut out, to at most n characters: a token's start
    and its host and pid are what tell holders apart."""
    if len(s) <= n or n < 9:
        return s
    keep = n - 3
    return s[:keep - keep // 2] + "..." + s[len(s) - keep // 2:]


def truncate(s, n):
    if len(s) <= n or n < 4:
        return s
    return s[:n - 3] + "..."


def foreground(fd):
    """Whether this process's group is the terminal's foreground: a job in the
    background must not draw over the shell's prompt, nor over the job that
    has the terminal."""
    try:
        return os.tcgetpgrp(fd) == os.getpgrp()
    except OSError:
        return False


class Status:
    """The status of one `run` for name (tag:id as shown) on the binary
    stream err, whose lines start with prefix ("PROG run: ")."""

    def __init__(self, err, prefix, name):
        self.err, self.prefix, self.name = err, prefix, name
        self.fd = None
        try:
            fd = err.fileno()
            if os.isatty(fd):
                self.fd = fd
        except (AttributeError, OSError, ValueError):
            pass
        self.mu = threading.Lock()
        self.holder = ""  # whom we wait for; "" until we wait
        self.since = None  # when the command started here
        self.waited_at = None
        self.drawn = False
        self.held = False  # the command left a partial line: do not draw over it
        self.last_log = 0.0
        self.quit = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True, name="memolock-status")
        self.thread.start()

    def on_terminal(self):
        return self.fd is not None

    def _write(self, b):
        try:
            self.err.write(b)
            self.err.flush()
        except (OSError, ValueError):
            pass

    def _loop(self):
        every = REDRAW_EVERY if self.fd is not None else STILL_WAIT_EVERY
        while not self.quit.wait(every):
            with self.mu:
                if self.fd is not None:
                    self._draw()
                elif self.holder and self.since is None and \
                        time.monotonic() - self.last_log >= STILL_WAIT_EVERY - 1:
                    self._log(f"still waiting for {self.name}, computed by {self.holder} "
                              f"({seconds(time.monotonic() - self.waited_at)})")

    def waiting(self, _id, holder):
        """on_wait: a lookup found the lock held by holder."""
        with self.mu:
            if not self.holder:
                self.waited_at = time.monotonic()
            self.holder, self.since = holder, None
            if self.fd is not None:
                self._draw()
            else:
                self._log(f"waiting for {self.name}, computed by {holder}")

    def computing(self):
        """The command starts here."""
        with self.mu:
            self.since = time.monotonic()
            if self.fd is not None:
                self._draw()
            elif self.holder:
                self._log(f"the lock of {self.name} came free without a value after "
                          f"{seconds(time.monotonic() - self.waited_at)}: running the command here")

    def done(self):
        """Erases the line and stops; what the command writes from now on
        passes as it is."""
        self.quit.set()
        self.thread.join()
        with self.mu:
            self._erase()
            self.fd = None

    def relay(self, data):
        """Passes data, from the command's stderr, to the terminal below the
        line, and draws the line again after a whole line."""
        with self.mu:
            self._erase()
            self._write(data)
            self.held = bool(data) and not data.endswith(b"\n")
            if self.fd is not None:
                self._draw()

    def _log(self, line):
        self.last_log = time.monotonic()
        self._write((self.prefix + line + "\n").encode("utf-8", "surrogateescape"))

    def _draw(self):
        if self.held or not foreground(self.fd):
            return
        # A line longer than the terminal wraps, and \r then goes back to
        # its last row only: keep it on one, shortening the holder's token
        # first, so that the elapsed time stays in sight.
        try:
            width = os.get_terminal_size(self.fd).columns
        except OSError:
            width = 0
        if width <= 1:
            width = 80
        now = time.monotonic()
        if self.since is not None:
            line = f"{self.prefix}computing {self.name} ({seconds(now - self.since)})"
        elif self.holder:
            before = f"{self.prefix}waiting for {self.name}, computed by "
            after = f" ({seconds(now - self.waited_at)})"
            room = width - 1 - len(before + after)
            if room < 9:
                # No room for the holder's token: the time stays in sight.
                line = f"{self.prefix}waiting for {self.name}{after}"
            else:
                line = before + shorten(self.holder, room) + after
        else:
            return
        self._write(("\r" + truncate(line, width - 1) + "\x1b[K").encode("utf-8", "surrogateescape"))
        self.drawn = True

    def _erase(self):
        if self.drawn:
            self._write(b"\r\x1b[K")
            self.drawn = False


def relay_stream(status, fd):
    """Copies the command's stderr, from fd, through status until it ends;
    returns the thread doing it."""

    def copy():
        while True:
            try:
                b = os.read(fd, 32 * 1024)
            except OSError:
                b = b""
            if not b:
                os.close(fd)
                return
            status.relay(b)

    t = threading.Thread(target=copy, daemon=True, name="memolock-stderr")
    t.start()
    return t
