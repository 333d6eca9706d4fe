"""``sacct -P`` lexed straight into the audit's per-attempt kernel: no record per row.

The record path (:func:`~slurmiso.audit.read.sacct.parse_parsable` yields an
:class:`~slurmiso.audit.read.sacct.AcctRecord`, :meth:`Aggregator.add` hands its fields to
:mod:`slurmiso.audit.figures.kernel`) costs about four times a plain ``csv`` pass over the
same file. This reader makes the kernel's calls with no record, no generator and one call
per job row in the common case: a job row, split only as far as the last column read, whose
timestamps hit a per-hour cache and whose TRES and state are cached per distinct string
(read by subscript: a miss is the rare KeyError), followed by its steps. Anything else (het
components, a torn or bad row, a header that lacks a column) is made a record by the record
path's own code, so a bad row gets the same message, and goes to the same kernel.
``tests/unit/test_audit_fold.py`` checks on randomised dumps that both leave every figure
equal.

A job's GPU utilisation is the max over its steps' ``gres/gpuutil``, so the kernel's
``usage`` call for it waits for the next job row (as the record path holds the record back).
"""

from __future__ import annotations

import itertools
from typing import Dict, Iterable, List, Optional, Tuple

from slurmiso.audit.figures.aggregate import Aggregator
from slurmiso.audit.read.sacct import (
    NO_TIME,
    SLACK_S,
    AuditInputError,
    ParseStats,
    checked_record,
    fitted_row,
    gpu_usage,
    parse_time,
    parse_tres,
    read_header,
    record_maker,
    row_usage,
    tres_number,
)

_CACHE = 10_000  # entries per string cache (hostile input cannot grow them without bound)
_HOURS = 100_000  # eleven years of distinct hours
#: ``:MM:SS`` -> seconds into the hour, for a timestamp whose hour (``text[:13]``) is cached:
#: ``parse_time`` is the hour's base plus these, so the sum is the same float. Anything else
#: (a torn or odd stamp) takes the record path, which decides what it means.
_TWO = [f"{n:02d}" for n in range(60)]
_MMSS = {":" + m + ":" + s: i * 60 + j for i, m in enumerate(_TWO) for j, s in enumerate(_TWO)}


def _slow_time(text: str, hours: Dict[str, float]) -> Optional[float]:
    """A time the hour cache missed; learns its hour. Raises ValueError when bad (the
    caller then lets the record path name the problem)."""
    if text in NO_TIME:
        return None
    value = parse_time(text)
    if value is None:
        raise ValueError(text)
    if len(text) == 19 and len(hours) < _HOURS:
        into = _MMSS.get(text[13:])
        if into is not None:
            hours[text[:13]] = value - into  # exact: whole seconds well below 2**53
    return value


def _odd_row(line: str, parts: List[str], ncol: int, idx: Dict[str, int], number: int,
             stats: ParseStats) -> Optional[List[str]]:
    """The fields of a row the fast split found odd (another number of columns, no line
    end), all split, as the record path reads them; None to skip it (a blank line, a row
    past repair: ``fitted_row`` counts it)."""
    parts[-1] = parts[-1].rstrip("\r\n")
    if len(parts) == 1 and (not parts[0] or parts[0].isspace()):
        return None  # a blank line
    if len(parts) != ncol:
        repaired = fitted_row(parts, ncol, idx, line[-1:] == "\n", f"line {number}", stats)
        if repaired is None:
            return None
        parts = repaired
    if line[-1:] != "\n":  # sacct ends every line; a last line without one was cut
        stats.truncated = True
    return parts


def _odd_times(start: Optional[float], end: Optional[float], submit: Optional[float],
               eligible: Optional[float], elapsed: float, nodes: str) -> bool:
    """Whether a job row's times are a problem the record path names (its checks, on what
    it reads): a negative ElapsedRaw, an end before the start, more time elapsed than ran,
    a start before the job could wait (submit where eligible is unknown) on a node."""
    waited_from = eligible if eligible is not None else submit
    return (elapsed < 0
            or (start is not None and end is not None
                and (end < start or elapsed > end - start + SLACK_S))
            or (start is not None and waited_from is not None
                and start < waited_from - SLACK_S and nodes != "None assigned"))


