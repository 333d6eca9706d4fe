"""Rates from two snapshots of cumulative counters: CPU cores, throttling, IO, NIC bytes.

    >>> before = CgroupSample(at=100.0, figures=read_v2(d))   # doctest: +SKIP
    >>> after = CgroupSample(at=110.0, figures=read_v2(d))    # doctest: +SKIP
    >>> cgroup_rates(before, after).cpu_cores                 # doctest: +SKIP
    15.2

Counters only grow while the cgroup (or interface) lives. A counter that went down means
it was reset (the cgroup was recreated, the NIC re-registered, a requeued job got a fresh
cgroup): that rate is unknown (None), never a negative or a zero. ``at`` is a monotonic
clock in seconds supplied by the caller, so tests need no sleeping.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional

from slurmiso.host.cgroup_figures import CgroupFigures
from slurmiso.host.node_figures import NicCounters


@dataclass(frozen=True)
class CgroupSample:
    """One reading of a job's cgroup and the monotonic time it was taken."""

    at: float
    figures: CgroupFigures


@dataclass(frozen=True)
class CgroupRates:
    """Per-second figures over the interval; ``throttled_fraction`` is of CFS periods."""

    seconds: float
    cpu_cores: Optional[float]
    throttled_fraction: Optional[float]
    read_bytes_per_s: Optional[float]
    write_bytes_per_s: Optional[float]
    read_ops_per_s: Optional[float]
    write_ops_per_s: Optional[float]

    @property
    def io_bytes_per_s(self) -> Optional[float]:
        """Read plus write; unknown if either is."""
        if self.read_bytes_per_s is None or self.write_bytes_per_s is None:
            return None
        return self.read_bytes_per_s + self.write_bytes_per_s


def delta(old: Optional[int], new: Optional[int]) -> Optional[int]:
    """``new - old`` for a cumulative counter; None if either is unknown or it went down."""
    if old is None or new is None or new < old:
        return None
    return new - old


def _per_second(old: Optional[int], new: Optional[int], seconds: float,
                scale: float = 1.0) -> Optional[float]:
    change = delta(old, new)
    return None if change is None else change / scale / seconds


def _throttled_fraction(before: CgroupFigures, after: CgroupFigures) -> Optional[float]:
    """Share of elapsed CFS periods in which the cgroup was throttled.

    No period elapsed (no quota set, or idle) with no throttling is a measured 0: the kernel
    throttles only inside a period. More throttled periods than periods is not a kernel figure.
    """
    periods = delta(before.cpu.nr_periods, after.cpu.nr_periods)
    throttled = delta(before.cpu.nr_throttled, after.cpu.nr_throttled)
    if periods is None or throttled is None or throttled > periods:
        return None
    return throttled / periods if periods else 0.0


def cgroup_rates(before: CgroupSample, after: CgroupSample) -> CgroupRates:
    """Rates between two samples of the same cgroup; all None if the clock did not advance."""
    seconds = after.at - before.at
    if seconds <= 0:
        return CgroupRates(seconds, None, None, None, None, None, None)
    old, new = before.figures, after.figures
    return CgroupRates(
        seconds=seconds,
        cpu_cores=_per_second(old.cpu.usage_usec, new.cpu.usage_usec, seconds, 1e6),
        throttled_fraction=_throttled_fraction(old, new),
        read_bytes_per_s=_per_second(old.io.rbytes, new.io.rbytes, seconds),
        write_bytes_per_s=_per_second(old.io.wbytes, new.io.wbytes, seconds),
        read_ops_per_s=_per_second(old.io.rios, new.io.rios, seconds),
        write_ops_per_s=_per_second(old.io.wios, new.io.wios, seconds),
    )


@dataclass(frozen=True)
class NicRates:
    """Bytes per second received and sent on one interface."""

    rx_bytes_per_s: Optional[float]
    tx_bytes_per_s: Optional[float]


def nic_rates(before: Dict[str, NicCounters], after: Dict[str, NicCounters],
              seconds: float) -> Dict[str, NicRates]:
    """Per interface present in both reads; a reset counter gives that direction None."""
    if seconds <= 0:
        return {name: NicRates(None, None) for name in after}
    out: Dict[str, NicRates] = {}
    for name in sorted(set(before) & set(after)):
        out[name] = NicRates(
            rx_bytes_per_s=_per_second(before[name].rx_bytes, after[name].rx_bytes, seconds),
            tx_bytes_per_s=_per_second(before[name].tx_bytes, after[name].tx_bytes, seconds),
        )
    return out
