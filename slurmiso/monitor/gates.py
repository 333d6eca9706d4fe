"""Admission's gates (pure): each shared node's verdict, and per scope (a node, a partition,
the inference SLO) whether new training may start there, computed once a cycle.

>>> from slurmiso.monitor.gates import GateState, Scope
>>> Scope.of_key("node:n1"), Scope.of_key("slo").key, Scope.partition("train").key
(Scope(kind=<ScopeKind.NODE: 'node'>, name='n1'), 'slo', 'train')

Signals first: each shared node is HOT, CALM, BETWEEN or UNKNOWN. A missing value is unknown,
never 0 %: SM activity falls back to graphics-engine activity (busier or equal, so the stand-in
errs towards inference) and, with neither, the node is unknown; an agent that answered without
GPU series, or data older than ``max_data_age_s``, is unknown too. Unknown admits no *new*
training (``unknown_admits`` turns that off) and never opens or closes a gate.

Each node has a gate (``nodes`` admission) or each partition has (``hold``, ``qos-limit``): it
closes at once when hot, opens after ``min_dwell_s`` of calm and at most
``gate_opens_per_hour``; the SLO has one.
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass, field
from typing import Any, Dict, Optional, Sequence, Set, Tuple

from slurmiso.config.model import SHARED_MODES
from slurmiso.monitor.admission_state import Gate
from slurmiso.monitor.attribution import Attribution
from slurmiso.monitor.policy import Memory, Policy
from slurmiso.monitor.snapshot import NodeInfo, Snapshot

SLO_SCOPE = "slo"
HOT, CALM, BETWEEN, UNKNOWN = "hot", "calm", "between", "unknown"
Verdict = Tuple[str, str, Dict[str, Any]]


class GateState(enum.Enum):
    """A scope's gate after this snapshot."""

    OPEN = "open"
    CLOSED = "closed"
    #: Its data is unknown or stale: the gate neither opens nor closes.
    UNKNOWN = "unknown"


class ScopeKind(enum.Enum):
    NODE = "node"
    PARTITION = "partition"
    SLO = "slo"


@dataclass(frozen=True)
class Scope:
    """What a gate guards: a node, a partition or the inference SLO. ``key`` is its name in
    the memory (``node:<name>``, the partition's name, ``slo``)."""

    kind: ScopeKind
    name: str = ""

    @classmethod
    def node(cls, name: str) -> Scope:
        return cls(ScopeKind.NODE, name)

    @classmethod
    def partition(cls, name: str) -> Scope:
        return cls(ScopeKind.PARTITION, name)

    @classmethod
    def of_key(cls, key: str) -> Scope:
        """The scope a memory key names."""
        if key == SLO_SCOPE:
            return SLO
        kind, sep, name = key.partition(":")
        if sep and kind == ScopeKind.NODE.value:
            return cls.node(name)
        return cls.partition(key)

    @property
    def key(self) -> str:
        if self.kind is ScopeKind.NODE:
            return f"node:{self.name}"
        return SLO_SCOPE if self.kind is ScopeKind.SLO else self.name


SLO = Scope(ScopeKind.SLO)


