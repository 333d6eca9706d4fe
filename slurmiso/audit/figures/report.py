"""Assemble the report: one JSON-ready dict every renderer reads. Pure.

Every number says where it comes from: ``measured`` (sacct or journal facts), ``estimated``
(a rule of thumb applied to measured facts) or ``unavailable``; the ``notes`` list says how.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any, Dict, List, Optional, Sequence, Set, Tuple

from slurmiso.audit.figures.aggregate import Aggregator
from slurmiso.audit.figures.definitions import DEFINITIONS, DOC
from slurmiso.audit.figures.findings import sort_findings
from slurmiso.audit.figures.ladder import ladder_section
from slurmiso.audit.figures.quantiles import EXACT, RELATIVE_ERROR
from slurmiso.audit.figures.stats import ClassStats, Who
from slurmiso.audit.figures.telemetry import telemetry_section
from slurmiso.audit.read.digest import JournalDigest
from slurmiso.audit.read.sacct import ParseStats
from slurmiso.doctor import Finding

#: Figures made unknown (None) by a finding about the input: code -> figure keys.
UNKNOWN_WHEN = {
    "sacct-without-duplicates": ("requeues", "preemptions"),
    "gpu-tres-missing": ("gpu_hours", "lost_gpu_hours", "lost_gpu_hours_estimated",
                         "idle_gpu_hours"),
    "journal-empty": ("lost_gpu_hours",),
    "sacct-no-records": tuple(k for k in ("jobs", "attempts", "requeues", "preemptions",
                                          "started", "gpu_hours", "lost_gpu_hours",
                                          "lost_gpu_hours_estimated", "idle_gpu_hours")),
}
_TOP = 20

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
    capacity: Optional[Dict[str, Optional[int]]] = None,
) -> Dict[str, Any]:
    overall = ClassStats()
    for s in agg.classes.values():
        # ClassStats.merge: the one list of what adds up (a copy here once left out
        # preemptions_user_reported, so the overall figure was always 0)
        overall.merge(s)
    unknown = unknowns(findings, overall)
    classes = {name: _blank(s.to_dict(), unknown) for name, s in agg.classes.items()}
    for name, data in classes.items():
        slo = _wait_slo(agg, name)
        if slo:
            data["wait_slo"] = slo
    capacity = capacity if capacity is not None else capacity_from_config(agg.cfg)
    lo = since if since is not None else agg.first_time
    hi = until if until is not None else agg.last_time
    span_h = (hi - lo) / 3600.0 if lo is not None and hi is not None and hi > lo else None
    return {
        "version": 2,
        "generated": iso(generated),
        "window": {"since": iso(since), "until": iso(until)},
        "data_span": {"first": iso(agg.first_time), "last": iso(agg.last_time)},
        "severity_threshold": severity,
        "inputs": {"sacct": stats.to_dict(), "journals": list(journals),
                   "journal_records": digest.records,
                   "journal_user_reported": digest.user_reported,
                   "journal_rejected": digest.rejected,
                   "records_outside_window": agg.outside_window},
        "overall": _blank(overall.to_dict(), unknown),
        "classes": classes,
        "class_order": [c.name for c in agg.cfg.classes],
        "pools": {name: _pool(name, v, capacity.get(name), span_h, "gpu_hours" in unknown)
                  for name, v in sorted(agg.pools.items())},
        "checkpoints": _checkpoints(digest),
        "requeues_by_reason": dict(sorted(digest.requeues.items())),
        "monitor_actions": dict(sorted(digest.monitor_actions.items())),
        "monitor_dry_run_actions": digest.monitor_dry_run,
        "latency_slo": _latency(agg, digest),
        "ladder": ladder_section(agg, digest),
        "telemetry_unknown": telemetry_section(agg, digest),
        "idle": {
            "measured_gpu_hours": (round(overall.idle_gpu_hours, 3)
                                   if overall.util_gpu_hours else None),
            "accounted_gpu_hours": round(overall.util_gpu_hours, 3),
            "monitor_flagged_jobs": len(digest.idle_jobs),
        },
        "who": {
            "users": _ranking(agg.users, "user", overall.util_gpu_hours > 0),
            "accounts": _ranking(agg.accounts, "account", overall.util_gpu_hours > 0),
        },
        "gpu_efficiency": [
            {"job": job, "user": user, "class": cls, "gpu_util": util,
             "gpu_hours": round(gh, 3), "wasted_gpu_hours": round(wasted, 3)}
            for wasted, job, user, util, gh, cls in sorted(agg.inefficient, reverse=True)
        ],
        "series": _series(agg, capacity),
        "findings": [f.to_dict() for f in sort_findings(findings)],
        "notes": _notes(agg, digest, overall),
        "definitions": {k: {"text": v, "doc": f"{DOC}#{k.replace('_', '-')}"}
                        for k, v in sorted(DEFINITIONS.items())},
    }


def _pool(name: str, v: List[float], cap: Optional[int], span_h: Optional[float],
          unknown: bool) -> Dict[str, Any]:
    gh = None if unknown else round(v[1], 3)
    share = round(v[1] / (cap * span_h), 4) if cap and span_h and gh is not None else None
    return {"attempts": int(v[0]), "gpu_hours": gh, "capacity_gpus": cap, "use_share": share}


def unknowns(findings: Sequence[Finding], overall: ClassStats) -> Set[str]:
    """Figure keys the input cannot show (they are reported as None, never 0)."""
    out: Set[str] = set()
    for f in findings:
        out.update(UNKNOWN_WHEN.get(f.code, ()))
    if not overall.util_gpu_hours:
        out.add("idle_gpu_hours")
    return out


def _blank(figures: Dict[str, Any], unknown: Set[str]) -> Dict[str, Any]:
    for key in unknown:
        if key in figures:
            figures[key] = None
    return figures


def capacity_from_config(cfg: Any) -> Dict[str, Optional[int]]:
    """GPUs per pool from the config: named nodes x gpus_per_node; None for feature pools."""
    from slurmiso.hostlist import expand

    out: Dict[str, Optional[int]] = {}
    for p in cfg.pools:
        try:
            nodes = len(expand(p.nodes)) if p.nodes else 0
        except ValueError:
            nodes = 0
        out[p.name] = nodes * p.gpus_per_node if nodes and p.gpus_per_node else None
    return out


def capacity_from_scontrol(cfg: Any, text: str) -> Dict[str, Optional[int]]:
    """GPUs per pool from a saved ``scontrol show nodes`` (``Gres=gpu:...``, features)."""
    from slurmiso.slurm.gres import gres_counts

    out: Dict[str, Optional[int]] = {p.name: None for p in cfg.pools}
    for block in text.split("NodeName=")[1:]:
        fields = dict(w.split("=", 1) for w in ("NodeName=" + block).split() if "=" in w)
        features = tuple(fields.get("AvailableFeatures", "").split(","))
        pool = cfg.pool_for_node(fields.get("NodeName", ""), features)
        if pool is None:
            continue
        gpus = gres_counts(fields.get("Gres", "")).get("gpu", 0)
        out[pool.name] = (out[pool.name] or 0) + gpus
    return out


def _ranking(table: Dict[str, Who], label: str, util_known: bool) -> List[Dict[str, Any]]:
    """The top users/accounts by GPU-hours, plus any in the top 5 of the other columns."""
    def row(name: str, w: Who) -> Dict[str, Any]:
        return {label: name or "(none)", "jobs": w.jobs, "gpu_hours": round(w.gpu_hours, 3),
                "idle_gpu_hours": round(w.idle_gpu_hours, 3) if util_known else None,
                "lost_gpu_hours": round(w.lost_gpu_hours, 3), "preemptions": w.preemptions}

    keep: Set[str] = set()
    for key in ("gpu_hours", "idle_gpu_hours", "lost_gpu_hours", "preemptions"):
        top = sorted(table.items(), key=lambda kv: (-getattr(kv[1], key), kv[0]))
        keep.update(n for n, w in top[: _TOP if key == "gpu_hours" else 5]
                    if getattr(w, key) or key == "gpu_hours")
    rows = sorted((row(n, table[n]) for n in keep), key=lambda r: (-r["gpu_hours"], r[label]))
    return rows


def _wait_slo(agg: Aggregator, name: str) -> Optional[Dict[str, Any]]:
    limit = agg.slo_wait.get(name)
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
            "over_grace": ck.over_grace, "grace_s": ck.grace_s, "periodic": ck.periodic,
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


def _series(agg: Aggregator, capacity: Dict[str, Optional[int]]) -> Dict[str, Any]:
    """Points per class and per pool, merged into wider buckets so there are at most
    MAX_POINTS; buckets with nothing in them are absent (charts show them as gaps)."""
    if not agg.series:
        return {"bucket_s": agg.bucket_s, "points": [], "pools": []}
    lo = min(b for b, _ in agg.series)
    hi = max(b for b, _ in agg.series)
    factor = max(1, -(-(hi - lo + 1) // MAX_POINTS))
    merged: Dict[Tuple[int, str], List[float]] = {}
    for (b, cls), (gh, wsum, wn, wmax) in agg.series.items():
        key = (lo + (b - lo) // factor * factor, cls)
        m = merged.setdefault(key, [0.0, 0.0, 0.0, 0.0])
        m[0] += gh
        m[1] += wsum
        m[2] += wn
        m[3] = max(m[3], wmax)
    bucket_s = agg.bucket_s * factor
    points, pools = [], []
    for (b, name), m in sorted(merged.items()):
        t = iso(b * agg.bucket_s)
        if name.startswith("pool:"):
            pool = name[5:]
            cap = capacity.get(pool)
            pools.append({"t": t, "pool": pool, "gpu_hours": round(m[0], 3),
                          "use_share": round(m[0] / (cap * bucket_s / 3600.0), 4)
                          if cap else None})
        else:
            points.append({"t": t, "class": name, "gpu_hours": round(m[0], 3),
                           "wait_mean_s": round(m[1] / m[2], 1) if m[2] else None,
                           "wait_max_s": round(m[3], 1) if m[2] else None, "starts": int(m[2])})
    return {"bucket_s": bucket_s, "points": points, "pools": pools}


def _notes(agg: Aggregator, digest: JournalDigest, overall: ClassStats) -> List[str]:
    notes = [
        f"Wait quantiles come from a log histogram: exact below {EXACT} s, within "
        f"{RELATIVE_ERROR:.1%} above (nearest-rank).",
        "Wait = start - eligible per started attempt; requeues = attempts - distinct jobs "
        "(sacct -D); preemptions = attempts in state PREEMPTED.",
        "GPU-hours count the part of each run inside the window (as sreport does), with MPS "
        "and shard allocations as fractions of a GPU (pool mps_shares_per_gpu / "
        "shards_per_gpu).",
        "Checkpoint times and lost work since the last checkpoint are user-reported (the "
        "job's wrapper writes them, source: job); every figure is defined in docs/audit.md.",
    ]
    if overall.lost_gpu_hours_estimated:
        notes.append("Lost GPU-hours marked 'estimated' had no checkpoint data in the journals: "
                     "the whole preempted run counts as lost.")
    if not overall.util_gpu_hours:
        notes.append("Idle allocated GPUs: no record carried gres/gpuutil in TRESUsageInAve "
                     "or TRESUsageInTot, so idle GPU-hours are unknown; only monitor-flagged "
                     "jobs are shown.")
    if not digest.records:
        notes.append("No journal records: checkpoint, requeue-reason and monitor figures are "
                     "unavailable.")
    return notes


def _r(value: Optional[float]) -> Optional[float]:
    return None if value is None else round(value, 1)
