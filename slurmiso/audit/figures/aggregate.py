"""The audit's figures and the lookups they need: what the per-attempt kernel folds into.

:class:`Aggregator` owns the figures (counters, histograms, bounded top-N lists and a bitmap
of job ids, so memory does not grow with the number of records: see
:mod:`slurmiso.audit.figures.jobset`) and what a job's fields decide (its class, by the
prolog's own classifier, and its pool). The arithmetic of one attempt is
:mod:`slurmiso.audit.figures.kernel`'s alone; this module adds records through it and adds
the figures of two parts of an input (:meth:`Aggregator.merge`).

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

from typing import Any, Dict, Iterable, List, Optional, Protocol, Tuple, TypeVar

from slurmiso.audit.figures.jobledger import JobLedger, JobMark, Rules, Tally
from slurmiso.audit.figures.jobset import JobSet
from slurmiso.audit.figures.kernel import Kernel, kernel_for
from slurmiso.audit.figures.stats import ClassStats, Waste, Who, offer
from slurmiso.audit.read.digest import JournalDigest
from slurmiso.audit.read.sacct import AcctRecord

UNKNOWN_POOL = "(none)"
UNCLASSIFIED = "(unclassified)"


class _Mergeable(Protocol):
    def merge(self, other: Any) -> None: ...


_M = TypeVar("_M", bound=_Mergeable)
_K = TypeVar("_K")


def _merge_table(mine: Dict[_K, _M], theirs: Dict[_K, _M]) -> None:
    """Each entry of ``theirs`` added to ``mine``'s (new names keep their order)."""
    for name, entry in theirs.items():
        had = mine.get(name)
        if had is None:
            mine[name] = entry
        else:
            had.merge(entry)


