"""Online aggregation of job records into the audit's figures. Pure: no I/O, no clock.

:class:`Aggregator` takes one :class:`~slurmiso.audit.read.sacct.AcctRecord` at a time and keeps only
counters, histograms, bounded top-N lists and a bitmap of job ids, so memory does not grow
with the number of records (see :mod:`slurmiso.audit.figures.jobset`).

Every figure is defined in ``docs/audit.md``; the keys used there are in
:mod:`slurmiso.audit.figures.definitions`. In short:

- *attempt*: one allocation record (``sacct -D`` lists each requeued attempt);
  *jobs*: distinct job ids; *requeues* = attempts - jobs.
- *GPU-hours* (sreport's rule): GPU equivalents x the part of the attempt's run that lies
  inside ``[since, until)``; an attempt that started before the window counts only its hours
  inside it.
- *preemption*: an attempt in state ``PREEMPTED`` (a fact from accounting). A ``REQUEUED``
  attempt for which the wrapper reported a preemption signal is counted apart as
  *user-reported*: the wrapper runs as the job's user.
- *wait*: ``start - eligible`` (``submit`` when eligible is unknown) of attempts that started
  inside the window.
- *lost GPU-hours*: for a preempted attempt, GPU equivalents x the time from its last
  successful checkpoint inside the attempt (journal, user-reported) to its end; where the job
  never reported a checkpoint, the whole attempt, counted apart as an *estimate*. Both are
  clipped to the window, so lost <= GPU-hours of the same attempts.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, List, Optional, Tuple

from slurmiso.audit.read.digest import JournalDigest
from slurmiso.audit.figures.jobset import JobSet
from slurmiso.audit.figures.quantiles import LogHistogram
from slurmiso.audit.read.sacct import AcctRecord

_MAX_IDS = 50
_TOP = 20
UNKNOWN_POOL = "(none)"
UNCLASSIFIED = "(unclassified)"


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
        """Add the figures of a later part of the input (see :meth:`Aggregator.merge`)."""
        self.jobs += other.jobs
        self.attempts += other.attempts
        self.started += other.started
        self.preemptions += other.preemptions
        self.preemptions_user_reported += other.preemptions_user_reported
        self.wait.merge(other.wait)
        self.gpu_hours += other.gpu_hours
        self.lost_gpu_hours += other.lost_gpu_hours
        self.lost_gpu_hours_estimated += other.lost_gpu_hours_estimated
        self.util_gpu_hours += other.util_gpu_hours
        self.idle_gpu_hours += other.idle_gpu_hours
        self.wait_slo_met += other.wait_slo_met
        self.long_jobs += other.long_jobs
        room = _MAX_IDS - len(self.long_job_ids)
        if room > 0:
            self.long_job_ids.extend(other.long_job_ids[:room])


class Preempted:
    """What findings need about one preempted job (slots: there may be many)."""

    __slots__ = ("cls", "user", "preemptions", "lost_hours")

    def __init__(self, cls: str, user: str) -> None:
        self.cls = cls
        self.user = user
        self.preemptions = 0
        self.lost_hours = 0.0

    def merge(self, other: Preempted) -> None:
        self.preemptions += other.preemptions
        self.lost_hours += other.lost_hours


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
        self.gpu_hours += other.gpu_hours
        self.idle_gpu_hours += other.idle_gpu_hours
        self.lost_gpu_hours += other.lost_gpu_hours
        self.preemptions += other.preemptions
        self.jobs += other.jobs


class Aggregator:
    """Fold records into per-class, per-pool, per-user and over-time statistics.

    A large file is folded in parts by several processes (:mod:`slurmiso.audit.read.parallel`):
    each part's aggregator travels back pickled (its figures only, see ``__getstate__``)
    and :meth:`merge` adds it to the one before it.
    """

    #: What a part's aggregator carries back: its figures, not the config, journal or caches.
    _FIGURES = ("bucket_s", "since", "until", "classes", "pools", "series", "seen", "multi",
                "preempted", "users", "accounts", "inefficient", "restarted",
                "outside_window", "first_time", "last_time")

    def __init__(self, cfg: Any, digest: Optional[JournalDigest] = None, bucket_s: int = 3600,
                 since: Optional[float] = None, until: Optional[float] = None) -> None:
        self.cfg = cfg
        self.digest = digest or JournalDigest()
        self.bucket_s = bucket_s
        self.since = since
        self.until = until
        self.classes: Dict[str, ClassStats] = {
            c.name: ClassStats() for c in cfg.classes}  # config order, even when empty
        self.pools: Dict[str, List[float]] = {}  # pool -> [attempts, gpu_hours]
        #: (bucket, class) and (bucket, "pool:" + name) -> [gpu_h, wait sum, waits, wait max]
        self.series: Dict[Tuple[int, str], List[float]] = {}
        self.seen = JobSet()
        self.multi: Dict[str, int] = {}  # attempts of ids seen more than once
        self.preempted: Dict[str, Preempted] = {}
        self.users: Dict[str, Who] = {}
        self.accounts: Dict[str, Who] = {}
        #: worst GPU efficiency by wasted GPU-hours: (wasted, job, user, util %, GPU-h, class)
        self.inefficient: List[Tuple[float, str, str, float, float, str]] = []
        self.restarted: Dict[str, int] = {}  # job -> sacct Restarts, when > 0
        self.outside_window = 0
        self.first_time: Optional[float] = None  # earliest start or end seen (data's span)
        self.last_time: Optional[float] = None
        self._class_cache: Dict[Tuple[str, str, str], str] = {}
        self._pool_cache: Dict[Tuple[str, str], Tuple[str, float, float]] = {}
        self._slo_wait = {s.class_name: s.max_queue_wait_s for s in cfg.monitor.slo
                          if s.max_queue_wait_s is not None}
        self._long_classes = {c.name for c in cfg.classes
                              if c.name == "infer" or (c.qos.preempt and not c.preemptible)}
        self._long_s = cfg.audit.long_infer_job_s

    def __getstate__(self) -> Dict[str, Any]:
        return {name: getattr(self, name) for name in self._FIGURES}

    def __setstate__(self, state: Dict[str, Any]) -> None:
        """Figures only: such an aggregator is merged into a live one, never added to."""
        self.__dict__.update(state)
        self.cfg = None
        self.digest = JournalDigest()

    def merge(self, other: Aggregator) -> None:
        """Add ``other``, the figures of the input that follows this one's, as if this
        aggregator had gone on to fold it: counters and sums add, maxima and the data's span
        widen, capped id lists fill up in input order, new names keep their order of first
        appearance, the top-N heap keeps the top N. Exact for integers; a float sum may
        differ in its last bits from the one-pass sum (another order of additions).

        Job ids must not repeat across the two (attempts, jobs and requeues would be
        counted twice): the caller checks :meth:`JobSet.overlaps` first."""
        for name, cs in other.classes.items():
            mine = self.classes.get(name)
            if mine is None:
                self.classes[name] = cs
            else:
                mine.merge(cs)
        for name, row in other.pools.items():
            p = self.pools.get(name)
            if p is None:
                self.pools[name] = row
            else:
                p[0] += row[0]
                p[1] += row[1]
        series = self.series
        for key, point in other.series.items():
            mine_p = series.get(key)
            if mine_p is None:
                series[key] = point
            else:
                mine_p[0] += point[0]
                mine_p[1] += point[1]
                mine_p[2] += point[2]
                if point[3] > mine_p[3]:
                    mine_p[3] = point[3]
        self.seen.merge(other.seen)
        for job, n in other.multi.items():
            self.multi[job] = self.multi.get(job, 0) + n
        for job, entry in other.preempted.items():
            had = self.preempted.get(job)
            if had is None:
                self.preempted[job] = entry
            else:
                had.merge(entry)
        for mine_t, theirs in ((self.users, other.users), (self.accounts, other.accounts)):
            for name, who in theirs.items():
                had_w = mine_t.get(name)
                if had_w is None:
                    mine_t[name] = who
                else:
                    had_w.merge(who)
        heap = self.inefficient
        for item in other.inefficient:  # what _usage does with each
            if len(heap) < _TOP:
                heapq.heappush(heap, item)
            elif item > heap[0]:
                heapq.heapreplace(heap, item)
        for job, restarts in other.restarted.items():
            self.restarted[job] = max(restarts, self.restarted.get(job, 0))
        self.outside_window += other.outside_window
        if other.first_time is not None and (self.first_time is None
                                             or other.first_time < self.first_time):
            self.first_time = other.first_time
        if other.last_time is not None and (self.last_time is None
                                            or other.last_time > self.last_time):
            self.last_time = other.last_time

    # -- classification ------------------------------------------------------------------

    def class_of(self, rec: AcctRecord) -> str:
        """The prolog's classifier on what sacct recorded; the journal's class wins where the
        prolog saw more (a SPANK ``--iso-class``, a QoS 22.05 does not show the prolog)."""
        return self.class_for(rec.job, rec.qos, rec.partition, rec.account)

    def class_for(self, job: str, qos: str, partition: str, account: str) -> str:
        """:meth:`class_of` on the fields themselves (the fused -P reader has no record)."""
        journal = self.digest.job_class.get(job)
        if journal is not None:
            return journal
        if qos in ("", "Unknown") and job in self.preempted:
            return self.preempted[job].cls  # 22.05 records a cancelled requeue without QoS
        key = (qos, partition, account)
        hit = self._class_cache.get(key)
        if hit is None:
            hit = classify_fields(self.cfg, qos, partition, account)
            if len(self._class_cache) < 10_000:
                self._class_cache[key] = hit
        return hit

    # -- records -------------------------------------------------------------------------

    def add_all(self, records: Iterable[AcctRecord]) -> None:
        """Fold every record in; a source that can fold itself (``sacct -P``, see
        :mod:`slurmiso.audit.read.fold`) does so without making the records."""
        fold = getattr(records, "fold_into", None)
        if fold is not None:
            fold(self)
            return
        add = self.add
        for rec in records:
            add(rec)

    def add(self, rec: AcctRecord) -> None:
        """Fold one record in. The hot path of a million rows: fields unpacked once, the
        common cases (a classified QoS, a named pool, one or two time buckets) inline."""
        (job, _name, user, account, partition, qos, state, submit, eligible, start, end,
         elapsed, _limit, gpus, mps, shards, nodes, util, _steps, component, restarts,
         _mem) = rec
        ran = start is not None and nodes != "None assigned"
        if ran:
            lo: Optional[float] = start
            hi: Optional[float] = end if end is not None else start + elapsed  # type: ignore
        else:
            lo = hi = None
        since, until = self.since, self.until
        if since is not None and end is not None and end < since:
            self.outside_window += 1
            return
        first = lo if lo is not None else (eligible or submit)
        if until is not None and first is not None and first >= until:
            self.outside_window += 1
            return
        if lo is not None:
            if self.first_time is None or lo < self.first_time:
                self.first_time = lo
            if self.last_time is None or hi > self.last_time:  # type: ignore[operator]
                self.last_time = hi
        cls = self.digest.job_class.get(job) if self.digest.job_class else None
        if cls is None:
            cls = self._class_cache.get((qos, partition, account))
            if cls is None or (qos in ("", "Unknown") and job in self.preempted):
                cls = self.class_of(rec)
        stats = self.classes.get(cls)
        if stats is None:
            stats = self.classes[cls] = ClassStats()
        # GPU equivalents and the hours of the run inside the window (sreport's clipping)
        pool, mps_per_gpu, shards_per_gpu = self._pool(partition, nodes)
        if mps:
            gpus += mps / mps_per_gpu
        if shards:
            gpus += shards / shards_per_gpu
        gpu_hours = 0.0
        if lo is not None and gpus:
            clo = since if since is not None and lo < since else lo
            chi = until if until is not None and hi > until else hi  # type: ignore[operator]
            seconds = elapsed if (clo == lo and chi == hi) else min(elapsed, chi - clo)  # type: ignore[operator]
            if seconds > 0:
                gpu_hours = gpus * seconds / 3600.0
                self._spread(clo, chi, gpu_hours, cls, pool)  # type: ignore[arg-type]
        stats.gpu_hours += gpu_hours
        p = self.pools.get(pool)
        if p is None:
            p = self.pools[pool] = [0, 0.0]
        p[1] += gpu_hours
        if component:  # another component of a het job: same job, same attempt
            if util is not None and gpus:
                self._usage(util, job, user, stats, gpus, gpu_hours, cls)
            return
        p[0] += 1
        stats.attempts += 1
        if self.seen.add(job):
            stats.jobs += 1
            new_job = True
        else:
            self.multi[job] = self.multi.get(job, 1) + 1
            new_job = False
        if restarts > 0:
            self.restarted[job] = max(restarts, self.restarted.get(job, 0))
        users, accounts = self.users, self.accounts
        who_u = users.get(user)
        if who_u is None:
            who_u = users[user] = Who()
        who_a = accounts.get(account)
        if who_a is None:
            who_a = accounts[account] = Who()
        if new_job:
            who_u.jobs += 1
            who_a.jobs += 1
        who_u.gpu_hours += gpu_hours
        who_a.gpu_hours += gpu_hours
        if ran and (since is None or start >= since):  # type: ignore[operator]
            stats.started += 1
            waited_from = eligible if eligible is not None else submit
            if waited_from is not None:
                wait = start - waited_from if start > waited_from else 0.0  # type: ignore
                stats.wait.add(wait)
                limit = self._slo_wait.get(cls)
                if limit is not None and wait <= limit:
                    stats.wait_slo_met += 1
                self._wait_point(start, cls, wait)  # type: ignore[arg-type]
        if util is not None and gpus:
            idle = self._usage(util, job, user, stats, gpus, gpu_hours, cls)
            if idle:
                who_u.idle_gpu_hours += idle
                who_a.idle_gpu_hours += idle
        if elapsed > self._long_s and cls in self._long_classes:
            stats.long_jobs += 1
            if len(stats.long_job_ids) < _MAX_IDS:
                stats.long_job_ids.append(job)
        if state == "PREEMPTED" and not (
                start is not None and self.digest.confirmed_unpreempted(job, start)):
            lost = self._preemption(job, user, cls, stats, gpus, lo, hi)
            for who in (who_u, who_a):
                who.preemptions += 1
                who.lost_gpu_hours += lost
        elif (state == "REQUEUED" and start is not None and end is not None
              and self.digest.preempted_within(job, start, end)):
            stats.preemptions_user_reported += 1

    def _clip(self, lo: float, hi: float) -> Tuple[float, float]:
        if self.since is not None and lo < self.since:
            lo = self.since
        if self.until is not None and hi > self.until:
            hi = self.until
        return lo, hi

    def _usage(self, util: float, job: str, user: str, stats: ClassStats, gpus: float,
               gpu_hours: float, cls: str) -> float:
        """Account GPU utilisation (``util`` not None, ``gpus`` > 0); returns the idle
        GPU-hours of this record (0 if busy)."""
        stats.util_gpu_hours += gpu_hours
        eff = efficiency(util, gpus)
        wasted = gpu_hours * (1.0 - eff)
        if wasted > 0:
            item = (wasted, job, user, round(util, 1), gpu_hours, cls)
            if len(self.inefficient) < _TOP:
                heapq.heappush(self.inefficient, item)
            elif item > self.inefficient[0]:
                heapq.heapreplace(self.inefficient, item)
        if util <= 0:
            stats.idle_gpu_hours += gpu_hours
            return gpu_hours
        return 0.0

    def _preemption(self, job: str, user: str, cls: str, stats: ClassStats, gpus: float,
                    lo: Optional[float], hi: Optional[float]) -> float:
        stats.preemptions += 1
        entry = self.preempted.get(job)
        if entry is None:
            entry = self.preempted[job] = Preempted(cls, user)
        entry.preemptions += 1
        if lo is None or hi is None:
            return 0.0
        ckpt = self.digest.last_checkpoint(job, lo, hi)
        lost_lo, lost_hi = self._clip(ckpt if ckpt is not None else lo, hi)
        lost = gpus * max(0.0, lost_hi - lost_lo) / 3600.0
        entry.lost_hours += lost
        if ckpt is not None or job in self.digest.checkpointing_jobs:
            stats.lost_gpu_hours += lost
        else:
            stats.lost_gpu_hours_estimated += lost
        return lost

    def _spread(self, lo: float, hi: float, gpu_hours: float, cls: str, pool: str) -> None:
        """Share ``gpu_hours`` out over the buckets ``[lo, hi)`` covers, by time."""
        b = self.bucket_s
        first = int(lo // b)
        last = int((hi - 1e-9) // b) if hi > lo else first
        series = self.series
        pool_key = "pool:" + pool
        if first == last:
            parts: Iterable[Tuple[int, float]] = ((first, gpu_hours),)
        elif last == first + 1:  # the common case: a run across one bucket boundary
            cut = gpu_hours * ((first + 1) * b - lo) / (hi - lo)
            parts = ((first, cut), (last, gpu_hours - cut))
        else:
            rate = gpu_hours / (hi - lo)
            parts = [(k, rate * (min(hi, (k + 1) * b) - max(lo, k * b)))
                     for k in range(first, last + 1)]
        for k, gh in parts:
            point = series.get((k, cls))
            if point is None:
                point = series[(k, cls)] = [0.0, 0.0, 0.0, 0.0]
            point[0] += gh
            point = series.get((k, pool_key))
            if point is None:
                point = series[(k, pool_key)] = [0.0, 0.0, 0.0, 0.0]
            point[0] += gh

    def _wait_point(self, start: float, cls: str, wait: float) -> None:
        key = (int(start // self.bucket_s), cls)
        point = self.series.get(key)
        if point is None:
            point = self.series[key] = [0.0, 0.0, 0.0, 0.0]
        point[1] += wait
        point[2] += 1
        if wait > point[3]:
            point[3] = wait

    @staticmethod
    def _who(table: Dict[str, Who], name: str) -> Who:
        who = table.get(name)
        if who is None:
            who = table[name] = Who()
        return who

    def _pool(self, partition: str, nodes: str) -> Tuple[str, float, float]:
        hit = self._pool_cache.get((partition, ""))  # a partition that names a pool
        if hit is not None:
            return hit
        named = self._partition_pool(partition)
        # else the nodes decide, under a key that cannot be the one above: with (partition,
        # nodes) an empty NodeList cached (partition, "") and every later job of that
        # partition took its pool, whatever its nodes (the result hung on the rows' order)
        key = (partition, "") if named else (partition, "nodes:" + nodes)
        hit = self._pool_cache.get(key)
        if hit is None:
            pool = named or self._node_pool(nodes)
            hit = (
                (pool.name, float(pool.mps_shares_per_gpu or 100), float(pool.shards_per_gpu or 7))
                if pool else (UNKNOWN_POOL, 100.0, 7.0)
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
        from slurmiso.hostlist import expand

        try:
            first = expand(nodes)[0]
        except (ValueError, IndexError):
            return None
        return self.cfg.pool_for_node(first)

    def multi_attempts(self, job: str) -> int:
        return self.multi.get(job, 1)

    def missing_attempts(self) -> List[str]:
        """Jobs whose ``Restarts`` says they ran before, with no earlier attempt in the input.

        Only meaningful when *no* restarted job shows its earlier attempts (a window can cut
        off the attempts of a few): then the input was saved without ``sacct -D``.
        """
        missing = [j for j in self.restarted if self.multi.get(j, 1) <= 1]
        return missing if missing and len(missing) == len(self.restarted) else []


def classify_fields(cfg: Any, qos: str, partition: str, account: str) -> str:
    """Class name of a job from its accounting fields, by the prolog's own classifier."""
    from slurmiso.isolation.classify import classify

    part = partition.split(",", 1)[0]  # a pending job lists its candidate partitions
    cls, _ = classify(cfg, qos if qos != "Unknown" else "", part, account)
    return cls.name if cls is not None else UNCLASSIFIED


def efficiency(util: float, gpus: float) -> float:
    """0..1 from Slurm's ``gres/gpuutil``; a value above 100 is a sum over the job's GPUs."""
    per_gpu = util / gpus if util > 100 and gpus > 1 else util
    return max(0.0, min(1.0, per_gpu / 100.0))


def _round(value: Optional[float]) -> Optional[float]:
    return None if value is None else round(value, 1)
