"""``sacct -P`` folded straight into an :class:`~slurmiso.audit.figures.aggregate.Aggregator`.

The record path (:func:`~slurmiso.audit.read.sacct.parse_parsable` yields a
:class:`~slurmiso.audit.read.sacct.AcctRecord`, :meth:`Aggregator.add` folds it) costs about four
times a plain ``csv`` pass over the same file. This loop does the same work with no record,
no generator and no method call per row for the common case: a job row, split only as far
as the last column read, whose timestamps hit a per-hour cache, whose TRES, state and class
are cached per distinct string (read by subscript: a miss is the rare KeyError), followed by
its steps. Anything else (het components, a torn or bad row, a header that lacks a column)
goes through the record path's own code for that row, so a bad row gets the same message
and every figure the same value. ``tests/unit/test_audit_fold.py`` checks that on randomised
dumps against the record path.

A job row is folded in as it is read, but for its GPU utilisation: that is the max over its
steps' ``gres/gpuutil``, so that part waits for the next job row (the record path holds the
whole record back; each figure still receives its values in the same order, so every float
sum is the same). Where the record path did something per row that the report does not
depend on (the order of a histogram's buckets), the fold may differ; nothing else.
"""

from __future__ import annotations

import itertools
from heapq import heappush, heapreplace
from typing import Any, Dict, Iterable, List, Optional, Tuple

from slurmiso.audit.figures.aggregate import _MAX_IDS, _TOP, Aggregator, ClassStats, Who, efficiency
from slurmiso.audit.figures.jobset import MAX_BIT_ID
from slurmiso.audit.figures.quantiles import EXACT, LogHistogram
from slurmiso.audit.read.sacct import (
    NO_TIME,
    SLACK_S,
    AuditInputError,
    AcctRecord,
    ParseStats,
    _number,
    _read_header,
    _record_maker,
    _repair,
    checked_record,
    gpu_usage,
    parse_time,
    parse_tres,
)

_CACHE = 10_000  # entries per string cache (hostile input cannot grow them without bound)
_HOURS = 100_000  # eleven years of distinct hours
#: ``:MM:SS`` -> seconds into the hour, for a timestamp whose hour (``text[:13]``) is cached:
#: ``parse_time`` is the hour's base plus these, so the sum is the same float. Anything else
#: (a torn or odd stamp) takes the record path, which decides what it means.
_MASKS = (1, 2, 4, 8, 16, 32, 64, 128)  # 1 << (n & 7)
_TWO = [f"{n:02d}" for n in range(60)]
_MMSS = {":" + m + ":" + s: i * 60 + j for i, m in enumerate(_TWO) for j, s in enumerate(_TWO)}


def row_util(ave: str, tot: str) -> Optional[float]:
    """A job row's own GPU utilisation, as the record path reads it (Ave, else Tot)."""
    util = mem = None
    usage = ave or tot
    if usage and "gres/gpu" in usage:
        util, mem = gpu_usage(usage)
        if util is None and mem is None and tot:
            util, mem = gpu_usage(tot)
    elif not ave and tot and "gres/gpu" in tot:
        util, mem = gpu_usage(tot)
    return util


def _slow_time(text: str, hours: Dict[str, float]) -> Optional[float]:
    """A time the hour cache missed; learns its hour. Raises ValueError when bad (the
    caller then lets the record path name the problem)."""
    if text in NO_TIME:
        return None
    value = parse_time(text)
    if value is None:
        raise ValueError(text)
    if len(text) == 19 and len(hours) < _HOURS:
        into = _MMSS.get(text[13:])
        if into is not None:
            hours[text[:13]] = value - into  # exact: whole seconds well below 2**53
    return value


def _header(it: Iterable[str], stats: ParseStats) -> Tuple[int, List[str], Dict[str, int],
                                                          Optional[str]]:
    """(lines read, header, column index, a first line that is data: ``sacct -n``)."""
    number = 0
    for line in it:
        number += 1
        text = line.rstrip("\r\n")
        if not text or text.isspace():
            continue
        bom = text.startswith("\ufeff")
        parts = text.split("|")
        if bom:  # a BOM from an editor or Windows tool
            parts[0] = parts[0][1:]
        header, idx = _read_header(parts, stats)
        return number, header, idx, (None if "JobID" in parts else line[1:] if bom else line)
    stats.lines = number
    raise AuditInputError(f"{stats.source or 'sacct output'}: empty, no header line found")


