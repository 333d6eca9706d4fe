"""Training admission, the part of :func:`~slurmiso.monitor.decide.decide` that keeps new
training off GPUs that inference needs (pure: no I/O, no clock).

Signals first: each shared node is HOT, CALM, BETWEEN or UNKNOWN. A missing value is unknown,
never 0 %: SM activity falls back to graphics-engine activity (busier or equal, so the stand-in
errs towards inference) and, with neither, the node is unknown; an agent that answered without
GPU series, or data older than ``max_data_age_s``, is unknown too. Unknown admits no *new*
training (``unknown_admits`` turns that off) and never opens or closes a gate.

Each node has a gate (closes at once when hot, opens after ``min_dwell_s`` of calm and at most
``gate_opens_per_hour``); the SLO has one. How a closed gate keeps training away:

* ``nodes``: pending training jobs get the closed nodes of their partitions in ExcNodeList
  (their own exclusions kept) and a comment saying why; inference and running jobs untouched;
* ``hold``: a partition whose nodes are hot holds its pending training jobs;
* ``qos-limit``: see :mod:`slurmiso.monitor.caps`.

In every mode new arrivals and releases share one start budget per ``stagger_interval_s``
(``stagger_max_starts``, more when free GPUs or the backlog call for it: a backlog drains in
about ``backlog_drain_s``), spent in Slurm's priority order; the excess is held, "staggered".
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Dict, FrozenSet, List, Optional, Sequence, Set, Tuple

from slurmiso.config.model import SHARED_MODES
from slurmiso.hostlist import compress
from slurmiso.monitor.actions import Action, ActionKind
from slurmiso.monitor.admission_state import Gate, Hold
from slurmiso.monitor.attribution import Attribution
from slurmiso.monitor.exclusions import NOTE_PREFIX, comment_is_free, note_is_ours
from slurmiso.monitor.policy import Memory, Policy
from slurmiso.monitor.snapshot import JobInfo, NodeInfo, Snapshot

SLO_SCOPE = "slo"
STAGGER = "stagger"
HOT, CALM, BETWEEN, UNKNOWN = "hot", "calm", "between", "unknown"
Verdict = Tuple[str, str, Dict[str, Any]]


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


def gate(mem: Memory, scope: str, verdict: str, why: str, now: float,
         policy: Policy) -> Optional[bool]:
    """Whether ``scope`` is closed to training after this snapshot (None: unknown).

    Closes at once when hot (inference first); opens only after it has been calm, below the
    threshold by the hysteresis margin, for ``min_dwell_s``, ``min_dwell_s`` after closing,
    and while fewer than ``gate_opens_per_hour`` openings happened in the last hour."""
    old = mem.gates.get(scope)
    if verdict == UNKNOWN:
        return None
    if old is None:
        if verdict != HOT:
            return False  # open and never closed: nothing to remember (3,000 nodes)
        old = Gate()
    new = old
    if not old.closed:
        if verdict == HOT:
            new = Gate(True, now, None, why)
    elif verdict == CALM:
        calm_since = old.calm_since if old.calm_since is not None else now
        new = dataclasses.replace(old, calm_since=calm_since)
        if (now - calm_since >= policy.min_dwell_s and now - old.since >= policy.min_dwell_s
                and mem.count(f"open:{scope}", now) < policy.gate_opens_per_hour):
            mem.note(f"open:{scope}", now)
            new = Gate(False, now, None, why)
    else:
        new = dataclasses.replace(old, calm_since=None)
    if new != old:
        mem.gates[scope] = new
    return new.closed


def admission(snap: Snapshot, policy: Policy, mem: Memory,
              who: Optional[Attribution] = None,
              ladder_blocked: Optional[Dict[str, str]] = None) -> List[Action]:
    """Gates, then holds / exclusions / releases / begin-time releases for training.
    ``ladder_blocked``: nodes the ladder holds (an inference job there breaches its SLO),
    closed as long as it says, with its reason (its own dwell and hysteresis)."""
    ladder_blocked = ladder_blocked or {}
    from slurmiso.monitor.caps import qos_caps, unhold_all
    from slurmiso.monitor.exclusions import exclusions, forget_started, members
    from slurmiso.monitor.requeue import begin_now

    train = set(policy.train_classes)
    pending = {j.id: j for j in snap.jobs if j.pending}
    overridden = set(mem.overridden) & set(pending)
    waiting = [j for j in pending.values() if j.job_class in train]
    actions_started = forget_started(snap, mem)
    verdicts: Dict[str, Verdict] = {}
    closed: Dict[str, str] = {}  # node -> why training is kept off it
    unknown: Dict[str, str] = {}
    for node in snap.nodes:
        v = node_load(node, policy, who)
        if v is None:
            continue
        held = ladder_blocked.get(node.name)
        if held is not None and policy.admission != "nodes":
            v = (HOT, held, {"node": node.name, "ladder": "hold"})
        verdicts[node.name] = v
        if policy.admission != "nodes":  # partition gates below; unknown nodes listed
            if v[0] == UNKNOWN:
                unknown[node.name] = v[1]
            continue
        g = gate(mem, f"node:{node.name}", v[0], v[1], snap.ts, policy)
        if held is not None:
            closed[node.name] = held
        elif g:
            closed[node.name] = mem.gates[f"node:{node.name}"].why if v[0] != HOT else v[1]
        elif g is None:
            unknown[node.name] = v[1]
    for scope in [s for s in mem.gates if s.startswith("node:") and (
            s[5:] not in verdicts or policy.admission != "nodes")]:
        del mem.gates[scope]  # node gone or no longer shared: forget its gate
    gates: Dict[str, Optional[bool]] = {}
    why: Dict[str, Verdict] = {}
    if policy.slo:
        v = slo_load(snap, policy)
        gates[SLO_SCOPE] = gate(mem, SLO_SCOPE, v[0], v[1], snap.ts, policy)
        why[SLO_SCOPE] = v
        if gates[SLO_SCOPE] is not False:
            slo_gate = mem.gates.get(SLO_SCOPE)
            for name in _slo_nodes(snap, policy):
                target = closed if gates[SLO_SCOPE] else unknown
                target.setdefault(name, (slo_gate.why if slo_gate else "") or v[1])
    if policy.admission != "nodes":
        for part in sorted({p for j in waiting for p in j.partitions}):
            v = combine([verdicts[n] for n in snap.partitions.get(part, ()) if n in verdicts])
            gates[part] = gate(mem, part, v[0], v[1], snap.ts, policy)
            why[part] = v
    if policy.unknown_admits:
        unknown = {}
    mem.stale = sorted(set(unknown) | {s for s, g in gates.items() if g is None})
    since = {s: mem.unknown_since.get(s, snap.ts) for s in mem.stale}
    if since != mem.unknown_since:
        mem.unknown_since = since
    if policy.admission == "qos-limit":
        # Unknown caps training at what runs (as a closed gate would), never lets it grow.
        hold_gates: Dict[str, Optional[bool]] = {
            s: (bool(g) if g is not None else not policy.unknown_admits)
            for s, g in gates.items()}
        return (actions_started + qos_caps(snap, policy, mem, hold_gates, why, waiting)
                + unhold_all(pending, mem))

    actions: List[Action] = actions_started
    cache: Dict[Tuple[str, ...], FrozenSet[str]] = {}
    blocked = dict(unknown, **closed)

    open_cache: Dict[Tuple[str, ...], bool] = {}

    def open_for(job: JobInfo) -> bool:
        """Could this job start somewhere training is admitted now? (per partition set)"""
        key = job.partitions
        if key not in open_cache:
            if policy.admission == "nodes":
                nodes = members(snap, key, cache)
                open_cache[key] = not nodes or any(n not in blocked for n in nodes)
            else:
                scopes = list(key) + ([SLO_SCOPE] if policy.slo else [])
                open_cache[key] = not any(
                    gates.get(s) or (gates.get(s, False) is None and not policy.unknown_admits)
                    for s in scopes)
        return open_cache[key]

    # -- holds for closed partitions (hold mode) and the start budget (every mode) ---------
    arrivals = [j for j in waiting if mem.last_ts is not None and j.submit_ts > mem.last_ts
                and not j.held and j.id not in mem.holds and j.id not in overridden]
    arrivals.sort(key=_order)
    arrival_ids = {j.id for j in arrivals}
    window = snap.ts - policy.stagger_interval_s
    mem.release_times = [t for t in mem.release_times if t > window]
    backlog = [h.ts for jid, h in mem.holds.items() if jid in pending]
    free = _free_gpus(snap, blocked, who)
    # The backlog (held jobs and this cycle's arrivals) must be gone backlog_drain_s after
    # its oldest hold: spread what is left over the intervals left.
    left = policy.backlog_drain_s - (snap.ts - min(backlog, default=snap.ts))
    budget = max(policy.stagger_max_starts, free,
                 math.ceil((len(backlog) + len(arrivals)) * policy.stagger_interval_s
                           / max(left, policy.stagger_interval_s)))
    allowance = max(0, budget - len(mem.release_times))
    held_now: Set[str] = set()
    if policy.admission == "hold":
        # One hold record and one details dict per partition set, shared by its jobs (both
        # are read-only once made: 20,000 holds cost 20,000 references, not dicts).
        group: Dict[Tuple[Tuple[str, ...], bool, bool], Optional[Tuple[str, Hold,
                                                                        Dict[str, Any]]]] = {}
        for job in waiting:
            if job.id in mem.holds or job.held or job.id in overridden:
                continue
            key = (job.partitions, job.id in arrival_ids, comment_is_free(job.comment))
            if key not in group:
                scopes = list(job.partitions) + ([SLO_SCOPE] if policy.slo else [])
                closing = [s for s in scopes if gates.get(s)]
                if not closing and key[1] and not open_for(job):
                    closing = [s for s in scopes if gates.get(s) is None]
                if closing:
                    text = f"training held: {why[closing[0]][1]}"
                    group[key] = (text, Hold(snap.ts, tuple(closing), text),
                                  dict(why[closing[0]][2], scopes=closing,
                                       job_class=job.job_class,
                                       partition=",".join(job.partitions),
                                       comment=_note(text) if key[2] else None))
                else:
                    group[key] = None
            hit = group[key]
            if hit is not None:
                mem.holds[job.id] = hit[1]
                actions.append(Action(ActionKind.HOLD, job.id, hit[0], hit[2]))
                held_now.add(job.id)
    stagger_text = (f"training staggered: {budget} start(s) per "
                    f"{policy.stagger_interval_s:g}s (stagger {policy.stagger_max_starts}, "
                    f"backlog drains in {policy.backlog_drain_s:g}s)")
    stagger_share: _HoldShare = {}
    for job in arrivals:
        if job.id in held_now or not open_for(job):
            continue  # held for its gate above, or its exclusions keep it off every node
        if allowance > 0:
            allowance -= 1
            mem.release_times.append(snap.ts)
            continue
        actions.append(_hold(job, snap.ts, [STAGGER], stagger_text, {"budget": budget}, mem,
                             stagger_share))
        held_now.add(job.id)
    if policy.admission == "nodes":
        # A job every node of which is blocked is held, not excluded from all of them: Slurm
        # may hold a job whose request no node can meet (BadConstraints) for good.
        all_blocked: Dict[Tuple[str, ...], Tuple[str, Dict[str, Any]]] = {}
        hold_share: _HoldShare = {}
        for job in waiting:
            if (job.id in mem.holds or job.held or job.id in overridden
                    or job.id in held_now or open_for(job)):
                continue
            if job.partitions not in all_blocked:
                names = sorted(members(snap, job.partitions, cache))
                first = blocked.get(names[0], "") if names else ""
                all_blocked[job.partitions] = ((
                    f"training held: every node it may use ({compress(names)}) is hot or "
                    f"unknown ({first})")[:250], {"nodes": compress(names)})
            reason, facts = all_blocked[job.partitions]
            actions.append(_hold(job, snap.ts, ["nodes"], reason, facts, mem, hold_share))
            held_now.add(job.id)
        # Jobs held here because no node is open get their exclusions when one opens (in
        # that cycle, before the release: the applier runs "exclude" before "release").
        # (one pass, no set of ids: at 60,000 pending jobs a cycle's first hold of nearly
        # all of them makes this list the cycle's largest)
        holds = mem.holds
        rest = [j for j in waiting if j.id not in holds or open_for(j)]
        actions += exclusions(snap, mem, rest, overridden, blocked, cache)

    # -- releases: our holds whose job can start now, highest priority first ----------------
    # a released job keeps no hold note, unless an exclusion this cycle wrote its own note
    noted = {a.target for a in actions if a.kind == "exclude" and a.details.get("comment")}
    candidates: List[JobInfo] = []
    for jid in list(mem.holds):
        mine = pending.get(jid)
        if jid in held_now:
            continue
        if mine is None:  # started, ended or cancelled: not ours to track any more
            del mem.holds[jid]
        elif not mine.held:  # someone released it: respect that and never hold it again
            del mem.holds[jid]
            overridden.add(jid)
            if mine.comment is not None and note_is_ours(mine.comment) and jid not in noted:
                actions.append(Action(ActionKind.UNCOMMENT, jid, "released by someone else: the "
                                      "monitor's hold note is removed",
                                      {"comment": mine.comment[:250]}))
        elif open_for(mine):
            candidates.append(mine)
    candidates.sort(key=_order)
    for job in candidates[:allowance]:
        hold = mem.holds.pop(job.id)
        mem.release_times.append(snap.ts)
        allowance -= 1
        actions.append(Action(
            ActionKind.RELEASE, job.id,
            "calm: released in priority order" if hold.scopes != (STAGGER,)
            else "its turn in the start budget, in priority order",
            {"hold": hold.to_dict(), "held_s": round(snap.ts - hold.ts, 1),
             "partition": ",".join(job.partitions), "priority": job.priority,
             "budget": f"{budget}/{policy.stagger_interval_s:g}s", "backlog": len(backlog),
             "uncomment": note_is_ours(job.comment) and job.id not in noted}))
    actions += begin_now(snap, policy, mem, pending, allowance, open_for, _order)
    mem.overridden = sorted(overridden)
    return actions


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
