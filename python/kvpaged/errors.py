# SPDX-License-Identifier: MIT
"""The library's errors as OSError subclasses: errno, and the daemon's (or library's) words."""
import errno as _errno


class Error(OSError):
    """A call kvpaged refused or could not make: .errno, and .strerror, the reason given."""


class NotFound(Error):
    """ENOENT: no such socket, pool or sequence."""


class AccessDenied(Error):
    """EACCES: the pool's ACL refused this user."""


class NoSpace(Error):
    """ENOSPC: the pool has no block to give (nothing free, cached or preemptible)."""


class QuotaExceeded(Error):
    """EDQUOT: a limit of this session, user or namespace (the daemon says which)."""


class Busy(Error):
    """EBUSY: the sequence is parked, or loading, or the queue is full."""


class InvalidArgument(Error):
    """EINVAL: the request is malformed (the reason says how)."""


class TooManySessions(Error):
    """EUSERS: the daemon's session limit."""


class TooBig(Error):
    """E2BIG: more than a limit allows in one request."""


class Disconnected(Error):
    """ECONNRESET or EPIPE: the daemon went away."""


class TimedOut(Error, TimeoutError):
    """ETIMEDOUT: Client.complete() waited its timeout for too few completions."""


class ProtocolError(Error):
    """EPROTO: the daemon spoke something else."""


_BY_ERRNO = {
    _errno.ENOENT: NotFound, _errno.EACCES: AccessDenied, _errno.ENOSPC: NoSpace,
    _errno.EDQUOT: QuotaExceeded, _errno.EBUSY: Busy, _errno.EINVAL: InvalidArgument,
    _errno.EUSERS: TooManySessions, _errno.E2BIG: TooBig, _errno.ECONNRESET: Disconnected,
    _errno.EPIPE: Disconnected, _errno.EPROTO: ProtocolError, _errno.ETIMEDOUT: TimedOut,
}


def error(err: int, message: str) -> Error:
    """The exception for a positive errno and the reason kvpaged gave."""
    import os

    return _BY_ERRNO.get(err, Error)(err, message or os.strerror(err))
