"""A stand-in for Slurm's side of preemption, so the whole cycle runs on a laptop.

submitit's lesson: a local controller that imitates the scheduler's signal timing lets the
preempt -> checkpoint -> requeue -> resume loop be tested end to end without a cluster.
This one imitates what slurmctld/slurmstepd do to a batch job:

* preemption (``PreemptMode=REQUEUE``): SIGCONT + SIGTERM to every process of the job, SIGKILL
  to all that remain after ``grace_s`` (the QoS GraceTime), then the job runs again with
  ``SLURM_RESTART_COUNT`` one higher - but, as Slurm 22.05 does, a job that exits before the
  grace ends without having been requeued ends FAILED and does not run again;
* time limit with ``--signal=SIG@T``: SIG to every process of the step, ``T`` seconds before
  the limit; at the limit SIGTERM to all, SIGKILL after ``kill_wait_s`` (state TIMEOUT);
* ``scontrol requeue``: a fake ``scontrol`` (found first through ``SLURMISO_SLURM_BIN``)
  writes the request to a file; the controller then ends the run (SIGTERM, SIGKILL after
  ``kill_wait_s``) and starts it again, count + 1; ``scontrol update JobId=J Requeue=0`` is
  recorded the same way and turns the job's requeue off;
* with ``epilog_requeue=True``, what slurmiso's prolog and epilog add: the job gets
  ``SLURMISO_EVENTS_FILE`` and ``SLURMISO_EPILOG_REQUEUE=1``, and once a run has ended the
  controller reads that run's events as the epilog does and requeues the job when its
  wrapper asked for it (a requeue of an ended job, as Slurm allows);
* with ``release`` 24.05 or later (``scontrol --version`` answers it), what slurmctld does
  since then: a job signalled for a preemption grace keeps that mark through ``scontrol
  requeue``, and a later attempt that ends by itself is requeued for it (state PREEMPTED),
  as is a job that exits inside the grace - unless its requeue was turned off.

It drives the real ``slurmiso run`` process, so only Slurm is simulated.
"""

from __future__ import annotations

import logging
import os
import signal
import stat
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from slurmiso.slurm import versions

log = logging.getLogger(__name__)

#: Called with the seconds since the run started; True = preempt now.
Trigger = Callable[[float], bool]

FAKE_SCONTROL = """#!/bin/sh
# scontrol stand-in for slurmiso's local controller. 'show job' answers with the state the
# controller wrote; 'requeue' is recorded and succeeds (or fails the way a site that forbids
# users 'scontrol requeue' does).
if [ "$1" = --version ]; then
    echo "slurm $SLURMISO_SIM_VERSION"
    exit 0
fi
if [ "$1" = show ]; then
    state=$(cat "$SLURMISO_SIM_REQUESTS.state" 2>/dev/null || echo RUNNING)
    echo "JobId=$SLURM_JOB_ID JobName=sim JobState=$state"
    exit 0
fi
if [ -n "$SLURMISO_SIM_SCONTROL_FAIL" ]; then
    echo "scontrol: error: Access/permission denied" >&2
    exit 1
fi
echo "$@" >> "$SLURMISO_SIM_REQUESTS"
"""

#: squeue stand-in: ``-O State:W`` answers the state the controller wrote, padded as squeue
#: pads it (the wrapper reads the job's state the way the hooks do, never 'scontrol show').
FAKE_SQUEUE = """#!/bin/sh
state=$(cat "$SLURMISO_SIM_REQUESTS.state" 2>/dev/null || echo RUNNING)
printf '%-63s\\n' "$state"
"""


@dataclass
class Attempt:
    """One run of the job (Slurm's "job attempt" between requeues)."""

    restart_count: int
    state: str  # COMPLETED, FAILED, PREEMPTED, REQUEUED, TIMEOUT
    exit_code: int
    seconds: float
    killed: bool = False  # something was still alive when the grace ran out
    signals: List[str] = field(default_factory=list)
    #: Seconds after the start at which the run was told to stop (preemption, requeue, time
    #: limit; None: it ended by itself), so a test can time what followed from there.
    stop_at: Optional[float] = None


def after(seconds: float) -> Trigger:
    """A trigger that fires ``seconds`` after the run started."""
    return lambda elapsed: elapsed >= seconds


