"""A large saved ``sacct -P`` file folded in parts by forked worker processes.

The serial fold (:func:`~slurmiso.audit.read.sacct.fold_parsable`) is one Python loop on
one core. A regular file of at least :data:`MIN_BYTES` is cut into up to
:data:`MAX_WORKERS` byte ranges (one per core; ``SLURMISO_AUDIT_WORKERS`` overrides, ``1``
reads serially), each cut at a job row whose job id (before any ``.``, ``+`` or ``_``)
differs from the job row before it, so a job's attempts, het components, array tasks and
steps fall in one part. The first part is folded here, each other in a forked process
(which shares the loaded config and journal digest) by the same fold, from a bounded reader
of its range with the header line put in front: memory stays that of one serial fold per
process. The parts' aggregators (each filled by the same per-attempt kernel) come back
pickled and :meth:`Aggregator.merge` adds them in file order.

Exactness: every integer figure, list and bad-line message (with the file's own line
numbers) equals the serial fold's; float sums may differ in their last bits (another order
of additions). That needs a job id to live in one part only: when one shows up in two (an
attempt listed far from the others), or a worker fails in any way, the parallel result is
dropped and the caller folds the file serially, as it does a pipe or standard input.
"""

from __future__ import annotations

import io
import itertools
import logging
import os
import re
import stat
import sys
from typing import Any, Iterator, List, Optional, Tuple

from slurmiso.audit.figures.aggregate import Aggregator
from slurmiso.audit.read.sacct import ParseStats, fold_parsable, read_header

log = logging.getLogger(__name__)

#: Smaller files are folded serially: forking and merging would cost more than they save.
MIN_BYTES = 32 << 20
MAX_WORKERS = 4
ENV_WORKERS = "SLURMISO_AUDIT_WORKERS"
_BLOCK = 1 << 16
_HEAD = 64  # characters collect.records_from reads ahead (see _header_line)
_LINE_NO = re.compile(r"^line (\d+)")


def workers() -> int:
    """Processes to fold a large file with: ``SLURMISO_AUDIT_WORKERS``, else one per usable
    core up to :data:`MAX_WORKERS`."""
    text = os.environ.get(ENV_WORKERS, "").strip()
    if text:
        try:
            return max(1, min(int(text), 64))
        except ValueError:
            log.warning("%s=%r is not a number; using one worker per core", ENV_WORKERS, text)
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cpus = os.cpu_count() or 1
    return max(1, min(cpus, MAX_WORKERS))


def _can_fork() -> bool:
    import multiprocessing  # here: a serial read never pays for its import

    return "fork" in multiprocessing.get_all_start_methods()


class _Range(io.RawIOBase):
    """Bytes ``[start, end)`` of an open file (``end`` None: to its end), read by ``pread``
    (the file's offset is shared with forked workers, so never moved)."""

    def __init__(self, fd: int, start: int, end: Optional[int]) -> None:
        super().__init__()
        self._fd = fd
        self._pos = start
        self._end = end

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        view = memoryview(b).cast("B")
        n = len(view)
        if self._end is not None:
            n = min(n, self._end - self._pos)
        if n <= 0:
            return 0
        data = os.pread(self._fd, n, self._pos)
        view[: len(data)] = data
        self._pos += len(data)
        return len(data)


def _header_line(fd: int) -> Optional[Tuple[str, int, int, int]]:
    """(the header line as the serial reader sees it, the byte offset after it, columns,
    the JobID column), or None where only the serial reader decides what the start means
    (no header, a short one, odd line breaks)."""
    data = os.pread(fd, 1 << 20, 0)
    nl = data.find(b"\n")
    if nl < 0:
        return None
    body = data[:nl]
    if body.endswith(b"\r"):
        body = body[:-1]
    if b"\r" in body:  # a lone CR is a line break to the text reader
        return None
    text = body.decode("utf-8", errors="replace")
    # records_from reads 64 characters ahead and splits what it read with str.splitlines
    # (more line breaks than \n): a header at least that long, with none of them, is one
    # line to it as to us
    if len(text) < _HEAD or len((text + "\n").splitlines()) != 1:
        return None
    if text.startswith("\ufeff"):
        text = text[1:]
    parts = text.split("|")
    if "JobID" not in parts or "State" not in parts:
        return None
    idx = {name: i for i, name in enumerate(parts) if name}  # as sacct.read_header
    return text + "\n", nl + 1, len(parts), idx["JobID"]


