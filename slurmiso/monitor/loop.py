"""The monitor's cycle and its life: snapshot -> decide -> apply, every ``interval``.

* one leader: an ``flock`` on a lock file; a second monitor stays idle and retries each
  interval, taking over when the leader dies (the kernel drops a dead holder's lock);
* memory survives restarts and crashes: the intent (every action about to be applied) is
  written atomically to the state file *before* acting and cleared after, so a monitor
  killed mid-batch is reconciled by the next one (:func:`~slurmiso.monitor.decide.
  reconcile_intent`); SIGTERM finishes the batch under way, then the cycle, then exits;
* a dry run never writes the state file, but remembers exactly what a real run would: the
  effect of its unapplied actions is laid over each next snapshot (:class:`DryRunOverlay`);
* Slurm down: the cycle changes nothing and the next one waits longer (capped back-off);
* every action is journaled (``monitor-action``) and counted in the exported metrics.
"""

from __future__ import annotations

import gc
import json
import logging
import os
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Set, Tuple

from slurmiso.atomic import write_atomic
from slurmiso.errors import StateError
from slurmiso.monitor import snapshot as snapmod
from slurmiso.monitor.actions import KIND
from slurmiso.monitor.apply import Applier, Outcome
from slurmiso.monitor.decide import decide, failed, intent_of
from slurmiso.monitor.policy import Memory, Policy
from slurmiso.monitor.snapshot import Snapshot
from slurmiso.state.journal import MONITOR_SOURCE
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
    #: decide() alone in the last cycle (the pure core, without I/O).
    last_decide_s: float = 0.0
    held_jobs: int = 0
    lent_nodes: int = 0
    closed_gates: List[str] = field(default_factory=list)
    stale_scopes: List[str] = field(default_factory=list)
    telemetry_errors: int = 0
    #: Age of the oldest hold this monitor keeps (None: it keeps none).
    oldest_hold_s: Optional[float] = None
    held_by_reason: Dict[str, int] = field(default_factory=dict)
    #: "source/reason" -> signals unknown last cycle (the memory's, as status shows them).
    unknown: Dict[str, int] = field(default_factory=dict)
    #: node -> (seconds its telemetry has been unknown, "source/reason").
    unknown_nodes: Dict[str, Tuple[Optional[float], str]] = field(default_factory=dict)
    excluded_jobs: int = 0
    slurm_ok: bool = True
    #: The ladder: GPUs per step in force, training jobs throttled / suspended by it.
    ladder_gpus: Dict[str, int] = field(default_factory=dict)
    restrained: Dict[str, int] = field(default_factory=dict)


class EndOfSnapshots(Exception):
    """A replayed snapshot sequence is over: the monitor stops."""


