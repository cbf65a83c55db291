"""The process's stdout and stderr -> writers that never raise: output that cannot be written is dropped.

A terminal can go away under a running ``lightning-grpo``: a killed tmux session, a dropped SSH connection, a
background job after logout. Writing to it then fails with EIO (a hung-up terminal) or EPIPE (a closed pipe), and
a run that had trained for hours died in its last line, printing its summary, before exporting its model. So the
CLI wraps ``sys.stdout`` and ``sys.stderr`` once, at start: a write or flush that fails is dropped, and when the
descriptor itself is gone (``GONE``), it is pointed at ``/dev/null``, so every other writer holding it (the
progress bar, logging's handlers, warnings, Python's own flush at exit, which would otherwise turn the exit status
into 120) writes nowhere instead of failing. Whether the run then stops is the signal's business, not this
module's (``callbacks/preemption.py``): a SIGHUP stops it after the step with ``last.ckpt`` and status 129; no
signal, it trains to its end and exports.
"""

from __future__ import annotations

import errno
import os
import sys
from typing import Any, TextIO

GONE = frozenset({errno.EIO, errno.EPIPE, errno.ENXIO, errno.EBADF, errno.ECONNRESET, errno.ENODEV})
"""The errors that say the terminal or pipe behind a descriptor is gone for good (a full disk, or a non-blocking
descriptor's EAGAIN, drops that write only)."""


class GuardedStream:
    """``stream`` (``sys.stdout`` or ``sys.stderr``) whose ``write`` and ``flush`` never raise; anything else is
    the stream's own.

    >>> import io
    >>> closed = io.StringIO()
    >>> closed.close()
    >>> GuardedStream(closed, fd=None).write("dropped")
    7
    """

    def __init__(self, stream: TextIO, fd: int | None) -> None:
        self._stream, self._fd = stream, fd

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except (OSError, ValueError) as err:  # ValueError: a closed file
            self._lost(err)
            return len(text)

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except (OSError, ValueError) as err:
            self._lost(err)

    def _lost(self, err: BaseException) -> None:
        """The descriptor is gone: from now on it is ``/dev/null`` for every writer that holds it."""
        if self._fd is None or not isinstance(err, OSError) or err.errno not in GONE:
            return
        try:
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, self._fd)
            os.close(null)
        except OSError:
            self._fd = None  # the writes stay guarded all the same
            return
        self._fd = None
        try:
            self._stream.flush()  # what the stream still buffered goes to /dev/null, not to a later write
        except (OSError, ValueError):
            pass

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def guard_standard_streams() -> None:
    """Wrap ``sys.stdout`` and ``sys.stderr`` in ``GuardedStream`` (once; a stream that is None stays None)."""
    for name, fd in (("stdout", 1), ("stderr", 2)):
        stream = getattr(sys, name)
        if stream is not None and not isinstance(stream, GuardedStream):
            setattr(sys, name, GuardedStream(stream, fd if _fileno(stream) == fd else None))


def _fileno(stream: TextIO) -> int | None:
    try:
        return stream.fileno()
    except (OSError, ValueError, AttributeError):  # io.UnsupportedOperation is both OSError and ValueError
        return None
