"""A probe run's host figures: the CPU its command used, and the share of the run's time some
task stalled on CPU, memory and IO (pressure stall information), so the probe reports where
contention is on the host as well as on the GPU, alone against beside training (issue 36).

    >>> before = snapshot(job_cgroup(open("/proc/self/cgroup").read()))   # doctest: +SKIP
    >>> ... the run ...
    >>> figures(before, snapshot(...), seconds=42.0, cpu_s=38.5)         # doctest: +SKIP
    {'scope': 'job', 'cpu_cores': 0.917, 'stall': {'cpu': 0.012, ...}, 'memory_peak_mb': 812.0}

Where the run is in a Slurm job on cgroup v2, the figures are the job's own cgroup's (scope
``job``): the solo and mixed runs are separate jobs, so each figure is that job's alone. Elsewhere
(cgroup v1, which has no per-cgroup PSI, or ``--local`` runs in no job) the stall shares are the
node's (``/proc/pressure``, scope ``node``) and say so; a kernel without PSI gives none. The CPU
used is the command's own everywhere (the runner's reaped children, ``getrusage``).
"""

from __future__ import annotations

import os
import resource
from typing import Any, Dict, Optional

from slurmiso.host.kernel_text import parse_psi, parse_single, read_text

RESOURCES = ("cpu", "memory", "io")
CGROUP_ROOT = "/sys/fs/cgroup"
NODE_PRESSURE = "/proc/pressure"


def job_cgroup(proc_cgroup: str, root: str = CGROUP_ROOT) -> Optional[str]:
    """The v2 directory of the Slurm job this process runs in: its nearest ancestor named
    as Slurm's cgroup/v2 names a job (``job_<id>``, or the job's SLUID from 26.05), or None
    (cgroup v1, or not in a job)."""
    from slurmiso.sluid import job_of_dir

    for line in proc_cgroup.splitlines():
        if not line.startswith("0::"):
            continue
        parts = line[3:].strip().split("/")
        jobs = [i for i, p in enumerate(parts) if i and job_of_dir(p) is not None]
        if jobs and ".." not in parts:
            path = os.path.join(root, *parts[1:jobs[-1] + 1])
            return path if os.path.isdir(path) else None
    return None


def own_job_cgroup() -> Optional[str]:
    text = read_text("/proc/self/cgroup")
    return job_cgroup(text) if text else None


def snapshot(cgroup: Optional[str], node_pressure: str = NODE_PRESSURE) -> Dict[str, Any]:
    """Stall totals (µs, the ``some`` line) per resource, from the job's cgroup where it has
    them, else the node's; and the job's memory peak (job scope only)."""
    scope, where = "job", cgroup
    if cgroup is None or parse_psi(read_text(os.path.join(cgroup, "cpu.pressure"))) is None:
        scope, where = "node", None
    stall: Dict[str, Optional[int]] = {}
    for res in RESOURCES:
        path = (os.path.join(where, f"{res}.pressure") if where
                else os.path.join(node_pressure, res))
        psi = parse_psi(read_text(path))
        stall[res] = psi.some.total_usec if psi is not None else None
    peak = parse_single(read_text(os.path.join(where, "memory.peak"))) if where else None
    return {"scope": scope if any(v is not None for v in stall.values()) else None,
            "stall_us": stall, "peak_bytes": peak}


def children_cpu_s() -> float:
    """CPU seconds (user and system) of the reaped children so far."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def figures(before: Dict[str, Any], after: Dict[str, Any], seconds: float,
            cpu_s: Optional[float]) -> Dict[str, Any]:
    """The run's figures: cores used on average, and per resource the share of the run some
    task stalled (None where a total was missing either side, or went backwards)."""
    stall: Dict[str, Optional[float]] = {}
    for res in RESOURCES:
        a, b = (before.get("stall_us") or {}).get(res), (after.get("stall_us") or {}).get(res)
        stall[res] = (round((b - a) / 1e6 / seconds, 4)
                      if a is not None and b is not None and b >= a and seconds > 0 else None)
    scope = after.get("scope") if after.get("scope") == before.get("scope") else None
    peak = after.get("peak_bytes")
    return {"scope": scope,
            "cpu_cores": round(cpu_s / seconds, 3) if cpu_s is not None and seconds > 0
            else None,
            "stall": stall if scope else {res: None for res in RESOURCES},
            "memory_peak_mb": round(peak / 2**20, 1) if scope == "job" and peak else None}
