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
from slurmiso.monitor.admission import admission
from slurmiso.monitor.admission_state import Cap, Hold, Loan
from slurmiso.monitor.attribution import Attribution
from slurmiso.monitor.ladder import ladder
from slurmiso.monitor.ladder_state import Restraint
from slurmiso.monitor.policy import KINDS, Action, Memory, Policy
from slurmiso.monitor.relayout import relayout
from slurmiso.monitor.snapshot import JobInfo, Snapshot, jobs_by_node
from slurmiso.monitor.unknown import track as track_unknown

#: Each kind's place in the order actions are applied (a dict: 40,000 actions a cycle).
_RANK = {kind: i for i, kind in enumerate(KINDS)}


def decide(snap: Snapshot, policy: Policy, memory: Memory) -> Tuple[List[Action], Memory]:
    """The actions for this snapshot and the memory to keep; ``memory`` is not changed."""
    mem = memory.copy()
    if not snap.slurm_ok:  # nothing is known about the queue: change nothing
        return [], mem
    if mem.intent:
        reconcile_intent(snap, mem)
    track_unknown(snap, policy, mem)
    running = jobs_by_node(list(snap.jobs))
    actions = relayout(snap, policy, mem, running)
    actions += _partitions(snap, policy, mem, running)
    who = Attribution(snap, policy.train_classes)
    steps, held = ladder(snap, policy, mem, who)
    actions += admission(snap, policy, mem, who, held)
    actions += steps
    actions += _reconcile(snap, policy, mem, running)
    actions.sort(key=lambda a: _RANK[a.kind])
    mem.last_ts = snap.ts
    return actions, mem


def intent_of(actions: List[Action]) -> List[List[str]]:
    """What the loop writes down before applying ``actions`` (kind, target, moved nodes)."""
    return [[a.kind, a.target, str(a.details.get("op", "")),
             ",".join(a.details.get("moved", ()))] for a in actions]


def reconcile_intent(snap: Snapshot, mem: Memory) -> None:
    """Square what the monitor meant to do before it stopped with what Slurm shows: a hold
    that never happened is forgotten (not taken for an admin's release); a release that never
    happened is owned again (so it is released, never orphaned); a reclaim that never happened
    leaves the node lent; an exclusion that never happened is retried."""
    jobs = {j.id: j for j in snap.jobs if j.pending}
    for kind, target, op, moved in (tuple(x) + ("", "", "", "")[:4 - len(x)]
                                    for x in mem.intent):
        job = jobs.get(target)
        if kind == "hold" and job is not None and not job.held:
            mem.holds.pop(target, None)
        elif kind == "release" and job is not None and job.held and target not in mem.holds:
            mem.holds[target] = Hold(snap.ts, ("reconciled",),
                                     "a release the monitor meant before it stopped")
        elif kind == "exclude" and job is not None and target in mem.excluded:
            mem.excluded[target] = dict(mem.excluded[target], set=job.exc_nodes)
        elif kind == "begin-now" and job is not None and job.reason == "BeginTime":
            mem.requeued.setdefault(target, snap.ts)
        elif kind in ("suspend", "resume-job", "unthrottle"):
            _reconcile_restraint(snap, mem, kind, target)
        elif kind == "partition-update" and op == "reclaim":
            members = set(snap.partitions.get(target, ()))
            for node in (n for n in moved.split(",") if n in members):
                mem.lent.setdefault(node, Loan("", target, snap.ts))
    mem.intent = []


def _reconcile_restraint(snap: Snapshot, mem: Memory, kind: str, target: str) -> None:
    """A suspend Slurm does not show never happened; a resume it does not show is owed
    again (the job stays ours to resume); an unthrottle may not have been sent, so it is
    sent again (it is idempotent). A throttle is kept as if sent: the ladder escalates past
    a program that did not slow down anyway."""
    import dataclasses

    live = next((j for j in snap.jobs if j.id == target), None)
    rec = mem.restrained.get(target)
    if live is None:
        return
    if kind == "suspend" and rec is not None and live.state != "SUSPENDED":
        mem.restrained[target] = dataclasses.replace(rec, suspended_since=None)
    elif kind == "resume-job" and live.state == "SUSPENDED" and live.nodes:
        base = rec or Restraint(live.nodes[0], -1, why="a resume the monitor meant before it "
                                "stopped")
        mem.restrained[target] = dataclasses.replace(base, suspended_since=snap.ts)
    elif kind == "unthrottle" and live.state in ("RUNNING", "SUSPENDED") and live.nodes:
        base = rec or Restraint(live.nodes[0], -1, why="an unthrottle the monitor meant "
                                "before it stopped")
        mem.restrained[target] = dataclasses.replace(base, throttled_since=snap.ts)


