"""The ladder's reading of real servers' /metrics (issue 32): every built-in profile against
answers generated from the server's own definitions (tests/fixtures/servers.py), judged
against the truth of the requests that made them.

The path is the product's own: the answer read by the profiles, windowed as the agent does,
exported by the agent's collector, parsed by the monitor and judged by the ladder."""

from __future__ import annotations

from typing import Callable, Dict, List, Optional, Sequence

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from slurmiso.agent.endpoint import Profile, Profiles
from slurmiso.agent.job_signals import JobSignalsCollector, JobSignalsState
from slurmiso.config.model import DEFAULT_SERVERS, SignalSettings
from slurmiso.exposition import job_series as sig
from slurmiso.exposition.text import parse_prometheus_text
from slurmiso.monitor import ladder
from slurmiso.monitor.policy import Policy, SloLimit
from slurmiso.state.record import JobRecord, RecordStatus
from tests.fixtures import servers as fx

PROFILES = Profiles([Profile.from_config(p) for p in DEFAULT_SERVERS])

#: Every server and layout a built-in profile must read.
FACTORIES: Dict[str, Callable[[], fx.Server]] = {
    "vllm-A": lambda: fx.Vllm("A"), "vllm-B": lambda: fx.Vllm("B"),
    "vllm-C": lambda: fx.Vllm("C"), "sglang": fx.Sglang, "tgi": fx.Tgi,
    "triton": fx.Triton, "otel": fx.OtelHttp, "fastapi": fx.FastapiInstrumentator,
}
PROFILE_OF = {"vllm-A": "vllm", "vllm-B": "vllm", "vllm-C": "vllm", "sglang": "sglang",
              "tgi": "tgi", "triton": "triton", "otel": "generic", "fastapi": "generic"}


def read(server: fx.Server, before: Sequence[fx.Request], window: Sequence[fx.Request],
         signal: str = "e2e") -> sig.JobSignals:
    """What the monitor sees of ``server`` after ``before`` then ``window``: two agent
    readings 10 s apart, the agent's export parsed back."""
    texts: List[str] = []
    for batch in (before, window):
        for r in batch:
            server.serve(r)
        texts.append(server.text())
    clock = [1000.0]
    state = JobSignalsState(SignalSettings(), slo_classes=("infer",),
                            fetch=lambda urls, *a: {j: _Ok(texts.pop(0)) for j in urls},
                            listeners=lambda: None, clock=lambda: clock[0])
    rec = JobRecord("7", RecordStatus.READY, uid=1000, job_class="infer", metrics="8000")
    state.refresh({"7": rec})
    clock[0] += 10.0
    state.refresh({"7": rec})
    reg = CollectorRegistry()
    reg.register(JobSignalsCollector(state))
    exported = generate_latest(reg).decode()
    return sig.from_samples(parse_prometheus_text(exported), "n1")["7"]


class _Ok:
    def __init__(self, body: str) -> None:
        self.body, self.reason, self.detail = body, "", ""


def verdict(js: sig.JobSignals, p99_ms: Optional[float] = 250.0, signal: str = "e2e",
            max_error_rate: Optional[float] = None) -> ladder.Breach:
    slo = SloLimit("infer", p99_latency_ms=p99_ms, max_error_rate=max_error_rate,
                   signal=signal)
    return ladder.job_verdict(js.job, js, slo, Policy())


def ok(latencies: Sequence[float], model: str = "llama") -> List[fx.Request]:
    return [fx.Request(e2e=v, ttft=v / 4, itl=v / 40, model=model) for v in latencies]


WARMUP = ok([0.05] * 5)


@pytest.mark.parametrize("name", sorted(FACTORIES))
def test_each_server_is_read_by_its_own_profile(name: str) -> None:
    server = FACTORIES[name]()
    for r in WARMUP:
        server.serve(r)
    assert PROFILES.read(server.text()).profile == PROFILE_OF[name]


@pytest.mark.parametrize("name", sorted(FACTORIES))
def test_fast_server_under_the_shipped_slo_is_never_hot(name: str) -> None:
    """Every request in 20-200 ms: at most calm, or unknown with the bucket that says why
    (vLLM's first edge of 0.3 s cannot place them against 250 ms)."""
    js = read(FACTORIES[name](), WARMUP, ok(fx.spread(400, 0.02, 0.2)))
    v = verdict(js)
    assert v.kind != ladder.HOT, v.why
    if v.kind == ladder.UNKNOWN:
        assert "lies inside bucket" in v.why, v.why
    truth = fx.Truth(ok(fx.spread(400, 0.02, 0.2)))
    assert truth.share_over(0.25) == 0.0