def _header(it: Iterable[str], stats: ParseStats) -> Tuple[int, List[str], Dict[str, int],
                                                          Optional[str]]:
    """(lines read, header, column index, a first line that is data: ``sacct -n``)."""
    number = 0
    for line in it:
        number += 1
        text = line.rstrip("\r\n")
        if not text or text.isspace():
            continue
        bom = text.startswith("\ufeff")
        parts = text.split("|")
        if bom:  # a BOM from an editor or Windows tool
            parts[0] = parts[0][1:]
        header, idx = read_header(parts, stats)
        return number, header, idx, (None if "JobID" in parts else line[1:] if bom else line)
    stats.lines = number
    raise AuditInputError(f"{stats.source or 'sacct output'}: empty, no header line found")


def fold_parsable(lines: Iterable[str], stats: ParseStats, agg: Aggregator) -> None:
    """Fold ``sacct -P`` output (header first) into ``agg``: what
    ``agg.add_all(parse_parsable(lines, stats))`` does, with the same ``stats``."""
    stats.format = stats.format or "parsable"
    it = iter(lines)
    number, header, idx, first = _header(it, stats)
    if first is not None:
        number -= 1
        it = itertools.chain((first,), it)
    ncol = len(header)
    make = record_maker(idx, ncol)

    def at(name: str) -> int:  # a column the header lacks reads the "" appended to the row
        return idx.get(name, ncol)

    i_job, i_state = idx["JobID"], idx["State"]
    i_user, i_acct, i_part, i_qos = at("User"), at("Account"), at("Partition"), at("QOS")
    i_submit, i_elig, i_start, i_end = at("Submit"), at("Eligible"), at("Start"), at("End")
    i_elapsed, i_tres, i_nodes = at("ElapsedRaw"), at("AllocTRES"), at("NodeList")
    i_ave, i_tot, i_restarts = at("TRESUsageInAve"), at("TRESUsageInTot"), at("Restarts")
    i_limit = at("TimelimitRaw")
    read = (i_job, i_state, i_user, i_acct, i_part, i_qos, i_submit, i_elig, i_start, i_end,
            i_elapsed, i_tres, i_nodes, i_ave, i_tot, i_restarts, i_limit)
    pad = ncol in read
    strip = ncol - 1 in read
    # split a row only as far as the last column read (the rest stays one string whose "|"
    # are counted): 14 fewer strings a row for the 32-field dump; not when a column is
    # missing (its "" is appended after the row) or the last column is read
    upto = max(read) + 1 if not pad and max(read) < ncol - 2 else 0
    rest_bars = ncol - 1 - upto

    stamps = (i_start, i_end, i_submit, i_elig)
    hours: Dict[str, float] = {}
    mmss = _MMSS
    tres_cache: Dict[str, Tuple[float, int, int, bool]] = {}
    states: Dict[str, str] = {}
    kernel = agg.kernel
    attempt, usage = kernel.attempt, kernel.usage

    start: Optional[float]
    end: Optional[float]
    submit: Optional[float]
    eligible: Optional[float]
    records = steps = 0
    pkey: Optional[str] = None  # the job whose steps may follow; None: none
    putil: Optional[float] = None  # ... its GPU utilisation (the max over its steps)
    first_number = number + 1
    try:
        for number, line in enumerate(it, first_number):
            # the line end stays on the last field unless the fast path reads that field
            if upto:
                parts = line.split("|", upto)
                # the rest holds rest_bars >= 1 bars only where the row has every column (a
                # shorter row's last part holds none)
                if parts[-1].count("|") != rest_bars or line[-1:] != "\n":
                    odd = _odd_row(line, line.split("|"), ncol, idx, number, stats)
                    if odd is None:
                        continue
                    parts = odd
            else:
                parts = line.rstrip("\r\n").split("|") if strip else line.split("|")
                if len(parts) != ncol or line[-1:] != "\n":
                    odd = _odd_row(line, parts, ncol, idx, number, stats)
                    if odd is None:
                        continue
                    parts = odd
            if pad:
                parts.append("")
            job_id = parts[i_job]

            if "." in job_id:  # a step: its GPU usage is its job's
                key = job_id[: job_id.find(".")]
                if "+" in key:
                    key = key.split("+", 1)[0]
                if key == pkey:
                    # gpu_usage(Ave)[0], else gpu_usage(Tot)[0]: the last item that starts
                    # with gres/gpuutil= (one inside another item: gpu_usage decides)
                    util = None
                    for text in (parts[i_ave], parts[i_tot]):
                        i = text.rfind("gres/gpuutil=")
                        if i >= 0:
                            if i and text[i - 1] != ",":
                                util = gpu_usage(text)[0]
                            else:
                                j = text.find(",", i)
                                value = text[i + 13 :] if j < 0 else text[i + 13 : j]
                                util = (float(value) if value.isdigit() and value.isascii()
                                        else tres_number(value))
                            if util is not None:
                                break
                    if util is not None and (putil is None or util > putil):
                        putil = util
                    steps += 1
                else:
                    stats.orphan_steps += 1
                continue

            # a job row: first the utilisation of the job before, its steps all read
            if pkey is not None:
                records += 1
                if putil is not None:
                    usage(putil)
                pkey = None

            if "+" not in job_id:
                try:  # a KeyError or ValueError: the record path reads the row instead
                    try:  # each stamp's hour cached: two dict hits a stamp
                        start = hours[(text := parts[i_start])[:13]] + mmss[text[13:]]
                        end = hours[(text := parts[i_end])[:13]] + mmss[text[13:]]
                        submit = hours[(text := parts[i_submit])[:13]] + mmss[text[13:]]
                        eligible = (submit if parts[i_elig] == text
                                    else hours[(text := parts[i_elig])[:13]] + mmss[text[13:]])
                        raw = parts[i_elapsed]
                        elapsed = float(int(raw)) if raw else end - start
                        # _odd_times where every stamp is a time
                        if (elapsed < 0 or end < start or elapsed > end - start + SLACK_S
                                or (start < eligible - SLACK_S
                                    and parts[i_nodes] != "None assigned")):
                            raise ValueError("a problem the record path names")
                    except KeyError:  # an hour to learn, or a stamp to read in full
                        start, end, submit, eligible = [_slow_time(parts[i], hours)
                                                        for i in stamps]
                        raw = parts[i_elapsed]
                        elapsed = (float(int(raw)) if raw else end - start
                                   if start is not None and end is not None else 0.0)
                        if _odd_times(start, end, submit, eligible, elapsed, parts[i_nodes]):
                            raise ValueError("a problem the record path names") from None
                    text = parts[i_tres]
                    try:
                        tres = tres_cache[text]
                    except KeyError:
                        g, m, s = parse_tres(text)
                        tres = (g, m, s, g < 0 or m < 0 or s < 0)
                        if len(tres_cache) < _CACHE:
                            tres_cache[text] = tres
                    text = parts[i_restarts]
                    restarts = 0 if text == "0" else int(text) if text.isdecimal() else 0
                    if tres[3]:  # a negative count
                        raise ValueError("a problem the record path names")
                except (ValueError, KeyError):
                    pass
                else:
                    text = parts[i_state]
                    try:
                        state = states[text]
                    except KeyError:
                        state = text.split(" ", 1)[0].upper() if text else "UNKNOWN"
                        if len(states) < _CACHE:
                            states[text] = state
                    attempt(job_id, parts[i_user], parts[i_acct], parts[i_part], parts[i_qos],
                            state, submit, eligible, start, end, elapsed, tres[0], tres[1],
                            tres[2], parts[i_nodes], 0, restarts)
                    pkey = job_id
                    ave, tot = parts[i_ave], parts[i_tot]
                    putil = row_usage(ave, tot)[0] if ave or tot else None
                    continue
            # the record path's own code for this row
            if upto and len(parts) == upto + 1:  # a regular row split only so far
                parts[upto:] = parts[upto].split("|")
            parts[ncol - 1] = parts[ncol - 1].rstrip("\r\n")
            if not pad:
                parts.append("")
            key, rec, why = checked_record(make, parts, job_id)
            if why is not None:
                stats.bad_line(f"line {number} (job {job_id})", why)
                continue
            assert rec is not None
            kernel.record(rec)
            pkey, putil = key, rec.gpu_util
        if pkey is not None:  # the last job
            records += 1
            if putil is not None:
                usage(putil)
    finally:
        stats.records += records
        stats.steps += steps
        stats.lines = number

