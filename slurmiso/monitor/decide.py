"""The monitor's pure core: ``decide(snapshot, policy, memory) -> (actions, memory)``.

No I/O, no clock, no logging: time is ``snapshot.ts``, and everything remembered between
cycles goes in and out as :class:`~slurmiso.monitor.policy.Memory`. So a recorded snapshot
replays exactly, dry-run is the same call with the actions left unapplied, and the tests are
tables. Each policy is one function below:

* admission: a gate per partition (shared GPUs hot / calm, with hysteresis and a minimum
  dwell) and one for the inference SLO; pending training jobs are held while a gate of theirs
  is closed, released (at most ``stagger_max_starts`` per interval) once all are open again;
  or, with ``admission="qos-limit"``, the training QoS is capped at what training uses and
  raised by the next ``stagger_max_starts`` jobs' GRES per interval once calm; a scope whose
  telemetry is stale changes nothing;
* partitions: idle inference nodes are lent to a training partition, reclaimed as soon as
  inference demand returns;
* MIG re-layout: one node at a time is drained, laid out anew when empty, and resumed;
* reconcile: a periodic clean-up per node this host can reach.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple

from slurmiso.monitor.policy import KINDS, SHARED_MODES, Action, Memory, Policy
from slurmiso.monitor.relayout import relayout
from slurmiso.monitor.snapshot import JobInfo, NodeInfo, Snapshot, gres_counts, jobs_by_node
from slurmiso.slurm.hostlist import compress

SLO_SCOPE = "slo"
HOT, CALM, BETWEEN, STALE = "hot", "calm", "between", "stale"


def decide(snap: Snapshot, policy: Policy, memory: Memory) -> Tuple[List[Action], Memory]:
    """The actions for this snapshot and the memory to keep; ``memory`` is not changed."""
    mem = memory.copy()
    if not snap.slurm_ok:  # nothing is known about the queue: change nothing
        return [], mem
    running = jobs_by_node(list(snap.jobs))
    actions = relayout(snap, policy, mem, running)
    actions += _partitions(snap, policy, mem, running)
    actions += _admission(snap, policy, mem)
    actions += _reconcile(snap, policy, mem, running)
    actions.sort(key=lambda a: KINDS.index(a.kind))
    return actions, mem


def failed(memory: Memory, action: Action, error: str) -> Memory:
    """The memory to keep when applying ``action`` failed: as if it had not been decided,
    so the next cycle tries again (or, for a re-layout, puts the node back in service)."""
    mem = memory.copy()
    d = action.details
    if action.kind == "hold":
        mem.holds.pop(action.target, None)
    elif action.kind == "release":
        mem.holds[action.target] = dict(d.get("hold") or {"ts": 0.0, "scopes": []})
        if mem.release_times:
            mem.release_times.pop()
    elif action.kind == "partition-update":
        for node in d.get("moved", ()):
            if d.get("op") == "lend":
                mem.lent.pop(node, None)
            else:
                mem.lent[node] = {"from": d.get("from", ""), "to": action.target, "ts": 0.0}
    elif action.kind == "drain":
        mem.relayout = None
    elif action.kind == "qos-limit":
        if d.get("previous") is None:
            mem.caps.pop(action.target, None)
        else:
            mem.caps[action.target] = {"tres": dict(d["previous"]), "ts": 0.0}
    elif action.kind == "requeue" and mem.relayout is not None:
        done = [j for j in mem.relayout.get("requeued", []) if j != action.target]
        mem.relayout = dict(mem.relayout, requeued=done)
    elif action.kind in ("mig-apply", "resume"):
        mem.relayout = {"node": action.target, "pool": d.get("pool", ""),
                        "layout": d.get("layout", ""), "phase": "failed", "since": 0.0,
                        "error": error}
    return mem


# ----------------------------------------------------------------------------- admission
def _admission(snap: Snapshot, policy: Policy, mem: Memory) -> List[Action]:
    train = set(policy.train_classes)
    pending = {j.id: j for j in snap.jobs if j.pending}
    waiting = sorted((j for j in pending.values() if j.job_class in train),
                     key=lambda j: (j.submit_ts, j.id))
    nodes = {n.name: n for n in snap.nodes}
    scopes = {p for j in waiting for p in j.partitions}
    scopes.update(p for jid in mem.holds if jid in pending for p in pending[jid].partitions)
    gate: Dict[str, Optional[bool]] = {}
    why: Dict[str, Tuple[str, Dict[str, Any]]] = {}
    for part in sorted(scopes):
        verdict, text, facts = _partition_load(snap.partitions.get(part, ()), nodes, policy)
        gate[part] = _gate(mem, part, verdict, text, snap.ts, policy)
        why[part] = (text, facts)
    if policy.slo:
        verdict, text, facts = _slo_load(snap, policy, pending.values())
        gate[SLO_SCOPE] = _gate(mem, SLO_SCOPE, verdict, text, snap.ts, policy)
        why[SLO_SCOPE] = (text, facts)
    mem.stale = sorted(s for s, g in gate.items() if g is None)
    if policy.admission == "qos-limit":
        return _qos_caps(snap, policy, mem, gate, why, waiting) + _unhold_all(pending, mem)

    actions: List[Action] = []
    overridden = set(mem.overridden)
    just_held: set[str] = set()
    for job in waiting:
        if job.id in mem.holds or job.held or job.id in overridden:
            continue
        job_scopes = list(job.partitions) + ([SLO_SCOPE] if policy.slo else [])
        closing = [s for s in job_scopes if gate.get(s)]
        if not closing:
            continue  # open, or unknown (stale): no change on stale data
        text, facts = why[closing[0]]
        hold: Dict[str, Any] = {"ts": snap.ts, "scopes": closing, "reason": text}
        mem.holds[job.id] = hold
        just_held.add(job.id)
        details = dict(facts, scopes=closing, job_class=job.job_class,
                       partition=",".join(job.partitions))
        actions.append(Action("hold", job.id, f"training held: {text}", details))

    candidates: List[JobInfo] = []
    for jid in list(mem.holds):
        held_job = pending.get(jid)
        if jid in just_held:
            continue
        if held_job is None:  # started, ended or cancelled: not ours to track any more
            del mem.holds[jid]
        elif not held_job.held:  # someone released it: respect that and never hold it again
            del mem.holds[jid]
            mem.overridden = (mem.overridden + [jid])[-1000:]
        else:
            job_scopes = list(held_job.partitions) + ([SLO_SCOPE] if policy.slo else [])
            states = [gate.get(s, False) for s in job_scopes]
            if not any(s is None or s for s in states):
                candidates.append(held_job)
    window = snap.ts - policy.stagger_interval_s
    mem.release_times = [t for t in mem.release_times if t > window]
    allowance = max(0, policy.stagger_max_starts - len(mem.release_times))
    candidates.sort(key=lambda j: (j.submit_ts, j.id))
    for job in candidates[:allowance]:
        hold = mem.holds.pop(job.id)
        mem.release_times.append(snap.ts)
        actions.append(Action(
            "release", job.id,
            f"calm for {policy.min_dwell_s:g}s: below {policy.release_memory_pct:g}% memory "
            f"and {policy.release_sm_pct:g}% SM (and inference within its SLO)",
            {"hold": hold, "held_s": round(snap.ts - float(hold.get("ts", snap.ts)), 1),
             "partition": ",".join(job.partitions),
             "stagger": f"{policy.stagger_max_starts}/{policy.stagger_interval_s:g}s"}))
    return actions


def _qos_caps(
    snap: Snapshot, policy: Policy, mem: Memory, gate: Dict[str, Optional[bool]],
    why: Dict[str, Tuple[str, Dict[str, Any]]], waiting: List[JobInfo],
) -> List[Action]:
    """qos-limit admission: while a gate is closed, cap each training QoS's GrpTRES at what
    its running jobs use (lowered as they end, never raised); once every gate is open, set it
    to that use plus the GRES of the next ``stagger_max_starts`` waiting jobs, once per
    interval, and remove it when none waits. Stale data changes nothing."""
    closed = sorted(s for s, g in gate.items() if g)
    stale = any(g is None for g in gate.values())
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
        prev = dict(old["tres"]) if old else None
        ids = {j.id for j in mine}
        queue = [j for j in waiting if j.id in ids and not j.held]
        if closed:
            text, facts = why[closed[0]]
            new = {t: min(used[t], prev.get(t, used[t])) if prev else used[t]
                   for t in policy.cap_tres}
            if new == prev:
                continue
            reason = f"training capped at what it uses: {text}"
            details = dict(facts, scopes=closed)
        elif stale or old is None or snap.ts - float(old["ts"]) < policy.stagger_interval_s:
            continue
        elif not queue:
            mem.caps.pop(qos)
            actions.append(Action("qos-limit", qos, "calm and no training waits: cap removed",
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
        mem.caps[qos] = {"tres": new, "ts": snap.ts}
        actions.append(Action("qos-limit", qos, reason,
                              dict(details, tres=new, previous=prev, used=used)))
    return actions


def _unhold_all(pending: Dict[str, JobInfo], mem: Memory) -> List[Action]:
    """Holds placed under ``admission: hold`` are released once admission caps the QoS."""
    actions = []
    for jid in sorted(mem.holds):
        hold = mem.holds.pop(jid)
        job = pending.get(jid)
        if job is not None and job.held:
            actions.append(Action("release", jid, "admission is qos-limit now: no holds",
                                  {"hold": hold}))
    return actions


def _partition_load(
    names: Sequence[str], nodes: Dict[str, NodeInfo], policy: Policy
) -> Tuple[str, str, Dict[str, Any]]:
    """HOT, CALM, BETWEEN or STALE for the shared GPUs of a partition, with the worst GPU."""
    worst: Optional[Tuple[float, str, Dict[str, Any]]] = None
    calm = True
    stale: List[str] = []
    for name in names:
        node = nodes.get(name)
        if node is None or node.mode not in SHARED_MODES or not node.usable:
            continue
        if node.telemetry_age_s is None or node.telemetry_age_s > policy.max_data_age_s:
            stale.append(name)
            continue
        for gpu in node.gpus:
            mem_pct = gpu.memory_pct
            sm = gpu.sm_active_pct if gpu.sm_active_pct is not None else 0.0
            over = max(mem_pct - policy.memory_used_pct, sm - policy.sm_active_pct)
            if mem_pct >= policy.release_memory_pct or sm >= policy.release_sm_pct:
                calm = False
            if worst is None or over > worst[0]:
                what = (f"memory {mem_pct:.0f}% (hold at {policy.memory_used_pct:g}%)"
                        if mem_pct - policy.memory_used_pct >= sm - policy.sm_active_pct
                        else f"SM {sm:.0f}% (hold at {policy.sm_active_pct:g}%)")
                worst = (over, f"{name} GPU {gpu.index} {what}",
                         {"node": name, "gpu": gpu.index, "memory_pct": round(mem_pct, 1),
                          "sm_active_pct": round(sm, 1)})
    if worst is not None and worst[0] >= 0:
        return HOT, worst[1], worst[2]
    if stale:
        return STALE, f"no fresh telemetry from {compress(stale)}", {"stale_nodes": stale}
    if worst is None:
        return CALM, "no shared GPUs", {}
    return (CALM if calm else BETWEEN), worst[1], worst[2]


def _slo_load(
    snap: Snapshot, policy: Policy, pending: Any
) -> Tuple[str, str, Dict[str, Any]]:
    """HOT when an inference class waits or answers beyond its SLO; CALM when it is below the
    SLO by the hysteresis margin; STALE when its latency figure is too old."""
    margin = 1.0 - policy.hysteresis_pct / 100.0
    oldest: Dict[str, float] = {}
    for job in pending:
        if not job.held and job.submit_ts > 0:
            oldest[job.job_class] = min(oldest.get(job.job_class, job.submit_ts), job.submit_ts)
    calm = True
    for slo in policy.slo:
        wait = snap.ts - oldest[slo.class_name] if slo.class_name in oldest else 0.0
        if slo.max_queue_wait_s is not None:
            if wait > slo.max_queue_wait_s:
                return HOT, (f"{slo.class_name} jobs wait {wait:.0f}s in the queue "
                             f"(SLO {slo.max_queue_wait_s:g}s)"), {
                    "class": slo.class_name, "queue_wait_s": round(wait, 1)}
            calm = calm and wait <= slo.max_queue_wait_s * margin
        p99 = snap.latency_p99_ms.get(slo.class_name)
        if slo.p99_latency_ms is not None and p99 is not None:
            age = snap.latency_age_s
            if age is not None and age > policy.max_data_age_s:
                return STALE, f"{slo.class_name} latency is {age:.0f}s old", {}
            if p99 > slo.p99_latency_ms:
                return HOT, (f"{slo.class_name} P99 latency {p99:.0f} ms "
                             f"(SLO {slo.p99_latency_ms:g} ms)"), {
                    "class": slo.class_name, "p99_latency_ms": round(p99, 1)}
            calm = calm and p99 <= slo.p99_latency_ms * margin
    return (CALM if calm else BETWEEN), "inference within its SLO", {}


def _gate(
    mem: Memory, scope: str, verdict: str, why: str, now: float, policy: Policy
) -> Optional[bool]:
    """Whether ``scope`` is closed to training after this snapshot (None: stale, unknown).

    Closes at once when hot (inference first); opens only after it has been calm, below the
    threshold by the hysteresis margin, for ``min_dwell_s`` and ``min_dwell_s`` after closing.
    """
    old = mem.gates.get(scope) or {"closed": False, "since": 0.0, "calm_since": None, "why": ""}
    if verdict == STALE:
        return None
    new = dict(old)
    if not old["closed"]:
        if verdict == HOT:
            new.update(closed=True, since=now, calm_since=None, why=why)
    elif verdict == CALM:
        calm_since = old["calm_since"] if old["calm_since"] is not None else now
        new["calm_since"] = calm_since
        if now - calm_since >= policy.min_dwell_s and now - old["since"] >= policy.min_dwell_s:
            new.update(closed=False, since=now, calm_since=None, why=why)
    else:
        new["calm_since"] = None
    if new != old:
        mem.gates[scope] = new
    return bool(new["closed"])


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
        lent = [n for n, r in sorted(mem.lent.items()) if (r["from"], r["to"]) == (frm, to)]
        for n in lent:
            if n not in members[to]:  # an admin took it back: forget it
                del mem.lent[n]
        lent = [n for n in lent if n in members[to]]
        waiting = [j.id for j in snap.jobs if j.pending and not j.held and frm in j.partitions]
        serving = [j.id for n in lent for j in running.get(n, []) if j.job_class not in train]
        if lent and (waiting or serving):
            why = (f"{len(waiting)} job(s) pending in {frm}" if waiting
                   else f"job(s) {','.join(serving)} of {frm} run on it")
            members[to] = [n for n in members[to] if n not in lent]
            for n in lent:
                del mem.lent[n]
                mem.idle_since[n] = snap.ts  # idle for a full dwell again before re-lending
            actions.append(Action(
                "partition-update", to, f"reclaim {compress(lent)} for {frm}: {why}",
                {"op": "reclaim", "from": frm, "moved": lent, "nodes": members[to]}))
            continue
        if waiting:
            continue
        free = [n for n in members[frm] if n in mem.idle_since and n not in members[to]]
        lendable = [n for n in free if n != busy
                    and snap.ts - mem.idle_since[n] >= policy.min_dwell_s]
        lendable = lendable[:max(0, len(free) - policy.lend_reserve)]
        if lendable:
            members[to] = members[to] + lendable
            for n in lendable:
                mem.lent[n] = {"from": frm, "to": to, "ts": snap.ts}
            actions.append(Action(
                "partition-update", to,
                f"lend idle {compress(lendable)} of {frm} to {to}: nothing pending there, idle "
                f">= {policy.min_dwell_s:g}s",
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
        live = sorted(j.id for j in running.get(node, []))
        actions.append(Action("reconcile", node, "periodic clean-up of what ended jobs left",
                              {"live_jobs": live}))
    return actions
