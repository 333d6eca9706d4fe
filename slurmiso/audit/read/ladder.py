"""What the audit keeps of the monitor's ladder lines (``monitor-action``, docs/monitor.md,
"What it cost"), folded in one pass by :class:`~slurmiso.audit.read.digest.JournalDigest`.

A line is the monitor's (root, ``source: "monitor"``: the digest checked the writer), but
its SLO figures came from an inference job's own metrics endpoint, and a journal is a file
that others can damage. So each line is checked whole before any of it counts: a step name
the ladder does not take, a figure of the wrong type, negative, not finite or beyond what
any real one reaches, a duration below zero or above :data:`MAX_DURATION_S`, a job id that
is not one makes it a *bad line*: counted, reported with why (fixed text, never the
line's own), and left out of every figure. A figure that is simply absent is unknown
(None), never 0.

Small by design: the ladder is budgeted (a few steps an hour per GPU), so its lines are few;
counts are kept per (step, class, node) and durations per (class, node), resolved to pools
by the report (:mod:`slurmiso.audit.figures.ladder`).
"""

from __future__ import annotations

import bisect
import math
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Set, Tuple

#: The ladder's steps as the audit names them, in the order a report lists them; the
#: monitor's action names map onto them (``resume-job`` resumes a suspended job,
#: ``ladder-end`` is a restraint that ended without the ladder: job gone, resumed by others).
STEPS = ("hold", "throttle", "unthrottle", "park", "unpark", "suspend", "resume", "requeue",
         "ended", "host-limit", "host-unlimit")
_STEP_OF = {"throttle": "throttle", "unthrottle": "unthrottle", "suspend": "suspend",
            "resume-job": "resume", "ladder-end": "ended", "requeue": "requeue", "hold": "hold",
            "park": "park", "unpark": "unpark", "host-limit": "host-limit",
            "host-unlimit": "host-unlimit"}
#: The optional rungs' steps (park, issue 35; the host rung, issue 36): a report lists their
#: rows where a window has any.
PARK_STEPS = ("park", "unpark", "host-limit", "host-unlimit")
#: Steps that restrain (their line's ``figure`` is the SLO figure at the step) and those
#: that release (``figure_before``: when the job was first restrained, ``figure_after``: now).
ESCALATIONS = ("throttle", "park", "suspend", "requeue")
RELEASES = ("unthrottle", "unpark", "resume", "ended")
#: A host-unlimit line eases a limit to ``details.level``; only level 0 releases it.
_MAX_LEVEL = 100
SIGNALS = ("p99_ms", "error_rate")
UNKNOWN = "unknown"

#: Longer than any restraint in a journal a year old: a larger duration is not a real one.
MAX_DURATION_S = 400 * 86400.0
#: A P99 of hours is no longer a latency (the agent reports milliseconds).
MAX_P99_MS = 1e7
#: A job id as squeue prints one: plain, an array task, a pending array's tasks, a het part.
_JOB_ID = re.compile(r"[0-9]{1,12}(_([0-9]{1,10}|\[[0-9,%-]{1,100}\]))?(\+[0-9]{1,4})?")
_MAX_NAME = 100
_MAX_SAMPLES = 3


class BadLine(ValueError):
    """A ladder line that cannot be counted; its message is the audit's own text."""


@dataclass
class SloTally:
    """One signal's figures on one step's lines: sums and counts (means at the end)."""

    n: int = 0  # lines that carried the figure at the step
    total: float = 0.0
    top: float = 0.0
    pairs: int = 0  # release lines with both the figure before and after
    before: float = 0.0
    after: float = 0.0

    def to_dict(self) -> Dict[str, Any]:
        return {"figures": self.n, "figure_mean": _mean(self.total, self.n),
                "figure_max": _r(self.top) if self.n else None,
                "pairs": self.pairs, "before_mean": _mean(self.before, self.pairs),
                "after_mean": _mean(self.after, self.pairs)}


