"""Where each job's cgroup is on this node, as Slurm lays it out: never from anything a user wrote.

    >>> found = job_cgroups("tests/fixtures/host/slurm-v2", "n1")
    >>> sorted(found), found["4242"].v2
    (['4242', '4243'], 'tests/fixtures/host/slurm-v2/system.slice/n1_slurmstepd.scope/job_4242')

cgroup v2 (cgroup/v2 plugin, ``_set_int_cg_ns``): ``<root>/<slice>/<node>_slurmstepd.scope``
when several slurmd share a host, else ``<root>/<slice>/slurmstepd.scope``; in it each job is
``job_<id>``, or its SLUID on 26.05 (slurmiso/sluid.py), which only a record can turn into a job
id. cgroup v1 (task/cgroup, cgroup/v1): ``<root>/<controller>/slurm[_<node>]/uid_<U>/job_<id>``
per controller, a controller mounted alone (``memory``) or co-mounted (``cpu,cpuacct``).

Only directories at exactly those places count: a symlink, an odd name or a job found twice is
skipped (a job that appears under two uids is nobody's to read). The root is a parameter so
tests read recorded trees.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from typing import Any, Dict, Iterable, List, Mapping, Optional, Tuple

from slurmiso.host.cgroup_figures import CgroupVersion, V1Dirs, detect_version
from slurmiso.sluid import is_sluid, job_of_dir

#: The v1 controllers a job's figures come from (V1Dirs' fields).
V1_CONTROLLERS = ("cpu", "cpuacct", "memory", "blkio")
_MAX_ENTRIES = 65536  # a scope holds one directory per running job; more is not Slurm's


@dataclass(frozen=True)
class JobCgroup:
    """One job's cgroup: its v2 directory, or its directory per v1 controller; ``uid`` is the
    v1 ``uid_<U>`` Slurm filed it under (-1 on v2, which has none)."""

    version: CgroupVersion
    v2: Optional[str] = None
    v1: Optional[V1Dirs] = None
    uid: int = -1


def _is_real_dir(path: str) -> bool:
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False


def _entries(path: str) -> List[str]:
    try:
        names = os.listdir(path)
    except OSError:
        return []
    return sorted(names)[:_MAX_ENTRIES]


def v2_scopes(root: str, node: str = "") -> List[str]:
    """Slurm's stepd scopes under a v2 ``root``: ``<slice>/<node>_slurmstepd.scope`` if there
    is one, else ``<slice>/slurmstepd.scope``; real directories only."""
    mine, plain = [], []
    for sl in _entries(root):
        base = os.path.join(root, sl)
        if not sl.endswith(".slice") or not _is_real_dir(base):
            continue
        if node and _is_real_dir(os.path.join(base, f"{node}_slurmstepd.scope")):
            mine.append(os.path.join(base, f"{node}_slurmstepd.scope"))
        if _is_real_dir(os.path.join(base, "slurmstepd.scope")):
            plain.append(os.path.join(base, "slurmstepd.scope"))
    return mine or plain


def _job_dirs(parent: str) -> Dict[str, str]:
    """job key (id or SLUID) -> directory, for each real ``job_<id>``/SLUID directory."""
    out: Dict[str, str] = {}
    for name in _entries(parent):
        key = job_of_dir(name)
        path = os.path.join(parent, name)
        if key is not None and _is_real_dir(path):
            out[key] = path
    return out


def _v2(root: str, node: str, sluids: Dict[str, str]) -> Dict[str, JobCgroup]:
    out: Dict[str, JobCgroup] = {}
    twice: set[str] = set()
    for scope in v2_scopes(root, node):
        for key, path in _job_dirs(scope).items():
            job = sluids.get(key) if is_sluid(key) else key
            if job is None:
                continue  # a SLUID no record names: no job id to give it
            if job in out:
                twice.add(job)
            out[job] = JobCgroup(CgroupVersion.V2, v2=path)
    return {j: c for j, c in out.items() if j not in twice}


def _controller_dir(root: str, controller: str) -> Optional[str]:
    """The hierarchy holding ``controller``: mounted alone or co-mounted (``cpu,cpuacct``); a
    real directory first (distributions add ``cpu -> cpu,cpuacct`` links beside it)."""
    names = [n for n in _entries(root) if controller in n.split(",")]
    for n in names:
        if _is_real_dir(os.path.join(root, n)):
            return os.path.join(root, n)
    for n in names:
        if os.path.isdir(os.path.join(root, n)):  # the mount itself is root's
            return os.path.join(root, n)
    return None


def _v1(root: str, node: str) -> Dict[str, JobCgroup]:
    dirs: Dict[str, Dict[str, str]] = {}
    uids: Dict[str, set[int]] = {}
    for controller in V1_CONTROLLERS:
        top = _controller_dir(root, controller)
        if top is None:
            continue
        slurm = os.path.join(top, f"slurm_{node}") if node else ""
        if not (slurm and _is_real_dir(slurm)):
            slurm = os.path.join(top, "slurm")
        if not _is_real_dir(slurm):
            continue
        seen: set[str] = set()
        for name in _entries(slurm):
            uid_text = name[4:] if name.startswith("uid_") else ""
            path = os.path.join(slurm, name)
            if not (uid_text.isdigit() and len(uid_text) <= 10 and _is_real_dir(path)):
                continue
            for key, job_dir in _job_dirs(path).items():
                if is_sluid(key):
                    continue  # v1 names jobs job_<id> only
                if key in seen:
                    uids.setdefault(key, set()).add(-2)  # twice in one hierarchy
                seen.add(key)
                dirs.setdefault(key, {})[controller] = job_dir
                uids.setdefault(key, set()).add(int(uid_text))
    out: Dict[str, JobCgroup] = {}
    for job, per in dirs.items():
        if len(uids[job]) != 1:
            continue  # under two uids, or twice: not Slurm's layout
        out[job] = JobCgroup(CgroupVersion.V1, v1=V1Dirs(**per), uid=next(iter(uids[job])))
    return out


def job_cgroups(root: str = "/sys/fs/cgroup", node: str = "",
                sluids: Optional[Dict[str, str]] = None) -> Dict[str, JobCgroup]:
    """job id -> its cgroup, for every job Slurm made one for on ``node`` under ``root``.
    ``sluids`` (SLUID -> job id, from the records) names 26.05's SLUID directories; one it does
    not name is left out. Empty when the root is neither hierarchy."""
    version = detect_version(root)
    if version is CgroupVersion.V2:
        return _v2(root, node, sluids or {})
    if version is CgroupVersion.V1:
        return _v1(root, node)
    return {}


def ready_jobs_cgroups(records: Mapping[str, Any], classes: Iterable[str], root: str,
                       node: str) -> List[Tuple[str, Any, JobCgroup]]:
    """(job, record, cgroup) of each ready job of ``classes`` whose cgroup Slurm's layout
    shows under ``root``, in job order; a cgroup filed under another uid than the record's
    is not the job's, and left out. What the agent's per-job writers start from."""
    wanted = set(classes)
    jobs = {str(j): r for j, r in records.items()
            if getattr(r, "job_class", None) in wanted and getattr(r, "status", None) == "ready"}
    if not jobs:
        return []
    sluids = {str(r.fence.get("sluid")): str(j) for j, r in records.items()
              if is_sluid(str(getattr(r, "fence", {}).get("sluid") or ""))}
    found = job_cgroups(root, node, sluids)
    out = []
    for job in sorted(set(jobs) & set(found)):
        rec, cg = jobs[job], found[job]
        if min(cg.uid, rec.uid) < 0 or cg.uid == rec.uid:
            out.append((job, rec, cg))
    return out

