"""One pub/sub connection per client, shared by all its waiters (sync).

A single listener thread owns the connection: it alone writes SUBSCRIBE,
UNSUBSCRIBE and PING, reads every reply, and replaces the connection. Waiters
only edit the shared state under a lock and wake the thread through a pipe.

The connection is a bare redis-py Connection (not redis-py's PubSub, which
reconnects and resubscribes by itself so that gaps go unseen). Rules, as in
the Go reference (subscriber.go):

- Each channel is subscribed once, however many watches want it.
- A watch is live once a PING "memolock:<n>" sent after its SUBSCRIBE comes
  back; it is then told to re-read.
- Every reply answers the oldest command still owed one; a reply that does
  not match, or any error, means the connection is replaced: a new one
  subscribes every channel again, and every watch re-reads once the new
  marker returns.
- A connection silent for `health` seconds gets "PING memolock:probe"; with
  nothing back within `health` more, it is replaced.
- An error reply to a SUBSCRIBE of several channels (NOPERM) subscribes them
  again one per command; one refused alone ends its watches with the error.
"""

import inspect
import os
import select
import threading
import time

import redis

from .protocol import MARKER_PREFIX

#: Silence after which the connection is probed, and probe answer deadline.
DEFAULT_HEALTH = 3.0
#: Bound on a dial or on reading the rest of one reply.
SOCKET_TIMEOUT = 5.0
MAX_BACKOFF = 1.0


class Watch:
    """One waiter's interest in some channels. Events accumulate here and
    `signal` (a threading.Event, possibly shared with the waiter's flight)
    is set; the waiter calls Subscriber.take."""

    def __init__(self, channels, signal):
        self.channels = channels
        self.signal = signal
        self.seq = 0
        self.live = False
        self.reread = False
        self.messages = []  # (channel, payload)
        self.err = None
        self.closed = False
        self.gone = False


class Events:
    __slots__ = ("reread", "messages", "err", "closed", "live")

    def __init__(self, reread, messages, err, closed, live=False):
        self.reread, self.messages, self.err, self.closed = reread, messages, err, closed
        self.live = live  # subscribed, with a marker back, on the current connection


def connection_kwargs(pool, socket_timeout):
    """The pool's connection arguments, for a connection of our own: raw
    bytes, no health checks or retries of redis-py's, our timeouts (only
    those the connection class takes: unix sockets have no connect timeout)."""
    kw = dict(pool.connection_kwargs)
    try:
        params = inspect.signature(pool.connection_class.__init__).parameters
    except (TypeError, ValueError):
        params = kw
    want = {"decode_responses": False, "health_check_interval": 0, "socket_timeout": socket_timeout,
            "retry_on_timeout": False}
    if kw.get("socket_connect_timeout") is None:
        want["socket_connect_timeout"] = SOCKET_TIMEOUT
    for k, v in want.items():
        if k in params:
            kw[k] = v
    kw.pop("retry", None)
    return kw


def make_connection(redis_client):
    """A new raw connection configured like redis_client's pool."""
    pool = redis_client.connection_pool
    return pool.connection_class(**connection_kwargs(pool, SOCKET_TIMEOUT))