def failed(memory: Memory, action: Action, error: str) -> Memory:
    """The memory to keep when applying ``action`` failed: as if it had not been decided,
    so the next cycle tries again (or, for a re-layout, puts the node back in service)."""
    mem = memory.copy()
    d = action.details
    if action.kind == "hold":
        mem.holds.pop(action.target, None)
    elif action.kind == "release":
        mem.holds[action.target] = Hold.from_dict(d.get("hold") or {})
        if mem.release_times:
            mem.release_times.pop()
    elif action.kind == "exclude":
        if d.get("previous") is None:  # nothing of ours was on the job before
            mem.excluded.pop(action.target, None)
        else:
            mem.excluded[action.target] = {"set": d["previous"], "user": d.get("user", ""),
                                           "comment": d.get("own_comment", "")}
    elif action.kind == "begin-now":
        mem.requeued[action.target] = 0.0
        if mem.release_times:
            mem.release_times.pop()
    elif action.kind == "partition-update":
        for node in d.get("moved", ()):
            if d.get("op") == "lend":
                mem.lent.pop(node, None)
            else:
                mem.lent[node] = Loan(str(d.get("from", "")), action.target)
    elif action.kind == "drain":
        mem.relayout = None
    elif action.kind == "qos-limit":
        if d.get("previous") is None:
            mem.caps.pop(action.target, None)
        else:
            mem.caps[action.target] = Cap(dict(d["previous"]))
    elif action.kind == "requeue" and mem.relayout is not None and "restraint" not in d:
        done = [j for j in mem.relayout.get("requeued", []) if j != action.target]
        mem.relayout = dict(mem.relayout, requeued=done)
    elif action.kind in ("throttle", "suspend", "requeue", "unthrottle", "resume-job") \
            and "restraint" in d:
        _restraint_failed(mem, action)
    elif action.kind in ("mig-apply", "resume"):
        mem.relayout = {"node": action.target, "pool": d.get("pool", ""),
                        "layout": d.get("layout", ""), "phase": "failed", "since": 0.0,
                        "error": error}
    return mem


def _restraint_failed(mem: Memory, action: Action) -> None:
    """Undo one ladder action in memory: an escalation gives its budget back and the job
    is as before it; a release that failed leaves the job restrained (retried next cycle)."""
    import dataclasses

    d = action.details
    before = Restraint.from_dict(d["restraint"])
    for key in d.get("budget_keys", ()):
        stamps = mem.events.get(key, [])
        if stamps and stamps[-1] == d.get("ts"):
            mem.events[key] = stamps[:-1]
    cur = mem.restrained.get(action.target)
    if action.kind == "requeue":
        mem.restrained[action.target] = before
        return
    if action.kind == "throttle":
        rec = cur and dataclasses.replace(cur, throttled_since=None)
    elif action.kind == "suspend":
        rec = cur and dataclasses.replace(cur, suspended_since=None)
    elif action.kind == "unthrottle":
        rec = dataclasses.replace(cur or before, throttled_since=before.throttled_since)
    else:  # resume-job
        rec = dataclasses.replace(cur or before, suspended_since=before.suspended_since)
    if rec is None or (rec.throttled_since is None and rec.suspended_since is None):
        mem.restrained.pop(action.target, None)
    else:
        mem.restrained[action.target] = rec


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
                "partition-update", to, f"reclaim {compress(back)} for {frm}: {why}",
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
                "partition-update", to,
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
        actions.append(Action("reconcile", node, "periodic clean-up of what ended jobs left",
                              {"live_jobs": live}))
    return actions
