"""The per-attempt kernel: the one place an attempt's figures are computed.

    agg = Aggregator(cfg, digest)
    agg.add_all(parse_parsable(lines, stats))  # or parse_json, or records a test makes
    agg.add(rec)                               # one record: Kernel.add

Every reader hands it :class:`~slurmiso.audit.read.sacct.AcctRecord` s, and so does each
part of the parallel fold (:mod:`slurmiso.audit.read.parallel`), whose aggregators are then
added with the containers' own ``merge`` (:mod:`~slurmiso.audit.figures.stats`). What a
figure means is in ``docs/audit.md``.

:meth:`Kernel.add_all` folds records a batch at a time (:func:`batches`). It first works
out what each record decides, once (:class:`Attempt`: whether it lies in the window, its
class and pool, its GPU equivalents, the part of its run inside the window and those
GPU-hours), then hands the batch's attempts to one adder per figure family, always in the
same order: GPU-hours (:meth:`~Kernel.add_gpu_hours`), jobs and users
(:meth:`~Kernel.add_jobs`), waits (:meth:`~Kernel.add_waits`), long jobs
(:meth:`~Kernel.add_long`), preemptions and lost work (:meth:`~Kernel.add_preemptions`),
GPU utilisation and waste (:meth:`~Kernel.add_usage`). Every figure therefore receives its
values in record order, whichever reader feeds it, and every float sum is the same as one
record at a time would give.

Each value is added once, at the finest grain a figure needs; the coarser figures are sums
made when read: a run's GPU-hours per (class, pool, bucket) (``Aggregator.spread``, settled
into the class's and the pool's series points), attempts and GPU-hours per (class, pool)
(``runs``: ``classes``, ``pools``), a user's figures per (user, account) (``people``:
``users``, ``accounts``). So these figures' memory is bounded by the distinct (user,
account, class, pool) and buckets, never by the number of records; what is kept per job
(a bit per job id, and the facts of the last few thousand jobs:
:mod:`~slurmiso.audit.figures.jobledger`) is the aggregator's.
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING, Dict, Iterable, Iterator, List, NamedTuple, Optional, Tuple

from slurmiso.audit.figures.stats import MAX_IDS, TOP, ClassStats, Who
from slurmiso.audit.figures.stats import offer as offer_waste

if TYPE_CHECKING:
    from slurmiso.audit.figures.aggregate import Aggregator
    from slurmiso.audit.read.sacct import AcctRecord

#: bucket -> GPU-hours, of one (class, pool): see Aggregator.spread
Spread = Dict[float, float]
#: What a record's QOS, partition, account (and journal) decide: class, its figures, pool,
#: (class, pool), MPS shares and shards per GPU
Place = Tuple[str, ClassStats, str, Tuple[str, str], float, float]
CACHE = 10_000  # entries in the place cache (hostile input cannot grow it without bound)


class Attempt(NamedTuple):
    """What one attempt's record decides, worked out once for every figure family."""

    rec: AcctRecord
    cls: str
    stats: ClassStats  # the class's figures
    pool: str
    where: Tuple[str, str]  # (class, pool): the key of its runs and spread
    gpus: float  # GPU equivalents: whole GPUs plus MPS shares and shards
    lo: Optional[float]  # the run [lo, hi) where it ran; None: it never ran
    hi: float
    gh: float  # GPU-hours of the run inside the window (sreport's clipping)
    clo: Optional[float]  # ... that part of the run [clo, chi); None: no GPU-hours
    chi: float


