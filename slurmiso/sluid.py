"""Slurm 26.05's SLUID: the job identifier its cgroup/v2 plugin names a job's cgroup by.

From 26.05 a job also has a SLUID (src/common/sluid.c): 12 bits of cluster id, 42 of
milliseconds, 10 of sequence, printed by ``print_sluid`` as ``s`` and 13 digits of
Crockford's base32 in upper case (``s42DM918PDCP00``). cgroup/v2 names the job's directory by
it (``<slice>/<node>_slurmstepd.scope/<SLUID>/step_<s>/...``) unless cgroup.conf has
``CgroupJobIdPaths=yes`` (then ``job_<id>``, as before 26.05); the Prolog, Epilog and the job
see it as ``SLURM_JOB_SLUID``, ``scontrol show job -d`` as ``SLUID=``. Nothing in it gives
the job id back, so a SLUID path is matched against the SLUID Slurm gave the hook.

Which job a process's cgroup (``/proc/PID/cgroup``) puts it in is read here too, once, for the
epilog's process checks (isolation/processes.py) and the monitor's GPU owners
(agent/gpu_owners.py): ``job_<id>`` under cgroup v1 (``slurm_<node>/uid_<u>/job_<id>``) and
v2 up to 25.11, the SLUID on 26.05's v2. Stdlib only, nothing else of slurmiso: the hooks
import it on every job.
"""

from __future__ import annotations

import re
from typing import Dict, Optional

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


_JOB_DIR = re.compile(r"job_([0-9]{1,12})")
#: Controllers that follow the job's processes, in order of trust (v2's line has none).
_PREFERRED = ("freezer", "devices", "memory", "cpuset", "")
#: What is read of a /proc/PID/cgroup (a v1 host lists a line per hierarchy, about a dozen).
MAX_CGROUP_BYTES = 16384
MAX_CGROUP_LINES = 64


def job_of_dir(name: str) -> Optional[str]:
    """The job a cgroup directory name stands for: the id of ``job_<id>``, a SLUID as it is,
    else None."""
    m = _JOB_DIR.fullmatch(name)
    if m:
        return m.group(1)
    return name if is_sluid(name) else None


def job_of_cgroup(text: str, sluids: Optional[Dict[str, str]] = None) -> Optional[str]:
    """The job a ``/proc/PID/cgroup`` text puts its process in: its job id, or the SLUID of
    its 26.05 cgroup/v2 job directory; None outside every job's cgroup.

    In each line the *first* component that names a job counts: a job with a delegated
    cgroup can make deeper ones of any name. Among the lines, the controllers that follow the
    job's processes win, in :data:`_PREFERRED` order. ``sluids`` (SLUID -> job id, from the
    records): SLUIDs are given back as job ids, and one it does not name is no job's."""
    by_controller: Dict[str, str] = {}
    for line in text.splitlines()[:MAX_CGROUP_LINES]:
        _hid, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        key = next((k for k in map(job_of_dir, path.split("/")) if k is not None), None)
        if key is not None and sluids is not None and is_sluid(key):
            key = sluids.get(key)
        if key is None:
            continue
        for c in controllers.split(",") if controllers else [""]:
            by_controller.setdefault(c.replace("name=", ""), key)
    for c in _PREFERRED:
        if c in by_controller:
            return by_controller[c]
    return next(iter(by_controller.values()), None)


def read_cgroup(pid: int, proc: str = "/proc") -> Optional[str]:
    """``/proc/PID/cgroup`` (up to :data:`MAX_CGROUP_BYTES`); None when it cannot be read."""
    try:
        with open(f"{proc}/{int(pid)}/cgroup", "rb") as fh:
            return fh.read(MAX_CGROUP_BYTES).decode("utf-8", "replace")
    except (OSError, ValueError):
        return None


def job_of_process(pid: int, proc: str = "/proc") -> Optional[str]:
    """The job whose cgroup holds process ``pid`` (its id, or its SLUID), from the kernel's
    ``/proc/PID/cgroup`` alone; None outside every job's cgroup or when unreadable."""
    text = read_cgroup(pid, proc)
    return None if text is None else job_of_cgroup(text)
