"""Assemble the report: one JSON-ready dict every renderer reads. Pure.

Every number says where it comes from: ``measured`` (sacct or journal facts), ``estimated``
(a rule of thumb applied to measured facts) or ``unavailable``; the ``notes`` list says how.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any, Dict, List, Optional, Sequence

from slurmiso.audit.analyze import Aggregator, ClassStats
from slurmiso.audit.digest import JournalDigest
from slurmiso.audit.findings import Finding, sort_findings
from slurmiso.audit.quantiles import EXACT, RELATIVE_ERROR
from slurmiso.audit.sacct import ParseStats

#: At most this many points per class in the time series (charts stay readable).
MAX_POINTS = 60


def iso(ts: Optional[float]) -> Optional[str]:
    if ts is None:
        return None
    return datetime.fromtimestamp(ts, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def build_report(
    agg: Aggregator,
    digest: JournalDigest,
    stats: ParseStats,
    journals: Sequence[Dict[str, Any]],
    findings: Sequence[Finding],
    *,
    since: Optional[float],
    until: Optional[float],
    generated: float,
    severity: str,
) -> Dict[str, Any]:
    overall = ClassStats()
    for s in agg.classes.values():
        _merge(overall, s)
    classes = {name: s.to_dict() for name, s in sorted(agg.classes.items())}
    for name, data in classes.items():
        slo = _wait_slo(agg, name)
        if slo:
            data["wait_slo"] = slo
    return {
        "version": 1,
        "generated": iso(generated),
        "window": {"since": iso(since), "until": iso(until)},
        "severity_threshold": severity,
        "inputs": {"sacct": stats.to_dict(), "journals": list(journals),
                   "journal_records": digest.records},
        "overall": overall.to_dict(),
        "classes": classes,
        "pools": {name: {"attempts": int(v[0]), "gpu_hours": round(v[1], 3)}
                  for name, v in sorted(agg.pools.items())},
        "checkpoints": _checkpoints(digest),
        "requeues_by_reason": dict(sorted(digest.requeues.items())),
        "monitor_actions": dict(sorted(digest.monitor_actions.items())),
        "monitor_dry_run_actions": digest.monitor_dry_run,
        "latency_slo": _latency(agg, digest),
        "idle": {
            "measured_gpu_hours": round(overall.idle_gpu_hours, 3),
            "accounted_gpu_hours": round(overall.util_gpu_hours, 3),
            "monitor_flagged_jobs": len(digest.idle_jobs),
        },
        "series": _series(agg),
        "findings": [f.to_dict() for f in sort_findings(findings)],
        "notes": _notes(agg, digest, overall),
    }


def _merge(into: ClassStats, s: ClassStats) -> None:
    for name in ("jobs", "attempts", "started", "preemptions", "gpu_hours", "lost_gpu_hours",
                 "lost_gpu_hours_estimated", "util_gpu_hours", "idle_gpu_hours",
                 "wait_slo_met", "long_jobs"):
        setattr(into, name, getattr(into, name) + getattr(s, name))
    into.wait.merge(s.wait)


def _wait_slo(agg: Aggregator, name: str) -> Optional[Dict[str, Any]]:
    limit = agg._slo_wait.get(name)
    stats = agg.classes[name]
    if limit is None or not stats.wait.n:
        return None
    return {"max_queue_wait_s": limit, "met": stats.wait_slo_met, "of": stats.wait.n,
            "attainment": round(stats.wait_slo_met / stats.wait.n, 4)}


def _checkpoints(digest: JournalDigest) -> Dict[str, Any]:
    out = {}
    for cls, ck in sorted(digest.checkpoints.items()):
        out[cls] = {
            "checkpoints": ck.started, "ok": ck.ok, "failed": ck.failed,
            "over_grace": ck.over_grace, "grace_s": ck.grace_s,
            "p50_s": _r(ck.durations.quantile(0.5)), "p95_s": _r(ck.durations.quantile(0.95)),
            "max_s": _r(ck.durations.max if ck.durations.n else None),
        }
    return out


def _latency(agg: Aggregator, digest: JournalDigest) -> List[Dict[str, Any]]:
    out = []
    for slo in agg.cfg.monitor.slo:
        if slo.p99_latency_ms is None:
            continue
        samples = [ms for c, ms in digest.latency if c in ("", slo.class_name)]
        ok = sum(1 for ms in samples if ms <= slo.p99_latency_ms)
        out.append({"class": slo.class_name, "target_p99_ms": slo.p99_latency_ms,
                    "samples": len(samples),
                    "attainment": round(ok / len(samples), 4) if samples else None,
                    "source": "monitor journal" if samples else "unavailable"})
    return out


def _series(agg: Aggregator) -> Dict[str, Any]:
    """Points per class, merged into wider buckets so there are at most MAX_POINTS."""
    if not agg.series:
        return {"bucket_s": agg.bucket_s, "points": []}
    lo = min(b for b, _ in agg.series)
    hi = max(b for b, _ in agg.series)
    factor = max(1, -(-(hi - lo + 1) // MAX_POINTS))
    merged: Dict[tuple, List[float]] = {}
    for (b, cls), (gh, wsum, wn, wmax) in agg.series.items():
        key = (lo + (b - lo) // factor * factor, cls)
        m = merged.setdefault(key, [0.0, 0.0, 0.0, 0.0])
        m[0] += gh
        m[1] += wsum
        m[2] += wn
        m[3] = max(m[3], wmax)
    bucket_s = agg.bucket_s * factor
    points = [
        {"t": iso(b * agg.bucket_s), "class": cls, "gpu_hours": round(m[0], 3),
         "wait_mean_s": round(m[1] / m[2], 1) if m[2] else None, "wait_max_s": round(m[3], 1),
         "starts": int(m[2])}
        for (b, cls), m in sorted(merged.items())
    ]
    return {"bucket_s": bucket_s, "points": points}


def _notes(agg: Aggregator, digest: JournalDigest, overall: ClassStats) -> List[str]:
    notes = [
        f"Wait quantiles come from a log histogram: exact below {EXACT} s, within "
        f"{RELATIVE_ERROR:.1%} above (nearest-rank).",
        "Wait = start - eligible per started attempt; requeues = attempts - distinct jobs "
        "(sacct -D); preemptions = attempts in state PREEMPTED.",
        "GPU-hours count MPS and shard allocations as fractions of a GPU "
        "(pool mps_shares_per_gpu / shards_per_gpu).",
    ]
    if overall.lost_gpu_hours_estimated:
        notes.append("Lost GPU-hours marked 'estimated' had no checkpoint data in the journals: "
                     "the whole preempted run counts as lost.")
    if not overall.util_gpu_hours:
        notes.append("Idle allocated GPUs: sacct had no gres/gpuutil (GPU accounting off); "
                     "only monitor-flagged jobs are shown.")
    if not digest.records:
        notes.append("No journal records: checkpoint, requeue-reason and monitor figures are "
                     "unavailable.")
    return notes


def _r(value: Optional[float]) -> Optional[float]:
    return None if value is None else round(value, 1)
