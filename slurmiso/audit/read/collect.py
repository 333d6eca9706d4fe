"""Where the audit's inputs come from: a saved sacct file, live ``sacct``, the journals.

Live ``sacct`` is streamed from a pipe (``SlurmCli.run`` buffers whole outputs, which a month
of accounting does not fit), so this module is the one place its errors are translated.
We ask for ``-P`` with a header (column order is then self-describing and a saved file can
be re-read), all users (``-a``), each requeued attempt (``-D``) and the steps (no ``-X``: their
``TRESUsageInAve`` carries GPU utilisation where Slurm accounts it); ``--json`` on request.
"""

from __future__ import annotations

import glob
import io
import itertools
import logging
import os
import subprocess
import time
from datetime import datetime, timezone
from typing import IO, Any, Callable, Dict, Iterable, Iterator, List, Optional, Sequence

from slurmiso.audit.read.sacct import (
    LIVE_FIELDS,
    AcctRecord,
    AuditInputError,
    ParseStats,
    detect_format,
    fold_parsable,
    parse_parsable,
)
from slurmiso.errors import UsageError
from slurmiso.units import parse_duration

log = logging.getLogger(__name__)


def parse_when(text: str, now: float) -> float:
    """``1d``/``12h``/``90m`` (that long before ``now``), or a date ``2024-05-01``,
    ``2024-05-01T08:00[:00]`` (local time, as sacct) or with ``Z`` (UTC)."""
    text = text.strip()
    try:
        return now - parse_duration(text)
    except ValueError:
        pass
    try:
        if text.endswith("Z"):
            return datetime.fromisoformat(text[:-1]).replace(tzinfo=timezone.utc).timestamp()
        when = datetime.fromisoformat(text)
        return when.timestamp()  # naive = local time, like sacct -S
    except ValueError:
        raise UsageError(
            f"invalid time {text!r}: use a duration back from now (1d, 12h, 90m) or a date "
            "(2024-05-01, 2024-05-01T08:00, 2024-05-01T08:00:00Z)"
        ) from None


def sacct_time(ts: float) -> str:
    """Unix seconds in sacct's ``-S``/``-E`` local-time spelling."""
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(ts))


def known_fields(helpformat: str) -> List[str]:
    """The audit's live fields this sacct knows (``sacct --helpformat``), in the audit's order:
    none a job's user writes (:data:`~slurmiso.audit.read.sacct.LIVE_FIELDS`).

    Measured: 22.05's sacct has no ``Restarts`` (``Invalid field requested``), so asking for
    it would fail the whole query; the live query always passes ``-D``, so nothing is lost.
    An empty or unreadable answer keeps every field (sacct then names what it refuses).
    """
    have = {w.lower() for w in helpformat.split()}
    if not have:
        return list(LIVE_FIELDS)
    return [f for f in LIVE_FIELDS if f.lower() in have]


