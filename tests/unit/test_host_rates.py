"""Rates from two snapshots: cores, throttled share, IO and NIC bytes; resets are unknown."""

from __future__ import annotations

import dataclasses
import os

from slurmiso.host.cgroup_figures import CgroupFigures, CpuFigures, IoFigures, read_v2
from slurmiso.host.node_figures import NicCounters
from slurmiso.host.rates import CgroupSample, cgroup_rates, delta, nic_rates

FIX = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "fixtures",
                   "host")
BASE = read_v2(os.path.join(FIX, "v2", "job_4242"))


def _later(cpu_usec: int, periods: int, throttled: int, wbytes: int) -> CgroupFigures:
    cpu = dataclasses.replace(BASE.cpu, usage_usec=cpu_usec, nr_periods=periods,
                              nr_throttled=throttled)
    io = dataclasses.replace(BASE.io, wbytes=wbytes)
    return dataclasses.replace(BASE, cpu=cpu, io=io)


def test_cores_throttling_and_io_over_ten_seconds() -> None:
    assert BASE.cpu.usage_usec is not None and BASE.io.wbytes is not None
    after = _later(BASE.cpu.usage_usec + 152_000_000, 5100, 1300, BASE.io.wbytes + 10 * 2**20)
    rates = cgroup_rates(CgroupSample(100.0, BASE), CgroupSample(110.0, after))
    assert rates.cpu_cores is not None and abs(rates.cpu_cores - 15.2) < 1e-9
    assert rates.throttled_fraction == 0.5  # 50 of 100 periods
    assert rates.write_bytes_per_s == 2**20
    assert rates.read_bytes_per_s == 0.0  # known and unchanged: a measured zero
    assert rates.io_bytes_per_s == 2**20


def test_counter_reset_is_unknown_not_negative() -> None:
    """A requeued job's fresh cgroup restarts its counters: no rate, never a negative."""
    after = _later(5, 1, 0, 10)
    rates = cgroup_rates(CgroupSample(100.0, BASE), CgroupSample(110.0, after))
    assert rates.cpu_cores is None
    assert rates.throttled_fraction is None
    assert rates.write_bytes_per_s is None and rates.io_bytes_per_s is None


def test_unknown_figure_gives_unknown_rate() -> None:
    blank = dataclasses.replace(BASE, cpu=CpuFigures(None, None, None, None),
                                io=IoFigures(None, None, None, None))
    rates = cgroup_rates(CgroupSample(0.0, blank), CgroupSample(10.0, BASE))
    assert rates.cpu_cores is None and rates.read_ops_per_s is None
    assert rates.throttled_fraction is None


def test_clock_not_advancing_gives_nothing() -> None:
    rates = cgroup_rates(CgroupSample(10.0, BASE), CgroupSample(10.0, BASE))
    assert rates.cpu_cores is None and rates.write_bytes_per_s is None


def test_no_quota_no_periods_is_zero_throttling() -> None:
    rates = cgroup_rates(CgroupSample(0.0, BASE), CgroupSample(1.0, BASE))
    assert rates.throttled_fraction == 0.0


def test_more_throttled_than_periods_is_unknown() -> None:
    after = _later(BASE.cpu.usage_usec or 0, 5001, 1260, BASE.io.wbytes or 0)
    rates = cgroup_rates(CgroupSample(0.0, BASE), CgroupSample(1.0, after))
    assert rates.throttled_fraction is None


def test_delta() -> None:
    assert delta(5, 7) == 2 and delta(7, 5) is None and delta(None, 1) is None


def test_nic_rates_and_reset() -> None:
    before = {"eth0": NicCounters(1000, 2000), "ib0": NicCounters(10, 10)}
    after = {"eth0": NicCounters(3000, 1000), "new0": NicCounters(5, 5)}
    rates = nic_rates(before, after, 2.0)
    assert set(rates) == {"eth0"}  # interfaces seen once have no rate
    assert rates["eth0"].rx_bytes_per_s == 1000.0
    assert rates["eth0"].tx_bytes_per_s is None  # counter went down
    assert nic_rates(before, after, 0.0)["eth0"].rx_bytes_per_s is None
