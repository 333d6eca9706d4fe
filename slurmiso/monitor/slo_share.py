"""An SLO as users state it: at most 1 % of requests slower than the bound.

A Prometheus histogram counts requests at or under each bucket edge, so the share of requests
slower than a bound is exact when the bound is an edge and otherwise only known to lie between
the shares over the edges either side of it. Judging that share, rather than an interpolated
P99, never calls a job hot because its buckets are too wide: a server answering in 20-200 ms
under vLLM's first edge of 0.3 s has a P99 that interpolates to 297 ms, but a share over 250 ms
anywhere between 0 and 100 %: the verdict is unknown, with the bucket that says why. Pure: the
monitor judges with it (:mod:`slurmiso.monitor.ladder`), ``check-config`` and ``slurmiso
signals check`` explain with it.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

#: Two edges closer than this (relative) are one: 0.25 s and 250 ms are the same bound.
_SAME = 1e-9
#: Shares this close are equal: 4 of 400 requests over the bound is 1 %, not 1.0000000001 %.
_EPS = 1e-9


class Verdict(str, enum.Enum):
    """One latency signal of one job (or model) against its SLO."""

    HOT = "hot"  # surely more than the allowed share over the bound
    BETWEEN = "between"  # surely within the SLO, not surely calm
    CALM = "calm"  # surely within the SLO by the hysteresis margin
    UNKNOWN = "unknown"  # the buckets cannot tell (see Judgement.why)


@dataclass(frozen=True)
class Share:
    """The share of requests slower than ``bound`` (seconds): ``low`` <= true share <=
    ``high``, from the edges ``below`` and ``above`` around the bound (equal, and ``low ==
    high``, when the bound is an edge)."""

    bound: float
    low: float
    high: float
    below: float
    above: float
    total: float

    @property
    def exact(self) -> bool:
        return self.low == self.high


def cumulative(buckets: Sequence[Tuple[float, float]]) -> List[Tuple[float, float]]:
    """(edge, cumulative count) sorted, counts forced non-decreasing, repeated edges merged,
    negative and NaN edges dropped (no request takes less than no time)."""
    pts = sorted((b, c) for b, c in buckets
                 if not math.isnan(b) and b >= 0 and math.isfinite(c) and c >= 0)
    out: List[Tuple[float, float]] = []
    top = 0.0
    for edge, count in pts:
        top = max(top, count)
        if out and abs(out[-1][0] - edge) <= _SAME * max(1.0, edge) and edge != math.inf:
            out[-1] = (out[-1][0], top)
        elif out and out[-1][0] == edge:
            out[-1] = (edge, top)
        else:
            out.append((edge, top))
    return out


def share_over(buckets: Sequence[Tuple[float, float]], bound: float) -> Optional[Share]:
    """The share of requests slower than ``bound`` seconds, as far as ``buckets`` (edge,
    cumulative count; the last edge ``+Inf``) tell. None without a ``+Inf`` bucket or with no
    request counted."""
    pts = cumulative(buckets)
    if not pts or pts[-1][0] != math.inf or pts[-1][1] <= 0 or not bound > 0:
        return None
    total = pts[-1][1]
    below, at_below = 0.0, 0.0
    for edge, count in pts:
        if abs(edge - bound) <= _SAME * max(1.0, bound):
            s = 1.0 - count / total
            return Share(bound, s, s, edge, edge, total)
        if edge > bound:
            return Share(bound, 1.0 - count / total, 1.0 - at_below / total, below, edge, total)
        below, at_below = edge, count
    return None  # unreachable: +Inf is above any finite bound


@dataclass(frozen=True)
class Judgement:
    """A verdict, the share it rests on, and why in words."""

    verdict: Verdict
    share: Optional[Share]
    why: str


def judge(buckets: Sequence[Tuple[float, float]], bound_s: float, allowed: float = 0.01,
          hysteresis: float = 0.1) -> Judgement:
    """At most ``allowed`` of requests slower than ``bound_s``, with calm ``hysteresis`` below.

    Hot: surely more than ``allowed`` over the bound. Calm: surely at most ``allowed`` over
    ``bound_s * (1 - hysteresis)``; where that calm bound lies inside a bucket, surely at most
    ``allowed * (1 - hysteresis)`` over the bound itself (so calm is reachable wherever the
    bound is). Between: surely within the SLO, not surely calm. Unknown: the bound lies in a
    bucket too wide to tell; never hot, never calm."""
    share = share_over(buckets, bound_s)
    if share is None:
        return Judgement(Verdict.UNKNOWN, None, "no request in the window's buckets")
    if share.low > allowed + _EPS:
        return Judgement(Verdict.HOT, share, f"{share.low:.1%} of requests over "
                         f"{_ms(bound_s)} (SLO: at most {allowed:.1%})")
    if share.high > allowed + _EPS:
        return Judgement(Verdict.UNKNOWN, share, f"the SLO bound {_ms(bound_s)} lies inside "
                         f"bucket ({_ms(share.below)}, {_ms(share.above)}]: between "
                         f"{share.low:.1%} and {share.high:.1%} of requests are over it")
    calm = share_over(buckets, bound_s * (1.0 - hysteresis))
    if calm is not None and (calm.high <= allowed + _EPS or calm.low > allowed + _EPS):
        ok = calm.high <= allowed + _EPS  # the calm bound decides
    else:
        ok = share.high <= allowed * (1.0 - hysteresis) + _EPS
    verdict = Verdict.CALM if ok else Verdict.BETWEEN
    return Judgement(verdict, share, f"at most {share.high:.1%} of requests over "
                     f"{_ms(bound_s)} (SLO: at most {allowed:.1%})")


def resolvable(edges: Sequence[float], bound_s: float, allowed: float = 0.01) -> Optional[str]:
    """None if a histogram with these ``edges`` always resolves ``bound_s`` (an edge at the
    bound); else the words of when it cannot (for ``check-config``, ``doctor`` and
    ``slurmiso signals check``)."""
    fin = sorted(e for e in edges if math.isfinite(e) and e > 0)
    if any(abs(e - bound_s) <= _SAME * max(1.0, bound_s) for e in fin):
        return None
    lower = max((e for e in fin if e < bound_s), default=0.0)
    upper = min((e for e in fin if e > bound_s), default=math.inf)
    return (f"the SLO bound {_ms(bound_s)} lies inside bucket ({_ms(lower)}, {_ms(upper)}]: "
            f"the verdict is unknown whenever more than {allowed:.0%} of requests fall in it")


def _ms(seconds: float) -> str:
    if seconds == math.inf:
        return "+Inf"
    return f"{seconds * 1000:g} ms"
