"""The job's own events file: written by the job's wrapper, folded into the journal by the epilog.

The wrapper (``slurmiso run``) runs as the job's user and cannot write root's journal, so the
prolog names a file in the job's working directory (``SLURM_JOB_WORK_DIR``) and exports it as
``SLURMISO_EVENTS_FILE``; the wrapper creates it as the user, on the user's filesystem and
quota. A user who fills it fills their own disk, never root's state dir (where a full tmpfs
once failed another user's prolog and drained the node).

Everything in it is opaque user data, read by root under these rules:

* opened without following a final symlink, without blocking (a FIFO is refused), only if it
  is a regular file owned by the job's uid; at most :data:`MAX_BYTES` are read;
* read per line: at most :data:`MAX_LINE` bytes and :data:`MAX_DEPTH` levels of nesting,
  checked *before* the JSON parser sees the line (100,000 nested brackets would blow its
  recursion limit);
* only the wrapper's event names (:data:`USER_EVENTS`, from slurmiso/jobfiles.py: the contract
  both sides import) pass: a line can never produce ``job-end``, ``prolog`` or
  ``monitor-action``; fields must be scalars with plain names;
* what is refused is counted and reported, never raised: user data must not drain a node.
"""

from __future__ import annotations

import errno
import json
import logging
import math
import os
import stat
from typing import Any, Dict, List, Optional

from slurmiso.jobfiles import MAX_BYTES, RESERVED, USER_EVENTS
from slurmiso.values import Value, field

__all__ = ["MAX_BYTES", "RESERVED", "USER_EVENTS", "Folded", "UserEvent", "fold", "parse_line"]
log = logging.getLogger(__name__)

MAX_LINE = 4096
MAX_DEPTH = 4
MAX_RECORDS = 1000
MAX_LINES = 10_000  # lines examined at all: parsing is bounded even for a file of "1\n"s
MAX_FIELDS = 16
MAX_TEXT = 256
_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyz0123456789_")
_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0) | getattr(
    os, "O_NOCTTY", 0
)


class UserEvent(Value, eq=True):
    event: str
    ts: Optional[str]
    fields: Dict[str, Any]


class Folded(Value, frozen=False):
    records: List[UserEvent] = field(default_factory=list)
    dropped: int = 0
    why: str = ""
    #: Bytes of the file past the cap, never read (their lines are not counted in ``dropped``).
    unread_bytes: int = 0

    def drop(self, why: str, count: int = 1) -> None:
        self.dropped += count
        if not self.why:
            self.why = why



def _depth_ok(line: bytes) -> bool:
    """Whether brackets outside strings nest at most MAX_DEPTH deep (no parser recursion)."""
    depth = 0
    in_str = escaped = False
    for byte in line:
        if in_str:
            if escaped:
                escaped = False
            elif byte == 0x5C:  # backslash
                escaped = True
            elif byte == 0x22:
                in_str = False
        elif byte == 0x22:
            in_str = True
        elif byte in (0x5B, 0x7B):
            depth += 1
            if depth > MAX_DEPTH:
                return False
        elif byte in (0x5D, 0x7D):
            depth -= 1
    return True


def _scalar(value: Any) -> bool:
    if value is None or isinstance(value, bool):
        return True
    if isinstance(value, int):
        return abs(value) <= 2**53
    if isinstance(value, float):
        return math.isfinite(value)
    return isinstance(value, str) and len(value) <= MAX_TEXT


def parse_line(line: bytes) -> Optional[UserEvent]:
    """One line as a user event, or None if it breaks a rule (never raises)."""
    if len(line) > MAX_LINE or not _depth_ok(line):
        return None
    try:
        rec = json.loads(line)
    except (ValueError, RecursionError):
        return None
    if not isinstance(rec, dict) or rec.get("event") not in USER_EVENTS:
        return None
    ts = rec.get("ts")
    if not (isinstance(ts, str) and len(ts) <= 40 and ts.isprintable()):
        ts = None
    fields: Dict[str, Any] = {}
    for key, value in rec.items():
        if key in RESERVED:
            continue
        if not (isinstance(key, str) and 0 < len(key) <= 32 and set(key) <= _NAME_CHARS):
            return None
        if not _scalar(value) or len(fields) >= MAX_FIELDS:
            return None
        fields[key] = value
    return UserEvent(str(rec["event"]), ts, fields)


def fold(path: str, uid: int) -> Folded:
    """Read and remove the job's events file; return what passed the rules and a drop count."""
    out = Folded()
    folder, name = os.path.split(path)
    try:
        dir_fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return out  # the job's directory is gone or unreachable: nothing to fold
    try:
        raw = _read(dir_fd, name, uid, out)
        if raw is None:
            return out
        lines = [ln for ln in raw.split(b"\n") if ln.strip()]
        for i, line in enumerate(lines):
            if len(out.records) >= MAX_RECORDS or i >= MAX_LINES:
                out.drop(f"more than {MAX_RECORDS} events or {MAX_LINES} lines", len(lines) - i)
                break
            rec = parse_line(line)
            if rec is None:
                out.drop("lines that are not the wrapper's events (or too long or deep)")
            else:
                out.records.append(rec)
    finally:
        os.close(dir_fd)
    return out


def _read(dir_fd: int, name: str, uid: int, out: Folded) -> Optional[bytes]:
    try:
        fd = os.open(name, _FLAGS, dir_fd=dir_fd)
    except FileNotFoundError:
        return None
    except OSError as exc:
        why = "a symlink" if exc.errno == errno.ELOOP else exc.strerror
        out.drop(f"events file {name} refused: {why}")
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or (uid >= 0 and st.st_uid != uid):
            out.drop(f"events file {name} is not a regular file of uid {uid}")
            return None
        raw = os.read(fd, MAX_BYTES + 1)
    finally:
        os.close(fd)
    if len(raw) > MAX_BYTES:
        raw = raw[: raw.rfind(b"\n", 0, MAX_BYTES) + 1]
        out.unread_bytes = max(st.st_size, MAX_BYTES + 1) - len(raw)
        out.drop(f"events file of {st.st_size} bytes is over the {MAX_BYTES}-byte cap; "
                 f"only its first {len(raw)} bytes were read, {out.unread_bytes} were not")
    _unlink_same(dir_fd, name, st)
    return raw


def _unlink_same(dir_fd: int, name: str, st: os.stat_result) -> None:
    """Remove the file we read, and only that one (the name may have been swapped since)."""
    try:
        now = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        if (now.st_dev, now.st_ino) == (st.st_dev, st.st_ino):
            os.unlink(name, dir_fd=dir_fd)
    except OSError as exc:
        log.info("could not remove the job's events file %s: %s", name, exc)
