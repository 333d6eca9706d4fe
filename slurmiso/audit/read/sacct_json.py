"""``sacct --json`` records, whatever the ``data_parser`` version wrote them.

``data_parser`` v0.0.38 (Slurm 22.05) gives plain ints and ``state.current`` as a string; later
versions (v0.0.39+, e.g. v0.0.42 in 24.11) wrap many numbers as ``{"set": true, "infinite":
false, "number": N}`` and give ``state.current`` as a list of flags. :func:`_num` reads every
spelling, so one mapping serves all versions. Steps are nested in their job, so folding them is
free here; the element stream comes from :mod:`slurmiso.audit.read.jsonstream`.
"""

from __future__ import annotations

import logging
from typing import IO, Any, Dict, Iterator, Optional, Tuple

from slurmiso.audit.read.jsonstream import TruncatedJson, iter_array, split_meta
from slurmiso.audit.read.sacct import (
    AcctRecord,
    AuditInputError,
    ParseStats,
    parse_tres,
    problem,
    state_word,
)

log = logging.getLogger(__name__)

def _num(value: Any) -> Optional[float]:
    """A number in any data_parser spelling: ``5``, ``{"set": true, "number": 5}``, null."""
    if isinstance(value, dict):
        if not value.get("set", True) or value.get("infinite"):
            return None
        value = value.get("number")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


#: Slurm's NO_VAL and INFINITE (32-bit), printed as plain numbers by some data_parser versions
#: (recorded on 24.11.5: a requeued attempt cancelled before it started has start 4294967294).
_UNSET_32 = (0xFFFFFFFE, 0xFFFFFFFF)


def _when(value: Any) -> Optional[float]:
    n = _num(value)
    if n in _UNSET_32:
        return None
    return n if n else None  # 0 means "not yet" in Slurm's JSON


def _json_state(state: Any) -> str:
    current = state.get("current") if isinstance(state, dict) else state
    if isinstance(current, list):
        for s in ("PREEMPTED", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED"):
            if s in current:
                return s
        current = current[0] if current else ""
    return state_word(str(current or ""))


def _json_tres(items: Any) -> Tuple[float, int, int]:
    parts = []
    for t in items or ():
        if isinstance(t, dict) and t.get("type") == "gres" and t.get("name"):
            parts.append(f"gres/{t['name']}={_num(t.get('count')) or 0:g}")
    return parse_tres(",".join(parts))


def _json_util(steps: Any) -> Tuple[Optional[float], Optional[float], int]:
    """(max gpuutil, max gpumem, steps) over the steps: ``average``, else ``total``."""
    best: Dict[str, Optional[float]] = {"gpuutil": None, "gpumem": None}
    count = 0
    for step in steps or ():
        count += 1
        requested = (step.get("tres") or {}).get("requested") or {}
        for name in best:
            value = _tres_value(requested.get("average"), name)
            if value is None:
                value = _tres_value(requested.get("total"), name)
            old = best[name]
            if value is not None and (old is None or value > old):
                best[name] = value
    return best["gpuutil"], best["gpumem"], count


def _tres_value(items: Any, name: str) -> Optional[float]:
    for t in items or ():
        if isinstance(t, dict) and t.get("name") == name:
            return _num(t.get("count"))
    return None


def json_record(job: Dict[str, Any]) -> AcctRecord:
    """One ``jobs[]`` element of ``sacct --json`` (any data_parser version) as a record."""
    t = job.get("time") or {}
    array = job.get("array") or {}
    het = job.get("het") or {}
    key = str(int(_num(job.get("job_id")) or 0))
    het_id = _num(het.get("job_id"))
    task = _num(array.get("task_id"))
    offset = 0
    if het_id:
        key = str(int(het_id))
        offset = int(_num(het.get("job_offset")) or 0)
    elif _num(array.get("job_id")):
        array_id = int(_num(array.get("job_id")) or 0)
        if task is not None:
            key = f"{array_id}_{int(task)}"
        elif array.get("task"):  # pending tasks not yet split out: "3-4" like sacct's _[3-4]
            key = f"{array_id}_[{array['task']}]"
    start, end = _when(t.get("start")), _when(t.get("end"))
    elapsed = _num(t.get("elapsed"))
    if elapsed is None:
        elapsed = end - start if start and end else 0.0
    limit = _num(t.get("limit"))
    gpus, mps, shards = _json_tres((job.get("tres") or {}).get("allocated"))
    util, mem, nsteps = _json_util(job.get("steps"))
    restarts = _num(job.get("restart_cnt"))
    nodes = job.get("nodes")
    return AcctRecord(
        key,
        str(job.get("name") or ""),
        str(job.get("user") or ""),
        str(job.get("account") or ""),
        str(job.get("partition") or ""),
        str(job.get("qos") or ""),
        _json_state(job.get("state")),
        _when(t.get("submission")),
        _when(t.get("eligible")),
        start,
        end,
        elapsed,
        int(limit) * 60 if limit is not None else None,
        gpus,
        mps,
        shards,
        str(nodes) if isinstance(nodes, str) else "",
        util,
        nsteps,
        offset,
        int(restarts) if restarts is not None else 0,
        mem,
    )


def parse_json(fh: IO[str], stats: ParseStats) -> Iterator[AcctRecord]:
    """Records from ``sacct --json``, decoding one ``jobs[]`` element at a time."""
    stats.format = stats.format or "json"
    others: Dict[str, Any] = {}
    number = 0
    try:
        for number, job in enumerate(iter_array(fh, "jobs", others), 1):  # noqa: B007
            if not isinstance(job, dict):
                stats.bad_line(f"jobs[{number - 1}]", "not an object")
                continue
            try:
                record = json_record(job)
            except (TypeError, ValueError, AttributeError) as exc:
                stats.bad_line(f"jobs[{number - 1}]", f"unexpected shape: {exc}")
                continue
            why = problem(record)
            if why is not None:
                stats.bad_line(f"jobs[{number - 1}] (job {record.job})", why)
                continue
            stats.steps += record.steps
            stats.records += 1
            yield record
    except TruncatedJson as exc:
        stats.truncated = True
        stats.bad_line(f"after jobs[{number - 1}]" if number else "start", f"truncated: {exc}")
    except ValueError as exc:
        if not number:
            raise AuditInputError(
                f"{stats.source or 'sacct --json output'}: not sacct JSON: {exc}"
            ) from None
        stats.bad_line(f"after jobs[{number - 1}]", f"garbage: {exc}")
    release, errors = split_meta(others)
    stats.slurm_version = release
    for err in errors[:3]:
        if isinstance(err, dict) and err.get("error_number") == 9003:  # "Nothing found"
            continue
        log.warning("%s: sacct reported an error: %s", stats.source or "sacct --json", err)
