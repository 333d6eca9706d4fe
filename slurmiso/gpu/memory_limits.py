"""Per-job GPU memory held by the driver: NVIDIA's memory partitioning per cgroup (issue 35,
item 2), behind a narrow protocol with NVML's and the simulated driver's implementations.

    >>> JobMemoryLimits.of(soft_mb=20480, hard_mb=40960).hard_bytes
    42949672960

What NVIDIA documents (docs/mps-v3.md, "Memory partitioning"; read, not run here): from
driver r615 (CUDA 13.4), on cgroup v2 and whole GPUs only (MIG handles are rejected), a
cgroup gets a hard limit per GPU (an allocation above it fails with out-of-memory) and a soft
limit (what it is guaranteed; above it a process may be evicted under real contention). The
driver keeps them in the kernel's ``dmem`` controller (``dmem.max`` / ``dmem.min``, kernel
6.14+) or, without it, in its own accounting; either way they are set through NVML
(``nvmlDeviceSetMemoryLimits_v1``: the cgroup's full path, soft and hard limits in bytes),
which also raises the ancestors' reservations: never by writing ``dmem.*`` files directly.
Clearing means soft 0 and hard ``NVML_DEVICE_MEMORY_LIMIT_MAX``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Protocol

#: ``NVML_DEVICE_MEMORY_LIMIT_MAX`` as nvidia-ml-py (13.615.71) defines it: no hard limit.
LIMIT_MAX = 0xFFFFFFFFFFFFFFFF
MIB = 1 << 20


@dataclass(frozen=True)
class JobMemoryLimits:
    """A cgroup's limits on one GPU, in bytes: ``soft`` guaranteed (0: none), ``hard`` never
    passed (:data:`LIMIT_MAX`: none); ``used`` as the driver counts it, when read."""

    soft_bytes: int = 0
    hard_bytes: int = LIMIT_MAX
    used_bytes: Optional[int] = None

    @classmethod
    def of(cls, soft_mb: int, hard_mb: int) -> JobMemoryLimits:
        """From MiB, 0 meaning none (as the config gives them)."""
        return cls(soft_mb * MIB, hard_mb * MIB if hard_mb else LIMIT_MAX)

    @property
    def none(self) -> bool:
        """Whether this says "no limit" (what clearing writes)."""
        return self.soft_bytes == 0 and self.hard_bytes == LIMIT_MAX

    def problem(self, total_bytes: int) -> str:
        """Why the driver would refuse these on a GPU of ``total_bytes`` (NVML's
        INVALID_ARGUMENT: soft above hard, or a limit above the GPU's memory), or ""."""
        hard = total_bytes if self.hard_bytes == LIMIT_MAX else self.hard_bytes
        if self.soft_bytes > hard:
            return f"soft limit {self.soft_bytes // MIB} MiB above hard {hard // MIB} MiB"
        if hard > total_bytes:
            return (f"hard limit {hard // MIB} MiB above the GPU's {total_bytes // MIB} MiB")
        return ""

    def same_limits(self, other: JobMemoryLimits) -> bool:
        return (self.soft_bytes, self.hard_bytes) == (other.soft_bytes, other.hard_bytes)

    def describe(self) -> str:
        hard = "none" if self.hard_bytes == LIMIT_MAX else f"{self.hard_bytes // MIB} MiB"
        return f"soft {self.soft_bytes // MIB} MiB, hard {hard}"


class MemoryLimitSetter(Protocol):
    """The driver's memory partitions: per (whole GPU, cgroup). Raises ``GpuNotSupported``
    where the driver, the GPU (MIG) or the cgroup cannot take them, ``GpuError`` else."""

    def set_memory_limits(self, index: int, cgroup: str, limits: JobMemoryLimits) -> None:
        """Set ``cgroup``'s (a full ``/sys/fs/cgroup/...`` path) limits on GPU ``index``."""

    def memory_limits(self, index: int, cgroup: str) -> JobMemoryLimits:
        """The limits in force (and memory used) for ``cgroup`` on GPU ``index``."""
