"""The host rung's planning half: cgroup writes that rate-limit a training job, and their undo.

    >>> settings = read_settings(CgroupVersion.V2, V2Target(job_dir))       # doctest: +SKIP
    >>> plan = plan_limit(settings, LimitRequest(cpu_cores=4.0))            # doctest: +SKIP
    >>> plan.steps[0].apply                                                 # doctest: +SKIP
    (CgroupWrite(path='.../cpu.max', value='400000 100000'),)

The writes go through :mod:`slurmiso.host.cgroup_writer`.

A limit is planned only where the current value was read and can be written back exactly;
it only ever tightens (a knob already tighter is left alone, with a reason). The memory
limit Slurm sets (``memory.max``, ``memory.limit_in_bytes``) is never written: the writers
(cgroup_writer) accept only :data:`WRITABLE` file names, only under the Slurm-found cgroup
roots they were given, and never through a symlink.

cgroup v2: ``cpu.max``, ``cpu.weight``, ``io.weight`` (default and per-device overrides),
``io.max`` (rbps/wbps per device), ``memory.high``. cgroup v1 can do less:
``cpu.cfs_quota_us`` and ``cpu.shares``, and ``blkio.weight`` only with the CFQ/BFQ
scheduler. v1 has no ``memory.high`` (``memory.soft_limit_in_bytes`` acts only under global
pressure), and its ``blkio.throttle.*`` limits miss buffered writes (v1 writeback is not
charged to the cgroup), so neither is planned on v1.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Mapping, Optional, Tuple, Union

from slurmiso.host.cgroup_figures import CgroupVersion, V1Dirs
from slurmiso.host.kernel_text import parse_uint, read_text

#: The only cgroup files the host rung may write.
WRITABLE = frozenset({
    "cpu.max", "cpu.weight", "io.weight", "io.max", "memory.high",
    "cpu.cfs_quota_us", "cpu.shares", "blkio.weight",
})
#: The kernel refuses a CFS quota under 1 ms.
MIN_QUOTA_USEC = 1000
_DEVICE_RE = re.compile(r"^[0-9]{1,10}:[0-9]{1,10}$")


@dataclass(frozen=True)
class CgroupWrite:
    """One write of ``value`` to the cgroup file at absolute ``path``."""

    path: str
    value: str


@dataclass(frozen=True)
class LimitRequest:
    """How hard to limit; None leaves that knob alone.

    ``cpu_cores``: CFS quota in cores. ``cpu_weight`` and ``io_weight``: the v2 scale
    (1..10000, default 100), mapped to v1 shares/blkio.weight. ``io_bps``: read and write
    bytes/s per ``MAJ:MIN`` device (v2 only). ``memory_high_bytes``: v2 only.
    """

    cpu_cores: Optional[float] = None
    cpu_weight: Optional[int] = None
    io_weight: Optional[int] = None
    io_bps: Mapping[str, int] = field(default_factory=dict)
    memory_high_bytes: Optional[int] = None


@dataclass(frozen=True)
class Settings:
    """The raw text of each file the plan may write, as read before limiting."""

    version: CgroupVersion
    dirs: Mapping[str, str]
    raw: Mapping[str, Optional[str]]

    def path(self, name: str) -> Optional[str]:
        directory = self.dirs.get(name)
        return None if directory is None else os.path.join(directory, name)

    def text(self, name: str) -> Optional[str]:
        value = self.raw.get(name)
        return None if value is None else value.strip()


@dataclass(frozen=True)
class Step:
    """One knob: the writes that limit it and the writes that put it back exactly."""

    knob: str
    apply: Tuple[CgroupWrite, ...]
    restore: Tuple[CgroupWrite, ...]


@dataclass(frozen=True)
class Plan:
    """Steps in apply order, and a reason for every requested knob that was not planned."""

    steps: Tuple[Step, ...]
    skipped: Tuple[str, ...] = ()


def _dirs_for(version: CgroupVersion, target: Union[str, V1Dirs]) -> Dict[str, str]:
    if version is CgroupVersion.V2 and isinstance(target, str):
        return {name: target for name in ("cpu.max", "cpu.weight", "io.weight", "io.max",
                                           "memory.high")}
    if version is CgroupVersion.V1 and isinstance(target, V1Dirs):
        dirs = {}
        if target.cpu:
            dirs.update({n: target.cpu for n in ("cpu.cfs_quota_us", "cpu.shares",
                                                 "cpu.cfs_period_us")})
        if target.blkio:
            dirs["blkio.weight"] = target.blkio
        return dirs
    wanted = "a directory" if version is CgroupVersion.V2 else "V1Dirs"
    raise TypeError(f"cgroup {version.value} wants {wanted}, got {type(target).__name__}")


def read_settings(version: CgroupVersion, target: Union[str, V1Dirs]) -> Settings:
    """Read what the plan needs: a v2 job directory (str) or the v1 :class:`V1Dirs`."""
    dirs = _dirs_for(version, target)
    raw = {name: read_text(os.path.join(d, name)) for name, d in dirs.items()}
    return Settings(version=version, dirs=dirs, raw=raw)


# -- one planner per knob: (settings, request) -> Step, or a reason it is not planned ----

_Planned = Tuple[Optional[Step], Optional[str]]


def _single(knob: str, settings: Settings, new: int, render: Callable[[int], str],
            current: Optional[int]) -> _Planned:
    """A single-value knob: tighten only, restore the exact text read."""
    path, raw = settings.path(knob), settings.text(knob)
    if path is None or raw is None:
        return None, f"{knob}: not readable, so not written (no exact undo)"
    if current is not None and current <= new:
        return None, f"{knob}: already {raw}, at or below {render(new)}"
    return Step(knob, (CgroupWrite(path, render(new)),), (CgroupWrite(path, raw),)), None


def _max_or_uint(text: Optional[str]) -> Tuple[bool, Optional[int]]:
    """(ok, value) for ``max`` (no limit: value None) or a u64."""
    if text == "max":
        return True, None
    value = None if text is None else parse_uint(text)
    return value is not None, value


def _plan_cpu_max(settings: Settings, req: LimitRequest) -> _Planned:
    raw = settings.text("cpu.max")
    parts = (raw or "").split()
    ok, quota = _max_or_uint(parts[0] if len(parts) == 2 else None)
    period = parse_uint(parts[1]) if len(parts) == 2 else None
    if not ok or not period or req.cpu_cores is None:
        return None, f"cpu.max: unreadable ({raw!r}), so not written (no exact undo)"
    new = max(MIN_QUOTA_USEC, int(req.cpu_cores * period))
    return _single("cpu.max", settings, new, lambda q: f"{q} {period}", quota)


def _plan_cfs_quota(settings: Settings, req: LimitRequest) -> _Planned:
    raw, period = settings.text("cpu.cfs_quota_us"), settings.text("cpu.cfs_period_us")
    period_us = parse_uint(period) if period else None
    if raw is None or not period_us or req.cpu_cores is None:
        return None, "cpu.cfs_quota_us: quota or period unreadable, so not written"
    quota = None if raw == "-1" else parse_uint(raw)
    if raw != "-1" and quota is None:
        return None, f"cpu.cfs_quota_us: unreadable ({raw!r}), so not written"
    new = max(MIN_QUOTA_USEC, int(req.cpu_cores * period_us))
    return _single("cpu.cfs_quota_us", settings, new, str, quota)


def _plan_weight(knob: str, scale: Callable[[int], int]
                 ) -> Callable[[Settings, LimitRequest], _Planned]:
    """A weight knob; the request is on the v2 scale, ``scale`` maps it to ``knob``'s."""
    def plan(settings: Settings, req: LimitRequest) -> _Planned:
        wanted = req.cpu_weight if knob in ("cpu.weight", "cpu.shares") else req.io_weight
        if wanted is None or not 1 <= wanted <= 10000:
            return None, f"{knob}: weight {wanted} outside 1..10000, not written"
        return _single(knob, settings, scale(wanted), str,
                       parse_uint(settings.text(knob) or ""))
    return plan


