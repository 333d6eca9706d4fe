"""GPU access: pick a :class:`~slurmiso.gpu.backend.GpuBackend` (NVML or simulated).

Implementations are imported lazily so that importing :mod:`slurmiso.gpu` (as every hook
does) neither loads ``pynvml`` nor touches the hardware.
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING

from slurmiso.errors import ConfigError, GpuUnavailable

if TYPE_CHECKING:
    from slurmiso.gpu.backend import GpuBackend

log = logging.getLogger(__name__)

BACKEND_KINDS = ("auto", "nvml", "sim")
ENV_BACKEND = "SLURMISO_GPU_BACKEND"
ENV_SIM_STATE = "SLURMISO_SIM_STATE"


def node_name(node: str = "") -> str:
    """This node's name as Slurm knows it: ``node``, else ``$SLURMD_NODENAME``, else the host."""
    if node or os.environ.get("SLURMD_NODENAME"):
        return node or os.environ["SLURMD_NODENAME"]
    import socket  # only off a Slurm node: the hooks always have SLURMD_NODENAME

    return socket.gethostname().split(".")[0]


def sim_state_path(sim_state: str = "", node: str = "") -> str:
    """The simulated node's state file: ``$SLURMISO_SIM_STATE`` or ``sim_state``, ``%n``
    replaced by the node name (several simulated nodes share one host in the sandbox)."""
    return expand_node(os.environ.get(ENV_SIM_STATE) or sim_state, node)


def expand_node(path: str, node: str = "") -> str:
    """``path`` with ``%n`` replaced by :func:`node_name` (as in slurm.conf's ``%n``)."""
    return path.replace("%n", node_name(node)) if "%n" in path else path


def open_backend(kind: str = "auto", sim_state: str = "", node: str = "") -> GpuBackend:
    """The node's GPU backend.

    ``$SLURMISO_GPU_BACKEND`` overrides ``kind`` and ``$SLURMISO_SIM_STATE`` overrides
    ``sim_state``. ``auto`` prefers NVML; it falls back to the simulated node only when NVML is
    unavailable *and* a sim state file exists, and says so loudly, because a production node
    silently running on simulated GPUs would be worse than failing.
    """
    kind = (os.environ.get(ENV_BACKEND) or kind or "auto").strip().lower()
    if kind not in BACKEND_KINDS:
        raise ConfigError(
            f"unknown GPU backend {kind!r}; allowed values: {', '.join(BACKEND_KINDS)}",
            hint=f"check gpu backend in the config or ${ENV_BACKEND}",
        )
    path = sim_state_path(sim_state, node)
    if kind == "sim":
        return _open_sim(path)
    if kind == "nvml":  # connects on first use, like every backend
        from slurmiso.gpu.nvml import NvmlBackend

        return NvmlBackend()
    try:
        return _open_nvml()
    except GpuUnavailable as err:
        if path and os.path.exists(path):
            log.warning(
                "NVML is unavailable (%s); using the simulated GPUs at %s", err.message, path
            )
            return _open_sim(path)
        where = f" and no simulated node exists at {path}" if path else ""
        raise GpuUnavailable(
            f"no GPU backend: NVML is unavailable ({err.message}){where}",
            hint="on a GPU node install/load the NVIDIA driver; for tests create a simulated "
            f"node with 'slurmiso sim init' and set ${ENV_SIM_STATE}",
        ) from err


def _open_sim(path: str) -> GpuBackend:
    if not path:
        raise ConfigError(
            "the sim GPU backend needs a state file",
            hint=f"set ${ENV_SIM_STATE} or pass --state PATH",
        )
    from slurmiso.gpu.sim import SimBackend

    return SimBackend(path)


def _open_nvml() -> GpuBackend:
    """An initialised NVML backend; :class:`GpuUnavailable` when there is no usable driver."""
    from slurmiso.gpu.nvml import NvmlBackend

    backend = NvmlBackend()
    backend.connect()
    return backend
