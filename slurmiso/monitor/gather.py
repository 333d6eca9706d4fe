"""The live snapshot: Slurm's nodes, partitions and queue plus telemetry, at one moment.

Slurm unreachable is not an exception here: the snapshot says ``slurm_ok=False`` and
``decide`` changes nothing, while the loop backs off. Job classes come from what Slurm
enforces (QoS, partition, account) through :func:`slurmiso.config.classify.classify`.
"""

from __future__ import annotations

import logging
import time
from datetime import datetime
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Tuple

from slurmiso.errors import SlurmError, SlurmisoError
from slurmiso.hostlist import expand
from slurmiso.monitor.snapshot import GpuSample, JobInfo, NodeInfo, Snapshot
from slurmiso.monitor.telemetry import Reading, TelemetrySource
from slurmiso.restraints import Note
from slurmiso.slurm.rows import NO_COMMENT, RowCounts

if TYPE_CHECKING:
    from slurmiso.config.model import Config

log = logging.getLogger(__name__)

_HELD = ("JobHeldUser", "JobHeldAdmin")


def live_snapshot(
    cfg: Config, slurm: Any, source: Optional[TelemetrySource],
    clock: Callable[[], float] = time.time,
) -> Snapshot:
    """Ask Slurm, then the telemetry source, for everything :func:`decide` looks at, as
    they said it: which jobs hold a GPU that the agents' samples leave unnamed is for
    :class:`~slurmiso.monitor.attribution.Attribution` to work out, in one place, live or
    replayed."""
    now = clock()
    rejected = RowCounts("monitor")
    try:
        raw_nodes = slurm.show_all("node", counts=rejected)
        raw_parts = slurm.show_all("partition", counts=rejected)
        raw_jobs = slurm.queue("PENDING,RUNNING,SUSPENDED", counts=rejected)
    except SlurmError as exc:
        log.warning("monitor: Slurm did not answer: %s", exc)
        return Snapshot(now, slurm_ok=False, errors=(f"slurm: {exc}",))
    partitions = {name: tuple(_expand(f.get("Nodes", ""))) for name, f in raw_parts.items()}
    member: Dict[str, List[str]] = {}
    for part, names in partitions.items():
        for n in names:
            member.setdefault(n, []).append(part)
    addrs = {name: f.get("NodeAddr", "") for name, f in raw_nodes.items()}
    reading = Reading()
    if source is not None:
        try:
            reading = source.read(addrs, now)
        except (SlurmisoError, OSError, ValueError, KeyError, TypeError) as exc:
            # a source that breaks is stale data for this cycle, never the monitor's end
            reading = Reading()
            reading.miss("telemetry", "source-error", f"telemetry: {exc!r}")
    for err in reading.errors[:20]:
        # every cycle: the loop warns once when a node's telemetry turns unknown, and says
        # when it is back (slurmiso.monitor.unknown)
        log.debug("monitor: telemetry: %s", err)
    nodes = []
    for name, f in sorted(raw_nodes.items()):
        pool = cfg.pool_for_node(name, tuple(_features(f)))
        gpus: Tuple[GpuSample, ...] = tuple(reading.gpus.get(name, ()))
        nodes.append(NodeInfo(
            name, f.get("State", "UNKNOWN"), tuple(member.get(name, ())),
            pool.name if pool else "", pool.mode if pool else "", _gres(f.get("Gres", "")),
            addrs[name], gpus, reading.ages.get(name)))
    jobs = parse_queue(cfg, raw_jobs)
    # rows Slurm's output could not vouch for are counted where unknown signals are (the
    # journal's monitor-unknown line, the unknown-signals metric)
    unknown = dict(reading.unknown, **rejected.unknown())
    return Snapshot(now, tuple(nodes), partitions, tuple(jobs), dict(reading.latency_p99_ms),
                    reading.latency_age_s, True, tuple(reading.errors), unknown,
                    dict(reading.job_signals), dict(reading.node_unknown),
                    dict(reading.host_nodes), dict(reading.host_jobs), dict(reading.parks),
                    _notes(slurm))


def _notes(slurm: Any) -> Optional[Dict[str, Note]]:
    """Each running or suspended job's restraint note (None: not read this cycle; then
    nothing is adopted)."""
    from slurmiso.restraints import read_slurm_all

    run = getattr(slurm, "run", None)
    if run is None:
        return None  # a stand-in without the CLI
    try:
        return {r.job: r.note for r in read_slurm_all(run)}
    except SlurmError as exc:
        log.warning("monitor: could not read the restraint notes: %s", exc)
        return None


def parse_queue(cfg: Config, rows: List[Dict[str, str]]) -> List[JobInfo]:
    """squeue rows (:meth:`SlurmCli.queue`) into jobs with their slurmiso class; a row with
    no ``comment`` is a job whose comment is unread (``JobInfo.comment`` None)."""
    from slurmiso.config.classify import classify

    classes: Dict[Tuple[str, str, str], str] = {}
    out = []
    for r in rows:
        parts = tuple(p for p in r.get("partition", "").split(",") if p)
        key = (r.get("qos", ""), parts[0] if parts else "", r.get("account", ""))
        if key not in classes:
            try:
                job_class, _ = classify(cfg, *key)
                classes[key] = job_class.name if job_class else ""
            except SlurmisoError:
                classes[key] = ""
        reason = r.get("reason", "")
        state = r.get("state", "")
        comment = r.get("comment")
        out.append(JobInfo(
            r["id"], state, classes[key], parts, r.get("qos", ""), _epoch(r.get("submit", "")),
            state == "PENDING" and reason in _HELD, reason if reason != "None" else "",
            tuple(_expand(r.get("nodes", ""))) if state in ("RUNNING", "SUSPENDED") else (),
            _gres(r.get("gres", "")), _number(r.get("priority", "")),
            _gres(r.get("exc_nodes", "")), max(1, int(_number(r.get("num_nodes", "1")) or 1)),
            _epoch(r.get("start", "")) if state == "PENDING" else 0.0,
            "" if comment == NO_COMMENT else comment))
    return out


def _expand(expr: str) -> List[str]:
    expr = expr.strip()
    if not expr or expr in ("(null)", "N/A"):
        return []
    return expand(expr)


def _gres(text: str) -> str:
    return "" if text in ("(null)", "N/A", "") else text


def _features(fields: Dict[str, str]) -> List[str]:
    text = fields.get("ActiveFeatures", "") or fields.get("AvailableFeatures", "")
    return [] if text in ("", "(null)") else text.split(",")


def _number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        return 0.0


def _epoch(text: str) -> float:
    """squeue's ``%V`` (local time, ISO) as Unix seconds; 0 when unknown."""
    try:
        return datetime.fromisoformat(text).timestamp()
    except ValueError:
        return 0.0
