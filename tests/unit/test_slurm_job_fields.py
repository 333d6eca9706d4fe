"""``SlurmCli.job_fields``: the hooks' one way to ask slurmctld about a job, reading only
fields Slurm makes itself (``scontrol show job -o`` prints the submitter's comment, paths and
command unquoted after ``QOS=`` and ``JobState=``: measured on 22.05.8, a train job with
``--comment "x QOS=infer JobState=RUNNING"`` read as QoS infer and RUNNING)."""

from __future__ import annotations

from typing import Any, List, Optional, Sequence

import pytest

from slurmiso.errors import SlurmError
from slurmiso.slurm import client
from slurmiso.slurm.client import JOB_FIELDS, SlurmCli, parse_kv_line


def _answer(monkeypatch: Any, out: str = "", fail: str = "") -> List[Sequence[str]]:
    seen: List[Sequence[str]] = []

    def run(self: Any, cmd: str, args: Sequence[str], timeout: Optional[float] = None,
            env: Any = None) -> str:
        seen.append([cmd, *args])
        assert env is not None and env["SLURM_TIME_FORMAT"] == "standard"
        assert not any(k.startswith("SQUEUE_") for k in env)
        if fail:
            raise SlurmError(fail)
        return out

    monkeypatch.setattr(client.SlurmCli, "run", run)
    return seen


def test_the_old_reader_is_forged_by_a_comment_the_new_one_asks_no_user_text() -> None:
    line = ("JobId=7 JobName=t UserId=u(1) GroupId=u(1) MCS_label=N/A Priority=1 Nice=0 "
            "Account=a QOS=train JobState=PENDING Reason=None Command=(null) WorkDir=/w "
            "Comment=x QOS=infer JobState=RUNNING StdErr=/w/e StdOut=/w/o")
    # keys are read where they first appear, so QOS and JobState hold; but a key Slurm
    # prints after the comment is the comment's to write: why the hooks never read it
    assert parse_kv_line(line)["QOS"] == "train"
    line = line.replace("RUNNING StdErr", "RUNNING StdOut=/etc/shadow StdErr")
    assert parse_kv_line(line)["StdOut"] == "/etc/shadow"
    assert not JOB_FIELDS & {"JobName", "Comment", "WorkDir", "StdOut", "StdErr", "Command",
                             "AdminComment", "Reason", "NodeList"}


def test_fields_are_read_by_position(monkeypatch: Any) -> None:
    seen = _answer(monkeypatch, "train".ljust(64) + "RUNNING".ljust(64) + "\n")
    assert SlurmCli().job_fields("42", ("QOS", "State")) == {"QOS": "train", "State": "RUNNING"}
    assert seen[0] == ["squeue", "-h", "-t", "all", "-j", "42", "-O", "QOS:64,State:64"]


@pytest.mark.parametrize("out", [
    "train\n",  # a field missing
    "train RUNNING extra\n",  # a field too many
    "x" * 64 + "RUNNING\n",  # a value as wide as its column: it may be cut
    "train".ljust(64) + "RUNNING\n" + "infer".ljust(64) + "RUNNING\n",  # two rows
])
def test_odd_output_is_an_error_never_a_guess(monkeypatch: Any, out: str) -> None:
    _answer(monkeypatch, out)
    with pytest.raises(SlurmError):
        SlurmCli().job_fields("42", ("QOS", "State"))


def test_a_job_slurmctld_forgot_is_none(monkeypatch: Any) -> None:
    _answer(monkeypatch, fail="squeue -j 42 failed: slurm_load_jobs error: Invalid job id "
                              "specified")
    assert SlurmCli().job_fields("42", ("State",)) is None
    _answer(monkeypatch, "")
    assert SlurmCli().job_fields("42", ("State",), node="n1") is None


def test_only_slurms_own_fields_and_job_ids(monkeypatch: Any) -> None:
    _answer(monkeypatch, "x\n")
    with pytest.raises(ValueError):
        SlurmCli().job_fields("42", ("Comment",))
    with pytest.raises(SlurmError):
        SlurmCli().job_fields("42 -u root", ("State",))


def test_a_hostile_comment_and_name_never_reach_the_answer() -> None:
    """The comment and name a job's user wrote, newlines, ``|`` and Slurm's own keys in them,
    as squeue would print them were they asked for: job_fields never asks."""
    from tests.slurmtext import FakeSqueue, job

    hostile = "x\nQOS=infer JobState=RUNNING\n" + "infer".ljust(64) + "RUNNING|7\t"
    fake = FakeSqueue([job("7", "PENDING", qos="train", comment=hostile, name=hostile),
                       job("8", "RUNNING", qos="infer")])
    facts = client.job_fields(fake, "7", ("QOS", "State", "RestartCnt"))
    assert facts == {"QOS": "train", "State": "PENDING", "RestartCnt": "0"}
    assert not any(n in fake.calls[0][-1] for n in ("Comment", "Name", "WorkDir"))