class DryRunOverlay:
    """What a dry run's actions would have changed in Slurm, laid over each next snapshot,
    so its memory (and so its next decisions) are the real run's."""

    def __init__(self) -> None:
        self.held: Set[str] = set()
        self.released: Set[str] = set()
        self.exc: Dict[str, str] = {}
        self.begun: Set[str] = set()
        self.parts: Dict[str, List[str]] = {}
        #: The ladder's: running jobs suspended / resumed / requeued.
        self.suspended: Set[str] = set()
        self.resumed: Set[str] = set()
        self.requeued: Set[str] = set()

    def record(self, outcomes: List[Outcome]) -> None:
        for out in outcomes:
            overlay = KIND[out.action.kind].overlay
            if out.ok and overlay is not None:
                overlay(self, out.action)

    def apply(self, snap: Snapshot) -> Snapshot:
        import dataclasses

        jobs = []
        for j in snap.jobs:
            if not j.pending and j.id in self.requeued:
                j = dataclasses.replace(j, state="PENDING", nodes=(), reason="BeginTime")
            elif j.state == "RUNNING" and j.id in self.suspended:
                j = dataclasses.replace(j, state="SUSPENDED")
            elif j.state == "SUSPENDED" and j.id in self.resumed:
                j = dataclasses.replace(j, state="RUNNING")
            elif j.pending:
                self.requeued.discard(j.id)  # Slurm shows it pending: the overlay is done
            if j.pending and (j.id in self.held or j.id in self.released or j.id in self.exc
                              or j.id in self.begun):
                held = j.id in self.held or (j.held and j.id not in self.released)
                reason = "JobHeldAdmin" if held else (
                    "Priority" if j.reason in ("JobHeldAdmin", "JobHeldUser")
                    or (j.id in self.begun and j.reason == "BeginTime") else j.reason)
                j = dataclasses.replace(j, held=held, reason=reason,
                                        exc_nodes=self.exc.get(j.id, j.exc_nodes))
            jobs.append(j)
        parts = dict(snap.partitions)
        for name, nodes in self.parts.items():
            if name in parts:
                parts[name] = tuple(nodes)
        return dataclasses.replace(snap, jobs=tuple(jobs), partitions=parts)


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
        nudge: Optional[Callable[[Mapping[str, str]], None]] = None,
    ) -> None:
        self.policy = policy
        self.snapshot_fn = snapshot_fn
        self.applier = applier
        self.state_path = state_path
        self.lock = FileLock(lock_path, timeout=0)
        self.interval_s = interval_s
        self.dry_run = dry_run
        self.sleep = sleep
        #: Tells nodes (name -> address) to read their restraints from Slurm now: where a
        #: note is the action (park, host limit), the node acts this second, not at its round.
        self.nudge = nudge
        self.stats = Stats()
        self.memory = self.load_memory()
        self.stop_requested = False
        self.overlay = DryRunOverlay() if dry_run else None
        self.last_snapshot: Optional[Snapshot] = None

    def request_stop(self) -> None:
        """From a signal handler: finish the batch under way and the cycle, then stop."""
        self.stop_requested = True

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
        write_atomic(
            self.state_path,
            json.dumps({"version": STATE_VERSION, "memory": self.memory.to_dict()}),
        )

    # ----------------------------------------------------------------------------- cycle
    def cycle(self) -> List[Outcome]:
        """One snapshot -> decide -> apply; returns what was (or, dry-run, would be) done."""
        started = time.monotonic()
        snap = self.snapshot_fn()
        if self.overlay is not None:
            snap = self.overlay.apply(snap)
        self.last_snapshot = snap
        t0 = time.perf_counter()
        collect = gc.isenabled()
        gc.disable()  # decide() makes no cycles; a full collection over 60,000 jobs costs more
        try:
            actions, memory = decide(snap, self.policy, self.memory)
        finally:
            if collect:
                gc.enable()
        self.stats.last_decide_s = time.perf_counter() - t0
        if actions and not self.dry_run:
            memory.intent = intent_of(actions)
            self.memory = memory
            self.save_memory()  # intent first: a crash from here on is reconciled
        outcomes = self.applier.apply(actions, self.dry_run, stop=lambda: self.stop_requested)
        for out in outcomes:
            if not out.ok:
                memory = failed(memory, out.action, out.error)
        if not self.dry_run:
            self._nudge(snap, outcomes)
        memory.intent = []
        if self.overlay is not None:
            self.overlay.record(outcomes)
        self._telemetry_changes(snap, memory)
        if set(memory.stale) != set(self.memory.stale):
            if memory.stale:
                log.warning("monitor: unknown or stale telemetry for %s: no new training "
                            "admitted there", ", ".join(memory.stale[:20]))
            else:
                log.info("monitor: telemetry fresh again")
            self._journal_unknown(snap, memory)
        self.memory = memory
        if not self.dry_run:
            self.save_memory()
        self._count(snap, outcomes, time.monotonic() - started)
        return outcomes

    def _nudge(self, snap: Snapshot, outcomes: List[Outcome]) -> None:
        """Nudge the nodes whose notes changed and that act on them themselves."""
        from slurmiso.monitor.actions import KIND

        if self.nudge is None:
            return
        nodes: Dict[str, str] = {}
        for out in outcomes:
            node = str(out.action.details.get("node") or "")
            if out.ok and node and KIND[out.action.kind].node_acts:
                info = snap.node(node)
                nodes[node] = info.addr if info is not None else ""
        if nodes:
            try:
                self.nudge(nodes)
            except Exception as exc:  # noqa: BLE001 - a nudge only hastens: the round comes
                log.warning("monitor: could not nudge %s: %s", ", ".join(sorted(nodes)), exc)

    def _telemetry_changes(self, snap: Snapshot, memory: Memory) -> None:
        """A WARNING when nodes' telemetry turns unknown (an agent stops answering) and a
        line when it is back, once per change, never every cycle; each change journaled
        (``monitor-telemetry``), which the audit reads as how long each node was unknown.
        Unknown signals tied to no node (a Prometheus query) warn when a new kind appears."""
        from slurmiso.monitor import unknown

        found = unknown.changes(self.memory, memory, snap.ts)
        lost = [c for c in found if c.state == unknown.UNKNOWN]
        back = [c for c in found if c.state == unknown.KNOWN]
        if lost:
            log.warning("monitor: telemetry unknown for %d node(s): %s%s: no step and no "
                        "release of the ladder there, no new training where admission "
                        "needs it", len(lost), ", ".join(f"{c.node} ({c.reason})"
                                                         for c in lost[:20]),
                        f" and {len(lost) - 20} more" if len(lost) > 20 else "")
            for err in snap.errors[:5]:
                log.warning("monitor: telemetry: %s", err)
        if back:
            log.info("monitor: telemetry known again for %s", ", ".join(
                f"{c.node} (unknown {c.unknown_s:.0f}s)" if c.unknown_s is not None
                else c.node for c in back[:20]))
        new_kinds = sorted(set(memory.unknown_signals) - set(self.memory.unknown_signals))
        if new_kinds and not lost:
            log.warning("monitor: telemetry signals unknown: %s%s", ", ".join(
                f"{k} x{memory.unknown_signals[k]}" for k in new_kinds[:20]),
                f" ({snap.errors[0]})" if snap.errors else "")
        journal = getattr(self.applier, "journal", None)
        kinds_changed = set(memory.unknown_signals) != set(self.memory.unknown_signals)
        if journal is None or not (found or kinds_changed):
            return
        try:
            for c in found:
                journal.append(unknown.EVENT, source=MONITOR_SOURCE, dry_run=self.dry_run,
                               **c.journal_fields())
            if kinds_changed:  # e.g. DCGM series that map to no node (issue 32)
                journal.append(unknown.SIGNALS_EVENT, source=MONITOR_SOURCE,
                               dry_run=self.dry_run, unknown=dict(memory.unknown_signals),
                               new=new_kinds, detail=list(snap.errors[:3]))
        except OSError as exc:
            log.warning("monitor: cannot write the journal: %s", exc)

    def _journal_unknown(self, snap: Snapshot, memory: Memory) -> None:
        """One journal line whenever the set of unknown scopes changes: which, since when,
        and the reasons counted per source this cycle."""
        journal = getattr(self.applier, "journal", None)
        if journal is None:
            return
        try:
            journal.append("monitor-unknown", source=MONITOR_SOURCE, dry_run=self.dry_run,
                           unknown=dict(memory.unknown_since), reasons=dict(snap.unknown),
                           errors=list(snap.errors[:20]))
        except OSError as exc:
            log.warning("monitor: cannot write the journal: %s", exc)

    def _count(self, snap: Snapshot, outcomes: List[Outcome], took: float) -> None:
        st = self.stats
        st.cycles += 1
        st.slurm_failures = 0 if snap.slurm_ok else st.slurm_failures + 1
        for out in outcomes:
            key = f"{out.action.name}/{'ok' if out.ok else 'failed'}"
            st.actions[key] = st.actions.get(key, 0) + 1
        st.last_cycle_ts = snap.ts
        st.last_cycle_s = took
        st.held_jobs = len(self.memory.holds)
        st.lent_nodes = len(self.memory.lent)
        st.closed_gates = sorted(k for k, g in self.memory.gates.items() if g.closed)
        st.stale_scopes = list(self.memory.stale)
        st.telemetry_errors = len(snap.errors)
        st.slurm_ok = snap.slurm_ok
        from slurmiso.monitor.unknown import view

        seen = view(self.memory, snap.ts)  # what `monitor status` shows too
        st.unknown = dict(seen["signals"])
        st.unknown_nodes = {n: (v["for_s"], v["reason"]) for n, v in seen["nodes"].items()}
        st.excluded_jobs = len(self.memory.excluded)
        steps: Dict[str, int] = {}
        for rung in self.memory.ladder.values():
            steps[rung.step] = steps.get(rung.step, 0) + 1
        st.ladder_gpus = steps
        st.restrained = {
            "throttled": sum(1 for r in self.memory.restrained.values()
                             if r.throttled_since is not None),
            "suspended": sum(1 for r in self.memory.restrained.values()
                             if r.suspended_since is not None)}
        parked = sum(1 for r in self.memory.restrained.values() if r.parked_since is not None)
        if parked:  # the park rung's, only where it parks (issue 35)
            st.restrained["parked"] = parked
        if self.memory.host_limited:  # the host rung's, only where it limits (issue 36)
            st.restrained["host-limited"] = len(self.memory.host_limited)
        stamps = [h.ts for h in self.memory.holds.values()]
        st.oldest_hold_s = max(0.0, snap.ts - min(stamps)) if stamps else None
        by: Dict[str, int] = {}
        for h in self.memory.holds.values():
            key = h.kind
            by[key] = by.get(key, 0) + 1
        st.held_by_reason = by

    def next_wait(self) -> float:
        """The interval, doubled per consecutive cycle Slurm did not answer (capped)."""
        n = self.stats.slurm_failures
        return min(self.interval_s * float(2 ** min(n, 10)), max(MAX_BACKOFF_S, self.interval_s))

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
        while (cycles is None or done < cycles) and not self.stop_requested:
            if not self.try_lead():
                if not idle_logged:
                    log.warning("monitor: another monitor holds %s: idle", self.lock.lock_file)
                    idle_logged = True
                if once:
                    return
                self._wait(self.interval_s)
                continue
            idle_logged = False
            try:
                outcomes = self.cycle()
            except EndOfSnapshots:
                return
            yield outcomes
            done += 1
            if once or self.stop_requested:
                return
            wait = self.next_wait()
            if wait > self.interval_s:
                log.warning("monitor: Slurm unreachable %d time(s); next cycle in %.0fs",
                            self.stats.slurm_failures, wait)
            self._wait(wait)

    def _wait(self, seconds: float) -> None:
        """Sleep in short slices so SIGTERM ends the wait promptly."""
        if self.sleep is not time.sleep:
            self.sleep(seconds)  # an injected sleep (tests) sees the whole wait once
            return
        end = time.monotonic() + seconds
        while not self.stop_requested:
            left = end - time.monotonic()
            if left <= 0:
                return
            time.sleep(min(left, 1.0))

    def close(self) -> None:
        self.lock.release()
        self.stats.leader = False


