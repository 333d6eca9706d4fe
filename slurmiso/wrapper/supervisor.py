"""The wrapper's main loop: run the program, and on a stop signal checkpoint, end, requeue.

    start:   resume env (last good checkpoint) + isolation env -> program in its own group,
             under a guardian that ends the program's whole tree if the wrapper dies,
             SIGKILLed included (wrapper/guardian.py)
    running: forward every other signal to the group, but the monitor's throttle and
             unthrottle, which set and clear the throttle file (wrapper/throttle.py); record
             checkpoints the program reports on its own
    stop:    (SIGTERM = preempted | --signal = time limit near; the first one only)
             journal preempt-signal -> checkpoint signal to the group -> (while it saves)
             ask Slurm the job's state -> wait for the marker or the program's exit, up to
             grace minus a margin -> requeue decision (with its reason) -> scontrol requeue
             (or, where slurmiso's epilog requeues, the request in the events file) -> let
             the program exit briefly, else SIGKILL the group -> exit 143
    exit:    on every path, nothing of the program outlives the wrapper: SIGTERM, then
             SIGKILL after a bound, to the group and to every adopted orphan

The margin leaves time, before Slurm's SIGKILL at the end of GraceTime, for the kill, the
journal lines and ``scontrol requeue``. Exit statuses pass through unless the wrapper stopped
the program; then it exits 143 (128+SIGTERM), so a stopped run never looks finished.

Latency on preemption is what an inference job waits for, so from the report on nothing
sleeps: the marker is polled every few milliseconds while a checkpoint is awaited, the
program's exit wakes the loop through SIGCHLD, and the requeue is issued before the program
has finished exiting (Slurm frees the GPUs only once every process of the job is gone, so
both proceed together). Where the epilog requeues (wrapper/requeue.py says why that is
faster under srun), nothing is called at all: the request is one line in the events file.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, Mapping, NoReturn, Optional, Sequence, Tuple

from slurmiso import jobfiles
from slurmiso.wrapper import procctl, requeue
from slurmiso.wrapper.checkpoint_protocol import MarkerWatcher, Report, verify
from slurmiso.wrapper.child import Child
from slurmiso.wrapper.resume import CheckpointStore, resume_env
from slurmiso.wrapper.signals import (
    JOB_CONTROL,
    PREEMPTED,
    TIME_LIMIT,
    JobEnvironment,
    SignalHandler,
)
from slurmiso.wrapper.throttle import ThrottleFile, throttle_path

log = logging.getLogger(__name__)

EXIT_STOPPED = 128 + int(signal.SIGTERM)
#: How often the marker is looked at while the program runs / while a checkpoint is awaited.
POLL_RUNNING_S = 0.5
POLL_CHECKPOINT_S = 0.005


@dataclass(frozen=True)
class Settings:
    ckpt_dir: str
    ckpt_signal: signal.Signals = signal.SIGUSR2
    warn_signal: signal.Signals = signal.SIGUSR1
    grace_s: float = 120.0
    max_requeues: int = 20
    rank: int = 0  # the task (SLURM_PROCID) that checkpoints; others wait for its marker
    exit_window_s: float = 5.0  # after the report, how long the program may take to exit
    term_wait_s: float = 2.0  # on exit, between SIGTERM and SIGKILL to what is left
    # the monitor's ladder (monitor.ladder.throttle_signal / unthrottle_signal): the
    # wrapper's own, never passed on; None: not one
    throttle_signal: Optional[signal.Signals] = signal.SIGURG
    unthrottle_signal: Optional[signal.Signals] = signal.SIGWINCH

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
        self._over_cap = False

    @property
    def path(self) -> str:
        return str(getattr(self.journal, "path", "")) if self.journal is not None else ""

    def emit(self, event: str, **fields: Any) -> bool:
        """Append one event; whether it was written."""
        if self.journal is None:
            return False
        try:
            self.journal.append(event, **fields)
        except OSError as exc:
            if not self._failed:
                log.warning("cannot write the job's events file %s: %s", self.journal.path, exc)
            self._failed = True
            return False
        self._check_size()
        return True

    def _check_size(self) -> None:
        """Say in the job's own log, once, when the file outgrows what the epilog reads: what
        lies past the cap never reaches the journal (the epilog says so there too)."""
        if self._over_cap:
            return
        from slurmiso.jobfiles import MAX_BYTES

        try:
            size = os.stat(self.path).st_size
        except OSError:
            return
        if size > MAX_BYTES:
            self._over_cap = True
            log.warning("the job's events file %s is %d bytes, over the %d bytes the epilog "
                        "reads: later events (checkpoints, preemptions) will not be counted; "
                        "something else is writing to it", self.path, size, MAX_BYTES)


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
        exit_process: bool = False,
        tick: Optional[Callable[[], None]] = None,
    ) -> None:
        """``exit_process``: this process is the wrapper and nothing else (the CLI), so after
        a stop it may end at once (see :func:`exit_now`) instead of returning. ``tick``: run
        on every turn of the loop while the program runs (never raises; wrapper/steps.py)."""
        self.argv = list(argv)
        self.exit_process = exit_process
        self.tick = tick
        self.stopped = False
        self.settings = settings
        self.job = job
        self.base_env = dict(base_env)
        self.isolation_env = dict(isolation_env or {})
        self.events = events or Events()
        self.slurm = slurm or _default_slurm
        self.clock = clock
        self.store = CheckpointStore(settings.ckpt_dir)
        self.designated = job.procid == settings.rank
        self.throttle = ThrottleFile(throttle_path(settings.ckpt_dir), clock=clock)
        self._own = self._throttle_signals()
        self._handler: Optional[SignalHandler] = None
        self._child: Optional[Child] = None

    # -- start and run ----------------------------------------------------------------------

    def run(self) -> int:
        self.store.ensure()
        latest = self.store.read()
        env: Dict[str, str] = dict(self.base_env)
        env.update(self.isolation_env)
        env.update(self.throttle.env())
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
        was_subreaper = procctl.is_subreaper()
        why = procctl.set_subreaper()
        if why:
            log.warning("%s", why)
        try:
            with SignalHandler(self.job, stop, own=sorted(self._own)) as handler:
                status = self._supervise(env, handler, watcher)
        finally:
            if why is None and not was_subreaper:
                procctl.set_subreaper(False)  # run in-process (tests): leave the host as it was
        if self.stopped and self.exit_process:
            exit_now(status)
        return status

    def _supervise(
        self, env: Mapping[str, str], handler: SignalHandler, watcher: MarkerWatcher
    ) -> int:
        self._handler = handler
        # The program sees Slurm's SIGTERM and --signal too (Slurm signals every process
        # of a step): it starts with them ignored; only the checkpoint signal reaches it.
        ignore = {int(signal.SIGTERM), int(self.settings.warn_signal)}
        ignore.discard(int(self.settings.ckpt_signal))
        # After the handlers are in place: a throttle that arrives from here on is queued
        # and acted on in the loop, after this removal of an earlier attempt's file.
        self.throttle.start()
        child = Child.start(self.argv, env, ignore=sorted(ignore))
        self._child = child
        try:
            status = self._loop(child, handler, watcher)
            self.stopped = handler.stop_cause is not None
            return status
        finally:
            # Every exit path, an exception included: nothing of the program outlives the
            # wrapper. After a stop the group was already ended within the grace.
            term_wait = 0.0 if self.stopped else self.settings.term_wait_s
            child.terminate(term_wait, self._sleep)
            self.throttle.finish()

    def _sleep(self, timeout: float) -> None:
        """Sleep up to ``timeout``, waking at once on any signal, and pass signals on."""
        if self._handler is None:
            time.sleep(max(0.0, timeout))
            return
        self._handler.wait(timeout)
        if self._child is not None:
            self._forward(self._child, self._handler)

    def _loop(self, child: Child, handler: SignalHandler, watcher: MarkerWatcher) -> int:
        while True:
            handler.wait(POLL_RUNNING_S)
            self._forward(child, handler)
            if self.designated:
                self._take_report(watcher, requested=False)
            if self.tick is not None:
                self.tick()
            if handler.stop_cause is not None:
                return self._stop(child, handler, watcher)
            status = child.poll()
            if status is not None:
                if self.designated:
                    self._take_report(watcher, requested=False)
                if self.job.restart_count > 0:
                    self._close_requeue(status)
                return status

    def _forward(self, child: Child, handler: SignalHandler) -> None:
        for signum in handler.take_own():
            self._throttle(signum)
        for signum in handler.take_forward():
            child.signal_group(signum)
            if signum in JOB_CONTROL:
                # The program's group has no parent in its session (an orphaned group), so the
                # kernel drops TSTP/TTIN/TTOU there: stop it outright, then stop too, as a
                # shell expects of its foreground job. The SIGCONT that resumes the wrapper
                # is forwarded like any other signal.
                child.signal_group(signal.SIGSTOP)
                os.kill(os.getpid(), signal.SIGSTOP)

    # -- the monitor's throttle ---------------------------------------------------------------

    def _throttle_signals(self) -> Dict[int, str]:
        """signal -> ``throttle``/``unthrottle``. A stop signal keeps its meaning (the wrapper
        cannot tell a throttle from a time limit on one signal), with a warning."""
        s = self.settings
        stops = {int(signal.SIGTERM): "SIGTERM", int(s.warn_signal): "the time-limit --signal"}
        out: Dict[int, str] = {}
        for sig, what in ((s.throttle_signal, "throttle"), (s.unthrottle_signal, "unthrottle")):
            if sig is None:
                continue
            if int(sig) in stops:
                log.warning("%s is %s here, so not the monitor's %s signal: a %s would stop "
                            "the program instead", sig.name, stops[int(sig)], what, what)
                continue
            if int(sig) == int(s.ckpt_signal):
                log.warning("%s is the checkpoint signal and the monitor's %s signal: Slurm "
                            "sends a %s to the program too, which would checkpoint",
                            sig.name, what, what)
            out[int(sig)] = what
        return out

    def _throttle(self, signum: int) -> None:
        """Set or clear the throttle file: a set or a clear, never a toggle. One line in the
        job's output each (the monitor sends one per restraint, minutes apart)."""
        name = signal.Signals(signum).name
        if self._own.get(signum) == "throttle":
            if self.throttle.set(name):
                log.info("%s: throttled by the monitor (%s created)", name, self.throttle.path)
                if self.designated:
                    self.events.emit("throttle", job=self.job.job_id, signal=name[3:])
            else:
                log.info("%s: already throttled", name)
            return
        throttled_s = self.throttle.clear()
        if throttled_s is None:
            log.info("%s: not throttled, nothing to undo", name)
            return
        log.info("%s: back to full speed after %.1fs throttled (%s removed)", name,
                 throttled_s, self.throttle.path)
        if self.designated:
            self.events.emit("unthrottle", job=self.job.job_id, signal=name[3:],
                             throttled_s=throttled_s)

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
        """Wait for the program's report (designated rank) or its exit, until ``deadline``.

        A tight poll of the marker (a few microseconds each): the report is what the
        preempting job waits for. The program's exit wakes the wait through SIGCHLD.
        """
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
        if report is None:
            return None
        log.info("rank %s: rank %s reported its checkpoint (%s)", self.job.procid,
                 self.settings.rank, report.path)
        return True, report, 0, ""

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
            if early == 0:  # finished: Slurm (24.05+) would requeue it as preempted
                self._close_requeue(early)
            return early
        if self.designated:
            self.events.emit(
                "checkpoint-start",
                job=self.job.job_id,
                signal=s.ckpt_signal.name[3:],
                grace_s=s.grace_s,
            )
            child.signal_group(s.ckpt_signal)
        # Learnt while the program saves, not after: a cancelled job is CANCELLED at once
        # and a preempted one stays RUNNING through the grace, so the answer cannot change.
        state = self._job_state(cause)
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
        # Requeue first: the program's own exit (often slow: CUDA, NCCL teardown) and the
        # requeue call then overlap, and the job frees its GPUs when both are done.
        wait_for_slurm = self._requeue(cause, checkpoint_ok=ok, slurm_state=state)
        self._end(child, deadline)
        if wait_for_slurm:
            self._wait_for_slurm()
        return EXIT_STOPPED

    def _end(self, child: Child, deadline: float) -> None:
        """Let the program exit by itself for a moment, then SIGKILL everything of it."""
        window = min(self.settings.exit_window_s, max(0.0, deadline - self.clock()))
        if child.wait(window, self._sleep) is None:
            log.info("program still running after its checkpoint window; killing it")
        child.terminate(0.0, self._sleep)

    def _job_state(self, cause: str) -> str:
        """The job's state in Slurm when it decides a requeue ("" when not asked)."""
        if not (self.designated and cause == PREEMPTED and self.job.in_slurm):
            return ""
        return requeue.slurm_job_state(self.slurm(), self.job.job_id)

    def _requeue(
        self,
        cause: str,
        checkpoint_ok: bool,
        program_status: Optional[int] = None,
        slurm_state: str = "",
    ) -> bool:
        """Decide and requeue; True when the wrapper must then wait for Slurm to end the job."""
        if not self.designated:
            return False  # the designated rank's wrapper requeues and records, once per job
        decision = requeue.decide(
            cause,
            job_id=self.job.job_id,
            restart_count=self.job.restart_count,
            max_requeues=self.settings.max_requeues,
            checkpoint_ok=checkpoint_ok,
            program_status=program_status,
            slurm_state=slurm_state,
            epilog=self._epilog_requeues(),
        )
        if decision.requeue and decision.by == requeue.BY_EPILOG:
            # the request the epilog acts on; if it cannot be written, requeue here
            if self.events.emit(
                jobfiles.REQUEUE, job=self.job.job_id, reason=cause, count=decision.count,
                by=decision.by,
            ):
                log.info("requeue requested: %s", decision.reason)
                return False
            decision = requeue.Decision(True, decision.reason, requeue.BY_WRAPPER, decision.count)
        if decision.requeue:
            error = requeue.scontrol_requeue(self.slurm(), self.job.job_id)
            if error is None:
                self.events.emit(
                    jobfiles.REQUEUE,
                    job=self.job.job_id,
                    reason=cause,
                    count=decision.count,
                    by=decision.by,
                )
                log.info("requeued: %s", decision.reason)
                return False
            decision = requeue.Decision(False, error)
            if cause == PREEMPTED:
                decision = requeue.Decision(
                    False,
                    f"{error}; waiting for Slurm to end the job (it requeues a "
                    "preempted job that is still running when the grace ends)",
                )
                self.events.emit("requeue-declined", job=self.job.job_id, reason=decision.reason)
                log.warning("not requeued by slurmiso: %s", decision.reason)
                return True
        self.events.emit("requeue-declined", job=self.job.job_id, reason=decision.reason)
        if cause == TIME_LIMIT or self.job.in_slurm:
            log.warning("not requeued: %s", decision.reason)
        return False

    def _epilog_requeues(self) -> bool:
        """slurmiso's epilog will requeue on request: the prolog declared it, and the events
        go to the file that epilog reads (not one the user chose with ``--events``)."""
        return bool(
            self.job.epilog_requeue
            and self.job.events_file
            and self.events.path == self.job.events_file
        )

    def _close_requeue(self, status: int) -> None:
        """The program ended by itself: make this the job's end where Slurm would requeue it
        for a preemption already dealt with (:mod:`slurmiso.wrapper.requeue`, 24.05+)."""
        if not (self.designated and self.job.in_slurm):
            return
        client = self.slurm()
        version = requeue.slurm_version(client, self.base_env)
        if not requeue.needs_close(version):
            return
        error = requeue.close_requeue(client, self.job.job_id)
        self.events.emit(
            jobfiles.REQUEUE_CLOSED,
            job=self.job.job_id,
            restart_count=self.job.restart_count,
            status=status,
            ok=error is None,
            **({"reason": error} if error else {}),
        )
        if error:
            log.warning("%s: Slurm may run this finished job again", error)
        else:
            log.info("program ended (status %d): job Requeue turned off so Slurm ends the "
                     "job with it", status)

    def _wait_for_slurm(self) -> None:
        """Stay alive (the program is gone) so Slurm, not an early exit, decides the job's
        fate; bounded, in case no end ever comes."""
        until = self.clock() + self.settings.grace_s + 60.0
        while self.clock() < until:
            time.sleep(min(1.0, max(0.0, until - self.clock())))


def exit_now(status: int) -> NoReturn:
    """End the wrapper's process after a stop, skipping the interpreter's teardown.

    Slurm frees the job's GPUs only when its last process is gone, and the wrapper is that
    process; Python's own teardown of its modules takes 10-25 ms that the preempting job
    would wait for. Everything is done by then (program reaped, journal lines written with
    plain ``write``, checkpoint record fsynced); logs and stdio are flushed here.
    """
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(status)


def _default_slurm() -> requeue.SlurmRunner:
    from slurmiso.slurm.client import SlurmCli

    return SlurmCli(timeout=requeue.REQUEUE_TIMEOUT_S)