@dataclass
class Restrained:
    """Throttled and suspended time of one (class, node): the lines that carried it, the
    seconds, GPU-seconds where the training job's GPUs are known, and how many lines'
    GPUs were not."""

    throttled_n: int = 0
    throttled_s: float = 0.0
    throttled_gpu_s: float = 0.0
    throttled_unknown_gpus: int = 0
    suspended_n: int = 0
    suspended_s: float = 0.0
    suspended_gpu_s: float = 0.0
    suspended_unknown_gpus: int = 0

    def merge(self, other: Restrained) -> None:
        for kind in ("throttled", "suspended"):
            for name in (f"{kind}_n", f"{kind}_s", f"{kind}_gpu_s", f"{kind}_unknown_gpus"):
                setattr(self, name, getattr(self, name) + getattr(other, name))


@dataclass
class LadderLog:
    """The ladder lines of a window, checked and counted."""

    #: Lines that counted (taken, dry run or failed) and lines left out as bad.
    lines: int = 0
    bad: int = 0
    bad_samples: List[str] = field(default_factory=list)
    #: (step, class of the training job, node) -> steps taken (ok, not a dry run)
    taken: Counter[Tuple[str, str, str]] = field(default_factory=Counter)
    dry_run: Counter[str] = field(default_factory=Counter)  # step -> dry-run lines
    failed: Counter[str] = field(default_factory=Counter)  # step -> lines with ok false
    #: (step, signal) -> the SLO figures its lines carried
    slo: Dict[Tuple[str, str], SloTally] = field(default_factory=dict)
    #: (class, node) -> throttled / suspended time, clipped to the window
    restrained: Dict[Tuple[str, str], Restrained] = field(default_factory=dict)
    #: jobs throttled / suspended in the window with no release read yet
    open_throttled: Set[str] = field(default_factory=set)
    open_suspended: Set[str] = field(default_factory=set)
    open_parked: Set[str] = field(default_factory=set)
    open_host_limited: Set[str] = field(default_factory=set)
    #: job -> (its hardest open step, when it was taken) while unreleased: the finding's
    #: job ids and ages (issue 33)
    open_since: Dict[str, Tuple[str, float]] = field(default_factory=dict)
    #: The latest time of a ladder line read (how long an open restraint lasted at least).
    last_ts: Optional[float] = None
    #: job -> sorted Unix times the ladder requeued it (the sacct pass matches attempts)
    requeued_at: Dict[str, List[float]] = field(default_factory=dict)

    def add(self, rec: Dict[str, Any], when: float, since: Optional[float],
            job_class: Dict[str, str], job_gpus: Dict[str, Tuple[int, int]]) -> None:
        """Fold one ``monitor-action`` line in, if it is the ladder's (else nothing)."""
        try:
            line = _check(rec)
        except BadLine as exc:
            self.bad += 1
            if len(self.bad_samples) < _MAX_SAMPLES and str(exc) not in self.bad_samples:
                self.bad_samples.append(str(exc))
            return
        if line is None:
            return
        step, job, node, cls, d = line
        self.lines += 1
        self.last_ts = when if self.last_ts is None else max(self.last_ts, when)
        if d["dry_run"]:
            self.dry_run[step] += 1
            return
        if not d["ok"]:
            self.failed[step] += 1
            return
        if step != "hold":
            cls = job_class.get(job, UNKNOWN)
        self.taken[(step, cls, node)] += 1
        if d["signal"]:
            self._slo(step, d)
        self._track(step, job, when, d["level"])
        if d["throttled_s"] is not None or d["suspended_s"] is not None:
            self._restrained(cls, node, _gpus(job_gpus.get(job)), d, when, since)

    def _slo(self, step: str, d: Dict[str, Any]) -> None:
        """The SLO figure at a restraining step; before and after at a release."""
        tally = self.slo.get((step, d["signal"]))
        if tally is None:
            tally = self.slo[(step, d["signal"])] = SloTally()
        figure = d["figure"]
        if figure is not None and step in ESCALATIONS:
            tally.n += 1
            tally.total += figure
            tally.top = max(tally.top, figure)
        before, after = d["figure_before"], d["figure_after"]
        if step in RELEASES and before is not None and after is not None:
            tally.pairs += 1
            tally.before += before
            tally.after += after

    def _track(self, step: str, job: str, when: float, level: int = 0) -> None:
        """Which jobs are restrained now, since when, and when the ladder requeued one."""
        if step == "throttle":
            self.open_throttled.add(job)
            self.open_since.setdefault(job, (step, when))
        elif step in ("park", "suspend"):
            (self.open_parked if step == "park" else self.open_suspended).add(job)
            self.open_since[job] = (step, when)
        elif step == "requeue":
            bisect.insort(self.requeued_at.setdefault(job, []), when)
        elif step == "host-limit":
            self.open_host_limited.add(job)
            self.open_since.setdefault(job, (step, when))
        elif step == "host-unlimit" and level == 0:
            self.open_host_limited.discard(job)
        if step in ("unthrottle", "requeue", "ended"):
            self.open_throttled.discard(job)
        if step in ("resume", "requeue", "ended"):
            self.open_suspended.discard(job)
        if step in ("unpark", "requeue", "ended"):
            self.open_parked.discard(job)
        if job not in (self.open_throttled | self.open_suspended | self.open_parked
                       | self.open_host_limited):
            self.open_since.pop(job, None)
        elif step in ("resume", "unpark", "unthrottle") and job in self.open_since:
            self.open_since[job] = (self._hardest(job), self.open_since[job][1])

    def _hardest(self, job: str) -> str:
        """The hardest restraint still open on ``job`` (it still restrained)."""
        for step, open_ in (("suspend", self.open_suspended), ("park", self.open_parked),
                            ("throttle", self.open_throttled),
                            ("host-limit", self.open_host_limited)):
            if job in open_:
                return step
        return "throttle"

    def _restrained(self, cls: str, node: str, gpus: Optional[int], d: Dict[str, Any],
                    when: float, since: Optional[float]) -> None:
        """Throttled and suspended time a release line carries, clipped to the window."""
        held = self.restrained.get((cls, node))
        if held is None:
            held = self.restrained[(cls, node)] = Restrained()
        for seconds, kind in ((d["throttled_s"], "throttled"), (d["suspended_s"], "suspended")):
            if seconds is None:
                continue
            # the part of [when - seconds, when] inside the window (lines after its end are
            # not read at all)
            clipped = seconds if since is None else max(0.0, min(seconds, when - since))
            setattr(held, f"{kind}_n", getattr(held, f"{kind}_n") + 1)
            setattr(held, f"{kind}_s", getattr(held, f"{kind}_s") + clipped)
            if gpus is None:
                setattr(held, f"{kind}_unknown_gpus", getattr(held, f"{kind}_unknown_gpus") + 1)
            else:
                setattr(held, f"{kind}_gpu_s", getattr(held, f"{kind}_gpu_s") + clipped * gpus)

    def requeued_within(self, job: str, start: float, end: float, slack: float) -> bool:
        """Whether the ladder requeued ``job`` during its attempt ``[start, end]``."""
        times = self.requeued_at.get(job)
        if not times:
            return False
        i = bisect.bisect_left(times, start)
        return i < len(times) and times[i] <= end + slack

    @property
    def active(self) -> bool:
        return bool(self.lines)


