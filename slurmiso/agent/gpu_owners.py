"""Which job holds which GPU or MIG instance: the records, and the processes really there.

Two sources, both root's: the hooks' records (what each job was given) and the GPU's compute
processes, each mapped to its job through its cgroup (``/proc/PID/cgroup``, read by
slurmiso/sluid.py, as the epilog reads it), which slurmstepd sets and the job cannot leave:
``.../job_<id>/step_<s>/...`` under cgroup v1 (freezer, devices, memory, cpuset) and v2
(``/system.slice/slurmstepd.scope/job_<id>/...``, or the job's SLUID on 26.05). The *first*
component that names a job counts, since a job with a delegated cgroup can make deeper ones
of any name. Never the process's environment: a process may claim any SLURM_JOB_ID.

A process of no job is ``job="" class="foreign"``; one whose job has no record on this node,
or whose uid is not its job's, is that job's with ``class="unrecorded"`` or foreign.
An MPS server (``nvidia-cuda-mps-server``) runs outside every job, as a child of the MPS
control daemon a record names: it is slurmiso's, not foreign, and not a job's, so it is left
out (its clients are the jobs' processes). MIG instances are attributed per instance (a
process on MIG device X is on X, never on "its GPU"), so two jobs on two instances of one GPU
are two rows.
"""

from __future__ import annotations

import os
from typing import Any, Callable, Dict, Iterable, NamedTuple, Optional, Set, Tuple

from slurmiso.exposition import job_series as sig
from slurmiso.sluid import is_sluid, job_of_cgroup, read_cgroup

#: (job, class, gpu, gi)
Row = Tuple[str, str, int, str]


def pid_uid(pid: int, proc: str = "/proc") -> Optional[int]:
    try:
        return os.stat(f"{proc}/{int(pid)}").st_uid
    except (OSError, ValueError):
        return None


def parent_pid(pid: int, proc: str = "/proc") -> Optional[int]:
    try:
        with open(f"{proc}/{int(pid)}/stat", "rb") as fh:
            stat = fh.read(4096)
        fields = stat[stat.rindex(b")") + 2:].split()  # the name may hold spaces and ")"
        return int(fields[1])
    except (OSError, ValueError, IndexError):
        return None


class _Owners:
    """Who owns each GPU process: its cgroup's job, checked against the records."""

    def __init__(self, records: Dict[str, Any], instances: Iterable[Any], proc: str,
                 cgroup: Optional[Callable[[int], Optional[str]]],
                 uid_of: Optional[Callable[[int], Optional[int]]],
                 parent_of: Optional[Callable[[int], Optional[int]]]) -> None:
        self.records = records
        self.read = cgroup or (lambda pid: read_cgroup(pid, proc))
        self.uid = uid_of or (lambda pid: pid_uid(pid, proc))
        self.parent = parent_of or (lambda pid: parent_pid(pid, proc))
        self.daemons = {r.daemon_pid for rec in records.values() for r in rec.resources
                        if r.kind == "mps" and r.daemon_pid}
        self.gi_of = {i.uuid: (i.gpu_index, str(i.gi_id)) for i in instances if i.uuid}
        self.sluids = {str(rec.fence.get("sluid")): str(job) for job, rec in records.items()
                       if is_sluid(str(getattr(rec, "fence", {}).get("sluid") or ""))}

    def of(self, p: Any) -> Optional[Row]:
        """The (job, class, gpu, gi) process ``p`` counts for; None for a recorded MPS
        daemon's server (slurmiso's, no job's)."""
        where = self.gi_of.get(p.mig_uuid) if p.mig_uuid else (p.gpu_index, "")
        if where is None:  # on a MIG device the backend does not list: its GPU, unplaced
            where = (p.gpu_index, "?")
        text = self.read(p.pid)
        owner = job_of_cgroup(text, self.sluids) if text is not None else None
        held = self.records.get(owner) if owner is not None else None
        if owner is None and self.daemons and self.parent(p.pid) in self.daemons:
            return None  # a recorded MPS daemon's server
        if owner is None:
            return ("", sig.CLASS_FOREIGN, *where)
        if held is None:
            return (owner, sig.CLASS_UNRECORDED, *where)
        if held.uid >= 0 and self.uid(p.pid) not in (held.uid, None):
            return ("", sig.CLASS_FOREIGN, *where)  # in the job's cgroup, not its user
        return (owner, held.job_class, *where)