def fold_parsable(lines: Iterable[str], stats: ParseStats, agg: Aggregator) -> None:
    """Fold ``sacct -P`` output (header first) into ``agg``: what
    ``agg.add_all(parse_parsable(lines, stats))`` does, with the same ``stats``."""
    stats.format = stats.format or "parsable"
    it = iter(lines)
    number, header, idx, first = _header(it, stats)
    if first is not None:
        number -= 1
        it = itertools.chain((first,), it)
    ncol = len(header)
    make = _record_maker(idx, ncol)

    def at(name: str) -> int:  # a column the header lacks reads the "" appended to the row
        return idx.get(name, ncol)

    i_job, i_state = idx["JobID"], idx["State"]
    i_user, i_acct, i_part, i_qos = at("User"), at("Account"), at("Partition"), at("QOS")
    i_submit, i_elig, i_start, i_end = at("Submit"), at("Eligible"), at("Start"), at("End")
    i_elapsed, i_tres, i_nodes = at("ElapsedRaw"), at("AllocTRES"), at("NodeList")
    i_ave, i_tot, i_restarts = at("TRESUsageInAve"), at("TRESUsageInTot"), at("Restarts")
    i_limit = at("TimelimitRaw")
    read = (i_job, i_state, i_user, i_acct, i_part, i_qos, i_submit, i_elig, i_start, i_end,
            i_elapsed, i_tres, i_nodes, i_ave, i_tot, i_restarts, i_limit)
    pad = ncol in read
    strip = ncol - 1 in read
    # split a row only as far as the last column read (the rest stays one string whose "|"
    # are counted): 14 fewer strings a row for the 32-field dump; not when a column is
    # missing (its "" is appended after the row) or the last column is read
    upto = max(read) + 1 if not pad and max(read) < ncol - 2 else 0
    rest_bars = ncol - 1 - upto

    hours: Dict[str, float] = {}
    mmss = _MMSS
    tres_cache: Dict[str, Tuple[float, int, int, bool]] = {}
    states: Dict[str, str] = {}
    place = _Places(agg)
    combos = place.combos
    wait_buckets: Dict[float, int] = {}

    # the aggregator's state, bound once (its containers; first/last time kept here)
    since, until, bucket_s = agg.since, agg.until, agg.bucket_s
    # a whole number of seconds (3600): a bucket a run covers from edge to edge gets exactly
    # rate * bucket_s, what min/max compute there (k*b and (k+1)*b are exact integers)
    whole_s = bucket_s if type(bucket_s) is int and bucket_s > 0 else 0
    digest = agg.digest
    job_class = digest.job_class
    multi, restarted = agg.multi, agg.restarted
    users, accounts = agg.users, agg.accounts
    seen = agg.seen
    seen_add, bits = seen.add, seen._bits
    in_bits = min(MAX_BIT_ID, len(bits) << 3)  # ids below this are a bit of ``bits``
    long_s = agg._long_s
    bucket = LogHistogram.bucket
    first_time, last_time = agg.first_time, agg.last_time
    inefficient = agg.inefficient  # a heap, changed in place by Aggregator.add too

    start: Optional[float]
    end: Optional[float]
    submit: Optional[float]
    eligible: Optional[float]
    records = steps = new_ids = 0
    pkey: Optional[str] = None  # the job whose steps may follow; None: none
    prec: Optional[AcctRecord] = None  # ... as a record, when it took the record path
    putil: Optional[float] = None  # ... its GPU utilisation (the max over its steps)
    # ... and what folding that in needs (pgpus 0: nothing to fold)
    pgpus = pgh = 0.0
    pcls = ""
    pcs = ClassStats()
    puser = ""
    pwho_u = pwho_a = Who()
    first_number = number + 1
    try:
        for number, line in enumerate(it, first_number):
            # the line end stays on the last field unless the fast path reads that field
            if upto:
                parts = line.split("|", upto)
                if (len(parts) != upto + 1 or parts[upto].count("|") != rest_bars
                        or line[-1:] != "\n"):  # odd: the whole row, read as below
                    parts = line.split("|")
                    regular = False
                else:
                    regular = True
            else:
                parts = line.rstrip("\r\n").split("|") if strip else line.split("|")
                regular = len(parts) == ncol and line[-1:] == "\n"
            if not regular:
                parts[-1] = parts[-1].rstrip("\r\n")
                if len(parts) == 1 and (not parts[0] or parts[0].isspace()):
                    continue  # a blank line
                if len(parts) != ncol:
                    repaired = _repair(parts, ncol, idx)
                    if repaired is None:
                        if line[-1:] != "\n":
                            stats.truncated = True
                            stats.bad_line(f"line {number}", "truncated (output ends mid-line)")
                        else:
                            stats.bad_line(f"line {number}", f"{len(parts)} fields, want {ncol}")
                        continue
                    parts = repaired
                if line[-1:] != "\n":  # sacct ends every line; a last line without one was cut
                    stats.truncated = True
            if pad:
                parts.append("")
            job_id = parts[i_job]

            if "." in job_id:  # a step: its GPU usage is its job's
                key = job_id[: job_id.find(".")]
                if "+" in key:
                    key = key.split("+", 1)[0]
                if key == pkey:
                    # gpu_usage(Ave)[0], else gpu_usage(Tot)[0]: the last item that starts
                    # with gres/gpuutil= (one inside another item: gpu_usage decides)
                    util = None
                    for text in (parts[i_ave], parts[i_tot]):
                        i = text.rfind("gres/gpuutil=")
                        if i >= 0:
                            if i and text[i - 1] != ",":
                                util = gpu_usage(text)[0]
                            else:
                                j = text.find(",", i)
                                value = text[i + 13 :] if j < 0 else text[i + 13 : j]
                                util = (float(value) if value.isdigit() and value.isascii()
                                        else _number(value))
                            if util is not None:
                                break
                    if util is not None and (putil is None or util > putil):
                        putil = util
                    steps += 1
                else:
                    stats.orphan_steps += 1
                continue

            # a job row. First what waited for the steps of the job before it: all of a job
            # taken on the record path, else the part that needs its steps' GPU utilisation
            if pkey is not None:
                records += 1
                if prec is not None:
                    agg.first_time, agg.last_time = first_time, last_time
                    agg.add(prec._replace(gpu_util=putil))
                    first_time, last_time = agg.first_time, agg.last_time
                    prec = None
                elif putil is not None and pgpus:  # Aggregator._usage, inline
                    pcs.util_gpu_hours += pgh
                    wasted = pgh * (1.0 - efficiency(putil, pgpus))
                    # the heap's item is built only when it may go in (item > top needs
                    # wasted >= top's)
                    if wasted > 0 and (len(inefficient) < _TOP or wasted >= inefficient[0][0]):
                        item = (wasted, pkey, puser, round(putil, 1), pgh, pcls)
                        if len(inefficient) < _TOP:
                            heappush(inefficient, item)
                        elif item > inefficient[0]:
                            heapreplace(inefficient, item)
                    if putil <= 0:
                        pcs.idle_gpu_hours += pgh
                        if pgh:
                            pwho_u.idle_gpu_hours += pgh
                            pwho_a.idle_gpu_hours += pgh
                pkey = None

            # ... then this one: read, checked, and folded in but for its utilisation
            rec: Optional[AcctRecord] = None
            why: Optional[str] = None
            if "+" not in job_id:
                try:  # a KeyError or ValueError: the record path reads the row instead
                    text = parts[i_start]
                    try:
                        start = hours[text[:13]] + mmss[text[13:]]
                    except KeyError:
                        start = _slow_time(text, hours)
                    text = parts[i_end]
                    try:
                        end = hours[text[:13]] + mmss[text[13:]]
                    except KeyError:
                        end = _slow_time(text, hours)
                    text = parts[i_submit]
                    try:
                        submit = hours[text[:13]] + mmss[text[13:]]
                    except KeyError:
                        submit = _slow_time(text, hours)
                    if parts[i_elig] == text:
                        eligible = submit
                    else:
                        text = parts[i_elig]
                        try:
                            eligible = hours[text[:13]] + mmss[text[13:]]
                        except KeyError:
                            eligible = _slow_time(text, hours)
                    raw = parts[i_elapsed]
                    elapsed = (float(int(raw)) if raw else end - start
                               if start is not None and end is not None else 0.0)
                    text = parts[i_tres]
                    try:
                        tres = tres_cache[text]
                    except KeyError:
                        g, m, s = parse_tres(text)
                        tres = (g, m, s, g < 0 or m < 0 or s < 0)
                        if len(tres_cache) < _CACHE:
                            tres_cache[text] = tres
                    if not parts[i_limit].isascii():
                        raise ValueError("what int() makes of it")
                    text = parts[i_restarts]
                    restarts = 0 if text == "0" else int(text) if text.isdigit() else 0
                    waited_from = eligible if eligible is not None else submit
                    ran = start is not None and parts[i_nodes] != "None assigned"
                    if (elapsed < 0 or tres[3]
                            or (start is not None and end is not None
                                and (end < start or elapsed > end - start + SLACK_S))
                            or (ran and waited_from is not None
                                and start < waited_from - SLACK_S)):  # type: ignore[operator]
                        raise ValueError("a problem the record path names")
                except (ValueError, KeyError):
                    pass
                else:  # == Aggregator.add, inline (see there for what each step means)
                    pkey = job_id
                    ave, tot = parts[i_ave], parts[i_tot]
                    putil = row_util(ave, tot) if ave or tot else None
                    pgpus = 0.0  # no usage to fold unless it is inside the window
                    if ran:
                        lo: Optional[float] = start
                        hi: Optional[float] = end if end is not None else start + elapsed  # type: ignore[operator]
                    else:
                        lo = hi = None
                    earliest = lo if lo is not None else (eligible or submit)
                    if ((since is not None and end is not None and end < since)
                            or (until is not None and earliest is not None
                                and earliest >= until)):
                        agg.outside_window += 1
                        continue
                    if lo is not None:
                        if first_time is None or lo < first_time:
                            first_time = lo
                        if last_time is None or hi > last_time:  # type: ignore[operator]
                            last_time = hi
                    qos, partition, account = parts[i_qos], parts[i_part], parts[i_acct]
                    if job_class and job_id in job_class:  # the journal's class wins
                        spot = place.find(job_id, qos, partition, account, parts[i_nodes])
                    else:
                        try:
                            spot = combos[(qos, partition, account)]
                        except KeyError:
                            spot = place.find(job_id, qos, partition, account, parts[i_nodes])
                    (cls, cs, cls_points, slo_limit, long_class, pool, mps_per_gpu,
                     shards_per_gpu, pool_row, pairs) = spot
                    gpus = tres[0]
                    if tres[1]:
                        gpus += tres[1] / mps_per_gpu
                    if tres[2]:
                        gpus += tres[2] / shards_per_gpu
                    gh = 0.0
                    if lo is not None and gpus:
                        clo = since if since is not None and lo < since else lo
                        chi = until if until is not None and hi > until else hi  # type: ignore[operator]
                        seconds = (elapsed if (clo == lo and chi == hi)
                                   else min(elapsed, chi - clo))  # type: ignore[operator]
                        if seconds > 0:
                            gh = gpus * seconds / 3600.0
                            # bucket numbers as floats: a float equal to an int finds its key
                            b0 = clo // bucket_s
                            b1 = (chi - 1e-9) // bucket_s if chi > clo else b0  # type: ignore[operator]
                            if b0 == b1:
                                try:
                                    cp, pp = pairs[b0]
                                except KeyError:
                                    cp, pp = place.pair(pairs, int(b0), cls, pool)
                                cp[0] += gh
                                pp[0] += gh
                            elif b1 == b0 + 1:  # Aggregator._spread's two-bucket case
                                cut = gh * ((b0 + 1) * bucket_s - clo) / (chi - clo)  # type: ignore[operator]
                                try:
                                    cp, pp = pairs[b0]
                                except KeyError:
                                    cp, pp = place.pair(pairs, int(b0), cls, pool)
                                cp[0] += cut
                                pp[0] += cut
                                cut = gh - cut
                                try:
                                    cp, pp = pairs[b1]
                                except KeyError:
                                    cp, pp = place.pair(pairs, int(b1), cls, pool)
                                cp[0] += cut
                                pp[0] += cut
                            else:  # ... and its general case, the same arithmetic
                                rate = gh / (chi - clo)  # type: ignore[operator]
                                k0, last = int(b0), int(b1)
                                if whole_s:  # inside buckets: min/max pick the bucket's edges
                                    cut = rate * ((k0 + 1) * bucket_s - clo)  # clo >= k*b
                                    try:
                                        cp, pp = pairs[k0]
                                    except KeyError:
                                        cp, pp = place.pair(pairs, k0, cls, pool)
                                    cp[0] += cut
                                    pp[0] += cut
                                    cut = rate * whole_s  # (k+1)*b - k*b, exactly
                                    for k in range(k0 + 1, last):
                                        try:
                                            cp, pp = pairs[k]
                                        except KeyError:
                                            cp, pp = place.pair(pairs, k, cls, pool)
                                        cp[0] += cut
                                        pp[0] += cut
                                    k0 = last
                                for k in range(k0, last + 1):
                                    cut = rate * (min(chi, (k + 1) * bucket_s)  # type: ignore[operator,type-var]
                                                  - max(clo, k * bucket_s))
                                    try:
                                        cp, pp = pairs[k]
                                    except KeyError:
                                        cp, pp = place.pair(pairs, k, cls, pool)
                                    cp[0] += cut
                                    pp[0] += cut
                    cs.gpu_hours += gh
                    pool_row[1] += gh
                    pool_row[0] += 1
                    cs.attempts += 1
                    # JobSet.add, inline for a plain id within the bitmap
                    n = int(job_id) if job_id.isdigit() else in_bits
                    if n < in_bits:
                        byte = bits[n >> 3]
                        mask = _MASKS[n & 7]
                        if byte & mask:
                            new_job = False
                        else:
                            bits[n >> 3] = byte | mask
                            new_ids += 1
                            new_job = True
                    else:
                        new_job = seen_add(job_id)
                        in_bits = min(MAX_BIT_ID, len(bits) << 3)
                    if new_job:
                        cs.jobs += 1
                    else:
                        multi[job_id] = multi.get(job_id, 1) + 1
                    if restarts > 0:
                        restarted[job_id] = max(restarts, restarted.get(job_id, 0))
                    user = parts[i_user]
                    try:
                        who_u = users[user]
                    except KeyError:
                        who_u = users[user] = Who()
                    try:
                        who_a = accounts[account]
                    except KeyError:
                        who_a = accounts[account] = Who()
                    if new_job:
                        who_u.jobs += 1
                        who_a.jobs += 1
                    who_u.gpu_hours += gh
                    who_a.gpu_hours += gh
                    if ran and (since is None or start >= since):  # type: ignore[operator]
                        cs.started += 1
                        if waited_from is not None:
                            wait = start - waited_from if start > waited_from else 0.0  # type: ignore
                            hist = cs.wait  # LogHistogram.add, inline
                            if 0 < wait < EXACT:
                                b = int(wait)
                            else:
                                b = wait_buckets.get(wait)  # type: ignore[assignment]
                                if b is None:
                                    b = bucket(wait)
                                    if len(wait_buckets) < _CACHE:
                                        wait_buckets[wait] = b
                            counts = hist.counts
                            try:
                                counts[b] += 1
                            except KeyError:
                                counts[b] = 1
                            hist.n += 1
                            hist.total += wait
                            if wait > hist.max:
                                hist.max = wait
                            if slo_limit is not None and wait <= slo_limit:
                                cs.wait_slo_met += 1
                            at_b = start // bucket_s  # type: ignore[operator]
                            try:
                                point = cls_points[at_b]
                            except KeyError:
                                point = place.point(int(at_b), cls)
                            point[1] += wait
                            point[2] += 1
                            if wait > point[3]:
                                point[3] = wait
                    if elapsed > long_s and long_class:
                        cs.long_jobs += 1
                        if len(cs.long_job_ids) < _MAX_IDS:
                            cs.long_job_ids.append(job_id)
                    text = parts[i_state]
                    try:
                        state = states[text]
                    except KeyError:
                        state = text.split(" ", 1)[0].upper() if text else "UNKNOWN"
                        if len(states) < _CACHE:
                            states[text] = state
                    if state == "PREEMPTED" and not (
                            start is not None and digest.confirmed_unpreempted(job_id, start)):
                        # (24.05+ names an attempt that ended by itself PREEMPTED: digest.py)
                        lost = agg._preemption(job_id, user, cls, cs, gpus, lo, hi)
                        who_u.preemptions += 1
                        who_u.lost_gpu_hours += lost
                        who_a.preemptions += 1
                        who_a.lost_gpu_hours += lost
                    elif (state == "REQUEUED" and start is not None and end is not None
                          and digest.preempted_within(job_id, start, end)):
                        cs.preemptions_user_reported += 1
                    pgpus = gpus
                    pgh = gh
                    pcls = cls
                    pcs = cs
                    puser = user
                    pwho_u = who_u
                    pwho_a = who_a
                    continue
            # the record path's own code for this row
            if upto and len(parts) == upto + 1:  # a regular row split only so far
                parts[upto:] = parts[upto].split("|")
            parts[ncol - 1] = parts[ncol - 1].rstrip("\r\n")
            if not pad:
                parts.append("")
            key, rec, why = checked_record(make, parts, job_id)
            if why is not None:
                stats.bad_line(f"line {number} (job {job_id})", why)
                continue
            assert rec is not None
            pkey, prec, putil = key, rec, rec.gpu_util
        if pkey is not None:  # the last job
            records += 1
            if prec is not None:
                agg.first_time, agg.last_time = first_time, last_time
                agg.add(prec._replace(gpu_util=putil))
                first_time, last_time = agg.first_time, agg.last_time
            elif putil is not None and pgpus:
                idle = agg._usage(putil, pkey, puser, pcs, pgpus, pgh, pcls)
                if idle:
                    pwho_u.idle_gpu_hours += idle
                    pwho_a.idle_gpu_hours += idle
    finally:
        agg.first_time, agg.last_time = first_time, last_time
        seen.count += new_ids
        stats.records += records
        stats.steps += steps
        stats.lines = number