def _job_pids(root: int) -> List[int]:
    """``root`` and every descendant (what proctrack/linuxproc would track)."""
    import psutil

    try:
        proc = psutil.Process(root)
        return [root] + [c.pid for c in proc.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


class LocalSlurm:
    """Runs ``argv`` (normally ``slurmiso run ... -- CMD``) as one simulated batch job."""

    def __init__(
        self,
        argv: Sequence[str],
        *,
        job_id: str = "4242",
        grace_s: float = 5.0,
        kill_wait_s: float = 2.0,
        env: Optional[Mapping[str, str]] = None,
        workdir: Optional[str] = None,
        poll_s: float = 0.02,
        epilog_requeue: bool = False,
        release: Tuple[int, int, int] = (22, 5, 8),
    ) -> None:
        self.argv = list(argv)
        self.job_id = job_id
        self.grace_s = grace_s
        self.kill_wait_s = kill_wait_s
        self.base_env = dict(os.environ if env is None else env)
        self.workdir = workdir or tempfile.mkdtemp(prefix="slurmiso-localsim-")
        self.poll_s = poll_s
        self.bin_dir = os.path.join(self.workdir, "bin")
        self.requests = os.path.join(self.workdir, "scontrol-requests")
        self.epilog_requeue = epilog_requeue
        self.events_file = os.path.join(self.workdir, f".slurmiso-events.{job_id}.jsonl")
        self.epilog_requeues = 0  # requeues the simulated epilog ran
        self.release: Tuple[int, int, int] = (release[0], release[1], release[2])
        self.grace_mark = False  # slurmctld's GRACE_PREEMPT (24.05+)
        self._fake_scontrol()

    def _fake_scontrol(self) -> None:
        os.makedirs(self.bin_dir, exist_ok=True)
        for name, text in (("scontrol", FAKE_SCONTROL), ("squeue", FAKE_SQUEUE)):
            path = os.path.join(self.bin_dir, name)
            with open(path, "w", encoding="utf-8") as fh:
                fh.write(text)
            os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)

    def env_for(self, restart_count: int) -> Dict[str, str]:
        env = dict(self.base_env)
        env.update(
            SLURM_JOB_ID=self.job_id,
            SLURM_PROCID="0",
            SLURMISO_SLURM_BIN=self.bin_dir,
            SLURMISO_SIM_REQUESTS=self.requests,
            SLURMISO_SIM_VERSION=".".join(map(str, self.release)),
        )
        env.setdefault("SLURMISO_CONFIG", os.path.join(self.workdir, "no-config.yaml"))
        if self.epilog_requeue:
            env.update(SLURMISO_EVENTS_FILE=self.events_file, SLURMISO_EPILOG_REQUEUE="1")
        if restart_count:
            env["SLURM_RESTART_COUNT"] = str(restart_count)  # Slurm sets it after a requeue
        else:
            env.pop("SLURM_RESTART_COUNT", None)
        return env

    def set_state(self, state: str) -> None:
        """What the fake ``scontrol show job`` reports (RUNNING unless told otherwise)."""
        with open(self.requests + ".state", "w", encoding="utf-8") as fh:
            fh.write(state)

    def cancel(self, pid: int) -> None:
        """``scancel``: the job turns CANCELLED, then SIGCONT+SIGTERM to all its processes."""
        self.set_state("CANCELLED")
        self._signal_all(pid, (signal.SIGCONT, signal.SIGTERM), Attempt(0, "", 0, 0.0))

    def run(
        self,
        preempt: Sequence[Trigger] = (),
        time_limit_s: Optional[float] = None,
        warn_signal: int = signal.SIGUSR1,
        warn_before_s: float = 0.0,
        max_attempts: int = 10,
        timeout_s: float = 120.0,
        started: Sequence[Trigger] = (),
    ) -> List[Attempt]:
        """Run until the job completes or fails; attempt ``i`` is preempted by ``preempt[i]``.

        Attempt ``i``'s time limit (and its warning) count from when ``started[i]`` first
        fires, not from the launch, so a slow start of the wrapper on a busy machine does not
        eat the warning window (a signal that comes before the wrapper's handlers are
        installed kills it, which a test of the handlers must not depend on).
        """
        attempts: List[Attempt] = []
        while len(attempts) < max_attempts:
            n = len(attempts)
            trigger = preempt[n] if n < len(preempt) else None
            att = self.run_attempt(
                n, trigger, time_limit_s, warn_signal, warn_before_s, timeout_s,
                started[n] if n < len(started) else None,
            )
            attempts.append(att)
            if att.state not in ("PREEMPTED", "REQUEUED"):
                break
        return attempts

    def run_attempt(
        self,
        restart_count: int,
        trigger: Optional[Trigger] = None,
        time_limit_s: Optional[float] = None,
        warn_signal: int = signal.SIGUSR1,
        warn_before_s: float = 0.0,
        timeout_s: float = 120.0,
        started: Optional[Trigger] = None,
    ) -> Attempt:
        """One run; ``started``: when its time-limit clock starts (None: at the launch)."""
        requests_before = self._request_count()
        events_before = self._events_size()
        requeued = False
        t0 = time.monotonic()
        proc = subprocess.Popen(self.argv, env=self.env_for(restart_count), cwd=self.workdir)
        att = Attempt(restart_count, "RUNNING", 0, 0.0)
        ending: Optional[str] = None  # the state the job gets once it is gone
        kill_at: Optional[float] = None
        warned = False
        clock0: Optional[float] = None if started is not None else t0  # the time limit's
        while proc.poll() is None:
            now = time.monotonic()
            elapsed = now - t0
            if clock0 is None and started is not None and started(elapsed):
                clock0 = now
            if ending is None:
                if trigger is not None and trigger(elapsed):
                    ending, kill_at = "PREEMPTED", now + self.grace_s
                    self.grace_mark = versions.has("grace_preempt_sticky", self.release) is True
                    self._signal_all(proc.pid, (signal.SIGCONT, signal.SIGTERM), att)
                elif self._request_count() > requests_before:
                    ending, kill_at = "REQUEUED", now + self.kill_wait_s
                    self._signal_all(proc.pid, (signal.SIGCONT, signal.SIGTERM), att)
                elif time_limit_s is not None and clock0 is not None:
                    running = now - clock0
                    if not warned and warn_before_s and running >= time_limit_s - warn_before_s:
                        warned = True
                        # as --signal=SIG@T reaches a wrapper run by srun: every process
                        self._signal_all(proc.pid, (warn_signal,), att)
                    if running >= time_limit_s:
                        ending, kill_at = "TIMEOUT", now + self.kill_wait_s
                        self._signal_all(proc.pid, (signal.SIGCONT, signal.SIGTERM), att)
                if elapsed > timeout_s:
                    ending, kill_at = "TIMEOUT", now
                if ending is not None:
                    att.stop_at = round(elapsed, 3)
            if kill_at is not None and now >= kill_at:
                att.killed = bool(_job_pids(proc.pid))
                if ending == "PREEMPTED":
                    requeued = True  # still running at the end of the grace: Slurm requeues
                self._signal_all(proc.pid, (signal.SIGKILL,), att)
                kill_at = None
            time.sleep(self.poll_s)
        rc = proc.returncode
        att.exit_code = 128 - rc if rc < 0 else rc
        asked = self.epilog_requeue and self.epilog_asked(events_before, restart_count)
        if asked and not requeued:
            self.epilog_requeues += 1
            with open(self.requests, "a", encoding="utf-8") as fh:
                fh.write(f"requeue {self.job_id}\n")  # the epilog's scontrol requeue (root)
        requeued = requeued or self._request_count() > requests_before
        # 24.05+: a completion while the grace mark is on is taken for the preemption
        taken_for_preemption = self.grace_mark and self._requeue_on()
        if ending is None and requeued:
            ending = "REQUEUED"
        elif ending in (None, "PREEMPTED") and not requeued and taken_for_preemption:
            ending, self.grace_mark = "PREEMPTED", False  # the only place it is cleared
        elif ending == "PREEMPTED" and not requeued:
            ending = "FAILED"  # exited inside the grace and nobody requeued it (22.05)
        att.state = ending or ("COMPLETED" if att.exit_code == 0 else "FAILED")
        att.seconds = round(time.monotonic() - t0, 3)
        log.info("attempt %d: %s (exit %d)", restart_count, att.state, att.exit_code)
        return att

    def _events_size(self) -> int:
        try:
            return os.path.getsize(self.events_file)
        except OSError:
            return 0

    def epilog_asked(self, offset: int, restart_count: int) -> bool:
        """Whether this run's events ask the epilog to requeue (hooks/requeue.py decides)."""
        from slurmiso.hooks.events import parse_line
        from slurmiso.hooks.requeue import requested

        try:
            with open(self.events_file, "rb") as fh:
                fh.seek(offset)
                lines = fh.read().splitlines()
        except OSError:
            return False
        records = [r for r in (parse_line(ln) for ln in lines if ln.strip()) if r is not None]
        return requested(records, restart_count)

    def _requeue_on(self) -> bool:
        """False once the job's Requeue was turned off (``scontrol update ... Requeue=0``)."""
        try:
            with open(self.requests, encoding="utf-8") as fh:
                return not any(line.startswith("update ") and "Requeue=0" in line
                               for line in fh)
        except FileNotFoundError:
            return True

    def _request_count(self) -> int:
        try:
            with open(self.requests, encoding="utf-8") as fh:
                return sum(1 for line in fh if line.startswith("requeue"))
        except FileNotFoundError:
            return 0

    def _signal_all(self, root: int, sigs: Sequence[int], att: Attempt) -> None:
        pids = _job_pids(root)
        for sig in sigs:
            for pid in pids:
                self._signal(pid, sig, att, record=pid == root)

    @staticmethod
    def _signal(pid: int, sig: int, att: Attempt, record: bool = True) -> None:
        if record:
            att.signals.append(signal.Signals(sig).name)
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass
