"""GPU-hours over time: the kernel's one sum per (class, pool, bucket), settled into series.

The kernel adds a run's hours to ``Aggregator.spread`` once per bucket (not to the class's
point and the pool's); :meth:`Aggregator.settle` moves them into the points. These check
the arithmetic per bucket against hand-made figures, and that reading the series at any
time neither loses nor counts twice.
"""

from __future__ import annotations

from typing import Dict

import pytest

from slurmiso.audit.figures.aggregate import Aggregator
from slurmiso.audit.read.sacct import AcctRecord
from slurmiso.config import load_config
from tests.audit_helpers import CONFIG

H = 3600
T0 = 1_714_521_600  # 2024-05-01T00:00:00Z, a bucket edge
CFG = load_config(CONFIG)


def run(agg: Aggregator, job: str, start: float, end: float, gpus: float = 1.0,
        partition: str = "train", qos: str = "train") -> None:
    agg.add(AcctRecord(job, "", "alice", "research", partition, qos, "COMPLETED", start, start,
                       start, end, end - start, None, gpus, 0, 0, "gpu033"))


def gpu_hours(agg: Aggregator, name: str) -> Dict[int, float]:
    """bucket (hours since T0) -> GPU-hours of one class or "pool:" name."""
    return {b - T0 // H: p[0] for (b, n), p in agg.series.items() if n == name and p[0]}


@pytest.mark.parametrize("bucket_s", [H, 1800.5])
def test_runs_over_one_two_and_many_buckets_land_where_they_ran(bucket_s: float) -> None:
    agg = Aggregator(CFG, bucket_s=bucket_s)  # type: ignore[arg-type]
    run(agg, "1", T0 + 600, T0 + 1200, gpus=2)  # 1/6 h in one bucket
    run(agg, "2", T0 + 3000, T0 + 4200, gpus=1)  # across one edge
    run(agg, "3", T0 + 1800, T0 + 5 * H + 1800)  # five hours over six buckets
    want: Dict[int, float] = {}
    for lo, hi, g in ((T0 + 600, T0 + 1200, 2), (T0 + 3000, T0 + 4200, 1),
                      (T0 + 1800, T0 + 5 * H + 1800, 1)):
        b = lo // bucket_s
        while b * bucket_s < hi:  # the part of [lo, hi) in each bucket, by hand
            part = min(hi, (b + 1) * bucket_s) - max(lo, b * bucket_s)
            want[int(b)] = want.get(int(b), 0.0) + g * part / H
            b += 1
    for name in ("train", "pool:bulk"):
        got = {b: p[0] for (b, n), p in agg.series.items() if n == name}
        assert got.keys() == want.keys()
        for b, hours in want.items():
            assert got[b] == pytest.approx(hours, rel=1e-12), (name, b)
    assert sum(want.values()) == pytest.approx(2 / 6 + 1200 / H + 5)
    assert agg.classes["train"].gpu_hours == pytest.approx(sum(want.values()))


def test_reading_the_series_mid_fold_neither_loses_nor_doubles() -> None:
    whole, read_between = Aggregator(CFG), Aggregator(CFG)
    runs = [("1", T0, T0 + 2 * H + 60), ("2", T0 + 1800, T0 + 3600), ("3", T0 + 100, T0 + 200)]
    for job, lo, hi in runs:
        run(whole, job, lo, hi)
        run(read_between, job, lo, hi)
        assert read_between.series  # settles what is spread so far
        read_between.settle()  # again: nothing left to add
    assert not any(read_between.spread.values())
    assert read_between.series == pytest.approx(whole.series)
    assert gpu_hours(whole, "train") == pytest.approx({0: 1 + 0.5 + 100 / H, 1: 1.0,
                                                       2: 60 / H})


def test_a_class_on_two_pools_gets_the_sum_and_each_pool_its_own() -> None:
    agg = Aggregator(CFG)
    run(agg, "1", T0, T0 + H, gpus=4, partition="train")  # class train, pool bulk
    run(agg, "2", T0 + 1800, T0 + 2 * H, gpus=2, partition="elastic")  # pool elastic
    pools = ("pool:bulk", "pool:elastic")
    assert gpu_hours(agg, "pool:bulk") == pytest.approx({0: 4.0})
    assert gpu_hours(agg, "pool:elastic") == pytest.approx({0: 1.0, 1: 2.0})
    by_class: Dict[int, float] = {}
    for (b, name), p in agg.series.items():
        if not name.startswith("pool:"):
            by_class[b - T0 // H] = by_class.get(b - T0 // H, 0.0) + p[0]
    assert by_class == pytest.approx({0: 5.0, 1: 2.0})
    assert sum(sum(gpu_hours(agg, p).values()) for p in pools) == pytest.approx(7.0)


def test_a_merged_part_brings_its_spread_hours() -> None:
    first, second, serial = Aggregator(CFG), Aggregator(CFG), Aggregator(CFG)
    run(first, "1", T0, T0 + 1800)
    run(second, "2", T0 + 900, T0 + H + 900)
    run(serial, "1", T0, T0 + 1800)
    run(serial, "2", T0 + 900, T0 + H + 900)
    first.merge(second)  # neither read its series before
    assert first.series == pytest.approx(serial.series)
    assert gpu_hours(first, "pool:bulk") == pytest.approx({0: 0.5 + 0.75, 1: 0.25})


@pytest.mark.parametrize("bucket_s", [H, 1800.5])
def test_a_run_ending_on_a_bucket_edge_makes_no_point_after_it(bucket_s: float) -> None:
    # chi - 1e-9 is chi itself at epoch magnitudes (float spacing there is 2.4e-7 s): the
    # old rule made a 0.0 point in the next bucket, a false drop to zero on the chart
    agg = Aggregator(CFG, bucket_s=bucket_s)  # type: ignore[arg-type]
    edge = (T0 // bucket_s + 3) * bucket_s
    run(agg, "1", edge - 2 * bucket_s, edge)  # two whole buckets, ends on the third's edge
    run(agg, "2", edge - 100, edge, partition="elastic")  # inside one, ends on the edge
    buckets = sorted({b for (b, _) in agg.series})
    assert buckets == [int(edge // bucket_s) - 2, int(edge // bucket_s) - 1]
    assert all(p[0] > 0 for p in agg.series.values())
    assert sum(p[0] for (_, n), p in agg.series.items() if n.startswith("pool:")) == \
        pytest.approx((2 * bucket_s + 100) / H)


def test_users_and_accounts_are_the_sums_of_their_user_account_records() -> None:
    agg = Aggregator(CFG)
    for job, user, account, hours in (("1", "ann", "a", 1), ("2", "ann", "b", 2),
                                      ("3", "bob", "a", 4), ("1", "ann", "a", 8)):
        agg.add(AcctRecord(job, "", user, account, "train", "train", "COMPLETED", T0, T0, T0,
                           T0 + hours * H, hours * H, None, 1.0, 0, 0, "gpu033"))
    assert list(agg.people) == [("ann", "a"), ("ann", "b"), ("bob", "a")]
    users, accounts = agg.users, agg.accounts
    assert list(users) == ["ann", "bob"] and list(accounts) == ["a", "b"]  # first seen first
    assert (users["ann"].gpu_hours, users["ann"].jobs) == (11.0, 2)  # job 1 twice: one job
    assert (users["bob"].gpu_hours, users["bob"].jobs) == (4.0, 1)
    assert (accounts["a"].gpu_hours, accounts["a"].jobs) == (13.0, 2)
    assert (accounts["b"].gpu_hours, accounts["b"].jobs) == (2.0, 1)


def test_classes_and_pools_are_the_sums_of_their_class_pool_runs() -> None:
    agg = Aggregator(CFG)
    run(agg, "1", T0, T0 + H, gpus=4, partition="train")  # train on bulk
    run(agg, "2", T0, T0 + 2 * H, gpus=1, partition="elastic")  # train on elastic
    run(agg, "3", T0, T0 + H, gpus=2, partition="train", qos="debug")  # debug on bulk
    classes, pools = agg.classes, agg.pools
    assert (classes["train"].attempts, classes["train"].gpu_hours) == (2, 6.0)
    assert (classes["debug"].attempts, classes["debug"].gpu_hours) == (1, 2.0)
    assert (classes["infer"].attempts, classes["infer"].gpu_hours) == (0, 0.0)  # config's
    assert pools == {"bulk": [2, 6.0], "elastic": [1, 2.0]}
    assert list(pools) == ["bulk", "elastic"]  # first seen first
    pools["bulk"][0] = 99  # a reader's copy: the figures stay
    assert agg.pools["bulk"] == [2, 6.0] and agg.classes["train"].attempts == 2
