"""The agent's reading of a job's step file (wrapper/steps.py writes it): root reading a file
the job's user controls, the careful way.

The path is the one the prolog recorded (never one the job names later); the file is opened
without following a final symlink and without blocking, used only if it is a regular file
owned by the job's uid and at most :data:`~slurmiso.wrapper.steps.MAX_FILE_BYTES` long, and
every field is checked (:func:`slurmiso.wrapper.steps.decode`). Its ``job`` must be the
record's: a user's symlinked directory cannot pass one job's steps off as another's. What
the job writes there can only make *its own* step figures wrong.
"""

from __future__ import annotations

import errno
import statistics
from dataclasses import dataclass
from typing import Optional

from slurmiso.exposition import job_series as sig


@dataclass(frozen=True)
class StepFigures:
    """One job's step signals now; ``reason`` is why they are unknown ("" when known)."""

    steps_total: Optional[float] = None
    step_s: Optional[float] = None
    throughput_vs_solo: Optional[float] = None
    reported_at: Optional[float] = None  # the wrapper's last fold (Unix s)
    reason: str = ""  # one of signals.R_* (a label value: never the job's words)
    detail: str = ""  # for the agent's log


def figures(path: str, job_id: str, uid: int, now: float, step_window_s: float,
            baseline_steps: int) -> StepFigures:
    """Steps so far, the mean step time of the last ``step_window_s`` and the throughput
    against the median of the first ``baseline_steps`` step times (None until there are as
    many; 0: no baseline)."""
    from slurmiso.wrapper.steps import MAX_FILE_BYTES, decode, read_bounded

    try:
        raw = read_bounded(path, MAX_FILE_BYTES, uid)
    except ValueError as exc:
        return StepFigures(reason=sig.R_REFUSED, detail=str(exc))
    except OSError as exc:
        why = "a symlink" if exc.errno == errno.ELOOP else (exc.strerror or "unreadable")
        return StepFigures(reason=sig.R_REFUSED, detail=why)
    if raw is None:
        return StepFigures(reason=sig.R_NO_REPORT)
    try:
        data = decode(raw)
    except ValueError as exc:
        return StepFigures(reason=sig.R_BAD_FILE, detail=str(exc))
    if data["job"] != job_id:
        return StepFigures(reason=sig.R_BAD_FILE, detail=f"written for job {data['job'][:20]!r}")
    start = now - step_window_s
    steps = secs = 0.0
    for end, n, s in data["recent"]:
        if start <= end <= now + 60:
            steps += n
            secs += s
    step_s = secs / steps if steps > 0 and secs > 0 else None
    first = data["first"]
    base = (statistics.median(first[:baseline_steps])
            if baseline_steps > 0 and len(first) >= baseline_steps else None)
    ratio = base / step_s if base and step_s else None
    return StepFigures(data["steps"], step_s, ratio, data["ts"])
