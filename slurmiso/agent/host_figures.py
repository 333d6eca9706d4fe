"""The node agent's host view: each job's cgroup figures and the node's pressure and NICs, as
Prometheus metrics (issue 36).

    >>> report = gather_host({}, "n1", cgroup_root="tests/fixtures/host/slurm-v2")
    >>> sorted(j.job for j in report.jobs)
    ['4242', '4243']

Each job's cgroup is found where Slurm puts it (:mod:`slurmiso.host.job_cgroups`), never where
anything a user wrote points; its figures are read by :mod:`slurmiso.host.cgroup_figures`,
which treats the files as hostile. The class comes from the hooks' record, ``unrecorded`` for a
job without one (a CPU-only job still takes the node's CPUs). A figure that could not be read
has no sample and a ``slurmiso_job_host_figure_unknown`` line with the reason: unknown is never
calm. Series names: :mod:`slurmiso.exposition.host_series`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

from slurmiso.errors import SlurmisoError
from slurmiso.exposition import host_series as h
from slurmiso.exposition.job_series import CLASS_UNRECORDED
from slurmiso.host.cgroup_figures import (
    NO_PRESSURE,
    CgroupFigures,
    CgroupVersion,
    PressureFigures,
    read_v1,
    read_v2,
)
from slurmiso.host.job_cgroups import JobCgroup, job_cgroups
from slurmiso.host.kernel_text import Psi, PsiLine
from slurmiso.host.node_figures import (
    NicCounters,
    read_link_speeds,
    read_net_dev,
    read_node_pressure,
)
from slurmiso.sluid import is_sluid

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class JobHost:
    """One job's figures (None: no cgroup of it could be found, ``reason`` says why)."""

    job: str
    job_class: str
    figures: Optional[CgroupFigures]
    reason: str = ""


@dataclass
class HostReport:
    node: str
    jobs: List[JobHost] = field(default_factory=list)
    pressure: PressureFigures = NO_PRESSURE
    nics: Dict[str, NicCounters] = field(default_factory=dict)
    speeds: Dict[str, Optional[float]] = field(default_factory=dict)


def _read(cg: JobCgroup) -> Optional[CgroupFigures]:
    if cg.v2 is not None:
        return read_v2(cg.v2)
    return read_v1(cg.v1) if cg.v1 is not None else None


def record_sluids(records: Dict[str, Any]) -> Dict[str, str]:
    """SLUID -> job id, from the records (26.05 names job cgroups by SLUID)."""
    return {str(rec.fence.get("sluid")): str(job) for job, rec in records.items()
            if is_sluid(str(getattr(rec, "fence", {}).get("sluid") or ""))}


def gather_host(records: Dict[str, Any], node: str, cgroup_root: str = "/sys/fs/cgroup",
                proc_root: str = "/proc", sys_root: str = "/sys") -> HostReport:
    """Every job Slurm made a cgroup for on ``node`` and every recorded job, with its figures;
    the node's PSI and NIC counters beside them."""
    found = job_cgroups(cgroup_root, node, record_sluids(records))
    report = HostReport(node)
    for job in sorted(set(found) | {str(j) for j in records}, key=lambda j: (len(j), j)):
        rec = records.get(job)
        cls = rec.job_class if rec is not None else CLASS_UNRECORDED
        cg = found.get(job)
        if cg is not None and rec is not None and min(cg.uid, rec.uid) >= 0 \
                and cg.uid != rec.uid:
            cg = None  # filed under another uid than the record's: not this job's to read
        figures = _read(cg) if cg is not None else None
        report.jobs.append(JobHost(job, cls, figures, "" if figures is not None else h.R_NO_CGROUP))
    report.pressure = read_node_pressure(proc_root)
    report.nics = read_net_dev(proc_root)
    report.speeds = read_link_speeds(sys_root, [n for n in report.nics if n != "lo"])
    return report


def _psi(p: Optional[Psi], kind: str) -> Optional[PsiLine]:
    if p is None:
        return None
    return p.some if kind == "some" else p.full


