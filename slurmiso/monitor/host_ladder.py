"""The host rung (issue 36), pure: where a hot inference job's breach is diagnosed as host
contention (CPU, memory or IO pressure), the training jobs the diagnosis names on that node
are rate-limited through their cgroup, one level at a time, whatever their GPU.

    >>> acts = host_ladder(snap, policy, mem, who)                  # doctest: +SKIP
    >>> [(a.name, a.target, a.details["level"]) for a in acts]      # doctest: +SKIP
    [('host-limit', 't2', 1)]

The monitor only writes a note in the job's ``AdminComment`` (``step=host-limit,...,lvl=N``);
the node applies what level N means there and restores the job when the note goes
(docs/host-contention.md). One rung per node (:class:`~slurmiso.monitor.ladder_state.HostRung`):
level 1 once a host-caused breach has lasted ``after_s``, the next after another ``after_s``
with the same host cause, up to the levels configured; one level back after
``release_after_s`` of calm on every SLO inference job there (the hysteresis as the GPU
rungs'). Unknown, between, or hot for a cause that is not the host's: position held, no step
and no release; a rung with no hot host cause for ``max_s`` ends. Budgets per job (either
side) and per hour. Never an inference job, never a job of no training class, never a job
the GPU ladder restrains (one note a job: its throttle or suspend is the harder; the host
limit comes back in the note once that ends, :func:`slurmiso.monitor.bound.annotate`).
Off (no action, no memory) while ``monitor.ladder.host_limit.levels`` is empty.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Set, Tuple

from slurmiso.host.diagnosis import Diagnosis
from slurmiso.monitor.action import Action, ActionKind
from slurmiso.monitor.attribution import Attribution, gpu_key
from slurmiso.monitor.bound import annotate
from slurmiso.monitor.contention import ON_THE_HOST, diagnose_breach, host_suspects, record
from slurmiso.monitor.ladder import BETWEEN, CALM, HOT, UNKNOWN, Breach, job_verdict, limits, worst
from slurmiso.monitor.ladder_state import HostLimited, HostRung
from slurmiso.monitor.policy import HostRungPolicy, Memory, Policy
from slurmiso.monitor.snapshot import JobInfo, Snapshot

STEP = "host-limit"


@dataclass(frozen=True)
class NodeVerdict:
    """One node's verdict for the host rung: HOT (a host cause, with the training jobs it
    names), CALM, or UNKNOWN/BETWEEN (hold position), with the breach behind it."""

    kind: str
    why: str = ""
    breach: Optional[Breach] = None
    gpu: int = 0
    suspects: Tuple[str, ...] = ()

    @property
    def diagnosis(self) -> Optional[Diagnosis]:
        return self.breach.diagnosis if self.breach is not None else None

    @property
    def host_cause(self) -> str:
        d = self.diagnosis
        return d.cause.value if d is not None else ""


def host_ladder(snap: Snapshot, policy: Policy, mem: Memory, who: Attribution) -> List[Action]:
    """This cycle's host-rung actions; ``mem`` moves with them."""
    hp = policy.ladder.host
    if not hp.levels and not mem.host_rungs and not mem.host_limited:
        return []  # off, and nothing of it left to undo
    now = snap.ts
    verdicts = node_verdicts(snap, policy, mem, who) if hp.levels else {}
    for node in sorted(set(mem.host_rungs) | set(verdicts)):
        _move(mem, node, verdicts.get(node, NodeVerdict(CALM, "the host rung is off")), hp,
              now)
    actions = _restrain(snap, mem, who, verdicts, hp, now)
    for act in actions:  # the journal says why the GPU rungs there stay at throttle
        held = {key: r.capped for key, r in sorted(mem.ladder.items())
                if key.rpartition("/")[0] == act.details["node"] and ON_THE_HOST in r.capped}
        if held:
            act.details["gpu_rungs_held"] = held
    annotate(actions, mem, policy)
    return actions


# --------------------------------------------------------------------------- verdicts
def node_verdicts(snap: Snapshot, policy: Policy, mem: Memory,
                  who: Attribution) -> Dict[str, NodeVerdict]:
    """Per node where an SLO inference job runs, or a host rung stands: its verdict."""
    slos = {s.class_name: s for s in policy.slo if limits(s)}
    serving: Dict[str, List[JobInfo]] = {node: [] for node in mem.host_rungs}
    for info in who.live.values():
        if info.job_class in slos and info.state == "RUNNING":
            for node in info.nodes:
                serving.setdefault(node, []).append(info)
    out: Dict[str, NodeVerdict] = {}
    for node, jobs in serving.items():
        seen = snap.node(node)
        if seen is None or seen.telemetry_age_s is None or \
                seen.telemetry_age_s > policy.max_data_age_s:
            out[node] = NodeVerdict(UNKNOWN, f"no fresh telemetry from {node}")
            continue
        if not jobs:
            out[node] = NodeVerdict(CALM, f"no inference job left on {node}")
            continue
        breaches = [job_verdict(j.id, snap.job_signals.get(j.id), slos[j.job_class], policy)
                    for j in sorted(jobs, key=lambda j: j.id)]
        out[node] = _node_verdict(snap, who, node, breaches)
    return out


