"""The monitor's cycle and its life: snapshot -> decide -> apply, every ``interval``.

* one leader: an ``flock`` on a lock file; a second monitor stays idle and retries each
  interval, taking over when the leader dies (the kernel drops a dead holder's lock);
* memory survives restarts: written atomically to a state file after each applied cycle
  (a dry run never writes it: nothing it decided happened);
* Slurm down: the cycle changes nothing and the next one waits longer (capped back-off);
* every action is journaled (``monitor-action``) and counted in the exported metrics.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterator, List, Optional

from slurmiso.errors import StateError
from slurmiso.monitor import snapshot as snapmod
from slurmiso.monitor.apply import Applier, Outcome
from slurmiso.monitor.decide import decide, failed
from slurmiso.monitor.policy import Memory, Policy
from slurmiso.monitor.snapshot import Snapshot
from slurmiso.state.lock import FileLock, LockTimeout

log = logging.getLogger(__name__)

STATE_VERSION = 1
MAX_BACKOFF_S = 600.0


@dataclass
class Stats:
    """What the monitor exports about itself (read by :class:`MonitorCollector`)."""

    leader: bool = False
    cycles: int = 0
    slurm_failures: int = 0
    actions: Dict[str, int] = field(default_factory=dict)  # "kind/ok|failed" -> count
    last_cycle_ts: float = 0.0
    last_cycle_s: float = 0.0
    held_jobs: int = 0
    lent_nodes: int = 0
    closed_gates: List[str] = field(default_factory=list)
    stale_scopes: List[str] = field(default_factory=list)
    telemetry_errors: int = 0


class Monitor:
    """One monitor process. ``snapshot_fn`` gives each cycle's snapshot (live or a file)."""

    def __init__(
        self,
        policy: Policy,
        snapshot_fn: Callable[[], Snapshot],
        applier: Applier,
        state_path: str,
        lock_path: str,
        interval_s: float,
        dry_run: bool = False,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.policy = policy
        self.snapshot_fn = snapshot_fn
        self.applier = applier
        self.state_path = state_path
        self.lock = FileLock(lock_path, timeout=0)
        self.interval_s = interval_s
        self.dry_run = dry_run
        self.sleep = sleep
        self.stats = Stats()
        self.memory = self.load_memory()

    # ------------------------------------------------------------------------ state file
    def load_memory(self) -> Memory:
        try:
            with open(self.state_path, encoding="utf-8") as fh:
                data = json.load(fh)
        except FileNotFoundError:
            return Memory()
        except (OSError, ValueError) as exc:
            raise StateError(f"monitor state {self.state_path} is unreadable: {exc}",
                             hint="move it aside to start with an empty memory") from None
        if not isinstance(data, dict) or data.get("version") != STATE_VERSION:
            raise StateError(f"monitor state {self.state_path} is not version {STATE_VERSION}")
        return Memory.from_dict(data.get("memory") or {})

    def save_memory(self) -> None:
        folder = os.path.dirname(os.path.abspath(self.state_path))
        os.makedirs(folder, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".monitor-state-", dir=folder)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                json.dump({"version": STATE_VERSION, "memory": self.memory.to_dict()}, fh)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, self.state_path)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise

    # ----------------------------------------------------------------------------- cycle
    def cycle(self) -> List[Outcome]:
        """One snapshot -> decide -> apply; returns what was (or, dry-run, would be) done."""
        started = time.monotonic()
        snap = self.snapshot_fn()
        actions, memory = decide(snap, self.policy, self.memory)
        outcomes = self.applier.apply(actions, self.dry_run)
        for out in outcomes:
            if not out.ok:
                memory = failed(memory, out.action, out.error)
        if set(memory.stale) != set(self.memory.stale):
            if memory.stale:
                log.warning("monitor: stale telemetry for %s: admission unchanged there",
                            ", ".join(memory.stale))
            else:
                log.info("monitor: telemetry fresh again")
        self.memory = memory
        if not self.dry_run:
            self.save_memory()
        self._count(snap, outcomes, time.monotonic() - started)
        return outcomes

    def _count(self, snap: Snapshot, outcomes: List[Outcome], took: float) -> None:
        st = self.stats
        st.cycles += 1
        st.slurm_failures = 0 if snap.slurm_ok else st.slurm_failures + 1
        for out in outcomes:
            key = f"{out.action.kind}/{'ok' if out.ok else 'failed'}"
            st.actions[key] = st.actions.get(key, 0) + 1
        st.last_cycle_ts = snap.ts
        st.last_cycle_s = took
        st.held_jobs = len(self.memory.holds)
        st.lent_nodes = len(self.memory.lent)
        st.closed_gates = sorted(k for k, g in self.memory.gates.items() if g.get("closed"))
        st.stale_scopes = list(self.memory.stale)
        st.telemetry_errors = len(snap.errors)

    def next_wait(self) -> float:
        """The interval, doubled per consecutive cycle Slurm did not answer (capped)."""
        n = self.stats.slurm_failures
        return min(self.interval_s * (2 ** min(n, 10)), max(MAX_BACKOFF_S, self.interval_s))

    # -------------------------------------------------------------------------- leading
    def try_lead(self) -> bool:
        if self.lock.is_locked:
            return True
        try:
            os.makedirs(os.path.dirname(os.path.abspath(self.lock.lock_file)), exist_ok=True)
            self.lock.acquire(timeout=0)
        except LockTimeout:
            return False
        self.stats.leader = True
        self.memory = self.load_memory()  # the previous leader's memory, not ours from before
        return True

    def run(self, once: bool = False, cycles: Optional[int] = None) -> Iterator[List[Outcome]]:
        """Cycles as the leader (each yields its outcomes); idle while another leads."""
        done = 0
        idle_logged = False
        while cycles is None or done < cycles:
            if not self.try_lead():
                if not idle_logged:
                    log.warning("monitor: another monitor holds %s: idle", self.lock.lock_file)
                    idle_logged = True
                if once:
                    return
                self.sleep(self.interval_s)
                continue
            idle_logged = False
            yield self.cycle()
            done += 1
            if once:
                return
            wait = self.next_wait()
            if wait > self.interval_s:
                log.warning("monitor: Slurm unreachable %d time(s); next cycle in %.0fs",
                            self.stats.slurm_failures, wait)
            self.sleep(wait)

    def close(self) -> None:
        self.lock.release()
        self.stats.leader = False


