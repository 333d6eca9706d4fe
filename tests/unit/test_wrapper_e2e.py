"""The whole preempt -> checkpoint -> requeue -> resume cycle, with the local controller
(tests/localsim.py) playing Slurm and the real ``slurmiso run`` process.

No Slurm, no root: each test takes a few seconds (short grace times).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import pytest

from slurmiso.wrapper.checkpoint_protocol import write_marker
from tests.localsim import LocalSlurm, Trigger
from tests.waiting import wait_for

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
WORKLOAD = os.path.join(ROOT, "slurmiso_sandbox", "train_counter.py")
ENV = dict(os.environ, PYTHONPATH=ROOT)
ENV.pop("SLURMISO_EVENTS_FILE", None)
ENV.pop("SLURMISO_CKPT_DIR", None)

pytestmark = pytest.mark.slow


class Job:
    """One simulated job: paths, the wrapper command, and readers for its traces."""

    def __init__(self, tmp: str, *workload_args: str, grace: float = 3.0, extra: tuple = (),
                 slurm_grace: Optional[float] = None) -> None:
        """``grace``: the wrapper's ``--grace``; ``slurm_grace``: when the stand-in Slurm
        SIGKILLs what is left (default the same)."""
        self.dir = tmp
        self.log = os.path.join(tmp, "steps.log")
        self.events = os.path.join(tmp, "events.jsonl")
        self.ckpt = os.path.join(tmp, "ckpt")
        self.argv = [
            sys.executable, "-m", "slurmiso", "run", "--grace", str(grace),
            "--events", self.events, "--ckpt-dir", self.ckpt, *extra, "--",
            sys.executable, WORKLOAD, "--log", self.log, *workload_args,
        ]
        self.sim = LocalSlurm(self.argv, env=ENV, workdir=tmp,
                              grace_s=grace if slurm_grace is None else slurm_grace,
                              kill_wait_s=2.0)

    def steps(self) -> List[int]:
        try:
            text = Path(self.log).read_text()
        except FileNotFoundError:
            return []
        return [int(m) for m in re.findall(r"^step=(\d+) ", text, re.M)]

    def after_steps(self, n: int) -> Trigger:
        """Preempt once the log has ``n`` more steps than when this run began."""
        base: Dict[str, int] = {}

        def fire(elapsed: float) -> bool:
            count = len(self.steps())
            base.setdefault("n", count)
            return count - base["n"] >= n

        return fire

    def journal(self, event: str = "") -> List[Dict[str, Any]]:
        with open(self.events) as fh:
            recs = [json.loads(line) for line in fh if line.strip()]
        return [r for r in recs if not event or r["event"] == event]


def test_preempted_three_times_finishes_exactly_once_per_step(tmp_path) -> None:
    job = Job(str(tmp_path), "--steps", "120", "--step-time", "0.01")
    attempts = job.sim.run(preempt=[job.after_steps(20) for _ in range(3)])
    assert [a.state for a in attempts] == ["PREEMPTED"] * 3 + ["COMPLETED"]
    assert attempts[-1].restart_count == 3 and attempts[-1].exit_code == 0
    assert all(a.exit_code == 143 and not a.killed for a in attempts[:3])
    steps = job.steps()
    assert sorted(steps) == list(range(1, 121))  # none lost, none twice
    assert not [s for s, n in Counter(steps).items() if n > 1]
    ends = job.journal("checkpoint-end")
    assert len(ends) == 3 and all(e["ok"] and e["bytes"] > 0 for e in ends)
    resumes = job.journal("resume")
    assert [r["restart_count"] for r in resumes] == [1, 2, 3]
    assert [r["checkpoint"] for r in resumes] == [e["path"] for e in ends]
    assert [r["count"] for r in job.journal("requeue")] == [1, 2, 3]
    assert Path(job.sim.requests).read_text().splitlines() == ["requeue 4242"] * 3
    assert "restart=3" in Path(job.log).read_text().splitlines()[-2]


def test_program_ignoring_the_signal_is_killed_and_no_checkpoint_recorded(tmp_path) -> None:
    # the wrapper is told a 2 s grace; the stand-in Slurm kills only after 120 s, so what
    # ended the job can be told by who ended it, not by how long it took
    job = Job(str(tmp_path), "--steps", "400", "--step-time", "0.01", "--ignore-signal",
              "--misbehave-on-restart", "0", grace=2.0, slurm_grace=120.0)
    attempts = job.sim.run(preempt=[job.after_steps(10)])
    assert [a.state for a in attempts] == ["PREEMPTED", "COMPLETED"]
    # the wrapper ended the program and itself (143), at its own deadline inside the grace
    # (the grace less its margin, which the reason names); Slurm's SIGKILL found nothing left
    assert attempts[0].stop_at is not None and not attempts[0].killed
    assert attempts[0].exit_code == 143
    (end,) = job.journal("checkpoint-end")
    assert not end["ok"] and end["path"] is None
    assert "did not report a checkpoint within 1s (grace 2s less a 1s margin)" in end["reason"]
    assert "killed" in end["reason"]
    (resume,) = job.journal("resume")
    assert resume["checkpoint"] is None  # starts over: the lost work is visible, not hidden


def test_crash_during_checkpoint_keeps_the_previous_good_one(tmp_path) -> None:
    job = Job(str(tmp_path), "--steps", "90", "--step-time", "0.01", "--crash-in-checkpoint",
              "--misbehave-on-restart", "1")
    attempts = job.sim.run(preempt=[job.after_steps(20), job.after_steps(20)])
    assert [a.state for a in attempts] == ["PREEMPTED", "PREEMPTED", "COMPLETED"]
    first, crashed = job.journal("checkpoint-end")
    assert first["ok"] and not crashed["ok"]
    assert "exited (status 7) without reporting" in crashed["reason"]
    resumes = job.journal("resume")
    assert resumes[-1]["checkpoint"] == first["path"]  # not the half-written one
    assert any(n.endswith(".tmp") for n in os.listdir(job.ckpt))  # the half-written file
    assert set(job.steps()) == set(range(1, 91))


def test_checkpoint_slower_than_the_grace_is_not_offered(tmp_path) -> None:
    job = Job(str(tmp_path), "--steps", "60", "--step-time", "0.01", "--slow-checkpoint", "10",
              "--misbehave-on-restart", "0", grace=2.0)
    attempts = job.sim.run(preempt=[job.after_steps(10)])
    assert [a.state for a in attempts] == ["PREEMPTED", "COMPLETED"]
    (end,) = job.journal("checkpoint-end")
    assert not end["ok"] and "did not report" in end["reason"]
    assert job.journal("resume")[0]["checkpoint"] is None


def test_preempted_job_that_cannot_requeue_itself_waits_for_slurm(tmp_path) -> None:
    """A site that forbids 'scontrol requeue': exiting early would end the job FAILED."""
    job = Job(str(tmp_path), "--steps", "80", "--step-time", "0.01", grace=2.0)
    job.sim.base_env["SLURMISO_SIM_SCONTROL_FAIL"] = "1"
    attempts = job.sim.run(preempt=[job.after_steps(10)])
    assert [a.state for a in attempts] == ["PREEMPTED", "COMPLETED"]
    assert attempts[0].killed and attempts[0].stop_at is not None
    assert attempts[0].seconds - attempts[0].stop_at >= 2.0  # stayed until the grace ended
    (declined,) = job.journal("requeue-declined")
    assert "permission denied" in declined["reason"] and "waiting for Slurm" in declined["reason"]
    assert sorted(job.steps()) == list(range(1, 81))


def test_scancel_checkpoints_but_is_not_requeued(tmp_path) -> None:
    job = Job(str(tmp_path), "--steps", "400", "--step-time", "0.01")
    proc = subprocess.Popen(job.argv, env=job.sim.env_for(0), cwd=job.dir)
    try:
        while len(job.steps()) < 5:
            time.sleep(0.02)
        job.sim.cancel(proc.pid)
        assert proc.wait(10) == 143
    finally:
        proc.kill()
    assert job.journal("checkpoint-end")[0]["ok"]  # the work is saved all the same
    assert not job.journal("requeue")
    assert "cancelled, not preempted" in job.journal("requeue-declined")[0]["reason"]
    assert not os.path.exists(job.sim.requests)


def _has_event(path: str, event: str) -> bool:
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        return False
    return any(json.loads(x)["event"] == event for x in text.splitlines() if x.strip())


def test_double_signal_is_one_checkpoint(tmp_path) -> None:
    job = Job(str(tmp_path), "--steps", "400", "--step-time", "0.01", "--slow-checkpoint", "1.0")
    env = job.sim.env_for(0)
    proc = subprocess.Popen(job.argv, env=env, cwd=job.dir)
    try:
        wait_for(lambda: len(job.steps()) >= 5, "steps")
        proc.send_signal(signal.SIGTERM)
        # the second signals come while that checkpoint runs: once the wrapper has begun it
        # (not after a fixed 0.1 s, which on a busy machine could be before it had)
        wait_for(lambda: _has_event(job.events, "checkpoint-start"), "checkpoint-start")
        proc.send_signal(signal.SIGTERM)
        proc.send_signal(signal.SIGUSR1)  # and the time-limit warning on top
        assert proc.wait(10) == 143
    finally:
        proc.kill()
    assert len(job.journal("checkpoint-start")) == 1
    assert len(job.journal("checkpoint-end")) == 1 and job.journal("checkpoint-end")[0]["ok"]
    assert Path(job.log).read_text().count("# checkpoint") == 1


def test_time_limit_requeues_itself_until_max_requeues(tmp_path) -> None:
    job = Job(str(tmp_path), "--steps", "100000", "--step-time", "0.01",
              extra=("--max-requeues", "2"))
    # each attempt's time limit counts from its program's first step: the warning comes 1 s
    # into the run, and must not come before the wrapper's handlers are up (a slow start on
    # a busy machine died of it: exit 138)
    attempts = job.sim.run(time_limit_s=6.0, warn_signal=signal.SIGUSR1, warn_before_s=5.0,
                           started=[job.after_steps(1) for _ in range(3)])
    assert [a.state for a in attempts] == ["REQUEUED", "REQUEUED", "FAILED"]
    assert [a.restart_count for a in attempts] == [0, 1, 2]
    assert attempts[-1].exit_code == 143
    assert [r["by"] for r in job.journal("requeue")] == ["slurmiso", "slurmiso"]
    (declined,) = job.journal("requeue-declined")
    assert "max_requeues (2)" in declined["reason"]
    calls = Path(job.sim.requests).read_text().split("\n")
    assert calls[:2] == ["requeue 4242", "requeue 4242"]
    steps = job.steps()
    assert steps == list(range(1, len(steps) + 1))  # contiguous, across three runs


def test_outside_slurm_passes_exit_codes_and_still_checkpoints(tmp_path) -> None:
    env = {k: v for k, v in ENV.items() if not k.startswith("SLURM_")}
    code = "import sys; sys.exit(9)"
    rc = subprocess.run([sys.executable, "-m", "slurmiso", "run", "--", sys.executable, "-c", code],
                        env=env, cwd=str(tmp_path)).returncode
    assert rc == 9
    job = Job(str(tmp_path), "--steps", "400", "--step-time", "0.01")
    proc = subprocess.Popen(job.argv, env=env, cwd=job.dir)
    while len(job.steps()) < 5:
        time.sleep(0.02)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(10) == 143
    assert job.journal("checkpoint-end")[0]["ok"]
    assert "not running under Slurm" in job.journal("requeue-declined")[0]["reason"]


def test_other_ranks_wait_for_the_designated_ranks_report(tmp_path) -> None:
    events = str(tmp_path / "ev.jsonl")
    ckpt = str(tmp_path / "ckpt")
    argv = [sys.executable, "-m", "slurmiso", "run", "--grace", "600", "--events", events,
            "--ckpt-dir", ckpt, "--", sys.executable, "-c",
            "import time; open('ready', 'w').close(); time.sleep(600)"]
    env = dict(ENV, SLURM_JOB_ID="5", SLURM_PROCID="1",
               SLURMISO_CONFIG=str(tmp_path / "none.yaml"))
    log = tmp_path / "wrapper.log"
    with open(log, "wb") as err:
        proc = subprocess.Popen(argv, env=env, cwd=str(tmp_path), stderr=err)
    # the program runs, so the wrapper's handlers are up (not a 1 s sleep: a slow start on a
    # busy machine got SIGTERM before them, and died of it)
    wait_for(lambda: (tmp_path / "ready").exists(), "program")
    proc.send_signal(signal.SIGTERM)
    wait_for(lambda: _has_event(events, "preempt-signal"), "preempt-signal")
    assert proc.poll() is None  # still waiting: rank 1 does not checkpoint itself
    report = tmp_path / "c.pt"  # a path the wrapper can only learn from the marker
    report.write_text("x")
    write_marker(os.path.join(ckpt, ".slurmiso", "marker.json"), str(report))
    # the wrapper's own deadline is 590 s away (grace 600 less a 10 s margin): ending before
    # it shows the marker ended the wait. 60 s is a hang guard, not a speed test: from the
    # marker to the exit takes milliseconds
    assert proc.wait(60) == 143
    # what ended the wait, counted rather than timed: rank 1 read rank 0's report
    assert f"rank 1: rank 0 reported its checkpoint ({report})" in log.read_text()
    kinds = [json.loads(x)["event"] for x in Path(events).read_text().splitlines()]
    assert kinds == ["preempt-signal"]  # no checkpoint or requeue records from rank 1


# A program that reports its checkpoint, then takes its time to exit (CUDA and NCCL teardown
# do), and notes whether the job was already requeued while it was still exiting.
SLOW_EXIT = r"""
import os, signal, sys, time
from slurmiso.wrapper.checkpoint_protocol import write_marker
got = []
signal.signal(signal.SIGUSR2, lambda n, f: got.append(n))
open("ready", "w").close()
while not got:
    time.sleep(0.01)
