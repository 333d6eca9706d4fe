"""The SLO as a share of requests over the bound (issue 32 item 2): exact on an edge, bounded
inside a bucket, unknown where the bucket cannot tell; and the config's warnings."""

from __future__ import annotations

import math
from typing import Any

import pytest
import yaml

from slurmiso.config import parse_config
from slurmiso.monitor.slo_share import Verdict, judge, resolvable, share_over
from tests.unit.test_signals_check import EXAMPLE

INF = math.inf
#: 100 requests: 10 <= 0.1 s, 50 <= 0.3 s, 99 <= 0.5 s, all <= +Inf
HIST = [(0.1, 10.0), (0.3, 50.0), (0.5, 99.0), (INF, 100.0)]


def test_share_is_exact_on_an_edge_and_bounded_inside_a_bucket() -> None:
    s = share_over(HIST, 0.5)
    assert s is not None and s.exact and s.low == pytest.approx(0.01)
    s = share_over(HIST, 0.25)  # inside (0.1, 0.3]: between 50 % and 90 % are over it
    assert s is not None and (s.below, s.above) == (0.1, 0.3)
    assert (s.low, s.high) == pytest.approx((0.5, 0.9))
    s = share_over(HIST, 0.5000000001)  # 500 ms written as seconds with rounding: an edge
    assert s is not None and s.exact
    s = share_over(HIST, 2.0)  # beyond the last finite edge: between 0 and 1 %
    assert s is not None and (s.low, s.high, s.above) == pytest.approx((0.0, 0.01, INF))


def test_no_answer_without_requests_or_an_inf_bucket() -> None:
    assert share_over([(0.1, 0.0), (INF, 0.0)], 0.25) is None
    assert share_over([(0.1, 3.0), (0.5, 5.0)], 0.25) is None
    assert share_over(HIST, 0.0) is None


@pytest.mark.parametrize("buckets,bound,verdict", [
    ([(0.3, 400.0), (INF, 400.0)], 0.25, Verdict.UNKNOWN),  # vLLM e2e: all in (0, 300 ms]
    ([(0.3, 390.0), (0.5, 400.0), (INF, 400.0)], 0.25, Verdict.HOT),  # 2.5 % surely over
    ([(0.25, 400.0), (INF, 400.0)], 0.25, Verdict.CALM),
    ([(0.1, 100.0), (0.25, 398.0), (0.5, 400.0), (INF, 400.0)], 0.25, Verdict.CALM),
    # 3 % in (225 ms, 250 ms]: calm bound inside (100, 250], so 1 % less 10 % over 250 ms
    ([(0.1, 300.0), (0.25, 397.0), (0.5, 400.0), (INF, 400.0)], 0.25, Verdict.CALM),
    ([(0.1, 300.0), (0.25, 396.0), (0.5, 400.0), (INF, 400.0)], 0.25, Verdict.BETWEEN),
    ([(0.1, 300.0), (0.25, 395.0), (0.5, 400.0), (INF, 400.0)], 0.25, Verdict.HOT),
    ([(0.2, 300.0), (0.225, 390.0), (0.25, 400.0), (INF, 400.0)], 0.25, Verdict.BETWEEN),
])
def test_verdicts(buckets: Any, bound: float, verdict: Verdict) -> None:
    j = judge(buckets, bound)
    assert j.verdict == verdict, j.why
    if verdict == Verdict.UNKNOWN:
        assert "lies inside bucket (0 ms, 300 ms]" in j.why


def test_hostile_buckets_never_make_a_verdict_worse_than_the_truth() -> None:
    """Negative, NaN and -Inf edges are no edges; counts going down are forced up."""
    hostile = [(-1.0, 500.0), (float("nan"), 9.0), (-INF, 3.0), (0.25, 400.0), (0.5, 390.0),
               (INF, 400.0)]
    assert judge(hostile, 0.25).verdict == Verdict.CALM


def test_resolvable_names_the_bucket() -> None:
    assert resolvable([0.3, 0.5, INF], 0.3) is None
    words = resolvable([0.3, 0.5, INF], 0.25)
    assert words and "(0 ms, 300 ms]" in words


def _config(slo: Any) -> Any:
    with open(EXAMPLE) as fh:
        data = yaml.safe_load(fh)
    data["monitor"]["slo"] = [dict({"class": "infer"}, **slo)]
    return parse_config(data, "x.yaml")


def test_check_config_and_doctor_say_which_server_cannot_resolve() -> None:
    from slurmiso.doctor.cluster import check_slo_resolvable

    cfg = _config({"p99_ms": 250})
    said = " ".join(cfg.warnings)
    assert "vllm cannot resolve e2e 250 ms" in said and "(0 ms, 300 ms]" in said
    assert "signal: ttft" in said
    (f, *_) = check_slo_resolvable({}, cfg)
    assert f.code == "slo-unresolvable" and f.severity == "warning" and "signals check" in f.fix
    on_edge = check_slo_resolvable({}, _config({"p99_ms": 300}))  # an edge of vLLM's e2e
    assert not any("vllm" in f.message for f in on_edge)


def test_slo_config_errors_are_clear() -> None:
    from slurmiso.errors import ConfigError

    with pytest.raises(ConfigError) as err:
        _config({"signal": "tpot", "p99_ms": 100})
    assert "monitor.slo[0].signal" in str(err.value) and "itl" in str(err.value)
    with pytest.raises(ConfigError) as err:
        _config({"p99_ms": 100, "p99_latency_ms": 200})
    assert "keep one of the two" in str(err.value)
