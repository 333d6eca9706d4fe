"""Training step times: the program's report, folded by the wrapper into the job's step file.

    program (slurmiso.checkpoint.report_step)  -> SLURMISO_STEP_REPORT (its running totals,
                                                  rewritten at most once a second)
    wrapper (StepFolder.tick, from its loop)   -> SLURMISO_STEPS_FILE, the file the prolog
                                                  named (job's working dir); one small JSON
    agent (agent/stepfile.py, as root)       -> slurmiso_job_step_seconds and friends

The program only keeps totals (steps, timed steps, seconds, samples, its first step times),
so reporting costs it a few additions and one small file write a second. The wrapper turns
successive totals into intervals (steps and seconds between two folds) and keeps the recent
ones; the agent takes the mean step time of the last ``monitor.signals.step_window`` and the
median of the first ``baseline_steps`` as the solo baseline. Both files are the job's own
data, written as the job's user on its filesystem: the agent reads the step file as hostile
input (agent/stepfile.py), and this module never raises into the wrapper.

Stdlib only; the wrapper imports it only when the prolog named a step file.
"""

from __future__ import annotations

import json
import logging
import math
import os
import stat
import time
from typing import Any, Callable, Dict, List, Optional

from slurmiso.jobfiles import steps_report_path as report_path_for

__all__ = ["StepFolder", "decode", "read_bounded", "report_path_for"]
log = logging.getLogger(__name__)

#: Set by the prolog (task prolog env): where the wrapper writes the job's step file.
STEPS_FILE_ENV = "SLURMISO_STEPS_FILE"
#: Set by the wrapper for the program: where report_step writes its running totals.
REPORT_ENV = "SLURMISO_STEP_REPORT"
VERSION = 1
MAX_FIRST = 256  # step times kept for the baseline (monitor.signals.baseline_steps <= this)
MAX_RECENT = 120  # intervals kept (at FOLD_S apart: 4 minutes of history)
MAX_REPORT_BYTES = 64 * 1024
MAX_FILE_BYTES = 64 * 1024
FOLD_S = 2.0
_OPEN = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)


def _number(value: Any, lo: float = 0.0, hi: float = 1e15) -> Optional[float]:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    v = float(value)
    return v if math.isfinite(v) and lo <= v <= hi else None


def read_bounded(path: str, limit: int, uid: Optional[int] = None) -> Optional[bytes]:
    """A regular file's first ``limit`` bytes, not through a final symlink, not from a FIFO,
    only if owned by ``uid`` (when given); None if it is missing. OSError(errno) with a
    reason otherwise (ValueError for a file that is not what it must be)."""
    try:
        fd = os.open(path, _OPEN)
    except FileNotFoundError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ValueError("not a regular file")
        if uid is not None and uid >= 0 and st.st_uid != uid:
            raise ValueError(f"owned by uid {st.st_uid}, not the job's {uid}")
        data = os.read(fd, limit + 1)
    finally:
        os.close(fd)
    if len(data) > limit:
        raise ValueError(f"over {limit} bytes")
    return data


def decode(raw: bytes) -> Dict[str, Any]:
    """A step file as written by :class:`StepFolder`, every field checked; ValueError."""
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError):
        raise ValueError("not JSON") from None
    if not isinstance(data, dict) or data.get("v") != VERSION:
        raise ValueError(f"not a version {VERSION} step file")
    out: Dict[str, Any] = {"job": data.get("job") if isinstance(data.get("job"), str) else ""}
    for key in ("ts", "steps", "samples"):
        v = _number(data.get(key, 0))
        if v is None:
            raise ValueError(f"{key!r} is not a number")
        out[key] = v
    first = data.get("first", [])
    if not isinstance(first, list) or len(first) > MAX_FIRST:
        raise ValueError("'first' is not a list of step times")
    out["first"] = [v for v in (_number(x, 0.0, 1e7) for x in first) if v is not None]
    recent = data.get("recent", [])
    if not isinstance(recent, list) or len(recent) > MAX_RECENT:
        raise ValueError("'recent' is not a list of intervals")
    out["recent"] = []
    for item in recent:
        if not (isinstance(item, list) and len(item) == 3):
            raise ValueError("an interval is not [end, steps, seconds]")
        end, n, secs = _number(item[0]), _number(item[1], 0, 1e9), _number(item[2], 0, 1e9)
        if end is None or n is None or secs is None:
            raise ValueError("an interval holds something other than numbers")
        out["recent"].append((end, n, secs))
    return out