open("ckpt.bin", "w").write("x")
write_marker(os.environ["SLURMISO_CKPT_MARKER"], os.path.abspath("ckpt.bin"), step=1)
requests = os.environ["SLURMISO_SIM_REQUESTS"]
deadline = time.monotonic() + 3.0
while not os.path.exists(requests) and time.monotonic() < deadline:
    time.sleep(0.01)
open("exit-saw", "w").write("requeued" if os.path.exists(requests) else "not requeued")
"""


def test_requeue_does_not_wait_for_the_program_to_finish_exiting(tmp_path) -> None:
    """The requeue and the program's own exit overlap: the preempting job waits for both."""
    argv = [sys.executable, "-m", "slurmiso", "run", "--grace", "20",
            "--ckpt-dir", str(tmp_path / "ckpt"), "--", sys.executable, "-c", SLOW_EXIT]
    sim = LocalSlurm(argv, env=ENV, workdir=str(tmp_path))
    started = lambda elapsed: (tmp_path / "ready").exists()  # noqa: E731
    attempts = sim.run(preempt=[started], max_attempts=1)
    assert attempts[0].exit_code == 143
    assert (tmp_path / "exit-saw").read_text() == "requeued"
    assert Path(sim.requests).read_text().splitlines() == ["requeue 4242"]


