"""Reading an inference server's /metrics answer with the shipped server profiles (vLLM, TGI,
Triton, generic) and the selector syntax of monitor.signals.servers (issue 24)."""

from __future__ import annotations

import math
from typing import Dict, Optional

import pytest

from slurmiso.agent.endpoint import BadAnswer, Profile, Profiles
from slurmiso.agent.job_signals import figures
from slurmiso.config.model import DEFAULT_SERVERS, ServerProfile
from slurmiso.config.selector import BadSelector, parse_selector
from slurmiso.exposition import job_series as sig
from slurmiso.exposition.histogram import Window

PROFILES = Profiles([Profile.from_config(p) for p in DEFAULT_SERVERS])
LE = ("0.1", "0.5", "1.0", "+Inf")


def vllm(counts: Dict[str, float], stop: float = 0, abort: float = 0, error: float = 0,
         model: str = "m") -> str:
    """A vLLM answer (names as docs.vllm.ai "Production Metrics" lists them)."""
    lines = ["# HELP vllm:e2e_request_latency_seconds Histogram of end to end request latency.",
             "# TYPE vllm:e2e_request_latency_seconds histogram"]
    for le in LE:
        lines.append(f'vllm:e2e_request_latency_seconds_bucket{{le="{le}",model_name="{model}"}} '
                     f"{counts[le]}")
    lines.append(f'vllm:e2e_request_latency_seconds_count{{model_name="{model}"}} {counts["+Inf"]}')
    for reason, n in (("stop", stop), ("length", 0), ("abort", abort), ("error", error)):
        lines.append(f'vllm:request_success_total{{finished_reason="{reason}",'
                     f'model_name="{model}"}} {n}')
    # the API server's instrumentator: an engine error is its 500 (vllm/v1/engine/__init__.py)
    lines.append(f'http_requests_total{{handler="/v1/completions",method="POST",status="2xx"}} '
                 f"{stop + abort}")
    lines.append(f'http_requests_total{{handler="/v1/completions",method="POST",status="5xx"}} '
                 f"{error}")
    lines.append('vllm:num_requests_running{model_name="m"} 3.0')
    return "\n".join(lines) + "\n"


def cum(a: float, b: float, c: float, d: float) -> Dict[str, float]:
    return dict(zip(LE, (a, b, c, d)))


def window_figures(*texts: str, step: float = 5.0) -> object:
    w = Window(60.0)
    out = None
    for i, text in enumerate(texts):
        answer = PROFILES.read(text)
        w.add(i * step, answer.counters)
        out = figures(answer, w)
    return out


def test_vllm_quantiles_come_from_the_window_not_since_start() -> None:
    """Since start: 1000 fast requests. In the window: 100 more, 10/40/40/10 as the hand-
    computed histogram of test_histogram, so P50 0.5 s, P95 and P99 1.0 s."""
    before = vllm(cum(1000, 1000, 1000, 1000), stop=1000)
    after = vllm(cum(1010, 1050, 1090, 1100), stop=1090, abort=8, error=2)
    lat = window_figures(before, after)
    assert lat.e2e() == pytest.approx({"0.5": 0.5, "0.95": 1.0, "0.99": 1.0})
    assert lat.requests == 100.0
    assert lat.error_ratio == pytest.approx(0.10)  # abort 8 + error 2 of 100
    assert lat.unknown == ()


def test_first_reading_has_no_window_and_says_so() -> None:
    lat = window_figures(vllm(cum(1, 2, 3, 4), stop=4))
    assert lat.quantiles == {} and lat.unknown == (sig.R_FIRST_SAMPLE,)


def test_idle_server_is_requests_zero_not_unknown() -> None:
    text = vllm(cum(5, 5, 5, 5), stop=5)
    lat = window_figures(text, text)
    assert lat.quantiles == {} and lat.requests == 0.0 and lat.unknown == ()
    assert lat.error_ratio is None


def test_restarted_server_counts_from_its_restart() -> None:
    """Counters drop (a restarted vLLM): the increase is what the new process counted, as
    Prometheus's increase() takes it, never a negative or a huge number."""
    before = vllm(cum(5000, 6000, 7000, 8000), stop=8000)
    restarted = vllm(cum(10, 50, 90, 100), stop=100)
    lat = window_figures(before, restarted)
    assert lat.requests == 100.0
    assert lat.e2e()["0.5"] == pytest.approx(0.5)