@pytest.mark.parametrize("name", sorted(FACTORIES))
def test_slow_tail_over_the_bound_is_hot_or_unknown_never_calm(name: str) -> None:
    """10 % of requests at 0.6-0.9 s, beyond the bucket around 250 ms of every layout: hot
    wherever an edge lies between the bound and the tail."""
    window = ok([0.05] * 360 + fx.spread(40, 0.6, 0.9))
    assert fx.Truth(window).share_over(0.25) == pytest.approx(0.10)
    v = verdict(read(FACTORIES[name](), WARMUP, window))
    if name == "triton":  # a summary: judged on its own P99, no buckets
        assert v.kind == ladder.HOT, v.why
        return
    assert v.kind == ladder.HOT, v.why
    assert "of requests over 250 ms" in v.why


def test_vllm_new_layout_p99_of_239ms_is_unknown_not_hot() -> None:
    """Issue 32's second case: true P99 239 ms, first edges 0.1 and 0.3 s (interpolated P99
    298 ms): the 250 ms bound is inside (100, 300] ms."""
    window = ok([0.05] * 300 + fx.spread(100, 0.15, 0.245))
    js = read(fx.Vllm("C"), WARMUP, window)
    assert js.p99_ms is not None and js.p99_ms > 250  # what a P99 rule would have judged
    v = verdict(js)
    assert v.kind == ladder.UNKNOWN and "(100 ms, 300 ms]" in v.why, v.why


@pytest.mark.parametrize("layout", ["A", "B", "C"])
def test_vllm_ttft_slo_is_exact_on_its_edges(layout: str) -> None:
    """The signal the example config uses for vLLM: TTFT, 500 ms is an edge of every layout."""
    fast = [fx.Request(e2e=1.5, ttft=t) for t in fx.spread(400, 0.02, 0.2)]
    assert verdict(read(fx.Vllm(layout), WARMUP, fast), 500, "ttft").kind == ladder.CALM
    slow = [fx.Request(e2e=1.5, ttft=0.1)] * 380 + [fx.Request(e2e=3, ttft=0.9)] * 20
    v = verdict(read(fx.Vllm(layout), WARMUP, slow), 500, "ttft")
    assert v.kind == ladder.HOT and "5.0% of requests over 500 ms" in v.why, v.why


def test_itl_slo_reads_the_inter_token_family_of_each_layout() -> None:
    window = [fx.Request(e2e=1.0, ttft=0.1, itl=0.12)] * 100
    for layout in "ABC":
        v = verdict(read(fx.Vllm(layout), WARMUP, window), 100, "itl")
        assert v.kind == ladder.HOT, (layout, v.why)  # 0.12 s > 0.1 s, an edge of both


def test_a_server_without_the_slo_signal_is_unknown() -> None:
    """TGI has no TTFT: an SLO on it is unknown with its name, never calm."""
    v = verdict(read(fx.Tgi(), WARMUP, ok([0.05] * 100)), 500, "ttft")
    assert v.kind == ladder.UNKNOWN and "time to first token" in v.why


MIX = ([fx.Request(0.05)] * 69 + [fx.Request(0.05, outcome=fx.ENGINE_ERROR)] * 6
       + [fx.Request(0.05, outcome=fx.ABORT)] * 5 + [fx.Request(0.01, outcome=fx.BAD_REQUEST)] * 10
       + [fx.Request(0.01, outcome=fx.SERVER_ERROR)] * 10)


@pytest.mark.parametrize("name", sorted(FACTORIES))
def test_every_failure_kind_the_server_records_is_seen(name: str) -> None:
    """31 % failures of four kinds: the error ratio is the share of those the server records
    anywhere (per docs/monitor.md), never 0."""
    server = FACTORIES[name]()
    js = read(server, WARMUP, MIX)
    seen = sum(1 for r in MIX if r.outcome in server.sees)
    if name == "tgi":  # tgi_request_count counts every request at entry
        assert js.error_rate == pytest.approx(seen / len(MIX))
    else:
        assert js.error_rate == pytest.approx(seen / len(MIX), abs=0.011), js
    assert verdict(js, None, max_error_rate=0.05).kind == ladder.HOT


