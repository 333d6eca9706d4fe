"""Histogram quantiles (Prometheus histogram_quantile) and counter increases over a window,
against values computed by hand (issue 24)."""

from __future__ import annotations

import math

import pytest

from slurmiso.exposition.histogram import Window, increase, quantile

INF = math.inf
#: 100 observations: 10 up to 0.1 s, 40 more up to 0.5 s, 40 more up to 1 s, 10 above 1 s.
B = [(0.1, 10.0), (0.5, 50.0), (1.0, 90.0), (INF, 100.0)]


@pytest.mark.parametrize("q, expected", [
    (0.05, 0.05),   # rank 5 in the first bucket, which starts at 0: 0.1 * 5/10
    (0.25, 0.25),   # rank 25: 0.1 + 0.4 * 15/40
    (0.5, 0.5),     # rank 50: the top of the second bucket
    (0.7, 0.75),    # rank 70: 0.5 + 0.5 * 20/40
    (0.9, 1.0),     # rank 90: the top of the third bucket
    (0.95, 1.0),    # rank 95 falls in +Inf: the highest finite bound
    (0.99, 1.0),
    (0.0, 0.0),
])
def test_quantile_interpolates_inside_the_bucket_as_prometheus(q: float, expected: float) -> None:
    assert quantile(q, B) == pytest.approx(expected)


def test_quantile_has_no_answer_without_data_or_an_inf_bucket() -> None:
    assert quantile(0.5, []) is None
    assert quantile(0.5, [(INF, 10.0)]) is None  # one bucket
    assert quantile(0.5, [(0.1, 1.0), (1.0, 2.0)]) is None  # no +Inf bucket
    assert quantile(0.5, [(0.1, 0.0), (INF, 0.0)]) is None  # no observations
    assert quantile(1.5, B) is None and quantile(-0.1, B) is None and quantile(math.nan, B) is None


def test_quantile_repairs_counts_that_go_down_and_ignores_nan() -> None:
    """A garbage answer (bucket counts not cumulative) is forced monotonic, never a crash."""
    bad = [(0.5, 5.0), (0.1, 10.0), (1.0, 20.0), (INF, 20.0), (math.nan, 3.0), (2.0, math.inf)]
    # sorted and fixed: 0.1:10, 0.5:10, 1.0:20, +Inf:20; rank 10 lands in the first bucket
    assert quantile(0.5, bad) == pytest.approx(0.1)
    assert quantile(0.75, bad) == pytest.approx(0.75)  # 0.5 + 0.5 * 5/10


def test_quantile_of_a_first_bucket_with_a_negative_bound() -> None:
    assert quantile(0.5, [(-1.0, 10.0), (INF, 10.0)]) == -1.0


def test_increase_counts_resets_as_prometheus_does() -> None:
    assert increase([10.0, 15.0, 20.0]) == 5.0 + 5.0
    assert increase([10.0, 15.0, 3.0, 7.0]) == 5.0 + 3.0 + 4.0  # restarted server: 3 since
    assert increase([10.0]) is None  # one reading: no window
    assert increase([None, None]) is None
    # a series created in the window (the first failure) counts from 0
    assert increase([None, 2.0, 5.0]) == 5.0
    # gone for a reading, back with more: the gap is skipped, not a reset
    assert increase([4.0, None, 6.0]) == 2.0
    assert increase([4.0, math.nan, -1.0, math.inf, 6.0]) == 2.0


def test_window_keeps_its_span_and_one_reading_before_it() -> None:
    w = Window(60.0, max_readings=100)
    for t in range(0, 200, 10):
        w.add(float(t), {"a": float(t)})
    assert w.readings[0][0] == 130.0 and w.readings[-1][0] == 190.0  # 190 - 60 = 130
    assert w.span == 60.0
    assert w.increases() == {"a": 60.0}


def test_window_restarts_when_the_clock_goes_back_and_is_bounded() -> None:
    w = Window(60.0, max_readings=3)
    for t in (0.0, 1.0, 2.0, 3.0, 4.0):
        w.add(t, {"a": t})
    assert len(w.readings) == 3
    w.add(1.0, {"a": 100.0})
    assert len(w.readings) == 1 and w.increases() is None and w.span == 0.0


def test_window_increases_per_key_with_a_reset_in_between() -> None:
    w = Window(60.0)
    w.add(0.0, {"b": 100.0, "c": 5.0})
    w.add(5.0, {"b": 120.0, "c": 6.0})
    w.add(10.0, {"b": 4.0})  # the server restarted; "c" is gone this time
    assert w.increases() == {"b": 20.0 + 4.0, "c": 1.0}
