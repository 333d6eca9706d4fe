"""The monitor's pure core: ``decide(snapshot, policy, memory) -> (actions, memory)``.

No I/O, no clock, no logging: time is ``snapshot.ts``, and everything remembered between
cycles goes in and out as :class:`~slurmiso.monitor.policy.Memory`. So a recorded snapshot
replays exactly, dry-run is the same call with the actions left unapplied, and the tests are
tables. Each policy is one function:

* admission (:mod:`slurmiso.monitor.admission`): per-node gates and the inference SLO keep
  new training off nodes where inference's GPUs are hot or unknown; starts are staggered in
  Slurm's priority order;
* the ladder (:mod:`slurmiso.monitor.ladder`): where an inference job breaches its SLO, the
  training sharing its GPU is held off, throttled, suspended, requeued, one step at a time;
  where the breach is host contention, the host rung (:mod:`slurmiso.monitor.host_ladder`)
  rate-limits the training the diagnosis names on that node (off unless configured);
* partitions: idle inference nodes are lent to a training partition; when inference waits,
  only the nodes it needs come back (at most ``partition_updates_per_hour`` lendings);
* MIG re-layout (:mod:`slurmiso.monitor.relayout`): one node at a time, hourly limited;
* reconcile: a periodic clean-up per node this host can reach.

Before deciding, actions a previous monitor intended but may not have applied (it was
killed mid-batch) are reconciled with what Slurm shows (:func:`reconcile_intent`).
"""

from __future__ import annotations

from typing import Dict, List, Tuple

from slurmiso.hostlist import compress
from slurmiso.monitor.action import Action, ActionKind
from slurmiso.monitor.actions import KIND, RECONCILE_BY_JOURNAL
from slurmiso.monitor.admission import admission
from slurmiso.monitor.admission_state import Loan
from slurmiso.monitor.adopt import adopt_notes
from slurmiso.monitor.attribution import Attribution
from slurmiso.monitor.host_ladder import host_ladder
from slurmiso.monitor.ladder import ladder
from slurmiso.monitor.policy import Memory, Policy
from slurmiso.monitor.relayout import relayout
from slurmiso.monitor.snapshot import JobInfo, Snapshot, jobs_by_node
from slurmiso.monitor.unknown import track as track_unknown

#: Each kind's place in the order actions are applied (a dict: 40,000 actions a cycle).
_RANK = {kind: spec.rank for kind, spec in KIND.items()}


def decide(snap: Snapshot, policy: Policy, memory: Memory) -> Tuple[List[Action], Memory]:
    """The actions for this snapshot and the memory to keep; ``memory`` is not changed."""
    mem = memory.copy()
    if not snap.slurm_ok:  # nothing is known about the queue: change nothing
        return [], mem
    if mem.intent:
        reconcile_intent(snap, mem)
    adopt_notes(snap, mem)
    track_unknown(snap, policy, mem)
    running = jobs_by_node(list(snap.jobs))
    actions = relayout(snap, policy, mem, running)
    actions += _partitions(snap, policy, mem, running)
    who = Attribution(snap, policy.train_classes)
    steps, held = ladder(snap, policy, mem, who)
    steps += host_ladder(snap, policy, mem, who)
    actions += admission(snap, policy, mem, who, held)
    actions += steps
    actions += _reconcile(snap, policy, mem, running)
    actions.sort(key=lambda a: _RANK[a.kind])
    mem.last_ts = snap.ts
    return actions, mem


def intent_of(actions: List[Action]) -> List[List[str]]:
    """What the loop writes down before applying ``actions`` (kind, target, moved nodes)."""
    return [[a.name, a.target, str(a.details.get("op", "")),
             ",".join(a.details.get("moved", ()))] for a in actions]


def reconcile_intent(snap: Snapshot, mem: Memory) -> None:
    """Square what the monitor meant to do before it stopped with what Slurm shows, each
    kind as its table entry says (:mod:`slurmiso.monitor.undo`)."""
    jobs = {j.id: j for j in snap.jobs if j.pending}
    for kind, target, op, moved in (tuple(x) + ("", "", "", "")[:4 - len(x)]
                                    for x in mem.intent):
        square = RECONCILE_BY_JOURNAL.get(kind)
        if square is not None:
            square(snap, mem, jobs.get(target), target, op, moved)
    mem.intent = []


def failed(memory: Memory, action: Action, error: str) -> Memory:
    """The memory to keep when applying ``action`` failed: as if it had not been decided,
    so the next cycle tries again (or, for a re-layout, puts the node back in service)."""
    mem = memory.copy()
    undo = KIND[action.kind].undo
    if undo is not None:
        undo(mem, action, error)
    return mem