class Attribution(NamedTuple):
    """Every (job, class, gpu, gi) row holding, and per row its processes' figures."""

    rows: Set[Row]
    #: MiB its processes use there; None: the driver would not say for one of them
    memory: Dict[Row, Optional[int]]
    #: their summed SM share 0..1; None: one process's share unknown (MIG, older drivers)
    sm: Dict[Row, Optional[float]]


def attribute_all(
    records: Dict[str, Any], processes: Iterable[Any], instances: Iterable[Any],
    proc: str = "/proc", cgroup: Optional[Callable[[int], Optional[str]]] = None,
    uid_of: Optional[Callable[[int], Optional[int]]] = None,
    parent_of: Optional[Callable[[int], Optional[int]]] = None,
) -> Attribution:
    """Every (job, class, gpu, gi) holding (the records' resources and the processes'), and
    the GPU memory (MiB) and SM share each row's processes use, summed per row: on a shared
    GPU the rows' sums add up to what the GPU's processes use, less a recorded MPS daemon's
    server. A row with a process whose figure the driver would not give is None for it
    (unknown, never a partial sum); a row of records alone, with no process, has no entry.

    ``processes``: the backend's GpuProcess (pid, gpu_index, used_memory_mb, mig_uuid,
    sm_util); ``instances``: its MigInstance (gpu_index, gi_id, uuid), to place a process on
    its instance.
    """
    owners = _Owners(records, instances, proc, cgroup, uid_of, parent_of)
    out: Set[Row] = set()
    for job, rec in records.items():
        for res in rec.resources:
            if res.gpu is None:
                continue
            if res.gi is not None:
                out.add((str(job), rec.job_class, res.gpu, str(res.gi)))
            elif res.uuid and res.uuid in owners.gi_of:
                out.add((str(job), rec.job_class, *owners.gi_of[res.uuid]))
            elif not res.is_mig:
                out.add((str(job), rec.job_class, res.gpu, ""))
    memory: Dict[Row, Optional[int]] = {}
    sm: Dict[Row, Optional[float]] = {}
    for p in processes:
        row = owners.of(p)
        if row is None:
            continue
        out.add(row)
        raw = getattr(p, "used_memory_mb", None)
        mb = int(raw) if raw is not None and getattr(p, "memory_known", True) else -1
        before = memory.get(row, 0)
        memory[row] = None if before is None or mb < 0 else before + mb
        share, so_far = getattr(p, "sm_util", None), sm.get(row, 0.0)
        sm[row] = None if so_far is None or share is None else so_far + float(share)
    return Attribution(out, memory, sm)


def attribute(
    records: Dict[str, Any], processes: Iterable[Any], instances: Iterable[Any],
    proc: str = "/proc", cgroup: Optional[Callable[[int], Optional[str]]] = None,
    uid_of: Optional[Callable[[int], Optional[int]]] = None,
    parent_of: Optional[Callable[[int], Optional[int]]] = None,
) -> Tuple[Set[Row], Dict[Row, Optional[int]]]:
    """:func:`attribute_all`'s rows and memory."""
    found = attribute_all(records, processes, instances, proc, cgroup, uid_of, parent_of)
    return found.rows, found.memory


def rows(
    records: Dict[str, Any], processes: Iterable[Any], instances: Iterable[Any],
    proc: str = "/proc", cgroup: Optional[Callable[[int], Optional[str]]] = None,
    uid_of: Optional[Callable[[int], Optional[int]]] = None,
    parent_of: Optional[Callable[[int], Optional[int]]] = None,
) -> Set[Row]:
    """Every (job, class, gpu, gi) holding: the records' resources and the processes'
    (:func:`attribute` without the memory)."""
    return attribute(records, processes, instances, proc, cgroup, uid_of, parent_of)[0]
