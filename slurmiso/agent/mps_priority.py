"""A job's own MPS client priority on a shared server, watched: what its namespace cannot keep.

NVIDIA documents that a client's ``CUDA_MPS_CLIENT_PRIORITY`` wins over its namespace's
(docs/mps-v3.md), so a training job that exports ``CUDA_MPS_CLIENT_PRIORITY=0`` would compete
with inference at normal priority on the shared server. Root cannot forbid the variable; it
can see it. Each round the agent reads the environment each process of such a job started
with (``/proc/PID/environ``) and ends, with SIGKILL through a pidfd (no pid reuse), every
process that carries a priority other than the one its class was given, journaling
``mps-priority-refused`` with the job, the process and the value.

What it cannot see: a variable a program sets inside itself before CUDA starts (it is not
in the environment the process started with). The ladder, which acts on the inference
jobs' measured latency rather than on declared priority, stays the protection there.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
from typing import Any, Dict, List, Mapping, Optional, Tuple

from slurmiso.agent.node_journal import say

log = logging.getLogger(__name__)

EV_REFUSED = "mps-priority-refused"
VARIABLE = b"CUDA_MPS_CLIENT_PRIORITY="


def assigned(records: Mapping[str, Any]) -> Dict[str, Tuple[int, str]]:
    """Job -> (the priority its namespace holds, its SLUID or "") for the ready jobs on a
    shared MPS server whose priority is below normal (only they have a higher one to take)."""
    from slurmiso.isolation.mps_shared import namespace_of

    out: Dict[str, Tuple[int, str]] = {}
    for job, rec in records.items():
        if getattr(rec, "status", None) != "ready":
            continue
        for res in getattr(rec, "resources", ()) or ():
            prio = res.extra.get("priority") if res.kind == "mps" else None
            if namespace_of(res.extra) and prio == 1:
                sluid = str((getattr(rec, "fence", None) or {}).get("sluid") or "")
                out[str(job)] = (1, sluid)
    return out


#: What is read of a process's environment: all of it. Linux caps a new program's argv and
#: environment together at 3/4 of _STK_LIM (6 MiB) whatever the stack limit (fs/exec.c), so a
#: job cannot pad its environment past this to hide the variable from the watch.
MAX_ENVIRON_BYTES = 8 << 20


def started_with(pid: int, proc: str = "/proc") -> Optional[str]:
    """The priority variable process ``pid`` started with (None: not set, or unreadable)."""
    try:
        with open(f"{proc}/{pid}/environ", "rb") as fh:
            data = fh.read(MAX_ENVIRON_BYTES)
    except OSError:
        return None
    for entry in data.split(b"\0"):
        if entry.startswith(VARIABLE):
            return entry[len(VARIABLE):].decode("utf-8", "replace")[:40]
    return None


def priority_round(records: Mapping[str, Any], node: str, journal: Any = None,
                   proc: str = "/proc", now: float = 0.0) -> List[str]:
    """One pass over the node's processes; a line for each process ended."""
    jobs = assigned(records)
    if not jobs:
        return []
    from slurmiso.sluid import job_of_process

    by_id = {sluid or job: job for job, (_, sluid) in jobs.items()}
    by_id.update({job.split("_")[0]: job for job in jobs})
    lines: List[str] = []
    for name in os.listdir(proc):
        if not name.isdigit():
            continue
        pid = int(name)
        holder = job_of_process(pid, proc)
        job = by_id.get(holder or "")
        if job is None:
            continue
        value = started_with(pid, proc)
        want = jobs[job][0]
        if value is None or value.strip() == str(want):
            continue
        ended = _end(pid, proc, value)
        say(lines, journal, node, EV_REFUSED, job, now, ended,
            f"process {pid} started with CUDA_MPS_CLIENT_PRIORITY={value!r} above its "
            f"class's {want} (below normal) on a shared MPS server: "
            + ("ended" if ended else "gone before it could be ended"),
            pid=pid, value=value, priority=want)
    return lines


def _end(pid: int, proc: str, value: str) -> bool:
    """SIGKILL ``pid`` through a pidfd, once it still carries ``value``; whether it was sent."""
    try:
        fd = os.pidfd_open(pid)
    except (OSError, AttributeError):
        return False
    try:
        if started_with(pid, proc) != value:
            return False  # the pid now names another process
        signal.pidfd_send_signal(fd, signal.SIGKILL)
        return True
    except OSError as exc:
        log.warning("process %d: cannot end it: %s", pid, exc)
        return False
    finally:
        with contextlib.suppress(OSError):
            os.close(fd)
