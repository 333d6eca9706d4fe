"""The one interface between slurmiso and GPUs: what a backend returns, and its protocols.

Hooks, wrapper, agent and monitor talk to a :class:`GpuBackend`; two implementations exist:
``nvml`` (pynvml, real hardware) and ``sim`` (a file-backed simulated node shared by separate
processes). Both raise only :mod:`slurmiso.errors` ``Gpu*`` errors, translated from NVML's codes
where the backend calls NVML, so callers can apply one failure policy.

The protocols themselves (:class:`GpuBackend` and its narrow parts) live in
:mod:`slurmiso.gpu.protocols` and are re-exported here on first use: a ``typing.Protocol``
costs milliseconds to define, and the hooks, which build a backend on every job start, only
ever name them in annotations. The value classes are :class:`~slurmiso.values.Value`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict, Optional

from slurmiso.errors import GpuError
from slurmiso.values import Value, as_dict, field

if TYPE_CHECKING:
    from slurmiso.gpu.protocols import GpuBackend as GpuBackend
    from slurmiso.gpu.protocols import GpuInventory as GpuInventory
    from slurmiso.gpu.protocols import GpuTelemetry as GpuTelemetry
    from slurmiso.gpu.protocols import MigControl as MigControl
    from slurmiso.gpu.protocols import MigModeSetter as MigModeSetter

#: Names this module re-exports from :mod:`slurmiso.gpu.protocols` when first asked for.
PROTOCOLS = ("GpuBackend", "GpuInventory", "GpuTelemetry", "MigControl", "MigModeSetter")


def __getattr__(name: str) -> Any:
    """The protocols, imported on first use (``isinstance(b, GpuBackend)``, not annotations)."""
    if name in PROTOCOLS:
        from slurmiso.gpu import protocols

        return getattr(protocols, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class DeviceInfo(Value, eq=True):
    """A physical GPU as the backend sees it now."""

    index: int
    uuid: str
    name: str  # product name, e.g. "NVIDIA H100 80GB HBM3"
    model: str  # slurmiso's canonical model name, e.g. "H100-80GB" ("" if unknown)
    minor: int  # /dev/nvidia<minor>
    pci_bus_id: str
    memory_total_mb: int
    memory_used_mb: int
    utilization_pct: Optional[int]  # GPU engine busy %; None when not reported (MIG mode)
    mig_enabled: bool
    mig_pending: bool
    #: "ampere", "hopper", "blackwell", ... ("" unknown): whether a MIG mode change needs a
    #: GPU reset depends on it (:mod:`slurmiso.mig.mode`).
    architecture: str = ""

    def to_dict(self) -> Dict[str, Any]:
        return as_dict(self)


class MigInstance(Value, eq=True):
    """A MIG GPU instance and, when created, its (single, full-size) compute instance.

    ``uuid`` is the MIG device UUID (``MIG-...``) that goes into ``CUDA_VISIBLE_DEVICES``; it
    exists only once a compute instance exists.
    """

    gpu_index: int
    gi_id: int
    profile: str
    placement_start: int
    placement_size: int
    ci_id: Optional[int] = None
    uuid: str = ""
    memory_total_mb: int = 0
    memory_used_mb: int = 0

    def to_dict(self) -> Dict[str, Any]:
        return as_dict(self)


class GpuProcess(Value, eq=True):
    """A process holding a GPU context (compute), with its memory on that GPU/MIG device.
    ``memory_known`` False: the driver would not say (NVML's "not available", e.g. a MIG
    device read without root), and ``used_memory_mb`` is 0 for a figure nobody measured.
    ``sm_util``: its share of the GPU's SM (3D/compute) time over the driver's recent samples,
    0..1 (NVML ``nvmlDeviceGetProcessUtilization``'s ``smUtil``); None: not measured (MIG
    devices, drivers without it)."""

    pid: int
    gpu_index: int
    used_memory_mb: int
    mig_uuid: str = ""
    name: str = ""
    memory_known: bool = True
    sm_util: Optional[float] = None

    def to_dict(self) -> Dict[str, Any]:
        return as_dict(self)


class Telemetry(Value, eq=True):
    """Per-GPU activity numbers the agent exports (0.0..1.0 ratios, as DCGM's PROF fields).
    ``sm_active`` None = not measured (no GPM/DCGM): unknown, never 0; ``sm_source`` says
    where it came from ("gpm", "dcgm"); ``gr_engine_active`` is graphics-engine busy time."""

    gpu_index: int
    sm_active: Optional[float] = None
    gr_engine_active: Optional[float] = None
    memory_used_mb: int = 0
    memory_total_mb: int = 0
    extra: Dict[str, float] = field(default_factory=dict)
    sm_source: str = ""
    sm_occupancy: Optional[float] = None


class Capabilities(Value, eq=True):
    """What a backend can do beyond its protocols, declared by the backend itself: callers
    read these flags and never probe for methods or compare backend names."""

    #: The backend can switch a GPU's MIG mode itself (simulated GPUs). On real GPUs that is
    #: an admin action on an idle GPU followed by a reset, so NVML declares False.
    set_mig_mode: bool = False
    #: The GPUs are simulated, so what runs beside them (MPS daemons) is simulated too.
    simulated: bool = False


def create_mig_device(
    backend: GpuBackend, index: int, profile: str, placement: Optional[int] = None
) -> MigInstance:
    """Create a GPU instance and its compute instance as one step.

    If the compute instance cannot be made the GPU instance is destroyed again, so a failure
    never leaves a half-configured GPU behind.
    """
    gi = backend.create_gpu_instance(index, profile, placement)
    try:
        return backend.create_compute_instance(index, gi.gi_id)
    except GpuError:
        backend.destroy_gpu_instance(index, gi.gi_id)
        raise


def destroy_mig_device(backend: GpuBackend, inst: MigInstance) -> None:
    """Destroy a MIG device's compute instance (if any) and then its GPU instance."""
    if inst.ci_id is not None:
        backend.destroy_compute_instance(inst.gpu_index, inst.gi_id, inst.ci_id)
    backend.destroy_gpu_instance(inst.gpu_index, inst.gi_id)
