"""Training admission, the part of :func:`~slurmiso.monitor.decide.decide` that keeps new
training off GPUs that inference needs (pure: no I/O, no clock).

The gates come first (:mod:`slurmiso.monitor.gates`: per node or per partition, and the SLO's),
computed once; then one strategy per ``monitor.admission`` mode keeps training away from the
closed ones:

* ``nodes`` (:class:`NodesAdmission`): pending training jobs get the closed nodes of their
  partitions in ExcNodeList (their own exclusions kept) and a comment saying why; inference
  and running jobs untouched;
* ``hold`` (:class:`HoldAdmission`): a partition whose nodes are hot holds its pending
  training jobs;
* ``qos-limit`` (:class:`QosLimitAdmission`): see :mod:`slurmiso.monitor.caps`.

In ``nodes`` and ``hold`` new arrivals and releases share one start budget per
``stagger_interval_s`` (``stagger_max_starts``, more when free GPUs or the backlog call for it:
a backlog drains in about ``backlog_drain_s``), spent in Slurm's priority order; the excess is
held, "staggered".
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, FrozenSet, List, Optional, Protocol, Set, Tuple

from slurmiso.hostlist import compress
from slurmiso.monitor.action import Action, ActionKind
from slurmiso.monitor.admission_state import Hold
from slurmiso.monitor.attribution import Attribution
from slurmiso.monitor.exclusions import (
    NOTE_PREFIX,
    comment_is_free,
    exclusions,
    forget_started,
    members,
    note_is_ours,
)
from slurmiso.monitor.gates import (
    SLO_SCOPE,
    Gates,
    GateState,
    node_gates,
    partition_gates,
)
from slurmiso.monitor.policy import Memory, Policy
from slurmiso.monitor.snapshot import JobInfo, Snapshot

STAGGER = "stagger"


class Strategy(Protocol):
    """One ``monitor.admission`` mode: its gates, then what it does with them."""

    def gates(self, cyc: Cycle, ladder_blocked: Dict[str, str]) -> Gates: ...

    def admit(self, cyc: Cycle, g: Gates) -> List[Action]: ...


class Starting(Protocol):
    """A mode that spends the start budget: where a job could start now."""

    def open_for(self, cyc: Cycle, g: Gates, blocked: Dict[str, str]) -> OpenFor: ...


@dataclass
class Cycle:
    """What every strategy reads of this cycle: the snapshot, the pending jobs, the
    training among them, and the jobs someone else released (never held again)."""

    snap: Snapshot
    policy: Policy
    mem: Memory
    who: Optional[Attribution]
    pending: Dict[str, JobInfo]
    waiting: List[JobInfo]
    overridden: Set[str]
    #: Partition set -> its nodes (20,000 jobs share a few sets).
    members: Dict[Tuple[str, ...], FrozenSet[str]] = field(default_factory=dict)

    @classmethod
    def of(cls, snap: Snapshot, policy: Policy, mem: Memory,
           who: Optional[Attribution]) -> Cycle:
        train = set(policy.train_classes)
        pending = {j.id: j for j in snap.jobs if j.pending}
        return cls(snap, policy, mem, who, pending,
                   [j for j in pending.values() if j.job_class in train],
                   set(mem.overridden) & set(pending))



def admission(snap: Snapshot, policy: Policy, mem: Memory,
              who: Optional[Attribution] = None,
              ladder_blocked: Optional[Dict[str, str]] = None) -> List[Action]:
    """Gates, then holds / exclusions / releases / begin-time releases for training, as
    ``policy.admission``'s strategy does them. ``ladder_blocked``: nodes the ladder holds
    (an inference job there breaches its SLO), closed as long as it says, with its reason
    (its own dwell and hysteresis)."""
    cyc = Cycle.of(snap, policy, mem, who)
    started = forget_started(snap, mem)
    mode = MODES[policy.admission]
    return started + mode.admit(cyc, mode.gates(cyc, ladder_blocked or {}))


class NodesAdmission:
    """``nodes``: a gate per node; training is excluded from closed and unknown nodes."""

    def gates(self, cyc: Cycle, ladder_blocked: Dict[str, str]) -> Gates:
        return node_gates(cyc.snap, cyc.policy, cyc.mem, cyc.who, ladder_blocked)

    def open_for(self, cyc: Cycle, g: Gates, blocked: Dict[str, str]) -> OpenFor:
        def check(parts: Tuple[str, ...]) -> bool:
            nodes = members(cyc.snap, parts, cyc.members)
            return not nodes or any(n not in blocked for n in nodes)
        return OpenFor(check)

    def admit(self, cyc: Cycle, g: Gates) -> List[Action]:
        starts = Starts.of(cyc, g, self)
        starts.stagger()
        starts.hold_all_blocked()
        # Jobs held here because no node is open get their exclusions when one opens (in
        # that cycle, before the release: the applier runs "exclude" before "release").
        # (one pass, no set of ids: at 60,000 pending jobs a cycle's first hold of nearly
        # all of them makes this list the cycle's largest)
        holds = cyc.mem.holds
        rest = [j for j in cyc.waiting if j.id not in holds or starts.open_for(j)]
        starts.actions += exclusions(cyc.snap, cyc.mem, rest, cyc.overridden, starts.blocked,
                                     cyc.members)
        return starts.release()


class _PartitionGated:
    """A gate per partition (and the SLO's): ``hold`` and ``qos-limit``."""

    def gates(self, cyc: Cycle, ladder_blocked: Dict[str, str]) -> Gates:
        parts = {p for j in cyc.waiting for p in j.partitions}
        return partition_gates(cyc.snap, cyc.policy, cyc.mem, cyc.who, ladder_blocked, parts)


class HoldAdmission(_PartitionGated):
    """``hold``: pending training in a closed partition is held, released when calm."""

    def open_for(self, cyc: Cycle, g: Gates, blocked: Dict[str, str]) -> OpenFor:
        slo = [SLO_SCOPE] if cyc.policy.slo else []
        admits = cyc.policy.unknown_admits
        return OpenFor(lambda parts: not any(g.keeps_off(s, admits)
                                             for s in list(parts) + slo))

    def admit(self, cyc: Cycle, g: Gates) -> List[Action]:
        starts = Starts.of(cyc, g, self)
        starts.hold_closed()
        starts.stagger()
        return starts.release()


class QosLimitAdmission(_PartitionGated):
    """``qos-limit``: the training QoS is capped while a gate is closed; no holds."""

    def admit(self, cyc: Cycle, g: Gates) -> List[Action]:
        from slurmiso.monitor.caps import qos_caps, unhold_all

        # Unknown caps training at what runs (as a closed gate would), never lets it grow.
        unknown_is = GateState.OPEN if cyc.policy.unknown_admits else GateState.CLOSED
        capping = {s: unknown_is if st is GateState.UNKNOWN else st
                   for s, st in g.scopes.items()}
        return (qos_caps(cyc.snap, cyc.policy, cyc.mem, capping, g.why, cyc.waiting)
                + unhold_all(cyc.pending, cyc.mem))


#: ``monitor.admission`` -> its strategy.
MODES: Dict[str, Strategy] = {"nodes": NodesAdmission(), "hold": HoldAdmission(),
                         "qos-limit": QosLimitAdmission()}


class OpenFor:
    """Could a job start somewhere training is admitted now? (cached per partition set)"""

    def __init__(self, check: Callable[[Tuple[str, ...]], bool]) -> None:
        self._check = check
        self._cache: Dict[Tuple[str, ...], bool] = {}

    def __call__(self, job: JobInfo) -> bool:
        key = job.partitions
        if key not in self._cache:
            self._cache[key] = self._check(key)
        return self._cache[key]


@dataclass
class Starts:
    """The start budget shared by arrivals, releases and begin-time releases, and the
    actions that spend it (``hold`` and ``nodes`` admission)."""

    cyc: Cycle
    gates: Gates
    blocked: Dict[str, str]
    open_for: OpenFor
    arrivals: List[JobInfo]
    budget: int
    allowance: int
    backlog: int
    actions: List[Action] = field(default_factory=list)
    held_now: Set[str] = field(default_factory=set)
    #: Jobs an exclusion this cycle wrote its own note on (set before the releases).
    noted: Set[str] = field(default_factory=set)

    @classmethod
    def of(cls, cyc: Cycle, g: Gates, mode: Starting) -> Starts:
        snap, policy, mem = cyc.snap, cyc.policy, cyc.mem
        blocked = g.blocked
        arrivals = [j for j in cyc.waiting if mem.last_ts is not None
                    and j.submit_ts > mem.last_ts and not j.held and j.id not in mem.holds
                    and j.id not in cyc.overridden]
        arrivals.sort(key=_order)
        window = snap.ts - policy.stagger_interval_s
        mem.release_times = [t for t in mem.release_times if t > window]
        backlog = [h.ts for jid, h in mem.holds.items() if jid in cyc.pending]
        free = _free_gpus(snap, blocked, cyc.who)
        # The backlog (held jobs and this cycle's arrivals) must be gone backlog_drain_s
        # after its oldest hold: spread what is left over the intervals left.
        left = policy.backlog_drain_s - (snap.ts - min(backlog, default=snap.ts))
        budget = max(policy.stagger_max_starts, free,
                     math.ceil((len(backlog) + len(arrivals)) * policy.stagger_interval_s
                               / max(left, policy.stagger_interval_s)))
        return cls(cyc, g, blocked, mode.open_for(cyc, g, blocked), arrivals, budget,
                   max(0, budget - len(mem.release_times)), len(backlog))

    def hold_closed(self) -> None:
        """``hold``: pending training whose partition (or the SLO) is closed is held; an
        arrival that could start nowhere is held for the unknown scopes too. One hold record
        and one details dict per partition set, shared by its jobs (both are read-only once
        made: 20,000 holds cost 20,000 references, not dicts)."""
        cyc = self.cyc
        arrival_ids = {j.id for j in self.arrivals}
        group: Dict[Tuple[Tuple[str, ...], bool, bool],
                    Optional[Tuple[str, Hold, Dict[str, Any]]]] = {}
        holds, overridden = cyc.mem.holds, cyc.overridden
        for job in cyc.waiting:
            if job.id in holds or job.held or job.id in overridden:  # held, or released by someone
                continue
            key = (job.partitions, job.id in arrival_ids, comment_is_free(job.comment))
            if key not in group:
                group[key] = self._closed_hold(job, key[1], key[2])
            hit = group[key]
            if hit is not None:
                cyc.mem.holds[job.id] = hit[1]
                self.actions.append(Action(ActionKind.HOLD, job.id, hit[0], hit[2]))
                self.held_now.add(job.id)

    def _closed_hold(self, job: JobInfo, arrival: bool,
                     free_comment: bool) -> Optional[Tuple[str, Hold, Dict[str, Any]]]:
        """The hold of a job of this partition set (None: its scopes admit it)."""
        g = self.gates
        scopes = list(job.partitions) + ([SLO_SCOPE] if self.cyc.policy.slo else [])
        closing = [s for s in scopes if g.state(s) is GateState.CLOSED]
        if not closing and arrival and not self.open_for(job):
            closing = [s for s in scopes if g.state(s) is GateState.UNKNOWN]
        if not closing:
            return None
        text = f"training held: {g.why[closing[0]][1]}"
        return (text, Hold(self.cyc.snap.ts, tuple(closing), text),
                dict(g.why[closing[0]][2], scopes=closing, job_class=job.job_class,
                     partition=",".join(job.partitions),
                     comment=_note(text) if free_comment else None))

    def stagger(self) -> None:
        """Arrivals start within the budget, in priority order; the excess is held."""
        policy, mem = self.cyc.policy, self.cyc.mem
        text = (f"training staggered: {self.budget} start(s) per "
                f"{policy.stagger_interval_s:g}s (stagger {policy.stagger_max_starts}, "
                f"backlog drains in {policy.backlog_drain_s:g}s)")
        share: _HoldShare = {}
        for job in self.arrivals:
            if job.id in self.held_now or not self.open_for(job):
                continue  # held for its gate above, or its exclusions keep it off every node
            if self.allowance > 0:
                self.allowance -= 1
                mem.release_times.append(self.cyc.snap.ts)
                continue
            self.actions.append(_hold(job, self.cyc.snap.ts, [STAGGER], text,
                                      {"budget": self.budget}, mem, share))
            self.held_now.add(job.id)

    def hold_all_blocked(self) -> None:
        """``nodes``: a job every node of which is blocked is held, not excluded from all of
        them: Slurm may hold a job whose request no node can meet (BadConstraints) for
        good."""
        cyc = self.cyc
        all_blocked: Dict[Tuple[str, ...], Tuple[str, Dict[str, Any]]] = {}
        share: _HoldShare = {}
        holds, overridden = cyc.mem.holds, cyc.overridden
        for job in cyc.waiting:
            if (job.id in holds or job.held or job.id in overridden
                    or job.id in self.held_now or self.open_for(job)):
                continue
            if job.partitions not in all_blocked:
                names = sorted(members(cyc.snap, job.partitions, cyc.members))
                first = self.blocked.get(names[0], "") if names else ""
                nodes = compress(names)
                all_blocked[job.partitions] = ((
                    f"training held: every node it may use ({nodes}) is hot or "
                    f"unknown ({first})")[:250], {"nodes": nodes})
            reason, facts = all_blocked[job.partitions]
            self.actions.append(_hold(job, cyc.snap.ts, ["nodes"], reason, facts, cyc.mem,
                                      share))
            self.held_now.add(job.id)

    def release(self) -> List[Action]:
        """Our holds whose job can start now, highest priority first, within the budget;
        then the requeued jobs' begin-time releases. The cycle's actions."""
        from slurmiso.monitor.requeue import begin_now

        cyc = self.cyc
        candidates = self._forget_released()
        candidates.sort(key=_order)
        for job in candidates[:self.allowance]:
            self.actions.append(self._release(job))
        self.actions += begin_now(cyc.snap, cyc.policy, cyc.mem, cyc.pending, self.allowance,
                                  self.open_for, _order)
        cyc.mem.overridden = sorted(cyc.overridden)
        return self.actions

    def _noted(self) -> Set[str]:
        """Jobs an exclusion this cycle wrote its own note on: a release leaves it."""
        return {a.target for a in self.actions
                if a.kind == ActionKind.EXCLUDE and a.details.get("comment")}

    def _forget_released(self) -> List[JobInfo]:
        """Our holds that can be released now; holds whose job started, ended or was
        released by someone else are forgotten (the last never held again, and its hold
        note removed)."""
        cyc, mem = self.cyc, self.cyc.mem
        noted = self.noted = self._noted()
        candidates: List[JobInfo] = []
        for jid in list(mem.holds):
            mine = cyc.pending.get(jid)
            if jid in self.held_now:
                continue
            if mine is None:  # started, ended or cancelled: not ours to track any more
                del mem.holds[jid]
            elif not mine.held:  # someone released it: respect that, never hold it again
                del mem.holds[jid]
                cyc.overridden.add(jid)
                if mine.comment is not None and note_is_ours(mine.comment) \
                        and jid not in noted:
                    self.actions.append(Action(
                        ActionKind.UNCOMMENT, jid,
                        "released by someone else: the monitor's hold note is removed",
                        {"comment": mine.comment[:250]}))
            elif self.open_for(mine):
                candidates.append(mine)
        return candidates

    def _release(self, job: JobInfo) -> Action:
        snap, policy, mem = self.cyc.snap, self.cyc.policy, self.cyc.mem
        hold = mem.holds.pop(job.id)
        mem.release_times.append(snap.ts)
        self.allowance -= 1
        return Action(
            ActionKind.RELEASE, job.id,
            "calm: released in priority order" if hold.scopes != (STAGGER,)
            else "its turn in the start budget, in priority order",
            {"hold": hold.to_dict(), "held_s": round(snap.ts - hold.ts, 1),
             "partition": ",".join(job.partitions), "priority": job.priority,
             "budget": f"{self.budget}/{policy.stagger_interval_s:g}s",
             "backlog": self.backlog,
             "uncomment": note_is_ours(job.comment) and job.id not in self.noted})


def _order(job: JobInfo) -> Tuple[float, float, str]:
    """Slurm's order: highest priority first, then oldest submission."""
    return (-job.priority, job.submit_ts, job.id)


_HoldShare = Dict[Tuple[Any, ...], Tuple[Hold, Dict[str, Any]]]


def _note(reason: str) -> str:
    """The comment a held job shows its owner in ``squeue``: why it waits."""
    return f"{NOTE_PREFIX} {reason}"[:250]


def _hold(job: JobInfo, now: float, scopes: List[str], reason: str, facts: Dict[str, Any],
          mem: Memory, share: Optional[_HoldShare] = None) -> Action:
    """Hold ``job``; with ``share``, jobs alike get one (read-only) record and details.
    The details' ``comment`` is the note that tells the job's owner why (None: the job has
    a comment of its own, never replaced)."""
    ours = comment_is_free(job.comment)
    key = (job.partitions, job.job_class, reason, tuple(scopes), ours)
    if share is None or key not in share:
        made = (Hold(now, tuple(scopes), reason),
                dict(facts, scopes=scopes, job_class=job.job_class,
                     partition=",".join(job.partitions),
                     comment=_note(reason) if ours else None))
        if share is None:
            share = {}
        share[key] = made
    record, details = share[key]
    mem.holds[job.id] = record
    return Action(ActionKind.HOLD, job.id, reason, details)


def _free_gpus(snap: Snapshot, blocked: Dict[str, str], who: Optional[Attribution]) -> int:
    """GPUs with no job on usable nodes training may use: what can start right away."""
    on_gpu = who.on_gpu if who is not None else {}
    return sum(1 for n in snap.nodes if n.usable and n.name not in blocked
               for g in n.gpus
               if not g.jobs and not g.processes and (n.name, g.index) not in on_gpu)
