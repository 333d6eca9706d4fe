"""The node's own watch over the ladder's restraints, for when no monitor is alive.

:class:`RestraintCollector` exports each restraint the node last read from Slurm and the age
of the monitor's heartbeat; :func:`restraint_watch` is one round of reading the node's
restraints from Slurm into root's record and ending those past their bound while no monitor
is alive (:mod:`slurmiso.restraints` says how); :func:`watch_forever` runs it beside the
agent's server.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING, Any, Callable, Iterator, List, Optional

from slurmiso.exposition import job_series as sig

if TYPE_CHECKING:
    from slurmiso.config.model import Config

log = logging.getLogger(__name__)


class RestraintCollector:
    """Each restraint the node last read from Slurm (root's record, :data:`~slurmiso.
    restraints.BOOK_FILE`) as a series, and the monitor's heartbeat age."""

    def __init__(self, state_dir: str, clock: Callable[[], float] = time.time) -> None:
        self.state_dir = state_dir
        self.clock = clock

    def describe(self) -> List[Any]:
        return []

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import GaugeMetricFamily

        from slurmiso import restraints as r

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
        yield self._host_limits(now)
        yield from self._parks(now)

    def _host_limits(self, now: float) -> Any:
        """Each knob of each host limit the node applied (root's record), seconds in force."""
        from prometheus_client.core import GaugeMetricFamily

        from slurmiso import restraints as r
        from slurmiso.host.limit_record import load_record

        fam = GaugeMetricFamily(r.M_HOST_LIMIT, "Seconds a host limit of the ladder's host "
                                "rung has been in force on a training job's cgroup, per knob",
                                labels=[sig.L_JOB, "step", "level", "knob"])
        for a in load_record(self.state_dir).applied:
            for knob in a.knobs():
                fam.add_metric([a.job, r.RestraintStep.HOST_LIMIT.value, str(a.level), knob],
                               max(0.0, now - a.at))
        return fam


    def _parks(self, now: float) -> Iterator[Any]:
        """Each park the node made and finished (root's record), seconds in force; and each
        park note it will not park, by the note's ``since`` (the monitor's fallback)."""
        from prometheus_client.core import GaugeMetricFamily

        from slurmiso import restraints as r
        from slurmiso.agent.park_record import load_record

        rec = load_record(self.state_dir)
        fam = GaugeMetricFamily(r.M_PARK, "Seconds a training job's CUDA processes have been "
                                "parked by the ladder's park rung (GPU memory to host)",
                                labels=[sig.L_JOB, "step", "processes"])
        for p in rec.parked:
            if p.whole:
                fam.add_metric([p.job, r.RestraintStep.PARK.value, str(len(p.procs))],
                               max(0.0, now - p.at))
        yield fam
        refused = GaugeMetricFamily(r.M_PARK_REFUSED, "1 per park note this node will not "
                                    "park (refused, cut short or ended at its bound; the "
                                    "node's journal says why), by the note's since",
                                    labels=[sig.L_JOB, "since"])
        for job, since in sorted(rec.done):
            refused.add_metric([job, f"{since:.0f}"], 1.0)
        yield refused


def restraint_watch(cfg: Config, node: str, slurm: Any = None,
                    clock: Callable[[], float] = time.time,
                    cgroup_root: str = "/sys/fs/cgroup") -> List[str]:
    """One round of the agent's restraint watch: read the node's restraints from Slurm
    into root's record, end those past their bound while no monitor is alive, and run the
    host rung (:mod:`slurmiso.agent.host_rung`) on the host-limit notes and the park rung
    (:mod:`slurmiso.agent.park_rung`) on the park notes."""
    from slurmiso import restraints as r
    from slurmiso.host.limit_record import load_record

    if slurm is None:
        from slurmiso.slurm.client import SlurmCli

        slurm = SlurmCli()
    state_dir = cfg.paths.state_dir_for(node)
    now = clock()
    from slurmiso.errors import StateError
    from slurmiso.state import NodeState

    try:
        records = NodeState(state_dir).jobs()
    except StateError as exc:
        # one unreadable job record must not stop the undo: the rung still ends what its
        # notes, bounds and gone jobs end, and with no records it applies nothing new
        log.warning("agent: the node's job records cannot be read: %s", exc)
        records = {}
    held = load_record(state_dir)
    limited = bool(held.applied or held.problems)  # host limits to undo, or a record to fix
    quotas = _quota_round(cfg, node, records, {a.job for a in held.applied}, cgroup_root, now)
    quotas += _memory_round(cfg, node, records, cgroup_root, now)
    quotas += _priority_round(cfg, node, records, now)
    from slurmiso.agent import park_record

    parks = park_record.load_record(state_dir)
    parked = bool(parks.parked or parks.problems)  # parks to release, or a record to fix
    if not records and not r.load_book(state_dir)["restraints"] and not (limited or parked):
        return quotas  # no job here and none restrained: nothing to ask slurmctld about
    book = r.refresh(slurm, state_dir, node, now)
    from slurmiso.state import Journal

    journal = Journal(cfg.paths.journal_for(node))
    lines: List[str] = []
    if "error" not in book:
        lines = r.end_over_bound(slurm, state_dir, book["restraints"], now,
                                 cfg.monitor.interval_s, cfg.monitor.ladder.unthrottle_signal,
                                 False, journal)
    # Slurm not answering: the host rung still ends what its bound or a gone job ends
    if limited or any(x.note.step is r.RestraintStep.HOST_LIMIT for x in book["restraints"]):
        from slurmiso.agent.host_rung import HostRung

        rung = HostRung(state_dir, node, cfg.monitor.ladder.host_limit.levels,
                        (c.name for c in cfg.classes if c.preemptible), cfg.monitor.interval_s,
                        journal, cgroup_root, slurm,
                        max_s=float(cfg.monitor.ladder.host_limit.max_s))
        lines += rung.round(book["restraints"], records, now)
    if parked or any(x.note.step is r.RestraintStep.PARK for x in book["restraints"]):
        lines += _park_round(cfg, node, slurm, journal, book["restraints"], records, now)
    return quotas + lines


def _quota_round(cfg: Config, node: str, records: Any, limited: Any, cgroup_root: str,
                 now: float) -> List[str]:
    """The classes' host quotas (:mod:`slurmiso.agent.host_quota`), where any class has one."""
    if not records or not any(c.host.any() for c in cfg.classes):
        return []
    from slurmiso.agent.host_quota import quota_round
    from slurmiso.state import Journal

    return quota_round(cfg, node, records, Journal(cfg.paths.journal_for(node)), cgroup_root,
                       limited, now=now)


def _memory_round(cfg: Config, node: str, records: Any, cgroup_root: str,
                  now: float) -> List[str]:
    """The classes' GPU memory partitions (:mod:`slurmiso.agent.gpu_memory`), where any
    class has one, through the node's GPU backend."""
    if not records or not any(c.gpu_memory.any() for c in cfg.classes):
        return []
    from slurmiso.agent.gpu_memory import memory_round
    from slurmiso.errors import SlurmisoError
    from slurmiso.gpu import open_backend
    from slurmiso.state import Journal

    try:
        with open_backend(cfg.gpu.backend, cfg.gpu.sim_state, node) as backend:
            return memory_round(cfg, node, records, backend,
                                Journal(cfg.paths.journal_for(node)), cgroup_root, now)
    except SlurmisoError as exc:
        log.warning("agent: GPU memory partitions not set this round: %s", exc)
        return []


def _priority_round(cfg: Config, node: str, records: Any, now: float) -> List[str]:
    """Processes of below-normal jobs on a shared MPS server that raised their own priority
    (:mod:`slurmiso.agent.mps_priority`), ended."""
    if not records:
        return []
    from slurmiso.agent.mps_priority import assigned, priority_round
    from slurmiso.state import Journal

    if not assigned(records):
        return []
    return priority_round(records, node, Journal(cfg.paths.journal_for(node)), now=now)


def _park_round(cfg: Config, node: str, slurm: Any, journal: Any, book: Any,
                records: Any, now: float) -> List[str]:
    """The park rung (:mod:`slurmiso.agent.park_rung`) over the node's GPU backend: the real
    cuda-checkpoint, or its simulation on the simulated node."""
    from slurmiso.agent.park_rung import ParkRung
    from slurmiso.errors import SlurmisoError
    from slurmiso.gpu import open_backend
    from slurmiso.gpu.cuda_checkpoint import CliTool, SimTool
    from slurmiso.gpu.sim import SimBackend

    backend: Any = None
    try:
        backend = open_backend(cfg.gpu.backend, cfg.gpu.sim_state, node)
    except SlurmisoError as exc:
        tool: Any = _NoTool(f"the node's GPUs cannot be opened: {exc}")
    else:
        tool = SimTool(backend) if isinstance(backend, SimBackend) else CliTool()
    rung = ParkRung(cfg.paths.state_dir_for(node), node,
                    (c.name for c in cfg.classes if c.preemptible), cfg.monitor.interval_s,
                    journal, slurm, tool=tool,
                    processes=backend.processes if backend is not None else tool.processes)
    try:
        return rung.round(book, records, now)
    finally:
        if backend is not None:
            backend.close()


class _NoTool:
    """cuda-checkpoint where the node's GPUs cannot be opened: unusable, every act refused
    (a release is retried next round), and no process listed."""

    def __init__(self, why: str) -> None:
        self.why = why

    def unusable(self) -> Optional[str]:
        return self.why

    def state(self, pid: int) -> Any:
        from slurmiso.errors import CheckpointRefused

        raise CheckpointRefused(f"pid {pid}: {self.why}")

    def act(self, pid: int, action: Any, timeout_ms: int = 0) -> None:
        self.state(pid)

    def processes(self) -> List[Any]:
        return []


def watch_forever(cfg: Config, node: str, every_s: float,
                  woken: Optional[threading.Event] = None) -> None:
    """A round every ``every_s``, or at once when ``woken`` is set (the monitor's nudge:
    a note this node acts on was just written)."""
    woken = woken or threading.Event()
    while True:
        woken.clear()
        try:
            for line in restraint_watch(cfg, node):
                log.warning("agent: %s", line)
        except Exception as exc:  # noqa: BLE001 - the watch must outlive any one failure
            log.warning("agent: restraint watch failed: %s", exc)
        woken.wait(every_s)