def _node_verdict(snap: Snapshot, who: Attribution, node: str,
                  breaches: List[Breach]) -> NodeVerdict:
    hot = [b for b in breaches if b.kind == HOT]
    host_hot: List[Tuple[Breach, Tuple[str, ...]]] = []
    for b in hot:
        d = diagnose_breach(snap, who, node, b.job) if snap.host_nodes else None
        suspects = host_suspects(d, who.train)
        if suspects:
            host_hot.append((dataclasses.replace(b, diagnosis=d), suspects))
    if host_hot:
        b = worst([h for h, _ in host_hot])
        suspects = next(s for h, s in host_hot if h is b)
        gpu = next((g for on, g in who.gpus_of.get(b.job, ()) if on == node), 0)
        d = b.diagnosis
        return NodeVerdict(HOT, f"inference job {b.job} on {node}: {b.why}; "
                           f"{d.text if d is not None else ''}", b, gpu, suspects)
    if hot:
        return NodeVerdict(BETWEEN, f"inference job {hot[0].job} is hot, but not for a "
                           "host cause with a training suspect")
    w = worst(breaches)
    if w.kind in (UNKNOWN, BETWEEN):
        return NodeVerdict(w.kind, w.why)
    return NodeVerdict(CALM, f"inference on {node} within its SLO")


# ------------------------------------------------------------------------------ the rung
def _move(mem: Memory, node: str, v: NodeVerdict, hp: HostRungPolicy, now: float) -> None:
    """One node's rung after this verdict (see the module doc)."""
    rung = mem.host_rungs.get(node)
    if rung is None and v.kind != HOT:
        return
    old = rung or HostRung()
    not_hot = old.not_hot_since if old.not_hot_since is not None else now
    if v.kind != HOT and (not hp.levels or now - not_hot >= hp.max_s or old.level == 0):
        del mem.host_rungs[node]  # off, bound reached, or nothing to step back from
        return
    if v.kind in (UNKNOWN, BETWEEN):  # hold position: neither dwell goes on
        mem.host_rungs[node] = dataclasses.replace(old, breach_since=None, calm_since=None,
                                                   not_hot_since=not_hot)
        return
    if v.kind == CALM:
        calm = old.calm_since if old.calm_since is not None else now
        if now - max(calm, old.since) < hp.release_after_s:
            new = dataclasses.replace(old, breach_since=None, calm_since=calm,
                                      not_hot_since=not_hot)
        elif old.level <= 1:
            del mem.host_rungs[node]
            return
        else:
            new = dataclasses.replace(old, level=old.level - 1, since=now, breach_since=None,
                                      calm_since=now, not_hot_since=not_hot, capped="")
        mem.host_rungs[node] = new
        return
    same = old.host_cause == v.host_cause
    breach = old.breach_since if old.breach_since is not None and same else now
    b = v.breach
    new = dataclasses.replace(old, breach_since=breach, calm_since=None, not_hot_since=None,
                              cause=b.job if b else "", gpu=v.gpu, host_cause=v.host_cause,
                              why=v.why[:300])
    start = breach if old.level == 0 else max(breach, old.since)
    if old.level < hp.levels and now - start >= hp.after_s:
        new = dataclasses.replace(new, level=old.level + 1, since=now, capped="")
    mem.host_rungs[node] = new


# ---------------------------------------------------------------------- the jobs limited
def _order(job: Optional[JobInfo], jid: str) -> Tuple[float, float, str]:
    """Who gives way first: lowest Slurm priority, then the youngest (as the GPU rungs)."""
    return (job.priority, -job.submit_ts, jid) if job is not None else (0.0, 0.0, jid)


def _restrain(snap: Snapshot, mem: Memory, who: Attribution, verdicts: Dict[str, NodeVerdict],
              hp: HostRungPolicy, now: float) -> List[Action]:
    """Each limited or suspected training job to its node's level, within the budgets."""
    want: Dict[str, str] = {}  # job -> node
    for node, v in verdicts.items():
        rung = mem.host_rungs.get(node)
        if v.kind == HOT and rung is not None and rung.level:
            for jid in v.suspects:
                want.setdefault(jid, node)
    exempt: Set[str] = set(mem.ladder_exempt)
    actions: List[Action] = []
    for jid in sorted(set(want) | set(mem.host_limited),
                      key=lambda j: _order(who.live.get(j), j)):
        rec = mem.host_limited.get(jid)
        node = rec.node if rec is not None else want[jid]
        job = who.live.get(jid)
        if job is None or node not in job.nodes:
            if rec is not None:
                del mem.host_limited[jid]
                actions.append(_ended(jid, rec, now))
            continue
        rung = mem.host_rungs.get(node)
        level = rung.level if rung is not None else 0
        seen = verdicts.get(node)
        if rec is not None and level < rec.level:
            actions.append(_ease(mem, jid, rec, level, seen, now))
        elif rung is not None and seen is not None and seen.kind == HOT and \
                level > (rec.level if rec else 0) and _limitable(job, jid, who, mem, exempt):
            # only while hot: a level a budget held back is not taken once unknown or calm
            act = _limit(mem, jid, rec, node, rung, seen, hp, now)
            if act is not None:
                actions.append(act)
    return actions