# -- where slurmiso's epilog requeues (issue 14): the wrapper only asks, then exits ----------


def _epilog_job(tmp: str, *extra: str) -> Tuple[LocalSlurm, str]:
    log = os.path.join(tmp, "steps.log")
    argv = [sys.executable, "-m", "slurmiso", "run", "--grace", "3", "--ckpt-dir",
            os.path.join(tmp, "ckpt"), *extra, "--", sys.executable, WORKLOAD, "--log", log,
            "--steps", "60", "--step-time", "0.01"]
    return LocalSlurm(argv, env=ENV, workdir=tmp, grace_s=3.0, epilog_requeue=True), log


def test_preempted_under_an_epilog_that_requeues_the_wrapper_only_asks(tmp_path) -> None:
    """No scontrol requeue from inside the step (it would kill srun before the step ends):
    the request goes to the events file, and the epilog's requeue brings the job back."""
    sim, log = _epilog_job(str(tmp_path))
    steps = lambda: len(re.findall(r"^step=", Path(log).read_text(), re.M)) if Path(log).exists() else 0  # noqa: E731
    attempts = sim.run(preempt=[lambda e: steps() >= 20, lambda e: steps() >= 40])
    assert [a.state for a in attempts] == ["PREEMPTED", "PREEMPTED", "COMPLETED"]
    assert all(a.exit_code == 143 and not a.killed for a in attempts[:2])
    assert sim.epilog_requeues == 2  # every requeue was the epilog's ...
    assert Path(sim.requests).read_text().splitlines() == ["requeue 4242"] * 2  # ... none else
    found = [int(m) for m in re.findall(r"^step=(\d+) ", Path(log).read_text(), re.M)]
    assert sorted(found) == list(range(1, 61))  # none lost, none twice