class Kernel:
    """The figure families' adders, bound to one aggregator (see the module's docstring)."""

    def __init__(self, agg: Aggregator) -> None:
        self.agg = agg
        self.digest = agg.digest
        self.since, self.until, self.bucket_s = agg.since, agg.until, agg.bucket_s
        # a whole number of seconds (3600): a bucket a run covers from edge to edge gets
        # exactly rate * bucket_s, what min/max compute there (k*b and (k+1)*b are exact)
        bucket_s = agg.bucket_s
        self.whole_s = bucket_s if type(bucket_s) is int and bucket_s > 0 else 0
        #: (QOS, partition, account) -> what it decides (see place)
        self.places: Dict[Tuple[str, str, str], Place] = {}

    def add(self, rec: AcctRecord) -> None:
        """Fold one attempt's record into every figure it counts in."""
        self.add_batch([rec])

    def add_all(self, records: Iterable[AcctRecord]) -> None:
        """Fold records in, a batch at a time (see :func:`batches`)."""
        for batch in batches(records):
            self.add_batch(batch)

    def add_batch(self, recs: List[AcctRecord]) -> None:
        """Fold a batch of records in, one figure family after the other: each family
        receives the batch's values in record order. No family reads another's figures
        (but the (user, account) record ``add_jobs`` makes, read after it), and no attempt
        depends on the batch's figures (but the class of a record without a QOS, which
        :func:`batches` puts first in a batch)."""
        ats = [at for at in map(self.attempt, recs) if at is not None]
        self.add_gpu_hours(ats)
        whole = [at for at in ats if not at.rec.component]  # a het job's other components
        self.add_jobs(whole)  # are the same job and attempt: GPU-hours and usage only
        self.add_waits(whole)
        self.add_long(whole)
        self.add_preemptions(whole)
        self.add_usage([at for at in ats if at.rec.gpu_util is not None])
        self.agg.ledger.tick()  # only here: a batch's jobs stay in the window through it

    # -- what a record decides -------------------------------------------------------------

    def attempt(self, rec: AcctRecord) -> Optional[Attempt]:
        """The attempt's facts, or None (counted) where it lies outside the window."""
        since, until, agg = self.since, self.until, self.agg
        lo: Optional[float] = None
        hi = 0.0
        if rec.start is not None and rec.nodes != "None assigned":
            lo = rec.start
            hi = rec.end if rec.end is not None else rec.start + rec.elapsed
        earliest = lo if lo is not None else (rec.eligible or rec.submit)
        if ((since is not None and rec.end is not None and rec.end < since)
                or (until is not None and earliest is not None and earliest >= until)):
            agg.outside_window += 1
            return None
        if lo is not None:  # the data's span
            if agg.first_time is None or lo < agg.first_time:
                agg.first_time = lo
            if agg.last_time is None or hi > agg.last_time:
                agg.last_time = hi
        cls, stats, pool, where, mps_per_gpu, shards_per_gpu = self.place(rec)
        gpus = rec.gpus
        if rec.mps:
            gpus += rec.mps / mps_per_gpu
        if rec.shards:
            gpus += rec.shards / shards_per_gpu
        gh, clo, chi = 0.0, None, 0.0
        if lo is not None and gpus:
            clo, chi, seconds = self.clipped(lo, hi, rec.elapsed)
            if seconds > 0:
                gh = gpus * seconds / 3600.0
            else:
                clo = None
        return Attempt(rec, cls, stats, pool, where, gpus, lo, hi, gh, clo, chi)

    def place(self, rec: AcctRecord) -> Place:
        """(class, its figures, pool, (class, pool), MPS shares and shards per GPU) of a
        record; the class's and the (class, pool)'s containers made on first sight, in
        order of appearance. Cached per (QOS, partition, account) where only they decide:
        no journal class for the job, a QOS, a partition that names its pool."""
        key = (rec.qos, rec.partition, rec.account)
        job_class = self.digest.job_class
        hit = self.places.get(key)
        if hit is not None and not (job_class and rec.job in job_class):
            return hit
        agg = self.agg
        cls = agg.class_for(rec.job, rec.qos, rec.partition, rec.account)
        stats = agg.class_stats.get(cls)
        if stats is None:
            stats = agg.class_stats[cls] = ClassStats()
        pool, mps_per_gpu, shards_per_gpu = agg.pool_for(rec.partition, rec.nodes)
        where = (cls, pool)
        if where not in agg.runs:
            agg.runs[where] = [0, 0.0]
        agg.spread.setdefault(where, {})  # (emptied by settle, never deleted)
        place = (cls, stats, pool, where, mps_per_gpu, shards_per_gpu)
        if (rec.job not in job_class and rec.qos not in ("", "Unknown")
                and len(self.places) < CACHE and agg.partition_pool(rec.partition)):
            self.places[key] = place
        return place

    def clipped(self, lo: float, hi: float, elapsed: float) -> Tuple[float, float, float]:
        """(start, end, seconds) of the run [lo, hi) inside the window."""
        since, until = self.since, self.until
        if (since is None or lo >= since) and (until is None or hi <= until):
            return lo, hi, elapsed  # the whole run is inside the window
        clo = since if since is not None and lo < since else lo
        chi = until if until is not None and hi > until else hi
        return clo, chi, min(elapsed, chi - clo)

    # -- the figure families ---------------------------------------------------------------

    def add_gpu_hours(self, ats: List[Attempt]) -> None:
        """GPU-hours: the (class, pool)'s sum and its buckets over time."""
        runs, spreads, spread = self.agg.runs, self.agg.spread, self.spread
        for at in ats:
            runs[at.where][1] += at.gh  # the class's and the pool's are sums of these
            if at.clo is not None:
                spread(spreads[at.where], at.clo, at.chi, at.gh)

    def spread(self, spread: Spread, clo: float, chi: float, gh: float) -> None:
        """Spread ``gh`` of the run [clo, chi) over the buckets it ran in, by time. Bucket
        numbers are floats (exact): a float equal to an int finds its key."""
        bucket_s = self.bucket_s
        b0 = clo // bucket_s
        b1 = chi // bucket_s  # the bucket of the run's last instant: not an end on an
        if b1 > b0 and b1 * bucket_s >= chi:  # edge (chi - 1e-9 is chi at 1.7e9)
            b1 -= 1
        if b0 == b1:
            spread[b0] = spread.get(b0, 0.0) + gh
        elif b1 == b0 + 1:  # a run across one bucket boundary
            cut = gh * ((b0 + 1) * bucket_s - clo) / (chi - clo)
            spread[b0] = spread.get(b0, 0.0) + cut
            spread[b1] = spread.get(b1, 0.0) + (gh - cut)
        else:
            self.spread_long(spread, b0, b1, clo, chi, gh)

    def spread_long(self, spread: Spread, b0: float, b1: float, clo: float, chi: float,
                    gh: float) -> None:
        """Buckets b0..b1 (three or more); min/max pick a bucket's edges where the run
        covers it whole."""
        bucket_s, whole_s = self.bucket_s, self.whole_s
        rate = gh / (chi - clo)
        # a whole number of seconds: a covered bucket gets rate * bucket_s, (k+1)*b - k*b
        cut = (rate * ((b0 + 1) * bucket_s - clo) if whole_s  # clo >= b0*b
               else rate * (min(chi, (b0 + 1) * bucket_s) - max(clo, b0 * bucket_s)))
        k = b0
        while True:
            spread[k] = spread.get(k, 0.0) + cut
            if k == b1:
                return
            k += 1
            cut = (rate * whole_s if whole_s and k != b1
                   else rate * (min(chi, (k + 1) * bucket_s) - max(clo, k * bucket_s)))

    def add_jobs(self, ats: List[Attempt]) -> None:
        """Attempts, distinct jobs, requeues, restarts, and the (user, account)'s figures;
        each job's attempts and restarts in the ledger's window."""
        agg = self.agg
        runs, seen, people, ledger = agg.runs, agg.seen, agg.people, agg.ledger
        young = ledger.young  # (swapped only between batches)
        for at in ats:
            rec = at.rec
            job = rec.job
            runs[at.where][0] += 1  # attempts, as GPU-hours
            new_job = seen.add(job)
            if new_job:
                at.stats.jobs += 1
                young[job] = None
            else:
                ledger.again(job)
            if rec.restarts > 0:
                facts = ledger.facts(job)
                facts.restarts = max(rec.restarts, facts.restarts)
            who = people.get((rec.user, rec.account))
            if who is None:
                who = people[(rec.user, rec.account)] = Who()
            if new_job:
                who.jobs += 1
            who.gpu_hours += at.gh

    def add_waits(self, ats: List[Attempt]) -> None:
        """Queue waits of attempts that started in the window: the class's histogram and
        SLO count, and the series point of the bucket it started in."""
        since, bucket_s, points, slo_wait = (self.since, self.bucket_s, self.agg.points,
                                             self.agg.slo_wait)
        for at in ats:
            lo, stats = at.lo, at.stats
            if lo is None or (since is not None and lo < since):
                continue
            stats.started += 1
            rec = at.rec
            waited_from = rec.eligible if rec.eligible is not None else rec.submit
            if waited_from is None:
                continue
            wait = lo - waited_from if lo > waited_from else 0.0
            stats.wait.add(wait)
            limit = slo_wait.get(at.cls)
            if limit is not None and wait <= limit:
                stats.wait_slo_met += 1
            key = (int(lo // bucket_s), at.cls)
            point = points.get(key)
            if point is None:
                point = points[key] = [0.0, 0.0, 0.0, 0.0]
            point[1] += wait
            point[2] += 1
            if wait > point[3]:
                point[3] = wait

    def add_long(self, ats: List[Attempt]) -> None:
        """Jobs of a class that counts them running longer than ``audit.long_infer_job_s``."""
        long_s, long_classes = self.agg.long_s, self.agg.long_classes
        for at in ats:
            if at.rec.elapsed > long_s and at.cls in long_classes:
                at.stats.long_jobs += 1
                if len(at.stats.long_job_ids) < MAX_IDS:
                    at.stats.long_job_ids.append(at.rec.job)

    def add_preemptions(self, ats: List[Attempt]) -> None:
        """Preemptions and their lost work; the ladder's requeues and user-reported
        preemptions of REQUEUED attempts."""
        digest, people = self.digest, self.agg.people
        for at in ats:
            rec = at.rec
            if rec.state == "PREEMPTED" and not (
                    rec.start is not None and digest.confirmed_unpreempted(rec.job, rec.start)):
                # (24.05+ names an attempt that ended by itself PREEMPTED: see digest.py)
                lost = self.preempted(at)
                who = people[(rec.user, rec.account)]
                who.preemptions += 1
                who.lost_gpu_hours += lost
            elif rec.state == "REQUEUED" and rec.start is not None and rec.end is not None:
                if (digest.ladder.requeued_at  # empty: nothing to ask
                        and digest.ladder_requeued_within(rec.job, rec.start, rec.end)):
                    self.ladder_requeue(at)
                elif digest.preempted_within(rec.job, rec.start, rec.end):
                    at.stats.preemptions_user_reported += 1

    def preempted(self, at: Attempt) -> float:
        """Count a preempted attempt; its lost GPU-hours since the last checkpoint."""
        job, stats = at.rec.job, at.stats
        stats.preemptions += 1
        facts = self.agg.ledger.facts(job)
        if not facts.preemptions:
            facts.cls = at.cls  # the class of its first preemption
        facts.preemptions += 1
        if at.lo is None:
            return 0.0
        lost, measured = self.lost_work(job, at.gpus, at.lo, at.hi)
        if measured:
            stats.lost_gpu_hours += lost
        else:
            stats.lost_gpu_hours_estimated += lost
        return lost

    def ladder_requeue(self, at: Attempt) -> None:
        """An attempt the monitor's ladder requeued: its work since the last checkpoint is
        what the ladder cost, counted apart from preemptions (it is not one)."""
        ladder_lost = self.agg.ladder_lost
        row = ladder_lost.get((at.cls, at.pool))
        if row is None:
            row = ladder_lost[(at.cls, at.pool)] = [0.0, 0.0, 0.0]
        row[0] += 1
        if at.lo is not None:
            lost, measured = self.lost_work(at.rec.job, at.gpus, at.lo, at.hi)
            row[1 if measured else 2] += lost

    def lost_work(self, job: str, gpus: float, lo: float, hi: float) -> Tuple[float, bool]:
        """GPU-hours of the run [lo, hi) after its last checkpoint, clipped to the window,
        and whether a checkpoint measured it (else the whole run counts: an estimate)."""
        since, until, digest = self.since, self.until, self.digest
        ckpt = digest.last_checkpoint(job, lo, hi)
        lost_lo = ckpt if ckpt is not None else lo
        if since is not None and lost_lo < since:
            lost_lo = since
        lost_hi = until if until is not None and hi > until else hi
        lost = gpus * max(0.0, lost_hi - lost_lo) / 3600.0
        return lost, ckpt is not None or job in digest.checkpointing_jobs

    def add_usage(self, ats: List[Attempt]) -> None:
        """GPU utilisation (%, the max over the job's steps) of attempts that have one:
        accounted and idle GPU-hours, and the ranking of wasted GPU-hours."""
        for at in ats:
            if at.gpus:
                self.usage(at, at.rec.gpu_util)  # type: ignore[arg-type]

    def usage(self, at: Attempt, util: float) -> None:
        gpus, gh, stats = at.gpus, at.gh, at.stats
        stats.util_gpu_hours += gh
        # GPU efficiency 0..1 from Slurm's gres/gpuutil, where a value above 100 is a sum
        # over the job's GPUs (NaN reads as 1: nothing wasted)
        eff = (util / gpus if util > 100 and gpus > 1 else util) / 100.0
        if not eff <= 1.0:
            eff = 1.0
        elif eff < 0.0:
            eff = 0.0
        wasted = gh * (1.0 - eff)
        inefficient = self.agg.inefficient
        # the item is built only when it may go in (item > top needs wasted >= top's)
        if wasted > 0 and (len(inefficient) < TOP or wasted >= inefficient[0][0]):
            offer_waste(inefficient, (wasted, at.rec.job, at.rec.user, round(util, 1), gh,
                                      at.cls))
        if util <= 0:
            stats.idle_gpu_hours += gh
            if gh and not at.rec.component:  # a het component's are its class's only
                self.agg.people[(at.rec.user, at.rec.account)].idle_gpu_hours += gh


def batches(records: Iterable[AcctRecord], size: int = 1024) -> Iterator[List[AcctRecord]]:
    """``records`` in lists of up to ``size``, cut before a record without a QOS: its class
    may be a preempted job's (``Aggregator.class_for``), so the records before it must be
    folded whole first."""
    it = iter(records)
    while True:
        chunk = list(itertools.islice(it, size))
        if not chunk:
            return
        cuts = [i for i, rec in enumerate(chunk) if i and rec.qos in _NO_QOS]
        for lo, hi in zip([0, *cuts], [*cuts, len(chunk)]):
            yield chunk[lo:hi]


_NO_QOS = ("", "Unknown")


def kernel_for(agg: Aggregator) -> Kernel:
    """The kernel that folds attempts into ``agg``'s figures."""
    return Kernel(agg)

