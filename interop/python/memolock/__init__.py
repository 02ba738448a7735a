"""memolock: compute a value once across processes, shared through Redis.

The Python peer of the Go reference implementation; see interop/PROTOCOL.md.
"""

from .client import Client, Lease
from .errors import (Abandoned, Closed, HolderFailed, InvalidArgument, LeaseLost, MemolockError, NotFound,
                     RedisError, Timeout)
from .protocol import KeyScheme, hash_id
from . import gojson

__all__ = ["Client", "AsyncClient", "Lease", "AsyncLease", "KeyScheme", "hash_id", "gojson", "MemolockError",
           "InvalidArgument", "Closed", "Timeout", "LeaseLost", "RedisError", "HolderFailed", "NotFound", "Abandoned"]


def __getattr__(name):
    if name in ("AsyncClient", "AsyncLease"):
        from . import aio
        return getattr(aio, name)
    raise AttributeError(name)
