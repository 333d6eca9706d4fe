"""``SlurmCli``'s operations on running jobs (the monitor's ladder): the exact command lines,
and "already so" / "ended" as answers, not failures; the applier journals them."""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence

import pytest

from slurmiso.errors import SlurmError
from slurmiso.monitor.action import Action
from slurmiso.monitor.apply import Applier
from slurmiso.slurm import client
from slurmiso.slurm.client import SlurmCli


def _slurm(monkeypatch: Any, fail: Optional[Dict[str, str]] = None) -> List[List[str]]:
    seen: List[List[str]] = []

    def run(self: Any, cmd: str, args: Sequence[str], timeout: Optional[float] = None,
            env: Any = None) -> str:
        seen.append([cmd, *args])
        for word, msg in (fail or {}).items():
            if word in args:
                raise SlurmError(f"{cmd} {' '.join(args)} failed: {msg}")
        return ""

    monkeypatch.setattr(client.SlurmCli, "run", run)
    return seen


def test_command_lines(monkeypatch: Any) -> None:
    seen = _slurm(monkeypatch)
    cli = SlurmCli()
    assert cli.signal_job("7", "URG") == "done"
    assert cli.signal_job("7", "WINCH") == "done"
    cli.suspend("7")
    cli.resume_job("7")
    cli.requeue_job("7", resume_first=True)
    # the steps (a wrapper under srun), then the batch script and its children (one without):
    # --full alone never reached a step's tasks on 22.05.8 (measured)
    assert seen == [["scancel", "--signal=URG", "7"], ["scancel", "--signal=URG", "--full", "7"],
                    ["scancel", "--signal=28", "7"],  # 22.05: "Unknown job signal: WINCH"
                    ["scancel", "--signal=28", "--full", "7"],
                    ["scontrol", "suspend", "7"], ["scontrol", "resume", "7"],
                    ["scontrol", "resume", "7"], ["scontrol", "requeue", "7"]]


def test_signal_to_an_ended_job_is_gone_once(monkeypatch: Any) -> None:
    seen = _slurm(monkeypatch, {"--signal=URG": "Job/step already completing or completed"})
    assert SlurmCli().signal_job("7", "URG") == "gone"
    assert seen == [["scancel", "--signal=URG", "7"]]


@pytest.mark.parametrize("op,msg,answer", [
    ("suspend", "Job is not running", "already"),
    ("resume", "Job is not suspended", "already"),
    ("requeue", "Job is pending execution", "already"),
    ("suspend", "Job/step already completing or completed", "gone"),
    ("requeue", "Invalid job id specified", "gone"),
])
def test_already_so_and_ended_are_answers(monkeypatch: Any, op: str, msg: str,
                                          answer: str) -> None:
    _slurm(monkeypatch, {op: msg})
    cli = SlurmCli()
    call = {"suspend": cli.suspend, "resume": cli.resume_job, "requeue": cli.requeue_job}[op]
    assert call("7") == answer


def test_other_refusals_are_clear_errors(monkeypatch: Any) -> None:
    _slurm(monkeypatch, {"requeue": "Requested operation is presently disabled"})
    with pytest.raises(SlurmError, match="requeue 7 failed: Requested operation"):
        SlurmCli().requeue_job("7")


class _Journal:
    def __init__(self) -> None:
        self.lines: List[Dict[str, Any]] = []

    def append(self, event: str, **fields: Any) -> None:
        self.lines.append(dict(fields, event=event))


def test_applier_runs_each_kind_and_journals_notes_and_failures(monkeypatch: Any) -> None:
    seen = _slurm(monkeypatch, {"resume": "Job is not suspended",
                                "suspend": "Access/permission denied"})
    j = _Journal()
    rec = {"node": "n1", "gpu": 0}
    acts = [Action("throttle", "5", "slow", {"sends": "URG", "restraint": rec}),
            Action("suspend", "5", "stop", {"restraint": rec}),
            Action("requeue", "6", "requeue", {"restraint": rec, "suspended": False}),
            Action("resume-job", "7", "calm", {"restraint": rec}),
            Action("ladder-end", "8", "ended", {"restraint": rec})]
    out = Applier(None, SlurmCli(), j).apply(acts)
    assert [o.ok for o in out] == [True, False, True, True, True]
    assert "permission denied" in out[1].error
    assert out[3].note == "Slurm shows the job as asked already"
    assert [ln["action"] for ln in j.lines] == ["throttle", "suspend", "requeue",
                                                "resume-job", "ladder-end"]
    assert j.lines[3]["note"] and j.lines[1]["error"]
    assert ["scontrol", "requeue", "6"] in seen and not any("8" in c for c in seen)
    calls = len(seen)  # the throttle is two scancel calls (steps, then the batch script)
    dry = Applier(None, SlurmCli(), _Journal()).apply(acts, dry_run=True)
    assert all(o.ok for o in dry) and len(seen) == calls == 5, "dry run: no Slurm call"
