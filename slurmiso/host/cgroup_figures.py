"""One job's host figures, read from its own cgroup directory (v2) or directories (v1).

    >>> figs = read_v2("tests/fixtures/host/v2/job_4242")
    >>> figs.cpu.usage_usec, figs.io.wbytes, figs.pressure.cpu.some.avg10
    (8420000123, 1073857024, 23.51)

The directory comes from the caller, who found it through Slurm (the job's step cgroup),
never from anything the job's user wrote. The files are treated as hostile: a missing,
malformed or out-of-range figure is ``None`` (unknown), never 0. cgroup v1 has no pressure
stall information per cgroup, no ``memory.events`` and no ``memory.high``: those figures
are ``None`` on v1 whatever the job does. Formats: Documentation/admin-guide/cgroup-v2.rst,
cgroup-v1/memory.rst, cgroup-v1/blkio-controller.rst, accounting/psi.rst.
"""

from __future__ import annotations

import enum
import os
import re
from dataclasses import dataclass
from typing import Dict, Optional

from slurmiso.host.kernel_text import (
    Psi,
    parse_flat_keyed,
    parse_nested_keyed,
    parse_psi,
    parse_single,
    parse_uint,
    read_text,
)

_BLKIO_OPS = ("Read", "Write", "Sync", "Async", "Discard", "Total")
_DEVICE_RE = re.compile(r"^[0-9]{1,10}:[0-9]{1,10}$")


class CgroupVersion(enum.Enum):
    """Which cgroup hierarchy a node runs; decides which files exist and what they mean."""

    V1 = "v1"
    V2 = "v2"


@dataclass(frozen=True)
class CpuFigures:
    """Cumulative CPU counters in µs; ``nr_*`` count CFS bandwidth periods."""

    usage_usec: Optional[int]
    throttled_usec: Optional[int]
    nr_periods: Optional[int]
    nr_throttled: Optional[int]


@dataclass(frozen=True)
class MemoryFigures:
    """Bytes now and at peak; event counters as memory.events names them (v2).

    On v1 ``max_events`` is ``memory.failcnt`` (times usage hit the limit), ``oom`` and
    ``high`` are None (v1 counts neither).
    """

    current_bytes: Optional[int]
    peak_bytes: Optional[int]
    oom: Optional[int]
    oom_kill: Optional[int]
    high: Optional[int]
    max_events: Optional[int]


@dataclass(frozen=True)
class IoFigures:
    """Cumulative block IO summed over every device the cgroup touched."""

    rbytes: Optional[int]
    wbytes: Optional[int]
    rios: Optional[int]
    wios: Optional[int]


@dataclass(frozen=True)
class PressureFigures:
    """Pressure stall information per resource; None where the kernel gives none (v1)."""

    cpu: Optional[Psi]
    memory: Optional[Psi]
    io: Optional[Psi]


NO_PRESSURE = PressureFigures(cpu=None, memory=None, io=None)


@dataclass(frozen=True)
class CgroupFigures:
    """Everything read from one job's cgroup at one instant."""

    version: CgroupVersion
    cpu: CpuFigures
    memory: MemoryFigures
    io: IoFigures
    pressure: PressureFigures


@dataclass(frozen=True)
class V1Dirs:
    """The job's directory in each v1 controller hierarchy (Slurm's ``slurm/uid_U/job_J``)."""

    cpu: Optional[str] = None
    cpuacct: Optional[str] = None
    memory: Optional[str] = None
    blkio: Optional[str] = None


def _read(directory: Optional[str], name: str) -> Optional[str]:
    return None if directory is None else read_text(os.path.join(directory, name))


def _sum_io_stat(text: Optional[str]) -> IoFigures:
    """Sum io.stat over devices; a device line lacking a key makes that sum unknown."""
    parsed = parse_nested_keyed(text)
    if parsed is None:
        return IoFigures(None, None, None, None)
    devices = parsed.values()
    sums: Dict[str, Optional[int]] = {}
    for key in ("rbytes", "wbytes", "rios", "wios"):
        values = [d.get(key) for d in devices]
        sums[key] = None if any(v is None for v in values) else sum(v or 0 for v in values)
    return IoFigures(sums["rbytes"], sums["wbytes"], sums["rios"], sums["wios"])