def file_snapshots(path: str) -> Tuple[Callable[[], Snapshot], bool]:
    """Replay recorded snapshots, each with its own timestamp, and whether they are a
    sequence: a folder or JSON-lines file is one (replayed without waiting between cycles;
    the monitor stops after its last); a single snapshot file is re-read each cycle, so it
    can be replaced meanwhile."""
    seq = snapmod.load_sequence(path)
    if len(seq) == 1 and not os.path.isdir(path):
        return (lambda: snapmod.load_sequence(path)[0]), False
    it = iter(seq)

    def nxt() -> Snapshot:
        try:
            return next(it)
        except StopIteration:
            raise EndOfSnapshots() from None
    return nxt, True


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
            ("slurmiso_monitor_excluded_jobs", "Pending training jobs kept off hot nodes",
             st.excluded_jobs),
        ):
            yield GaugeMetricFamily(name, text, value=float(value))
        if st.oldest_hold_s is not None:  # no hold: no sample (never a misleading 0)
            yield GaugeMetricFamily("slurmiso_monitor_oldest_hold_seconds",
                                    "Age of the oldest hold this monitor keeps",
                                    value=st.oldest_hold_s)
        held = GaugeMetricFamily("slurmiso_monitor_held_jobs_by_reason",
                                 "Training jobs held, by why", labels=["reason"])
        for reason, n in sorted(st.held_by_reason.items()):
            held.add_metric([reason], float(n))
        yield held
        unknown = GaugeMetricFamily("slurmiso_monitor_unknown_signals",
                                    "Signals unknown last cycle, by source and reason",
                                    labels=["source", "reason"])
        for key, n in sorted(st.unknown.items()):
            src, _, why = key.partition("/")
            unknown.add_metric([src, why], float(n))
        yield unknown
        yield GaugeMetricFamily("slurmiso_monitor_unknown_telemetry_nodes",
                                "Pool nodes whose telemetry is unknown now",
                                value=float(len(st.unknown_nodes)))
        nodes = GaugeMetricFamily("slurmiso_monitor_unknown_telemetry_seconds",
                                  "How long a node's telemetry has been unknown",
                                  labels=["node", "reason"])
        for node, (secs, why) in sorted(st.unknown_nodes.items()):
            nodes.add_metric([node, why], float(secs or 0.0))
        yield nodes
        gates = GaugeMetricFamily("slurmiso_monitor_gate_closed",
                                  "1 while training admission is closed for a scope",
                                  labels=["scope"])
        for scope in st.closed_gates:
            gates.add_metric([scope], 1.0)
        yield gates
        rungs = GaugeMetricFamily("slurmiso_monitor_ladder_gpus",
                                  "GPUs where the ladder holds a step, by step", labels=["step"])
        for step, n in sorted(st.ladder_gpus.items()):
            rungs.add_metric([step], float(n))
        yield rungs
        held_back = GaugeMetricFamily("slurmiso_monitor_restrained_jobs",
                                      "Training jobs the ladder throttles, suspends or "
                                      "host-limits",
                                      labels=["state"])
        for state, n in sorted(st.restrained.items()):
            held_back.add_metric([state], float(n))
        yield held_back
        stale = GaugeMetricFamily("slurmiso_monitor_stale", "1 while a scope's data is stale",
                                  labels=["scope"])
        for scope in st.stale_scopes:
            stale.add_metric([scope], 1.0)
        yield stale
