"""Bounded-memory quantiles for wait and checkpoint times.

A million waits cannot be kept and sorted, so they go into a fixed histogram: one bucket per
whole second below :data:`EXACT` seconds (sacct times have one-second resolution, so quantiles
there are exact), then logarithmic buckets growing by :data:`GAMMA`. A quantile is reported as
the geometric middle of its bucket, so above :data:`EXACT` it is within ``sqrt(GAMMA) - 1``
(about 1%) of the true nearest-rank value. A year of seconds needs under 700 buckets.
"""

from __future__ import annotations

import math
from typing import Dict, Optional

EXACT = 128
GAMMA = 1.02
_LOG_GAMMA = math.log(GAMMA)
#: Relative error bound of :meth:`LogHistogram.quantile` above EXACT seconds.
RELATIVE_ERROR = math.sqrt(GAMMA) - 1


class LogHistogram:
    """Counts per bucket; ``add`` is O(1), ``quantile`` is O(buckets)."""

    __slots__ = ("counts", "total", "max")

    def __init__(self) -> None:
        self.counts: Dict[int, int] = {}
        self.total = 0.0
        self.max = 0.0

    @property
    def n(self) -> int:
        """Values added: the sum of the counts (not a counter of its own, one addition
        less per value in the audit's hottest loop)."""
        return sum(self.counts.values())

    @staticmethod
    def bucket(value: float) -> int:
        if value < EXACT:
            return int(value) if value > 0 else 0
        return EXACT + int(math.log(value / EXACT) / _LOG_GAMMA)

    @staticmethod
    def value_of(bucket: int) -> float:
        if bucket < EXACT:
            return float(bucket)
        above: float = GAMMA ** (bucket - EXACT + 0.5)
        return EXACT * above

    def add(self, value: float) -> None:
        b = int(value) if 0 < value < EXACT else self.bucket(value)
        counts = self.counts
        counts[b] = counts.get(b, 0) + 1
        self.total += value
        if value > self.max:
            self.max = value

    def merge(self, other: LogHistogram) -> None:
        for b, c in other.counts.items():
            self.counts[b] = self.counts.get(b, 0) + c
        self.total += other.total
        self.max = max(self.max, other.max)

    def quantile(self, q: float) -> Optional[float]:
        """Nearest-rank quantile (``q`` in 0..1), or None when empty; never above the max."""
        n = self.n
        if not n:
            return None
        rank = max(1, math.ceil(q * n))
        seen = 0
        for b in sorted(self.counts):
            seen += self.counts[b]
            if seen >= rank:
                return min(self.value_of(b), self.max)
        return self.max

    def count_le(self, limit: float) -> int:
        """Values at or below ``limit`` (exact below EXACT, bucket-rounded above)."""
        top = self.bucket(limit)
        return sum(c for b, c in self.counts.items() if b <= top)

    def mean(self) -> Optional[float]:
        n = self.n
        return self.total / n if n else None