def _lines_from(fd: int, pos: int, limit: int) -> Iterator[Tuple[int, bytes]]:
    """(offset, line with its ``\\n``) of the whole lines that start in ``[pos, limit)``."""
    buf = b""
    at = pos  # file offset of buf[0]
    i = 0  # where the next line starts in buf
    while at + i < limit:
        nl = buf.find(b"\n", i)
        if nl < 0:
            if len(buf) - i > 1 << 20:  # a line over a MiB: no cut here
                return
            more = os.pread(fd, _BLOCK, at + len(buf))
            if not more:
                return  # the last line has no \n: never a cut
            buf = buf[i:] + more
            at += i
            i = 0
            continue
        yield at + i, buf[i : nl + 1]
        i = nl + 1


def _row_key(line: bytes, ncol: int, i_job: int) -> Optional[bytes]:
    """The job id key of a plain job row; ``b"."`` for a step; None when unsure."""
    body = line[:-2] if line.endswith(b"\r\n") else line[:-1]
    if b"\r" in body or body.count(b"|") != ncol - 1:
        return None
    job = body.split(b"|", i_job + 1)[i_job]
    if b"." in job:
        return b"."
    return job.split(b"+", 1)[0].split(b"_", 1)[0]


def _cut_after(fd: int, pos: int, limit: int, ncol: int, i_job: int) -> Optional[int]:
    """The offset of the first job row at or after the line start that follows ``pos``
    whose key differs from the job row before it (both read here), before ``limit``."""
    prev: Optional[bytes] = None
    lines = _lines_from(fd, pos - 1, limit)  # from the byte before: pos may start a line
    next(lines, None)  # the (rest of the) line ``pos`` is in
    for at, line in lines:
        if not line.strip():
            continue  # a blank line changes nothing
        key = _row_key(line, ncol, i_job)
        if key == b".":
            continue  # a step: its job's
        if key is not None and prev is not None and key != prev:
            return at
        prev = key  # an unreadable row: not sure what job it is, so no cut right after
    return None