def test_two_models_are_judged_apart() -> None:
    """Each model has its own window histogram (issue 32: a fast, busy model must not hide a
    breaching one); the e2e quantiles shown are the worst model's."""
    a0, b0 = vllm(cum(0, 0, 0, 0), model="a"), vllm(cum(0, 0, 0, 0), model="b")
    a1 = vllm(cum(10, 50, 50, 50), stop=50, model="a")
    b1 = vllm(cum(0, 0, 40, 50), stop=50, model="b")
    lat = window_figures(a0 + b0, a1 + b1)
    assert lat.windows[("e2e", "a")] == ((0.1, 10.0), (0.5, 50.0), (1.0, 50.0), (math.inf, 50.0))
    assert lat.windows[("e2e", "b")] == ((0.1, 0.0), (0.5, 0.0), (1.0, 40.0), (math.inf, 50.0))
    assert lat.e2e()["0.99"] == pytest.approx(1.0)  # model b's
    assert lat.quantiles[("e2e", "a")]["0.99"] == pytest.approx(0.1 + 0.4 * 39.5 / 40)


TGI = """# TYPE tgi_request_duration histogram
tgi_request_duration_bucket{le="0.5"} {a}
tgi_request_duration_bucket{le="2"} {b}
tgi_request_duration_bucket{le="+Inf"} {c}
tgi_request_duration_sum 10
tgi_request_duration_count {c}
tgi_request_count {c}
{failure}"""


def tgi(a: int, b: int, c: int, failures: Optional[int] = None) -> str:
    fail = "" if failures is None else f'tgi_request_failure{{err="overloaded"}} {failures}\n'
    return (TGI.replace("{a}", str(a)).replace("{b}", str(b)).replace("{c}", str(c))
            .replace("{failure}", fail))


def test_tgi_failure_counter_created_at_the_first_failure() -> None:
    """TGI creates tgi_request_failure on the first failure: absent is 0 (errors_missing:
    zero), and when it appears its whole value is new failures."""
    lat = window_figures(tgi(0, 0, 0), tgi(40, 90, 100))
    assert lat.error_ratio == 0.0 and lat.requests == 100
    assert lat.e2e()["0.5"] == pytest.approx(0.5 + 1.5 * 10 / 50)  # rank 50 in (0.5, 2]
    lat = window_figures(tgi(40, 90, 100), tgi(50, 140, 200, failures=20))
    assert lat.error_ratio == pytest.approx(0.2)


TRITON_SUMMARY = """# TYPE nv_inference_request_summary_us summary
nv_inference_request_summary_us_count{model="m",version="1"} {n}
nv_inference_request_summary_us_sum{model="m",version="1"} 11110
nv_inference_request_summary_us{model="m",version="1",quantile="0.5"} 5500
nv_inference_request_summary_us{model="m",version="1",quantile="0.9"} 9700
nv_inference_request_summary_us{model="m",version="1",quantile="0.95"} 9800
nv_inference_request_summary_us{model="m",version="1",quantile="0.99"} 10100
nv_inference_request_summary_us{model="other",version="1",quantile="0.99"} 20000
nv_inference_request_success{model="m",version="1"} {n}
nv_inference_request_failure{model="m",version="1"} {f}
"""


def test_triton_summary_quantiles_in_microseconds_highest_model_wins() -> None:
    """Summary quantiles are the server's own window: valid from the first reading; the
    highest over the models (P99 20 ms of model "other")."""
    lat = window_figures(TRITON_SUMMARY.replace("{n}", "100").replace("{f}", "0"))
    assert lat.e2e() == pytest.approx({"0.5": 0.0055, "0.95": 0.0098, "0.99": 0.020})
    assert lat.requests is None  # no window yet for the counters
    lat = window_figures(TRITON_SUMMARY.replace("{n}", "100").replace("{f}", "0"),
                         TRITON_SUMMARY.replace("{n}", "190").replace("{f}", "10"))
    assert lat.requests == 100 and lat.error_ratio == pytest.approx(0.1)


def test_triton_without_summaries_has_requests_but_no_quantiles() -> None:
    """Triton's default latency series are cumulative totals: no quantile can come of them."""
    text = ('nv_inference_request_success{model="m",version="1"} 10\n'
            'nv_inference_request_failure{model="m",version="1"} 0\n'
            'nv_inference_request_duration_us{model="m",version="1"} 123456\n')
    more = text.replace(" 10\n", " 30\n")
    lat = window_figures(text, more)
    assert lat.quantiles == {} and lat.unknown == (sig.R_NO_QUANTILES,)
    assert lat.requests == 20 and lat.error_ratio == 0.0


def generic(ok: int, err5: int, b: Dict[str, float]) -> str:
    out = ['# TYPE http_request_duration_seconds histogram']
    for le in LE:
        out.append(f'http_request_duration_seconds_bucket{{handler="/v1",le="{le}"}} {b[le]}')
    out.append(f'http_requests_total{{handler="/v1",status="200"}} {ok}')
    out.append(f'http_requests_total{{handler="/v1",status="503"}} {err5}')
    out.append('http_requests_total{handler="/v1",status="404"} 7')
    return "\n".join(out) + "\n"


