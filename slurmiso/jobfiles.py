"""The contract between a job's wrapper and root's hooks: the files the wrapper writes in the
job's working directory, and what an events line may say.

The prolog names the files (``SLURMISO_EVENTS_FILE``, ``SLURMISO_STEPS_FILE``), the wrapper
(``slurmiso run``, as the job's user) writes them, the epilog folds the events into the
journal (hooks/events.py: every rule a reader keeps against hostile lines is there) and
removes the step file (hooks/stepfiles.py). Both sides import the names from here, so a
change to one side cannot leave the other reading a file or an event nobody writes.

A leaf: stdlib only, nothing else of slurmiso (the hooks import it on every job, the wrapper
at every start).
"""

from __future__ import annotations

import os
from typing import Optional

#: What the epilog reads of the events file; the wrapper warns when its file outgrows it.
MAX_BYTES = 1024 * 1024

#: A preempted or time-limited job's request to be requeued (wrapper/requeue.py decides,
#: hooks/requeue.py honours ``by`` :data:`BY_EPILOG` with ``count`` = restart count + 1).
REQUEUE = "requeue"
#: The program ended by itself and the wrapper turned the job's Requeue off
#: (``ok``, ``restart_count``; hooks/requeue.py ``closed_claimed``).
REQUEUE_CLOSED = "requeue-closed"
#: What ``slurmiso run`` reports (slurmiso/wrapper/supervisor.py); nothing else is folded.
USER_EVENTS = frozenset(
    {"checkpoint-start", "checkpoint-end", "preempt-signal", REQUEUE, "requeue-declined",
     REQUEUE_CLOSED, "resume", "throttle", "unthrottle"}
)
#: Fields the epilog sets itself: a job cannot speak for another job or another source.
RESERVED = frozenset({"ts", "host", "event", "source", "job", "job_ts", "node", "uid"})

#: ``by`` in a ``requeue`` event: who runs ``scontrol requeue``. The epilog acts on
#: :data:`BY_EPILOG` only; :data:`BY_WRAPPER` records that the wrapper already did.
BY_EPILOG = "epilog"
BY_WRAPPER = "slurmiso"


def events_path(work_dir: str, job_id: str) -> Optional[str]:
    """The job's events file in its working directory; None if Slurm gave no usable one."""
    if (
        not work_dir
        or len(work_dir) > 1024
        or not work_dir.startswith("/")
        or not work_dir.isprintable()
    ):
        return None
    return os.path.join(work_dir, f".slurmiso-events.{job_id}.jsonl")


def steps_path(work_dir: str, job_id: str) -> Optional[str]:
    """The job's step file beside its events file; None where there is no events file."""
    if events_path(work_dir, job_id) is None:
        return None
    return os.path.join(work_dir, f".slurmiso-steps.{job_id}.json")


def steps_report_path(steps_file: str) -> str:
    """The program's report beside the step file (``.slurmiso-steps.<job>.report.json``)."""
    base = steps_file[:-5] if steps_file.endswith(".json") else steps_file
    return base + ".report.json"
