"""The node journal: one JSON line per event, appended by hooks, read by ``slurmiso audit``.

Writers are separate processes (concurrent prologs, epilogs, the monitor) that share no lock,
so each record goes out as a single ``os.write`` on an ``O_APPEND`` descriptor: the kernel
places each write at the end of the file as one unit and lines never interleave. Readers
must still survive a torn line (a writer killed mid-write, a disk error, a full disk): they
skip what does not parse, say how many lines they skipped, and read the rest.

Stdlib only and nothing done at import time, because every hook imports it. A hook only
appends, so ``datetime`` and ``heapq`` (for readers) are imported where they are used.
"""

from __future__ import annotations

import json
import logging
import os
import time
from typing import TYPE_CHECKING, Any, Dict, Iterable, Iterator, Mapping, Optional, Set, Tuple

if TYPE_CHECKING:
    from datetime import datetime

log = logging.getLogger(__name__)

FILE_MODE = 0o644
DIR_MODE = 0o755
_RESERVED = ("ts", "host", "event")
#: ``source`` of the lines a job's wrapper reports, folded in by the epilog (hooks/events.py);
#: the hooks' own lines carry no source, the monitor's :data:`MONITOR_SOURCE`.
JOB_SOURCE = "job"
MONITOR_SOURCE = "monitor"
#: Where a record begins; lets a reader recover a record glued to the tail of a torn one.
_RECORD_START = b'{"ts":'

_hostname: Optional[str] = None


def short_hostname() -> str:
    """The host name up to the first dot, as Slurm names nodes; cached per process."""
    global _hostname
    if _hostname is None:
        _hostname = os.uname().nodename.split(".", 1)[0]  # gethostname() without socket
    return _hostname


def format_ts(when: datetime) -> str:
    """ISO-8601 UTC with milliseconds and a ``Z``: fixed width, so text order is time order."""
    from datetime import timezone

    when = when.astimezone(timezone.utc)
    return when.strftime("%Y-%m-%dT%H:%M:%S.") + f"{when.microsecond // 1000:03d}Z"


def now_ts(now: Optional[float] = None) -> str:
    """:func:`format_ts` of the epoch time ``now`` (default: the clock) without ``datetime``:
    the hooks append on every job and need nothing else from it."""
    whole, frac = divmod(time.time() if now is None else now, 1.0)
    micros = round(frac * 1e6)  # rounded to microseconds as datetime does, then truncated
    if micros >= 1_000_000:
        whole, micros = whole + 1, micros - 1_000_000
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S.", time.gmtime(int(whole)))
    return f"{stamp}{micros // 1000:03d}Z"


def parse_ts(text: str) -> datetime:
    """Parse a journal timestamp (Python 3.9's ``fromisoformat`` rejects a ``Z`` suffix)."""
    from datetime import datetime, timezone

    if text.endswith("Z"):
        text = text[:-1] + "+00:00"
    when = datetime.fromisoformat(text)
    return when if when.tzinfo else when.replace(tzinfo=timezone.utc)


def _as_utc(when: Optional[datetime]) -> Optional[datetime]:
    """Naive datetimes are taken as UTC, the journal's own zone."""
    from datetime import timezone

    if when is None or when.tzinfo:
        return when
    return when.replace(tzinfo=timezone.utc)


