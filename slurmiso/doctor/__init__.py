"""``slurmiso doctor``: check a live Slurm cluster (and a GPU node) against the config.

A *snapshot* (plain JSON-able dict) is gathered by :mod:`slurmiso.doctor.collect`; the checks
in :mod:`slurmiso.doctor.cluster` and :mod:`slurmiso.doctor.nodes` are pure functions of the
snapshot and the config, so tests run them on recorded or edited snapshots.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Sequence, Tuple

from slurmiso.config.model import Config

SEVERITIES = ("error", "warning", "info")  # error and warning make doctor exit 1
SNAPSHOT_VERSION = 1


@dataclass(frozen=True)
class Finding:
    """One thing a human should look at, and how to fix it: the one finding type of doctor,
    ``audit`` and ``audit --live``. ``code`` is stable (``--ignore``, JSON, tests)."""

    severity: str
    code: str
    message: str
    fix: str = ""
    #: Job ids or node names concerned (the audit may cut the list; ``count`` is all of them).
    subjects: Tuple[str, ...] = ()
    count: int = 0

    def to_dict(self) -> Dict[str, Any]:
        return {"severity": self.severity, "code": self.code, "message": self.message,
                "fix": self.fix, "subjects": list(self.subjects), "count": self.count}

    @property
    def is_problem(self) -> bool:
        return self.severity in ("error", "warning")


Snapshot = Dict[str, Any]
Check = Callable[[Snapshot, Config], List[Finding]]


def all_checks() -> List[Check]:
    """Every check, in report order (cluster settings, QoS, then partitions, GRES, node)."""
    from slurmiso.doctor import (
        cluster,
        containers,
        fences,
        gpus,
        host,
        nodes,
        restraints,
        telemetry,
    )

    return (list(cluster.CHECKS) + list(fences.CHECKS) + list(host.CHECKS) + list(nodes.CHECKS)
            + list(gpus.CHECKS) + list(restraints.CHECKS) + list(telemetry.CHECKS)
            + list(containers.CHECKS))


def run_checks(snap: Snapshot, cfg: Config, ignore: Sequence[str] = ()) -> List[Finding]:
    """All findings for a snapshot, minus the ignored codes."""
    out: List[Finding] = []
    for check in all_checks():
        out.extend(f for f in check(snap, cfg) if f.code not in ignore)
    return out
