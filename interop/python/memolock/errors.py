"""The exceptions memolock raises."""


class MemolockError(Exception):
    """Base of every memolock error."""


class InvalidArgument(MemolockError, ValueError):
    """A rejected argument or option (a ValueError)."""


class Closed(MemolockError):
    """The client is closed, or was closed while the caller waited."""


class Timeout(MemolockError, TimeoutError):
    """The caller's timeout ran out before the value arrived."""


class LeaseLost(MemolockError):
    """The lock no longer holds the lease's token."""


class RedisError(MemolockError):
    """Talking to Redis failed; __cause__ holds redis-py's exception."""


class HolderFailed(MemolockError):
    """The lock holder in another process failed; .message is its text."""

    def __init__(self, message):
        if isinstance(message, bytes):
            message = message.decode("utf-8", "replace")
        self.message = message
        super().__init__(f"memolock: the lock holder's fetch failed: {message}")


class Abandoned(MemolockError):
    """Ends a flight that every caller left; nobody sees it."""


class NotFound(MemolockError, LookupError):
    """The id has no value: fetch says so by raising NotFound (or a
    subclass), and then every caller of that flight, here and in other
    processes, gets NotFound. With the client's neg_ttl, Redis remembers it
    for that long (the key T/lock-notfound:I), and a get() in any process
    raises NotFound at once, without calling fetch, until a value is stored.
    Not a failure: no fail event, and it is not an empty value."""
