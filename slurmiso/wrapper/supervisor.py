"""The wrapper's main loop: run the program, and on a stop signal checkpoint, end, requeue.

    start:   resume env (last good checkpoint) + isolation env -> program in its own group
    running: forward INT/HUP/QUIT; record checkpoints the program reports on its own
    stop:    (SIGTERM = preempted | --signal = time limit near; the first one only)
             journal preempt-signal -> checkpoint signal to the group -> wait for the marker
             or the program's exit, up to grace minus a margin -> let it exit briefly, else
             SIGKILL -> requeue decision (with its reason) -> scontrol requeue -> exit 143

The margin leaves time, before Slurm's SIGKILL at the end of GraceTime, for the kill, the
journal lines and ``scontrol requeue``. Exit statuses pass through unless the wrapper stopped
the program; then it exits 143 (128+SIGTERM), so a stopped run never looks finished.
"""

from __future__ import annotations

import logging
import signal
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, Mapping, Optional, Sequence, Tuple

from slurmiso.wrapper import requeue
from slurmiso.wrapper.checkpoint_protocol import MarkerWatcher, Report, verify
from slurmiso.wrapper.child import Child
from slurmiso.wrapper.resume import CheckpointStore, resume_env
from slurmiso.wrapper.signals import PREEMPTED, TIME_LIMIT, JobEnvironment, SignalHandler

log = logging.getLogger(__name__)

EXIT_STOPPED = 128 + int(signal.SIGTERM)
#: How often the marker is looked at while the program runs / while a checkpoint is awaited.
POLL_RUNNING_S = 0.5
POLL_CHECKPOINT_S = 0.05


@dataclass(frozen=True)
class Settings:
    ckpt_dir: str
    ckpt_signal: signal.Signals = signal.SIGUSR2
    warn_signal: signal.Signals = signal.SIGUSR1
    grace_s: float = 120.0
    max_requeues: int = 20
    rank: int = 0  # the task (SLURM_PROCID) that checkpoints; others wait for its marker
    exit_window_s: float = 5.0  # after the report, how long the program may take to exit

    @property
    def margin_s(self) -> float:
        """Kept back from the grace: 10% of it, between 1 and 10 seconds."""
        return min(10.0, max(1.0, 0.1 * self.grace_s))

    @property
    def budget_s(self) -> float:
        return max(0.5, self.grace_s - self.margin_s)


class Events:
    """The job's journal, if it has one. A journal that cannot be written never stops a job."""

    def __init__(self, journal: Any = None) -> None:
        self.journal = journal
        self._failed = False

    def emit(self, event: str, **fields: Any) -> None:
        if self.journal is None:
            return
        try:
            self.journal.append(event, **fields)
        except OSError as exc:
            if not self._failed:
                log.warning("cannot write the job's events file %s: %s", self.journal.path, exc)
            self._failed = True