# ---------------------------------------------------------------------------- partitions
def _partitions(
    snap: Snapshot, policy: Policy, mem: Memory, running: Dict[str, List[JobInfo]]
) -> List[Action]:
    for node in snap.nodes:
        idle = node.usable and not running.get(node.name) and node.flags[0].startswith("IDLE")
        if not idle:
            mem.idle_since.pop(node.name, None)
        elif node.name not in mem.idle_since:
            mem.idle_since[node.name] = snap.ts
    if not policy.lend:
        return []
    train = set(policy.train_classes)
    members = {p: list(ns) for p, ns in snap.partitions.items()}
    busy = mem.relayout["node"] if mem.relayout else ""
    actions: List[Action] = []
    for frm, to in policy.lend:
        if frm not in members or to not in members:
            continue
        lent = [n for n, r in sorted(mem.lent.items()) if r.borrower == to
                and r.lender in (frm, "")]
        for n in lent:
            if n not in members[to]:  # an admin took it back: forget it
                del mem.lent[n]
        lent = [n for n in lent if n in members[to]]
        waiting = [j for j in snap.jobs if frm in j.partitions and j.eligible
                   and j.job_class not in train]
        users = sorted({j.id for n in lent for j in running.get(n, [])
                        if j.job_class not in train})
        serving = sorted({n for n in lent for j in running.get(n, [])
                          if j.job_class not in train})
        # Only the nodes waiting inference needs come back: its node count, less the idle
        # nodes it still has; idle lent nodes first (no training to requeue there).
        need = sum(max(1, j.num_nodes) for j in waiting)
        spare = [n for n in members[frm] if n in mem.idle_since and n not in members[to]]
        short = max(0, need - len(spare))
        order = sorted((n for n in lent if n not in serving),
                       key=lambda n: (bool(running.get(n)), n))
        back = serving + order[:short]
        if back:
            why = (f"{len(waiting)} {frm} job(s) wait for {need} node(s), "
                   f"{len(spare)} idle there" if short else
                   f"{frm} job(s) {','.join(users)} run on {compress(serving)}")
            members[to] = [n for n in members[to] if n not in back]
            for n in back:
                del mem.lent[n]
                mem.idle_since[n] = snap.ts  # idle for a full dwell again before re-lending
            mem.note("partition-update", snap.ts)
            actions.append(Action(
                ActionKind.PARTITION_UPDATE, to, f"reclaim {compress(back)} for {frm}: {why}",
                {"op": "reclaim", "from": frm, "moved": back, "nodes": members[to]}))
            continue
        if waiting or mem.count("partition-update", snap.ts) >= \
                policy.partition_updates_per_hour:
            continue
        free = [n for n in members[frm] if n in mem.idle_since and n not in members[to]]
        lendable = [n for n in free if n != busy
                    and snap.ts - mem.idle_since[n] >= policy.min_dwell_s]
        lendable = lendable[:max(0, len(free) - policy.lend_reserve)]
        if lendable:
            members[to] = members[to] + lendable
            for n in lendable:
                mem.lent[n] = Loan(frm, to, snap.ts)
            mem.note("partition-update", snap.ts)
            actions.append(Action(
                ActionKind.PARTITION_UPDATE, to,
                f"lend idle {compress(lendable)} of {frm} to {to}: nothing pending there, idle "
                f">= {policy.min_dwell_s:g}s "
                f"({policy.partition_updates_per_hour}/h partition updates at most)",
                {"op": "lend", "from": frm, "moved": lendable, "nodes": members[to]}))
    return actions


# ----------------------------------------------------------------------------- reconcile
def _reconcile(
    snap: Snapshot, policy: Policy, mem: Memory, running: Dict[str, List[JobInfo]]
) -> List[Action]:
    if policy.reconcile_every_s <= 0:
        return []
    names = {n.name for n in snap.nodes}
    actions = []
    for node in policy.reconcile_nodes:
        if node not in names or snap.ts - mem.reconciled.get(node, -1e18) \
                < policy.reconcile_every_s:
            continue
        mem.reconciled[node] = snap.ts
        # a suspended job still holds its GPUs and its isolation: it is live, never "ended"
        live = sorted({j.id for j in running.get(node, [])} |
                      {j.id for j in snap.jobs if j.state == "SUSPENDED" and node in j.nodes})
        actions.append(Action(ActionKind.RECONCILE, node,
                              "periodic clean-up of what ended jobs left", {"live_jobs": live}))
    return actions