def file_snapshots(path: str) -> Callable[[], Snapshot]:
    """Replay a recorded snapshot (re-read each cycle, so it can be replaced meanwhile)."""
    return lambda: snapmod.load(path)


class MonitorCollector:
    """client_python custom collector over a monitor's :class:`Stats`."""

    def __init__(self, stats: Stats) -> None:
        self.stats = stats

    def describe(self) -> List[Any]:
        return []

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        st = self.stats
        yield GaugeMetricFamily("slurmiso_monitor_leader", "1 while this monitor leads",
                                value=float(st.leader))
        yield CounterMetricFamily("slurmiso_monitor_cycles", "Decision cycles run",
                                  value=float(st.cycles))
        actions = CounterMetricFamily("slurmiso_monitor_actions", "Actions by kind and result",
                                      labels=["kind", "result"])
        for key, n in sorted(st.actions.items()):
            actions.add_metric(key.split("/", 1), float(n))
        yield actions
        for name, text, value in (
            ("slurmiso_monitor_last_cycle_timestamp_seconds", "End of the last cycle",
             st.last_cycle_ts),
            ("slurmiso_monitor_cycle_seconds", "Duration of the last cycle", st.last_cycle_s),
            ("slurmiso_monitor_held_jobs", "Training jobs this monitor holds", st.held_jobs),
            ("slurmiso_monitor_lent_nodes", "Inference nodes lent to training", st.lent_nodes),
            ("slurmiso_monitor_slurm_failures", "Consecutive cycles Slurm did not answer",
             st.slurm_failures),
            ("slurmiso_monitor_telemetry_errors", "Telemetry sources that failed last cycle",
             st.telemetry_errors),
        ):
            yield GaugeMetricFamily(name, text, value=float(value))
        gates = GaugeMetricFamily("slurmiso_monitor_gate_closed",
                                  "1 while training admission is closed for a scope",
                                  labels=["scope"])
        for scope in st.closed_gates:
            gates.add_metric([scope], 1.0)
        yield gates
        stale = GaugeMetricFamily("slurmiso_monitor_stale", "1 while a scope's data is stale",
                                  labels=["scope"])
        for scope in st.stale_scopes:
            stale.add_metric([scope], 1.0)
        yield stale
