"""What the audit keeps from slurmiso's journals (see docs/journal.md), folded in one pass.

Pure: feed it journal records (dicts, in time order as ``read_journals`` merges them) and
read the summary. Journals are far smaller than accounting, so per-job facts are kept here
(successful checkpoint times, resume steps, classes) for the sacct pass to look up.

Trust boundary. A line counts only when its writer is one the event can come from:

- ``prolog``, ``job-end``, ``reconcile``, ``mps-user-conflict``: the hooks, as root, which
  write no ``source`` field;
- ``monitor-action``, ``monitor-telemetry``: the monitor, as root, ``source: "monitor"``;
- the wrapper's events (``preempt-signal``, ``checkpoint-*``, ``requeue*``, ``resume``): the
  job's own user, folded in by the epilog with ``source: "job"``. They are the job's *report*
  (time to checkpoint, lost work since its last checkpoint), shown as user-reported, never
  evidence for anything privileged.

Anything else (a job's events file claiming ``job-end`` or ``monitor-action``, an unknown
``source``) is counted as rejected, with the jobs named, and read no further.
"""

from __future__ import annotations

import bisect
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Set, Tuple

from slurmiso.audit.figures.quantiles import LogHistogram
from slurmiso.audit.read.ladder import LadderLog
from slurmiso.audit.read.sacct import parse_time
from slurmiso.audit.read.telemetry import TelemetryLog
from slurmiso.config.model import SHARED_MODES
from slurmiso.state.journal import JOB_SOURCE, MONITOR_SOURCE, parse_ts

#: Journal events the audit reads (passed to ``read_journals`` so the rest is skipped early).
EVENTS = {
    "prolog", "job-end", "reconcile", "mps-user-conflict", "preempt-signal",
    "checkpoint-start", "checkpoint-end", "requeue", "requeue-declined", "requeue-closed",
    "resume", "monitor-action", "not-preempted", "throttle", "unthrottle",
    "monitor-telemetry",
}
_MAX_IDS = 50
#: event -> the only ``source`` it may carry (None: the hooks, which write no source).
WRITER: Dict[str, Optional[str]] = {
    "prolog": None, "job-end": None, "reconcile": None, "mps-user-conflict": None,
    "not-preempted": None,
    "monitor-action": MONITOR_SOURCE,
    "monitor-telemetry": MONITOR_SOURCE,
    **{event: JOB_SOURCE for event in (
        "preempt-signal", "checkpoint-start", "checkpoint-end", "requeue", "requeue-declined",
        "requeue-closed", "resume", "throttle", "unthrottle")},
}


@dataclass
class CheckpointStats:
    """Time to checkpoint vs the grace Slurm gives before SIGKILL, for one class."""

    started: int = 0
    ok: int = 0
    failed: int = 0
    over_grace: int = 0
    grace_s: Optional[float] = None
    durations: LogHistogram = field(default_factory=LogHistogram)
    periodic: int = 0  # checkpoint-end with requested: false (not counted above)
    over_grace_jobs: List[str] = field(default_factory=list)
    failed_jobs: List[str] = field(default_factory=list)


#: sacct times are whole seconds; journal times are not.
_SACCT_SLACK_S = 2.0
#: The monitor journals its requeue once ``scontrol requeue`` has returned; the job's
#: wrapper may have read the SIGTERM and decided a moment before that line was written.
_DECLINE_SLACK_S = 60.0


