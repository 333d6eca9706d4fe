"""Slurm 26.05's SLUID: the job identifier its cgroup/v2 plugin names a job's cgroup by.

From 26.05 a job also has a SLUID (src/common/sluid.c): 12 bits of cluster id, 42 of
milliseconds, 10 of sequence, printed by ``print_sluid`` as ``s`` and 13 digits of
Crockford's base32 in upper case (``s42DM918PDCP00``). cgroup/v2 names the job's directory by
it (``<slice>/<node>_slurmstepd.scope/<SLUID>/step_<s>/...``) unless cgroup.conf has
``CgroupJobIdPaths=yes`` (then ``job_<id>``, as before 26.05); the Prolog, Epilog and the job
see it as ``SLURM_JOB_SLUID``, ``scontrol show job -d`` as ``SLUID=``. Nothing in it gives
the job id back, so a SLUID path is matched against the SLUID Slurm gave the hook.
"""

from __future__ import annotations

from typing import Optional, Tuple

#: Crockford's base32 alphabet (no I, L, O, U), as print_sluid writes it.
ALPHABET = frozenset("0123456789ABCDEFGHJKMNPQRSTVWXYZ")
LENGTH = 14


def is_sluid(text: Optional[str]) -> bool:
    """Whether ``text`` is a SLUID as Slurm prints it."""
    return (bool(text) and len(text or "") == LENGTH and (text or "")[0] == "s"
            and all(c in ALPHABET for c in (text or "")[1:]))


def valid_sluid(text: Optional[str]) -> str:
    """``text`` if it is a SLUID, else "" (a hook environment's value, bounded)."""
    return text if text and is_sluid(text) else ""


def job_dir(job_id: str, sluid: str = "") -> str:
    """The name of a job's cgroup/v2 directory: the SLUID where Slurm gave one (26.05, and
    CgroupJobIdPaths is not set), else ``job_<id>``."""
    return sluid if is_sluid(sluid) else f"job_{job_id.split('_')[0]}"


def job_dir_names(job_id: str, sluid: str = "") -> Tuple[str, ...]:
    """Every name the job's cgroup directory can have: ``job_<id>``, and its SLUID if known
    (a 26.05 node with CgroupJobIdPaths=yes uses the former)."""
    base = f"job_{job_id.split('_')[0]}"
    return (base, sluid) if is_sluid(sluid) else (base,)