class SubState:
    """The subscriber's bookkeeping, shared by the threaded Subscriber and
    the asyncio one (aio.py): which channels are wanted and sent, which
    replies are owed, which watches wait for which marker."""

    def __init__(self, redis_client, health=DEFAULT_HEALTH):
        self._rdb = redis_client
        self.health = health
        self._mu = threading.Lock()
        self._closed = False
        self._all = set()
        self._watches = {}  # channel -> set of watches
        self._dirty = set()
        self._sent = set()
        self._solo = set()
        self._unmarked = []
        self._marked = []  # (watch, seq)
        self._acks = []  # [kind, args, acked]
        self._gen = 0
        self._broken = True  # no connection yet
        self._next_seq = 1
        self._pong_seq = 0
        self.reconnects = 0  # connections made (for tests)
        self.subscribes = 0  # SUBSCRIBE commands sent (for tests)

    # --- waiters' side -------------------------------------------------

    def watch(self, signal, *channels):
        w = Watch(channels, signal)
        with self._mu:
            if self._closed:
                w.closed = True
                signal.set()
                return w
            self._start()
            self._all.add(w)
            for ch in channels:
                self._watches.setdefault(ch, set()).add(w)
                if ch not in self._sent:
                    self._dirty.add(ch)
            self._unmarked.append(w)
        self._wake()
        return w

    def unwatch(self, w):
        with self._mu:
            if w.gone or w.closed:
                return
            w.gone = True
            self._all.discard(w)
            for ch in w.channels:
                ws = self._watches.get(ch)
                if ws is not None:
                    ws.discard(w)
                    if not ws:
                        del self._watches[ch]
                        self._solo.discard(ch)
                        self._dirty.add(ch)
        self._wake()

    def take(self, w):
        """Returns and clears what w collected (and clears its signal)."""
        with self._mu:
            w.signal.clear()
            ev = Events(w.reread, w.messages, w.err, w.closed, w.live)
            w.reread, w.messages = False, []
            return ev

    def mark(self, w):
        """Asks for a marker round trip for w: once it is back, take()
        shows reread, and everything published before the marker was sent
        has been collected (a replaced connection shows reread too, after
        its own marker)."""
        with self._mu:
            if w.gone or w.closed:
                return
            self._unmarked.append(w)
        self._wake()

    def live_watches(self, ch):
        with self._mu:
            return sum(1 for w in self._watches.get(ch, ()) if w.live)

    def subscribed(self):
        """Channels subscribed on the current connection (for tests)."""
        with self._mu:
            return set(self._sent)

    # --- the listener thread ---------------------------------------------

    def _plan(self):
        """Under mu: the commands to send next, recorded as owed replies."""
        cmds = []
        batch = []
        for ch in list(self._dirty):
            want = ch in self._watches
            have = ch in self._sent
            if want and not have:
                if ch in self._solo:
                    cmds.append(("subscribe", [ch]))
                else:
                    batch.append(ch)
                self._sent.add(ch)
            elif not want and have:
                self._sent.discard(ch)
                cmds.append(("unsubscribe", [ch]))
        self._dirty.clear()
        subs = [c for c in cmds if c[0] == "subscribe"]
        unsubs = [c[1][0] for c in cmds if c[0] == "unsubscribe"]
        if batch:
            subs.insert(0, ("subscribe", batch))
        out = list(subs)
        marker = 0
        for w in self._unmarked:
            if w.gone:
                continue
            if marker == 0:
                marker = self._next_seq
                self._next_seq += 1
            w.seq = marker
            self._marked.append((w, marker))
        self._unmarked = []
        if marker:
            out.append(("ping", [MARKER_PREFIX + str(marker).encode()]))
        if unsubs:
            out.append(("unsubscribe", unsubs))
        for kind, args in out:
            self._acks.append([kind, args, 0])
        return out

    def _reset(self):
        """Under mu: start again on a new connection."""
        self._gen += 1
        self._broken = False
        self._sent.clear()
        self._acks, self._marked, self._unmarked, self._pong_seq = [], [], [], 0
        self._dirty.update(self._watches.keys())
        for w in self._all:
            w.live, w.seq = False, 0
            self._unmarked.append(w)

    def _fail(self):
        with self._mu:
            self._broken = True

    def _handle(self, msg):
        """Takes in one reply read from the connection; returns the watches
        to signal. Raises ConnectionError if it is not the reply owed."""
        poke = []
        with self._mu:
            if isinstance(msg, list) and msg and isinstance(msg[0], bytes):
                kind = msg[0].lower()
                if kind == b"message" and len(msg) == 3:
                    ch, payload = msg[1], msg[2]
                    for w in self._watches.get(ch, ()):
                        w.messages.append((ch, payload))
                        poke.append(w)
                elif kind == b"pong":
                    if not self._due("ping", msg[1] if len(msg) > 1 else b""):
                        raise ConnectionError("unexpected PONG")
                    self._marker_back(msg[1], poke)
                elif kind in (b"subscribe", b"unsubscribe") and len(msg) == 3:
                    if not self._due(kind.decode(), msg[1]):
                        raise ConnectionError("unexpected subscription acknowledgement")
                else:
                    raise ConnectionError(f"unexpected pub/sub reply {msg!r}")
            elif isinstance(msg, bytes):
                # A PING with no channel subscribed: a plain reply.
                payload = b"" if msg == b"PONG" else msg
                if not self._due("ping", payload):
                    raise ConnectionError("unexpected PING reply")
                self._marker_back(payload, poke)
            else:
                raise ConnectionError(f"unexpected pub/sub reply {msg!r}")
        return poke

    def _due(self, kind, arg):
        if not self._acks:
            return False
        cmd = self._acks[0]
        if cmd[0] != kind or cmd[1][cmd[2]] != arg:
            return False
        cmd[2] += 1
        if cmd[2] == len(cmd[1]):
            self._acks.pop(0)
        return True

    def _marker_back(self, payload, poke):
        if not payload.startswith(MARKER_PREFIX):
            return
        try:
            seq = int(payload[len(MARKER_PREFIX):])
        except ValueError:
            return  # the probe
        if seq <= self._pong_seq:
            return
        self._pong_seq = seq
        n = 0
        for w, s in self._marked:
            if s > seq:
                break
            n += 1
            if w.seq == s and not w.gone and not w.closed:
                w.live, w.reread = True, True
                poke.append(w)
        del self._marked[:n]

    def _refused(self, err):
        poke = []
        with self._mu:
            if not self._acks or self._acks[0][2] != 0:
                return False
            kind, args, _ = self._acks.pop(0)
            if kind == "ping":
                self._marker_back(args[0], poke)
            elif kind == "subscribe" and len(args) > 1:
                for ch in args:
                    self._sent.discard(ch)
                    if ch not in self._watches:
                        continue
                    self._solo.add(ch)
                    self._dirty.add(ch)
                    for w in self._watches[ch]:
                        if w.seq or w.live:
                            w.live, w.seq = False, 0
                            self._unmarked.append(w)
            elif kind == "subscribe":
                ch = args[0]
                self._sent.discard(ch)
                for w in self._watches.get(ch, ()):
                    if w.err is None:
                        w.err = err
                        poke.append(w)
        self._poke(poke)
        self._wake()
        return True