def plan(fd: int, size: int, n: int) -> Optional[Tuple[str, List[Tuple[int, Optional[int]]]]]:
    """(the header line, the byte ranges of the parts) or None: read it serially."""
    head = _header_line(fd)
    if head is None:
        return None
    header, start, ncol, i_job = head
    cuts = [start]
    targets = [start + (size - start) * k // n for k in range(1, n)] + [size]
    for k in range(n - 1):
        if targets[k] <= cuts[-1]:
            continue
        cut = _cut_after(fd, targets[k], targets[k + 1], ncol, i_job)
        if cut is not None and cuts[-1] < cut < size:
            cuts.append(cut)
    ends: List[Optional[int]] = [*cuts[1:], None]  # the last part reads to the end, as serial
    return header, list(zip(cuts, ends))


def parts_for(path: str) -> int:
    """How many processes :func:`fold_file` would fold ``path`` with (1: serially)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))  # a FIFO: no wait
    except OSError:
        return 1
    try:
        st = os.fstat(fd)
        n = workers()
        if not stat.S_ISREG(st.st_mode) or st.st_size < MIN_BYTES or n < 2 or not _can_fork():
            return 1
        got = plan(fd, st.st_size, n)
        return 1 if got is None else len(got[1])
    finally:
        os.close(fd)


def _fold_part(fd: int, header: str, start: int, end: Optional[int], like: Aggregator,
               source: str) -> Tuple[Aggregator, ParseStats]:
    """One part folded into a new aggregator built like ``like``; its line numbers count
    from the header as line 1 (:func:`_merge` renumbers)."""
    stats = ParseStats(source=source)
    agg = Aggregator(like.cfg, like.digest, bucket_s=like.bucket_s, since=like.since,
                     until=like.until)
    text = io.TextIOWrapper(io.BufferedReader(_Range(fd, start, end), _BLOCK),
                            encoding="utf-8", errors="replace")
    try:
        fold_parsable(itertools.chain((header,), text), stats, agg)
    finally:
        text.detach()  # the fd stays open: it is the caller's
    return agg, stats


def _worker(conn: Any, fd: int, header: str, start: int, end: Optional[int],
            like: Aggregator, source: str) -> None:
    """A forked process: fold one part, send back ("ok", aggregator, stats) or ("error",
    why). Logs nothing: the parent reports the header once."""
    logging.disable(logging.CRITICAL)
    try:
        result: Tuple[Any, ...] = ("ok", *_fold_part(fd, header, start, end, like, source))
    except BaseException as exc:  # noqa: BLE001 - the parent falls back to a serial fold
        result = ("error", f"{type(exc).__name__}: {exc}")
    try:
        conn.send(result)
    except Exception as exc:  # noqa: BLE001 - e.g. a figure that does not pickle
        conn.send(("error", f"sending the result: {type(exc).__name__}: {exc}"))
    finally:
        conn.close()


class _Quiet(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return False


def fold_file(path: str, stats: ParseStats, agg: Aggregator) -> bool:
    """Fold the ``sacct -P`` file at ``path`` into ``agg`` and ``stats`` in parallel, and
    return True; or return False, both untouched, where the caller must fold it serially
    (not a large regular file, one worker, no ``fork``, a job id in two parts, a worker
    that failed)."""
    if agg.seen.count or agg.runs or agg.outside_window or agg.people:
        return False  # merging assumes an empty aggregator to start from
    n = workers()
    if n < 2 or not _can_fork():
        return False
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))  # a FIFO: no wait
    except OSError:
        return False
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size < MIN_BYTES:
            return False
        got = plan(fd, st.st_size, n)
        if got is None or len(got[1]) < 2:
            log.info("%s: %s; reading it in one pass", path,
                     "no plain header line first" if got is None
                     else "no place to cut between jobs")
            return False
        header, ranges = got
        results = _run(fd, header, ranges, agg, stats.source or path)
    finally:
        os.close(fd)
    if results is None:
        return False
    for i, (a, _) in enumerate(results):
        for b, _ in results[i + 1 :]:
            if a.seen.overlaps(b.seen):
                log.info("%s: a job id appears in two of its %d parts (attempts listed "
                         "apart); reading it in one pass", path, len(results))
                return False
    _merge(results, header, stats, agg)
    log.info("%s: folded in %d parallel parts", path, len(results))
    return True


def _run(fd: int, header: str, ranges: List[Tuple[int, Optional[int]]], agg: Aggregator,
         source: str) -> Optional[List[Tuple[Aggregator, ParseStats]]]:
    """Every part folded (the first here, the others in forked workers), or None."""
    import multiprocessing

    ctx = multiprocessing.get_context("fork")
    procs: List[Tuple[Any, Any]] = []
    quiet = _Quiet()
    sacct_log = logging.getLogger("slurmiso.audit.read.sacct")
    for stream in (sys.stdout, sys.stderr):  # a child flushes its copy of unwritten output
        try:
            stream.flush()
        except (AttributeError, OSError, ValueError):
            pass
    try:
        for start, end in ranges[1:]:
            recv, send = ctx.Pipe(duplex=False)
            proc = ctx.Process(target=_worker, args=(send, fd, header, start, end, agg, source),
                               daemon=True)
            procs.append((proc, recv))
            proc.start()
            send.close()
        sacct_log.addFilter(quiet)  # the header is reported once, by _merge
        try:
            results = [_fold_part(fd, header, *ranges[0], agg, source)]
        finally:
            sacct_log.removeFilter(quiet)
        for proc, recv in procs:
            try:
                msg = recv.recv()
            except EOFError:
                proc.join()
                msg = ("error", f"exit status {proc.exitcode}")
            if msg[0] != "ok":
                log.info("%s: a worker failed (%s); reading it in one pass", source, msg[1])
                return None
            results.append((msg[1], msg[2]))
        return results
    except Exception as exc:  # noqa: BLE001 - whatever failed, the serial fold decides
        log.info("%s: parallel fold failed (%s: %s); reading it in one pass", source,
                 type(exc).__name__, exc)
        return None
    finally:
        for proc, recv in procs:
            recv.close()
            if proc.is_alive():
                proc.terminate()
            proc.join()


def _renumber(sample: str, offset: int) -> str:
    """``line N ...`` -> ``line N+offset ...`` (every sample the reader writes starts so)."""
    m = _LINE_NO.match(sample)
    return sample if m is None else f"line {int(m.group(1)) + offset}{sample[m.end():]}"


def _merge(results: List[Tuple[Aggregator, ParseStats]], header: str, stats: ParseStats,
           agg: Aggregator) -> None:
    """Add the parts in file order; a part's line numbers move down by the lines before
    it (each part counted its header as line 1; the file's header is its line 1 too)."""
    stats.format = stats.format or "parsable"
    read_header(header.rstrip("\n").split("|"), stats)  # fields, unknown ones (logged once)
    before = 0  # data lines of the parts before this one
    for part_agg, part in results:
        if before:
            part.bad_samples = [_renumber(s, before) for s in part.bad_samples]
        agg.merge(part_agg)
        stats.merge(part)
        before += part.lines - 1
    stats.lines = before + 1
