"""Whether a stopped job goes back to the queue, and who puts it there.

The decision is pure (:func:`decide`) and always carries a reason, including when it declines
(submitit's lesson: an unexplained "not requeued" costs users a day). The side effect,
``scontrol requeue``, goes through an injected Slurm client.

* Preemption: Slurm requeues a preempted job only if it is still running when the GraceTime
  ends (a job that exits earlier ends FAILED: seen on Slurm 22.05; from 24.05 it is requeued
  but counts towards MaxBatchRequeue, default 5, then held - Slurm's source), and until then
  the preemptor waits. So once the checkpoint is taken the wrapper runs
  ``scontrol requeue $SLURM_JOB_ID`` itself: the job is requeued and the GPUs are free at
  once. Not bounded by ``max_requeues``: a preemption is not the job's doing, and Slurm would
  requeue it anyway. ``scancel`` also starts with SIGTERM, and ``scontrol requeue`` would
  bring a cancelled job back, so the wrapper first asks Slurm for the job's state: only a job
  still RUNNING (preempted jobs stay RUNNING through the grace; cancelled ones are CANCELLED
  at once) is requeued. If ``scontrol requeue`` fails (a site that forbids it) the wrapper
  records why and waits for Slurm to end the job.
* Time-limit warning (``--signal``): nobody requeues unless the wrapper does; bounded by the
  class's ``max_requeues`` against ``SLURM_RESTART_COUNT``, and only after a checkpoint -
  requeuing without one would repeat the same work until the count runs out.

* The program ended by itself after a requeue: from Slurm 24.05 on, a job once signalled for
  a preemption GraceTime keeps that mark through ``scontrol requeue`` (slurmctld clears it
  only when it requeues a job itself), and the next attempt's batch completion - even exit 0
  - is taken for the preemption and requeued (sacct: PREEMPTED; seen on 24.11.5: a fourth
  restart that redid the steps after the last checkpoint). The wrapper then turns the job's
  ``Requeue`` off (:func:`close_requeue`) so the job ends with its program. Versions table
  key ``grace_preempt_sticky``.

Who runs ``scontrol requeue`` on preemption matters to the preempting job. Run by the wrapper
while its step is alive, the requeue kills the batch step first (bash dies on SIGTERM, and
slurmstepd then SIGKILLs the ``srun`` under it); when the wrapper exits a moment later, its
step's slurmstepd cannot deliver MESSAGE_TASK_EXIT to that srun and retries 5 times with
0.1+0.2+0.4+0.8+0.8 s back-off (``_send_srun_resp_msg``, Slurm 22.05 mgr.c) before the step
ends: the GPUs stay held 2.3 s longer (measured: infer start 3.2-4.7 s against 1.3 s). So
when slurmiso's prolog declares that its epilog requeues (``SLURMISO_EPILOG_REQUEUE=1``) and
the wrapper's events go to the file that epilog reads, the wrapper writes the request there
(``requeue`` with ``by: epilog``) and just exits: srun, the batch script and the job end as a
bare job does, and the epilog, as root, requeues the COMPLETING job (Slurm requeues
completing and finished batch jobs). The wrapper has already checked that the job is RUNNING
(not cancelled) by then.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Mapping, Optional, Protocol, Sequence, Tuple

from slurmiso.errors import SlurmError
from slurmiso.jobfiles import BY_EPILOG, BY_WRAPPER  # the epilog's half reads what we write
from slurmiso.wrapper.signals import PREEMPTED, TIME_LIMIT

log = logging.getLogger(__name__)

REQUEUE_TIMEOUT_S = 5.0
#: Job states that say the job is back in the queue already (``scontrol requeue`` by the
#: monitor or an admin sends the same SIGTERM a preemption does): not a cancellation.
REQUEUED_STATES = frozenset(("REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "PENDING"))
Version = Tuple[int, int, int]


class SlurmRunner(Protocol):
    """The part of :class:`slurmiso.slurm.client.SlurmCli` used here."""

    def run(self, cmd: str, args: Sequence[str], timeout: Optional[float] = None,
            env: Optional[Mapping[str, str]] = None) -> str: ...


@dataclass(frozen=True)
class Decision:
    requeue: bool
    reason: str
    by: str = ""  # BY_WRAPPER or BY_EPILOG when requeue is True (who runs scontrol requeue)
    count: int = 0  # the restart count the next run will have


def decide(
    cause: str,
    *,
    job_id: str,
    restart_count: int,
    max_requeues: int,
    checkpoint_ok: bool,
    program_status: Optional[int] = None,
    slurm_state: str = "",
    epilog: bool = False,
) -> Decision:
    """Requeue or not, with the reason either way.

    ``program_status`` is the program's exit status when it ended on its own before being
    asked to checkpoint (0 means it finished its work: nothing to requeue). ``slurm_state``
    is the job's state as slurmctld reports it ("" when unknown). ``epilog``: slurmiso's
    epilog will requeue a preempted job on the wrapper's request (see the module's note).
    """
    nxt = restart_count + 1
    if program_status == 0:
        return Decision(False, "the program finished (exit 0) before it was asked to checkpoint")
    if not job_id:
        return Decision(False, "not running under Slurm (no SLURM_JOB_ID): nothing to requeue")
    if cause == PREEMPTED:
        # SIGNALING is a running job slurmctld is sending SIGCONT/SIGSTOP (job_signal_id:
        # the flag is set only on a running job, for those two; preemption sends SIGCONT
        # first), printed instead of RUNNING while the signal agent works (measured on 26.05.5:
        # one preemption in three read it)
        if slurm_state in REQUEUED_STATES:
            return Decision(
                False,
                f"Slurm shows the job {slurm_state}: someone requeued it already (the "
                "monitor's ladder or re-layout, an admin); it starts again from its checkpoint",
            )
        if slurm_state == "COMPLETING":  # measured: the ladder's requeue reads so too
            return Decision(
                False,
                "Slurm shows the job COMPLETING: someone ended it (cancelled it, or "
                "requeued it: the monitor's ladder or re-layout, an admin), not a preemption "
                "(a preempted job stays RUNNING until its grace ends)",
            )
        if slurm_state and slurm_state not in ("RUNNING", "SIGNALING"):
            return Decision(
                False,
                f"Slurm shows the job {slurm_state}: it was cancelled, not preempted "
                "(a preempted job stays RUNNING until its grace ends)",
            )
        if epilog:
            return Decision(
                True,
                "preempted: the epilog requeues the job as soon as its steps have ended, so "
                "the preempting job need not wait out the grace",
                BY_EPILOG,
                nxt,
            )
        return Decision(
            True,
            "preempted: requeued now so the preempting job need not wait out the grace",
            BY_WRAPPER,
            nxt,
        )
    if cause != TIME_LIMIT:
        return Decision(False, f"stopped by {cause}: not a reason to requeue")
    if restart_count >= max_requeues:
        return Decision(
            False,
            f"restart count {restart_count} has reached the class's max_requeues "
            f"({max_requeues}); raise checkpoint.max_requeues or resubmit by hand",
        )
    if not checkpoint_ok:
        return Decision(
            False,
            "no checkpoint was taken before the time limit: a requeue would repeat the same "
            "work from the previous checkpoint",
        )
    return Decision(True, "time limit near: requeued after the checkpoint", BY_WRAPPER, nxt)


def slurm_job_state(client: SlurmRunner, job_id: str) -> str:
    """The job's state from slurmctld (``squeue -O State``), "" when it cannot be learnt in
    time. Through the hooks' own reader (:func:`slurmiso.slurm.client.job_fields`), never
    ``scontrol show job -o``: there a ``--comment "JobState=RUNNING"`` would read as the
    state (the job's user could only mislead their own wrapper, but nothing reads it so)."""
    from slurmiso.slurm.client import job_fields

    try:
        facts = job_fields(client.run, job_id, ("State",), timeout=REQUEUE_TIMEOUT_S)
    except SlurmError as exc:
        log.warning("cannot learn the job's state (%s); assuming it was preempted", exc)
        return ""
    return facts["State"] if facts else ""


def slurm_version(client: SlurmRunner, env: Mapping[str, str]) -> Optional[Version]:
    """``SLURM_VERSION`` from the job's environment, else ``scontrol --version``; None when
    neither answers in time."""
    from slurmiso.slurm import versions
    from slurmiso.slurm.client import parse_version

    found = versions.from_env(env)
    if found is not None:
        return found
    try:
        return parse_version(client.run("scontrol", ["--version"], REQUEUE_TIMEOUT_S))
    except SlurmError as exc:
        log.info("cannot learn Slurm's version (%s)", exc)
        return None


def needs_close(version: Optional[Version]) -> bool:
    """Whether a program's own end must turn the job's Requeue off (unknown: yes; a rerun of
    finished work costs more than a requeue flag turned off at the job's end)."""
    from slurmiso.slurm import versions  # at a program's end only: not on the start path

    return versions.has("grace_preempt_sticky", version) is not False


def close_requeue(client: SlurmRunner, job_id: str) -> Optional[str]:
    """``scontrol update JobId=JOB Requeue=0`` (a job's owner may); None on success, else
    why it failed."""
    try:
        client.run("scontrol", ["update", f"JobId={job_id}", "Requeue=0"], REQUEUE_TIMEOUT_S)
    except SlurmError as exc:
        return f"scontrol update JobId={job_id} Requeue=0 failed: {exc}"
    return None


def scontrol_requeue(client: SlurmRunner, job_id: str) -> Optional[str]:
    """Run ``scontrol requeue JOB``; None on success, else why it failed.

    Sites that forbid users ``scontrol requeue`` (or containers without ``scontrol``) show
    up here as a reason rather than a crash.
    """
    try:
        client.run("scontrol", ["requeue", job_id], REQUEUE_TIMEOUT_S)
    except SlurmError as exc:
        return f"scontrol requeue {job_id} failed: {exc}"
    return None
