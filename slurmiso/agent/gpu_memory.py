"""Per-job GPU memory partitions at job start: each class's ``gpu_memory`` (hard limit and
guarantee per whole GPU) set on its jobs' cgroups through the driver (issue 35, item 2).

    >>> memory_round(cfg, "n1", records, backend, journal)               # doctest: +SKIP
    ['job 4242: gpu-memory: GPU 0: soft 0 MiB, hard none -> soft 20480 MiB, hard 40960 MiB']

Why the agent: the limit belongs to the job's cgroup, which Slurm makes after the Prolog and
whose TaskProlog runs as the user; the driver's call needs root. So the agent's restraint
watch sets it in its first round after the job starts, as it does the host quotas
(:mod:`slurmiso.agent.host_quota`), and again in any round that finds it changed. Only a job
whose record on this node names the class, only the cgroup Slurm's layout shows for it
(cgroup v2: the driver's partitions need it), only whole GPUs of the record (the driver
refuses MIG devices; ``check-config`` refuses a MIG class with ``gpu_memory``, and a MIG
device is skipped without a word, a cgroup v1 job is journaled once per job and GPU, as
refused). What is set is journaled (``gpu-memory``); a refusal (a driver before r615) is
journaled once per job and GPU. NVIDIA
documents that removing the cgroup clears its limits; the epilog does not wait for that.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Dict, List, Mapping, Optional, Set, Tuple

from slurmiso.agent.node_journal import say
from slurmiso.errors import GpuError, GpuNotFound, GpuNotSupported
from slurmiso.gpu.memory_limits import JobMemoryLimits, MemoryLimitSetter
from slurmiso.host.cgroup_figures import CgroupVersion
from slurmiso.host.job_cgroups import ready_jobs_cgroups

if TYPE_CHECKING:
    from slurmiso.config.model import Config, GpuMemoryShare

log = logging.getLogger(__name__)

#: The node journal's event for a partition set (or refused).
EV_GPU_MEMORY = "gpu-memory"
#: Resource kinds whose ``gpu`` is a whole GPU the job shares or holds.
WHOLE_GPU_KINDS = frozenset({"gpu", "shared-gpu", "mps"})
#: (job, GPU) refusals already journaled by this agent: said once, not every round.
_SAID: Set[Tuple[str, int]] = set()


def job_gpus(rec: Any) -> List[int]:
    """The whole GPUs (indices) the job's record holds on this node."""
    return sorted({int(res.gpu) for res in getattr(rec, "resources", ()) or ()
                   if res.kind in WHOLE_GPU_KINDS and res.gpu is not None})


def wanted(share: GpuMemoryShare, total_mb: int) -> JobMemoryLimits:
    """The class's share as limits on a GPU of ``total_mb``."""
    soft_mb, hard_mb = share.limits_mb(total_mb)
    return JobMemoryLimits.of(soft_mb, hard_mb)


def memory_round(cfg: Config, node: str, records: Mapping[str, Any], backend: Any,
                 journal: Any = None, cgroup_root: str = "/sys/fs/cgroup",
                 now: float = 0.0) -> List[str]:
    """One pass: every ready job of a class with ``gpu_memory`` gets its partition on each of
    its whole GPUs; one line per job written to, refused, or skipped for a reason."""
    shares: Dict[str, GpuMemoryShare] = {c.name: c.gpu_memory for c in cfg.classes
                                         if c.gpu_memory.any()}
    lines: List[str] = []
    for job, rec, cg in ready_jobs_cgroups(records, shares, cgroup_root, node):
        if cg.version is not CgroupVersion.V2 or not cg.v2:
            for gpu in job_gpus(rec):  # the driver partitions v2 cgroups only: said once
                _refused(lines, journal, node, job, rec.job_class, gpu,
                         "the job's cgroup is v1; NVIDIA's memory partitions need cgroup v2",
                         now)
            continue
        for gpu in job_gpus(rec):
            if not _set_one(lines, journal, node, job, rec.job_class, shares[rec.job_class],
                            backend, gpu, cg.v2, now):
                return lines  # the driver has no such call: no other job will fare better
    return lines


def _set_one(lines: List[str], journal: Any, node: str, job: str, job_class: str,
             share: GpuMemoryShare, backend: MemoryLimitSetter, gpu: int, cgroup: str,
             now: float) -> bool:
    """Bring one (job, GPU) to its class's partition; False where the driver lacks it."""
    try:
        want = wanted(share, int(backend.device(gpu).memory_total_mb))  # type: ignore[attr-defined]
        have = _current(backend, gpu, cgroup)
        if have is not None and have.same_limits(want):
            return True
        backend.set_memory_limits(gpu, cgroup, want)
    except GpuNotSupported as exc:
        _refused(lines, journal, node, job, job_class, gpu, str(exc), now)
        return "MIG" in str(exc)
    except GpuError as exc:  # tried again every round, said once
        _refused(lines, journal, node, job, job_class, gpu, f"{exc}; tried again each round",
                 now)
        return True
    before = have.describe() if have is not None else "none"
    say(lines, journal, node, EV_GPU_MEMORY, job, now, True,
        f"class {job_class}: GPU {gpu}: {before} -> {want.describe()}", gpu=gpu,
        cgroup=cgroup, soft=want.soft_bytes, hard=want.hard_bytes)
    return True


def _refused(lines: List[str], journal: Any, node: str, job: str, job_class: str, gpu: int,
             why: str, now: float) -> None:
    """Journal a (job, GPU) the driver refused, once per agent (not every round)."""
    if (job, gpu) in _SAID:
        return
    if len(_SAID) > 10_000:
        _SAID.clear()
    _SAID.add((job, gpu))
    say(lines, journal, node, EV_GPU_MEMORY, job, now, False,
        f"class {job_class}: GPU {gpu}: not set ({why})", gpu=gpu)


def _current(backend: MemoryLimitSetter, gpu: int, cgroup: str) -> Optional[JobMemoryLimits]:
    try:
        return backend.memory_limits(gpu, cgroup)
    except GpuNotFound:
        return None