def test_events_the_user_redirected_mean_the_wrapper_requeues_itself(tmp_path) -> None:
    """The epilog reads only the file the prolog named: a request elsewhere would be lost."""
    sim, log = _epilog_job(str(tmp_path), "--events", str(tmp_path / "mine.jsonl"))
    started = lambda e: Path(log).exists()  # noqa: E731
    attempts = sim.run(preempt=[started], max_attempts=1)
    assert attempts[0].state == "PREEMPTED" and sim.epilog_requeues == 0
    assert Path(sim.requests).read_text().splitlines() == ["requeue 4242"]
    recs = [json.loads(x) for x in (tmp_path / "mine.jsonl").read_text().splitlines()]
    assert [r["by"] for r in recs if r["event"] == "requeue"] == ["slurmiso"]


def test_a_request_that_cannot_be_written_is_a_requeue_by_the_wrapper(tmp_path) -> None:
    """The epilog acts only on what it can read: if the request cannot be written, the
    wrapper requeues itself rather than lose the job."""
    sim, log = _epilog_job(str(tmp_path))
    (tmp_path / "blocker").write_text("")  # a file where the events file's directory would be
    sim.events_file = str(tmp_path / "blocker" / "events.jsonl")
    started = lambda e: Path(log).exists()  # noqa: E731
    attempts = sim.run(preempt=[started], max_attempts=1)
    assert attempts[0].state == "PREEMPTED" and sim.epilog_requeues == 0
    assert Path(sim.requests).read_text().splitlines() == ["requeue 4242"]