@dataclass
class JournalDigest:
    records: int = 0
    #: job -> sorted Unix times of successful checkpoint-end events
    checkpoints_ok: Dict[str, List[float]] = field(default_factory=dict)
    #: jobs that ever began a checkpoint (they do handle the signal)
    checkpointing_jobs: Set[str] = field(default_factory=set)
    job_class: Dict[str, str] = field(default_factory=dict)
    checkpoints: Dict[str, CheckpointStats] = field(default_factory=dict)
    #: job -> resume steps reported, in order (progress across requeues)
    resume_steps: Dict[str, List[Any]] = field(default_factory=dict)
    preempt_signals: Counter[str] = field(default_factory=Counter)
    #: job -> sorted Unix times the wrapper saw a *preemption* signal (not a time limit)
    preempted_at: Dict[str, List[float]] = field(default_factory=dict)
    #: job -> sorted Start times (Unix) of attempts slurmctld confirmed unpreempted to the
    #: epilog (``not-preempted``, root): Slurm 24.05+ names such a finished attempt PREEMPTED.
    #: The wrapper's own ``requeue-closed`` line is only its claim and counts for nothing.
    unpreempted_starts: Dict[str, List[float]] = field(default_factory=dict)
    requeues: Counter[str] = field(default_factory=Counter)  # by reason
    requeued_jobs: Set[str] = field(default_factory=set)  # jobs the wrapper says it requeued
    requeue_declined: List[Tuple[str, str]] = field(default_factory=list)
    #: The wrapper's "declined" lines that were the monitor's own requeue of the attempt
    #: (its SIGTERM read as a preemption, Slurm already showing the job requeued): (job,
    #: "ladder" or "monitor" for a re-layout's). Never counted as declined requeues.
    monitor_requeue_declines: List[Tuple[str, str]] = field(default_factory=list)
    #: job -> (when, "ladder"/"monitor") of the monitor's latest requeue of its running
    #: attempt, until the job's next attempt starts (its prolog): what a decline is matched on
    _monitor_requeued: Dict[str, Tuple[float, str]] = field(default_factory=dict)
    monitor_actions: Counter[str] = field(default_factory=Counter)
    monitor_dry_run: int = 0
    #: (class, p99 ms) samples from monitor-action details that carry a latency
    latency: List[Tuple[str, float]] = field(default_factory=list)
    idle_jobs: Dict[str, str] = field(default_factory=dict)  # job -> reason (monitor)
    reconcile_fixes: Counter[str] = field(default_factory=Counter)  # node -> fixes made
    mps_conflicts: List[Tuple[str, str]] = field(default_factory=list)  # (node, job)
    #: MPS jobs' time on their GPU (node, gpu, uid, start, end), from ``job-end`` lines:
    #: what :mod:`slurmiso.audit.figures.mps_sharing` splits into concurrent and serialised
    mps_intervals: List[Tuple[str, int, int, float, float]] = field(default_factory=list)
    refused: Counter[str] = field(default_factory=Counter)  # prolog refusal reasons
    rejected: int = 0  # lines whose writer cannot have written that event (see WRITER)
    rejected_jobs: List[str] = field(default_factory=list)
    rejected_samples: List[str] = field(default_factory=list)
    user_reported: int = 0  # lines accepted as the job's own report (source: job)
    #: The ladder's steps on running training, checked line by line (read/ladder.py).
    ladder: LadderLog = field(default_factory=LadderLog)
    #: How long each node's telemetry was unknown (read/telemetry.py).
    telemetry: TelemetryLog = field(default_factory=TelemetryLog)
    #: The latest time of a line read in the window (where an open outage is counted to).
    last_ts: Optional[float] = None
    #: job -> (restart count, GPUs) of its latest attempt in a pool the ladder acts on (the
    #: prolog's ``gpus``, summed over its nodes): what a throttled second costs in GPUs.
    #: Kept for those pools' jobs only, so exclusive pools cost nothing here.
    job_gpus: Dict[str, Tuple[int, int]] = field(default_factory=dict)
    _pending_grace: Dict[str, Tuple[float, float]] = field(default_factory=dict)
    #: Lines before this time (Unix seconds) only tell a job's class (a job that started
    #: before the window): the audit reads the journals from a week earlier for that.
    since: Optional[float] = None

    def add(self, rec: Dict[str, Any]) -> None:
        event = rec.get("event")
        job = str(rec.get("job", ""))
        source = rec.get("source")
        if self.since is not None and _ts(rec) < self.since:
            self._before_window(rec, event, job, source)
            return
        self.records += 1
        when = _ts(rec)
        if self.last_ts is None or when > self.last_ts:
            self.last_ts = when
        if event not in WRITER or WRITER[event] != source:
            self._reject(rec, str(event), job, source)
            return
        if source == "job":
            self.user_reported += 1
        handler = _HANDLERS.get(str(event))
        if handler is not None:
            handler(self, job, rec, when)

    def _before_window(self, rec: Dict[str, Any], event: Any, job: str, source: Any) -> None:
        """A line from before the window: only what a job in it may need."""
        assert self.since is not None
        if event == "monitor-telemetry" and source == MONITOR_SOURCE:
            self.telemetry.add(rec, _ts(rec), self.since)  # an outage reaching in
        elif event == "monitor-action" and source == MONITOR_SOURCE:
            # its decline may be folded in the window
            self._monitor_requeue(str(rec.get("target", "")), rec)
        elif event == "prolog" and source is None:
            self._monitor_requeued.pop(job, None)
        if event in ("prolog", "job-end") and source is None and rec.get("class"):
            self.job_class[job] = str(rec["class"])
        if event == "prolog" and source is None and rec.get("mode") in SHARED_MODES \
                and rec.get("outcome") != "refused":
            self._gpus(job, rec)  # a job restrained in the window may start before it

    def _job_line(self, job: str, rec: Dict[str, Any], when: float) -> None:
        """``prolog`` and ``job-end``: the job's class, requeues, GPUs, refusals, MPS time."""
        event = rec.get("event")
        if event == "prolog":
            self._monitor_requeued.pop(job, None)  # a new attempt: earlier requeues are over
        if rec.get("class"):
            self.job_class[job] = str(rec["class"])
        if (_float(rec.get("restart_count")) or 0) > 0:
            self.requeued_jobs.add(job)
        if event == "prolog" and rec.get("outcome") == "refused":
            self.refused[str(rec.get("reason", "?"))[:120]] += 1
        elif event == "prolog" and rec.get("mode") in SHARED_MODES:
            self._gpus(job, rec)
        if event == "job-end" and rec.get("mode") == "mps":
            from slurmiso.audit.figures.mps_sharing import interval_of

            span = interval_of(rec)
            if span is not None:
                self.mps_intervals.append(span)

    def _checkpoint_start(self, job: str, rec: Dict[str, Any], when: float) -> None:
        self.checkpointing_jobs.add(job)
        grace = _float(rec.get("grace_s"))
        self._pending_grace[job] = (_when(rec), grace if grace is not None else -1.0)

    def _preempt_signal(self, job: str, rec: Dict[str, Any], when: float) -> None:
        self.preempt_signals[job] += 1
        if rec.get("cause", "preempted") == "preempted":
            bisect.insort(self.preempted_at.setdefault(job, []), _when(rec))

    def _requeue(self, job: str, rec: Dict[str, Any], when: float) -> None:
        self.requeues[str(rec.get("reason", "?"))] += 1
        self.requeued_jobs.add(job)

    def _not_preempted(self, job: str, rec: Dict[str, Any], when: float) -> None:
        start = parse_time(str(rec.get("start", ""))[:40])
        if start is not None:
            bisect.insort(self.unpreempted_starts.setdefault(job, []), start)

    def _resume(self, job: str, rec: Dict[str, Any], when: float) -> None:
        self.resume_steps.setdefault(job, []).append(rec.get("step"))

    def _telemetry(self, job: str, rec: Dict[str, Any], when: float) -> None:
        self.telemetry.add(rec, when, self.since)

    def _reconcile(self, job: str, rec: Dict[str, Any], when: float) -> None:
        if not rec.get("dry_run"):
            self.reconcile_fixes[str(rec.get("node", rec.get("host", "?")))] += 1

    def _mps_conflict(self, job: str, rec: Dict[str, Any], when: float) -> None:
        if len(self.mps_conflicts) < _MAX_IDS:
            self.mps_conflicts.append((str(rec.get("node", "?")), job))

    def _gpus(self, job: str, rec: Dict[str, Any]) -> None:
        """The GPUs one node's prolog gave ``job``, added to its attempt's (a requeued
        attempt starts over)."""
        gpus = rec.get("gpus")
        restarts = rec.get("restart_count")
        if not isinstance(gpus, list) or len(gpus) > 64:
            return
        attempt = restarts if isinstance(restarts, int) and not isinstance(restarts, bool) else 0
        had = self.job_gpus.get(job)
        if had is not None and had[0] == attempt:
            self.job_gpus[job] = (attempt, had[1] + len(gpus))
        elif had is None or had[0] < attempt:
            self.job_gpus[job] = (attempt, len(gpus))

    def _reject(self, rec: Dict[str, Any], event: str, job: str, source: Any) -> None:
        self.rejected += 1
        if job and len(self.rejected_jobs) < _MAX_IDS and job not in self.rejected_jobs:
            self.rejected_jobs.append(job)
        if len(self.rejected_samples) < 3:
            want = WRITER.get(event, "?")
            self.rejected_samples.append(
                f"{event[:40]} from source {str(source)[:20] if source else '(hooks)'}"
                f" (only {want or '(hooks)'} writes it)" if event in WRITER
                else f"unknown event {event[:40]}")

    def _checkpoint_end(self, job: str, rec: Dict[str, Any], when: float = 0.0) -> None:
        """Time to checkpoint counts checkpoints the preemption *asked* for (after a
        ``checkpoint-start``, ``requested`` not false); periodic ones only mark progress."""
        self.checkpointing_jobs.add(job)
        stats = self.checkpoints.setdefault(self.job_class.get(job, "unknown"), CheckpointStats())
        ok = rec.get("ok") is True
        if ok:
            bisect.insort(self.checkpoints_ok.setdefault(job, []), _when(rec))
        if rec.get("requested") is False:
            stats.periodic += 1
            return
        stats.started += 1
        started, grace = self._pending_grace.pop(job, (0.0, -1.0))
        if grace >= 0:
            stats.grace_s = grace
        duration = _float(rec.get("duration_s"))
        if duration is None and started:
            duration = _when(rec) - started
        if duration is not None and duration < 0:
            duration = None  # a clock step or a forged line: no figure rather than a wrong one
        if not ok:
            stats.failed += 1
            if len(stats.failed_jobs) < _MAX_IDS:
                stats.failed_jobs.append(job)
            return
        stats.ok += 1
        if duration is not None:
            stats.durations.add(duration)
            if grace >= 0 and duration > grace:
                stats.over_grace += 1
                if len(stats.over_grace_jobs) < _MAX_IDS:
                    stats.over_grace_jobs.append(job)

    def _monitor_requeue(self, job: str, rec: Dict[str, Any]) -> None:
        """Remember the monitor's requeue of a running job (the ladder's, with its
        ``restraint``, or a re-layout's), taken for real: not a dry run, not failed."""
        if rec.get("action") != "requeue" or rec.get("dry_run") is not False \
                or rec.get("ok") is not True:
            return
        raw = rec.get("details")
        details: Dict[str, Any] = raw if isinstance(raw, dict) else {}
        self._monitor_requeued[job] = (_ts(rec), "ladder" if "restraint" in details
                                       else "monitor")

    def _declined(self, job: str, rec: Dict[str, Any], when: float = 0.0) -> None:
        """A decline the wrapper reports is the monitor's requeue when the monitor requeued
        this attempt no later than (a minute of clock and journaling slack) the wrapper's
        own decision: the SIGTERM it read as a preemption was that requeue's, and Slurm
        already showed the job requeued. Anything else is a decline of its own."""
        requeued = self._monitor_requeued.get(job)
        if requeued is not None and requeued[0] <= _when(rec) + _DECLINE_SLACK_S:
            del self._monitor_requeued[job]
            if len(self.monitor_requeue_declines) < _MAX_IDS:
                self.monitor_requeue_declines.append((job, requeued[1]))
        elif len(self.requeue_declined) < _MAX_IDS:
            self.requeue_declined.append((job, str(rec.get("reason", ""))))

    def _monitor(self, job: str, rec: Dict[str, Any], when: float = 0.0) -> None:
        action = str(rec.get("action", "?"))
        self._monitor_requeue(str(rec.get("target", "")), rec)
        self.monitor_actions[action] += 1
        if rec.get("dry_run"):
            self.monitor_dry_run += 1
        raw = rec.get("details")
        details: Dict[str, Any] = raw if isinstance(raw, dict) else {}
        latency = _float(details.get("p99_latency_ms"))
        if latency is not None:
            self.latency.append((str(details.get("class", "")), latency))
        self.ladder.add(rec, _ts(rec), self.since, self.job_class, self.job_gpus)
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

    def ladder_requeued_within(self, job: str, start: float, end: float) -> bool:
        """Whether the monitor's ladder requeued ``job`` during ``[start, end]`` (sacct shows
        that attempt REQUEUED)."""
        return self.ladder.requeued_within(job, start, end, _SACCT_SLACK_S)

    def preempted_within(self, job: str, start: float, end: float) -> bool:
        """Whether the wrapper saw ``job`` preempted during ``[start, end]`` (an attempt the
        wrapper requeued itself shows REQUEUED in sacct, not PREEMPTED)."""
        return _within(self.preempted_at.get(job), start, end)

    def confirmed_unpreempted(self, job: str, start: float) -> bool:
        """Whether slurmctld told the epilog that ``job``'s attempt that began at ``start`` was
        not preempted (Slurm 24.05+ names it PREEMPTED when an earlier attempt was)."""
        times = self.unpreempted_starts.get(job)
        if not times:
            return False
        i = bisect.bisect_left(times, start - _SACCT_SLACK_S)
        return i < len(times) and times[i] <= start + _SACCT_SLACK_S

    def made_progress(self, job: str) -> bool:
        """Whether journals show the job moving forward across its attempts."""
        if len(self.checkpoints_ok.get(job, ())) > 0:
            return True
        steps = [s for s in self.resume_steps.get(job, ()) if isinstance(s, (int, float))]
        return len(steps) >= 2 and steps[-1] > steps[0]


