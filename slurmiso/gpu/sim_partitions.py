"""The simulated driver's memory partitions per cgroup, as NVIDIA documents them (see
:mod:`slurmiso.gpu.memory_limits`), over the sim's state: what :class:`SimBackend` answers
for ``nvmlDeviceSetMemoryLimits_v1`` / ``...Get...`` and how it holds allocations to them.

Modelled: whole GPUs only (a GPU in MIG mode refuses, as MIG handles are rejected); the cgroup
must be a directory that opens (NVML's OPERATING_SYSTEM otherwise); soft above hard, or a
limit above the GPU's memory, is INVALID_ARGUMENT; clearing (soft 0, hard max) removes the
entry; reading a cgroup with none is NOT_FOUND; an allocation that would take a cgroup (with
every process in it or below it) above its hard limit fails, as CUDA's out-of-memory does.
A node can be told its driver lacks the feature (``memory_partitioning: false``, a driver
older than r615). Not modelled: the soft limit's evictions under contention, and the
ancestors' reservations the driver keeps in ``dmem.min``.
"""

from __future__ import annotations

import os
from typing import Any, Dict, List

from slurmiso.errors import GpuError, GpuInsufficientResources, GpuNotFound, GpuNotSupported
from slurmiso.gpu.memory_limits import MIB, JobMemoryLimits

State = Dict[str, Any]


def check_settable(state: State, gpu: Dict[str, Any], cgroup: str) -> None:
    """Raise as NVML would where this GPU or cgroup cannot take a partition."""
    if not state.get("memory_partitioning", True):
        raise GpuNotSupported("memory partitioning: the driver has no such call "
                              "(NVML_ERROR_FUNCTION_NOT_FOUND: driver older than r615)")
    if gpu.get("mig_enabled"):
        raise GpuNotSupported(f"GPU {gpu['index']} is in MIG mode: memory partitions take "
                              "whole GPUs only (NVML_ERROR_NOT_SUPPORTED)")
    if not os.path.isabs(cgroup) or not os.path.isdir(cgroup):
        raise GpuError(f"cgroup path cannot be opened: {cgroup} (NVML_ERROR_OPERATING_SYSTEM)")


def set_limits(state: State, gpu: Dict[str, Any], cgroup: str, limits: JobMemoryLimits,
               total_mb: int) -> None:
    check_settable(state, gpu, cgroup)
    why = limits.problem(total_mb * MIB)
    if why:
        raise GpuError(f"memory limits for {cgroup}: {why} (NVML_ERROR_INVALID_ARGUMENT)")
    table = gpu.setdefault("memory_limits", {})
    if limits.none:
        table.pop(cgroup, None)
    else:
        table[cgroup] = [limits.soft_bytes, limits.hard_bytes]


def limits_of(state: State, gpu: Dict[str, Any], cgroup: str,
              procs: List[Dict[str, Any]]) -> JobMemoryLimits:
    check_settable(state, gpu, cgroup)
    entry = gpu.get("memory_limits", {}).get(cgroup)
    if entry is None:
        raise GpuNotFound(f"no memory limits for {cgroup} on GPU {gpu['index']} "
                          "(NVML_ERROR_NOT_FOUND)")
    used = sum(int(p["used_memory_mb"]) for p in procs if _within(p.get("cgroup", ""), cgroup))
    return JobMemoryLimits(int(entry[0]), int(entry[1]), used * MIB)


def refusal(gpu: Dict[str, Any], cgroup: str, pid: int, used_mb: int,
            procs: List[Dict[str, Any]]) -> None:
    """Raise CUDA's out-of-memory where ``pid`` holding ``used_mb`` on ``gpu`` would take a
    limited cgroup at or above ``cgroup`` past its hard limit (the others' memory counted)."""
    for limited, (_, hard) in gpu.get("memory_limits", {}).items():
        if not _within(cgroup, limited):
            continue
        others = sum(int(p["used_memory_mb"]) for p in procs
                     if p["pid"] != pid and _within(p.get("cgroup", ""), limited))
        if (others + used_mb) * MIB > int(hard):
            raise GpuInsufficientResources(
                f"out of memory (CUDA_ERROR_OUT_OF_MEMORY): pid {pid} asks {used_mb} MiB on "
                f"GPU {gpu['index']}, and {limited} holds {others} MiB of its hard limit "
                f"{int(hard) // MIB} MiB")


def _within(path: str, top: str) -> bool:
    return bool(path) and (path == top or path.startswith(top.rstrip("/") + "/"))
