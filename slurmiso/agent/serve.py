"""``slurmiso agent``: serve the node's metrics (:func:`serve`), or render them once.

:func:`registry_for` gathers the node's collectors (its GPUs, :mod:`slurmiso.agent.gpus`;
its jobs' signals, :mod:`slurmiso.agent.job_signals`; its jobs' cgroups and the node's
pressure and NICs, :mod:`slurmiso.agent.host_figures`; the ladder's restraints,
:mod:`slurmiso.agent.restraint_watch`) on a registry of its own; :func:`signals_for` builds
the jobs' background reader; the server is the agent's own
(:mod:`slurmiso.agent.http_server`), which stamps the monitor's heartbeat from its scrapes.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Mapping, Optional, Set

from slurmiso.agent.gpus import NodeCollector, gather_node
from slurmiso.agent.restraint_watch import RestraintCollector, watch_forever
from slurmiso.state.record import JobRecord

if TYPE_CHECKING:
    from slurmiso.config.model import Config

log = logging.getLogger(__name__)


def registry_for(cfg: Config, node: str, signals: Any = None, host: bool = True,
                 cgroup_root: str = "/sys/fs/cgroup") -> Any:
    """A fresh registry holding only this node's collectors (never the global one: the
    process/platform collectors would add noise to every node's scrape); ``signals``: a
    :class:`~slurmiso.agent.job_signals.JobSignalsState` whose per-job series it adds;
    ``host``: the jobs' cgroup figures and the node's pressure and NICs, read under
    ``cgroup_root`` where Slurm lays the jobs' cgroups out."""
    from prometheus_client import CollectorRegistry

    registry = CollectorRegistry(auto_describe=False)
    registry.register(NodeCollector(lambda: gather_node(cfg, node), node,
                                    job_labels=cfg.monitor.telemetry.job_labels,
                                    dcgm_names=cfg.monitor.telemetry.agent_dcgm_names))
    if signals is not None:
        from slurmiso.agent.job_signals import JobSignalsCollector

        registry.register(JobSignalsCollector(signals))
    if host:
        from slurmiso.agent.host_figures import HostCollector, gather_host

        registry.register(HostCollector(
            lambda: gather_host(_records(cfg, node), node, cgroup_root), node))
    registry.register(RestraintCollector(cfg.paths.state_dir_for(node)))
    return registry


def signals_for(cfg: Config, node: str) -> Any:
    """The jobs' signals of ``node`` and their background reader (not started)."""
    from slurmiso.agent import netns
    from slurmiso.agent.host_figures import record_sluids
    from slurmiso.agent.job_signals import JobSignalsState, Refresher

    def elsewhere(jobs: List[str], records: Mapping[str, Any]) -> Set[str]:
        return netns.elsewhere(jobs, record_sluids(dict(records)), node)

    state = JobSignalsState(
        cfg.monitor.signals, tuple(s.class_name for s in cfg.monitor.slo),
        tuple(c.name for c in cfg.classes if c.preemptible), elsewhere=elsewhere)

    return Refresher(state, lambda: _records(cfg, node), cfg.monitor.signals.refresh_s)


def _records(cfg: Config, node: str) -> Dict[str, JobRecord]:
    from slurmiso.state import NodeState

    return NodeState(cfg.paths.state_dir_for(node)).jobs()


def render(registry: Any) -> str:
    from prometheus_client import generate_latest

    return str(generate_latest(registry).decode("utf-8"))