def _limitable(job: JobInfo, jid: str, who: Attribution, mem: Memory, exempt: Set[str]) -> bool:
    """A running training job the GPU ladder does not restrain and nobody exempted."""
    return job.job_class in who.train and job.state == "RUNNING" and \
        jid not in mem.restrained and jid not in exempt


def _facts(kind: ActionKind, rec: HostLimited, v: Optional[NodeVerdict],
           now: float) -> Dict[str, Any]:
    out: Dict[str, Any] = {"node": rec.node, "gpu": gpu_key(rec.node, rec.gpu),
                           "cause": rec.cause, "host_cause": rec.host_cause,
                           "step": kind.value, "ts": now}
    if v is not None and v.diagnosis is not None:
        out["diagnosis"] = record(v.diagnosis)
    return out


def _limit(mem: Memory, jid: str, rec: Optional[HostLimited], node: str, rung: HostRung,
           v: NodeVerdict, hp: HostRungPolicy, now: float) -> Optional[Action]:
    """One level up for ``jid`` (to the rung's), budget allowing; a spent budget caps the
    rung with its reason."""
    ok, note, keys = _spend(mem, hp, jid, rung.cause, now)
    if not ok:
        if rung.capped != note:
            mem.host_rungs[node] = dataclasses.replace(rung, capped=note)
        return None
    new = HostLimited(node, rung.level, now, rung.gpu, rung.cause, rung.host_cause,
                      rung.why)
    mem.host_limited[jid] = new
    reason = (f"training host-limited (level {rung.level}): {rung.why}")[:300]
    return Action(ActionKind.HOST_LIMIT, jid, reason, dict(
        _facts(ActionKind.HOST_LIMIT, new, v, now), level=rung.level,
        from_level=rec.level if rec else 0,
        budget=note, budget_keys=keys, restraint=new.to_dict(),
        host_before=rec.to_dict() if rec else None))


def _ease(mem: Memory, jid: str, rec: HostLimited, level: int, v: Optional[NodeVerdict],
          now: float) -> Action:
    """One level back (to the rung's; 0: the limit lifted). Releases are never budgeted."""
    if level:
        mem.host_limited[jid] = dataclasses.replace(rec, level=level, since=now)
        how = f"eased to level {level}"
    else:
        del mem.host_limited[jid]
        how = "lifted"
    why = v.why if v is not None and v.kind == CALM else "the host rung stepped back"
    reason = (f"training's host limit {how} after {now - rec.since:.0f}s on {rec.node}: "
              f"{why}")[:300]
    return Action(ActionKind.HOST_UNLIMIT, jid, reason, dict(
        _facts(ActionKind.HOST_UNLIMIT, rec, v, now), level=level, from_level=rec.level,
        limited_s=round(now - rec.since, 1), restraint=rec.to_dict(),
        host_before=rec.to_dict()))


def _ended(jid: str, rec: HostLimited, now: float) -> Action:
    """The limited job ended or left the node: its note removed (a requeued job is still
    listed and would carry it), never retried (``gone``: Slurm may refuse an ended job)."""
    return Action(ActionKind.HOST_UNLIMIT, jid, "training's host limit over: it no longer "
                  f"runs on {rec.node}", dict(
                      _facts(ActionKind.HOST_UNLIMIT, rec, None, now), level=0,
                      from_level=rec.level, gone=True,
                      limited_s=round(now - rec.since, 1), restraint=rec.to_dict(),
                      host_before=rec.to_dict()))


def _spend(mem: Memory, hp: HostRungPolicy, victim: str, cause: str,
           now: float) -> Tuple[bool, str, List[str]]:
    """Take one level from the budgets (in all, the training job's, the inference job's),
    or say which one is spent (the GPU rungs' keys and words, ``ladder:host-limit...``)."""
    total, mine, theirs = (f"ladder:{STEP}", f"ladder:{STEP}:{victim}",
                           f"ladder:{STEP}:{cause}")
    if mem.count(total, now) >= hp.per_hour:
        return False, f"{STEP} budget spent: {hp.per_hour} an hour in all", []
    if mem.count(mine, now) >= hp.per_job:
        return False, f"{STEP} budget of job {victim} spent: {hp.per_job} an hour", []
    if cause and mem.count(theirs, now) >= hp.per_job:
        return False, (f"{STEP} budget of inference job {cause} spent: "
                       f"{hp.per_job} an hour"), []
    keys = [total, mine, theirs] if cause else [total, mine]
    for k in keys:
        mem.note(k, now)
    return True, f"{STEP} {mem.count(total, now)}/{hp.per_hour} this hour", keys
