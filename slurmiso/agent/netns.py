"""Is a job listening in a network namespace of its own? Read through Slurm's cgroup for it.

The agent reads a job's ``--iso-metrics`` at 127.0.0.1 in the node's network namespace, and
checks the listener's owner there (:mod:`slurmiso.agent.port_owners`). A job whose container
has a network namespace of its own listens on that namespace's loopback, which the node's
does not reach, and whose sockets the node's ``/proc/net/tcp`` does not list: from the node,
nothing listens. Rather than a bare "unreachable", the agent names that cause when some of
the job's processes (found through the cgroup Slurm made for the job, never anything the job
wrote) are in another network namespace. Their latency stays unknown either way: the agent
does not enter a job's namespace to read a port there.
"""

from __future__ import annotations

import os
from typing import Iterable, List, Mapping, Optional, Set

from slurmiso.host.job_cgroups import JobCgroup, job_cgroups

#: Processes read per job: a job's first processes tell; a fork bomb costs no more.
MAX_PIDS = 4096
#: Nested cgroups walked per job (Slurm's step_*/user/task_* and a job's own).
MAX_DIRS = 256


def netns_of(pid: str, proc: str = "/proc") -> Optional[int]:
    """The network namespace (its inode) of process ``pid`` ("self" for the agent)."""
    try:
        return os.stat(os.path.join(proc, pid, "ns", "net")).st_ino
    except OSError:
        return None


def _walk_pids(top: str) -> List[str]:
    """The pids in ``top`` and the cgroups under it, bounded (a job makes its own cgroups)."""
    pids: List[str] = []
    for n, (path, dirs, _) in enumerate(os.walk(top)):
        dirs.sort()
        if n >= MAX_DIRS:
            break
        try:
            with open(os.path.join(path, "cgroup.procs"), encoding="ascii") as fh:
                pids += [p for p in fh.read().split() if p.isdigit()]
        except OSError:
            continue
        if len(pids) >= MAX_PIDS:
            break
    return pids[:MAX_PIDS]


def cgroup_pids(cg: JobCgroup) -> List[str]:
    """The processes in a job's cgroup and the cgroups under it (v1: its memory hierarchy)."""
    top = cg.v2 if cg.v2 is not None else (cg.v1.memory if cg.v1 is not None else None)
    return _walk_pids(top) if top else []


def elsewhere(jobs: Iterable[str], sluids: Mapping[str, str], node: str,
              cgroup_root: str = "/sys/fs/cgroup", proc: str = "/proc") -> Set[str]:
    """Those of ``jobs`` with a process in a network namespace other than the agent's."""
    own = netns_of("self", proc)
    wanted = set(jobs)
    if own is None or not wanted:
        return set()
    found = job_cgroups(cgroup_root, node, dict(sluids))
    out: Set[str] = set()
    for job in sorted(wanted & set(found)):
        if any(ns not in (None, own) for ns in (netns_of(p, proc)
                                                 for p in cgroup_pids(found[job]))):
            out.add(job)
    return out
