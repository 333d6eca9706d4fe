"""What the ladder cost training: the report's ``ladder`` section. Pure.

From the monitor's ladder lines (:mod:`slurmiso.audit.read.ladder`): how often each step
was taken, in all, per class of the training job and per pool; how long training was
throttled and suspended, in seconds and in GPU-hours of the jobs concerned; and the SLO
figure at each step and before/after each release. From accounting (the kernel, on
``REQUEUED`` attempts only): the GPU-hours the ladder's requeues threw away since the
job's last checkpoint, computed as the preemptions' lost work is.

Unknown is None, never 0: no journal record at all makes the section ``unknown``; journals
with no ladder line make it ``none`` (nothing measured, so no figure at all); a figure
whose parts are not all known (a job's GPUs, a requeue accounting does not show) is None
with the count of what is missing beside it.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

from slurmiso.audit.figures.aggregate import UNKNOWN_POOL, Aggregator
from slurmiso.audit.read.digest import JournalDigest
from slurmiso.audit.read.ladder import STEPS, Restrained

#: The figures of one scope (all, a class, a pool), keyed as the JSON has them.
Tally = Dict[str, Any]


def ladder_section(agg: Aggregator, digest: JournalDigest) -> Dict[str, Any]:
    """The ``ladder`` section of the report."""
    log = digest.ladder
    status = "active" if log.active else ("none" if digest.records else "unknown")
    out: Dict[str, Any] = {
        "status": status,
        "lines": log.lines,
        "bad_lines": log.bad,
        "bad_samples": list(log.bad_samples),
        "steps": {},
        "total": None,
        "by_class": {},
        "by_pool": {},
        "unreleased": None,
    }
    if not log.active:
        return out
    pool_of = _pools(agg)
    holds_seen = _holds_journaled(agg)
    out["steps"] = {step: {
        "taken": _taken(step, sum(n for (s, _, _), n in log.taken.items() if s == step),
                        holds_seen),
        "dry_run": log.dry_run.get(step, 0),
        "failed": log.failed.get(step, 0),
        "slo": {signal: t.to_dict() for (s, signal), t in sorted(log.slo.items())
                if s == step},
    } for step in STEPS}
    # every scope's parts: (class, pool) -> taken per step, restraint time, requeue losses
    taken: Dict[Tuple[str, str], Dict[str, int]] = {}
    for (step, cls, node), n in log.taken.items():
        row = taken.setdefault((cls, pool_of(node)), {})
        row[step] = row.get(step, 0) + n
    held: Dict[Tuple[str, str], Restrained] = {}
    for (cls, node), r in log.restrained.items():
        key = (cls, pool_of(node))
        if key in held:
            held[key].merge(r)
        else:
            held[key] = Restrained(**vars(r))
    lost = {key: list(row) for key, row in agg.ladder_lost.items()}
    keys = set(taken) | set(held) | set(lost)
    out["total"] = _tally(list(keys), taken, held, lost, holds_seen)
    for axis, name in ((0, "by_class"), (1, "by_pool")):
        groups = sorted({k[axis] for k in keys})
        out[name] = {g: _tally([k for k in keys if k[axis] == g], taken, held, lost,
                               holds_seen)
                     for g in groups}
    out["unreleased"] = {"throttled": len(log.open_throttled),
                         "suspended": len(log.open_suspended),
                         "parked": len(log.open_parked),
                         "host_limited": len(log.open_host_limited)}
    return out


def _holds_journaled(agg: Aggregator) -> bool:
    """Whether the hold step leaves a line of its own: only where admission holds pending
    training (``monitor.admission: hold``). With ``nodes`` (the default) it shows as the
    exclusions of pending jobs, which do not say the ladder asked for them; with
    ``qos-limit`` as a QoS cap. There no hold line is not "no hold"."""
    monitor = getattr(agg.cfg, "monitor", None)
    return getattr(monitor, "admission", "") == "hold"


def _taken(step: str, n: int, holds_seen: bool) -> Optional[int]:
    return None if step == "hold" and not n and not holds_seen else n


def _pools(agg: Aggregator) -> Any:
    """node -> its pool's name (the config's), :data:`UNKNOWN_POOL` where none says."""
    cache: Dict[str, str] = {}

    def pool_of(node: str) -> str:
        hit = cache.get(node)
        if hit is None:
            pool = agg.cfg.pool_for_node(node) if node and agg.cfg is not None else None
            hit = cache[node] = pool.name if pool is not None else UNKNOWN_POOL
        return hit

    return pool_of


def _tally(keys: List[Tuple[str, str]], taken: Dict[Tuple[str, str], Dict[str, int]],
           held: Dict[Tuple[str, str], Restrained],
           lost: Dict[Tuple[str, str], List[float]], holds_seen: bool) -> Tally:
    steps = {step: _taken(step, sum(taken.get(k, {}).get(step, 0) for k in keys), holds_seen)
             for step in STEPS}
    r = Restrained()
    for k in keys:
        if k in held:
            r.merge(held[k])
    found = [0.0, 0.0, 0.0]
    for k in keys:
        for i, v in enumerate(lost.get(k, ())):
            found[i] += v
    requeues, in_sacct = steps["requeue"] or 0, int(found[0])
    # all of the ladder's requeues must be in accounting for the sums to be whole
    whole = in_sacct >= requeues
    return {
        "taken": steps,
        "throttled_s": _seconds(r.throttled_s, r.throttled_n),
        "suspended_s": _seconds(r.suspended_s, r.suspended_n),
        "throttled_gpu_hours": _gpu_hours(r.throttled_gpu_s, r.throttled_n,
                                          r.throttled_unknown_gpus),
        "suspended_gpu_hours": _gpu_hours(r.suspended_gpu_s, r.suspended_n,
                                          r.suspended_unknown_gpus),
        "gpus_unknown": r.throttled_unknown_gpus + r.suspended_unknown_gpus,
        "requeues_in_sacct": in_sacct,
        "requeue_lost_gpu_hours": round(found[1], 3) if whole else None,
        "requeue_lost_gpu_hours_estimated": round(found[2], 3) if whole else None,
    }


def _seconds(total: float, n: int) -> Optional[float]:
    return round(total, 1) if n else None


def _gpu_hours(gpu_s: float, n: int, unknown: int) -> Optional[float]:
    return round(gpu_s / 3600.0, 3) if n and not unknown else None