class Supervisor:
    def __init__(
        self,
        argv: Sequence[str],
        settings: Settings,
        job: JobEnvironment,
        base_env: Mapping[str, str],
        isolation_env: Optional[Mapping[str, str]] = None,
        events: Optional[Events] = None,
        slurm: Optional[Callable[[], requeue.SlurmRunner]] = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.argv = list(argv)
        self.settings = settings
        self.job = job
        self.base_env = dict(base_env)
        self.isolation_env = dict(isolation_env or {})
        self.events = events or Events()
        self.slurm = slurm or _default_slurm
        self.clock = clock
        self.store = CheckpointStore(settings.ckpt_dir)
        self.designated = job.procid == settings.rank

    # -- start and run ----------------------------------------------------------------------

    def run(self) -> int:
        self.store.ensure()
        latest = self.store.read()
        env: Dict[str, str] = dict(self.base_env)
        env.update(self.isolation_env)
        env.update(
            resume_env(
                self.store,
                latest,
                self.job.restart_count,
                self.settings.ckpt_signal.name[3:],
                self.settings.rank,
            )
        )
        if self.designated and (self.job.restart_count > 0 or latest is not None):
            self.events.emit(
                "resume",
                job=self.job.job_id,
                restart_count=self.job.restart_count,
                checkpoint=latest.path if latest else None,
                step=latest.step if latest else None,
            )
            log.info(
                "restart %d: resuming from %s",
                self.job.restart_count,
                latest.path if latest else "nothing (no checkpoint yet)",
            )
        watcher = MarkerWatcher(self.store.marker, latest.ident if latest else None)
        stop = {int(signal.SIGTERM): PREEMPTED, int(self.settings.warn_signal): TIME_LIMIT}
        with SignalHandler(self.job, stop) as handler:
            # The program sees Slurm's SIGTERM and --signal too (Slurm signals every process
            # of a step): it starts with them ignored; only the checkpoint signal reaches it.
            ignore = {int(signal.SIGTERM), int(self.settings.warn_signal)}
            ignore.discard(int(self.settings.ckpt_signal))
            child = Child.start(self.argv, env, ignore=sorted(ignore))
            try:
                return self._loop(child, handler, watcher)
            finally:
                if child.poll() is None:  # an exception in the loop: never leave it running
                    child.kill()

    def _loop(self, child: Child, handler: SignalHandler, watcher: MarkerWatcher) -> int:
        while True:
            handler.wait(POLL_RUNNING_S)
            self._forward(child, handler)
            if self.designated:
                self._take_report(watcher, requested=False)
            if handler.stop_cause is not None:
                return self._stop(child, handler, watcher)
            status = child.poll()
            if status is not None:
                if self.designated:
                    self._take_report(watcher, requested=False)
                return status

    @staticmethod
    def _forward(child: Child, handler: SignalHandler) -> None:
        for signum in handler.take_forward():
            child.signal_group(signum)

    # -- checkpoints --------------------------------------------------------------------------

    def _take_report(
        self, watcher: MarkerWatcher, requested: bool
    ) -> Optional[Tuple[bool, Report, int, str]]:
        """Record a new report if there is one: (ok, report, bytes, reason) or None."""
        report = watcher.poll()
        if report is None:
            return None
        ok, size, reason = verify(report)
        if ok:
            self.store.record(report, size, self.job.restart_count)
            log.info("checkpoint recorded: %s (%d bytes)", report.path, size)
        else:
            log.warning("checkpoint not recorded: %s", reason)
        if not requested:  # a checkpoint the program took on its own schedule
            self.events.emit(
                "checkpoint-end",
                job=self.job.job_id,
                ok=ok,
                path=report.path,
                bytes=size,
                step=report.step,
                requested=False,
                **({"reason": reason} if reason else {}),
            )
        return ok, report, size, reason

    def _await(
        self, child: Child, handler: SignalHandler, watcher: MarkerWatcher, deadline: float
    ) -> Tuple[bool, Optional[Report], int, str]:
        """Wait for the program's report (designated rank) or its exit, until ``deadline``."""
        while True:
            self._forward(child, handler)
            got = self._observe(watcher)
            if got is not None:
                return got
            status = child.poll()
            if status is not None:
                got = self._observe(watcher)  # it may have reported just before exiting
                if got is not None:
                    return got
                why = f"the program exited (status {status}) without reporting a checkpoint"
                return False, None, 0, why
            left = deadline - self.clock()
            if left <= 0:
                s = self.settings
                why = (
                    f"the program did not report a checkpoint within {s.budget_s:g}s "
                    f"(grace {s.grace_s:g}s less a {s.margin_s:g}s margin); it was killed"
                )
                return False, None, 0, why
            handler.wait(min(POLL_CHECKPOINT_S, left))

    def _observe(self, watcher: MarkerWatcher) -> Optional[Tuple[bool, Optional[Report], int, str]]:
        if self.designated:
            return self._take_report(watcher, requested=True)
        report = watcher.poll()  # other ranks only wait for the designated rank's report
        return None if report is None else (True, report, 0, "")

    # -- stop ---------------------------------------------------------------------------------

    def _stop(self, child: Child, handler: SignalHandler, watcher: MarkerWatcher) -> int:
        s = self.settings
        cause = handler.stop_cause or PREEMPTED
        signame = signal.Signals(handler.stop_signum or signal.SIGTERM).name
        started = self.clock()
        deadline = started + s.budget_s
        self.events.emit(
            "preempt-signal",
            job=self.job.job_id,
            signal=signame[3:],
            cause=cause,
            restart_count=self.job.restart_count,
        )
        log.info("%s received (%s): asking the program to checkpoint", signame, cause)
        early = child.poll()
        if early is not None:  # it ended on its own before it could be asked
            if self.designated:
                self._take_report(watcher, requested=False)
            self._requeue(cause, checkpoint_ok=False, program_status=early)
            return early
        if self.designated:
            self.events.emit(
                "checkpoint-start",
                job=self.job.job_id,
                signal=s.ckpt_signal.name[3:],
                grace_s=s.grace_s,
            )
            child.signal_group(s.ckpt_signal)
        ok, report, size, reason = self._await(child, handler, watcher, deadline)
        if self.designated:
            self.events.emit(
                "checkpoint-end",
                job=self.job.job_id,
                ok=ok,
                path=report.path if report and ok else None,
                bytes=size,
                duration_s=round(self.clock() - started, 3),
                step=report.step if report else None,
                requested=True,
                **({"reason": reason} if reason else {}),
            )
        if not ok:
            log.warning("no checkpoint taken: %s", reason)
        if handler.stop_count > 1:
            log.info("%d stop signals received; one checkpoint taken", handler.stop_count)
        self._end(child, deadline)
        self._requeue(cause, checkpoint_ok=ok)
        return EXIT_STOPPED

    def _end(self, child: Child, deadline: float) -> None:
        """Let the program exit by itself for a moment, then SIGKILL its whole group."""
        window = min(self.settings.exit_window_s, max(0.0, deadline - self.clock()))
        if child.wait(window) is None:
            log.info("program still running after its checkpoint window; killing it")
            child.kill()
        else:
            child.reap_leftovers()

    def _requeue(
        self, cause: str, checkpoint_ok: bool, program_status: Optional[int] = None
    ) -> None:
        if not self.designated:
            return  # the designated rank's wrapper requeues and records, once per job
        state = ""
        if cause == PREEMPTED and self.job.in_slurm and program_status is None:
            state = requeue.slurm_job_state(self.slurm(), self.job.job_id)
        decision = requeue.decide(
            cause,
            job_id=self.job.job_id,
            restart_count=self.job.restart_count,
            max_requeues=self.settings.max_requeues,
            checkpoint_ok=checkpoint_ok,
            program_status=program_status,
            slurm_state=state,
        )
        if decision.requeue:
            error = requeue.scontrol_requeue(self.slurm(), self.job.job_id)
            if error is None:
                self.events.emit(
                    "requeue",
                    job=self.job.job_id,
                    reason=cause,
                    count=decision.count,
                    by=decision.by,
                )
                log.info("requeued: %s", decision.reason)
                return
            decision = requeue.Decision(False, error)
            if cause == PREEMPTED:
                decision = requeue.Decision(
                    False,
                    f"{error}; waiting for Slurm to end the job (it requeues a "
                    "preempted job that is still running when the grace ends)",
                )
                self.events.emit("requeue-declined", job=self.job.job_id, reason=decision.reason)
                log.warning("not requeued by slurmiso: %s", decision.reason)
                self._wait_for_slurm()
                return
        self.events.emit("requeue-declined", job=self.job.job_id, reason=decision.reason)
        if cause == TIME_LIMIT or self.job.in_slurm:
            log.warning("not requeued: %s", decision.reason)

    def _wait_for_slurm(self) -> None:
        """Stay alive (the program is gone) so Slurm, not an early exit, decides the job's
        fate; bounded, in case no end ever comes."""
        until = self.clock() + self.settings.grace_s + 60.0
        while self.clock() < until:
            time.sleep(min(1.0, max(0.0, until - self.clock())))


def _default_slurm() -> requeue.SlurmRunner:
    from slurmiso.slurm.client import SlurmCli

    return SlurmCli(timeout=requeue.REQUEUE_TIMEOUT_S)