class Subscriber(SubState):
    """The threaded subscriber of the sync Client."""

    def __init__(self, redis_client, health=DEFAULT_HEALTH):
        super().__init__(redis_client, health)
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._wake_mu = threading.Lock()
        self._thread = None

    def _start(self):
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="memolock-subscriber", daemon=True)
            self._thread.start()

    def _poke(self, watches):
        for w in watches:
            w.signal.set()

    def _wake(self):
        with self._wake_mu:  # never write to a closed (perhaps reused) fd
            if self._wake_w is None:
                return
            try:
                os.write(self._wake_w, b"x")
            except (BlockingIOError, OSError):
                pass

    def close(self, timeout=1.0):
        with self._mu:
            if self._closed:
                return
            self._closed = True
            for w in self._all:
                w.closed = True
                w.signal.set()
            t = self._thread
        self._wake()
        if t is not None:
            t.join(timeout)
        if t is None or not t.is_alive():
            with self._wake_mu:
                for fd in (self._wake_r, self._wake_w):
                    try:
                        os.close(fd)
                    except OSError:
                        pass
                self._wake_r = self._wake_w = None

    def _run(self):
        conn = None
        backoff = 0.0
        last_heard = time.monotonic()
        probe_at = None  # when the outstanding probe was sent
        try:
            while True:
                with self._mu:
                    if self._closed:
                        return
                    replace = self._broken
                    if replace:
                        self._reset()
                if replace:
                    if conn is not None:
                        conn.disconnect()
                        conn = None
                    if backoff:
                        if self._sleep(backoff):
                            return
                    backoff = min(max(2 * backoff, 0.005), MAX_BACKOFF)
                    conn = make_connection(self._rdb)
                    try:
                        conn.connect()
                    except Exception:
                        self._fail()
                        continue
                    self.reconnects += 1
                    last_heard, probe_at = time.monotonic(), None
                with self._mu:
                    cmds = self._plan()
                    now = time.monotonic()
                    if probe_at is None and now - last_heard >= self.health:
                        probe_at = now
                        probe = ("ping", [MARKER_PREFIX + b"probe"])
                        self._acks.append([probe[0], probe[1], 0])
                        cmds.append(probe)
                try:
                    for kind, args in cmds:
                        if kind == "subscribe":
                            self.subscribes += 1
                        conn.send_command(kind.upper(), *args)
                except Exception:
                    self._fail()
                    continue
                # Wait for a reply, a wake-up, or the health deadline.
                now = time.monotonic()
                if probe_at is not None:
                    timeout = probe_at + self.health - now
                else:
                    timeout = last_heard + self.health - now
                try:
                    readable = conn.can_read(timeout=0)
                    if not readable:
                        r, _, _ = select.select([conn._sock, self._wake_r], [], [], max(timeout, 0))
                        if self._wake_r in r:
                            self._drain()
                        readable = conn._sock in r
                    if readable:
                        self._read_one(conn)
                        last_heard, probe_at = time.monotonic(), None
                        backoff = 0.0
                    elif probe_at is not None and time.monotonic() - probe_at >= self.health:
                        self._fail()  # the probe went unanswered
                except Exception:
                    self._fail()
        finally:
            if conn is not None:
                conn.disconnect()

    def _sleep(self, d):
        """Sleeps d seconds unless closed; returns True if closed."""
        end = time.monotonic() + d
        while True:
            left = end - time.monotonic()
            if left <= 0:
                return False
            select.select([self._wake_r], [], [], left)
            self._drain()
            with self._mu:
                if self._closed:
                    return True

    def _drain(self):
        try:
            while os.read(self._wake_r, 4096):
                pass
        except (BlockingIOError, OSError):
            pass

    def _read_one(self, conn):
        try:
            msg = conn.read_response()
        except redis.exceptions.ResponseError as e:
            if not self._refused(e):
                raise
            return
        self._poke(self._handle(msg))
