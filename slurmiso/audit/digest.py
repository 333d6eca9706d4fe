"""What the audit keeps from slurmiso's journals (see docs/journal.md), folded in one pass.

Pure: feed it journal records (dicts, in time order as ``read_journals`` merges them) and
read the summary. Journals are far smaller than accounting, so per-job facts are kept here
(successful checkpoint times, resume steps, classes) for the sacct pass to look up.

Records tagged ``source: job`` were written by the job's own user: they are the job's report
of its checkpoints, good for cost estimates, never evidence for anything privileged.
"""

from __future__ import annotations

import bisect
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from slurmiso.audit.quantiles import LogHistogram
from slurmiso.state.journal import parse_ts

#: Journal events the audit reads (passed to ``read_journals`` so the rest is skipped early).
EVENTS = {
    "prolog", "job-end", "reconcile", "mps-user-conflict", "preempt-signal",
    "checkpoint-start", "checkpoint-end", "requeue", "requeue-declined", "resume",
    "monitor-action",
}
_MAX_IDS = 50


@dataclass
class CheckpointStats:
    """Time to checkpoint vs the grace Slurm gives before SIGKILL, for one class."""

    started: int = 0
    ok: int = 0
    failed: int = 0
    over_grace: int = 0
    grace_s: Optional[float] = None
    durations: LogHistogram = field(default_factory=LogHistogram)


#: sacct times are whole seconds; journal times are not.
_SACCT_SLACK_S = 2.0


