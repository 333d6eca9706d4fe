"""Each action kind's Slurm call(s), and what it changes in a dry run's next snapshot; named
by :data:`slurmiso.monitor.actions.KIND` and run by :class:`slurmiso.monitor.apply.Applier`.

A call returns what Slurm said of it: "done", or for the ladder's job calls "already" (Slurm
shows the job as asked) or "gone" (it ended). A refusal raises
:class:`~slurmiso.errors.SlurmisoError`.
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Protocol, Set

from slurmiso.hostlist import compress
from slurmiso.monitor.action import Action


class ApplierPort(Protocol):
    """What a call needs of :class:`slurmiso.monitor.apply.Applier` (a protocol, so the
    table that names the calls does not import the applier that runs them)."""

    slurm: Any

    def comment(self, ids: List[str], text: str) -> None: ...

    def reconcile(self, node: str, live_jobs: List[str]) -> Any: ...

    def relayout(self, node: str, layout: str) -> None: ...

    def write_restraint(self, act: Action) -> None: ...


class OverlayPort(Protocol):
    """What an overlay changes of :class:`slurmiso.monitor.loop.DryRunOverlay`."""

    held: Set[str]
    released: Set[str]
    exc: Dict[str, str]
    begun: Set[str]
    parts: Dict[str, List[str]]
    suspended: Set[str]
    resumed: Set[str]
    requeued: Set[str]


def quote(text: str) -> str:
    """A comment as one scontrol argument: no newlines, no quotes to unbalance."""
    return " ".join(text.replace('"', "'").split())


# ------------------------------------------------------------------ one action per call
def resume_node(ap: ApplierPort, act: Action) -> str:
    ap.slurm.resume(act.target)
    return "done"


def drain(ap: ApplierPort, act: Action) -> str:
    ap.slurm.drain(act.target, f"slurmiso monitor: {act.reason}")
    return "done"


def requeue(ap: ApplierPort, act: Action) -> str:
    ap.slurm.requeue([act.target])
    return "done"


def mig_apply(ap: ApplierPort, act: Action) -> str:
    ap.relayout(act.target, str(act.details["layout"]))
    return "done"


def partition_update(ap: ApplierPort, act: Action) -> str:
    ap.slurm.set_partition_nodes(act.target, compress(act.details["nodes"]))
    return "done"


def qos_limit(ap: ApplierPort, act: Action) -> str:
    lift = {t: -1 for t in act.details.get("lift", ("gpu",))}
    ap.slurm.set_qos_grp_tres(act.target, act.details.get("tres") or lift)
    return "done"


def reconcile(ap: ApplierPort, act: Action) -> str:
    act.details["fixes"] = ap.reconcile(act.target, list(act.details.get("live_jobs", [])))
    return "done"


# ------------------------------------------------------------- the ladder's, one job each
def throttle(ap: ApplierPort, act: Action) -> str:
    return str(ap.slurm.signal_job(act.target, str(act.details.get("sends") or "URG")))


def unthrottle(ap: ApplierPort, act: Action) -> str:
    return str(ap.slurm.signal_job(act.target, str(act.details.get("sends") or "WINCH")))


def suspend(ap: ApplierPort, act: Action) -> str:
    return str(ap.slurm.suspend(act.target))


def resume_job(ap: ApplierPort, act: Action) -> str:
    return str(ap.slurm.resume_job(act.target))


def requeue_job(ap: ApplierPort, act: Action) -> str:
    return str(ap.slurm.requeue_job(act.target, bool(act.details.get("suspended"))))


def note_only(ap: ApplierPort, act: Action) -> str:
    """The host rung's and the park rung's: the note in the job's AdminComment is the whole
    action (the node applies or undoes it), so a note Slurm refuses fails the action."""
    ap.write_restraint(act)
    return "noted"


def journal_only(ap: ApplierPort, act: Action) -> str:
    return "done"  # ladder-end: a journal line only


# ---------------------------------------------------------- many jobs per call (batched)
def same(act: Action) -> Any:
    """Job actions that can share one Slurm call: same kind (and, below, same fields)."""
    return act.kind


def hold_fields(act: Action) -> Any:
    return (act.kind, act.details.get("comment"))


def release_fields(act: Action) -> Any:
    return (act.kind, bool(act.details.get("uncomment")))


def exclude_fields(act: Action) -> Any:
    return (act.details.get("nodes"), act.details.get("comment"))


def hold(ap: ApplierPort, ids: List[str], details: Mapping[str, Any]) -> None:
    ap.slurm.hold(ids)
    if details.get("comment"):
        ap.comment(ids, str(details["comment"]))


def release(ap: ApplierPort, ids: List[str], details: Mapping[str, Any]) -> None:
    ap.slurm.release(ids)
    if details.get("uncomment"):
        ap.comment(ids, "")


def begin_now(ap: ApplierPort, ids: List[str], details: Mapping[str, Any]) -> None:
    ap.slurm.update_jobs(ids, {"StartTime": "now"})


def uncomment(ap: ApplierPort, ids: List[str], details: Mapping[str, Any]) -> None:
    ap.slurm.update_jobs(ids, {"Comment": ""})


def exclude(ap: ApplierPort, ids: List[str], details: Mapping[str, Any]) -> None:
    fields: Dict[str, str] = {"ExcNodeList": str(details.get("nodes") or "")}
    if details.get("comment") is not None:
        fields["Comment"] = quote(str(details["comment"]))
    ap.slurm.update_jobs(ids, fields)


# ------------------------------------------------------------- a dry run's next snapshot
def overlay_hold(ov: OverlayPort, act: Action) -> None:
    ov.held.add(act.target)
    ov.released.discard(act.target)


def overlay_release(ov: OverlayPort, act: Action) -> None:
    ov.released.add(act.target)
    ov.held.discard(act.target)


def overlay_exclude(ov: OverlayPort, act: Action) -> None:
    ov.exc[act.target] = str(act.details.get("nodes") or "")


def overlay_begin_now(ov: OverlayPort, act: Action) -> None:
    ov.begun.add(act.target)


def overlay_partition_update(ov: OverlayPort, act: Action) -> None:
    ov.parts[act.target] = list(act.details.get("nodes", ()))


def overlay_suspend(ov: OverlayPort, act: Action) -> None:
    ov.suspended.add(act.target)
    ov.resumed.discard(act.target)


def overlay_resume_job(ov: OverlayPort, act: Action) -> None:
    ov.resumed.add(act.target)
    ov.suspended.discard(act.target)


def overlay_requeue(ov: OverlayPort, act: Action) -> None:
    ov.requeued.add(act.target)