def read_v2(directory: str) -> CgroupFigures:
    """Read a cgroup v2 directory: cpu.stat, memory.*, io.stat and the three pressure files."""
    cpu = parse_flat_keyed(_read(directory, "cpu.stat"))
    events = parse_flat_keyed(_read(directory, "memory.events"))
    return CgroupFigures(
        version=CgroupVersion.V2,
        cpu=CpuFigures(
            usage_usec=cpu.get("usage_usec"),
            throttled_usec=cpu.get("throttled_usec"),
            nr_periods=cpu.get("nr_periods"),
            nr_throttled=cpu.get("nr_throttled"),
        ),
        memory=MemoryFigures(
            current_bytes=parse_single(_read(directory, "memory.current")),
            peak_bytes=parse_single(_read(directory, "memory.peak")),  # Linux >= 5.19
            oom=events.get("oom"),
            oom_kill=events.get("oom_kill"),
            high=events.get("high"),
            max_events=events.get("max"),
        ),
        io=_sum_io_stat(_read(directory, "io.stat")),
        pressure=PressureFigures(
            cpu=parse_psi(_read(directory, "cpu.pressure")),
            memory=parse_psi(_read(directory, "memory.pressure")),
            io=parse_psi(_read(directory, "io.pressure")),
        ),
    )


def _ns_to_us(value: Optional[int]) -> Optional[int]:
    return None if value is None else value // 1000


def _sum_blkio(text: Optional[str]) -> tuple[Optional[int], Optional[int]]:
    """(read, write) summed over devices from a blkio.throttle.* file.

    Lines are ``MAJ:MIN Read|Write|Sync|Async|Discard|Total N`` and a last ``Total N``
    (blkio-controller.rst). A device missing its Read or Write line makes the sum unknown.
    """
    if text is None:
        return None, None
    per_device: Dict[str, Dict[str, Optional[int]]] = {}
    for line in text.splitlines():
        parts = line.split()
        if not parts or (len(parts) == 2 and parts[0] == "Total"):
            continue
        if len(parts) != 3 or parts[1] not in _BLKIO_OPS or not _DEVICE_RE.match(parts[0]):
            return None, None  # not the kernel's file: a sum without this line would under-read
        if parts[1] in ("Read", "Write"):
            per_device.setdefault(parts[0], {})[parts[1]] = parse_uint(parts[2])
    sums: list[Optional[int]] = []
    for op in ("Read", "Write"):
        values = [ops.get(op) for ops in per_device.values()]
        sums.append(None if any(v is None for v in values) else sum(v or 0 for v in values))
    return sums[0], sums[1]


def read_v1(dirs: V1Dirs) -> CgroupFigures:
    """Read the v1 equivalents; pressure, ``oom`` and ``high`` events stay None (v1 has none)."""
    cpu_stat = parse_flat_keyed(_read(dirs.cpu, "cpu.stat"))
    oom_control = parse_flat_keyed(_read(dirs.memory, "memory.oom_control"))
    rbytes, wbytes = _sum_blkio(_read(dirs.blkio, "blkio.throttle.io_service_bytes"))
    rios, wios = _sum_blkio(_read(dirs.blkio, "blkio.throttle.io_serviced"))
    return CgroupFigures(
        version=CgroupVersion.V1,
        cpu=CpuFigures(
            usage_usec=_ns_to_us(parse_single(_read(dirs.cpuacct, "cpuacct.usage"))),
            throttled_usec=_ns_to_us(cpu_stat.get("throttled_time")),
            nr_periods=cpu_stat.get("nr_periods"),
            nr_throttled=cpu_stat.get("nr_throttled"),
        ),
        memory=MemoryFigures(
            current_bytes=parse_single(_read(dirs.memory, "memory.usage_in_bytes")),
            peak_bytes=parse_single(_read(dirs.memory, "memory.max_usage_in_bytes")),
            oom=None,
            oom_kill=oom_control.get("oom_kill"),  # Linux >= 4.13
            high=None,
            max_events=parse_single(_read(dirs.memory, "memory.failcnt")),
        ),
        io=IoFigures(rbytes, wbytes, rios, wios),
        pressure=NO_PRESSURE,
    )


def detect_version(mount: str) -> Optional[CgroupVersion]:
    """The hierarchy mounted at ``mount``: v2 has ``cgroup.controllers`` at its root."""
    if os.path.isfile(os.path.join(mount, "cgroup.controllers")):
        return CgroupVersion.V2
    if any(os.path.isdir(os.path.join(mount, c)) for c in ("cpu", "cpuacct", "memory")):
        return CgroupVersion.V1
    return None
