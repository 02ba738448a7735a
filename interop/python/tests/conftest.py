"""Fixtures: redis-server processes on free ports, started and killed here."""

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

import pytest
import redis

HERE = os.path.dirname(os.path.abspath(__file__))
PKG_ROOT = os.path.dirname(HERE)
sys.path.insert(0, PKG_ROOT)

REDIS_SERVER = shutil.which("redis-server", path="/usr/bin:/usr/local/bin") or "/usr/bin/redis-server"
PYTHON = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """A throwaway redis-server on a free port (never the shared one)."""

    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="memolock-py-")
        self.port = None
        self.proc = None

    def start(self, port=None):
        self.port = port or self.port or free_port()
        self.proc = subprocess.Popen(
            [REDIS_SERVER, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--dir", self.dir, "--protected-mode", "no", "--unixsocket", self.sock, "--unixsocketperm", "700"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while True:
            try:
                r = redis.Redis(port=self.port, socket_timeout=1)
                r.ping()
                r.close()
                return self
            except redis.exceptions.ConnectionError:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    raise RuntimeError("redis-server did not start")
                time.sleep(0.02)

    def stop(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()
        self.proc = None

    @property
    def sock(self):
        return os.path.join(self.dir, "redis.sock")

    @property
    def url(self):
        return f"redis://127.0.0.1:{self.port}"

    def client(self, **kw):
        return redis.Redis(port=self.port, **kw)

    def cleanup(self):
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture(scope="session")
def server():
    s = Server().start()
    yield s
    s.cleanup()


@pytest.fixture
def own_server():
    s = Server().start()
    yield s
    s.cleanup()


@pytest.fixture
def rdb(server):
    r = server.client()
    yield r
    r.close()


def key_misses(r):
    """The server's count of key lookups that found nothing (INFO stats),
    scripts' included. While no value is stored, every acquire misses the
    same keys (the value, the not-found marker): a holder's one lookup is
    the unit, and the count tells how many lookups the server has run,
    however slowly each client got to its own."""
    return int(r.info("stats")["keyspace_misses"])


_counter = [0]


@pytest.fixture
def tag():
    _counter[0] += 1
    return f"t{os.getpid()}x{_counter[0]}x{time.time_ns() % 10**9}"
