"""Quantiles from Prometheus histogram buckets, over a sliding window of readings.

An inference server exports cumulative counters since it started; what matters to the SLO
ladder is the last minute. So the agent keeps each job's recent readings (a
:class:`Window`), takes each counter's *increase* over the window the way Prometheus's
``increase()`` does (a counter that went down was reset: a restarted server, and its new
value is the increase since), sums the buckets' increases per ``le`` and interpolates the
quantile inside its bucket as ``histogram_quantile()`` does. Pure: no I/O, no clock.
"""

from __future__ import annotations

import math
from collections import deque
from typing import Deque, Dict, Hashable, Iterable, List, Optional, Sequence, Set, Tuple

#: A reading: counter key -> cumulative value. Keys are whatever the caller needs to tell
#: series apart (for a bucket: the series' labels without ``le``, then ``le``).
Counters = Dict[Hashable, float]


def quantile(q: float, buckets: Sequence[Tuple[float, float]]) -> Optional[float]:
    """The ``q`` quantile of a histogram given as (upper bound, cumulative count) pairs.

    Prometheus's ``histogram_quantile``: buckets sorted by bound, the last one ``+Inf``;
    counts forced non-decreasing; the rank ``q * total`` found in its bucket and interpolated
    linearly between the bucket's lower and upper bounds (the first bucket starts at 0 when
    its bound is positive). A rank in the ``+Inf`` bucket answers the highest finite bound.
    None when there is no answer: fewer than two buckets, no ``+Inf`` bucket, no
    observations, or ``q`` outside 0..1.
    """
    if not 0.0 <= q <= 1.0 or math.isnan(q):
        return None
    pts = sorted((b, c) for b, c in buckets if not math.isnan(b) and math.isfinite(c))
    if len(pts) < 2 or pts[-1][0] != math.inf:
        return None
    fixed: List[Tuple[float, float]] = []
    top = 0.0
    for bound, count in pts:
        top = max(top, count, 0.0)
        if fixed and fixed[-1][0] == bound:
            fixed[-1] = (bound, top)  # a repeated bound: one bucket
        else:
            fixed.append((bound, top))
    if len(fixed) < 2:
        return None
    total = fixed[-1][1]
    if total <= 0:
        return None
    rank = q * total
    b = next(i for i, (_, count) in enumerate(fixed) if count >= rank)
    if b == len(fixed) - 1:
        return fixed[-2][0]
    end, count = fixed[b]
    if b == 0:
        if end <= 0:
            return end
        start, below = 0.0, 0.0
    else:
        start, below = fixed[b - 1]
    inside = count - below
    if inside <= 0:
        return end
    return start + (end - start) * ((rank - below) / inside)


def increase(values: Iterable[Optional[float]]) -> Optional[float]:
    """How much a counter grew over consecutive readings, as Prometheus's ``increase()``: a
    drop is a reset and adds the value after it. None in a reading means the series was not
    there: absent *before* it first appears it counts as 0 (a series created since, such as
    the first failure's), absent after that the reading is skipped. None when the series was
    in none of the readings, or there was only one reading."""
    total = 0.0
    prev: Optional[float] = None
    readings = 0
    for v in values:
        readings += 1
        if v is None or not math.isfinite(v) or v < 0:
            continue
        if prev is None:
            prev = 0.0 if readings > 1 else v
        total += v - prev if v >= prev else v
        prev = v
    return total if prev is not None and readings > 1 else None


class Window:
    """The readings of one job within ``seconds``, plus the newest one before them (the
    window's start), bounded to ``max_readings``."""

    def __init__(self, seconds: float, max_readings: int = 64) -> None:
        self.seconds = seconds
        self.readings: Deque[Tuple[float, Counters]] = deque(maxlen=max(2, max_readings))

    def add(self, t: float, counters: Counters) -> None:
        if self.readings and t < self.readings[-1][0]:
            self.readings.clear()  # the clock went back: start over, never a negative span
        self.readings.append((t, dict(counters)))
        start = t - self.seconds
        while len(self.readings) > 2 and self.readings[1][0] <= start:
            self.readings.popleft()

    @property
    def span(self) -> float:
        """Seconds the window covers now (0 with one reading)."""
        if len(self.readings) < 2:
            return 0.0
        return self.readings[-1][0] - self.readings[0][0]

    def increases(self) -> Optional[Counters]:
        """Every key's increase over the window; None until there are two readings."""
        if len(self.readings) < 2:
            return None
        keys: Set[Hashable] = set()
        for _, c in self.readings:
            keys.update(c)
        out: Counters = {}
        for key in keys:
            inc = increase(c.get(key) for _, c in self.readings)
            if inc is not None:
                out[key] = inc
        return out
