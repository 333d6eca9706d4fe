"""The one interface the probe's session drives, whether a workload runs here or in Slurm.

A :class:`Run` is one workload: the spec file :mod:`slurmiso.probe.jobrun` reads, plus how to
place it (environment for a local process; sbatch arguments and a node for a Slurm job). A
launcher starts runs, says whether each is still pending, running or ended, and cancels them:
one run, or everything it ever started (the session's ``finally``).
"""

from __future__ import annotations

import os
from typing import Dict, List, Mapping, Optional, Protocol

from slurmiso.values import Value, field

PENDING, RUNNING, ENDED = "pending", "running", "ended"


def package_root() -> str:
    """The directory this slurmiso is imported from (a checkout or site-packages)."""
    import slurmiso

    return os.path.dirname(os.path.dirname(os.path.abspath(slurmiso.__file__)))


def with_package_path(env: Mapping[str, str]) -> Dict[str, str]:
    """``env`` with this slurmiso first on PYTHONPATH, so a run started from a checkout runs
    the checkout's runner and workloads, not another installed copy."""
    out = dict(env)
    parts = [package_root()] + [p for p in out.get("PYTHONPATH", "").split(os.pathsep) if p]
    out["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(parts))
    return out


class Run(Value):
    """One workload to start: ``name`` like ``mps-mixed-infer``."""

    name: str
    role: str
    spec_path: str
    env: Dict[str, str] = field(default_factory=dict)
    sbatch: List[str] = field(default_factory=list)
    node: str = ""  # Slurm: run on this node (the pair's second job joins the first)


class Launcher(Protocol):
    where: str

    def start(self, run: Run) -> str:
        """Start ``run``; return its handle (a pid or a job id, as text)."""

    def state(self, handle: str) -> str:
        """PENDING, RUNNING or ENDED."""

    def why_pending(self, handle: str) -> str:
        """Why a run has not started yet ("" when unknown)."""

    def restarts(self, handle: str) -> Optional[int]:
        """How often the scheduler restarted the run (Slurm's RestartCnt); None unknown."""

    def cancel(self, handle: str) -> None:
        """End one run (no error when it has ended already)."""

    def cancel_all(self) -> List[str]:
        """End every run this launcher started; return the handles still alive after it."""

    def describe(self, handle: str) -> str:
        """``job 1234`` or ``pid 5678``: how the run is named in messages."""
