"""The node agent's GPU view: a node's GPUs, MIG instances and the jobs holding them, as
Prometheus metrics.

:func:`gather_node` reads the GPU backend (NVML or simulated) and the node's slurmiso records
into a :class:`NodeReport`; :class:`NodeCollector` renders a fresh report on every scrape
(a client_python custom collector: no state kept between scrapes, so a metric is never older
than the scrape). The collector takes its backend and records through injected callables and
is registered on a registry the caller builds, so tests need no global state.

Two families of names: slurmiso's own (read back by the monitor) and, so existing Grafana
dashboards work, the DCGM exporter's (``DCGM_FI_DEV_FB_USED``/``FREE`` in MiB,
``DCGM_FI_PROF_SM_ACTIVE`` as a ratio where SM activity is measured, ``DCGM_FI_DEV_GPU_UTIL``
in percent, with ``gpu``, ``UUID``, ``device``, ``modelName``, ``Hostname``, ``GPU_I_ID``,
``GPU_I_PROFILE`` labels). Job ids are labels only with ``job_labels`` (``hpc_job`` on the
DCGM names): one series per job and GPU is a cardinality cost a site opts into.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Dict, Iterator, List, Optional, Set, Tuple

from slurmiso.errors import SlurmisoError
from slurmiso.exposition import gpu_series as t
from slurmiso.exposition import job_series as sig
from slurmiso.state.record import JobRecord

if TYPE_CHECKING:
    from slurmiso.config.model import Config

log = logging.getLogger(__name__)


@dataclass
class DeviceRow:
    """One whole GPU (``gi`` "") or one MIG instance, with the jobs holding it."""

    gpu: int
    gi: str = ""
    profile: str = ""
    uuid: str = ""
    model: str = ""
    memory_used_mb: int = 0
    memory_total_mb: int = 0
    sm_active: Optional[float] = None  # ratio 0..1, as DCGM's PROF fields; None: unknown
    gr_active: Optional[float] = None
    processes: int = 0
    jobs: Tuple[str, ...] = ()
    classes: Tuple[str, ...] = ()
    sm_source: str = ""  # "gpm", "dcgm" or "" (SM not measured)


@dataclass
class NodeReport:
    node: str
    collected: float
    rows: List[DeviceRow] = field(default_factory=list)
    #: (job, class, gpu, gi): records and processes (agent/gpu_owners.py)
    attribution: Set[Tuple[str, str, int, str]] = field(default_factory=set)
    #: (job, class, gpu, gi) -> MiB its processes use there; None: the driver would not say
    memory: Dict[Tuple[str, str, int, str], Optional[int]] = field(default_factory=dict)
    #: (job, class, gpu, gi) -> its processes' SM share 0..1; None: unknown (MIG, driver)
    sm: Dict[Tuple[str, str, int, str], Optional[float]] = field(default_factory=dict)


def gather_node(
    cfg: Optional[Config], node: str, backend: Any = None,
    records: Optional[Dict[str, JobRecord]] = None,
    clock: Callable[[], float] = time.time, proc: str = "/proc",
) -> NodeReport:
    """Read ``node``'s GPUs (``backend``, else the configured one) and job records (``records``,
    else its state dir). Raises :class:`SlurmisoError` when the GPUs cannot be read."""
    if records is None:
        from slurmiso.state import NodeState

        if cfg is None:
            raise SlurmisoError(f"{node}: reading its job records needs the config")
        records = NodeState(cfg.paths.state_dir_for(node)).jobs()
    owners = _owners(records)
    own = backend is None
    if own:
        from slurmiso.gpu import open_backend

        if cfg is None:
            raise SlurmisoError(f"{node}: opening its GPUs needs the config")
        backend = open_backend(cfg.gpu.backend, cfg.gpu.sim_state, node)
    try:
        report = NodeReport(node, clock())
        procs = backend.processes()
        instances = backend.instances()
        for dev in backend.devices():
            tel = backend.telemetry(dev.index)
            jobs = owners.get(("gpu", str(dev.index)), set()) | owners.get(("uuid", dev.uuid),
                                                                           set())
            report.rows.append(DeviceRow(
                dev.index, "", "", dev.uuid, dev.model, dev.memory_used_mb, dev.memory_total_mb,
                tel.sm_active, tel.gr_engine_active,
                sum(1 for p in procs if p.gpu_index == dev.index),
                tuple(sorted(j for j, _ in jobs)), tuple(sorted({c for _, c in jobs if c})),
                tel.sm_source))
            for inst in (i for i in instances if i.gpu_index == dev.index):
                held = owners.get(("uuid", inst.uuid), set()) if inst.uuid else set()
                held |= owners.get(("gi", f"{inst.gpu_index}/{inst.gi_id}"), set())
                report.rows.append(DeviceRow(
                    dev.index, str(inst.gi_id), inst.profile, inst.uuid, dev.model,
                    inst.memory_used_mb, inst.memory_total_mb, None, None,
                    sum(1 for p in procs if inst.uuid and p.mig_uuid == inst.uuid),
                    tuple(sorted(j for j, _ in held)), tuple(sorted({c for _, c in held if c}))))
        from slurmiso.agent.gpu_owners import attribute_all

        report.attribution, report.memory, report.sm = attribute_all(records, procs, instances,
                                                                     proc)
        return report
    finally:
        if own:
            backend.close()


def _owners(records: Dict[str, JobRecord]) -> Dict[Tuple[str, str], Set[Tuple[str, str]]]:
    """(("gpu", index) | ("uuid", uuid) | ("gi", "gpu/gi")) -> {(job, class)} from records."""
    out: Dict[Tuple[str, str], Set[Tuple[str, str]]] = {}
    for job, rec in records.items():
        who = (str(job), rec.job_class)
        for res in rec.resources:
            if res.uuid:
                out.setdefault(("uuid", res.uuid), set()).add(who)
            if res.gi is not None and res.gpu is not None:
                out.setdefault(("gi", f"{res.gpu}/{res.gi}"), set()).add(who)
            elif res.gpu is not None and not res.is_mig:
                out.setdefault(("gpu", str(res.gpu)), set()).add(who)
    return out


class NodeCollector:
    """client_python custom collector: every scrape reads the node afresh."""

    def __init__(self, read: Callable[[], NodeReport], node: str = "",
                 job_labels: bool = False, dcgm_names: bool = True) -> None:
        self.read = read
        self.node = node
        self.job_labels = job_labels
        self.dcgm_names = dcgm_names

    def describe(self) -> List[Any]:
        return []  # do not read the GPUs when the collector is registered

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import GaugeMetricFamily

        try:
            report: Optional[NodeReport] = self.read()
        except SlurmisoError as exc:
            log.warning("agent: cannot read node %s: %s", self.node, exc)
            report = None
        up = GaugeMetricFamily(t.M_UP, "1 if the GPUs could be read", labels=["node"])
        up.add_metric([self.node], 0.0 if report is None else 1.0)
        yield up
        if report is None:
            return
        stamp = GaugeMetricFamily(t.M_COLLECTED, "When this scrape read the GPUs (Unix s)",
                                  labels=["node"])
        stamp.add_metric([report.node], report.collected)
        yield stamp
        labels = ["node", "gpu", "gi", "profile", "uuid", "class"] + (
            ["job"] if self.job_labels else [])
        fams = {
            t.M_MEM_USED: GaugeMetricFamily(t.M_MEM_USED, "GPU memory in use", labels=labels),
            t.M_MEM_TOTAL: GaugeMetricFamily(t.M_MEM_TOTAL, "GPU memory", labels=labels),
            t.M_SM: GaugeMetricFamily(t.M_SM, "Fraction of SMs busy (GPM or DCGM; absent when "
                                      "not measured)", labels=labels),
            t.M_GR: GaugeMetricFamily(t.M_GR, "Fraction of time the graphics engine was busy",
                                      labels=labels),
            t.M_PROCS: GaugeMetricFamily(t.M_PROCS, "Compute processes", labels=labels),
        }
        for r in report.rows:
            values = [report.node, str(r.gpu), r.gi, r.profile, r.uuid, ",".join(r.classes)]
            if self.job_labels:
                values.append(",".join(r.jobs))
            fams[t.M_MEM_USED].add_metric(values, float(r.memory_used_mb * t.MIB))
            fams[t.M_MEM_TOTAL].add_metric(values, float(r.memory_total_mb * t.MIB))
            fams[t.M_PROCS].add_metric(values, float(r.processes))
            if r.sm_active is not None:
                fams[t.M_SM].add_metric(values, r.sm_active)
            if r.gr_active is not None:
                fams[t.M_GR].add_metric(values, r.gr_active)
        yield from fams.values()
        held = GaugeMetricFamily(sig.M_JOB_GPU, "1 per job and GPU or MIG instance it holds "
                                 "(records and processes; job \"\" class \"foreign\": no job)",
                                 labels=[sig.L_JOB, sig.L_CLASS, sig.L_GPU, sig.L_GI])
        for job, cls, gpu, gi in sorted(report.attribution):
            held.add_metric([job, cls, str(gpu), gi], 1.0)
        yield held
        used = GaugeMetricFamily(sig.M_JOB_GPU_MEMORY, "GPU memory the job's processes use "
                                 "on the GPU or MIG instance (absent: the driver would not "
                                 "say)", labels=[sig.L_JOB, sig.L_CLASS, sig.L_GPU, sig.L_GI])
        for (job, cls, gpu, gi), mb in sorted(report.memory.items()):
            if mb is not None:
                used.add_metric([job, cls, str(gpu), gi], float(mb * t.MIB))
        yield used
        sm = GaugeMetricFamily(sig.M_JOB_GPU_SM, "Share of the GPU's SM (3D/compute) time the "
                               "job's processes used over the driver's recent samples, 0..1 "
                               "(NVML per-process utilization; absent: not sampled, as on MIG "
                               "devices)", labels=[sig.L_JOB, sig.L_CLASS, sig.L_GPU, sig.L_GI])
        for (job, cls, gpu, gi), share in sorted(report.sm.items()):
            if share is not None:
                sm.add_metric([job, cls, str(gpu), gi], min(1.0, share))
        yield sm
        if self.dcgm_names:
            yield from self._dcgm(report)

    def _dcgm(self, report: NodeReport) -> Iterator[Any]:
        """The DCGM exporter's names and labels for the same readings."""
        from prometheus_client.core import GaugeMetricFamily

        labels = ["gpu", "UUID", "device", "modelName", "Hostname", "GPU_I_ID",
                  "GPU_I_PROFILE"] + (["hpc_job"] if self.job_labels else [])
        used = GaugeMetricFamily(t.DCGM_USED, "Framebuffer memory used (in MiB).", labels=labels)
        free = GaugeMetricFamily(t.DCGM_FREE, "Framebuffer memory free (in MiB).", labels=labels)
        sm = GaugeMetricFamily(t.DCGM_SM, "Ratio of cycles an SM has at least 1 warp assigned.",
                               labels=labels)
        util = GaugeMetricFamily(t.DCGM_UTIL, "GPU utilization (in %): graphics-engine busy "
                                 "time, not SM activity.", labels=labels)
        mig_gpus = {r.gpu for r in report.rows if r.gi}
        for r in report.rows:
            if not r.gi and r.gpu in mig_gpus:
                continue  # DCGM reports a MIG GPU per instance
            values = [str(r.gpu), r.uuid, f"nvidia{r.gpu}", r.model, report.node, r.gi,
                      r.profile] + ([",".join(r.jobs)] if self.job_labels else [])
            used.add_metric(values, float(r.memory_used_mb))
            free.add_metric(values, float(max(0, r.memory_total_mb - r.memory_used_mb)))
            if r.sm_active is not None:
                sm.add_metric(values, r.sm_active)
            if r.gr_active is not None and not r.gi:
                util.add_metric(values, 100.0 * r.gr_active)
        yield from (used, free, sm, util)
