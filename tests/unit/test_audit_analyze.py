"""Aggregations, quantiles, journal digest and findings: pure functions, table-driven."""

from __future__ import annotations

import random
from typing import Any, Dict, List, Optional

import pytest

from slurmiso.audit.figures.aggregate import Aggregator
from slurmiso.audit.figures.findings import at_or_above, job_findings
from slurmiso.audit.figures.quantiles import EXACT, RELATIVE_ERROR, LogHistogram
from slurmiso.audit.read.digest import JournalDigest
from slurmiso.audit.read.sacct import AcctRecord
from slurmiso.config import load_config
from tests.audit_helpers import CONFIG

CFG = load_config(CONFIG)


def rec(job: str, state: str = "COMPLETED", qos: str = "train", part: str = "train",
        start: Optional[float] = 100.0, run: float = 3600.0, gpus: float = 1.0, **kw: Any) -> AcctRecord:
    fields: Dict[str, Any] = dict(job=job, name="n", user="u", account="a", partition=part,
                                  qos=qos, state=state, submit=0.0, eligible=0.0, start=start,
                                  end=None if start is None else start + run,
                                  elapsed=0 if start is None else run, timelimit_s=None, gpus=gpus,
                                  mps=0, shards=0, nodes="gpu033")
    fields.update(kw)
    return AcctRecord(**fields)


def test_quantiles_exact_below_the_log_range():
    h = LogHistogram()
    for v in range(1, 101):
        h.add(v)
    assert (h.quantile(0.5), h.quantile(0.95), h.quantile(0.99), h.quantile(1.0)) == (
        50, 95, 99, 100)
    assert h.quantile(0.0) == 1 and LogHistogram().quantile(0.5) is None


