"""``slurmiso agent``'s data: a node's GPUs, MIG instances and the jobs holding them, as
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
from slurmiso.monitor import signals as sig
from slurmiso.monitor import telemetry as t
from slurmiso.monitor.snapshot import GpuSample
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
    #: (job, class, gpu, gi): records and processes (monitor/gpu_owners.py)
    attribution: Set[Tuple[str, str, int, str]] = field(default_factory=set)

    def samples(self) -> List[GpuSample]:
        """The monitor's view: one sample per GPU, MIG instances folded in."""
        out = []
        for r in self.rows:
            if r.gi:
                continue
            insts = [i for i in self.rows if i.gi and i.gpu == r.gpu]
            jobs = set(r.jobs).union(*(i.jobs for i in insts))
            classes = set(r.classes).union(*(i.classes for i in insts))
            out.append(GpuSample(
                r.gpu, r.memory_used_mb, r.memory_total_mb,
                None if r.sm_active is None else 100.0 * r.sm_active,
                None if r.gr_active is None else 100.0 * r.gr_active,
                r.processes, tuple(sorted(jobs)), tuple(sorted(classes)),
                tuple(sorted(i.profile for i in insts))))
        return out


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
        from slurmiso.monitor.gpu_owners import rows

        report.attribution = rows(records, procs, instances, proc)
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


def registry_for(cfg: Config, node: str, signals: Any = None) -> Any:
    """A fresh registry holding only this node's collectors (never the global one: the
    process/platform collectors would add noise to every node's scrape); ``signals``: a
    :class:`~slurmiso.monitor.jobsignals.JobSignalsState` whose per-job series it adds."""
    from prometheus_client import CollectorRegistry

    registry = CollectorRegistry(auto_describe=False)
    registry.register(NodeCollector(lambda: gather_node(cfg, node), node,
                                    job_labels=cfg.monitor.telemetry.job_labels,
                                    dcgm_names=cfg.monitor.telemetry.agent_dcgm_names))
    if signals is not None:
        from slurmiso.monitor.jobsignals import JobSignalsCollector

        registry.register(JobSignalsCollector(signals))
    registry.register(RestraintCollector(cfg.paths.state_dir_for(node)))
    return registry


def signals_for(cfg: Config, node: str) -> Any:
    """The jobs' signals of ``node`` and their background reader (not started)."""
    from slurmiso.monitor.jobsignals import JobSignalsState, Refresher

    state = JobSignalsState(
        cfg.monitor.signals, tuple(s.class_name for s in cfg.monitor.slo),
        tuple(c.name for c in cfg.classes if c.preemptible))

    def records() -> Dict[str, JobRecord]:
        from slurmiso.state import NodeState

        return NodeState(cfg.paths.state_dir_for(node)).jobs()

    return Refresher(state, records, cfg.monitor.signals.refresh_s)


def render(registry: Any) -> str:
    from prometheus_client import generate_latest

    return str(generate_latest(registry).decode("utf-8"))


class _Heartbeat:
    """Stamps the monitor's scrapes (a :data:`~slurmiso.monitor.restraints.HEARTBEAT_HEADER`
    credential munged vouches for) in the node's state dir, checking one at most every
    ``every_s`` seconds (a decode is a round trip to munged); a header that is not the
    monitor's is a warning, once a minute at most."""

    def __init__(self, state_dir: str, node: str, every_s: float = 5.0,
                 clock: Callable[[], float] = time.time,
                 vouch: Optional[Callable[[str, str], Optional[str]]] = None) -> None:
        from slurmiso.monitor.restraints import heartbeat_vouched

        self.state_dir = state_dir
        self.node = node
        self.every_s = every_s
        self.clock = clock
        self.vouch = vouch or heartbeat_vouched
        self.last = 0.0
        self.warned = 0.0

    def seen(self, value: str) -> None:
        from slurmiso.monitor.restraints import write_heartbeat

        now = self.clock()
        if now - self.last < self.every_s:
            return
        why = self.vouch(value, self.node)
        if why is not None:
            if now - self.warned >= 60:
                self.warned = now
                log.warning("agent: a scrape's monitor heartbeat is not the monitor's (%s): "
                            "not stamped", why)
            return
        self.last = now
        try:
            write_heartbeat(self.state_dir, now)
        except OSError as exc:
            log.warning("agent: cannot stamp the monitor's heartbeat: %s", exc)


def _stamp(head: bytes, heartbeat: _Heartbeat) -> None:
    """Hand the monitor's header of a scrape's request head, if any, to ``heartbeat``."""
    from slurmiso.monitor.restraints import HEARTBEAT_HEADER

    name = HEARTBEAT_HEADER.lower().encode() + b":"
    for line in head.split(b"\n")[1:]:
        if line.lower().startswith(name):
            heartbeat.seen(line[len(name):].strip().decode("ascii", "replace"))
            return