class _Heartbeat:
    """Stamps the monitor's scrapes (a :data:`~slurmiso.restraints.HEARTBEAT_HEADER`
    credential munged vouches for) in the node's state dir, checking one at most every
    ``every_s`` seconds (a decode is a round trip to munged); a header that is not the
    monitor's is a warning, once a minute at most."""

    def __init__(self, state_dir: str, node: str, every_s: float = 5.0,
                 clock: Callable[[], float] = time.time,
                 vouch: Optional[Callable[[str, str], Optional[str]]] = None,
                 wake: Optional[Callable[[], None]] = None, wake_every_s: float = 1.0) -> None:
        from slurmiso.restraints import heartbeat_vouched

        self.state_dir = state_dir
        self.node = node
        self.every_s = every_s
        self.clock = clock
        self.vouch = vouch or heartbeat_vouched
        self.last = 0.0
        self.warned = 0.0
        #: Wakes the restraint watch; a monitor's nudge (WAKE_HEADER) calls it, vouched, at
        #: most once every ``wake_every_s`` (each is one read of Slurm).
        self.wake = wake
        self.wake_every_s = wake_every_s
        self.woken = 0.0

    def seen(self, value: str, wake: bool = False) -> None:
        from slurmiso.restraints import write_heartbeat

        now = self.clock()
        wake = wake and self.wake is not None and now - self.woken >= self.wake_every_s
        if now - self.last < self.every_s and not wake:
            return
        why = self.vouch(value, self.node)
        if why is not None:
            if now - self.warned >= 60:
                self.warned = now
                log.warning("agent: a scrape's monitor heartbeat is not the monitor's (%s): "
                            "not stamped", why)
            return
        self.last = now
        if wake and self.wake is not None:
            self.woken = now
            self.wake()
        try:
            write_heartbeat(self.state_dir, now)
        except OSError as exc:
            log.warning("agent: cannot stamp the monitor's heartbeat: %s", exc)


def _stamp(head: bytes, heartbeat: _Heartbeat) -> None:
    """Hand the monitor's header of a scrape's request head, if any, to ``heartbeat``, with
    whether the scrape asks the restraint watch to wake (a nudge)."""
    from slurmiso.restraints import HEARTBEAT_HEADER, WAKE_HEADER, WAKE_RESTRAINTS

    name = HEARTBEAT_HEADER.lower().encode() + b":"
    wake_name = WAKE_HEADER.lower().encode() + b":"
    value: Optional[str] = None
    wake = False
    for line in head.split(b"\n")[1:]:
        low = line.lower()
        if low.startswith(name) and value is None:
            value = line[len(name):].strip().decode("ascii", "replace")
        elif low.startswith(wake_name):
            wake = line[len(wake_name):].strip().decode("ascii", "replace") == WAKE_RESTRAINTS
    if value is not None:
        heartbeat.seen(value, wake)


def serve(cfg: Config, node: str, port: int, addr: str = "") -> None:
    """Serve ``/metrics`` until killed (systemd stops it with SIGTERM), on ``addr`` (default
    ``monitor.telemetry.agent_addr``, loopback: opening it to the network is a choice), with
    the agent's own server (:mod:`slurmiso.agent.http_server`: no user's connections can
    keep a scrape out). Beside it, the restraint watch
    (:func:`~slurmiso.agent.restraint_watch.restraint_watch`, every
    ``max(30 s, interval)``)."""
    import threading

    from prometheus_client import generate_latest

    from slurmiso.agent.http_server import AgentServer, HttpStatsCollector
    from slurmiso.errors import UsageError

    where = addr or cfg.monitor.telemetry.agent_addr
    refresher = signals_for(cfg, node).start()
    registry = registry_for(cfg, node, refresher.state)
    woken = threading.Event()
    heartbeat = _Heartbeat(cfg.paths.state_dir_for(node), node, wake=woken.set)
    try:
        server = AgentServer(lambda: bytes(generate_latest(registry)), where, port,
                             on_scrape=lambda head: _stamp(head, heartbeat))
    except OSError as exc:
        raise UsageError(f"cannot listen on {where}:{port}: {exc.strerror}",
                         hint="pick another --port or --addr, or stop what holds it") from None
    registry.register(HttpStatsCollector(server))
    server.start()
    threading.Thread(target=watch_forever,
                     args=(cfg, node, max(30.0, cfg.monitor.interval_s), woken),
                     daemon=True, name="restraint-watch").start()
    log.info("agent for node %s serving on %s:%d (at most %d connections)", node, where, port,
             server.cap)
    while True:
        time.sleep(3600)
