"""The per-job ledger: findings about jobs from a window of recent jobs, memory bounded.

The reference keeps every job's facts for the whole input (what the audit did before the
ledger); on input in sacct's order (a job's attempts together) the ledger's tallies must
equal it exactly, however small the window, while it holds at most two windows of jobs.
"""

from __future__ import annotations

import random
from typing import Dict, List, Tuple

from slurmiso.audit.figures.aggregate import Aggregator
from slurmiso.audit.figures.findings import input_findings, job_findings
from slurmiso.audit.figures.jobledger import SHOW, JobFacts, JobMark, Rules, Tally, natural
from slurmiso.audit.read.digest import JournalDigest
from slurmiso.audit.read.sacct import AcctRecord, ParseStats
from tests.unit.test_audit_analyze import CFG, rec


def in_sacct_order(seed: int, jobs: int) -> List[AcctRecord]:
    """Jobs of random classes, each with its attempts together (sacct's order: the latest
    first), some preempted, some requeued, some with Restarts but no earlier attempt."""
    rnd = random.Random(seed)
    out: List[AcctRecord] = []
    for n in range(1000, 1000 + jobs):
        job = f"{n}_{rnd.randrange(4)}" if rnd.random() < 0.2 else str(n)
        qos = rnd.choice(["train", "train", "infer"])
        attempts = rnd.choice([1, 1, 1, 2, 3])
        lost = 1 if rnd.random() < 0.1 else 0  # an earlier attempt not in the input
        for k in reversed(range(attempts)):
            state = "PREEMPTED" if rnd.random() < 0.4 else rnd.choice(["COMPLETED", "REQUEUED"])
            out.append(rec(job, state, qos=qos, part=qos, start=100.0 + k * 4000,
                           restarts=k + lost))
    return out


def reference(agg: Aggregator, records: List[AcctRecord]) -> Dict[JobMark, Tuple[int, List[str]]]:
    """Every job's facts kept to the end, then judged by the same rules."""
    facts: Dict[str, JobFacts] = {}
    for r in records:
        f = facts.get(r.job)
        if f is None:
            f = facts[r.job] = JobFacts(0)
        f.attempts += 1
        f.restarts = max(f.restarts, r.restarts)
        if r.state == "PREEMPTED":
            if not f.preemptions:
                f.cls = agg.class_of(r)
            f.preemptions += 1
    rules = agg.ledger.rules
    assert rules is not None
    marked: Dict[JobMark, List[str]] = {mark: [] for mark in JobMark}
    for job, f in facts.items():
        for mark in rules.marks(job, f):
            marked[mark].append(job)
    return {mark: (len(jobs), sorted(jobs, key=natural)[:SHOW]) for mark, jobs in marked.items()}


def fold(records: List[AcctRecord], window: int, digest: JournalDigest,
         one_by_one: bool = False) -> Aggregator:
    """Folded by batches (the window swaps at a batch's end), or one record at a time."""
    agg = Aggregator(CFG, digest)
    agg.ledger.window = window
    if one_by_one:
        for r in records:
            agg.add(r)
    else:
        agg.add_all(records)
    return agg


def test_in_sacct_order_the_ledger_equals_keeping_every_job() -> None:
    digest = JournalDigest()
    digest.records = 1  # the journal rules apply
    digest.checkpointing_jobs.update(str(n) for n in range(1000, 1600, 3))
    for seed in range(6):
        records = in_sacct_order(seed, 3000)
        for window, one_by_one in ((1, True), (7, True), (64, False), (5000, False)):
            agg = fold(records, window, digest, one_by_one)
            got = {mark: (t.count, t.ids) for mark, t in agg.job_tallies().items()}
            want = reference(agg, records)
            assert got == want, (seed, window)
            assert got[JobMark.NOT_REQUEUED][0] > 10 and got[JobMark.MISSING][0] > 10
            assert got[JobMark.REPEATED][0] and got[JobMark.NO_CHECKPOINT][0]
            assert got[JobMark.LATE][0] == 0


def test_what_the_ledger_holds_is_bounded_by_its_window() -> None:
    records = in_sacct_order(1, 20_000)
    agg = Aggregator(CFG)
    agg.ledger.window = 100
    held = []
    for at in range(0, len(records), 1024):
        agg.add_all(records[at:at + 1024])
        held.append(len(agg.ledger.young) + len(agg.ledger.old))
    assert max(held) <= 2 * 100 + 1024  # two generations, one swapped at a batch's end
    assert agg.job_tallies()[JobMark.NOT_REQUEUED].count > 1000  # ... of many more jobs


def test_attempts_listed_apart_are_counted_late_and_named() -> None:
    first = [rec("77", "PREEMPTED")]
    others = [rec(str(n)) for n in range(100, 400)]
    agg = fold(first + others + [rec("77", "COMPLETED", start=9000.0)], 50, JournalDigest(),
               one_by_one=True)
    tallies = agg.job_tallies()
    assert (tallies[JobMark.LATE].count, tallies[JobMark.LATE].ids) == (1, ["77"])
    assert agg.classes["train"].jobs == 301  # the job count stays exact: 77 once
    codes = {f.code: f for f in input_findings(ParseStats(), [], agg, agg.digest)}
    assert codes["sacct-attempts-apart"].subjects == ("77",)
    # within the window, the same attempts are one job's: requeued, so no finding
    agg = fold(first + others[:10] + [rec("77", "COMPLETED", start=9000.0)], 50,
               JournalDigest(), one_by_one=True)
    assert not agg.job_tallies()[JobMark.LATE].count
    assert "training-not-requeued" not in {f.code for f in job_findings(CFG, agg, agg.digest)}


def test_a_tally_keeps_the_first_ids_in_natural_order_and_counts_all() -> None:
    tally = Tally()
    jobs = [str(n) for n in range(1000, 0, -1)] + ["12_3", "x", "7+1"]
    random.Random(3).shuffle(jobs)
    for job in jobs:
        tally.add(job)
    assert tally.count == len(jobs)
    assert tally.ids == sorted(set(jobs), key=natural)[:SHOW]
    other = Tally()
    other.add("0")
    tally.merge(other)
    assert tally.count == len(jobs) + 1 and tally.ids[0] == "0" and len(tally.ids) == SHOW


def test_a_part_pickled_carries_its_tallies_every_job_settled() -> None:
    import pickle

    agg = fold([rec("5", "PREEMPTED")], 4096, JournalDigest())
    back = pickle.loads(pickle.dumps(agg))
    assert back.ledger.tallies[JobMark.NOT_REQUEUED].ids == ["5"]
    assert not back.ledger.young and not back.ledger.old and back.ledger.rules is None
    assert isinstance(Rules(frozenset(), 1, None), Rules)
