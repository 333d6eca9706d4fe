"""Online aggregation of job records into the audit's numbers. Pure: no I/O, no clock.

:class:`Aggregator` takes one :class:`~slurmiso.audit.sacct.JobRecord` at a time and keeps only
counters, histograms and small per-job facts for jobs that were preempted, so memory grows
with the number of *distinct job ids* (a compact set) rather than with the records.

Definitions the report relies on:

- *attempt*: one allocation record (``sacct -D`` lists each requeued attempt);
  *jobs*: distinct job ids; *requeues* = attempts - jobs.
- *preemption*: an attempt whose state is ``PREEMPTED``, or ``REQUEUED`` while the wrapper's
  journal shows a preemption signal in it (``slurmiso run`` requeues a preempted job itself:
  on 22.05 one that ends inside the grace time is not requeued by Slurm).
- *wait*: ``start - eligible`` (``submit`` when eligible is unknown) per started attempt, so a
  requeued attempt's wait counts from its requeue.
- *GPU-hours*: elapsed x GPU equivalents (whole GPUs + ``mps`` units / the pool's
  ``mps_shares_per_gpu`` + ``shard`` units / ``shards_per_gpu``).
- *lost GPU-hours*: for a preempted attempt, the time since its last successful
  ``checkpoint-end`` in the journal, else the whole attempt (an estimate, reported apart).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, List, Optional, Set, Tuple, Union

from slurmiso.audit.digest import JournalDigest
from slurmiso.audit.quantiles import LogHistogram
from slurmiso.audit.sacct import JobRecord

_MAX_IDS = 50
_UNKNOWN_POOL = "(none)"
JobId = Union[int, str]


@dataclass
class ClassStats:
    jobs: int = 0
    attempts: int = 0
    started: int = 0
    preemptions: int = 0
    wait: LogHistogram = field(default_factory=LogHistogram)
    gpu_hours: float = 0.0
    lost_gpu_hours: float = 0.0  # with checkpoint data from the journal
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


@dataclass
class Preempted:
    """What findings need about one preempted job."""

    cls: str
    user: str
    preemptions: int = 0
    lost_hours: float = 0.0


class Aggregator:
    """Fold records into per-class, per-pool and over-time statistics."""

    def __init__(self, cfg: Any, digest: Optional[JournalDigest] = None,
                 bucket_s: int = 3600) -> None:
        self.cfg = cfg
        self.digest = digest or JournalDigest()
        self.bucket_s = bucket_s
        self.classes: Dict[str, ClassStats] = {}
        self.pools: Dict[str, List[float]] = {}  # pool -> [attempts, gpu_hours]
        self.series: Dict[Tuple[int, str], List[float]] = {}  # (bucket, class) -> see _series
        self.seen: Set[JobId] = set()
        self.multi: Dict[JobId, int] = {}  # attempts of ids seen more than once
        self.preempted: Dict[str, Preempted] = {}
        self.first_time: Optional[float] = None
        self.last_time: Optional[float] = None
        self._class_of = _class_resolver(cfg)
        self._pool_cache: Dict[Tuple[str, str], Tuple[str, float, float]] = {}
        self._slo_wait = {s.class_name: s.max_queue_wait_s for s in cfg.monitor.slo
                          if s.max_queue_wait_s is not None}
        self._long_classes = {c.name for c in cfg.classes
                              if c.name == "infer" or (c.qos.preempt and not c.preemptible)}
        self._long_s = cfg.audit.long_infer_job_s

    def add_all(self, records: Iterable[JobRecord]) -> None:
        add = self.add
        for rec in records:
            add(rec)

    def add(self, rec: JobRecord) -> None:
        if rec.qos in ("", "Unknown") and rec.job in self.preempted:
            cls = self.preempted[rec.job].cls  # 22.05 records a cancelled requeue without QoS
        else:
            cls = self._class_of(rec.qos, rec.partition)
        stats = self.classes.get(cls)
        if stats is None:
            stats = self.classes[cls] = ClassStats()
        if rec.component:  # another component of a het job: same job, same attempt
            self._component(rec, stats)
            return
        stats.attempts += 1
        key: JobId = int(rec.job) if rec.job.isdigit() else rec.job
        if key in self.seen:
            self.multi[key] = self.multi.get(key, 1) + 1
        else:
            self.seen.add(key)
            stats.jobs += 1
        gpus, gpu_hours = self._gpu_hours(rec, stats, 1)
        # a requeued attempt cancelled while pending gets Start=End but ran nowhere
        start = rec.start if rec.nodes != "None assigned" else None
        wait = None
        if start is not None:
            stats.started += 1
            since = rec.eligible or rec.submit
            if since is not None:
                wait = max(0.0, start - since)
                stats.wait.add(wait)
                limit = self._slo_wait.get(cls)
                if limit is not None and wait <= limit:
                    stats.wait_slo_met += 1
            self._series(start, cls, gpu_hours, wait)
        if rec.gpu_util is not None and gpus:
            stats.util_gpu_hours += gpu_hours
            if rec.gpu_util <= 0:
                stats.idle_gpu_hours += gpu_hours
        if cls in self._long_classes and rec.elapsed > self._long_s:
            stats.long_jobs += 1
            if len(stats.long_job_ids) < _MAX_IDS:
                stats.long_job_ids.append(rec.job)
        if rec.state == "PREEMPTED" or (
            rec.state == "REQUEUED" and rec.start is not None and rec.end is not None
            and self.digest.preempted_within(rec.job, rec.start, rec.end)
        ):
            self._preemption(rec, cls, stats, gpus)

    def _gpu_hours(self, rec: JobRecord, stats: ClassStats, attempt: int) -> Tuple[float, float]:
        """(GPU equivalents, GPU-hours) of the record, added to its class and pool."""
        pool, mps_per_gpu, shards_per_gpu = self._pool(rec.partition, rec.nodes)
        gpus = rec.gpus
        if rec.mps:
            gpus += rec.mps / mps_per_gpu
        if rec.shards:
            gpus += rec.shards / shards_per_gpu
        gpu_hours = gpus * rec.elapsed / 3600.0
        stats.gpu_hours += gpu_hours
        p = self.pools.get(pool)
        if p is None:
            p = self.pools[pool] = [0, 0.0]
        p[0] += attempt
        p[1] += gpu_hours
        return gpus, gpu_hours

    def _component(self, rec: JobRecord, stats: ClassStats) -> None:
        gpus, gpu_hours = self._gpu_hours(rec, stats, 0)
        if rec.gpu_util is not None and gpus:
            stats.util_gpu_hours += gpu_hours
            if rec.gpu_util <= 0:
                stats.idle_gpu_hours += gpu_hours

    def _preemption(self, rec: JobRecord, cls: str, stats: ClassStats, gpus: float) -> None:
        stats.preemptions += 1
        entry = self.preempted.get(rec.job)
        if entry is None:
            entry = self.preempted[rec.job] = Preempted(cls, rec.user)
        entry.preemptions += 1
        if rec.start is None or rec.end is None:
            return
        ckpt = self.digest.last_checkpoint(rec.job, rec.start, rec.end)
        lost = gpus * (rec.end - (ckpt if ckpt is not None else rec.start)) / 3600.0
        entry.lost_hours += lost
        if ckpt is not None or rec.job in self.digest.checkpointing_jobs:
            stats.lost_gpu_hours += lost
        else:
            stats.lost_gpu_hours_estimated += lost

    def _series(self, start: float, cls: str, gpu_hours: float, wait: Optional[float]) -> None:
        if self.first_time is None or start < self.first_time:
            self.first_time = start
        if self.last_time is None or start > self.last_time:
            self.last_time = start
        key = (int(start // self.bucket_s), cls)
        point = self.series.get(key)
        if point is None:
            point = self.series[key] = [0.0, 0.0, 0.0, 0.0]  # gpu_h, wait sum, n, max
        point[0] += gpu_hours
        if wait is not None:
            point[1] += wait
            point[2] += 1
            if wait > point[3]:
                point[3] = wait

    def _pool(self, partition: str, nodes: str) -> Tuple[str, float, float]:
        key = (partition, nodes if not self._partition_pool(partition) else "")
        hit = self._pool_cache.get(key)
        if hit is None:
            pool = self._partition_pool(partition) or self._node_pool(nodes)
            hit = (
                (pool.name, float(pool.mps_shares_per_gpu or 100), float(pool.shards_per_gpu or 7))
                if pool else (_UNKNOWN_POOL, 100.0, 7.0)
            )
            if len(self._pool_cache) > 10_000:
                self._pool_cache.clear()
            self._pool_cache[key] = hit
        return hit

    def _partition_pool(self, partition: str) -> Any:
        for part in partition.split(","):
            for p in self.cfg.pools:
                if p.partition and p.partition == part:
                    return p
        return None

    def _node_pool(self, nodes: str) -> Any:
        if not nodes or nodes in ("None assigned", "(null)"):
            return None
        from slurmiso.slurm.hostlist import expand

        try:
            first = expand(nodes)[0]
        except (ValueError, IndexError):
            return None
        return self.cfg.pool_for_node(first)

    def multi_attempts(self, job: str) -> int:
        key: JobId = int(job) if job.isdigit() else job
        return self.multi.get(key, 1)


def _class_resolver(cfg: Any) -> Any:
    """QoS -> class via ``match.qos``, else partition via ``match.partitions``, else default."""
    by_qos: Dict[str, str] = {}
    by_part: Dict[str, str] = {}
    for c in cfg.classes:
        for q in c.match.qos:
            by_qos.setdefault(q, c.name)
        for p in c.match.partitions:
            by_part.setdefault(p, c.name)
    default = cfg.default_class or "(unclassified)"
    cache: Dict[Tuple[str, str], str] = {}

    def class_of(qos: str, partition: str) -> str:
        hit = cache.get((qos, partition))
        if hit is None:
            hit = by_qos.get(qos) or by_part.get(partition.split(",")[0]) or default
            if len(cache) < 10_000:
                cache[(qos, partition)] = hit
        return hit

    return class_of


def _round(value: Optional[float]) -> Optional[float]:
    return None if value is None else round(value, 1)
