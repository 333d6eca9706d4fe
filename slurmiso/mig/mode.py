"""What a MIG mode change takes on a GPU: a reset or not, and what holds the GPU now.

Hopper and later switch MIG mode on an idle GPU without a reset; Ampere (A100, A30) applies
it only at a GPU reset (``nvidia-smi -r``, or a reboot where a VM's hypervisor forbids
resets), which every process with the device open blocks. slurmiso never switches MIG mode
on real GPUs: ``mig apply``, its plan and doctor say which case applies and who must stop.
Pure: the architecture and the holders come from the backend and :mod:`slurmiso.gpu.holders`.
"""

from __future__ import annotations

from typing import List, Optional, Sequence

from slurmiso.gpu.backend import GpuProcess
from slurmiso.gpu.holders import Holder
from slurmiso.gpu.profiles import RESET_FOR_MIG_MODE


def needs_reset(architecture: str) -> Optional[bool]:
    """Whether a MIG mode change on this architecture takes a GPU reset (None: unknown)."""
    return RESET_FOR_MIG_MODE.get(architecture)


def how(gpu: int, architecture: str, enable: bool = True) -> str:
    """One line: the commands for switching MIG mode on ``gpu``, reset included if needed."""
    flag = "1" if enable else "0"
    reset = needs_reset(architecture)
    arch = architecture or "architecture unknown"
    if reset is False:
        return (f"GPU {gpu} ({arch}): MIG mode switches without a GPU reset on an idle GPU: "
                f"drain the node, 'nvidia-smi -i {gpu} -mig {flag}'")
    if reset is True:
        return (f"GPU {gpu} ({arch}): MIG mode takes effect only at a GPU reset: drain the node, "
                f"stop what holds the GPU, 'nvidia-smi -i {gpu} -mig {flag}', then "
                f"'nvidia-smi -i {gpu} -r' (a VM with the GPU passed through: reboot it)")
    return (f"GPU {gpu} ({arch}): drain the node, 'nvidia-smi -i {gpu} -mig {flag}'; if "
            f"nvidia-smi reports the change pending, reset the GPU ('nvidia-smi -i {gpu} -r')")


def holder_lines(gpu: int, holders: Sequence[Holder], processes: Sequence[GpuProcess],
                 unreadable: int = 0) -> List[str]:
    """Who holds ``gpu`` now: compute processes (NVML) and device-file holders (/proc)."""
    lines = []
    compute = {p.pid for p in processes if p.gpu_index == gpu}
    for p in processes:
        if p.gpu_index == gpu:
            lines.append(f"GPU {gpu}: compute process pid {p.pid} {p.name or '?'} "
                         f"({p.used_memory_mb} MiB): a job or service; let it end")
    lines += [f"GPU {gpu}: {h.describe()}" for h in holders if h.pid not in compute]
    if unreadable:
        lines.append(f"GPU {gpu}: {unreadable} process(es) could not be inspected "
                     "(run as root to see every holder)")
    return lines


def advice(gpu: int, architecture: str, holders: Sequence[Holder],
           processes: Sequence[GpuProcess], enable: bool = True, unreadable: int = 0
           ) -> List[str]:
    """Before a MIG mode change: how it is done here, then who holds the GPU."""
    held = holder_lines(gpu, holders, processes, unreadable)
    return [how(gpu, architecture, enable)] + (held or [f"GPU {gpu}: nothing holds it now"])