def node_load(node: NodeInfo, policy: Policy,
              who: Optional[Attribution] = None) -> Optional[Verdict]:
    """The verdict on one node's shared GPUs; None for nodes admission ignores (exclusive
    pools, nodes Slurm does not schedule on). With ``who``, only the GPUs inference uses
    count: training's own load never keeps training off a node (a node with no inference
    is calm, whatever its GPUs do)."""
    if node.mode not in SHARED_MODES or not node.usable:
        return None
    name = node.name
    serving = who.inference_gpus(node) if who is not None else None
    if serving is not None and not serving:
        return CALM, f"no inference on {name}", {"node": name}
    if node.telemetry_age_s is None:
        return UNKNOWN, f"no telemetry from {name}", {"node": name, "unknown": "telemetry"}
    if node.telemetry_age_s > policy.max_data_age_s:
        return UNKNOWN, (f"telemetry from {name} is {node.telemetry_age_s:.0f}s old "
                         f"(limit {policy.max_data_age_s:g}s)"), {"node": name,
                                                                  "unknown": "stale"}
    if not node.gpus:
        return UNKNOWN, f"{name} reported no GPUs", {"node": name, "unknown": "gpus"}
    best: Optional[Tuple[float, Any, Optional[float], Optional[float], str, bool]] = None
    calm = True
    unknown = ""
    for gpu in node.gpus:
        if serving is not None and gpu.index not in serving:
            continue
        mem = gpu.memory_pct
        act, what = gpu.sm_active_pct, "SM"
        if act is None:
            act, what = gpu.gr_active_pct, "graphics-engine activity"
        if mem is None or act is None:
            unknown = unknown or (f"{name} GPU {gpu.index} "
                                  f"{'memory' if mem is None else 'SM activity'} unknown")
        over_m = -1e9 if mem is None else mem - policy.memory_used_pct
        over_a = -1e9 if act is None else act - policy.sm_active_pct
        if (mem is not None and mem >= policy.release_memory_pct) or (
                act is not None and act >= policy.release_sm_pct):
            calm = False
        over = max(over_m, over_a)
        if best is None or over > best[0]:
            best = (over, gpu, mem, act, what, over_m >= over_a)
    if best is None:
        return UNKNOWN, f"{name} reported none of the GPUs inference uses", {
            "node": name, "unknown": "gpus"}
    over, g, mem, act, what, by_mem = best
    if over < 0 and unknown:
        return UNKNOWN, unknown, {"node": name, "unknown": "signal"}
    text = (f"memory {mem:.0f}% (limit {policy.memory_used_pct:g}%)" if by_mem and mem is not None
            else f"{what} {act:.0f}% (limit {policy.sm_active_pct:g}%)" if act is not None
            else "no figures")
    facts = {"node": name, "gpu": g.index,
             "memory_pct": None if mem is None else round(mem, 1),
             "sm_active_pct": None if g.sm_active_pct is None else round(g.sm_active_pct, 1),
             "gr_active_pct": None if g.gr_active_pct is None else round(g.gr_active_pct, 1)}
    verdict = HOT if over >= 0 else CALM if calm else BETWEEN
    there = ""
    if who is not None:
        ids = who.inference_on(name, g)
        there = (f", inference job {','.join(ids[:3])}{'...' if len(ids) > 3 else ''} there"
                 if ids else ", inference there")
        facts["inference_jobs"] = ids[:10]
    return verdict, f"{name} GPU {g.index} {text}{there}", facts


def combine(verdicts: Sequence[Verdict]) -> Verdict:
    """A partition's verdict from its nodes': hot if one is, else unknown if one is."""
    for kind in (HOT, UNKNOWN, BETWEEN):
        hit = [v for v in verdicts if v[0] == kind]
        if hit:
            if kind == HOT:
                return max(hit, key=lambda v: _over(v[2]))
            return hit[0]
    return CALM, "no hot shared GPUs", {}


def _over(facts: Dict[str, Any]) -> float:
    return max(facts.get("memory_pct") or 0.0, facts.get("sm_active_pct") or 0.0,
               facts.get("gr_active_pct") or 0.0)