def test_generic_http_server_5xx_are_errors() -> None:
    lat = window_figures(generic(0, 0, cum(0, 0, 0, 0)), generic(80, 20, cum(10, 50, 90, 100)))
    assert lat.requests == 100 and lat.error_ratio == pytest.approx(0.2)
    assert lat.e2e()["0.5"] == pytest.approx(0.5)


@pytest.mark.parametrize("text", [
    "", "<html>hello</html>", "\x00\x01\x02" * 1000, "no_metric_here 1\n",
    "vllm:e2e_request_latency_seconds_bucket{le= 1\n",  # a cut-off line
])
def test_garbage_is_no_known_series(text: str) -> None:
    with pytest.raises(BadAnswer) as err:
        PROFILES.read(text)
    assert err.value.reason == sig.R_NO_SERIES


def test_hostile_values_are_no_values() -> None:
    """NaN, negative and infinite counts never become figures; a huge le is still a bound."""
    text = vllm(cum(1, 2, 3, 4)).replace(" 4\n", " NaN\n", 1)
    answer = PROFILES.read(text)
    assert all(math.isfinite(v) and v >= 0 for v in answer.counters.values())
    text = vllm({"0.1": -5, "0.5": float("inf"), "1.0": 3, "+Inf": 4})
    answer = PROFILES.read(text)
    assert all(math.isfinite(v) and v >= 0 for v in answer.counters.values())


def test_too_many_lines_or_series_is_refused_not_parsed() -> None:
    from slurmiso.agent import endpoint

    many = "".join(f'vllm:request_success_total{{finished_reason="x{i}"}} 1\n'
                   for i in range(endpoint.MAX_SERIES + 1))
    with pytest.raises(BadAnswer) as err:
        PROFILES.read(many)
    assert err.value.reason == "too-many-series"
    with pytest.raises(BadAnswer) as err:
        PROFILES.read("# c\n" * (endpoint.MAX_LINES + 1))
    assert err.value.reason == "too-large"
    # a giant metric name is nobody's metric: not even matched against the patterns
    assert not PROFILES.samples("x" * 100_000 + "_request_duration_seconds_bucket 1\n")


def test_first_profile_present_wins_and_vllm_ttft_can_be_chosen() -> None:
    ttft = Profiles([Profile.from_config(ServerProfile(
        "vllm-ttft", ("vllm:time_to_first_token_seconds",), "s",
        ("vllm:request_success_total",)))] + list(PROFILES.profiles))
    text = vllm(cum(0, 0, 0, 0)).replace("e2e_request_latency", "time_to_first_token")
    assert ttft.read(text).profile == "vllm-ttft"
    assert PROFILES.read(vllm(cum(0, 0, 0, 0))).profile == "vllm"


@pytest.mark.parametrize("text, labels, match", [
    ('a{x="1"}', {"x": "1"}, True),
    ('a{x="1"}', {"x": "2"}, False),
    ('a{x!="1"}', {"x": "2"}, True),
    ('a{x=~"5.."}', {"x": "503"}, True),
    ('a{x=~"5.."}', {"x": "1503"}, False),  # anchored, as PromQL
    ('a{x!~"5.."}', {"x": "200"}, True),
    ('a{x="q\\"uote"}', {"x": 'q"uote'}, True),
    ('a{ x = "1" , y=~"a|b" }', {"x": "1", "y": "b"}, True),
    ('a{x="1",y=~"a|b"}', {"x": "1"}, False),  # y is "" there
])
def test_selector_matchers(text: str, labels: Dict[str, str], match: bool) -> None:
    try:
        sel = parse_selector(text)
    except BadSelector:
        assert not match
        return
    assert sel.labels_match(labels) is match


@pytest.mark.parametrize("text", ["", "*", "a b", "a{", "a{x}", 'a{x="1}', 'a{x=~"("}',
                                  'a{1x="1"}', "a;b"])
def test_bad_selectors_are_refused(text: str) -> None:
    with pytest.raises(BadSelector):
        parse_selector(text)


def test_glob_names_match_name_characters_only() -> None:
    sel = parse_selector("*_requests_total")
    assert sel.name.fullmatch("http_requests_total")
    assert not sel.name.fullmatch("http_requests_total_created")
    # a wildcard never spans a namespace: sglang:num_requests_total is SGLang's, not generic
    assert not sel.name.fullmatch("app:api_requests_total")
    assert not sel.name.fullmatch("sglang:num_requests_total")
    assert parse_selector("sglang:*").name.fullmatch("sglang:num_requests_total")


def test_a_summary_without_its_count_is_no_count_not_idle() -> None:
    """A summary server that exports no _count (nor request counters) has an unknown request
    count: 0 would read as idle, and an idle server is calm whatever its quantiles say."""
    text = "\n".join(ln for ln in TRITON_SUMMARY.splitlines()
                     if "_count" not in ln and "success" not in ln and "failure" not in ln)
    lat = window_figures(text, text)
    assert lat.e2e()["0.99"] == pytest.approx(0.020)
    assert lat.requests is None
