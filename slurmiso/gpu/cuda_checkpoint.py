"""NVIDIA's cuda-checkpoint: a process's GPU state to host memory and back, in place.

What the tool does, from its README (github.com/NVIDIA/cuda-checkpoint, driver 570 text): a
process's CUDA state is ``running``; ``--action lock`` blocks its CUDA driver calls (with
``--timeout <ms>``: a lock that cannot be had in time fails instead of waiting for ever);
``checkpoint`` waits for submitted work, copies device memory to host and releases every GPU
resource (``locked`` -> ``checkpointed``: the process is gone from the GPU's process list);
``restore`` re-acquires the GPU and copies memory back (-> ``locked``); ``unlock`` lets CUDA
calls run again (-> ``running``). CPU threads keep running, blocking in CUDA calls. ``failed``
is the state after an error mid-way; the README says the driver does not try to keep the
process usable then. It refuses UVM and IPC memory. Driver 550 has only ``--toggle``; the
separate lock with a timeout came with 570, and slurmiso needs it (a lock that may wait for
ever cannot sit on the ladder's path), so older tools are reported as unusable.

The ladder's ``park`` rung uses :class:`CheckpointTool`: :class:`CliTool` runs the real binary,
:class:`SimTool` plays it on the simulated backend. Only the documentation backs the real
tool's behaviour here; no lent GPU has run it yet (docs/measured-gpu.md).
"""

from __future__ import annotations

import enum
import re
import shutil
import subprocess
from typing import Optional, Protocol, Sequence

from slurmiso.errors import CheckpointRefused

#: The driver branch whose tool has ``--action lock --timeout`` (README, "570 Features").
MIN_VERSION = (570, 0)
#: How long one call of the tool may take: checkpoint and restore copy the process's whole
#: device memory over PCIe; tens of GiB take seconds, never minutes.
CALL_TIMEOUT_S = 120.0


class CudaState(str, enum.Enum):
    """A process's CUDA state as ``cuda-checkpoint --get-state`` prints it."""

    RUNNING = "running"
    LOCKED = "locked"
    CHECKPOINTED = "checkpointed"
    FAILED = "failed"


class Action(str, enum.Enum):
    """``cuda-checkpoint --action`` verbs, in the order a park then a release uses them."""

    LOCK = "lock"
    CHECKPOINT = "checkpoint"
    RESTORE = "restore"
    UNLOCK = "unlock"


#: Which state each action needs, and which it leaves (the driver's state machine).
TRANSITIONS = {
    Action.LOCK: (CudaState.RUNNING, CudaState.LOCKED),
    Action.CHECKPOINT: (CudaState.LOCKED, CudaState.CHECKPOINTED),
    Action.RESTORE: (CudaState.CHECKPOINTED, CudaState.LOCKED),
    Action.UNLOCK: (CudaState.LOCKED, CudaState.RUNNING),
}


class CheckpointTool(Protocol):
    """The narrow interface the ladder parks training through."""

    def unusable(self) -> Optional[str]:
        """Why the tool cannot be used on this node, or None when it can."""

    def state(self, pid: int) -> CudaState:
        """The process's CUDA state; :class:`CheckpointRefused` if it has none."""

    def act(self, pid: int, action: Action, timeout_ms: int = 0) -> None:
        """One action on one process; :class:`CheckpointRefused` with the tool's reason."""


def parse_version(help_text: str) -> Optional[tuple[int, int]]:
    """``Version 570.86.10.`` in the tool's ``--help`` -> (570, 86); None when absent."""
    found = re.search(r"\bVersion (\d+)\.(\d+)", help_text)
    return (int(found.group(1)), int(found.group(2))) if found else None


class CliTool:
    """The real ``cuda-checkpoint`` binary, found on PATH or given; run as root."""

    def __init__(self, binary: str = "cuda-checkpoint") -> None:
        self.binary = shutil.which(binary) or ""
        self._why: Optional[str] = None
        self._checked = False

    def unusable(self) -> Optional[str]:
        if not self._checked:
            self._why, self._checked = self._check(), True
        return self._why

    def _check(self) -> Optional[str]:
        if not self.binary:
            return "cuda-checkpoint is not installed (it ships with the driver from 570)"
        try:
            text = self._run(["--help"]).stdout
        except CheckpointRefused as exc:
            return f"cuda-checkpoint --help failed: {exc}"
        version = parse_version(text)
        if version is None:
            return "cuda-checkpoint --help names no version: cannot tell it has a lock timeout"
        if version < MIN_VERSION:
            return (f"cuda-checkpoint {version[0]}.{version[1]} has no lock timeout (needs "
                    f"driver {MIN_VERSION[0]} or later)")
        return None

    def state(self, pid: int) -> CudaState:
        out = self._run(["--get-state", "--pid", str(int(pid))]).stdout.strip()
        try:
            return CudaState(out)
        except ValueError:
            raise CheckpointRefused(f"pid {pid}: unknown CUDA state {out[:80]!r}") from None

    def act(self, pid: int, action: Action, timeout_ms: int = 0) -> None:
        argv = ["--action", action.value, "--pid", str(int(pid))]
        if action is Action.LOCK and timeout_ms > 0:
            argv += ["--timeout", str(int(timeout_ms))]
        self._run(argv)

    def _run(self, argv: Sequence[str]) -> subprocess.CompletedProcess[str]:
        try:
            done = subprocess.run([self.binary, *argv], capture_output=True, text=True,
                                  timeout=CALL_TIMEOUT_S, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise CheckpointRefused(f"cuda-checkpoint {' '.join(argv)}: {exc}") from None
        if done.returncode != 0:
            why = (done.stderr or done.stdout).strip().splitlines()
            raise CheckpointRefused(
                f"cuda-checkpoint {' '.join(argv)}: {why[-1] if why else 'failed'} "
                f"(exit {done.returncode})")
        return done


class SimTool:
    """cuda-checkpoint played on the simulated node (:class:`slurmiso.gpu.sim.SimBackend`)."""

    def __init__(self, backend: SimCudaNode) -> None:
        self.backend = backend

    def unusable(self) -> Optional[str]:
        return None

    def state(self, pid: int) -> CudaState:
        return self.backend.cuda_state(pid)

    def act(self, pid: int, action: Action, timeout_ms: int = 0) -> None:
        self.backend.cuda_act(pid, action)


class SimCudaNode(Protocol):
    """What :class:`SimTool` needs of the simulated backend."""

    def cuda_state(self, pid: int) -> CudaState: ...

    def cuda_act(self, pid: int, action: Action) -> None: ...
