"""What the sync and asyncio drivers share that is not a decision: the
client's settings and operation table, and the lease's accessors."""

from . import core
from . import protocol as P
from .core import check_redis


class LeaseBase:
    """The right to compute one value: the lock key holding our token."""

    def __init__(self, client, key, token):
        self._c = client
        self._key = key
        self._token = token
        #: Set when the client is closing: a long fetch should stop.
        self.cancelled = client._closing

    def id(self):
        """The id as sent to Redis (bytes)."""
        return self._key

    def token(self):
        """The token stored in the lock (str)."""
        return self._token.decode()

    def _renewal(self, ms):
        return self._c._core.renew(self._key, self._token, ms)


class ClientBase:
    """Settings, scripts and the table of operations a driver performs
    (each a method taking the operation and the signal of _drive)."""

    def __init__(self, redis_client, kind, tag, lock_ttl, hash_ids, on_wait, neg_ttl):
        check_redis(redis_client, kind)
        self._core = core.Core(tag, lock_ttl, hash_ids, neg_ttl)
        self._rdb = redis_client
        self.keys = self._core.keys
        self.lock_ttl_ms, self.lock_ttl = self._core.lock_ttl_ms, self._core.lock_ttl
        self.neg_ttl_ms, self.hash_ids = self._core.neg_ttl_ms, self._core.hash_ids
        self._on_wait = on_wait
        self._scripts = {name: redis_client.register_script(src) for name, src in P.SCRIPTS.items()}
        self._ops = {core.Script: self._script, core.Publish: self._publish, core.Watch: self._watch,
                     core.Unwatch: self._unwatch, core.Take: self._take, core.Mark: self._mark, core.Sleep: self._sleep,
                     core.OnWait: self._notify, core.Fetch: self._fetch, core.Start: self._start}

    def _leave(self, f):
        if self._core.leave(f):
            f.wake.set()

    def _finish(self, f, val, err):
        if self._core.finish(f, val, err):
            f.done.set()
            f.wake.set()