def _plan_io_weight(settings: Settings, req: LimitRequest) -> _Planned:
    """``default W`` plus every per-device override above W; undo writes the old lines."""
    path, raw, new = settings.path("io.weight"), settings.text("io.weight"), req.io_weight
    lines = [line.split() for line in (raw or "").splitlines()]
    weights = {p[0]: parse_uint(p[1]) for p in lines if len(p) == 2}
    default = weights.pop("default", None)
    if new is None or not 1 <= new <= 10000:
        return None, f"io.weight: weight {new} outside 1..10000, not written"
    if path is None or default is None \
            or any(v is None or not _DEVICE_RE.match(k) for k, v in weights.items()):
        return None, f"io.weight: unreadable ({raw!r}), so not written (no exact undo)"
    keys = (["default"] if default > new else []) + sorted(
        k for k, v in weights.items() if v is not None and v > new)
    if not keys:
        return None, f"io.weight: already at or below {new}"
    old = {"default": default, **weights}
    return Step("io.weight", tuple(CgroupWrite(path, f"{k} {new}") for k in keys),
                tuple(CgroupWrite(path, f"{k} {old[k]}") for k in keys)), None


def _io_max_line(raw: str, device: str) -> Optional[Dict[str, str]]:
    """The current ``rbps``/``wbps`` of ``device`` (``max`` when it has no line); None if bad."""
    for line in raw.splitlines():
        parts = line.split()
        if parts and parts[0] == device:
            fields = dict(p.partition("=")[::2] for p in parts[1:])
            out = {k: fields.get(k, "") for k in ("rbps", "wbps")}
            return out if all(_max_or_uint(v)[0] for v in out.values()) else None
    return {"rbps": "max", "wbps": "max"}