def slo_load(snap: Snapshot, policy: Policy) -> Verdict:
    """HOT when an inference class's eligible jobs wait, or it answers, beyond its SLO;
    UNKNOWN when a configured latency figure is missing or old; CALM when below by the
    hysteresis margin. Jobs waiting for a BeginTime, a dependency or a hold do not count."""
    margin = 1.0 - policy.hysteresis_pct / 100.0
    oldest: Dict[str, float] = {}
    classes = {s.class_name for s in policy.slo}
    for job in snap.jobs:
        if job.eligible and job.submit_ts > 0 and job.job_class in classes:
            seen = oldest.get(job.job_class)
            if seen is None or job.submit_ts < seen:
                oldest[job.job_class] = job.submit_ts
    calm = True
    for slo in policy.slo:
        cls = slo.class_name
        wait = snap.ts - oldest[cls] if cls in oldest else 0.0
        if slo.max_queue_wait_s is not None:
            if wait > slo.max_queue_wait_s:
                return HOT, (f"{cls} jobs wait {wait:.0f}s for GPUs "
                             f"(SLO {slo.max_queue_wait_s:g}s)"), {
                    "class": cls, "queue_wait_s": round(wait, 1)}
            calm = calm and wait <= slo.max_queue_wait_s * margin
        if slo.p99_latency_ms is None or not slo.class_latency:
            continue
        p99 = snap.latency_p99_ms.get(cls)
        age = snap.latency_age_s
        if p99 is None:
            return UNKNOWN, f"no P99 latency for {cls}", {"class": cls, "unknown": "latency"}
        if age is None or age > policy.max_data_age_s:
            return UNKNOWN, (f"{cls} latency sample is "
                             f"{'of unknown age' if age is None else f'{age:.0f}s old'}"), {
                "class": cls, "unknown": "latency-age"}
        if p99 > slo.p99_latency_ms:
            return HOT, (f"{cls} P99 latency {p99:.0f} ms (SLO {slo.p99_latency_ms:g} ms)"), {
                "class": cls, "p99_latency_ms": round(p99, 1)}
        calm = calm and p99 <= slo.p99_latency_ms * margin
    return (CALM if calm else BETWEEN), "inference within its SLO", {}


def gate(mem: Memory, scope: Scope, verdict: str, why: str, now: float,
         policy: Policy) -> GateState:
    """``scope``'s gate after this snapshot.

    Closes at once when hot (inference first); opens only after it has been calm, below the
    threshold by the hysteresis margin, for ``min_dwell_s``, ``min_dwell_s`` after closing,
    and while fewer than ``gate_opens_per_hour`` openings happened in the last hour."""
    key = scope.key
    old = mem.gates.get(key)
    if verdict == UNKNOWN:
        return GateState.UNKNOWN
    if old is None:
        if verdict != HOT:
            return GateState.OPEN  # open and never closed: nothing to remember (3,000 nodes)
        old = Gate()
    new = old
    if not old.closed:
        if verdict == HOT:
            new = Gate(True, now, None, why)
    elif verdict == CALM:
        calm_since = old.calm_since if old.calm_since is not None else now
        new = dataclasses.replace(old, calm_since=calm_since)
        if (now - calm_since >= policy.min_dwell_s and now - old.since >= policy.min_dwell_s
                and mem.count(f"open:{key}", now) < policy.gate_opens_per_hour):
            mem.note(f"open:{key}", now)
            new = Gate(False, now, None, why)
    else:
        new = dataclasses.replace(old, calm_since=None)
    if new != old:
        mem.gates[key] = new
    return GateState.CLOSED if new.closed else GateState.OPEN


@dataclass
class Gates:
    """This cycle's gates: per node its verdict and, where training is kept off it, why
    (closed, or unknown); per partition and the SLO its gate and the verdict behind it."""

    verdicts: Dict[str, Verdict] = field(default_factory=dict)
    closed: Dict[str, str] = field(default_factory=dict)
    unknown: Dict[str, str] = field(default_factory=dict)
    #: Partition or SLO scope key -> its gate, and the verdict it rests on.
    scopes: Dict[str, GateState] = field(default_factory=dict)
    why: Dict[str, Verdict] = field(default_factory=dict)

    @property
    def blocked(self) -> Dict[str, str]:
        """Nodes training is kept off: unknown or closed (closed's reason first)."""
        return dict(self.unknown, **self.closed)

    def state(self, key: str) -> GateState:
        """A scope's gate; a scope with none is unknown."""
        return self.scopes.get(key, GateState.UNKNOWN)

    def keeps_off(self, key: str, unknown_admits: bool) -> bool:
        """Whether the scope admits no new training: closed, or unknown unless unknown
        admits."""
        st = self.scopes.get(key)
        return st is GateState.CLOSED or (st is GateState.UNKNOWN and not unknown_admits)