def test_vllm_without_its_api_server_counters_has_unknown_errors() -> None:
    """The engine's series alone cannot see the API server's failures: unknown, not 0."""
    server = fx.Vllm("B")
    texts = []
    for batch in (WARMUP, MIX):
        for r in batch:
            server.serve(r)
        texts.append("\n".join(line for line in server.text().splitlines()
                               if not line.startswith(("http_", "# HELP http_",
                                                       "# TYPE http_"))) + "\n")
    a = PROFILES.read(texts[1])
    assert a.profile == "vllm" and not a.errors_known


def test_busy_fast_model_does_not_hide_a_breaching_one() -> None:
    server = fx.Vllm("B", models=("fast", "slow"))
    window = ok([0.05] * 2000, "fast") + ok([0.7] * 10, "slow")
    assert fx.Truth(window).share_over(0.25) < 0.01  # all models together: within the SLO
    js = read(server, ok([0.05], "fast") + ok([0.05], "slow"), window)
    v = verdict(js, 500, "ttft")  # ttft = e2e / 4: 175 ms for slow, within 500
    assert v.kind == ladder.CALM, v.why
    v = verdict(js, 100, "ttft")
    assert v.kind == ladder.HOT and "model slow" in v.why, v.why


def test_triton_per_model_summary_worst_model_decides() -> None:
    server = fx.Triton(models=("a", "b"))
    window = ok([0.01] * 500, "a") + ok([0.9] * 50, "b")
    v = verdict(read(server, ok([0.01], "a") + ok([0.01], "b"), window))
    assert v.kind == ladder.HOT, v.why


@pytest.mark.parametrize("name", sorted(FACTORIES))
def test_parser_agrees_with_prometheus_client(name: str) -> None:
    """slurmiso's exposition parser and prometheus_client's give the same samples."""
    server = FACTORIES[name]()
    for r in MIX + WARMUP:
        server.serve(r)
    text = server.text()
    ours = sorted((_total(s.name), tuple(sorted(s.labels.items())), s.value)
                  for s in parse_prometheus_text(text))
    theirs = sorted((_total(s.name), tuple(sorted(s.labels.items())), s.value)
                    for fam in text_string_to_metric_families(text) for s in fam.samples)
    assert ours == theirs and len(ours) > 10


def _total(name: str) -> str:
    """prometheus_client's parser names a counter's sample ``NAME_total`` even where the
    exporter (TGI's Rust crate, Triton's prometheus-cpp) writes ``NAME``: not a difference."""
    return name[:-6] if name.endswith("_total") else name


@pytest.mark.parametrize("name", ["otel", "fastapi"])  # (0.26 refuses ":" names in OM)
def test_openmetrics_answers_read_alike(name: str) -> None:
    """The same registry in OpenMetrics (``# EOF``, ``_created`` in the family, counters
    without ``_total`` in TYPE): the same figures as the classic text."""
    from prometheus_client.openmetrics.exposition import generate_latest as om_latest
    from prometheus_client.openmetrics.parser import (
        text_string_to_metric_families as om_families,
    )

    server = FACTORIES[name]()
    for r in MIX + WARMUP:
        server.serve(r)
    text = om_latest(server.reg).decode()  # type: ignore[attr-defined]
    assert text.rstrip().endswith("# EOF")
    ours = sorted((s.name, tuple(sorted(s.labels.items())), s.value)
                  for s in parse_prometheus_text(text))
    theirs = sorted((s.name, tuple(sorted(s.labels.items())), float(s.value))
                    for fam in om_families(text) for s in fam.samples)
    assert ours == theirs
    classic = PROFILES.read(server.text())
    assert PROFILES.read(text).counters == classic.counters


def test_a_window_past_the_edge_cap_keeps_its_inf_bucket() -> None:
    """The monitor keeps at most MAX_EDGES edges of one window histogram, but always +Inf:
    without it the share cannot be read and the verdict would be unknown for the wrong
    reason."""
    lines = [f'{sig.M_WINDOW_BUCKET}{{job="7",class="infer",signal="e2e",model="",'
             f'le="{0.001 * (i + 1)!r}"}} {i}' for i in range(sig.MAX_EDGES + 20)]
    lines.append(f'{sig.M_WINDOW_BUCKET}{{job="7",class="infer",signal="e2e",model="",'
                 f'le="+Inf"}} 200')
    js = sig.from_samples(parse_prometheus_text("\n".join(lines) + "\n"), "n1")["7"]
    hist = js.window("e2e")[""]
    assert len(hist) == sig.MAX_EDGES + 1 and hist[-1] == (float("inf"), 200.0)