def sacct_fields(timeout: float = 30) -> List[str]:
    """The fields to ask this host's sacct for."""
    from slurmiso.slurm.client import find_command

    try:
        cp = subprocess.run([find_command("sacct"), "--helpformat"], capture_output=True,
                            text=True, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return list(LIVE_FIELDS)
    return known_fields(cp.stdout if cp.returncode == 0 else "")


def sacct_argv(since: float, until: Optional[float], as_json: bool = False,
               fields: Optional[List[str]] = None) -> List[str]:
    args = ["-a", "-D", "-S", sacct_time(since)]
    if until is not None:
        args += ["-E", sacct_time(until)]
    if as_json:
        return args + ["--json"]
    return args + ["-P", "--format=" + ",".join(fields or LIVE_FIELDS)]


def records_from(fh: IO[str], stats: ParseStats) -> Iterable[AcctRecord]:
    """Records from a sacct output stream of either format (detected from its first byte)."""
    head = fh.read(64)
    if head.startswith("\ufeff"):  # a UTF-8 byte order mark (Windows editors, some tools)
        head = head[1:]
    rest: Any = _Prefixed(head, fh)
    if detect_format(head) == "json":
        from slurmiso.audit.read.sacct_json import parse_json

        return parse_json(rest, stats)
    return ParsableSource(rest, stats)


class ParsableSource:
    """``sacct -P`` records: iterate for :class:`AcctRecord` s, or ``fold_into`` an aggregator
    (what :meth:`Aggregator.add_all` does), which folds a large saved file in parallel
    (:mod:`slurmiso.audit.read.parallel`)."""

    def __init__(self, lines: _Prefixed, stats: ParseStats) -> None:
        self._lines: Any = lines  # a text stream to parse_parsable
        self._stats = stats
        self.close: Optional[Callable[[], None]] = None  # called when read to the end or failed
        self.path: Optional[str] = None  # a saved file: a large one is folded in parallel

    def __iter__(self) -> Iterator[AcctRecord]:
        try:
            yield from parse_parsable(self._lines, self._stats)
        finally:
            if self.close is not None:
                self.close()

    def fold_into(self, agg: Any) -> None:
        from slurmiso.audit.read.parallel import fold_file

        try:
            if self.path is not None and fold_file(self.path, self._stats, agg):
                return
            fold_parsable(self._lines.lines(), self._stats, agg)
        finally:
            if self.close is not None:
                self.close()


def read_sacct_file(path: str, stats: ParseStats) -> Iterable[AcctRecord]:
    """Stream records from a saved ``sacct -P`` or ``sacct --json`` output."""
    stats.source = path
    try:
        fh = open(path, encoding="utf-8", errors="replace")  # noqa: SIM115 - generator closes
    except OSError as exc:
        raise AuditInputError(f"cannot read sacct file {path}: {exc.strerror}") from None
    records = records_from(fh, stats)
    if isinstance(records, ParsableSource):
        records.close = fh.close
        records.path = path
        return records
    return _closing(fh, records)


def stream_sacct(since: float, until: Optional[float], stats: ParseStats,
                 as_json: bool = False, timeout: float = 600) -> Iterator[AcctRecord]:
    """Run ``sacct`` and stream its records; Slurm failures become SlurmError afterwards."""
    from slurmiso.slurm.client import UNREACHABLE, find_command

    fields = None if as_json else sacct_fields()
    argv = [find_command("sacct"), *sacct_argv(since, until, as_json, fields)]
    stats.source = "sacct " + " ".join(argv[1:6]) + " ..."
    log.info("running %s", " ".join(argv))
    try:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, errors="replace")
    except OSError as exc:
        raise AuditInputError(f"cannot run {argv[0]}: {exc.strerror}") from None
    assert proc.stdout is not None and proc.stderr is not None
    try:
        yield from records_from(proc.stdout, stats)
    except AuditInputError:
        proc.kill()
        err = proc.stderr.read().strip().splitlines()
        proc.wait(timeout)
        if proc.returncode:
            _raise_for(err, proc.returncode, UNREACHABLE)
        raise
    finally:
        proc.stdout.close()
    err = proc.stderr.read().strip().splitlines()
    proc.stderr.close()
    if proc.wait(timeout):
        _raise_for(err, proc.returncode, UNREACHABLE)


def _raise_for(err: List[str], code: int, unreachable: Sequence[str]) -> None:
    """sacct failed: the audit's input is unusable (exit 2, as its help says)."""
    msg = err[-1] if err else f"exit status {code}"
    down = any(s in msg for s in unreachable)
    raise AuditInputError(f"sacct failed: {msg}",
                          hint="is slurmdbd running? (sacctmgr show cluster)" if down
                          else "run the same sacct by hand to see why")


def journal_paths(cfg: Any, explicit: Sequence[str]) -> List[Dict[str, Any]]:
    """Journals to read: ``--journal`` paths/globs, else ``paths.journal`` with ``%n`` as ``*``
    (the monitor's and every node's journal where they share a file system)."""
    out: List[Dict[str, Any]] = []
    patterns = list(explicit) or [cfg.paths.journal.replace("%n", "*")]
    for pattern in patterns:
        if any(c in pattern for c in "*?["):
            matches = sorted(glob.glob(pattern))
            if not matches and explicit:
                out.append({"path": pattern, "missing": True})
            out.extend({"path": m, "missing": False} for m in matches)
        else:
            out.append({"path": pattern, "missing": not os.path.exists(pattern)})
    return out


def _closing(fh: IO[str], records: Iterable[AcctRecord]) -> Iterator[AcctRecord]:
    try:
        yield from records
    finally:
        fh.close()


class _Prefixed(io.TextIOBase):
    """A text stream that first returns ``head`` (already read for detection), then ``fh``."""

    def __init__(self, head: str, fh: IO[str]) -> None:
        self._head: Optional[str] = head
        self._fh = fh

    def read(self, size: Optional[int] = -1) -> str:
        head, self._head = self._head or "", None
        if size is None or size < 0:
            return head + self._fh.read()
        return head + self._fh.read(max(0, size - len(head))) if head else self._fh.read(size)

    def __iter__(self) -> Iterator[str]:  # type: ignore[override]
        return self.lines()

    def lines(self) -> Iterator[str]:
        """The lines, the head's first (a plain iterator: no generator frame per line)."""
        head, self._head = self._head, None
        it = iter(self._fh)
        if not head:
            return it
        first = head if head.endswith("\n") else head + next(it, "")
        return itertools.chain(first.splitlines(keepends=True), it)