_Getter = Callable[[CgroupFigures], Optional[float]]
#: (figure, series, extra labels, value from the figures, scale, absent on cgroup v1)
_FIGURES: List[Tuple[str, str, Tuple[Tuple[str, str], ...], _Getter, float, bool]] = [
    ("cpu", h.M_JOB_CPU, (), lambda f: f.cpu.usage_usec, 1e-6, False),
    ("cpu_throttled", h.M_JOB_CPU_THROTTLED, (), lambda f: f.cpu.throttled_usec, 1e-6, False),
    ("cpu_periods", h.M_JOB_CPU_PERIODS, (), lambda f: f.cpu.nr_periods, 1.0, False),
    ("cpu_throttled_periods", h.M_JOB_CPU_THROTTLED_PERIODS, (),
     lambda f: f.cpu.nr_throttled, 1.0, False),
    ("memory_current", h.M_JOB_MEM_CURRENT, (), lambda f: f.memory.current_bytes, 1.0, False),
    ("memory_peak", h.M_JOB_MEM_PEAK, (), lambda f: f.memory.peak_bytes, 1.0, False),
    ("memory_oom", h.M_JOB_MEM_EVENTS, ((h.L_EVENT, "oom"),), lambda f: f.memory.oom, 1.0,
     True),
    ("memory_oom_kill", h.M_JOB_MEM_EVENTS, ((h.L_EVENT, "oom_kill"),),
     lambda f: f.memory.oom_kill, 1.0, False),
    ("memory_high", h.M_JOB_MEM_EVENTS, ((h.L_EVENT, "high"),), lambda f: f.memory.high, 1.0,
     True),
    ("memory_max", h.M_JOB_MEM_EVENTS, ((h.L_EVENT, "max"),), lambda f: f.memory.max_events,
     1.0, False),
    ("io_read_bytes", h.M_JOB_IO_BYTES, ((h.L_DIRECTION, "read"),), lambda f: f.io.rbytes, 1.0,
     False),
    ("io_write_bytes", h.M_JOB_IO_BYTES, ((h.L_DIRECTION, "write"),), lambda f: f.io.wbytes,
     1.0, False),
    ("io_read_ops", h.M_JOB_IO_OPS, ((h.L_DIRECTION, "read"),), lambda f: f.io.rios, 1.0,
     False),
    ("io_write_ops", h.M_JOB_IO_OPS, ((h.L_DIRECTION, "write"),), lambda f: f.io.wios, 1.0,
     False),
]


def _psi_lines(p: PressureFigures) -> Iterator[Tuple[str, str, Optional[PsiLine]]]:
    for res in h.RESOURCES:
        for kind in ("some", "full"):
            yield res, kind, _psi(getattr(p, res), kind)


