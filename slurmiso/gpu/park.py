"""Park a training job's CUDA processes (their GPU memory to host) and bring them back.

The ladder's ``park`` rung: all of a job's CUDA processes are parked or none is. A job whose
processes are half parked would hold its peers in NCCL calls while still keeping part of its
memory, the worst of both; so a refusal part-way releases what was parked and the caller
falls back to ``scontrol suspend`` with the reason. Order: lock every process first (no new
CUDA work anywhere), then checkpoint each; release in the reverse order of the park.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import List, Sequence, Tuple

from slurmiso.errors import CheckpointRefused
from slurmiso.gpu.cuda_checkpoint import Action, CheckpointTool, CudaState

log = logging.getLogger(__name__)

#: How long the lock may wait for a process's in-flight CUDA calls before the park gives up
#: (the README's reason for the 570 lock timeout: a lock must never deadlock the caller).
LOCK_TIMEOUT_MS = 10_000


@dataclass(frozen=True)
class ParkOutcome:
    """What a park did: every pid parked, or none and the reason (a suspend follows)."""

    parked: Tuple[int, ...] = ()
    refused: str = ""
    #: Processes left in a state the driver could not undo (``failed``): the job needs the
    #: suspend (or requeue) whatever happens next, and the journal names them.
    damaged: Tuple[int, ...] = field(default=())

    @property
    def ok(self) -> bool:
        return not self.refused


def park(tool: CheckpointTool, pids: Sequence[int],
         lock_timeout_ms: int = LOCK_TIMEOUT_MS) -> ParkOutcome:
    """Lock then checkpoint every pid; on any refusal undo the rest and say why."""
    why = tool.unusable()
    if why:
        return ParkOutcome(refused=why)
    if not pids:
        return ParkOutcome(refused="the job has no CUDA process on this node to park")
    locked: List[int] = []
    try:
        for pid in pids:
            tool.act(pid, Action.LOCK, lock_timeout_ms)
            locked.append(pid)
        for pid in pids:
            tool.act(pid, Action.CHECKPOINT)
    except CheckpointRefused as exc:
        damaged = _undo(tool, locked)
        log.warning("park refused, releasing what was parked: %s", exc)
        return ParkOutcome(refused=str(exc), damaged=tuple(damaged))
    return ParkOutcome(parked=tuple(pids))


def release(tool: CheckpointTool, pids: Sequence[int]) -> List[str]:
    """Restore then unlock every parked pid; the problems, one line each (empty: all back).

    Each pid is taken from whatever state it is in, so a release after a crash half-way
    (some restored, some not) finishes the job instead of failing on the first.
    """
    problems: List[str] = []
    for pid in reversed(list(pids)):
        problems.extend(_bring_back(tool, pid))
    return problems


def _bring_back(tool: CheckpointTool, pid: int) -> List[str]:
    try:
        state = tool.state(pid)
        if state is CudaState.CHECKPOINTED:
            tool.act(pid, Action.RESTORE)
            state = CudaState.LOCKED
        if state is CudaState.LOCKED:
            tool.act(pid, Action.UNLOCK)
            state = CudaState.RUNNING
    except CheckpointRefused as exc:
        return [str(exc)]
    if state is not CudaState.RUNNING:
        return [f"pid {pid} is {state.value}: the driver cannot bring it back"]
    return []


def _undo(tool: CheckpointTool, locked: Sequence[int]) -> List[int]:
    """Bring back what a refused park touched (every checkpointed pid was locked first);
    the pids the driver could not bring back."""
    return [pid for pid in reversed(list(locked)) if _bring_back(tool, pid)]
