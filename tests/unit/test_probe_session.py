"""The session's judgement of one run from hand-made files and job facts: a run interrupted
from outside the probe (requeued, signalled) is invalid, never a half-measured figure."""

from __future__ import annotations

import json
from typing import List, Optional

import pytest

from slurmiso.errors import ProbeError, SlurmError
from slurmiso.probe.launch import ENDED
from slurmiso.probe.session import Options, Outcome, RunInvalid, Session

STEPS = "\n".join(["0.2"] * 5) + "\n"
CLEAN = {"exit_code": 0, "stopped": True, "stop_cause": "stop-file", "seconds": 3.0,
         "restart_count": 0, "start_no": 1}


class FactsLauncher:
    """A launcher that started nothing: every run has ended; Slurm's restart count is given."""

    where = "slurm"

    def __init__(self, restarts: Optional[int] = 0, fails: bool = False) -> None:
        self._restarts = restarts
        self.fails = fails
        self.cancelled: List[str] = []

    def state(self, handle: str) -> str:
        return ENDED

    def restarts(self, handle: str) -> Optional[int]:
        if self.fails:
            raise SlurmError("squeue: slurmctld not responding")
        return self._restarts

    def cancel(self, handle: str) -> None:
        self.cancelled.append(handle)

    def describe(self, handle: str) -> str:
        return f"job {handle}"


def outcome(tmp_path, starts: int = 1, started_count: int = 0, result=None,
            output: str = STEPS) -> Outcome:
    base = tmp_path / "mps-solo-train"
    paths = {k: f"{base}.{ext}" for k, ext in (
        ("output", "out"), ("times", "times"), ("stderr", "err"), ("started", "started.json"),
        ("result", "result.json"), ("starts", "starts"), ("stop", "stop"), ("ready", "ready"))}
    paths["slurm_out"] = f"{base}.slurm.out"
    with open(paths["output"], "w") as fh:
        fh.write(output)
    with open(paths["starts"], "w") as fh:
        for n in range(starts):
            fh.write(json.dumps({"node": "n2", "restart_count": n, "start_no": n + 1}) + "\n")
    o = Outcome("mps-solo-train", "train", "4242", paths)
    o.started = {"node": "n2", "restart_count": started_count}
    o.result = dict(CLEAN if result is None else result)
    return o


def session(tmp_path, launcher: FactsLauncher) -> Session:
    return Session(launcher, str(tmp_path), Options(train_cmd="python step.py", poll_s=0.01))


def test_a_clean_run_is_judged_by_its_figures(tmp_path) -> None:
    s, o = session(tmp_path, FactsLauncher()), outcome(tmp_path)
    assert s.interrupted(o) == ""
    s.judge(o)
    assert o.parsed.steps == [0.2] * 5


@pytest.mark.parametrize("starts, started_count, slurm_count, facts", [
    (2, 1, 1, "it started 2 times (%s) and Slurm's restart count is 1"),
    (2, 0, None, "it started 2 times (%s)"),  # slurmctld forgot the job; the files tell
    (1, 1, 0, "Slurm's restart count is 1"),  # the second start rewrote started.json
    (1, 0, 2, "Slurm's restart count is 2"),  # requeued, not started again yet
])
def test_a_requeued_run_is_invalid_with_the_evidence(tmp_path, starts: int, started_count: int,
                                                     slurm_count: Optional[int],
                                                     facts: str) -> None:
    s = session(tmp_path, FactsLauncher(restarts=slurm_count))
    o = outcome(tmp_path, starts=starts, started_count=started_count)
    with pytest.raises(RunInvalid) as err:
        s.judge(o)
    msg = str(err.value)
    assert ("--train-cmd 'python step.py' (probe run mps-solo-train, job 4242) was requeued "
            "mid-probe (preempted, or its node failed): " + (
                facts % o.paths["starts"] if "%s" in facts else facts)) in msg
    assert "are from an interrupted run and are not used" in msg
    assert o.paths["output"] in msg and o.paths["slurm_out"] in msg
    assert o.parsed.steps == []  # never parsed into figures
    assert isinstance(err.value, ProbeError)  # one clear error where a caller does not know


def test_a_requeue_is_seen_even_without_a_result(tmp_path) -> None:
    s = session(tmp_path, FactsLauncher(restarts=1))
    o = outcome(tmp_path, result={})
    with pytest.raises(RunInvalid, match="was requeued mid-probe"):
        s.judge(o)


def test_a_signal_from_outside_is_invalid_and_the_probes_own_cancel_is_not(tmp_path) -> None:
    signalled = dict(CLEAN, stop_cause="signal", exit_code=0, seconds=1.5)
    s = session(tmp_path, FactsLauncher())
    o = outcome(tmp_path, result=signalled)
    with pytest.raises(RunInvalid, match=r"was ended by a signal from outside the probe after "
                                         r"1.5s \(scancel, preemption or a node shutdown\)"):
        s.judge(o)
    s.cancel(o)  # the session ended it itself (a stop file not obeyed): judged as usual
    assert s.interrupted(o) == "" and o.handle in s.launcher.cancelled
    s.judge(o)
    assert o.parsed.steps == [0.2] * 5


def test_slurm_not_answering_leaves_the_files_to_decide(tmp_path) -> None:
    s = session(tmp_path, FactsLauncher(fails=True))
    assert s.interrupted(outcome(tmp_path)) == ""
    assert "started 2 times" in s.interrupted(outcome(tmp_path, starts=2))


class RunningLauncher(FactsLauncher):
    """The run is listed as running and never prints a step."""

    def state(self, handle: str) -> str:
        return "running"


def test_a_run_requeued_before_its_first_step_is_invalid_not_silent(tmp_path) -> None:
    s = Session(RunningLauncher(restarts=1), str(tmp_path),
                Options(train_cmd="python step.py", poll_s=0.01, ready_timeout_s=0.05))
    o = outcome(tmp_path, output="")
    with pytest.raises(RunInvalid, match="was requeued mid-probe .*Slurm's restart count is 1"):
        s.wait_ready(o)
    s2 = Session(RunningLauncher(restarts=0), str(tmp_path),
                 Options(train_cmd="python step.py", poll_s=0.01, ready_timeout_s=0.05))
    with pytest.raises(ProbeError, match="printed no step within 0.05s") as err:
        s2.wait_ready(outcome(tmp_path, output=""))
    assert not isinstance(err.value, RunInvalid)
