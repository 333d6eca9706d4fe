"""How much MPS sharing was concurrent and how much was serialised, from the hooks' journal.

An MPS server serves one user at a time per GPU, so while jobs of one user share a GPU their
kernels run together, and while jobs of different users share it the GPU time-slices between
their servers. Every ``job-end`` line of an MPS job says its node, GPU, uid and when its prolog
ended and its epilog ended (docs/journal.md); overlapping intervals on one GPU are sharing,
with one uid concurrent, with several serialised; jobs on a shared MPS v3 server (its
resource says ``arrangement: shared-v3``) count as one user, since that server runs every
user's clients together. Jobs still running when the journal ends have no ``job-end`` yet
and are not counted. Pure: feed intervals, read the totals.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any, DefaultDict, Dict, List, Mapping, Optional, Sequence, Tuple

from slurmiso.values import Value

#: (node, gpu, uid, start, end): one MPS job's time on its GPU, Unix seconds.
Interval = Tuple[str, int, int, float, float]
#: The "uid" of every job on a shared MPS v3 server: one server runs all its users' clients
#: together, so their overlap is concurrent whoever they are.
SHARED_SERVER = -1


def interval_of(rec: Mapping[str, Any]) -> Optional[Interval]:
    """A ``job-end`` line of a released MPS job as an interval, else None."""
    if rec.get("mode") != "mps" or rec.get("outcome") != "released":
        return None
    times = rec.get("times")
    gpus = rec.get("gpus")
    if not isinstance(times, dict) or not isinstance(gpus, list) or len(gpus) != 1:
        return None
    gpu, uid = _number(gpus[0]), _number(rec.get("uid"))
    start = _number(times.get("prolog_end", times.get("prolog_start")))
    end = _number(times.get("epilog_end"))
    if gpu is None or uid is None or start is None or end is None or end <= start:
        return None
    if _on_shared_server(rec.get("resources")):
        uid = SHARED_SERVER
    return (str(rec.get("node", "?")), int(gpu), int(uid), start, end)


def _on_shared_server(resources: Any) -> bool:
    return isinstance(resources, list) and any(
        isinstance(r, dict) and r.get("arrangement") == "shared-v3" for r in resources)


def _number(value: Any) -> Optional[float]:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


class MpsSharing(Value, eq=True):
    """GPU-seconds during which two or more MPS jobs shared a GPU."""

    concurrent_s: float  # the sharing jobs were one user's: MPS ran them together
    serialised_s: float  # they were several users': time-sliced between MPS servers
    gpus: int  # (node, GPU) pairs that were shared at all
    #: the GPUs with the most serialised time: (node, gpu, seconds), largest first
    worst: Tuple[Tuple[str, int, float], ...] = ()

    @property
    def shared_s(self) -> float:
        return self.concurrent_s + self.serialised_s

    def to_dict(self) -> Dict[str, Any]:
        return {"concurrent_s": round(self.concurrent_s, 1),
                "serialised_s": round(self.serialised_s, 1), "gpus": self.gpus,
                "worst": [list(w) for w in self.worst]}


def sharing(intervals: Sequence[Interval], top: int = 5) -> MpsSharing:
    """Sweep each GPU's intervals: while two or more jobs are on it, the time counts as
    concurrent when they all have one uid and as serialised otherwise."""
    per_gpu: DefaultDict[Tuple[str, int], List[Tuple[float, int, int]]] = defaultdict(list)
    for node, gpu, uid, start, end in intervals:
        per_gpu[(node, gpu)].append((start, 1, uid))
        per_gpu[(node, gpu)].append((end, -1, uid))
    concurrent = serialised = 0.0
    shared = 0
    worst: List[Tuple[str, int, float]] = []
    for (node, gpu), events in per_gpu.items():
        events.sort(key=lambda e: (e[0], e[1]))  # an end before a start at the same instant
        active: Dict[int, int] = {}
        last = events[0][0]
        gpu_serial = gpu_shared = 0.0
        for when, step, uid in events:
            jobs = sum(active.values())
            if jobs >= 2 and when > last:
                if len(active) == 1:
                    concurrent += when - last
                else:
                    serialised += when - last
                    gpu_serial += when - last
                gpu_shared += when - last
            last = when
            active[uid] = active.get(uid, 0) + step
            if active[uid] <= 0:
                del active[uid]
        shared += gpu_shared > 0
        if gpu_serial > 0:
            worst.append((node, gpu, round(gpu_serial, 1)))
    worst.sort(key=lambda w: (-w[2], w[0], w[1]))
    return MpsSharing(concurrent, serialised, shared, tuple(worst[:top]))
