"""The GPU backend protocols: a node's GPUs as inventory, MIG control and telemetry.

Code that needs one concern takes the narrow protocol; :func:`slurmiso.gpu.open_backend`
returns a :class:`GpuBackend`, which is all of them. Kept apart from
:mod:`slurmiso.gpu.backend` because defining ``typing.Protocol`` classes is slow, and the hooks
use them only in annotations (imported under ``TYPE_CHECKING``); ``backend`` re-exports them on
first use.
"""

from __future__ import annotations

from typing import List, Optional, Protocol, Tuple, TypeVar, runtime_checkable

from slurmiso.gpu.backend import Capabilities, DeviceInfo, GpuProcess, MigInstance, Telemetry
from slurmiso.gpu.profiles import MigProfile
from slurmiso.gpu.timeslice import TimesliceSetter

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
class GpuBackend(GpuInventory, MigControl, GpuTelemetry, TimesliceSetter, Protocol):
    """A node's GPUs: inventory, MIG and telemetry, what :func:`slurmiso.gpu.open_backend`
    returns. Code that needs one concern takes the narrow protocol."""
