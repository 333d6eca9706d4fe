"""The one interface between slurmiso and GPUs.

Hooks, wrapper, agent and monitor talk to a :class:`GpuBackend`; two implementations exist:
``nvml`` (pynvml, real hardware) and ``sim`` (a file-backed simulated node shared by separate
processes). Both raise only :mod:`slurmiso.errors` ``Gpu*`` errors, translated from NVML's codes
where the backend calls NVML, so callers can apply one failure policy.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Dict, List, Optional, Protocol, Tuple, TypeVar, runtime_checkable

from slurmiso.errors import GpuError
from slurmiso.gpu.profiles import MigProfile


@dataclass(frozen=True)
class DeviceInfo:
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

    def to_dict(self) -> Dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class MigInstance:
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
        return asdict(self)


@dataclass(frozen=True)
class GpuProcess:
    """A process holding a GPU context (compute), with its memory on that GPU/MIG device."""

    pid: int
    gpu_index: int
    used_memory_mb: int
    mig_uuid: str = ""
    name: str = ""

    def to_dict(self) -> Dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Telemetry:
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


@dataclass(frozen=True)
class Capabilities:
    """What a backend can do beyond its protocols, declared by the backend itself: callers
    read these flags and never probe for methods or compare backend names."""

    #: The backend can switch a GPU's MIG mode itself (simulated GPUs). On real GPUs that is
    #: an admin action on an idle GPU followed by a reset, so NVML declares False.
    set_mig_mode: bool = False
    #: The GPUs are simulated, so what runs beside them (MPS daemons) is simulated too.
    simulated: bool = False


_B = TypeVar("_B")


class GpuInventory(Protocol):
    """Which GPUs the node has and who uses them; a context manager that closes the session.

    Instances are cheap to create and must not touch hardware in ``__init__`` (hooks build one
    on every job start); the first method call connects. Index arguments are NVML indices.
    """

    name: str
    capabilities: Capabilities

    def devices(self) -> List[DeviceInfo]:
        """All GPUs of the node, by index."""

    def device(self, index: int) -> DeviceInfo:
        """One GPU; :class:`~slurmiso.errors.GpuNotFound` if there is none at ``index``."""

    def processes(self, index: Optional[int] = None) -> List[GpuProcess]:
        """Compute processes on one GPU (including its MIG devices), or on all."""

    def close(self) -> None:
        """Release the backend (NVML shutdown); idempotent."""

    def __enter__(self: _B) -> _B: ...

    def __exit__(self, *exc: object) -> None: ...


class MigControl(Protocol):
    """MIG instances: read, create and destroy (MIG mode itself is an admin action)."""

    def mig_mode(self, index: int) -> Tuple[bool, bool]:
        """(current, pending) MIG mode of a GPU."""

    def profiles(self, index: int) -> List[MigProfile]:
        """MIG GPU-instance profiles the GPU supports (empty if it has no MIG)."""

    def free_placements(self, index: int, profile: str) -> List[int]:
        """Start slices where ``profile`` could be created now."""

    def create_gpu_instance(
        self, index: int, profile: str, placement: Optional[int] = None
    ) -> MigInstance:
        """Create a GPU instance; NVML picks the placement when ``placement`` is None."""

    def create_compute_instance(self, index: int, gi_id: int) -> MigInstance:
        """Create the full-size compute instance of a GPU instance; returns it with its UUID."""

    def destroy_compute_instance(self, index: int, gi_id: int, ci_id: int) -> None:
        """Destroy a compute instance (:class:`GpuInUse` while processes use it)."""

    def destroy_gpu_instance(self, index: int, gi_id: int) -> None:
        """Destroy a GPU instance (:class:`GpuInUse` while it has compute instances)."""

    def instances(self, index: Optional[int] = None) -> List[MigInstance]:
        """MIG instances of one GPU, or of all GPUs."""


class MigModeSetter(Protocol):
    """Backends whose :class:`Capabilities` declare ``set_mig_mode``."""

    def set_mig_mode(self, index: int, enabled: bool) -> None:
        """Switch MIG mode of an idle GPU."""


class GpuTelemetry(Protocol):
    """Activity figures the agent exports."""

    def telemetry(self, index: int) -> Telemetry:
        """Activity figures for a GPU; a figure the driver does not give is None."""


@runtime_checkable
class GpuBackend(GpuInventory, MigControl, GpuTelemetry, Protocol):
    """A node's GPUs: inventory, MIG and telemetry, what :func:`slurmiso.gpu.open_backend`
    returns. Code that needs one concern takes the narrow protocol."""


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