class Aggregator:
    """Fold records into per-class, per-pool, per-user and over-time statistics.

    A large file is folded in parts by several processes (:mod:`slurmiso.audit.read.parallel`):
    each part's aggregator travels back pickled (its figures only, see ``__getstate__``)
    and :meth:`merge` adds it to the one before it.
    """

    #: What a part's aggregator carries back: its figures, not the config, journal or caches.
    _FIGURES = ("bucket_s", "since", "until", "class_stats", "runs", "points", "spread", "seen",
                "ledger", "people", "inefficient", "outside_window", "first_time", "last_time",
                "ladder_lost")

    def __init__(self, cfg: Any, digest: Optional[JournalDigest] = None, bucket_s: int = 3600,
                 since: Optional[float] = None, until: Optional[float] = None) -> None:
        self.cfg = cfg
        self.digest = digest or JournalDigest()
        self.bucket_s = bucket_s
        self.since = since
        self.until = until
        #: class -> figures, in config order even when empty; attempts and GPU-hours are
        #: the sums of ``runs``: read :attr:`classes`
        self.class_stats: Dict[str, ClassStats] = {c.name: ClassStats() for c in cfg.classes}
        #: (class, pool) -> [attempts, GPU-hours]: what the kernel adds an attempt to once,
        #: where the class's figures and the pool's row each took it (read :attr:`pools`)
        self.runs: Dict[Tuple[str, str], List[float]] = {}
        #: (bucket, class) and (bucket, "pool:" + name) -> [gpu_h, wait sum, waits, wait max],
        #: but for the GPU-hours still in ``spread``: read :attr:`series`
        self.points: Dict[Tuple[int, str], List[float]] = {}
        #: (class, pool) -> bucket -> GPU-hours: the kernel adds a run's hours here once,
        #: not to the class's point and the pool's (half the additions in the hottest loop);
        #: :meth:`settle` moves them into ``points``
        self.spread: Dict[Tuple[str, str], Dict[float, float]] = {}
        self.seen = JobSet()
        #: what findings need per job, kept while its attempts may come (bounded)
        self.ledger = JobLedger(Rules(frozenset(c.name for c in cfg.classes if c.preemptible),
                                      cfg.audit.repeated_preemptions, self.digest))
        #: (user, account) -> figures: one record an attempt adds to, where a user's and an
        #: account's each took one (read :attr:`users` and :attr:`accounts`, their sums)
        self.people: Dict[Tuple[str, str], Who] = {}
        #: worst GPU efficiency by wasted GPU-hours: (wasted, job, user, util %, GPU-h, class)
        self.inefficient: List[Waste] = []
        #: (class, pool) -> [attempts the monitor's ladder requeued, lost GPU-hours since
        #: their last checkpoint, lost GPU-hours estimated (no checkpoint: the whole run)]
        self.ladder_lost: Dict[Tuple[str, str], List[float]] = {}
        self.outside_window = 0
        self.first_time: Optional[float] = None  # earliest start or end seen (data's span)
        self.last_time: Optional[float] = None
        self._class_cache: Dict[Tuple[str, str, str], str] = {}
        self._pool_cache: Dict[Tuple[str, str], Tuple[str, float, float]] = {}
        #: class -> its SLO's longest queue wait (s), where one is set
        self.slo_wait: Dict[str, float] = {s.class_name: s.max_queue_wait_s
                                           for s in cfg.monitor.slo
                                           if s.max_queue_wait_s is not None}
        #: classes whose jobs running longer than ``long_s`` are counted (long inference)
        self.long_classes = {c.name for c in cfg.classes
                             if c.name == "infer" or (c.qos.preempt and not c.preemptible)}
        self.long_s = cfg.audit.long_infer_job_s
        self._kernel: Optional[Kernel] = None

    def __getstate__(self) -> Dict[str, Any]:
        return {name: getattr(self, name) for name in self._FIGURES}

    def __setstate__(self, state: Dict[str, Any]) -> None:
        """Figures only: such an aggregator is merged into a live one, never added to."""
        self.__dict__.update(state)
        self.cfg = None
        self.digest = JournalDigest()
        self._kernel = None

    def merge(self, other: Aggregator) -> None:
        """Add ``other``, the figures of the input that follows this one's, as if this
        aggregator had gone on to fold it: counters and sums add, maxima and the data's span
        widen, capped id lists fill up in input order, new names keep their order of first
        appearance, the top-N heap keeps the top N. Exact for integers; a float sum may
        differ in its last bits from the one-pass sum (another order of additions).

        Job ids must not repeat across the two (attempts, jobs and requeues would be
        counted twice): the caller checks :meth:`JobSet.overlaps` first."""
        self.settle()
        other.settle()
        _merge_table(self.class_stats, other.class_stats)  # attempts, GPU-hours: from runs
        for where, row in other.runs.items():
            mine_r = self.runs.get(where)
            if mine_r is None:
                self.runs[where] = row
            else:
                mine_r[0] += row[0]
                mine_r[1] += row[1]
        series = self.points
        for key, point in other.points.items():
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
        self.ledger.merge(other.ledger)
        _merge_table(self.people, other.people)
        for item in other.inefficient:  # what the kernel does with each
            offer(self.inefficient, item)
        for where, row in other.ladder_lost.items():
            mine_l = self.ladder_lost.get(where)
            if mine_l is None:
                self.ladder_lost[where] = row
            else:
                for i, value in enumerate(row):
                    mine_l[i] += value
        self.outside_window += other.outside_window
        if other.first_time is not None and (self.first_time is None
                                             or other.first_time < self.first_time):
            self.first_time = other.first_time
        if other.last_time is not None and (self.last_time is None
                                            or other.last_time > self.last_time):
            self.last_time = other.last_time

    @property
    def series(self) -> Dict[Tuple[int, str], List[float]]:
        """(bucket, class) and (bucket, "pool:" + name) -> [GPU-hours, wait sum, waits,
        longest wait]: every point, with all the GPU-hours folded so far."""
        self.settle()
        return self.points

    @property
    def classes(self) -> Dict[str, ClassStats]:
        """class -> figures (config order, then others as they appear), with attempts and
        GPU-hours summed from :attr:`runs`."""
        sums: Dict[str, Tuple[int, float]] = {}
        for (cls, _), (attempts, hours) in self.runs.items():
            had = sums.get(cls, (0, 0.0))
            sums[cls] = (had[0] + int(attempts), had[1] + hours)
        for name, stats in self.class_stats.items():
            stats.attempts, stats.gpu_hours = sums.get(name, (0, 0.0))
        return self.class_stats

    @property
    def pools(self) -> Dict[str, List[float]]:
        """pool -> [attempts, GPU-hours], in order of first appearance: sums of :attr:`runs`."""
        out: Dict[str, List[float]] = {}
        for (_, pool), (attempts, hours) in self.runs.items():
            row = out.get(pool)
            if row is None:
                out[pool] = [attempts, hours]
            else:
                row[0] += attempts
                row[1] += hours
        return out

    @property
    def users(self) -> Dict[str, Who]:
        """user -> figures (GPU-hours, idle, lost, preemptions, jobs), in order of first
        appearance: the sums of its (user, account) records."""
        return self._sums(0)

    @property
    def accounts(self) -> Dict[str, Who]:
        """account -> figures, as :attr:`users`."""
        return self._sums(1)

    def _sums(self, part: int) -> Dict[str, Who]:
        out: Dict[str, Who] = {}
        for key, who in self.people.items():
            name = key[part]
            total = out.get(name)
            if total is None:
                total = out[name] = Who()
            total.merge(who)
        return out

    def settle(self) -> None:
        """Add each (class, pool, bucket)'s spread GPU-hours to the bucket's class point and
        pool point (made in that order where new) and empty the spread (in place: the
        kernel holds on to its dicts). Idempotent."""
        points = self.points
        for (cls, pool), buckets in self.spread.items():
            if not buckets:
                continue
            pool_name = "pool:" + pool
            for b, gh in buckets.items():
                for key in ((int(b), cls), (int(b), pool_name)):
                    point = points.get(key)
                    if point is None:
                        point = points[key] = [0.0, 0.0, 0.0, 0.0]
                    point[0] += gh
            buckets.clear()

    # -- classification ------------------------------------------------------------------

    def class_of(self, rec: AcctRecord) -> str:
        """The prolog's classifier on what sacct recorded; the journal's class wins where the
        prolog saw more (a SPANK ``--iso-class``, a QoS 22.05 does not show the prolog)."""
        return self.class_for(rec.job, rec.qos, rec.partition, rec.account)

    def class_for(self, job: str, qos: str, partition: str, account: str) -> str:
        """:meth:`class_of` on the fields themselves (without a record)."""
        journal = self.digest.job_class.get(job)
        if journal is not None:
            return journal
        if qos in ("", "Unknown"):  # 22.05 records a cancelled requeue without QoS
            facts = self.ledger.peek(job)
            if facts is not None and facts.preemptions:
                return facts.cls
        key = (qos, partition, account)
        hit = self._class_cache.get(key)
        if hit is None:
            hit = classify_fields(self.cfg, qos, partition, account)
            if len(self._class_cache) < 10_000:
                self._class_cache[key] = hit
        return hit

    # -- records -------------------------------------------------------------------------

    @property
    def kernel(self) -> Kernel:
        """The per-attempt kernel bound to these figures (made on first use)."""
        if self._kernel is None:
            self._kernel = kernel_for(self)
        return self._kernel

    def add_all(self, records: Iterable[AcctRecord]) -> None:
        """Fold every record in; a source that can fold itself (a saved ``sacct -P`` file,
        folded in parallel: :mod:`slurmiso.audit.read.parallel`) does so."""
        fold = getattr(records, "fold_into", None)
        if fold is not None:
            fold(self)
            return
        self.kernel.add_all(records)

    def add(self, rec: AcctRecord) -> None:
        """Fold one record in (:meth:`Kernel.add`)."""
        self.kernel.add(rec)

    def pool_for(self, partition: str, nodes: str) -> Tuple[str, float, float]:
        """(pool, MPS shares per GPU, shards per GPU) of a job: its partition's pool, else
        its first node's."""
        hit = self._pool_cache.get((partition, ""))  # a partition that names a pool
        if hit is not None:
            return hit
        named = self.partition_pool(partition)
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

    def partition_pool(self, partition: str) -> Any:
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

    def job_tallies(self) -> Dict[JobMark, Tally]:
        """What the jobs settled into (:mod:`~slurmiso.audit.figures.jobledger`), every job
        settled first: read once the input is folded."""
        return self.ledger.finish()

    def missing_attempts(self) -> Optional[Tally]:
        """Jobs whose ``Restarts`` says they ran before, with no earlier attempt in the input.

        Only meaningful when *no* restarted job shows its earlier attempts (a window can cut
        off the attempts of a few): then the input was saved without ``sacct -D``.
        """
        tallies = self.job_tallies()
        missing = tallies[JobMark.MISSING]
        return missing if missing.count and missing.count == tallies[JobMark.RESTARTED].count \
            else None

def classify_fields(cfg: Any, qos: str, partition: str, account: str) -> str:
    """Class name of a job from its accounting fields, by the prolog's own classifier."""
    from slurmiso.config.classify import classify

    part = partition.split(",", 1)[0]  # a pending job lists its candidate partitions
    cls, _ = classify(cfg, qos if qos != "Unknown" else "", part, account)
    return cls.name if cls is not None else UNCLASSIFIED
