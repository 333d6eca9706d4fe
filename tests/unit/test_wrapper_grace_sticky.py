"""Slurm 24.05+ keeps a preempted job's grace mark through ``scontrol requeue``: the
wrapper's requeues must not make Slurm run a finished job again (issue 12, seen on 24.11.5:
restart count 4 and a step counted twice after three preemptions).

The local controller plays both releases; the e2e tests run the real ``slurmiso run``.
"""

from __future__ import annotations

import json
import os
import re
import sys
from collections import Counter
from pathlib import Path
from typing import List, Optional, Sequence

import pytest

from slurmiso.errors import SlurmError
from slurmiso.wrapper import requeue
from tests.localsim import LocalSlurm, Trigger

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
WORKLOAD = os.path.join(ROOT, "slurmiso_sandbox", "train_counter.py")
ENV = {k: v for k, v in os.environ.items()
       if k not in ("SLURMISO_EVENTS_FILE", "SLURMISO_CKPT_DIR", "SLURM_VERSION")}
ENV["PYTHONPATH"] = ROOT


class Answers:
    """A Slurm client that answers ``scontrol --version`` and records every call."""

    def __init__(self, version: str = "", fail: bool = False) -> None:
        self.version, self.fail = version, fail
        self.calls: List[List[str]] = []

    def run(self, cmd: str, args: Sequence[str], timeout: Optional[float] = None) -> str:
        self.calls.append([cmd, *args])
        if self.fail:
            raise SlurmError("scontrol: error: Unable to contact slurm controller")
        return f"slurm {self.version}\n" if args[:1] == ["--version"] else ""


@pytest.mark.parametrize("version, expected", [
    ((22, 5, 8), False), ((23, 11, 10), False), ((24, 5, 0), True), ((24, 11, 5), True),
    ((26, 5, 5), True), (None, True),  # unknown: closed (a rerun of finished work costs more)
])
def test_close_needed_from_24_05_on_and_when_unknown(version, expected) -> None:
    assert requeue.needs_close(version) is expected


def test_version_from_the_job_env_first_then_scontrol() -> None:
    client = Answers("24.11.5")
    assert requeue.slurm_version(client, {"SLURM_VERSION": "22.05.8"}) == (22, 5, 8)
    assert client.calls == []
    assert requeue.slurm_version(client, {}) == (24, 11, 5)
    assert requeue.slurm_version(Answers(fail=True), {}) is None


def test_close_requeue_updates_the_job_and_reports_failure_as_reason() -> None:
    client = Answers()
    assert requeue.close_requeue(client, "77") is None
    assert client.calls == [["scontrol", "update", "JobId=77", "Requeue=0"]]
    why = requeue.close_requeue(Answers(fail=True), "77")
    assert why is not None and "Requeue=0" in why and "Unable to contact" in why


class Job:
    def __init__(self, tmp: str, release, steps: int = 120) -> None:
        self.log = os.path.join(tmp, "steps.log")
        self.events = os.path.join(tmp, "events.jsonl")
        argv = [sys.executable, "-m", "slurmiso", "run", "--grace", "3", "--events",
                self.events, "--ckpt-dir", os.path.join(tmp, "ckpt"), "--",
                sys.executable, WORKLOAD, "--log", self.log, "--steps", str(steps),
                "--step-time", "0.01"]
        self.sim = LocalSlurm(argv, env=ENV, workdir=tmp, grace_s=3.0, kill_wait_s=2.0,
                              release=release)

    def steps(self) -> List[int]:
        text = Path(self.log).read_text() if os.path.exists(self.log) else ""
        return [int(m) for m in re.findall(r"^step=(\d+) ", text, re.M)]

    def after_steps(self, n: int) -> Trigger:
        base: dict = {}

        def fire(elapsed: float) -> bool:
            count = len(self.steps())
            base.setdefault("n", count)
            return count - base["n"] >= n

        return fire

    def journal(self, event: str) -> List[dict]:
        with open(self.events) as fh:
            return [r for r in map(json.loads, filter(str.strip, fh)) if r["event"] == event]


@pytest.mark.slow
@pytest.mark.parametrize("release", [(24, 11, 5), (22, 5, 8)])
def test_thrice_preempted_job_ends_with_its_program_on_each_release(tmp_path, release) -> None:
    """Before the fix, 24.11 ran a fifth attempt (restart count 4) that redid the steps after
    the last checkpoint; 22.05 needs no update and gets none."""
    job = Job(str(tmp_path), release)
    attempts = job.sim.run(preempt=[job.after_steps(20) for _ in range(3)])
    assert [a.state for a in attempts] == ["PREEMPTED"] * 3 + ["COMPLETED"], attempts
    assert attempts[-1].restart_count == 3 and attempts[-1].exit_code == 0
    steps = job.steps()
    assert sorted(steps) == list(range(1, 121))
    assert not [s for s, n in Counter(steps).items() if n > 1]
    requests = Path(job.sim.requests).read_text().splitlines()
    closes = ["update JobId=4242 Requeue=0"] if release >= (24, 5, 0) else []
    assert requests == ["requeue 4242"] * 3 + closes
    closed = job.journal("requeue-closed")
    assert [(c["restart_count"], c["status"], c["ok"]) for c in closed] == \
        [(3, 0, True)] * len(closes)


@pytest.mark.slow
def test_without_the_close_24_11_runs_the_finished_job_again(tmp_path) -> None:
    """The controller itself reproduces the 24.11.5 sandbox trace when nothing turns the
    requeue off: the program's own end after a requeued preemption comes back PREEMPTED."""
    script = tmp_path / "job.sh"
    # requeues itself on SIGTERM (as the wrapper does) but never turns Requeue off
    script.write_text('#!/bin/bash\ntrap \'"$SLURMISO_SLURM_BIN"/scontrol requeue "$SLURM_JOB_ID"; exit 143\' TERM\n'
                      ': > trapped\n'
                      'if [ -z "$SLURM_RESTART_COUNT" ]; then sleep 30 & wait; fi\nexit 0\n')
    script.chmod(0o755)
    sim = LocalSlurm([str(script)], env=ENV, workdir=str(tmp_path), grace_s=3.0,
                     kill_wait_s=2.0, release=(24, 11, 5))
    # preempted once its trap is set (not 0.5 s in: a slow start would die of the SIGTERM)
    attempts = sim.run(preempt=[lambda elapsed: (tmp_path / "trapped").exists()])
    assert [a.state for a in attempts] == ["PREEMPTED", "PREEMPTED", "COMPLETED"]
    assert attempts[-1].restart_count == 2