def node_gates(snap: Snapshot, policy: Policy, mem: Memory, who: Optional[Attribution],
               ladder_blocked: Dict[str, str]) -> Gates:
    """``nodes`` admission: each shared node's gate; a node the ladder holds is closed as
    long as it says, with its reason."""
    g = Gates()
    for node in snap.nodes:
        v = node_load(node, policy, who)
        if v is None:
            continue
        g.verdicts[node.name] = v
        state = gate(mem, Scope.node(node.name), v[0], v[1], snap.ts, policy)
        held = ladder_blocked.get(node.name)
        if held is not None:
            g.closed[node.name] = held
        elif state is GateState.CLOSED:
            g.closed[node.name] = (mem.gates[Scope.node(node.name).key].why if v[0] != HOT
                                   else v[1])
        elif state is GateState.UNKNOWN:
            g.unknown[node.name] = v[1]
    _forget_node_gates(mem, g.verdicts)
    _slo_gate(snap, policy, mem, g)
    return _finish(snap, policy, mem, g)


def partition_gates(snap: Snapshot, policy: Policy, mem: Memory, who: Optional[Attribution],
                    ladder_blocked: Dict[str, str], parts: Set[str]) -> Gates:
    """``hold`` and ``qos-limit`` admission: the gate of each partition in ``parts`` from
    its nodes' verdicts; a node the ladder holds counts as hot."""
    g = Gates()
    for node in snap.nodes:
        v = node_load(node, policy, who)
        if v is None:
            continue
        held = ladder_blocked.get(node.name)
        if held is not None:
            v = (HOT, held, {"node": node.name, "ladder": "hold"})
        g.verdicts[node.name] = v
        if v[0] == UNKNOWN:
            g.unknown[node.name] = v[1]
    _forget_node_gates(mem, {})
    _slo_gate(snap, policy, mem, g)
    for part in sorted(parts):
        v = combine([g.verdicts[n] for n in snap.partitions.get(part, ()) if n in g.verdicts])
        g.scopes[part] = gate(mem, Scope.partition(part), v[0], v[1], snap.ts, policy)
        g.why[part] = v
    return _finish(snap, policy, mem, g)


def _forget_node_gates(mem: Memory, gated: Dict[str, Verdict]) -> None:
    """Node gone, no longer shared, or not gated per node any more: forget its gate."""
    for key in list(mem.gates):
        scope = Scope.of_key(key)
        if scope.kind is ScopeKind.NODE and scope.name not in gated:
            del mem.gates[key]


def _slo_gate(snap: Snapshot, policy: Policy, mem: Memory, g: Gates) -> None:
    """The SLO's gate; while it is not open, the nodes its classes need are kept off."""
    if not policy.slo:
        return
    v = slo_load(snap, policy)
    state = gate(mem, SLO, v[0], v[1], snap.ts, policy)
    g.scopes[SLO_SCOPE] = state
    g.why[SLO_SCOPE] = v
    if state is GateState.OPEN:
        return
    slo_gate = mem.gates.get(SLO_SCOPE)
    target = g.closed if state is GateState.CLOSED else g.unknown
    for name in _slo_nodes(snap, policy):
        target.setdefault(name, (slo_gate.why if slo_gate else "") or v[1])


def _finish(snap: Snapshot, policy: Policy, mem: Memory, g: Gates) -> Gates:
    """Unknown nodes admit as if calm where ``unknown_admits``; the scopes whose data is
    unknown are remembered, with since when."""
    if policy.unknown_admits:
        g.unknown = {}
    mem.stale = sorted(set(g.unknown) | {s for s, st in g.scopes.items()
                                         if st is GateState.UNKNOWN})
    since = {s: mem.unknown_since.get(s, snap.ts) for s in mem.stale}
    if since != mem.unknown_since:
        mem.unknown_since = since
    return g


def _slo_nodes(snap: Snapshot, policy: Policy) -> Set[str]:
    """Nodes the SLO classes need: their waiting jobs' partitions, else where they run."""
    classes = {s.class_name for s in policy.slo}
    parts = {p for j in snap.jobs if j.eligible and j.job_class in classes
             for p in j.partitions}
    out = {n for p in parts for n in snap.partitions.get(p, ())}
    if not out:
        out = {n for j in snap.jobs if j.state == "RUNNING" and j.job_class in classes
               for n in j.nodes}
    return out
