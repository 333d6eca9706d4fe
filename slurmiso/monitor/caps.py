"""qos-limit admission (pure): cap the training QoS's GrpTRES instead of holding jobs.

While a gate is closed each training QoS is capped at what its running jobs use (lowered as
they end, never raised); once every gate is open the cap is raised by the next
``stagger_max_starts`` waiting jobs' GRES once per interval, and removed when none waits.
Unknown data changes nothing.
"""

from __future__ import annotations

from typing import Any, Dict, List, Tuple

from slurmiso.monitor.action import Action, ActionKind
from slurmiso.monitor.admission_state import Cap
from slurmiso.monitor.exclusions import note_is_ours
from slurmiso.monitor.gates import GateState
from slurmiso.monitor.policy import Memory, Policy
from slurmiso.monitor.snapshot import JobInfo, Snapshot
from slurmiso.slurm.gres import gres_counts


def qos_caps(
    snap: Snapshot, policy: Policy, mem: Memory, gate: Dict[str, GateState],
    why: Dict[str, Tuple[str, str, Dict[str, Any]]], waiting: List[JobInfo],
) -> List[Action]:
    """qos-limit admission: while a gate is closed, cap each training QoS's GrpTRES at what
    its running jobs use (lowered as they end, never raised); once every gate is open, set it
    to that use plus the GRES of the next ``stagger_max_starts`` waiting jobs, once per
    interval, and remove it when none waits. Stale data changes nothing."""
    closed = sorted(s for s, g in gate.items() if g is GateState.CLOSED)
    stale = any(g is GateState.UNKNOWN for g in gate.values())
    train = set(policy.train_classes)
    actions: List[Action] = []
    for qos in policy.train_qos:
        mine = [j for j in snap.jobs if j.qos == qos or (not j.qos and j.job_class in train)]
        used = {t: 0 for t in policy.cap_tres}
        for j in mine:
            if not j.pending:
                for t, c in gres_counts(j.gres).items():
                    if t in used:
                        used[t] += c * max(1, len(j.nodes))
        old = mem.caps.get(qos)
        prev = dict(old.tres) if old else None
        ids = {j.id for j in mine}
        queue = sorted((j for j in waiting if j.id in ids and not j.held),
                       key=lambda j: (-j.priority, j.submit_ts, j.id))
        if closed:
            _, text, facts = why[closed[0]]
            new = {t: min(used[t], prev.get(t, used[t])) if prev else used[t]
                   for t in policy.cap_tres}
            if new == prev:
                continue
            reason = f"training capped at what it uses: {text}"
            details = dict(facts, scopes=closed)
        elif stale or old is None or snap.ts - old.ts < policy.stagger_interval_s:
            continue
        elif not queue:
            mem.caps.pop(qos)
            actions.append(Action(ActionKind.QOS_LIMIT, qos,
                                  "calm and no training waits: cap removed",
                                  {"tres": None, "lift": list(policy.cap_tres),
                                   "previous": prev, "used": used}))
            continue
        else:
            step = queue[:policy.stagger_max_starts]
            new = dict(used)  # jobs let in before that have not started are still in step
            for j in step:
                for t, c in gres_counts(j.gres).items():
                    if t in new:
                        new[t] += c
            reason = (f"calm for {policy.min_dwell_s:g}s: cap raised for the next "
                      f"{len(step)} training job(s) "
                      f"(stagger {policy.stagger_max_starts}/{policy.stagger_interval_s:g}s)")
            details = {"jobs": [j.id for j in step]}
        mem.caps[qos] = Cap(new, snap.ts)
        actions.append(Action(ActionKind.QOS_LIMIT, qos, reason,
                              dict(details, tres=new, previous=prev, used=used)))
    return actions


def unhold_all(pending: Dict[str, JobInfo], mem: Memory) -> List[Action]:
    """Holds placed under ``admission: hold`` are released once admission caps the QoS."""
    actions = []
    for jid in sorted(mem.holds):
        hold = mem.holds.pop(jid)
        job = pending.get(jid)
        if job is not None and job.held:
            actions.append(Action(ActionKind.RELEASE, jid, "admission is qos-limit now: no holds",
                                  {"hold": hold.to_dict(),
                                   "uncomment": note_is_ours(job.comment)}))
    return actions
