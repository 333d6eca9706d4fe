"""Latency and step-time figures from raw samples, computed one documented way.

Percentiles are *nearest rank*: P_p is the ceil(p/100 * n)-th smallest sample. It is always a
latency that was actually measured (never an interpolation between two), it is what an SLO of
"99% of requests within X ms" checks, and it can be worked out by hand in a test.

A request that timed out stays in the latency samples at the latency it had (at least the
timeout): dropping it would hide exactly the tail the SLO is about. It also counts as an error.
Requests that failed without a latency count as errors only.
"""

from __future__ import annotations

import math
from typing import Any, Dict, List, Optional, Sequence

from slurmiso.values import Value


class InferSample(Value, eq=True):
    """One inference request as the workload reported it."""

    latency_ms: Optional[float]
    ok: bool = True


def percentile(values: Sequence[float], p: float) -> Optional[float]:
    """Nearest-rank percentile (``p`` in 0..100); None for no values."""
    if not values:
        return None
    if not 0 <= p <= 100:
        raise ValueError(f"percentile {p} outside 0..100")
    ordered = sorted(values)
    rank = max(1, math.ceil(p / 100.0 * len(ordered)))
    return float(ordered[rank - 1])


def infer_figures(samples: Sequence[InferSample], timeout_ms: Optional[float]) -> Dict[str, Any]:
    """requests, P50/P95/P99 (ms), mean, max, errors, timeouts and error_rate of a run."""
    latencies: List[float] = [s.latency_ms for s in samples if s.latency_ms is not None]
    timeouts = sum(1 for s in samples if timeout_ms is not None and s.latency_ms is not None
                   and s.latency_ms > timeout_ms)
    failed = sum(1 for s in samples if not s.ok and not (
        timeout_ms is not None and s.latency_ms is not None and s.latency_ms > timeout_ms))
    n = len(samples)
    errors = failed + timeouts
    return {
        "requests": n,
        "p50_ms": _r(percentile(latencies, 50)),
        "p95_ms": _r(percentile(latencies, 95)),
        "p99_ms": _r(percentile(latencies, 99)),
        "mean_ms": _r(sum(latencies) / len(latencies)) if latencies else None,
        "max_ms": _r(max(latencies)) if latencies else None,
        "errors": errors,
        "timeouts": timeouts,
        "error_rate": round(errors / n, 6) if n else None,
    }


def train_figures(step_s: Sequence[float], warmup: int = 0) -> Dict[str, Any]:
    """Median step time (s) after ``warmup`` steps, P95, steps and throughput (steps/s).

    The median, not the mean: one step stalled by a checkpoint or a page fault would otherwise
    move the figure a co-located inference job is blamed for.
    """
    steady = list(step_s[warmup:]) if len(step_s) > warmup else list(step_s)
    med = percentile(steady, 50)
    return {
        "steps": len(step_s),
        "step_s": _r(med, 6),
        "p95_step_s": _r(percentile(steady, 95), 6),
        "throughput_steps_s": _r(1.0 / med, 4) if med else None,
    }


def throughput_vs_solo(mixed_step_s: Optional[float],
                       solo_step_s: Optional[float]) -> Optional[float]:
    """Training throughput beside inference as a share of training alone (1.0 = no loss)."""
    if not mixed_step_s or not solo_step_s:
        return None
    return round(solo_step_s / mixed_step_s, 4)


def _r(value: Optional[float], digits: int = 3) -> Optional[float]:
    return None if value is None else round(float(value), digits)


def cdf_points(values: Sequence[float], most: int = 200) -> List[List[float]]:
    """[[value, share of values <= it], ...] for a CDF chart, at most ``most`` points; the
    tail (top 2%) is kept whole, since that is where an SLO is decided."""
    ordered = sorted(values)
    n = len(ordered)
    if not n:
        return []
    picks = set(range(max(0, int(n * 0.98)), n))
    step = max(1, n // max(1, most - len(picks)))
    picks.update(range(0, n, step))
    return [[round(ordered[i], 3), round((i + 1) / n, 5)] for i in sorted(picks)]