class StepFolder:
    """Folds the program's running totals into the job's step file, every :data:`FOLD_S`.

    :meth:`tick` is the supervisor's hook (its loop runs about twice a second); it never
    raises: a report it cannot read is skipped, a step file it cannot write is logged once.
    """

    def __init__(self, steps_file: str, job_id: str,
                 clock: Callable[[], float] = time.time) -> None:
        self.steps_file = steps_file
        self.report = report_path_for(steps_file)
        self.job_id = job_id
        self.clock = clock
        self.first: List[float] = []
        self.recent: List[List[float]] = []
        self.steps = 0.0
        self.samples = 0.0
        self._offset = (0.0, 0.0)  # steps, samples of earlier program processes
        self._last: Dict[str, float] = {}
        self._last_pid: Optional[int] = None
        self._first_pid: Optional[int] = None  # the process whose first steps are the baseline
        self._next = 0.0
        self._failed = False

    def start(self) -> Dict[str, str]:
        """Forget an earlier attempt's report; the variable the program needs."""
        try:
            os.unlink(self.report)
        except OSError:
            pass
        return {REPORT_ENV: self.report}

    def tick(self) -> None:
        now = self.clock()
        if now < self._next:
            return
        self._next = now + FOLD_S
        try:
            if self._fold(now):
                self._write(now)
        except Exception as exc:  # noqa: BLE001 - the job's own data never stops the job
            if not self._failed:
                log.warning("step times of job %s not folded: %s", self.job_id, exc)
            self._failed = True

    def finish(self) -> None:
        """A last fold when the program has ended (the report stays for nobody: removed)."""
        self._next = 0.0
        self.tick()
        try:
            os.unlink(self.report)
        except OSError:
            pass

    def _fold(self, now: float) -> bool:
        try:
            raw = read_bounded(self.report, MAX_REPORT_BYTES)
        except (OSError, ValueError):
            return False
        if raw is None:
            return False
        try:
            rep = json.loads(raw)
        except (ValueError, RecursionError):
            return False
        if not isinstance(rep, dict):
            return False
        cur = {k: _number(rep.get(k, 0)) for k in ("steps", "timed", "seconds", "samples")}
        pid = rep.get("pid")
        if any(v is None for v in cur.values()) or not isinstance(pid, int):
            return False
        totals: Dict[str, float] = {k: float(v or 0.0) for k, v in cur.items()}
        last = self._last
        if pid != self._last_pid or totals["steps"] < last.get("steps", 0.0):
            # another program process (or its totals started over): its totals add on
            self._offset = (self.steps, self.samples)
            last = {}
        timed = totals["timed"] - last.get("timed", 0.0)
        seconds = totals["seconds"] - last.get("seconds", 0.0)
        if timed > 0 and seconds >= 0:
            self.recent.append([round(now, 3), timed, round(seconds, 6)])
            del self.recent[:-MAX_RECENT]
        if self._first_pid is None:
            self._first_pid = pid
        first = rep.get("first")
        if isinstance(first, list) and pid == self._first_pid:
            times = [_number(x, 0.0, 1e7) for x in first[:MAX_FIRST]]
            self.first = [t for t in times if t is not None]
        self._last_pid, self._last = pid, totals
        self.steps = self._offset[0] + totals["steps"]
        self.samples = self._offset[1] + totals["samples"]
        return True

    def _write(self, now: float) -> None:
        body = json.dumps({
            "v": VERSION, "job": self.job_id, "ts": round(now, 3), "steps": self.steps,
            "samples": self.samples, "first": self.first, "recent": self.recent,
        }, separators=(",", ":"))
        from slurmiso.atomic import write_atomic

        # 0644: an agent on an NFS home with root squashed reads it as nobody
        write_atomic(self.steps_file, body, 0o644, durable=False)
