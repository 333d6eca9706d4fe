"""Training step times: report_step in a real program under a real ``slurmiso run``, folded
into the step file the prolog named, read by the agent as root, removed by the epilog; the
step file read as hostile input (issue 24)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from typing import Any, Dict

import pytest

from slurmiso import checkpoint
from slurmiso.agent import stepfile
from slurmiso.exposition import job_series as sig
from slurmiso.hooks.runner import run_hook
from slurmiso.wrapper import steps
from tests.hookctx import Drains, job_env, state, write_config
from tests.unit.test_job_signals import signals_of

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

#: 20 steps alone, then 10 slowed by a neighbour. The step times are given, not slept: a
#: busy machine's sleeps overshoot unevenly, and no figure here may depend on its speed. The
#: first call starts the clock, as a program's first report_step() does.
PROGRAM = """
from slurmiso import checkpoint
checkpoint.report_step(samples=8)
for i in range(1, 31):
    checkpoint.report_step(seconds=0.02 if i <= 20 else 0.08, samples=8)
"""


def _env(extra: Dict[str, str]) -> Dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM", "SPANK"))}
    env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
    env.update(extra)
    return env


def test_report_step_through_the_wrapper_into_the_agents_output(tmp_path: Any) -> None:
    tmp = str(tmp_path)
    work = os.path.join(tmp, "work")
    os.makedirs(work)
    cfg = write_config(tmp, "timeslice", monitor={"signals": {"baseline_steps": 10}})
    env = job_env(job="42", qos="train", SLURM_JOB_WORK_DIR=work)
    assert run_hook("prolog", env, cfg, Drains()) == 0
    rec = state(tmp).read_job("42")
    assert rec is not None and rec.status == "ready"
    assert rec.steps_file == os.path.join(work, ".slurmiso-steps.42.json")
    assert rec.env["SLURMISO_STEPS_FILE"] == rec.steps_file

    step_env = _env({"SLURM_JOB_ID": "42", "SLURMD_NODENAME": "node1", "SLURM_PROCID": "0",
                     "SLURMISO_CONFIG": cfg, **rec.env})
    cp = subprocess.run([sys.executable, "-m", "slurmiso", "run", "--", sys.executable, "-c",
                         PROGRAM], cwd=work, env=step_env, capture_output=True, text=True,
                        timeout=60)
    assert cp.returncode == 0, cp.stderr
    with open(rec.steps_file) as fh:
        folded = json.load(fh)
    assert folded["job"] == "42" and folded["steps"] == 31 and folded["samples"] == 31 * 8
    assert len(folded["first"]) == 30, "the first call only starts the clock"
    assert not os.path.exists(steps.report_path_for(rec.steps_file)), "the report is gone"

    agent = subprocess.run([sys.executable, "-m", "slurmiso", "--config", cfg, "agent",
                            "--once", "--node", "node1"], env=_env({}), capture_output=True,
                           text=True, timeout=60)
    assert agent.returncode == 0, agent.stderr
    js = signals_of(agent.stdout, "node1")["42"]
    assert js.job_class == "train" and js.unknown == ()
    # 20 steps of 0.02 s then 10 of 0.08 s: the mean is above 0.02 s, and slower than the
    # baseline of the first steps
    assert js.step_s is not None and js.step_s > 0.025
    assert js.throughput_vs_solo is not None and 0.0 < js.throughput_vs_solo < 1.0
    # an age since the step file was written, not since the epoch or boot: an hour tells
    # them apart on any machine (the file is seconds old)
    assert js.steps_age_s is not None and 0 <= js.steps_age_s < 3600
    assert js.latency_age_s is None, "a training job is not asked for latency"
    assert 'slurmiso_job_steps_total{class="train",job="42"} 31.0' in agent.stdout

    assert run_hook("epilog", env, cfg, Drains()) == 0
    assert not os.path.exists(rec.steps_file), "the epilog removes the job's step file"


def _write(path: str, data: Any) -> None:
    with open(path, "w") as fh:
        fh.write(data if isinstance(data, str) else json.dumps(data))


GOOD = {"v": 1, "job": "42", "ts": 1000.0, "steps": 100, "samples": 0,
        "first": [0.1] * 20, "recent": [[990.0, 10, 2.0], [995.0, 10, 3.0], [100.0, 99, 99.0]]}


def _figures(path: str, uid: int = -1) -> stepfile.StepFigures:
    return stepfile.figures(path, "42", os.getuid() if uid == -1 else uid, 1000.0, 60.0, 20)


def test_step_figures_from_the_window_and_the_baseline(tmp_path: Any) -> None:
    path = str(tmp_path / "s.json")
    _write(path, GOOD)
    f = _figures(path)
    assert f.reason == "" and f.steps_total == 100
    assert f.step_s == pytest.approx(5.0 / 20)  # the interval at t=100 is out of the window
    assert f.throughput_vs_solo == pytest.approx(0.1 / 0.25)
    _write(path, {**GOOD, "first": [0.1] * 19})
    assert _figures(path).throughput_vs_solo is None, "fewer than baseline_steps: no baseline"
    _write(path, {**GOOD, "recent": []})
    assert _figures(path).step_s is None


@pytest.mark.parametrize("content, reason", [
    ("not json", sig.R_BAD_FILE),
    ("[" * 60000, sig.R_BAD_FILE),  # deep nesting, under the size cap
    ({**GOOD, "v": 2}, sig.R_BAD_FILE),
    ({**GOOD, "job": "43"}, sig.R_BAD_FILE),  # another job's file
    ({**GOOD, "steps": "many"}, sig.R_BAD_FILE),
    ({**GOOD, "steps": float("nan")}, sig.R_BAD_FILE),
    ({**GOOD, "recent": [[1, 2]]}, sig.R_BAD_FILE),
    ({**GOOD, "recent": [[1, 2, 3]] * 1000}, sig.R_BAD_FILE),
    ({**GOOD, "first": [0.1] * 1000}, sig.R_BAD_FILE),
    ("x" * (steps.MAX_FILE_BYTES + 1), sig.R_REFUSED),
], ids=["text", "deep", "version", "other-job", "steps-text", "steps-nan", "short-interval",
        "too-many-intervals", "too-many-first", "too-big"])
def test_a_bad_step_file_is_unknown_with_a_reason(tmp_path: Any, content: Any,
                                                  reason: str) -> None:
    path = str(tmp_path / "s.json")
    _write(path, content)
    f = _figures(path)
    assert f.reason == reason and f.step_s is None and f.steps_total is None


def test_the_agent_never_follows_a_symlink_or_blocks_on_a_fifo(tmp_path: Any) -> None:
    target = str(tmp_path / "other.json")
    _write(target, GOOD)
    link = str(tmp_path / "link.json")
    os.symlink(target, link)
    assert _figures(link).reason == sig.R_REFUSED
    fifo = str(tmp_path / "fifo.json")
    os.mkfifo(fifo)
    assert _figures(fifo).reason == sig.R_REFUSED  # returns at once: O_NONBLOCK
    assert _figures(str(tmp_path / "missing.json")).reason == sig.R_NO_REPORT
    assert _figures(str(tmp_path)).reason == sig.R_REFUSED  # a directory


def test_a_file_of_another_uid_is_not_the_jobs(tmp_path: Any) -> None:
    path = str(tmp_path / "s.json")
    _write(path, GOOD)
    assert _figures(path, uid=os.getuid() + 1).reason == sig.R_REFUSED


def test_the_folder_adds_up_successive_program_processes(tmp_path: Any) -> None:
    series = str(tmp_path / ".slurmiso-steps.42.json")
    clock = [100.0]
    folder = steps.StepFolder(series, "42", clock=lambda: clock[0])
    env = folder.start()
    report = env[steps.REPORT_ENV]

    def rep(pid: int, n: int, timed: int, secs: float, first: Any) -> None:
        _write(report, {"pid": pid, "steps": n, "timed": timed, "seconds": secs,
                        "samples": 0, "first": first})
        clock[0] += steps.FOLD_S
        folder.tick()

    rep(1, 10, 9, 0.9, [0.1] * 9)
    rep(1, 20, 19, 1.9, [0.1] * 19)
    rep(2, 5, 4, 2.0, [0.5] * 4)  # a new program process: its totals add on
    with open(series, "rb") as fh:
        data = steps.decode(fh.read())
    assert data["steps"] == 25 and data["first"] == [0.1] * 19
    assert [r[1:] for r in data["recent"]] == [(9, 0.9), (10, pytest.approx(1.0)), (4, 2.0)]
    _write(report, "garbage")
    clock[0] += steps.FOLD_S
    folder.tick()  # never raises
    folder.finish()
    assert not os.path.exists(report)


def test_report_step_never_raises_and_counts_outside_the_wrapper(
        tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(checkpoint, "_steps", checkpoint._Steps())
    monkeypatch.setenv(checkpoint.STEP_REPORT_ENV, str(tmp_path / "no" / "such" / "dir.json"))
    for _ in range(5):
        checkpoint.report_step(seconds=0.5, samples=2)
    checkpoint.report_step(seconds=float("nan"), samples=float("inf"))
    checkpoint.report_step(seconds="bad")  # type: ignore[arg-type]
    s = checkpoint._steps
    assert (s.steps, s.timed, s.seconds, s.samples) == (6, 5, 2.5, 10.0)
    assert s.failures >= 1 and not math.isnan(s.seconds)


def test_report_step_writes_at_most_once_a_second(tmp_path: Any,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(checkpoint, "_steps", checkpoint._Steps())
    path = tmp_path / "r.json"
    monkeypatch.setenv(checkpoint.STEP_REPORT_ENV, str(path))
    writes = []
    real = checkpoint._Steps.write
    monkeypatch.setattr(checkpoint._Steps, "write", lambda self: (writes.append(1),
                                                                   real(self)))
    for _ in range(1000):
        checkpoint.report_step()
    assert len(writes) == 1
    assert json.loads(path.read_text())["steps"] == 1