@dataclass
class JournalDigest:
    records: int = 0
    #: job -> sorted Unix times of successful checkpoint-end events
    checkpoints_ok: Dict[str, List[float]] = field(default_factory=dict)
    #: jobs that ever began a checkpoint (they do handle the signal)
    checkpointing_jobs: set = field(default_factory=set)
    job_class: Dict[str, str] = field(default_factory=dict)
    checkpoints: Dict[str, CheckpointStats] = field(default_factory=dict)
    #: job -> resume steps reported, in order (progress across requeues)
    resume_steps: Dict[str, List[Any]] = field(default_factory=dict)
    preempt_signals: Counter = field(default_factory=Counter)
    #: job -> sorted Unix times the wrapper saw a *preemption* signal (not a time limit)
    preempted_at: Dict[str, List[float]] = field(default_factory=dict)
    requeues: Counter = field(default_factory=Counter)  # by reason
    requeued_jobs: set = field(default_factory=set)  # jobs the wrapper says it requeued
    requeue_declined: List[Tuple[str, str]] = field(default_factory=list)
    monitor_actions: Counter = field(default_factory=Counter)
    monitor_dry_run: int = 0
    #: (class, p99 ms) samples from monitor-action details that carry a latency
    latency: List[Tuple[str, float]] = field(default_factory=list)
    idle_jobs: Dict[str, str] = field(default_factory=dict)  # job -> reason (monitor)
    reconcile_fixes: Counter = field(default_factory=Counter)  # node -> fixes made
    mps_conflicts: List[Tuple[str, str]] = field(default_factory=list)  # (node, job)
    refused: Counter = field(default_factory=Counter)  # prolog refusal reasons
    _pending_grace: Dict[str, Tuple[float, float]] = field(default_factory=dict)

    def add(self, rec: Dict[str, Any]) -> None:
        self.records += 1
        event = rec.get("event")
        job = str(rec.get("job", ""))
        if event in ("prolog", "job-end"):
            if rec.get("class"):
                self.job_class[job] = str(rec["class"])
            if (_float(rec.get("restart_count")) or 0) > 0:
                self.requeued_jobs.add(job)
            if event == "prolog" and rec.get("outcome") == "refused":
                self.refused[str(rec.get("reason", "?"))[:120]] += 1
        elif event == "checkpoint-start":
            self.checkpointing_jobs.add(job)
            grace = _float(rec.get("grace_s"))
            self._pending_grace[job] = (_ts(rec), grace if grace is not None else -1.0)
        elif event == "checkpoint-end":
            self._checkpoint_end(job, rec)
        elif event == "preempt-signal":
            self.preempt_signals[job] += 1
            if rec.get("cause", "preempted") == "preempted":
                bisect.insort(self.preempted_at.setdefault(job, []), _ts(rec))
        elif event == "requeue":
            self.requeues[str(rec.get("reason", "?"))] += 1
            self.requeued_jobs.add(job)
        elif event == "requeue-declined":
            if len(self.requeue_declined) < _MAX_IDS:
                self.requeue_declined.append((job, str(rec.get("reason", ""))))
        elif event == "resume":
            self.resume_steps.setdefault(job, []).append(rec.get("step"))
        elif event == "monitor-action":
            self._monitor(rec)
        elif event == "reconcile" and not rec.get("dry_run"):
            self.reconcile_fixes[str(rec.get("node", rec.get("host", "?")))] += 1
        elif event == "mps-user-conflict" and len(self.mps_conflicts) < _MAX_IDS:
            self.mps_conflicts.append((str(rec.get("node", "?")), job))

    def _checkpoint_end(self, job: str, rec: Dict[str, Any]) -> None:
        self.checkpointing_jobs.add(job)
        stats = self.checkpoints.setdefault(self.job_class.get(job, "unknown"), CheckpointStats())
        stats.started += 1
        started, grace = self._pending_grace.pop(job, (0.0, -1.0))
        if grace >= 0:
            stats.grace_s = grace
        duration = _float(rec.get("duration_s"))
        if duration is None and started:
            duration = max(0.0, _ts(rec) - started)
        if not rec.get("ok"):
            stats.failed += 1
            return
        stats.ok += 1
        bisect.insort(self.checkpoints_ok.setdefault(job, []), _ts(rec))
        if duration is not None:
            stats.durations.add(duration)
            if grace >= 0 and duration > grace:
                stats.over_grace += 1

    def _monitor(self, rec: Dict[str, Any]) -> None:
        action = str(rec.get("action", "?"))
        self.monitor_actions[action] += 1
        if rec.get("dry_run"):
            self.monitor_dry_run += 1
        raw = rec.get("details")
        details: Dict[str, Any] = raw if isinstance(raw, dict) else {}
        latency = _float(details.get("p99_latency_ms"))
        if latency is not None:
            self.latency.append((str(details.get("class", "")), latency))
        reason = str(rec.get("reason", ""))
        if "idle" in reason.lower() and len(self.idle_jobs) < 10 * _MAX_IDS:
            self.idle_jobs[str(rec.get("target", ""))] = reason

    def last_checkpoint(self, job: str, start: float, end: float) -> Optional[float]:
        """Time of the last successful checkpoint of ``job`` within ``[start, end]``."""
        times = self.checkpoints_ok.get(job)
        if not times:
            return None
        i = bisect.bisect_right(times, end) - 1
        return times[i] if i >= 0 and times[i] >= start else None

    def preempted_within(self, job: str, start: float, end: float) -> bool:
        """Whether the wrapper saw ``job`` preempted during ``[start, end]`` (an attempt the
        wrapper requeued itself shows REQUEUED in sacct, not PREEMPTED)."""
        times = self.preempted_at.get(job)
        if not times:
            return False
        i = bisect.bisect_left(times, start)
        # sacct's End is whole seconds (truncated); the wrapper's signal time has ms
        return i < len(times) and times[i] <= end + _SACCT_SLACK_S

    def made_progress(self, job: str) -> bool:
        """Whether journals show the job moving forward across its attempts."""
        if len(self.checkpoints_ok.get(job, ())) > 0:
            return True
        steps = [s for s in self.resume_steps.get(job, ()) if isinstance(s, (int, float))]
        return len(steps) >= 2 and steps[-1] > steps[0]


def _ts(rec: Dict[str, Any]) -> float:
    try:
        return parse_ts(str(rec["ts"])).timestamp()
    except (KeyError, ValueError):
        return 0.0


def _float(value: Any) -> Optional[float]:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)
