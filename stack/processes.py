"""Helpers of the embedded servers: their log files and the lock on their data dirs.

Starting and stopping process groups is agent/processes.py (shared with the workers and
the runtime worker).
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

LOG_TAIL_BYTES = 4000


def log_tail(path: Path, limit: int = LOG_TAIL_BYTES) -> str:
    """The end of a log file, for error messages."""
    try:
        with path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - limit))
            return f.read().decode("utf-8", "replace")
    except OSError:
        return ""


def log_since(path: Path, offset: int, limit: int = LOG_TAIL_BYTES) -> str:
    """What was appended to a log file after offset (at most its last `limit` bytes)."""
    try:
        with path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(offset, f.tell() - limit))
            return f.read().decode("utf-8", "replace")
    except OSError:
        return ""


class DirLock:
    """An exclusive flock on a file, held while a server owns its data directory.

    The kernel drops it when the holder dies, so holding it proves that no live
    EmbeddedPostgres/EmbeddedNats in another process uses the directory, and that a
    server process still running there is an orphan of a crashed run.
    """

    def __init__(self, path: Path) -> None:
        self._path = path
        self._fd: int | None = None

    def acquire(self) -> None:
        fd = os.open(self._path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise RuntimeError(
                f"{self._path.parent} is in use by another process (lock {self._path})"
            ) from None
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
