"""The probe's figures against values worked out by hand, and its output contract."""

from __future__ import annotations

import pytest

from slurmiso.probe.contract import parse_output
from slurmiso.probe.stats import (
    InferSample,
    cdf_points,
    infer_figures,
    percentile,
    throughput_vs_solo,
    train_figures,
)

#: 1..100 ms shuffled: nearest rank P50 = 50th smallest = 50, P95 = 95, P99 = 99.
HUNDRED = [float((i * 37) % 100 + 1) for i in range(100)]


def test_nearest_rank_percentiles_by_hand() -> None:
    assert sorted(HUNDRED) == [float(i) for i in range(1, 101)]
    assert percentile(HUNDRED, 50) == 50.0
    assert percentile(HUNDRED, 95) == 95.0
    assert percentile(HUNDRED, 99) == 99.0
    assert percentile(HUNDRED, 100) == 100.0
    # 10 samples: P99 rank ceil(9.9) = 10 -> the largest; P50 rank 5; P95 rank ceil(9.5) = 10
    ten = [5.0, 1.0, 9.0, 3.0, 7.0, 2.0, 8.0, 4.0, 10.0, 6.0]
    assert (percentile(ten, 50), percentile(ten, 95), percentile(ten, 99)) == (5.0, 10.0, 10.0)
    # 3 samples: P50 rank ceil(1.5) = 2
    assert percentile([30.0, 10.0, 20.0], 50) == 20.0
    assert percentile([], 99) is None
    assert percentile([4.0], 0) == 4.0
    with pytest.raises(ValueError):
        percentile([1.0], 101)


def test_error_rate_counts_timeouts_and_failures() -> None:
    # 10 requests: 7 fine, 2 over the 100 ms timeout (one even claims ok), 1 failed w/o latency
    samples = [InferSample(float(ms)) for ms in (10, 20, 30, 40, 50, 60, 70)]
    samples += [InferSample(150.0, True), InferSample(300.0, False), InferSample(None, False)]
    f = infer_figures(samples, timeout_ms=100.0)
    assert f["requests"] == 10
    assert f["timeouts"] == 2 and f["errors"] == 3 and f["error_rate"] == 0.3
    # latencies kept: 10..70, 150, 300 (9 values): P50 rank 5 = 50, P95/P99 rank 9 = 300
    assert (f["p50_ms"], f["p95_ms"], f["p99_ms"]) == (50.0, 300.0, 300.0)
    assert f["max_ms"] == 300.0 and f["mean_ms"] == round(730 / 9, 3)  # (280 + 150 + 300) / 9


def test_a_failed_request_with_a_latency_under_the_timeout_is_one_error() -> None:
    f = infer_figures([InferSample(5.0, False), InferSample(5.0, True)], timeout_ms=100.0)
    assert f["errors"] == 1 and f["timeouts"] == 0 and f["error_rate"] == 0.5


def test_no_timeout_means_no_timeouts() -> None:
    f = infer_figures([InferSample(5000.0)], timeout_ms=None)
    assert f["errors"] == 0 and f["p99_ms"] == 5000.0


def test_train_figures_are_the_median_after_warmup() -> None:
    steps = [9.0, 0.2, 0.3, 0.25, 0.2, 0.4]  # the 9 s first step is warm-up
    f = train_figures(steps, warmup=1)
    assert f["steps"] == 6
    assert f["step_s"] == 0.25  # nearest-rank median of 0.2 0.2 0.25 0.3 0.4
    assert f["throughput_steps_s"] == 4.0
    assert throughput_vs_solo(0.5, 0.25) == 0.5
    assert throughput_vs_solo(None, 0.25) is None


def test_cdf_keeps_the_tail_and_ends_at_one() -> None:
    pts = cdf_points(HUNDRED * 10, most=50)
    assert pts[-1] == [100.0, 1.0]
    assert len(pts) <= 80 and all(a[1] < b[1] for a, b in zip(pts, pts[1:]))
    assert [p for p in pts if p[1] > 0.98]  # the top 2% whole


def test_contract_lines() -> None:
    text = "\n".join([
        "loading model...", "12.5", '{"latency_ms": 30, "ok": true}',
        '{"latency_ms": 40, "ok": false}', '{"ok": false, "error": "503"}',
        '{"gpu_mem_peak_mb": 2048}', '{"info": {"server": "triton"}}', "NaN", "-3", "",
        "[1, 2]"])
    p = parse_output(text, "infer")
    assert [(s.latency_ms, s.ok) for s in p.infer] == [
        (12.5, True), (30.0, True), (40.0, False), (None, False)]
    assert p.gpu_mem_peak_mb == 2048.0 and p.info == {"server": "triton"}
    assert p.ignored == 4 and p.ignored_samples[0] == "loading model..."
    t = parse_output('0.25\n{"step_s": 0.5}\n{"step_s": "x"}\nepoch 1\n', "train")
    assert t.steps == [0.25, 0.5] and t.ignored == 2
