"""Each action kind's memory squared with what happened (pure): undone when applying it
failed (as if it had not been decided, so the next cycle tries again), and reconciled when a
restarted monitor finds it in its intent (it may or may not have reached Slurm). Named by
:data:`slurmiso.monitor.actions.KIND`; called by :func:`slurmiso.monitor.decide.failed` and
:func:`slurmiso.monitor.decide.reconcile_intent`.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Optional

from slurmiso.monitor.admission_state import Cap, Hold, Loan
from slurmiso.monitor.ladder_state import HostLimited, Restraint

if TYPE_CHECKING:
    from slurmiso.monitor.action import Action
    from slurmiso.monitor.policy import Memory
    from slurmiso.monitor.snapshot import JobInfo, Snapshot


# ------------------------------------------------------------------ applying it failed
def hold(mem: Memory, act: Action, error: str) -> None:
    mem.holds.pop(act.target, None)


def release(mem: Memory, act: Action, error: str) -> None:
    mem.holds[act.target] = Hold.from_dict(act.details.get("hold") or {})
    if mem.release_times:
        mem.release_times.pop()


def exclude(mem: Memory, act: Action, error: str) -> None:
    d = act.details
    if d.get("previous") is None:  # nothing of ours was on the job before
        mem.excluded.pop(act.target, None)
    else:
        mem.excluded[act.target] = {"set": d["previous"], "user": d.get("user", ""),
                                    "comment": d.get("own_comment", "")}


def begin_now(mem: Memory, act: Action, error: str) -> None:
    mem.requeued[act.target] = 0.0
    if mem.release_times:
        mem.release_times.pop()


def partition_update(mem: Memory, act: Action, error: str) -> None:
    d = act.details
    for node in d.get("moved", ()):
        if d.get("op") == "lend":
            mem.lent.pop(node, None)
        else:
            mem.lent[node] = Loan(str(d.get("from", "")), act.target)


def drain(mem: Memory, act: Action, error: str) -> None:
    mem.relayout = None


def qos_limit(mem: Memory, act: Action, error: str) -> None:
    d = act.details
    if d.get("previous") is None:
        mem.caps.pop(act.target, None)
    else:
        mem.caps[act.target] = Cap(dict(d["previous"]))


def relayout_requeue(mem: Memory, act: Action, error: str) -> None:
    if mem.relayout is not None:
        done = [j for j in mem.relayout.get("requeued", []) if j != act.target]
        mem.relayout = dict(mem.relayout, requeued=done)


def relayout_failed(mem: Memory, act: Action, error: str) -> None:
    """A re-layout step failed (mig-apply, or the node's resume): the node goes back into
    service on the next cycle."""
    d = act.details
    mem.relayout = {"node": act.target, "pool": d.get("pool", ""),
                    "layout": d.get("layout", ""), "phase": "failed", "since": 0.0,
                    "error": error}


def _ladder_before(mem: Memory, act: Action) -> Optional[Restraint]:
    """An escalation that failed gives its budget back; the restraint the job had before
    the action (None: an action with no restraint, nothing to undo)."""
    d = act.details
    if "restraint" not in d:
        return None
    _budget_back(mem, act)
    return Restraint.from_dict(d["restraint"])


def _budget_back(mem: Memory, act: Action) -> None:
    d = act.details
    for key in d.get("budget_keys", ()):
        stamps = mem.events.get(key, [])
        if stamps and stamps[-1] == d.get("ts"):
            mem.events[key] = stamps[:-1]


def _keep(mem: Memory, target: str, rec: Optional[Restraint]) -> None:
    if rec is None or not rec.held():
        mem.restrained.pop(target, None)
    else:
        mem.restrained[target] = rec


def ladder_requeue(mem: Memory, act: Action, error: str) -> None:
    before = _ladder_before(mem, act)
    if before is not None:
        mem.restrained[act.target] = before


def throttle(mem: Memory, act: Action, error: str) -> None:
    if _ladder_before(mem, act) is not None:
        cur = mem.restrained.get(act.target)
        _keep(mem, act.target, cur and dataclasses.replace(cur, throttled_since=None))


def suspend(mem: Memory, act: Action, error: str) -> None:
    if _ladder_before(mem, act) is not None:
        cur = mem.restrained.get(act.target)
        _keep(mem, act.target, cur and dataclasses.replace(cur, suspended_since=None))


def park(mem: Memory, act: Action, error: str) -> None:
    """A park note Slurm refused: the budget back, the job not parked (tried again)."""
    if _ladder_before(mem, act) is not None:
        cur = mem.restrained.get(act.target)
        _keep(mem, act.target, cur and dataclasses.replace(cur, parked_since=None))


def unpark(mem: Memory, act: Action, error: str) -> None:
    """A release Slurm refused leaves the job parked (retried next cycle; a job that ended
    meanwhile leaves the ladder with its ``ladder-end``)."""
    before = _ladder_before(mem, act)
    if before is not None:
        cur = mem.restrained.get(act.target) or before
        _keep(mem, act.target, dataclasses.replace(cur, parked_since=before.parked_since))


def unthrottle(mem: Memory, act: Action, error: str) -> None:
    """A release that failed leaves the job restrained (retried next cycle)."""
    before = _ladder_before(mem, act)
    if before is not None:
        cur = mem.restrained.get(act.target) or before
        _keep(mem, act.target,
              dataclasses.replace(cur, throttled_since=before.throttled_since))


def resume_job(mem: Memory, act: Action, error: str) -> None:
    before = _ladder_before(mem, act)
    if before is not None:
        cur = mem.restrained.get(act.target) or before
        _keep(mem, act.target,
              dataclasses.replace(cur, suspended_since=before.suspended_since))


# ------------------------------------------------------- reconciled after a restart
# A hold that never happened is forgotten (not taken for an admin's release); a release
# that never happened is owned again (so it is released, never orphaned); a reclaim that
# never happened leaves the node lent; an exclusion that never happened is retried.
def reconcile_hold(snap: Snapshot, mem: Memory, job: Optional[JobInfo], target: str,
                   op: str, moved: str) -> None:
    if job is not None and not job.held:
        mem.holds.pop(target, None)


def reconcile_release(snap: Snapshot, mem: Memory, job: Optional[JobInfo], target: str,
                      op: str, moved: str) -> None:
    if job is not None and job.held and target not in mem.holds:
        mem.holds[target] = Hold(snap.ts, ("reconciled",),
                                 "a release the monitor meant before it stopped")


def reconcile_exclude(snap: Snapshot, mem: Memory, job: Optional[JobInfo], target: str,
                      op: str, moved: str) -> None:
    if job is not None and target in mem.excluded:
        mem.excluded[target] = dict(mem.excluded[target], set=job.exc_nodes)


def reconcile_begin_now(snap: Snapshot, mem: Memory, job: Optional[JobInfo], target: str,
                        op: str, moved: str) -> None:
    if job is not None and job.reason == "BeginTime":
        mem.requeued.setdefault(target, snap.ts)


def reconcile_partition_update(snap: Snapshot, mem: Memory, job: Optional[JobInfo],
                               target: str, op: str, moved: str) -> None:
    if op != "reclaim":
        return
    members = set(snap.partitions.get(target, ()))
    for node in (n for n in moved.split(",") if n in members):
        mem.lent.setdefault(node, Loan("", target, snap.ts))


# A suspend Slurm does not show never happened; a resume it does not show is owed again
# (the job stays ours to resume); an unthrottle may not have been sent, so it is sent again
# (it is idempotent). A throttle is kept as if sent: the ladder escalates past a program
# that did not slow down anyway.
def _live(snap: Snapshot, target: str) -> Optional[JobInfo]:
    return next((j for j in snap.jobs if j.id == target), None)


def reconcile_suspend(snap: Snapshot, mem: Memory, job: Optional[JobInfo], target: str,
                      op: str, moved: str) -> None:
    live = _live(snap, target)
    rec = mem.restrained.get(target)
    if live is not None and rec is not None and live.state != "SUSPENDED":
        mem.restrained[target] = dataclasses.replace(rec, suspended_since=None)


def reconcile_resume_job(snap: Snapshot, mem: Memory, job: Optional[JobInfo], target: str,
                         op: str, moved: str) -> None:
    live = _live(snap, target)
    if live is not None and live.state == "SUSPENDED" and live.nodes:
        base = mem.restrained.get(target) or Restraint(
            live.nodes[0], -1, why="a resume the monitor meant before it stopped")
        mem.restrained[target] = dataclasses.replace(base, suspended_since=snap.ts)


def reconcile_unthrottle(snap: Snapshot, mem: Memory, job: Optional[JobInfo], target: str,
                         op: str, moved: str) -> None:
    live = _live(snap, target)
    if live is not None and live.state in ("RUNNING", "SUSPENDED") and live.nodes:
        base = mem.restrained.get(target) or Restraint(
            live.nodes[0], -1, why="an unthrottle the monitor meant before it stopped")
        mem.restrained[target] = dataclasses.replace(base, throttled_since=snap.ts)


def reconcile_unpark(snap: Snapshot, mem: Memory, job: Optional[JobInfo], target: str,
                     op: str, moved: str) -> None:
    """A release of a park the monitor meant before it stopped may not have reached Slurm:
    the job is owned as parked again, so the next cycle releases it (removing a note twice
    changes nothing); never left parked with nobody to release it."""
    live = _live(snap, target)
    if live is not None and live.state in ("RUNNING", "SUSPENDED") and live.nodes:
        base = mem.restrained.get(target) or Restraint(
            live.nodes[0], -1, why="an unpark the monitor meant before it stopped")
        mem.restrained[target] = dataclasses.replace(base, parked_since=snap.ts)


# ------------------------------------------------------------------ the host rung's
def _host_before(mem: Memory, act: Action) -> None:
    """The job's host limit as it was before ``act`` (``details.host_before``; None: none)."""
    before = act.details.get("host_before")
    if before:
        mem.host_limited[act.target] = HostLimited.from_dict(before)
    else:
        mem.host_limited.pop(act.target, None)


def host_limit(mem: Memory, act: Action, error: str) -> None:
    """A note Slurm refused: the budget back and the job's level as it was (tried again)."""
    if "host_before" in act.details:
        _budget_back(mem, act)
        _host_before(mem, act)


def host_unlimit(mem: Memory, act: Action, error: str) -> None:
    """A removal Slurm refused leaves the job limited (retried next cycle), unless the job
    is gone (an ended job may refuse it: nothing is left to restore)."""
    if "host_before" in act.details and not act.details.get("gone"):
        _host_before(mem, act)


def reconcile_host_unlimit(snap: Snapshot, mem: Memory, job: Optional[JobInfo], target: str,
                           op: str, moved: str) -> None:
    """A removal the monitor meant before it stopped may not have reached Slurm: the job is
    owned again, so the next cycle removes its note (removing it twice changes nothing)."""
    live = _live(snap, target)
    if live is not None and live.state in ("RUNNING", "SUSPENDED") and live.nodes \
            and target not in mem.host_limited:
        mem.host_limited[target] = HostLimited(
            live.nodes[0], 1, snap.ts, why="a host-limit removal the monitor meant before "
            "it stopped")
