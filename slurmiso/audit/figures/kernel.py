"""The per-attempt kernel: the one place an attempt's figures are computed.

Every reader feeds it: :meth:`~slurmiso.audit.figures.aggregate.Aggregator.add` with a
record's fields (``sacct --json``, tests), the fused ``sacct -P`` reader
(:mod:`slurmiso.audit.read.fold`) with the fields it lexed, and so each part of the parallel
fold, whose aggregators are then added with the containers' own ``merge``
(:mod:`~slurmiso.audit.figures.stats`). What a figure means is in ``docs/audit.md``.

An attempt goes in by two calls: ``attempt(...)`` with what accounting says of it, then
``usage(util)`` once its GPU utilisation is known. In ``sacct -P`` that is the max over the
steps that follow the job's row, so the fold calls ``usage`` when the next job row comes;
nothing is folded in between, so every figure receives its values in the same order
whichever reader feeds it, and every float sum is the same.

Speed: this is the loop body of a million rows. The closures bind the aggregator's
containers once (cell variables, not attribute lookups), and what a (QOS, partition,
account) triple decides, a time bucket's series points and a wait's histogram bucket are
looked up in caches filled on first use (bounded: hostile input cannot grow them). Each
value is added once, at the finest grain a figure needs; the coarser figures are sums made
when read: a run's GPU-hours per (class, pool, bucket) (``Aggregator.spread``, settled into
the class's and the pool's series points), attempts and GPU-hours per (class, pool)
(``runs``: ``classes``, ``pools``), a user's figures per (user, account) (``people``:
``users``, ``accounts``). Spreading alone was a fifth of the fold's time while each bucket
took two additions.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Dict, List, Optional, Protocol, Tuple

from slurmiso.audit.figures.jobset import MAX_BIT_ID
from slurmiso.audit.figures.quantiles import EXACT, LogHistogram
from slurmiso.audit.figures.stats import MAX_IDS, TOP, ClassStats, Preempted, Who
from slurmiso.audit.figures.stats import offer as offer_waste

if TYPE_CHECKING:
    from slurmiso.audit.figures.aggregate import Aggregator
    from slurmiso.audit.read.sacct import AcctRecord

CACHE = 10_000  # entries per cache
_MASKS = (1, 2, 4, 8, 16, 32, 64, 128)  # 1 << (n & 7)

#: A series point: [GPU-hours, wait sum, waits, longest wait]
Point = List[float]
#: bucket -> its point, of one class or pool (an int key is found by its float too)
Points = Dict[float, Point]
#: bucket -> [GPU-hours], of one (class, pool): see Aggregator.spread
Spread = Dict[float, List[float]]
#: What a (QOS, partition, account) decides: class, its figures and points, its SLO wait,
#: whether it counts long jobs, pool, MPS shares and shards per GPU, the (class, pool)'s
#: [attempts, GPU-hours] (Aggregator.runs), spread
Spot = Tuple[str, ClassStats, Points, Optional[float], bool, str, float, float, List[float],
             Spread]


class Attempt(Protocol):
    def __call__(self, job: str, user: str, account: str, partition: str, qos: str,
                 state: str, submit: Optional[float], eligible: Optional[float],
                 start: Optional[float], end: Optional[float], elapsed: float, gpus: float,
                 mps: int, shards: int, nodes: str, component: int, restarts: int) -> None:
        """Fold one attempt in, but for its GPU utilisation. ``state`` is sacct's first
        word, upper case; ``job`` the job id with array task, het components folded."""


class Usage(Protocol):
    def __call__(self, util: float) -> None:
        """Fold in the GPU utilisation (%) of the attempt ``attempt`` last took."""


class Kernel:
    """The two calls, bound to one aggregator (see the module's docstring)."""

    __slots__ = ("attempt", "usage")

    def __init__(self, attempt: Attempt, usage: Usage) -> None:
        self.attempt = attempt
        self.usage = usage

    def record(self, rec: AcctRecord) -> None:
        """``attempt`` with a record's fields (its utilisation is the caller's to add)."""
        self.attempt(rec.job, rec.user, rec.account, rec.partition, rec.qos, rec.state,
                     rec.submit, rec.eligible, rec.start, rec.end, rec.elapsed, rec.gpus,
                     rec.mps, rec.shards, rec.nodes, rec.component, rec.restarts)


def kernel_for(agg: Aggregator) -> Kernel:
    """The kernel that folds attempts into ``agg``'s figures."""
    since, until, bucket_s = agg.since, agg.until, agg.bucket_s
    # a whole number of seconds (3600): a bucket a run covers from edge to edge gets exactly
    # rate * bucket_s, what min/max compute there (k*b and (k+1)*b are exact integers)
    whole_s = bucket_s if type(bucket_s) is int and bucket_s > 0 else 0
    digest = agg.digest
    job_class = digest.job_class
    classes, runs, series, preempted = agg.class_stats, agg.runs, agg.points, agg.preempted
    spread_of = agg.spread
    multi, restarted, people = agg.multi, agg.restarted, agg.people
    inefficient = agg.inefficient
    ladder_lost = agg.ladder_lost
    ladder_requeued = digest.ladder.requeued_at  # empty: no attempt asks
    seen = agg.seen
    seen_add, bits = seen.add, seen.bits
    in_bits = min(MAX_BIT_ID, len(bits) << 3)  # plain ids below this are a bit of ``bits``
    long_s = agg.long_s
    bucket = LogHistogram.bucket
    #: (QOS, partition, account) -> what it decides (see find)
    combos: Dict[Tuple[str, str, str], Spot] = {}
    points: Dict[str, Points] = {}  # class or "pool:" name -> bucket -> point
    wait_buckets: Dict[float, int] = {}
    # the attempt whose utilisation may follow (last_gpus 0: nothing to fold)
    last_gpus = last_gh = 0.0
    last_job = last_user = last_cls = ""
    last_cs = ClassStats()
    last_who: Optional[Who] = None  # its (user, account)'s figures
    # the earliest start and latest end this kernel has seen (the aggregator's may be wider:
    # a merged part's)
    first_seen = agg.first_time if agg.first_time is not None else math.inf
    last_seen = agg.last_time if agg.last_time is not None else -math.inf

    def find(job: str, qos: str, partition: str, account: str, nodes: str) -> Spot:
        """What a job's fields decide: its class and the class's figures, its pool and the
        pool's, their series points; cached where only the triple decides (no journal
        class, a QOS, a partition that names its pool)."""
        journal = job_class.get(job) if job_class else None
        cls = agg.class_for(job, qos, partition, account)
        cs = classes.get(cls)
        if cs is None:
            cs = classes[cls] = ClassStats()
        pool, mps_per_gpu, shards_per_gpu = agg.pool_for(partition, nodes)
        row = runs.get((cls, pool))
        if row is None:
            row = runs[(cls, pool)] = [0, 0.0]
        spot: Spot = (cls, cs, points.setdefault(cls, {}), agg.slo_wait.get(cls),
                cls in agg.long_classes, pool, mps_per_gpu, shards_per_gpu, row,
                spread_of.setdefault((cls, pool), {}))
        if (journal is None and qos not in ("", "Unknown") and len(combos) < CACHE
                and agg.partition_pool(partition)):
            combos[(qos, partition, account)] = spot
        return spot

    def point(b: int, name: str) -> Point:
        """The series point [GPU-h, wait sum, waits, wait max] of (bucket, class or pool)."""
        got = series.get((b, name))
        if got is None:
            got = series[(b, name)] = [0.0, 0.0, 0.0, 0.0]
        cache = points.setdefault(name, {})
        if len(cache) < CACHE * 10:
            cache[b] = got
        return got

    def spread_long(spread: Spread, b0: float, b1: float, clo: float, chi: float,
                    gh: float) -> None:
        """Spread ``gh`` of the run [clo, chi) over buckets b0..b1 (three or more) by time;
        min/max pick a bucket's edges where the run covers it whole."""
        rate = gh / (chi - clo)
        # a whole number of seconds: a covered bucket gets rate * bucket_s, (k+1)*b - k*b
        cut = (rate * ((b0 + 1) * bucket_s - clo) if whole_s  # clo >= b0*b
               else rate * (min(chi, (b0 + 1) * bucket_s) - max(clo, b0 * bucket_s)))
        k = b0
        while True:
            try:
                spread[k][0] += cut
            except KeyError:
                spread[k] = [cut]
            if k == b1:
                return
            k += 1
            cut = (rate * whole_s if whole_s and k != b1
                   else rate * (min(chi, (k + 1) * bucket_s) - max(clo, k * bucket_s)))

    def preemption(job: str, user: str, cls: str, cs: ClassStats, gpus: float,
                   lo: Optional[float], hi: float) -> float:
        """Count a preempted attempt; its lost GPU-hours since the last checkpoint (the run
        is [lo, hi); lo None: it never ran)."""
        cs.preemptions += 1
        entry = preempted.get(job)
        if entry is None:
            entry = preempted[job] = Preempted(cls, user)
        entry.preemptions += 1
        if lo is None:
            return 0.0
        lost, measured = lost_work(job, gpus, lo, hi)
        entry.lost_hours += lost
        if measured:
            cs.lost_gpu_hours += lost
        else:
            cs.lost_gpu_hours_estimated += lost
        return lost

    def lost_work(job: str, gpus: float, lo: float, hi: float) -> Tuple[float, bool]:
        """GPU-hours of the run [lo, hi) after its last checkpoint, clipped to the window,
        and whether a checkpoint measured it (else the whole run counts: an estimate)."""
        ckpt = digest.last_checkpoint(job, lo, hi)
        lost_lo = ckpt if ckpt is not None else lo
        if since is not None and lost_lo < since:
            lost_lo = since
        lost_hi = until if until is not None and hi > until else hi
        lost = gpus * max(0.0, lost_hi - lost_lo) / 3600.0
        return lost, ckpt is not None or job in digest.checkpointing_jobs

    def ladder_requeue(job: str, cls: str, pool: str, gpus: float, lo: Optional[float],
                       hi: float) -> None:
        """An attempt the monitor's ladder requeued: its work since the last checkpoint is
        what the ladder cost, counted apart from preemptions (it is not one)."""
        row = ladder_lost.get((cls, pool))
        if row is None:
            row = ladder_lost[(cls, pool)] = [0.0, 0.0, 0.0]
        row[0] += 1
        if lo is not None:
            lost, measured = lost_work(job, gpus, lo, hi)
            row[1 if measured else 2] += lost

    def attempt(job: str, user: str, account: str, partition: str, qos: str, state: str,
                submit: Optional[float], eligible: Optional[float], start: Optional[float],
                end: Optional[float], elapsed: float, gpus: float, mps: int, shards: int,
                nodes: str, component: int, restarts: int) -> None:
        nonlocal last_gpus, last_gh, last_job, last_user, last_cls, last_cs
        nonlocal last_who, in_bits, first_seen, last_seen
        lo: Optional[float] = None  # the run [lo, hi), where it ran (else hi means nothing)
        hi = 0.0
        if start is not None and nodes != "None assigned":
            lo = start
            hi = end if end is not None else start + elapsed
        earliest = lo if lo is not None else (eligible or submit)
        if ((since is not None and end is not None and end < since)
                or (until is not None and earliest is not None and earliest >= until)):
            agg.outside_window += 1
            last_gpus = 0.0
            return
        if lo is not None:  # the data's span: the aggregator's read only when it may move
            if lo < first_seen:
                first_seen = lo
                if agg.first_time is None or lo < agg.first_time:
                    agg.first_time = lo
            if hi > last_seen:
                last_seen = hi
                if agg.last_time is None or hi > agg.last_time:
                    agg.last_time = hi
        if job_class and job in job_class:  # the journal's class wins
            spot = find(job, qos, partition, account, nodes)
        else:
            try:
                spot = combos[(qos, partition, account)]
            except KeyError:
                spot = find(job, qos, partition, account, nodes)
        (cls, cs, cls_points, slo_limit, long_class, pool, mps_per_gpu, shards_per_gpu,
         run, spread) = spot
        # GPU equivalents and the hours of the run inside the window (sreport's clipping)
        if mps:
            gpus += mps / mps_per_gpu
        if shards:
            gpus += shards / shards_per_gpu
        gh = 0.0
        if lo is not None and gpus:
            if (since is None or lo >= since) and (until is None or hi <= until):
                clo, chi, seconds = lo, hi, elapsed  # the whole run is inside the window
            else:
                clo = since if since is not None and lo < since else lo
                chi = until if until is not None and hi > until else hi
                seconds = min(elapsed, chi - clo)
            if seconds > 0:
                gh = gpus * seconds / 3600.0
                # bucket numbers as floats (exact): a float equal to an int finds its key.
                # One sum per (class, pool, bucket): Aggregator.settle adds it to both series
                b0 = clo // bucket_s
                b1 = chi // bucket_s  # the bucket of the run's last instant: not an end on
                if b1 > b0 and b1 * bucket_s >= chi:  # an edge (chi - 1e-9 is chi at 1.7e9)
                    b1 -= 1
                if b0 == b1:
                    try:
                        spread[b0][0] += gh
                    except KeyError:
                        spread[b0] = [gh]
                elif b1 == b0 + 1:  # a run across one bucket boundary
                    cut = gh * ((b0 + 1) * bucket_s - clo) / (chi - clo)
                    try:
                        spread[b0][0] += cut
                    except KeyError:
                        spread[b0] = [cut]
                    cut = gh - cut
                    try:
                        spread[b1][0] += cut
                    except KeyError:
                        spread[b1] = [cut]
                else:
                    spread_long(spread, b0, b1, clo, chi, gh)
        run[1] += gh  # the class's and the pool's GPU-hours are sums of these
        last_gpus = gpus
        last_gh = gh
        last_job = job
        last_user = user
        last_cls = cls
        last_cs = cs
        if component:  # another component of a het job: same job, same attempt
            last_who = None
            return
        run[0] += 1  # attempts, as GPU-hours
        # JobSet.add, inline for a plain id inside the bitmap (see JobSet.bits)
        n = int(job) if job.isdecimal() else in_bits
        if n < in_bits:
            byte = bits[n >> 3]
            mask = _MASKS[n & 7]
            if byte & mask:
                new_job = False
            else:
                bits[n >> 3] = byte | mask
                seen.count += 1
                new_job = True
        else:
            new_job = seen_add(job)
            in_bits = min(MAX_BIT_ID, len(bits) << 3)
        if new_job:
            cs.jobs += 1
        else:
            multi[job] = multi.get(job, 1) + 1
        if restarts > 0:
            restarted[job] = max(restarts, restarted.get(job, 0))
        # one record per (user, account): the users' and accounts' figures are its sums
        try:
            who = people[(user, account)]
        except KeyError:
            who = people[(user, account)] = Who()
        last_who = who
        if new_job:
            who.jobs += 1
        who.gpu_hours += gh
        if lo is not None and (since is None or lo >= since):  # started in the window
            cs.started += 1
            waited_from = eligible if eligible is not None else submit
            if waited_from is not None:
                wait = lo - waited_from if lo > waited_from else 0.0
                hist = cs.wait  # LogHistogram.add, inline
                try:  # sacct's whole seconds: few distinct waits
                    b = wait_buckets[wait]
                except KeyError:
                    b = int(wait) if 0 < wait < EXACT else bucket(wait)
                    if len(wait_buckets) < CACHE:
                        wait_buckets[wait] = b
                counts = hist.counts
                try:
                    counts[b] += 1
                except KeyError:
                    counts[b] = 1
                hist.total += wait
                if wait > hist.max:
                    hist.max = wait
                if slo_limit is not None and wait <= slo_limit:
                    cs.wait_slo_met += 1
                at_b = lo // bucket_s
                try:
                    wp = cls_points[at_b]
                except KeyError:
                    wp = point(int(at_b), cls)
                wp[1] += wait
                wp[2] += 1
                if wait > wp[3]:
                    wp[3] = wait
        if elapsed > long_s and long_class:
            cs.long_jobs += 1
            if len(cs.long_job_ids) < MAX_IDS:
                cs.long_job_ids.append(job)
        if state == "PREEMPTED" and not (
                start is not None and digest.confirmed_unpreempted(job, start)):
            # (24.05+ names an attempt that ended by itself PREEMPTED: see digest.py)
            lost = preemption(job, user, cls, cs, gpus, lo, hi)
            who.preemptions += 1
            who.lost_gpu_hours += lost
        elif state == "REQUEUED" and start is not None and end is not None:
            # only REQUEUED attempts look further: other rows pay nothing for the ladder
            if ladder_requeued and digest.ladder_requeued_within(job, start, end):
                ladder_requeue(job, cls, pool, gpus, lo, hi)
            elif digest.preempted_within(job, start, end):
                cs.preemptions_user_reported += 1

    def usage(util: float) -> None:
        nonlocal last_gpus
        gpus = last_gpus
        if not gpus:
            return
        last_gpus = 0.0  # folded once
        gh, cs = last_gh, last_cs
        cs.util_gpu_hours += gh
        # GPU efficiency 0..1 from Slurm's gres/gpuutil, where a value above 100 is a sum
        # over the job's GPUs (NaN reads as 1: nothing wasted)
        eff = (util / gpus if util > 100 and gpus > 1 else util) / 100.0
        if not eff <= 1.0:
            eff = 1.0
        elif eff < 0.0:
            eff = 0.0
        wasted = gh * (1.0 - eff)
        # the item is built only when it may go in (item > top needs wasted >= top's)
        if wasted > 0 and (len(inefficient) < TOP or wasted >= inefficient[0][0]):
            offer_waste(inefficient, (wasted, last_job, last_user, round(util, 1), gh, last_cls))
        if util <= 0:
            cs.idle_gpu_hours += gh
            if gh and last_who is not None:  # a het component's are its class's only
                last_who.idle_gpu_hours += gh

    return Kernel(attempt, usage)
