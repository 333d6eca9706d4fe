"""The containers the audit's figures live in, and how two of each add up.

:mod:`~slurmiso.audit.figures.kernel` fills them one attempt at a time;
:meth:`~slurmiso.audit.figures.aggregate.Aggregator.merge` adds the containers of a later
part of the input with the ``merge`` methods here, so a figure's sum is written once per
container, not once per reader.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from slurmiso.audit.figures.quantiles import LogHistogram

#: At most this many job ids per list in a figure (long inference jobs).
MAX_IDS = 50
#: The inefficiency ranking keeps this many jobs.
TOP = 20

#: (wasted GPU-hours, job, user, util %, GPU-hours, class): the ranking's item, ordered.
Waste = Tuple[float, str, str, float, float, str]


@dataclass
class ClassStats:
    jobs: int = 0
    attempts: int = 0
    started: int = 0
    preemptions: int = 0
    preemptions_user_reported: int = 0
    wait: LogHistogram = field(default_factory=LogHistogram)
    gpu_hours: float = 0.0
    lost_gpu_hours: float = 0.0  # from checkpoints the journal has
    lost_gpu_hours_estimated: float = 0.0  # whole attempt counted: no checkpoint data
    util_gpu_hours: float = 0.0  # GPU-hours of attempts whose GPU utilisation was accounted
    idle_gpu_hours: float = 0.0  # ... of which the GPUs stayed at 0% utilisation
    wait_slo_met: int = 0
    long_jobs: int = 0
    long_job_ids: List[str] = field(default_factory=list)

    def to_dict(self) -> Dict[str, Any]:
        w = self.wait
        return {
            "jobs": self.jobs,
            "attempts": self.attempts,
            "requeues": self.attempts - self.jobs,
            "preemptions": self.preemptions,
            "preemptions_user_reported": self.preemptions_user_reported,
            "started": self.started,
            "wait_p50_s": _round(w.quantile(0.50)),
            "wait_p95_s": _round(w.quantile(0.95)),
            "wait_p99_s": _round(w.quantile(0.99)),
            "wait_max_s": _round(w.max if w.n else None),
            "gpu_hours": round(self.gpu_hours, 3),
            "lost_gpu_hours": round(self.lost_gpu_hours, 3),
            "lost_gpu_hours_estimated": round(self.lost_gpu_hours_estimated, 3),
            "idle_gpu_hours": round(self.idle_gpu_hours, 3),
            "util_accounted_gpu_hours": round(self.util_gpu_hours, 3),
        }

    def merge(self, other: ClassStats) -> None:
        """Add the figures of a later part of the input: every count and sum, the wait
        histogram, and the capped id list filled up in input order."""
        for name in _CLASS_SUMS:
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.wait.merge(other.wait)
        room = MAX_IDS - len(self.long_job_ids)
        if room > 0:
            self.long_job_ids.extend(other.long_job_ids[:room])


_CLASS_SUMS = ("jobs", "attempts", "started", "preemptions", "preemptions_user_reported",
               "gpu_hours", "lost_gpu_hours", "lost_gpu_hours_estimated", "util_gpu_hours",
               "idle_gpu_hours", "wait_slo_met", "long_jobs")


class Who:
    """Per user or account: GPU-hours, idle allocated GPU-hours, lost GPU-hours, preemptions."""

    __slots__ = ("gpu_hours", "idle_gpu_hours", "lost_gpu_hours", "preemptions", "jobs")

    def __init__(self) -> None:
        self.gpu_hours = 0.0
        self.idle_gpu_hours = 0.0
        self.lost_gpu_hours = 0.0
        self.preemptions = 0
        self.jobs = 0

    def merge(self, other: Who) -> None:
        for name in self.__slots__:
            setattr(self, name, getattr(self, name) + getattr(other, name))


def offer(heap: List[Waste], item: Waste) -> None:
    """Keep ``item`` if it is among the :data:`TOP` largest ``heap`` has seen (a min-heap)."""
    if len(heap) < TOP:
        heapq.heappush(heap, item)
    elif item > heap[0]:
        heapq.heapreplace(heap, item)


def _round(value: Optional[float]) -> Optional[float]:
    return None if value is None else round(value, 1)
