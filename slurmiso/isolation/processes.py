"""Which GPU processes belong to a job, and ending the ones a job left behind.

Ownership is decided by the kernel's view of the process, never by what the job says: the
job's cgroup (``job_<id>``, or on Slurm 26.05's cgroup/v2 the job's SLUID: its job cgroup is
``<scope>/s<13 base32 digits>/step_*``, unless ``CgroupJobIdPaths=yes``), else the
``SLURM_JOB_ID`` slurmstepd put in the process's initial environment (``/proc/PID/environ``,
readable only by root and the owner), *and* the job's uid. A process of another uid is never
killed by this job's epilog.
"""

from __future__ import annotations

import logging
import os
import time
from typing import TYPE_CHECKING, Callable, Iterable, List, Optional, Sequence

from slurmiso.gpu.backend import GpuProcess
from slurmiso.pids import pid_alive
from slurmiso.sluid import is_sluid, job_of_process

if TYPE_CHECKING:  # the protocols are costly to define; hooks only annotate with them
    from slurmiso.gpu.protocols import GpuBackend

log = logging.getLogger(__name__)


def job_of_pid(pid: int, proc: str = "/proc") -> Optional[str]:
    """The Slurm job a process belongs to, or None: the job id of a ``job_<id>`` cgroup, the
    SLUID of a 26.05 cgroup/v2 job cgroup (slurmiso/sluid.py reads both), else the initial
    environment's job id."""
    return job_of_process(pid, proc) or _environ_job(pid, proc)


def _environ_job(pid: int, proc: str) -> Optional[str]:
    try:
        with open(f"{proc}/{pid}/environ", "rb") as fh:
            for item in fh.read().split(b"\0"):
                if item.startswith(b"SLURM_JOB_ID="):
                    return item.split(b"=", 1)[1].decode("ascii", "replace")
    except OSError:
        pass
    return None


def uid_of_pid(pid: int, proc: str = "/proc") -> Optional[int]:
    try:
        return os.stat(f"{proc}/{pid}").st_uid
    except OSError:
        return None


def on_devices(
    procs: Iterable[GpuProcess], gpus: Sequence[int] = (), mig_uuids: Sequence[str] = ()
) -> List[GpuProcess]:
    """Processes on the given whole GPUs, or on the given MIG devices."""
    out = []
    for p in procs:
        if mig_uuids and p.mig_uuid:
            if p.mig_uuid in mig_uuids:
                out.append(p)
        elif p.gpu_index in gpus and (not mig_uuids or not p.mig_uuid):
            out.append(p)
    return out


def belongs_to(pid: int, job_id: str, sluid: str = "", proc: str = "/proc",
               strict: bool = False) -> bool:
    """Whether process ``pid`` is job ``job_id``'s (``sluid``: the job's SLUID, which Slurm
    26.05 exports to the Prolog and Epilog as ``SLURM_JOB_SLUID``). A SLUID cgroup is the job's
    only when it is ``sluid``; a caller that does not know the job's SLUID (an older Slurm's
    hook cannot meet one) falls back to the process's initial environment, as before, unless
    ``strict``: where "ours" would let a process share the job's GPU (the foreign-process
    check), what the process says of itself never counts, and an unknown SLUID is not ours."""
    key = job_of_pid(pid, proc)
    if key is None:
        return False
    base = job_id.split("_")[0]
    if key in (job_id, base):
        return True
    if is_sluid(key):
        if sluid or strict:
            return key == sluid
        return _environ_job(pid, proc) in (job_id, base)
    return False


def job_processes(
    procs: Iterable[GpuProcess], job_id: str, uid: int, proc: str = "/proc", sluid: str = ""
) -> List[GpuProcess]:
    """The processes of ``procs`` that belong to ``job_id`` and run as ``uid``."""
    return [
        p
        for p in procs
        if belongs_to(p.pid, job_id, sluid, proc) and (uid < 0 or uid_of_pid(p.pid, proc) == uid)
    ]


def foreign_processes(
    procs: Iterable[GpuProcess], job_id: str, proc: str = "/proc", sluid: str = ""
) -> List[GpuProcess]:
    """Processes that are not this job's (a leftover of another job, or a rogue user): a
    process in a SLUID cgroup that is not the job's known SLUID is foreign (fail closed)."""
    return [p for p in procs if not belongs_to(p.pid, job_id, sluid, proc, strict=True)]


def end_processes(
    pids: Sequence[int],
    grace_s: float = 5.0,
    alive: Callable[[int], bool] = pid_alive,
) -> List[int]:
    """SIGTERM, wait up to ``grace_s``, then SIGKILL; return the pids that were signalled."""
    if not pids:
        return []
    import signal  # its enum conversion costs ~2 ms per hook start; most epilogs kill nothing

    sent = []
    for pid in pids:
        try:
            os.kill(pid, signal.SIGTERM)
            sent.append(pid)
        except ProcessLookupError:
            continue
        except PermissionError:
            log.warning("not allowed to signal pid %d", pid)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(alive(p) for p in sent):
        time.sleep(0.05)
    for pid in sent:
        if alive(pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    deadline = time.monotonic() + 2.0
    while time.monotonic() < deadline and any(alive(p) for p in sent):
        time.sleep(0.02)
    return sent


def clean_job_devices(
    backend: GpuBackend,
    job_id: str,
    uid: int,
    gpus: Sequence[int] = (),
    mig_uuids: Sequence[str] = (),
    grace_s: float = 5.0,
    sluid: str = "",
) -> List[int]:
    """End the job's leftover processes on its devices; return the pids ended."""
    procs = on_devices(backend.processes(), gpus, mig_uuids)
    mine = job_processes(procs, job_id, uid, sluid=sluid)
    if not mine:
        return []
    pids = [p.pid for p in mine]
    log.info("job %s: ending leftover GPU processes %s", job_id, pids)
    return end_processes(pids, grace_s)
