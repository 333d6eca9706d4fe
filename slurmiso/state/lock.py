"""A small inter-process file lock on ``flock(2)``, for code on every job's start path.

Why not ``filelock``: its import costs ~14 ms here (it pulls in asyncio), paid by every
prolog and epilog; these hooks only ever run on Linux, where ``flock`` is all we need. A
killed holder releases the lock with its last file descriptor, so a crashed prolog can never
leave the node locked. Reentrant within one object, like ``filelock.FileLock``.
"""

from __future__ import annotations

import fcntl
import os
import time
from types import TracebackType
from typing import Optional, Type


class LockTimeout(TimeoutError):
    """The lock stayed held by another process for the whole timeout."""

    def __init__(self, path: str, timeout: float) -> None:
        self.lock_file = path
        super().__init__(f"could not lock {path} within {timeout:g}s")


class FileLock:
    """``with FileLock(path, timeout=30):`` — exclusive across processes."""

    def __init__(self, path: str, timeout: float = 30.0, mode: int = 0o644) -> None:
        self.lock_file = path
        self.timeout = timeout
        self.mode = mode
        self._fd: Optional[int] = None
        self._depth = 0

    @property
    def is_locked(self) -> bool:
        return self._fd is not None

    def acquire(self, timeout: Optional[float] = None) -> FileLock:
        if self._fd is not None:
            self._depth += 1
            return self
        wait = self.timeout if timeout is None else timeout
        flags = os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOFOLLOW", 0)
        fd = os.open(self.lock_file, flags, self.mode)
        try:
            if self.mode & 0o022:
                os.fchmod(fd, self.mode)  # the umask must not stop other users taking it
        except PermissionError:
            pass  # not our file: whoever created it set the mode
        deadline = time.monotonic() + max(wait, 0.0)
        delay = 0.001
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    os.close(fd)
                    raise LockTimeout(self.lock_file, wait) from None
                time.sleep(delay)
                delay = min(delay * 2, 0.05)
            except BaseException:
                os.close(fd)
                raise
        self._fd = fd
        self._depth = 1
        return self

    def release(self) -> None:
        if self._fd is None:
            return
        self._depth -= 1
        if self._depth > 0:
            return
        fd, self._fd = self._fd, None
        try:
            fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)

    def suspend(self) -> int:
        """Release the lock whatever its depth; return the depth for :meth:`resume`."""
        depth = self._depth if self._fd is not None else 0
        if depth:
            self._depth = 1
            self.release()
        return depth

    def resume(self, depth: int, timeout: Optional[float] = None) -> None:
        """Take the lock back at the depth :meth:`suspend` returned (LockTimeout as acquire)."""
        if depth:
            self.acquire(timeout)
            self._depth = depth

    def __enter__(self) -> FileLock:
        return self.acquire()

    def __exit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        self.release()
