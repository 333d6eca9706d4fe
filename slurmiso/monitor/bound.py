"""The ladder's bound (issue 33): a rung never stands for ever without a hot cause.

Unknown and "between" verdicts hold a rung where it is (no step, no release: see
:mod:`slurmiso.monitor.ladder`). Without a bound, an inference job that forged a breach and
then stopped answering (or answers just under its SLO) would keep another user's training
suspended as long as it liked. So each GPU's rung remembers since when its cause has not been
hot (``Rung.not_hot_since``); once that lasts the step's ``max_s``, the rung ends and every
training job it restrains there is given back in the direction ``monitor.ladder.on_bound``
names: ``resume`` (``resume-job``, ``unthrottle``) or ``requeue`` (checkpoint and requeue,
a suspended job resumed first). Each is an ordinary ladder action, journaled with ``bound``.

The node applies the same bound when no monitor is alive (:mod:`slurmiso.restraints`):
so each ladder action carries the bound its restraint has (``bound``), and the applier
writes it in the job's ``AdminComment`` where the node reads it.

Pure: memory in, actions out, like the rest of :func:`~slurmiso.monitor.decide.decide`.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, List, Mapping, Optional, Tuple

from slurmiso.monitor.action import Action, ActionKind
from slurmiso.monitor.actions import KIND
from slurmiso.monitor.attribution import gpu_key
from slurmiso.monitor.ladder_state import HostLimited, Restraint, Rung
from slurmiso.monitor.policy import Memory, Policy
from slurmiso.monitor.snapshot import JobInfo
from slurmiso.restraints import OnBound

#: The verdict kind that keeps a rung's bound from running (the ladder's ``HOT``).
_HOT = "hot"


def step_bound(policy: Policy, step: str) -> float:
    """``max_s`` of ``step``; a step no longer configured (or none yet) gets the smallest
    bound configured, so it ends no later than any other."""
    st = policy.ladder.step(step)
    if st is not None:
        return st.max_s
    return min((s.max_s for s in policy.ladder.steps), default=0.0)


def end_unhot(mem: Memory, verdicts: Mapping[str, Tuple[Any, str, int]], policy: Policy,
              now: float, live: Mapping[str, JobInfo]) -> List[Action]:
    """Start, stop or apply each rung's bound from this cycle's verdicts (GPU key ->
    (verdict, node, GPU)); the actions that end the restraints of the rungs it ends."""
    actions: List[Action] = []
    for key in sorted(verdicts):
        rung = mem.ladder.get(key)
        if rung is None:
            continue
        kind = getattr(verdicts[key][0], "kind", "")
        if kind == _HOT:
            if rung.not_hot_since is not None:
                mem.ladder[key] = dataclasses.replace(rung, not_hot_since=None)
            continue
        since = rung.not_hot_since if rung.not_hot_since is not None else now
        bound = step_bound(policy, rung.step)
        if now - since < bound:
            if rung.not_hot_since is None:
                mem.ladder[key] = dataclasses.replace(rung, not_hot_since=now)
            continue
        del mem.ladder[key]
        actions += _end_gpu(mem, key, rung, kind, now - since, bound, policy, live, now)
    return actions


def _end_gpu(mem: Memory, key: str, rung: Rung, kind: str, lasted: float, bound: float,
             policy: Policy, live: Mapping[str, JobInfo], now: float) -> List[Action]:
    """The restraints of one GPU whose rung reached its bound, ended as ``on_bound`` says.
    A job that no longer runs there, or that someone else resumed, is left to the ladder
    (its ``ladder-end`` line)."""
    out: List[Action] = []
    facts = {"max_s": bound, "not_hot_s": round(lasted, 1), "verdict": kind or "unknown",
             "on_bound": policy.ladder.on_bound.value, "step": rung.step}
    why = (f"its cause ({rung.cause and 'inference job ' + rung.cause or 'unknown'}) has "
           f"not been hot for {lasted:.0f}s, the {rung.step or 'ladder'} step's bound "
           f"({bound:.0f}s)")
    for jid, rec in sorted(mem.restrained.items()):
        if gpu_key(rec.node, rec.gpu) != key:
            continue
        job = live.get(jid)
        if job is None or rec.node not in job.nodes:
            continue
        suspended = job.state == "SUSPENDED"
        if rec.suspended_since is not None and not suspended:
            continue
        del mem.restrained[jid]
        base = {"gpu": key, "node": rec.node, "cause": rec.cause, "signal": rec.signal,
                "figure_before": rec.figure, "restraint": rec.to_dict(), "ts": now,
                "bound": facts}
        if rec.parked_since is not None:
            out.append(Action(ActionKind.UNPARK, jid, f"training unparked: {why}"[:300],
                              dict(base, step="unpark",
                                   parked_s=_since(rec.parked_since, now))))
        if policy.ladder.on_bound is OnBound.REQUEUE and rec.parked_since is None:
            out.append(Action(ActionKind.LADDER_REQUEUE, jid,
                              f"training requeued (checkpoint): {why}"[:300],
                              dict(base, step="requeue", suspended=suspended,
                                   throttled_s=_since(rec.throttled_since, now),
                                   suspended_s=_since(rec.suspended_since, now))))
            continue
        if rec.suspended_since is not None:
            out.append(Action(ActionKind.RESUME_JOB, jid, f"training resumed: {why}"[:300],
                              dict(base, step="resume-job",
                                   suspended_s=_since(rec.suspended_since, now))))
        if rec.throttled_since is not None:
            out.append(Action(ActionKind.UNTHROTTLE, jid,
                              f"training back to full speed: {why}"[:300],
                              dict(base, step="unthrottle",
                                   sends=policy.ladder.unthrottle_signal,
                                   throttled_s=_since(rec.throttled_since, now))))
    return out


def _since(ts: Optional[float], now: float) -> Optional[float]:
    return None if ts is None else round(now - ts, 1)


def annotate(actions: List[Action], mem: Memory, policy: Policy) -> None:
    """Give each ladder action the restraint its job is left with (``left``: step, since,
    bound; None when none is left) and the bound's direction, for the applier's note in the
    job's ``AdminComment`` and for the journal."""
    for act in actions:
        if not KIND[act.kind].ladder:
            continue
        rec = mem.restrained.get(act.target)
        act.details["left"] = _left(rec, policy) or _host_left(
            mem.host_limited.get(act.target), policy)


def _host_left(rec: Optional[HostLimited], policy: Policy) -> Optional[Dict[str, Any]]:
    """The host rung's note, where the job has no GPU restraint (one note a job: a throttle
    or a suspend is the harder, and the host limit comes back once it ends)."""
    if rec is None:
        return None
    return {"step": "host-limit", "since": rec.since, "node": rec.node, "gpu": rec.gpu,
            "cause": rec.cause, "max_s": policy.ladder.host.max_s,
            "on_bound": OnBound.RESUME.value, "level": rec.level}


def _left(rec: Optional[Restraint], policy: Policy) -> Optional[Dict[str, Any]]:
    if rec is None:
        return None
    if rec.suspended_since is not None:
        step, since = "suspend", rec.suspended_since
    elif rec.parked_since is not None:
        step, since = "park", rec.parked_since
    elif rec.throttled_since is not None:
        step, since = "throttle", rec.throttled_since
    else:
        return None
    return {"step": step, "since": since, "node": rec.node, "gpu": rec.gpu,
            "cause": rec.cause, "max_s": step_bound(policy, step),
            "on_bound": policy.ladder.on_bound.value}