class HostCollector:
    """client_python custom collector: every scrape reads the cgroups and /proc afresh."""

    def __init__(self, read: Callable[[], HostReport], node: str = "") -> None:
        self.read = read
        self.node = node

    def describe(self) -> List[Any]:
        return []  # do not read the node when the collector is registered

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        try:
            report: Optional[HostReport] = self.read()
        except (SlurmisoError, OSError) as exc:
            log.warning("agent: cannot read the host figures of node %s: %s", self.node, exc)
            report = None
        up = GaugeMetricFamily(h.M_HOST_UP, "1 if the jobs' host figures could be read",
                               labels=[h.L_NODE])
        up.add_metric([self.node], 0.0 if report is None else 1.0)
        yield up
        if report is None:
            return
        yield from self._jobs(report, CounterMetricFamily, GaugeMetricFamily)
        yield from self._node(report, CounterMetricFamily, GaugeMetricFamily)

    def _jobs(self, report: HostReport, counter: Any, gauge: Any) -> Iterator[Any]:
        base = [h.L_JOB, h.L_CLASS, h.L_NODE]
        fams: Dict[str, Any] = {}
        for _fig, name, extra, _get, _scale, _v1 in _FIGURES:
            if name not in fams:
                kind = gauge if name in (h.M_JOB_MEM_CURRENT, h.M_JOB_MEM_PEAK) else counter
                fams[name] = kind(name, _HELP[name], labels=base + [k for k, _ in extra])
        psi_labels = base + [h.L_RESOURCE, h.L_KIND]
        psi = gauge(h.M_JOB_PSI, _HELP[h.M_JOB_PSI], labels=psi_labels)
        stalled = counter(h.M_JOB_PSI_STALLED, _HELP[h.M_JOB_PSI_STALLED], labels=psi_labels)
        unknown = gauge(h.M_JOB_HOST_UNKNOWN, _HELP[h.M_JOB_HOST_UNKNOWN],
                        labels=base + [h.L_FIGURE, h.L_REASON])
        for j in report.jobs:
            who = [j.job, j.job_class, report.node]
            f = j.figures
            v1 = f is not None and f.version is CgroupVersion.V1
            for fig, name, extra, get, scale, v1_lacks in _FIGURES:
                value = get(f) if f is not None else None
                if value is not None:
                    fams[name].add_metric(who + [v for _, v in extra], value * scale)
                else:
                    unknown.add_metric(who + [fig, _why(j, v1 and v1_lacks)], 1.0)
            for res, kind, line in _psi_lines(f.pressure if f is not None else NO_PRESSURE):
                if line is None:
                    unknown.add_metric(who + [f"pressure_{res}_{kind}", _why(j, v1)], 1.0)
                    continue
                psi.add_metric(who + [res, kind], line.avg10 / 100.0)
                stalled.add_metric(who + [res, kind], line.total_usec * 1e-6)
        yield from fams.values()
        yield from (psi, stalled, unknown)

    def _node(self, report: HostReport, counter: Any, gauge: Any) -> Iterator[Any]:
        labels = [h.L_NODE, h.L_RESOURCE, h.L_KIND]
        psi = gauge(h.M_NODE_PSI, _HELP[h.M_NODE_PSI], labels=labels)
        stalled = counter(h.M_NODE_PSI_STALLED, _HELP[h.M_NODE_PSI_STALLED], labels=labels)
        for res, kind, line in _psi_lines(report.pressure):
            if line is not None:
                psi.add_metric([report.node, res, kind], line.avg10 / 100.0)
                stalled.add_metric([report.node, res, kind], line.total_usec * 1e-6)
        net = counter(h.M_NODE_NET_BYTES, _HELP[h.M_NODE_NET_BYTES],
                      labels=[h.L_NODE, h.L_DEVICE, h.L_DIRECTION])
        for dev, c in sorted(report.nics.items()):
            net.add_metric([report.node, dev, "receive"], float(c.rx_bytes))
            net.add_metric([report.node, dev, "transmit"], float(c.tx_bytes))
        speed = gauge(h.M_NODE_NET_SPEED, _HELP[h.M_NODE_NET_SPEED],
                      labels=[h.L_NODE, h.L_DEVICE])
        for dev, bps in sorted(report.speeds.items()):
            if bps is not None:
                speed.add_metric([report.node, dev], bps)
        yield from (psi, stalled, net, speed)


def _why(j: JobHost, v1_lacks: bool) -> str:
    if j.figures is None:
        return j.reason or h.R_NO_CGROUP
    return h.R_CGROUP_V1 if v1_lacks else h.R_UNREADABLE


_HELP = {
    h.M_JOB_CPU: "CPU time the job's cgroup used",
    h.M_JOB_CPU_THROTTLED: "Time the job's cgroup was throttled by its CPU quota",
    h.M_JOB_CPU_PERIODS: "CFS bandwidth periods the job's cgroup was runnable in",
    h.M_JOB_CPU_THROTTLED_PERIODS: "CFS bandwidth periods the job's cgroup was throttled in",
    h.M_JOB_MEM_CURRENT: "Memory the job's cgroup holds now",
    h.M_JOB_MEM_PEAK: "Most memory the job's cgroup held",
    h.M_JOB_MEM_EVENTS: "Memory events of the job's cgroup (memory.events; v1: oom_kill, "
                        "failcnt as max)",
    h.M_JOB_IO_BYTES: "Block IO bytes of the job's cgroup, all devices",
    h.M_JOB_IO_OPS: "Block IO operations of the job's cgroup, all devices",
    h.M_JOB_PSI: "Share of the last 10 s the job's tasks stalled on the resource (PSI)",
    h.M_JOB_PSI_STALLED: "Time the job's tasks stalled on the resource (PSI total)",
    h.M_JOB_HOST_UNKNOWN: "1 per host figure of a job that could not be read, with why",
    h.M_NODE_PSI: "Share of the last 10 s the node's tasks stalled on the resource (PSI)",
    h.M_NODE_PSI_STALLED: "Time the node's tasks stalled on the resource (PSI total)",
    h.M_NODE_NET_BYTES: "Bytes through a network interface (no per-job counter exists)",
    h.M_NODE_NET_SPEED: "Link speed of a network interface",
}