def _gpus(attempt: Optional[Tuple[int, int]]) -> Optional[int]:
    return attempt[1] if attempt is not None and attempt[1] > 0 else None


Checked = Tuple[str, str, str, str, Dict[str, Any]]


def _check(rec: Dict[str, Any]) -> Optional[Checked]:
    """(step, job, node, class, facts) of a ladder line, None for another monitor action;
    :class:`BadLine` for one that cannot be counted."""
    raw = rec.get("details")
    details: Dict[str, Any] = raw if isinstance(raw, dict) else {}
    step = _step(rec.get("action"), details)
    if step is None:
        return None
    if raw is not None and not isinstance(raw, dict):
        raise BadLine("details is not an object")
    if details.get("step", rec.get("action")) != rec.get("action"):
        raise BadLine("details.step does not match the action")
    job = rec.get("target")
    if not isinstance(job, str) or not _JOB_ID.fullmatch(job):
        raise BadLine("target is not a job id")
    node = details.get("node")
    if node is None:
        node = ""
    elif not _name(node):
        raise BadLine("details.node is not a node name")
    cls = UNKNOWN
    named_cls = details.get("job_class")
    if step == "hold" and named_cls not in (None, ""):
        if not _name(named_cls):
            raise BadLine("details.job_class is not a class name")
        cls = named_cls
    return step, job, node, cls, _facts(rec, details, step)


