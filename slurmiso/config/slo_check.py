"""Whether the built-in servers' histograms can resolve each class's SLO bound.

An SLO of "at most 1 % of requests slower than B" is exact when B is a bucket edge of the
server's histogram and unknown whenever more than 1 % of requests fall in the bucket around
it. The edges below are each server's own (sources in docs/monitor.md and
tests/fixtures/servers.py); ``check-config``, ``doctor`` and ``slurmiso signals check`` warn
where a bound is no edge, naming the bucket and what to do.
"""

from __future__ import annotations

from typing import Dict, List, Sequence, Tuple

from slurmiso.config.model import Config

_TTFT_A = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
           7.5, 10.0)
_TPOT_A = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5)
_E2E_A = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0)

#: (profile, signal) -> (release words, edges in seconds) for each layout sites run.
KNOWN_LAYOUTS: Dict[Tuple[str, str], Tuple[Tuple[str, Tuple[float, ...]], ...]] = {
    ("vllm", "e2e"): (("vLLM V1 (vllm/v1/metrics/loggers.py)", _E2E_A),
                      ("vLLM with a 0.1 s first bucket", (0.1,) + _E2E_A)),
    ("vllm", "ttft"): (("vLLM V1", _TTFT_A),),
    ("vllm", "itl"): (("vLLM V1", _TPOT_A),),
    ("sglang", "e2e"): (("SGLang (srt/metrics/collector.py)",
                         (0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10)),),
    ("sglang", "ttft"): (("SGLang", (0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10)),),
    ("sglang", "itl"): (("SGLang", (0.002, 0.004, 0.006, 0.008, 0.010, 0.015, 0.020, 0.025,
                                    0.030, 0.035, 0.040, 0.060, 0.080, 0.100, 0.200, 0.400,
                                    0.600, 0.800, 1.000)),),
    ("tgi", "e2e"): (("TGI (router/src/server.rs)",
                      tuple(0.0001 * 1.5 ** k for k in range(1, 36))),),
    ("triton", "ttft"): (("Triton (histogram_latencies)", (0.1, 0.5, 2.0, 5.0)),),
}
_SAME = 1e-9


def bucket_around(edges: Sequence[float], bound_s: float) -> Tuple[float, float]:
    """The bucket (lower, upper] of ``edges`` that holds ``bound_s``; (b, b) on an edge."""
    for e in edges:
        if abs(e - bound_s) <= _SAME * max(1.0, bound_s):
            return e, e
    lower = max((e for e in edges if e < bound_s), default=0.0)
    upper = min((e for e in edges if e > bound_s), default=float("inf"))
    return lower, upper


def slo_problems(cfg: Config) -> List[Tuple[str, str]]:
    """(config key, words) for each class SLO a built-in server cannot resolve."""
    out: List[Tuple[str, str]] = []
    servers = {p.name for p in cfg.monitor.signals.servers}
    for i, slo in enumerate(cfg.monitor.slo):
        if slo.p99_latency_ms is None or not isinstance(slo.p99_latency_ms, (int, float)):
            continue
        bound = float(slo.p99_latency_ms) / 1000.0
        for (server, signal), layouts in sorted(KNOWN_LAYOUTS.items()):
            if signal != slo.signal or server not in servers:
                continue
            for words, edges in layouts:
                lo, hi = bucket_around(edges, bound)
                if lo == hi:
                    continue
                out.append((f"monitor.slo[{i}]", (
                    f"{slo.class_name}: {server} cannot resolve {signal} {_ms(bound)} "
                    f"({words}: the bound lies inside bucket ({_ms(lo)}, {_ms(hi)}]); a job "
                    "with over 1% of its requests in that bucket is judged unknown, never hot "
                    f"or calm. Use a bound on an edge ({_edges(lo, hi)})"
                    + ("" if signal == "ttft" or server == "tgi" else
                       " or signal: ttft where the server has it"))))
                break
    return out


def _ms(s: float) -> str:
    return "+Inf" if s == float("inf") else f"{s * 1000:g} ms"


def _edges(lo: float, hi: float) -> str:
    return " or ".join(_ms(e) for e in (lo, hi) if 0 < e < float("inf"))