class RestraintCollector:
    """Each restraint the node last read from Slurm (root's record, :data:`~slurmiso.
    monitor.restraints.BOOK_FILE`) as a series, and the monitor's heartbeat age."""

    def __init__(self, state_dir: str, clock: Callable[[], float] = time.time) -> None:
        self.state_dir = state_dir
        self.clock = clock

    def describe(self) -> List[Any]:
        return []

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import GaugeMetricFamily

        from slurmiso.monitor import restraints as r

        now = self.clock()
        age = r.heartbeat_age(self.state_dir, now)
        beat = GaugeMetricFamily(r.M_HEARTBEAT, "Seconds since the monitor last scraped this "
                                 "agent (+Inf: never)")
        beat.add_metric([], float("inf") if age is None else age)
        yield beat
        labels = [sig.L_JOB, "step", "gpu", "cause", "on_bound"]
        held = GaugeMetricFamily(r.M_RESTRAINT, "Seconds a training job has been restrained "
                                 "by the ladder (from its AdminComment note)", labels=labels)
        bound = GaugeMetricFamily(r.M_RESTRAINT_BOUND, "The bound of that restraint (max_s)",
                                  labels=labels)
        for x in r.load_book(self.state_dir)["restraints"]:
            n = x.note
            values = [x.job, n.step.value, f"{n.node}/{n.gpu}", n.cause, n.on_bound.value]
            held.add_metric(values, n.age(now))
            bound.add_metric(values, n.max_s)
        yield held
        yield bound


def restraint_watch(cfg: Config, node: str, slurm: Any = None,
                    clock: Callable[[], float] = time.time) -> List[str]:
    """One round of the agent's restraint watch: read the node's restraints from Slurm
    into root's record and end those past their bound while no monitor is alive."""
    from slurmiso.monitor import restraints as r

    if slurm is None:
        from slurmiso.slurm.client import SlurmCli

        slurm = SlurmCli()
    state_dir = cfg.paths.state_dir_for(node)
    now = clock()
    from slurmiso.state import NodeState

    if not NodeState(state_dir).jobs() and not r.load_book(state_dir)["restraints"]:
        return []  # no job here and none restrained: nothing to ask slurmctld about
    book = r.refresh(slurm, state_dir, node, now)
    if "error" in book:
        return []
    from slurmiso.state import Journal

    return r.end_over_bound(slurm, state_dir, book["restraints"], now,
                            cfg.monitor.interval_s, cfg.monitor.ladder.unthrottle_signal,
                            False, Journal(cfg.paths.journal_for(node)))


def _watch_forever(cfg: Config, node: str, every_s: float) -> None:
    while True:
        try:
            for line in restraint_watch(cfg, node):
                log.warning("agent: %s", line)
        except Exception as exc:  # noqa: BLE001 - the watch must outlive any one failure
            log.warning("agent: restraint watch failed: %s", exc)
        time.sleep(every_s)


def serve(cfg: Config, node: str, port: int, addr: str = "") -> None:
    """Serve ``/metrics`` until killed (systemd stops it with SIGTERM), on ``addr`` (default
    ``monitor.telemetry.agent_addr``, loopback: opening it to the network is a choice), with
    the agent's own server (:mod:`slurmiso.monitor.agent_http`: no user's connections can
    keep a scrape out). Beside it, the restraint watch (:func:`restraint_watch`, every
    ``max(30 s, interval)``)."""
    import threading

    from prometheus_client import generate_latest

    from slurmiso.errors import UsageError
    from slurmiso.monitor.agent_http import AgentServer, HttpStatsCollector

    where = addr or cfg.monitor.telemetry.agent_addr
    refresher = signals_for(cfg, node).start()
    registry = registry_for(cfg, node, refresher.state)
    heartbeat = _Heartbeat(cfg.paths.state_dir_for(node), node)
    try:
        server = AgentServer(lambda: bytes(generate_latest(registry)), where, port,
                             on_scrape=lambda head: _stamp(head, heartbeat))
    except OSError as exc:
        raise UsageError(f"cannot listen on {where}:{port}: {exc.strerror}",
                         hint="pick another --port or --addr, or stop what holds it") from None
    registry.register(HttpStatsCollector(server))
    server.start()
    threading.Thread(target=_watch_forever, args=(cfg, node, max(30.0, cfg.monitor.interval_s)),
                     daemon=True, name="restraint-watch").start()
    log.info("agent for node %s serving on %s:%d (at most %d connections)", node, where, port,
             server.cap)
    while True:
        time.sleep(3600)