class Journal:
    """An append-only JSON-lines file. Building one does no I/O."""

    def __init__(self, path: str, *, fsync: bool = False) -> None:
        #: fsync after each line; off by default because the journal is for audit, not
        #: recovery (NodeState is durable), and a hook should not wait on the disk for it.
        self.path = os.fspath(path)
        self.fsync = fsync

    def __repr__(self) -> str:
        return f"Journal({self.path!r})"

    def append(self, event: str, **fields: Any) -> Dict[str, Any]:
        """Append one record and return it. Values JSON cannot encode are written as str."""
        return self.append_fields(event, fields)

    def append_fields(self, event: str, fields: Mapping[str, Any]) -> Dict[str, Any]:
        """:meth:`append` with the fields as a mapping: for keys that come from data (a
        job's own events), which must never become keyword arguments."""
        clash = [k for k in _RESERVED if k in fields]
        if clash:
            raise ValueError(f"journal fields may not override {', '.join(clash)}")
        record: Dict[str, Any] = {"ts": now_ts(), "host": short_hostname(), "event": event}
        record.update(fields)
        # ensure_ascii keeps the line pure ASCII and json escapes newlines: one record, one line
        line = (json.dumps(record, separators=(",", ":"), default=str) + "\n").encode("ascii")
        fd = self._open()
        try:
            written = os.write(fd, line)
            if written != len(line):
                # Only on a full or failing disk. End the torn line so the next record stays
                # readable; readers skip the torn one.
                log.error(
                    "short write to journal %s (%d of %d bytes)", self.path, written, len(line)
                )
                os.write(fd, b"\n")
            if self.fsync:
                os.fsync(fd)
        finally:
            os.close(fd)
        return record

    def _open(self) -> int:
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_CLOEXEC", 0)
        try:
            return os.open(self.path, flags, FILE_MODE)
        except FileNotFoundError:
            os.makedirs(os.path.dirname(self.path) or ".", DIR_MODE, exist_ok=True)
            return os.open(self.path, flags, FILE_MODE)

    def read(
        self,
        since: Optional[datetime] = None,
        until: Optional[datetime] = None,
        events: Optional[Set[str]] = None,
    ) -> Iterator[Dict[str, Any]]:
        """Stream records with ``since <= ts < until`` whose event is in ``events``.

        Lines that are torn or garbage are skipped; one warning at the end gives their count.
        A missing file reads as empty.
        """
        since, until = _as_utc(since), _as_utc(until)
        try:
            fh = open(self.path, "rb")  # noqa: SIM115 - closed in the finally of a generator
        except FileNotFoundError:
            return
        skipped = 0
        try:
            for raw in fh:
                record, bad = _parse_line(raw)
                skipped += bad
                if record is None:
                    continue
                if events is not None and record["event"] not in events:
                    continue
                if (since or until) and not _in_window(parse_ts(record["ts"]), since, until):
                    continue
                yield record
        finally:
            fh.close()
            if skipped:
                log.warning(
                    "skipped %d unreadable line(s) in journal %s (torn writes or disk errors); "
                    "read the rest",
                    skipped,
                    self.path,
                )


def _in_window(when: datetime, since: Optional[datetime], until: Optional[datetime]) -> bool:
    return (since is None or when >= since) and (until is None or when < until)


def _parse_line(raw: bytes) -> Tuple[Optional[Dict[str, Any]], int]:
    """(record or None, number of torn/garbage pieces found in ``raw``)."""
    raw = raw.strip()
    if not raw:
        return None, 0
    record = _decode(raw)
    if record is not None:
        return record, 0
    # A writer torn mid-line leaves its fragment glued to the next complete record.
    start = raw.rfind(_RECORD_START)
    if start > 0:
        record = _decode(raw[start:])
        if record is not None:
            return record, 1
    return None, 1


def _decode(raw: bytes) -> Optional[Dict[str, Any]]:
    try:
        record = json.loads(raw)
    except ValueError:
        return None
    if not (
        isinstance(record, dict)
        and isinstance(record.get("ts"), str)
        and isinstance(record.get("event"), str)
    ):
        return None
    try:
        parse_ts(record["ts"])
    except ValueError:
        return None
    return record


def read_journals(
    paths: Iterable[str],
    since: Optional[datetime] = None,
    until: Optional[datetime] = None,
    events: Optional[Set[str]] = None,
) -> Iterator[Dict[str, Any]]:
    """Merge several journals (e.g. one per node) into one stream ordered by ``ts``.

    Streams: each file is read once, in step. Lines within one file are in time order up to
    the few milliseconds concurrent writers can race; that small disorder passes through.
    """
    import heapq

    streams = [Journal(p).read(since=since, until=until, events=events) for p in paths]
    return heapq.merge(*streams, key=lambda rec: parse_ts(rec["ts"]))
