"""MIG re-layout, the slowest policy of :func:`slurmiso.monitor.decide.decide` (pure).

When pending demand for MIG types persistently exceeds what a mig-static pool's layout
offers, and another configured layout would place more of it, one node at a time goes
through (at most ``relayouts_per_hour`` per pool, and ``min_dwell_s`` apart): drain (its jobs
finish; nothing is killed) -> ``mig-apply`` once drained and empty
-> ``resume``. With ``preempt_training_after_s`` set, the training jobs still on the node after
that long are requeued (they checkpoint on the signal; inference is always waited for). A
failed apply or a node that never empties is resumed with its old layout.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Dict, List, Optional, Tuple

from slurmiso.monitor.action import Action, ActionKind
from slurmiso.monitor.policy import Memory, Policy
from slurmiso.monitor.snapshot import JobInfo, NodeInfo, Snapshot
from slurmiso.slurm.gres import gpu_types


def relayout(
    snap: Snapshot, policy: Policy, mem: Memory, running: Dict[str, List[JobInfo]]
) -> List[Action]:
    """Advance the re-layout in progress, or start one where demand calls for it."""
    r = mem.relayout
    if r is not None:
        return _relayout_step(snap, policy, mem, running, r)
    gres_of: Dict[str, Dict[str, int]] = {}
    for pool, candidates in sorted(policy.mig_layouts.items()):
        pool_nodes = [n for n in snap.nodes if n.pool == pool]
        if not pool_nodes or not candidates:
            continue
        parts = {p for n in pool_nodes for p in n.partitions}
        asks: Counter[str] = Counter(  # GRES strings, counted once each (60,000 jobs)
            j.gres for j in snap.jobs
            if j.pending and not j.held and j.gres and not parts.isdisjoint(j.partitions))
        pending: Counter[str] = Counter()
        for gres, n_jobs in asks.items():
            for typ, c in gres_of.setdefault(gres, gpu_types(gres)).items():
                pending[typ] += c * n_jobs
        need = Counter(pending)
        supply: Counter[str] = Counter()
        for n in pool_nodes:
            supply.update(gpu_types(n.gres))
            for j in running.get(n.name, []):
                need.update(gres_of.setdefault(j.gres, gpu_types(j.gres)))
        unmet = _unmet(need, supply)
        choice = _best_layout(pool_nodes, candidates, need, supply, running, policy) \
            if pending and unmet else None
        if choice is None:
            mem.mig_mismatch_since.pop(pool, None)
            continue
        node, layout, after = choice
        since = mem.mig_mismatch_since.setdefault(pool, snap.ts)
        if (snap.ts - since < policy.min_dwell_s
                or snap.ts - mem.mig_last.get(pool, -1e18) < policy.min_dwell_s
                or mem.count(f"relayout:{pool}", snap.ts) >= policy.relayouts_per_hour):
            continue
        del mem.mig_mismatch_since[pool]
        mem.note(f"relayout:{pool}", snap.ts)
        want = ", ".join(f"{t} x{c}" for t, c in sorted(pending.items()))
        reason = (f"MIG re-layout to {layout}: pending {want} cannot all be placed "
                  f"(unmet {unmet} -> {after})")
        mem.relayout = {"node": node.name, "pool": pool, "layout": layout,
                        "phase": "draining", "since": snap.ts, "reason": reason}
        return [Action(ActionKind.DRAIN, node.name, reason,
                       {"pool": pool, "layout": layout, "pending": dict(pending),
                        "supply": dict(supply), "unmet_before": unmet, "unmet_after": after})]
    return []


def _unmet(need: Counter[str], supply: Counter[str]) -> int:
    return sum(max(0, c - supply.get(t, 0)) for t, c in need.items())


def _best_layout(
    pool_nodes: List[NodeInfo],
    candidates: Any,
    need: Counter[str],
    supply: Counter[str],
    running: Dict[str, List[JobInfo]],
    policy: Policy,
) -> Optional[Tuple[NodeInfo, str, int]]:
    """(node, layout, unmet after) of the re-layout that places most demand, taking the node
    with no inference job and the fewest jobs (it drains soonest); None if none helps."""
    train = set(policy.train_classes)
    usable = [n for n in pool_nodes if n.usable]
    if not usable:
        return None
    node = min(usable, key=lambda n: (
        any(j.job_class not in train for j in running.get(n.name, [])),
        len(running.get(n.name, [])), n.name))
    mine = Counter(gpu_types(node.gres))
    best: Optional[Tuple[int, str]] = None
    current = _unmet(need, supply)
    for name, counts in candidates:
        after = _unmet(need, supply - mine + Counter(dict(counts)))
        if after < current and (best is None or after < best[0]):
            best = (after, name)
    return None if best is None else (node, best[1], best[0])


def _relayout_step(
    snap: Snapshot, policy: Policy, mem: Memory, running: Dict[str, List[JobInfo]],
    r: Dict[str, Any],
) -> List[Action]:
    """Advance the re-layout in progress: drained and empty -> apply; applied -> resume."""
    node = snap.node(r["node"])
    details = {"pool": r["pool"], "layout": r["layout"]}
    if node is None:
        mem.relayout = None
        return []
    if r["phase"] == "draining":
        jobs = running.get(node.name, [])
        if not jobs and node.draining:
            mem.relayout = dict(r, phase="applying", since=snap.ts)
            return [Action(ActionKind.MIG_APPLY, node.name,
                           f"drained and empty: lay out MIG {r['layout']}", details)]
        waited = snap.ts - float(r["since"])
        after = policy.preempt_training_after_s
        if after is not None and waited >= after:
            done = set(r.get("requeued", ()))
            train = [j for j in jobs if j.job_class in policy.train_classes and j.id not in done]
            if train:
                mem.relayout = dict(r, requeued=sorted(done | {j.id for j in train}))
                left = len(jobs) - len(train)
                return [Action(
                    ActionKind.RELAYOUT_REQUEUE, j.id,
                    f"re-layout of {node.name} to {r['layout']}: training requeued after "
                    f"{waited:.0f}s of drain ({left} other job(s) are waited for)",
                    dict(details, node=node.name, job_class=j.job_class)) for j in train]
        if waited <= policy.drain_timeout_s:
            return []
        why = (f"re-layout to {r['layout']} abandoned: {len(jobs)} job(s) still run after "
               f"{policy.drain_timeout_s:g}s")
    elif r["phase"] == "applying":
        why = f"MIG layout {r['layout']} applied, GRES regenerated"
    else:
        why = (f"re-layout to {r['layout']} failed ({r.get('error', 'unknown error')}); "
               "back in service")
    mem.relayout = None
    mem.mig_last[r["pool"]] = snap.ts
    return [Action(ActionKind.RESUME, node.name, why, details)]
