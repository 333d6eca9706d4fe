"""The monitor's actions: one table entry per kind (:mod:`slurmiso.monitor.action`) saying
how it is applied, undone when applying failed, reconciled after a crash and ranked.

>>> from slurmiso.monitor.action import Action, ActionKind
>>> from slurmiso.monitor.actions import KIND
>>> act = Action(ActionKind.RELAYOUT_REQUEUE, "42", "empty n1 for its re-layout")
>>> act.name, KIND[act.kind].ladder, KIND[ActionKind.LADDER_REQUEUE].ladder
('requeue', False, True)

A kind's journal name (:attr:`ActionKind.journal`) is what the journal, the reports and the
state file's intent have always said; two kinds may share one (the ladder's requeue and a
re-layout's are both ``requeue`` there, told apart by the ladder's ``restraint`` in the
line's details, as the audit reads them). In the code they are different kinds: nothing
tests a kind's details to know which it is.

Adding a kind: its member in :class:`~slurmiso.monitor.action.ActionKind`, its entry in
:data:`KIND` (the Slurm call in :mod:`slurmiso.monitor.calls`, its undo and reconcile in
:mod:`slurmiso.monitor.undo`), its journal line in docs/journal.md, and its row in the
table's tests.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Mapping, Optional

from slurmiso.monitor import calls, undo
from slurmiso.monitor.action import Action, ActionKind
from slurmiso.monitor.calls import ApplierPort, OverlayPort

if TYPE_CHECKING:
    from slurmiso.monitor.policy import Memory
    from slurmiso.monitor.snapshot import JobInfo, Snapshot


#: One Slurm call (or none) for one action: "done", "already" or "gone" (the ladder's).
Call = Callable[[ApplierPort, Action], str]
#: One Slurm call for many jobs of one kind with the same fields: (applier, ids, details).
Batch = Callable[[ApplierPort, List[str], Mapping[str, Any]], None]
#: The memory to keep when applying failed: as if the action had not been decided.
Undo = Callable[["Memory", Action, str], None]
#: A restart squares an intended action with what Slurm shows: (snapshot, memory, the
#: pending job of that id or None, target, op, moved nodes).
Reconcile = Callable[["Snapshot", "Memory", Optional["JobInfo"], str, str, str], None]
#: What a dry run's action would have changed in Slurm, for its next snapshot.
Overlay = Callable[[OverlayPort, Action], None]


@dataclass(frozen=True)
class KindSpec:
    """One kind: where it ranks in a cycle, how it is applied (``call``
    one action at a time, or ``batch`` many jobs per call, grouped by ``group``), undone,
    reconciled and laid over a dry run's next snapshot."""

    #: Place in the order a cycle applies actions: what protects inference first (the
    #: ladder's escalations with the re-layout's), what gives training back last.
    rank: int
    call: Optional[Call] = None
    batch: Optional[Batch] = None
    group: Callable[[Action], Any] = calls.same
    undo: Optional[Undo] = None
    reconcile: Optional[Reconcile] = None
    overlay: Optional[Overlay] = None
    #: A ladder action: it carries the job's ``restraint``, its budget, and the note the
    #: applier leaves in the job's AdminComment.
    ladder: bool = False
    #: The node turns the note into the action (park, host limit): its agent is nudged to
    #: read its restraints from Slurm at once instead of at its next round.
    node_acts: bool = False


K = ActionKind
#: Every kind's entry, in the order a cycle applies them.
KIND: Dict[ActionKind, KindSpec] = {
    K.RESUME: KindSpec(0, calls.resume_node, undo=undo.relayout_failed),
    K.DRAIN: KindSpec(1, calls.drain, undo=undo.drain),
    K.RELAYOUT_REQUEUE: KindSpec(2, calls.requeue, undo=undo.relayout_requeue),
    K.LADDER_REQUEUE: KindSpec(2, calls.requeue_job, undo=undo.ladder_requeue,
                               overlay=calls.overlay_requeue, ladder=True),
    K.THROTTLE: KindSpec(3, calls.throttle, undo=undo.throttle, ladder=True),
    K.HOST_LIMIT: KindSpec(3, calls.note_only, undo=undo.host_limit, ladder=True,
                           node_acts=True),
    K.PARK: KindSpec(4, calls.note_only, undo=undo.park, ladder=True,
                     node_acts=True),
    K.SUSPEND: KindSpec(4, calls.suspend, undo=undo.suspend,
                        reconcile=undo.reconcile_suspend, overlay=calls.overlay_suspend,
                        ladder=True),
    K.MIG_APPLY: KindSpec(5, calls.mig_apply, undo=undo.relayout_failed),
    K.PARTITION_UPDATE: KindSpec(6, calls.partition_update,
                                 undo=undo.partition_update,
                                 reconcile=undo.reconcile_partition_update,
                                 overlay=calls.overlay_partition_update),
    K.QOS_LIMIT: KindSpec(7, calls.qos_limit, undo=undo.qos_limit),
    K.HOLD: KindSpec(8, batch=calls.hold, group=calls.hold_fields, undo=undo.hold,
                     reconcile=undo.reconcile_hold, overlay=calls.overlay_hold),
    K.EXCLUDE: KindSpec(9, batch=calls.exclude, group=calls.exclude_fields,
                        undo=undo.exclude, reconcile=undo.reconcile_exclude,
                        overlay=calls.overlay_exclude),
    K.UNCOMMENT: KindSpec(10, batch=calls.uncomment),
    K.RELEASE: KindSpec(11, batch=calls.release, group=calls.release_fields,
                        undo=undo.release, reconcile=undo.reconcile_release,
                        overlay=calls.overlay_release),
    K.BEGIN_NOW: KindSpec(12, batch=calls.begin_now, undo=undo.begin_now,
                          reconcile=undo.reconcile_begin_now, overlay=calls.overlay_begin_now),
    K.RESUME_JOB: KindSpec(13, calls.resume_job, undo=undo.resume_job,
                           reconcile=undo.reconcile_resume_job, overlay=calls.overlay_resume_job,
                           ladder=True),
    K.UNPARK: KindSpec(13, calls.note_only, undo=undo.unpark,
                       reconcile=undo.reconcile_unpark, ladder=True, node_acts=True),
    K.UNTHROTTLE: KindSpec(14, calls.unthrottle, undo=undo.unthrottle,
                           reconcile=undo.reconcile_unthrottle, ladder=True),
    K.HOST_UNLIMIT: KindSpec(14, calls.note_only, undo=undo.host_unlimit,
                             reconcile=undo.reconcile_host_unlimit, ladder=True, node_acts=True),
    K.LADDER_END: KindSpec(15, calls.journal_only, ladder=True),
    K.RECONCILE: KindSpec(16, calls.reconcile),
}
#: A restarted monitor's intent names kinds by their journal name: those it reconciles.
RECONCILE_BY_JOURNAL: Dict[str, Reconcile] = {
    kind.journal: spec.reconcile for kind, spec in KIND.items() if spec.reconcile is not None}