class _Places:
    """What a job's (QOS, partition, account) decides, looked up once per distinct triple:
    its class and the class's figures, its pool and the pool's, and the time-series points
    of both (cached per bucket; the points themselves live in ``Aggregator.series``)."""

    def __init__(self, agg: Aggregator) -> None:
        self.agg = agg
        self.combos: Dict[Tuple[str, str, str], Tuple[Any, ...]] = {}
        self.points: Dict[str, Dict[int, List[float]]] = {}
        self.pairs: Dict[Tuple[str, str], Dict[int, Tuple[List[float], List[float]]]] = {}

    def find(self, job: str, qos: str, partition: str, account: str, nodes: str
             ) -> Tuple[Any, ...]:
        """The entry for a job; cached where only the triple decides it (no journal class,
        a QOS, a partition that names its pool)."""
        agg = self.agg
        journal = agg.digest.job_class.get(job) if agg.digest.job_class else None
        cls = journal
        if cls is None:
            cls = agg._class_cache.get((qos, partition, account))
            if cls is None or (qos in ("", "Unknown") and job in agg.preempted):
                cls = agg.class_for(job, qos, partition, account)
        cs = agg.classes.get(cls)
        if cs is None:
            cs = agg.classes[cls] = ClassStats()
        pool, mps_per_gpu, shards_per_gpu = agg._pool(partition, nodes)
        row = agg.pools.get(pool)
        if row is None:
            row = agg.pools[pool] = [0, 0.0]
        spot = (cls, cs, self.points.setdefault(cls, {}), agg._slo_wait.get(cls),
                cls in agg._long_classes, pool, mps_per_gpu, shards_per_gpu, row,
                self.pairs.setdefault((cls, pool), {}))
        if (journal is None and qos not in ("", "Unknown") and len(self.combos) < _CACHE
                and agg._partition_pool(partition)):
            self.combos[(qos, partition, account)] = spot
        return spot

    def pair(self, pairs: Dict[int, Tuple[List[float], List[float]]], b: int, cls: str,
             pool: str) -> Tuple[List[float], List[float]]:
        """The points of (bucket, class) and (bucket, pool), made in that order when new."""
        pair = (self.point(b, cls), self.point(b, "pool:" + pool))
        if len(pairs) < _CACHE * 10:
            pairs[b] = pair
        return pair

    def point(self, b: int, name: str) -> List[float]:
        """The series point of (bucket, class or ``pool:`` name), made when new."""
        series = self.agg.series
        point = series.get((b, name))
        if point is None:
            point = series[(b, name)] = [0.0, 0.0, 0.0, 0.0]
        cache = self.points.setdefault(name, {})
        if len(cache) < _CACHE * 10:
            cache[b] = point
        return point