def _plan_io_max(settings: Settings, req: LimitRequest) -> _Planned:
    path, raw = settings.path("io.max"), settings.text("io.max")
    if path is None or raw is None:
        return None, "io.max: not readable, so not written (no exact undo)"
    apply: List[CgroupWrite] = []
    restore: List[CgroupWrite] = []
    for device, bps in sorted(req.io_bps.items()):
        old = _io_max_line(raw, device) if _DEVICE_RE.match(device) else None
        if old is None:
            return None, f"io.max: device {device!r} or its line unreadable"
        new = {k: str(min(bps, _max_or_uint(v)[1] or bps)) for k, v in old.items()}
        if new != old:
            apply.append(CgroupWrite(path, f"{device} rbps={new['rbps']} wbps={new['wbps']}"))
            restore.append(CgroupWrite(path, f"{device} rbps={old['rbps']} wbps={old['wbps']}"))
    if not apply:
        return None, "io.max: already at or below the requested bandwidth"
    return Step("io.max", tuple(apply), tuple(restore)), None


def _plan_memory_high(settings: Settings, req: LimitRequest) -> _Planned:
    raw = settings.text("memory.high")
    ok, current = _max_or_uint(raw)
    if not ok or req.memory_high_bytes is None or req.memory_high_bytes <= 0:
        return None, f"memory.high: unreadable ({raw!r}) or bad request, so not written"
    return _single("memory.high", settings, req.memory_high_bytes, str, current)


def _v1_shares(weight: int) -> int:
    """v2 weight (default 100) to v1 cpu.shares (default 1024), at least 2."""
    return max(2, round(weight * 1024 / 100))


def _v1_blkio(weight: int) -> int:
    """v2 io.weight (default 100) to v1 blkio.weight (default 500, range 10..1000)."""
    return min(1000, max(10, weight * 5))


def _wants(req: LimitRequest) -> Dict[str, bool]:
    return {"cpu": req.cpu_cores is not None, "cpu_weight": req.cpu_weight is not None,
            "io_weight": req.io_weight is not None, "io_bps": bool(req.io_bps),
            "memory_high": req.memory_high_bytes is not None}


_V2_PLANNERS: Tuple[Tuple[str, Callable[[Settings, LimitRequest], _Planned]], ...] = (
    ("cpu", _plan_cpu_max),
    ("cpu_weight", _plan_weight("cpu.weight", lambda w: w)),
    ("io_weight", _plan_io_weight),
    ("io_bps", _plan_io_max),
    ("memory_high", _plan_memory_high),
)
_V1_PLANNERS: Tuple[Tuple[str, Callable[[Settings, LimitRequest], _Planned]], ...] = (
    ("cpu", _plan_cfs_quota),
    ("cpu_weight", _plan_weight("cpu.shares", _v1_shares)),
    ("io_weight", _plan_weight("blkio.weight", _v1_blkio)),
)
_V1_CANNOT = {
    "io_bps": "io bandwidth: not on cgroup v1 (blkio.throttle misses buffered writeback)",
    "memory_high": "memory.high: cgroup v1 has none (memory.limit_in_bytes is Slurm's)",
}


def plan_limit(settings: Settings, request: LimitRequest) -> Plan:
    """The steps that limit one job as asked, each with its exact undo; pure."""
    planners = _V2_PLANNERS if settings.version is CgroupVersion.V2 else _V1_PLANNERS
    wants = _wants(request)
    steps: List[Step] = []
    skipped: List[str] = []
    for want, planner in planners:
        if not wants[want]:
            continue
        step, why = planner(settings, request)
        if step is not None:
            steps.append(step)
        if why is not None:
            skipped.append(why)
    if settings.version is CgroupVersion.V1:
        skipped += [why for want, why in _V1_CANNOT.items() if wants[want]]
    return Plan(steps=tuple(steps), skipped=tuple(skipped))