def _step(action: Any, details: Dict[str, Any]) -> Optional[str]:
    """The ladder's step a monitor action is, None where it is not the ladder's."""
    if action == "hold":
        if details.get("ladder") != "hold":
            return None  # admission's own hold (load, stagger): not a ladder step
    elif action == "requeue":
        if "restraint" not in details:
            return None  # the monitor's requeue of a pending job (begin-now etc.)
    elif action not in _STEP_OF:
        if "restraint" in details or "step" in details:
            raise BadLine("a ladder line names a step the ladder does not take")
        return None
    return _STEP_OF[str(action)]


def _name(value: Any) -> bool:
    return isinstance(value, str) and len(value) <= _MAX_NAME and value.isprintable()


def _facts(rec: Dict[str, Any], details: Dict[str, Any], step: str) -> Dict[str, Any]:
    """ok, dry_run, the signal and its figures, the restrained durations of a line."""
    facts: Dict[str, Any] = {"ok": _flag(rec, "ok", True), "dry_run": _flag(rec, "dry_run", False)}
    signal = _signal(details.get("signal"))
    restraint = details.get("restraint")
    if restraint is not None and not isinstance(restraint, dict):
        raise BadLine("details.restraint is not an object")
    # figure_before is the figure when the job was first restrained, of the restraint's
    # signal; the line's own signal may be another by now (the one nearest its limit)
    first = _signal((restraint or {}).get("signal")) or signal
    facts["signal"] = signal
    level = details.get("level", 0)
    if step in ("host-limit", "host-unlimit") and (
            isinstance(level, bool) or not isinstance(level, int) or not 0 <= level <= _MAX_LEVEL):
        raise BadLine("details.level is not a host rung's level")
    facts["level"] = level if step in ("host-limit", "host-unlimit") else 0
    for name in ("figure", "figure_after", "limit"):
        facts[name] = _figure(details.get(name), signal, name)
    facts["figure_before"] = _figure(details.get("figure_before"), first, "figure_before")
    if first != signal:
        facts["figure_before"] = None  # not comparable with the figure after
    for name, ends in (("throttled_s", ("unthrottle", "requeue", "ended")),
                       ("suspended_s", ("resume", "requeue", "ended"))):
        facts[name] = _duration(details.get(name), name)
        if facts[name] is not None and step not in ends:
            raise BadLine(f"details.{name} on a {step} line, which ends no restraint")
    return facts


def _signal(value: Any) -> str:
    if value in (None, ""):
        return ""
    if value not in SIGNALS:
        raise BadLine("details.signal is not p99_ms or error_rate")
    return str(value)


def _flag(rec: Dict[str, Any], name: str, default: bool) -> bool:
    value = rec.get(name, default)
    if not isinstance(value, bool):
        raise BadLine(f"{name} is not true or false")
    return value


def _number(value: Any, name: str) -> Optional[float]:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise BadLine(f"details.{name} is not a number")
    number = float(value)
    if not math.isfinite(number) or number < 0:
        raise BadLine(f"details.{name} is negative or not finite")
    return number


def _figure(value: Any, signal: str, name: str) -> Optional[float]:
    number = _number(value, name)
    if number is None:
        return None
    if not signal:
        raise BadLine(f"details.{name} without a signal to say what it measures")
    if number > (1.0 if signal == "error_rate" else MAX_P99_MS):
        raise BadLine(f"details.{name} is beyond any real {signal}")
    return number


def _duration(value: Any, name: str) -> Optional[float]:
    number = _number(value, name)
    if number is not None and number > MAX_DURATION_S:
        raise BadLine(f"details.{name} is longer than {MAX_DURATION_S / 86400:.0f} days")
    return number


def _mean(total: float, n: int) -> Optional[float]:
    return _r(total / n) if n else None


def _r(value: float) -> float:
    return round(value, 4)