def test_quantiles_within_the_stated_bound():
    rnd = random.Random(1)
    values = [rnd.lognormvariate(6, 2) for _ in range(50_000)]
    h = LogHistogram()
    for v in values:
        h.add(v)
    values.sort()
    for q in (0.5, 0.95, 0.99):
        exact = values[max(1, int(-(-q * len(values) // 1))) - 1]
        got = h.quantile(q)
        assert got is not None
        if exact >= EXACT:
            assert abs(got - exact) / exact <= RELATIVE_ERROR + 1e-9
        else:
            assert abs(got - exact) < 1.0
    assert len(h.counts) < 1000  # bounded whatever the number of values


def test_histogram_merge_and_count_le():
    a, b = LogHistogram(), LogHistogram()
    for v in (1, 2, 3):
        a.add(v)
    for v in (10, 500):
        b.add(v)
    a.merge(b)
    assert (a.n, a.count_le(10), a.max) == (5, 4, 500)


@pytest.mark.parametrize("qos, part, want", [
    ("infer", "train", "infer"), ("train", "infer", "train"), ("debug", "x", "debug"),
    ("normal", "elastic", "train"), ("", "", "train"),  # default_class
])
def test_class_from_qos_then_partition_then_default(qos, part, want):
    agg = Aggregator(CFG)
    agg.add(rec("1", qos=qos, part=part))
    assert [c for c, s in agg.classes.items() if s.attempts] == [want]


def _agg(records: List[AcctRecord], digest: JournalDigest = None) -> Aggregator:  # type: ignore[assignment]
    agg = Aggregator(CFG, digest)
    agg.add_all(records)
    return agg


@pytest.mark.parametrize("records, jobs, attempts, preemptions", [
    ([rec("1"), rec("2")], 2, 2, 0),
    ([rec("1", "PREEMPTED"), rec("1")], 1, 2, 1),
    ([rec("1", "PREEMPTED"), rec("2"), rec("1", "PREEMPTED"), rec("1", "PENDING", start=None)],
     2, 4, 2),
    ([rec("5_1"), rec("5_2"), rec("5_[3-4]", "PENDING", start=None)], 3, 3, 0),
    ([rec("9"), rec("9", component=1)], 1, 1, 0),  # het job: one job, one attempt
])
def test_jobs_attempts_requeues_preemptions(records, jobs, attempts, preemptions):
    s = _agg(records).classes["train"].to_dict()
    assert (s["jobs"], s["attempts"], s["requeues"], s["preemptions"]) == (
        jobs, attempts, attempts - jobs, preemptions)


def _digest(events: List[Dict[str, Any]]) -> JournalDigest:
    """A digest of ``events``, each tagged with the source its real writer gives it."""
    from slurmiso.audit.read.digest import WRITER

    d = JournalDigest()
    for e in events:
        writer = WRITER.get(e["event"])
        d.add({**e, "source": writer} if writer else e)
    return d


def _ts(seconds: float) -> str:
    import time

    return time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime(seconds))


@pytest.mark.parametrize("events, lost, estimated", [
    ([], 0.0, 8.0),  # no journal: the whole 1 h on 8 GPUs, estimated
    ([{"ts": _ts(1900), "event": "checkpoint-end", "job": "1", "ok": True, "duration_s": 5}],
     8 * 1800 / 3600, 0.0),  # last checkpoint 1800 s before the end
    ([{"ts": _ts(50), "event": "checkpoint-end", "job": "1", "ok": True}],
     8.0, 0.0),  # checkpoint before this attempt started: whole attempt lost, but measured
    ([{"ts": _ts(1900), "event": "checkpoint-end", "job": "1", "ok": False}], 8.0, 0.0),
])
def test_lost_gpu_hours(events, lost, estimated):
    agg = _agg([rec("1", "PREEMPTED", start=100, run=3600, gpus=8)], _digest(events))
    s = agg.classes["train"]
    assert s.lost_gpu_hours == pytest.approx(lost) and s.lost_gpu_hours_estimated == estimated


def test_gpu_equivalents_for_mps_and_shards():
    agg = _agg([rec("1", qos="infer", part="infer", gpus=0, mps=50, run=3600),
                rec("2", part="elastic", gpus=0, shards=7, run=3600)])
    assert agg.classes["infer"].gpu_hours == 0.5 and agg.classes["train"].gpu_hours == 1.0
    assert agg.pools["serve"][1] == 0.5 and agg.pools["elastic"][1] == 1.0


def test_wait_and_slo_attainment():
    agg = _agg([rec(str(i), qos="infer", part="infer", start=float(w))
                for i, w in enumerate([0, 10, 59, 60, 61, 3600])])
    s = agg.classes["infer"]
    assert (s.wait.quantile(0.5), s.wait_slo_met, s.wait.n) == (59, 4, 6)


@pytest.mark.parametrize("records, events, codes", [
    ([rec("1", "PREEMPTED")], [], {"training-not-requeued"}),
    ([rec("1", "PREEMPTED"), rec("1")], [], set()),
    ([rec("1", "PREEMPTED"), rec("1")], [{"ts": _ts(0), "event": "prolog", "job": "2"}],
     {"training-without-checkpoint"}),
    ([rec("1", "PREEMPTED")] * 3 + [rec("1")], [], set()),  # no journal: progress unknown
    ([rec("1", "PREEMPTED")] * 3 + [rec("1")], [{"ts": _ts(0), "event": "prolog", "job": "1"}],
     {"repeated-preemption", "training-without-checkpoint"}),
    ([rec("1", "PREEMPTED")] * 3 + [rec("1")],
     [{"ts": _ts(200), "event": "checkpoint-end", "job": "1", "ok": True}], set()),
    ([rec("1", qos="infer", part="infer", start=5, run=5 * 3600)], [], {"long-infer-jobs"}),
    ([rec("1", qos="infer", part="infer", start=5, run=3 * 3600)], [], set()),
    ([rec("1", qos="infer", part="infer", start=300)], [], {"wait-slo-missed"}),
    ([rec("1", gpu_util=0.0)], [], {"idle-allocated-gpus"}),
])
def test_job_findings(records, events, codes):
    digest = _digest(events)
    findings = job_findings(CFG, _agg(records, digest), digest)
    assert {f.code for f in findings} == codes


def test_severity_threshold():
    digest = JournalDigest()
    findings = job_findings(CFG, _agg([rec("1", gpu_util=0.0)], digest), digest)
    assert at_or_above(findings, "warning") == [] and len(at_or_above(findings, "info")) == 1


def test_digest_checkpoint_vs_grace_and_monitor():
    d = _digest([
        {"ts": _ts(0), "event": "prolog", "job": "1", "class": "train"},
        {"ts": _ts(10), "event": "checkpoint-start", "job": "1", "grace_s": 60},
        {"ts": _ts(80), "event": "checkpoint-end", "job": "1", "ok": True},  # no duration_s
        {"ts": _ts(90), "event": "monitor-action", "action": "hold", "reason": "GPU idle",
         "target": "7", "dry_run": True, "details": {"p99_latency_ms": 120}},
        {"ts": _ts(91), "event": "monitor-action", "action": "hold", "details": "odd"},
    ])
    ck = d.checkpoints["train"]
    assert (ck.ok, ck.over_grace, ck.grace_s, ck.durations.max) == (1, 1, 60, 70)
    assert d.monitor_actions == {"hold": 2} and d.monitor_dry_run == 1
    assert d.idle_jobs == {"7": "GPU idle"} and d.latency == [("", 120.0)]
    assert d.last_checkpoint("1", 0, 100) == pytest.approx(80) and d.made_progress("1")


def test_wrapper_requeued_attempt_with_a_preemption_signal_counts_as_preempted() -> None:
    """slurmiso run requeues a preempted job itself: sacct says REQUEUED, the journal says why."""
    from slurmiso.audit.read.digest import JournalDigest

    d = JournalDigest()
    d.add({"event": "preempt-signal", "job": "7", "cause": "preempted", "source": "job",
           "ts": "2026-01-01T00:00:10.400Z"})
    d.add({"event": "preempt-signal", "job": "7", "cause": "time-limit", "source": "job",
           "ts": "2026-01-01T00:05:00.000Z"})
    from slurmiso.state.journal import parse_ts

    t0 = parse_ts("2026-01-01T00:00:00.000Z").timestamp()
    assert d.preempted_within("7", t0, t0 + 10)  # End truncated to the second
    assert not d.preempted_within("7", t0 + 60, t0 + 400)  # the time-limit one is not
    assert not d.preempted_within("8", t0, t0 + 10)


def test_a_jobs_pool_does_not_hang_on_the_rows_before_it() -> None:
    """A partition that names no pool: the nodes decide, whatever an earlier job with an
    empty NodeList left in the cache (the parallel fold reads the rows in another order)."""
    first = rec("1", part="other", nodes="")
    second = rec("2", part="other", nodes="gpu001")
    for records in ([first, second], [second, first]):
        agg = _agg(records)
        assert agg.pools["serve"][0] == 1 and agg.pools["(none)"][0] == 1
