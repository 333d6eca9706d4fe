"""Atomic, durable file replacement: the one way slurmiso writes a file others read.

A reader (another hook, the wrapper, a web server, the next boot) sees the old file or the
new one, never half of one: the data goes to a fresh temp file in the same directory, is
fsynced, renamed over the target, and the directory is fsynced so the rename survives a
crash. A leaf module with no slurmiso imports: the hooks, the wrapper and the user-side
checkpoint helper all use it. Errors stay :class:`OSError`; each caller translates them
into its own part of the exception tree.
"""

from __future__ import annotations

import os
from typing import Optional, Union

_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_DIRECTORY = getattr(os, "O_DIRECTORY", 0)


def fsync_dir(directory: str) -> None:
    """Make a rename or unlink in ``directory`` durable: without this a crash can undo it."""
    fd = os.open(directory or ".", os.O_RDONLY | _DIRECTORY | _CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: str, data: Union[str, bytes], mode: Optional[int] = None,
                 durable: bool = True) -> None:
    """Replace ``path`` with ``data`` (str is written as UTF-8), atomically and durably.

    ``mode`` is set exactly (the umask does not apply); ``None`` creates the file as
    ``open()`` would (0666 less the umask). The temp file is created exclusively under a
    random name, so a symlink planted at a guessable name is never followed. ``durable``
    False skips both fsyncs: for figures rewritten every second (training step times),
    where a crash may lose the last write but never leaves half of one.
    """
    payload = data.encode("utf-8") if isinstance(data, str) else data
    directory, name = os.path.split(os.path.abspath(path))
    tmp = os.path.join(directory, f".{name}.{os.getpid()}.{os.urandom(4).hex()}.tmp")
    fd = os.open(
        tmp,
        os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC,
        0o666 if mode is None else mode,
    )
    try:
        try:
            if mode is not None:
                os.fchmod(fd, mode)
            view = memoryview(payload)
            while view:
                view = view[os.write(fd, view) :]
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    if durable:
        fsync_dir(directory)


def move_aside(path: str, target: str) -> None:
    """Rename ``path`` to ``target`` in the same directory, durably: for a file that is not
    whole, kept for a human instead of read again. Errors stay :class:`OSError`."""
    os.replace(path, target)
    fsync_dir(os.path.dirname(os.path.abspath(path)))
