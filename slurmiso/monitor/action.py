"""What the monitor does, as values: one typed kind each (:class:`ActionKind`) and the
action itself (:class:`Action`). How each kind is applied, undone, reconciled and ranked is
:data:`slurmiso.monitor.actions.KIND`'s; this leaf module is what every other module of the
monitor may import without importing the I/O those entries name.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, Dict


class ActionKind(str, enum.Enum):
    """What the monitor does; str-valued, the value is the kind's own name (its journal
    name is :attr:`journal`)."""

    RESUME = "resume"  # a node's State=RESUME (after a re-layout)
    DRAIN = "drain"
    RELAYOUT_REQUEUE = "relayout-requeue"  # training requeued to empty a node to re-layout
    LADDER_REQUEUE = "requeue"  # the ladder's last step (checkpoint, then requeue)
    THROTTLE = "throttle"
    SUSPEND = "suspend"
    MIG_APPLY = "mig-apply"
    PARTITION_UPDATE = "partition-update"
    QOS_LIMIT = "qos-limit"
    HOLD = "hold"
    EXCLUDE = "exclude"
    UNCOMMENT = "uncomment"
    RELEASE = "release"
    BEGIN_NOW = "begin-now"
    RESUME_JOB = "resume-job"  # a suspended job's
    UNTHROTTLE = "unthrottle"
    #: The park rung (issue 35): a note the node turns into cuda-checkpoint, and its removal.
    PARK = "park"
    UNPARK = "unpark"
    #: The host rung (issue 36): a note the node turns into a cgroup limit, and its removal.
    HOST_LIMIT = "host-limit"
    HOST_UNLIMIT = "host-unlimit"
    LADDER_END = "ladder-end"
    RECONCILE = "reconcile"

    def __str__(self) -> str:
        return self.value

    @property
    def journal(self) -> str:
        """The name the journal, the reports and the state file's intent have always used:
        the kind's own, but a re-layout's requeue is a ``requeue`` there as the ladder's is
        (the audit tells them apart by the ladder's ``restraint`` in the line's details)."""
        return JOURNAL_ALIAS.get(self.value, self.value)


#: Kinds whose journal name is another kind's (see :attr:`ActionKind.journal`).
JOURNAL_ALIAS = {"relayout-requeue": "requeue"}


@dataclass(frozen=True)
class Action:
    """One change the monitor wants: ``kind`` on ``target`` because of ``reason``."""

    #: A kind's value ("hold") is equal to it and hashes alike, so it finds the same entry:
    #: compare kinds with ``==``. (No conversion here: 60,000 actions a cycle.)
    kind: ActionKind
    target: str
    reason: str
    details: Dict[str, Any] = field(default_factory=dict)

    @property
    def name(self) -> str:
        """The kind as the journal, the reports and the logs name it."""
        return str(JOURNAL_ALIAS.get(self.kind, self.kind))

    def to_dict(self) -> Dict[str, Any]:
        return {"kind": self.name, "target": self.target, "reason": self.reason,
                "details": dict(self.details)}

    def describe(self) -> str:
        return f"{self.name} {self.target}: {self.reason}"
