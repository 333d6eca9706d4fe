"""``sacct -P`` folded straight into an :class:`~slurmiso.audit.analyze.Aggregator`.

The record path (:func:`~slurmiso.audit.sacct.parse_parsable` yields a
:class:`~slurmiso.audit.sacct.JobRecord`, :meth:`Aggregator.add` folds it) costs about four
times a plain ``csv`` pass over the same file. This loop does the same work with no record,
no generator and no method call per row for the common case: a job row whose timestamps
hit a per-minute cache, whose TRES, state and class are cached per distinct string, followed
by its steps. Anything else (het components, ``Unknown`` times, a torn or bad row, a header
that lacks a column) goes through the record path's own code for that row, so a bad row gets
the same message and every figure the same value. ``tests/unit/test_audit_fold.py`` checks
that on randomised dumps against the record path.

The job's aggregation waits for its steps (their ``gres/gpuutil`` is the job's), exactly as
the record path holds a record back: the order of every float sum is the same.
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING, Dict, Iterable, List, Optional, Tuple

from slurmiso.audit.quantiles import EXACT, LogHistogram
from slurmiso.audit.sacct import (
    NO_TIME,
    SLACK_S,
    AuditInputError,
    JobRecord,
    ParseStats,
    _number,
    _read_header,
    _record_maker,
    _repair,
    gpu_usage,
    het_offset,
    parse_time,
    parse_tres,
    problem,
)

if TYPE_CHECKING:
    from slurmiso.audit.analyze import Aggregator

_CACHE = 10_000  # entries per string cache (hostile input cannot grow them without bound)
_MINUTES = 200_000  # a year and a half of distinct minutes


def util_of(text: str) -> Optional[float]:
    """``gpu_usage(text)[0]`` without splitting the string: the last ``gres/gpuutil=`` item."""
    i = text.rfind("gres/gpuutil=")
    if i < 0:
        return None
    if i and text[i - 1] != ",":  # inside another item: let the full parser decide
        return gpu_usage(text)[0]
    j = text.find(",", i)
    return _number(text[i + 13 :] if j < 0 else text[i + 13 : j])


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


def _slow_time(text: str, minutes: Dict[str, float]) -> Optional[float]:
    """A time the minute cache missed; learns its minute. Raises ValueError when bad (the
    caller then lets the record path name the problem)."""
    if text in NO_TIME:
        return None
    value = parse_time(text)
    if value is None:
        raise ValueError(text)
    if len(text) == 19 and len(minutes) < _MINUTES:
        minutes[text[:16]] = value - int(text[17:19])
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
    from slurmiso.audit.analyze import ClassStats, Who

    stats.format = stats.format or "parsable"
    it = iter(lines)
    number, header, idx, first = _header(it, stats)
    if first is not None:
        number -= 1
        it = itertools.chain((first,), it)
    ncol = len(header)
    make = _record_maker(idx, ncol)

    def at(name: str) -> int:  # a column the header lacks reads the "" appended to each row
        return idx.get(name, ncol)

    i_job, i_state = idx["JobID"], idx["State"]
    i_user, i_acct, i_part, i_qos = at("User"), at("Account"), at("Partition"), at("QOS")
    i_submit, i_elig, i_start, i_end = at("Submit"), at("Eligible"), at("Start"), at("End")
    i_elapsed, i_tres, i_nodes = at("ElapsedRaw"), at("AllocTRES"), at("NodeList")
    i_limit = at("TimelimitRaw")
    i_ave, i_tot, i_restarts = at("TRESUsageInAve"), at("TRESUsageInTot"), at("Restarts")

    minutes: Dict[str, float] = {}
    minute = minutes.get
    tres_cache: Dict[str, Tuple[float, int, int, bool]] = {}
    states: Dict[str, str] = {}
    named_pool: Dict[str, Tuple[str, float, float]] = {}  # partitions that name a pool
    pool_keys: Dict[str, str] = {}

    # the aggregator's state, bound once (all mutable containers; scalars stay on agg)
    since, until, bucket_s = agg.since, agg.until, agg.bucket_s
    digest = agg.digest
    job_class = digest.job_class
    class_cache = agg._class_cache
    classes, pools, series, multi = agg.classes, agg.pools, agg.series, agg.multi
    restarted, preempted, users, accounts = agg.restarted, agg.preempted, agg.users, agg.accounts
    seen_add = agg.seen.add
    slo_wait, long_classes, long_s = agg._slo_wait, agg._long_classes, agg._long_s
    bucket = LogHistogram.bucket

    records = steps = 0
    pkey: Optional[str] = None  # the job held back for its steps; None: none
    prec: Optional[JobRecord] = None  # ... as a record, when it took the record path
    pj = pu = pa = ppart = pq = pst = pn = ""
    psub = pel = pstart = pend = putil = None  # type: Optional[float]
    pelap = pg = 0.0
    pm = psh = prest = 0
    try:
        for line in it:
            number += 1
            parts = line.rstrip("\r\n").split("|")
            if len(parts) != ncol or line[-1:] != "\n":
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
            parts.append("")
            job_id = parts[i_job]

            if "." in job_id:  # a step: its GPU usage is its job's
                key = job_id[: job_id.find(".")]
                if "+" in key:
                    key = key.split("+", 1)[0]
                if key == pkey:
                    ave, tot = parts[i_ave], parts[i_tot]
                    if "gres/gpu" in ave or "gres/gpu" in tot:
                        util = util_of(ave) if "gres/gpu" in ave else None
                        if util is None and "gres/gpu" in tot:
                            util = util_of(tot)
                        if util is not None and (putil is None or util > putil):
                            putil = util
                    steps += 1
                else:
                    stats.orphan_steps += 1
                continue

            # a job row: first fold the job held back (all its steps have been seen)
            if pkey is not None:
                records += 1
                if prec is not None:
                    agg.add(prec._replace(gpu_util=putil))
                else:  # == Aggregator.add, inline
                    ran = pstart is not None and pn != "None assigned"
                    if ran:
                        lo: Optional[float] = pstart
                        hi: Optional[float] = pend if pend is not None else pstart + pelap  # type: ignore[operator]
                    else:
                        lo = hi = None
                    earliest = lo if lo is not None else (pel or psub)
                    if ((since is not None and pend is not None and pend < since)
                            or (until is not None and earliest is not None
                                and earliest >= until)):
                        agg.outside_window += 1
                    else:
                        if lo is not None:
                            if agg.first_time is None or lo < agg.first_time:
                                agg.first_time = lo
                            if agg.last_time is None or hi > agg.last_time:  # type: ignore[operator]
                                agg.last_time = hi
                        cls = job_class.get(pj) if job_class else None
                        if cls is None:
                            cls = class_cache.get((pq, ppart, pa))
                            if cls is None or (pq in ("", "Unknown") and pj in preempted):
                                cls = agg.class_for(pj, pq, ppart, pa)
                        cs = classes.get(cls)
                        if cs is None:
                            cs = classes[cls] = ClassStats()
                        hit = named_pool.get(ppart)
                        if hit is None:
                            hit = agg._pool(ppart, pn)
                            if len(named_pool) < _CACHE and agg._partition_pool(ppart):
                                named_pool[ppart] = hit
                        pool, mps_per_gpu, shards_per_gpu = hit
                        gpus = pg
                        if pm:
                            gpus += pm / mps_per_gpu
                        if psh:
                            gpus += psh / shards_per_gpu
                        gh = 0.0
                        if lo is not None and gpus:
                            clo = since if since is not None and lo < since else lo
                            chi = until if until is not None and hi > until else hi  # type: ignore[operator]
                            seconds = (pelap if (clo == lo and chi == hi)
                                       else min(pelap, chi - clo))  # type: ignore[operator]
                            if seconds > 0:
                                gh = gpus * seconds / 3600.0
                                b0 = int(clo // bucket_s)
                                b1 = int((chi - 1e-9) // bucket_s) if chi > clo else b0  # type: ignore[operator]
                                if b0 == b1:
                                    pk = pool_keys.get(pool)
                                    if pk is None:
                                        pk = pool_keys[pool] = "pool:" + pool
                                    point = series.get((b0, cls))
                                    if point is None:
                                        point = series[(b0, cls)] = [0.0, 0.0, 0.0, 0.0]
                                    point[0] += gh
                                    point = series.get((b0, pk))
                                    if point is None:
                                        point = series[(b0, pk)] = [0.0, 0.0, 0.0, 0.0]
                                    point[0] += gh
                                else:
                                    agg._spread(clo, chi, gh, cls, pool)  # type: ignore[arg-type]
                        cs.gpu_hours += gh
                        p = pools.get(pool)
                        if p is None:
                            p = pools[pool] = [0, 0.0]
                        p[1] += gh
                        p[0] += 1
                        cs.attempts += 1
                        if seen_add(pj):
                            cs.jobs += 1
                            new_job = True
                        else:
                            multi[pj] = multi.get(pj, 1) + 1
                            new_job = False
                        if prest > 0:
                            restarted[pj] = max(prest, restarted.get(pj, 0))
                        who_u = users.get(pu)
                        if who_u is None:
                            who_u = users[pu] = Who()
                        who_a = accounts.get(pa)
                        if who_a is None:
                            who_a = accounts[pa] = Who()
                        if new_job:
                            who_u.jobs += 1
                            who_a.jobs += 1
                        who_u.gpu_hours += gh
                        who_a.gpu_hours += gh
                        if ran and (since is None or pstart >= since):  # type: ignore[operator]
                            cs.started += 1
                            waited_from = pel if pel is not None else psub
                            if waited_from is not None:
                                wait = pstart - waited_from if pstart > waited_from else 0.0  # type: ignore
                                hist = cs.wait  # LogHistogram.add, inline
                                b = int(wait) if 0 < wait < EXACT else bucket(wait)
                                counts = hist.counts
                                counts[b] = counts.get(b, 0) + 1
                                hist.n += 1
                                hist.total += wait
                                if wait > hist.max:
                                    hist.max = wait
                                limit = slo_wait.get(cls)
                                if limit is not None and wait <= limit:
                                    cs.wait_slo_met += 1
                                wkey = (int(pstart // bucket_s), cls)  # type: ignore[operator]
                                point = series.get(wkey)
                                if point is None:
                                    point = series[wkey] = [0.0, 0.0, 0.0, 0.0]
                                point[1] += wait
                                point[2] += 1
                                if wait > point[3]:
                                    point[3] = wait
                        if putil is not None and gpus:
                            idle = agg._usage(putil, pj, pu, cs, gpus, gh, cls)
                            if idle:
                                who_u.idle_gpu_hours += idle
                                who_a.idle_gpu_hours += idle
                        if pelap > long_s and cls in long_classes:
                            cs.long_jobs += 1
                            if len(cs.long_job_ids) < 50:
                                cs.long_job_ids.append(pj)
                        if pst == "PREEMPTED":
                            lost = agg._preemption(pj, pu, cls, cs, gpus, lo, hi)
                            who_u.preemptions += 1
                            who_u.lost_gpu_hours += lost
                            who_a.preemptions += 1
                            who_a.lost_gpu_hours += lost
                        elif (pst == "REQUEUED" and pstart is not None and pend is not None
                              and digest.preempted_within(pj, pstart, pend)):
                            cs.preemptions_user_reported += 1
                pkey = prec = None

            # ... then read this one
            rec: Optional[JobRecord] = None
            why: Optional[str] = None
            if "+" not in job_id:
                try:
                    text = parts[i_start]
                    base = minute(text[:16])
                    start = (base + int(text[17:19]) if base is not None and len(text) == 19
                             else _slow_time(text, minutes))
                    text = parts[i_end]
                    base = minute(text[:16])
                    end = (base + int(text[17:19]) if base is not None and len(text) == 19
                           else _slow_time(text, minutes))
                    text = parts[i_submit]
                    base = minute(text[:16])
                    submit = (base + int(text[17:19]) if base is not None and len(text) == 19
                              else _slow_time(text, minutes))
                    if parts[i_elig] == text:
                        eligible = submit
                    else:
                        text = parts[i_elig]
                        base = minute(text[:16])
                        eligible = (base + int(text[17:19])
                                    if base is not None and len(text) == 19
                                    else _slow_time(text, minutes))
                    raw = parts[i_elapsed]
                    elapsed = (float(int(raw)) if raw else end - start
                               if start is not None and end is not None else 0.0)
                    text = parts[i_tres]
                    tres = tres_cache.get(text)
                    if tres is None:
                        g, m, s = parse_tres(text)
                        tres = (g, m, s, g < 0 or m < 0 or s < 0)
                        if len(tres_cache) < _CACHE:
                            tres_cache[text] = tres
                    text = parts[i_state]
                    state = states.get(text)
                    if state is None:
                        state = text.split(" ", 1)[0].upper() if text else "UNKNOWN"
                        if len(states) < _CACHE:
                            states[text] = state
                    if not parts[i_limit].isascii():
                        raise ValueError("the record path decides what int() makes of it")
                    text = parts[i_restarts]
                    restarts = int(text) if text.isdigit() else 0
                    nodes = parts[i_nodes]
                    waited = eligible if eligible is not None else submit
                    if (elapsed < 0 or tres[3]
                            or (start is not None and end is not None
                                and (end < start or elapsed > end - start + SLACK_S))
                            or (start is not None and waited is not None
                                and nodes != "None assigned" and start < waited - SLACK_S)):
                        raise ValueError("let the record path name the problem")
                except ValueError:
                    pass
                else:
                    pkey, pj = job_id, job_id
                    pu, pa, ppart, pq = parts[i_user], parts[i_acct], parts[i_part], parts[i_qos]
                    pst, psub, pel, pstart, pend, pelap = (
                        state, submit, eligible, start, end, elapsed)
                    pg, pm, psh, pn, prest = tres[0], tres[1], tres[2], nodes, restarts
                    ave, tot = parts[i_ave], parts[i_tot]
                    putil = row_util(ave, tot) if ave or tot else None
                    continue
            # the record path's own code for this row
            key = job_id.split("+", 1)[0] if "+" in job_id else job_id
            try:
                rec = make(parts, key)
                if "+" in job_id:
                    rec = rec._replace(component=het_offset(job_id))
                why = problem(rec)
            except (ValueError, IndexError) as exc:
                why = str(exc)
            if why is not None:
                stats.bad_line(f"line {number} (job {job_id})", why)
                continue
            assert rec is not None
            pkey, prec, putil = key, rec, rec.gpu_util
        if pkey is not None:  # the last job
            records += 1
            agg.add(prec._replace(gpu_util=putil) if prec is not None else JobRecord(
                pj, "", pu, pa, ppart, pq, pst, psub, pel, pstart, pend, pelap, None, pg,
                pm, psh, pn, putil, 0, 0, prest, None))
    finally:
        stats.records += records
        stats.steps += steps
        stats.lines = number