#: event -> what folds a line of it in, once its writer is checked (the rest: counted only)
_HANDLERS: Dict[str, Callable[[JournalDigest, str, Dict[str, Any], float], None]] = {
    "prolog": JournalDigest._job_line,
    "job-end": JournalDigest._job_line,
    "checkpoint-start": JournalDigest._checkpoint_start,
    "checkpoint-end": JournalDigest._checkpoint_end,
    "preempt-signal": JournalDigest._preempt_signal,
    "requeue": JournalDigest._requeue,
    "not-preempted": JournalDigest._not_preempted,
    "requeue-declined": JournalDigest._declined,
    "resume": JournalDigest._resume,
    "monitor-action": JournalDigest._monitor,
    "monitor-telemetry": JournalDigest._telemetry,
    "reconcile": JournalDigest._reconcile,
    "mps-user-conflict": JournalDigest._mps_conflict,
}


def _within(times: Optional[List[float]], start: float, end: float) -> bool:
    if not times:
        return False
    i = bisect.bisect_left(times, start)
    # sacct's End is whole seconds (truncated); the wrapper's times have ms
    return i < len(times) and times[i] <= end + _SACCT_SLACK_S


def _ts(rec: Dict[str, Any]) -> float:
    try:
        return parse_ts(str(rec["ts"])).timestamp()
    except (KeyError, ValueError):
        return 0.0


def _when(rec: Dict[str, Any]) -> float:
    """When a job's own event happened: the wrapper's time (``job_ts``), which the epilog keeps
    beside its own ``ts`` (when it folded the line in, after the job's end), never later than
    that. Checkpoint and signal times must fall inside the attempt they belong to."""
    folded = _ts(rec)
    own = rec.get("job_ts")
    if isinstance(own, str) and own:
        try:
            return min(parse_ts(own[:40]).timestamp(), folded)
        except ValueError:
            pass
    return folded


def _float(value: Any) -> Optional[float]:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)
