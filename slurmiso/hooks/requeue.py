"""The epilog's half of a preempted job's requeue (the wrapper's half: wrapper/requeue.py).

Run from inside the job's step, ``scontrol requeue`` kills the batch step (and the ``srun``
in it) before the step has ended; that step's slurmstepd then retries its task-exit message
to the dead srun for 2.3 s and the preempting job waits for it. So the prolog declares
``SLURMISO_EPILOG_REQUEUE=1``, the wrapper writes its request in the job's events file and
exits, the job ends as a bare one does, and the epilog (root) requeues it here. Slurm
requeues a COMPLETING batch job (it goes PENDING once the epilog is done), and the node's
release is not held up by it.

The request is user data (the events file): it can only ever requeue *this* job (the id is
Slurm's, never the file's), which the job's owner may do with ``scontrol requeue`` anyway,
and only for this attempt (``count`` must be the restart count plus one).
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Dict, Iterable, Optional, Sequence, Tuple

from slurmiso.jobfiles import BY_EPILOG, REQUEUE, REQUEUE_CLOSED
from slurmiso.slurm.jobenv import EPILOG_REQUEUE

log = logging.getLogger(__name__)

#: The environment variable the prolog sets to say this epilog honours the request.
ENV_FLAG = EPILOG_REQUEUE
TIMEOUT_S = 5.0
#: What squeue prints for a time Slurm never set (a job slurmctld has not preempted).
UNSET_TIMES = frozenset({"N/A", "None", "Unknown", "NOT_SET"})

Runner = Callable[[str, Sequence[str]], Any]


def requested(records: Iterable[Any], restart_count: Any) -> bool:
    """Whether the job's own events (``UserEvent``s) ask for this attempt to be requeued."""
    if isinstance(restart_count, bool) or not isinstance(restart_count, int):
        return False
    for rec in records:
        fields = getattr(rec, "fields", {})
        count = fields.get("count")
        if (
            getattr(rec, "event", "") == REQUEUE
            and fields.get("by") == BY_EPILOG
            and isinstance(count, int)
            and not isinstance(count, bool)
            and count == restart_count + 1
        ):
            return True
    return False


#: What ``requeue_job`` did: requeued, or found slurmctld had already requeued the job.
DONE, ALREADY = "done", "already-requeued"
#: scontrol's answer when the job is already back in the queue: Slurm 24.05+ requeues a job
#: preempted in its grace time itself once it ends (measured on 24.11.5: 6 of 6 epilog
#: requests met it). Not a failure: the wrapper's request is fulfilled.
_PENDING = "Job is pending execution"


def requeue_job(job_id: str, run: Optional[Runner] = None) -> Tuple[str, Optional[str]]:
    """``scontrol requeue JOB`` (bounded): (:data:`DONE` or :data:`ALREADY`, None), or
    ("failed", why) (never raises)."""
    from slurmiso.errors import SlurmError

    if not job_id.isdigit():
        return "failed", f"not a job id: {job_id!r}"
    if run is None:
        from slurmiso.slurm.client import SlurmCli

        cli = SlurmCli(timeout=TIMEOUT_S)

        def run(cmd: str, args: Sequence[str]) -> Any:
            return cli.run(cmd, args)

    try:
        run("scontrol", ["requeue", job_id])
    except SlurmError as exc:
        if _PENDING in str(exc):
            log.info("job %s: already requeued by slurmctld", job_id)
            return ALREADY, None
        return "failed", f"scontrol requeue {job_id} failed: {exc}"
    return DONE, None


def closed_claimed(records: Iterable[Any], restart_count: Any) -> bool:
    """Whether the job's own events say its program ended by itself in this attempt and the
    wrapper turned the job's Requeue off (``requeue-closed``, wrapper/supervisor.py).

    A claim only: the audit believes it once :func:`check_not_preempted` has asked slurmctld."""
    if isinstance(restart_count, bool) or not isinstance(restart_count, int):
        return False
    for rec in records:
        fields = getattr(rec, "fields", {})
        count = fields.get("restart_count")
        if (getattr(rec, "event", "") == REQUEUE_CLOSED and fields.get("ok") is True
                and type(count) is int and count == restart_count):
            return True
    return False


def check_not_preempted(job_id: str, facts: Optional[Callable[[str], Any]] = None
                        ) -> Optional[Dict[str, str]]:
    """The facts, as root learns them from slurmctld, that this attempt ended unpreempted:
    None unless slurmctld shows no preemption time for it and its Requeue off.

    Slurm 24.05+ names an attempt PREEMPTED when an *earlier* attempt was (its grace mark
    survives the requeue) although the program ended by itself. slurmctld clears a job's
    ``PreemptTime`` at each requeue (``batch_requeue_fini``) and sets it when it preempts, and
    keeps it until the epilogs are done: so during this epilog an unset ``PreemptTime`` means
    this attempt was not preempted. The job's user can set neither; the events file, which
    they can write, is never the evidence.
    """
    if facts is None:
        from slurmiso.slurm.client import SlurmCli

        cli = SlurmCli(timeout=TIMEOUT_S)

        def facts(job: str) -> Any:
            return cli.job_fields(job, ("PreemptTime", "StartTime", "RestartCnt", "Requeue"))

    from slurmiso.errors import SlurmError

    try:
        info = facts(job_id)
    except SlurmError as exc:
        log.info("job %s: slurmctld did not confirm an unpreempted end: %s", job_id, exc)
        return None
    if not info or info.get("PreemptTime") not in UNSET_TIMES or info.get("Requeue") != "0":
        return None
    return {"start": info.get("StartTime", ""), "restarts": info.get("RestartCnt", "")}
