"""Allocation-table keys of MIG instances and who holds them.

Kept apart from :mod:`slurmiso.mig.apply` so the mig-dynamic prolog, which needs only these,
does not import the layout planner on every job start.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Dict, Optional, Tuple

if TYPE_CHECKING:
    from slurmiso.state import NodeState

_CLAIM_RE = re.compile(r"mig/([0-9]+)/gi([0-9]+)")


def claim_key(gpu: int, gi_id: int) -> str:
    """The allocation key a job holds for GPU instance ``gi_id`` of GPU ``gpu``."""
    return f"mig/{gpu}/gi{gi_id}"


def claimed_instances(state: Optional[NodeState]) -> Dict[Tuple[int, int], str]:
    """(gpu, gi_id) -> job id for MIG devices claimed by a job that still has a record."""
    if state is None:
        return {}
    out: Dict[Tuple[int, int], str] = {}
    live = set(state.jobs())
    for key, job in state.allocations().items():
        m = _CLAIM_RE.fullmatch(key)
        if m and job in live:
            out[(int(m.group(1)), int(m.group(2)))] = job
    return out
