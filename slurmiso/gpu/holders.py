"""Who holds a node's NVIDIA device files: what must stop before a MIG mode change or a reset.

NVML lists compute processes only (the backend's ``processes``). A MIG mode change, and the
GPU reset Ampere needs for it, is refused as well while *anything* keeps the device open:
the persistence daemon, DCGM's host engine, a display server, slurmd gathering GPU energy,
an MPS daemon. Those are found here the way ``fuser /dev/nvidia*`` finds them: through each
process's open files under ``/proc/<pid>/fd``. The proc root is injected, so tests read a
recorded tree; as non-root, other users' processes cannot be read, and that count is kept.
"""

from __future__ import annotations

import os
from typing import Any, Dict, List, Optional, Sequence, Tuple

from slurmiso.values import Value, as_dict

#: Process names (``/proc/<pid>/comm``, 15 characters at most) of the usual holders, and
#: what to do about each before a MIG mode change (the MIG user guide stops nvsm and dcgm).
KNOWN_HOLDERS: Dict[str, str] = {
    "nvidia-persiste": "NVIDIA persistence daemon: 'systemctl stop nvidia-persistenced' "
    "for the reset, start it again after",
    "nv-hostengine": "DCGM host engine: 'systemctl stop nvidia-dcgm' (or dcgm), start it after",
    "dcgm-exporter": "DCGM exporter: stop it for the change",
    "dcgmi": "a DCGM command line: let it finish",
    "nvsm": "NVSM (DGX): 'systemctl stop nvsm'",
    "nvsm_core": "NVSM (DGX): 'systemctl stop nvsm'",
    "Xorg": "a display server on the GPU (display driver): stop the display manager",
    "Xwayland": "a display server on the GPU (display driver): stop the display manager",
    "gnome-shell": "a desktop session on the GPU: stop the display manager",
    "gdm": "the display manager: 'systemctl stop gdm'",
    "slurmd": "slurmd holding NVML (GPU accounting or energy gathering): set "
    "JobAcctGatherParams=DisableGPUAcct and an AcctGatherEnergyType other than gpu",
    "nvidia-cuda-mps": "an MPS daemon: 'echo quit | nvidia-cuda-mps-control' with its "
    "CUDA_MPS_PIPE_DIRECTORY (slurmiso's epilog stops its own)",
    "nvidia-smi": "another nvidia-smi: let it finish",
    "nvidia-device-p": "the Kubernetes device plugin: cordon the node, stop the plugin",
    "gpu-feature-dis": "Kubernetes GPU feature discovery: stop it for the change",
}


class Holder(Value, eq=True):
    """A process with NVIDIA device files open."""

    pid: int
    name: str
    devices: Tuple[str, ...]  # the device files it holds, e.g. ("/dev/nvidia0", ...)
    gpus: Tuple[int, ...]  # minors of /dev/nvidiaN among them
    advice: str = ""  # what to do about it, for a known holder

    def to_dict(self) -> Dict[str, Any]:
        return as_dict(self)

    def describe(self) -> str:
        what = self.advice or "stop it, or wait for it to end"
        held = ", ".join(os.path.basename(d) for d in self.devices)
        return f"pid {self.pid} {self.name or '?'} holds {held}: {what}"


class HolderScan(Value):
    holders: Tuple[Holder, ...]
    unreadable: int = 0  # processes whose open files could not be read (not root)


def known_advice(name: str) -> str:
    """What to do about a holder named ``name`` ("" for an unknown one)."""
    if name in KNOWN_HOLDERS:
        return KNOWN_HOLDERS[name]
    for prefix, advice in KNOWN_HOLDERS.items():
        if len(prefix) >= 6 and name.startswith(prefix):
            return advice
    return ""


def _gpu_minor(path: str, dev_root: str) -> Optional[int]:
    base = path[len(os.path.join(dev_root, "nvidia")):]
    return int(base) if base.isdigit() else None


def scan(proc_root: str = "/proc", dev_root: str = "/dev",
         exclude: Sequence[int] = ()) -> HolderScan:
    """Every process with an NVIDIA device file open (``exclude``: pids to leave out, such
    as this process, which holds NVML itself)."""
    prefix = os.path.join(dev_root, "nvidia")
    holders: List[Holder] = []
    unreadable = 0
    try:
        pids = sorted(int(p) for p in os.listdir(proc_root) if p.isdigit())
    except OSError:
        return HolderScan(())
    for pid in pids:
        if pid in exclude:
            continue
        fd_dir = os.path.join(proc_root, str(pid), "fd")
        try:
            fds = os.listdir(fd_dir)
        except PermissionError:
            unreadable += 1
            continue
        except OSError:  # gone meanwhile
            continue
        held = set()
        for fd in fds:
            try:
                target = os.readlink(os.path.join(fd_dir, fd))
            except OSError:
                continue
            if target.startswith(prefix):
                held.add(target)
        if not held:
            continue
        name = _comm(proc_root, pid)
        gpus = sorted(m for m in (_gpu_minor(d, dev_root) for d in held) if m is not None)
        holders.append(Holder(pid, name, tuple(sorted(held)), tuple(gpus), known_advice(name)))
    return HolderScan(tuple(holders), unreadable)


def _comm(proc_root: str, pid: int) -> str:
    try:
        with open(os.path.join(proc_root, str(pid), "comm"), encoding="utf-8",
                  errors="replace") as fh:
            return fh.read().strip()
    except OSError:
        return ""


def on_gpu(found: HolderScan, minor: int) -> List[Holder]:
    """Holders of GPU ``minor``: of /dev/nvidia<minor>, or of the control devices only
    (nvidiactl, nvidia-uvm, nvidia-caps), which keep every GPU from a reset."""
    return [h for h in found.holders if minor in h.gpus or not h.gpus]
