"""Late and lost epilogs of a requeued job's earlier attempt (issue 13 follow-up, issue 14).

Measured on 22.05: an Epilog's ``SLURM_JOB_RESTART_COUNT`` is the job's count when it runs,
so a requeued attempt's own epilog shows the next count, and an earlier attempt's epilog that
runs after the next attempt's prolog shows that attempt's count. The record counts the
epilog it still owes (``late_epilogs``). When that epilog never comes (slurmd died during
it), the attempt's own epilog must still release: these tests lose it and count what is
left (instances, records, claims, fence files).
"""

from __future__ import annotations

from typing import Any, List, Optional, Sequence

import pytest

from slurmiso.errors import SlurmError
from slurmiso.gpu.sim import SimBackend
from slurmiso.hooks import runner
from slurmiso.isolation import fence
from slurmiso.state import NodeState
from tests.hookctx import Drains
from tests.killrounds import NODE, hook_env, leftovers, setup_node


class Slurmctld:
    """What ``scontrol show job`` would say; records every question (None: no answer)."""

    def __init__(self, answer: Optional[bool]) -> None:
        self.answer = answer
        self.asked: List[tuple] = []

    def __call__(self, job_id: str, node: str, attempt: int) -> Optional[bool]:
        self.asked.append((job_id, node, attempt))
        return self.answer


def _world(tmp: str, monkeypatch: Any, answer: Optional[bool]) -> tuple:
    cfg = setup_node(tmp)
    ctld = Slurmctld(answer)
    monkeypatch.setattr(runner, "attempt_running", ctld)  # never the real scontrol
    return cfg, ctld


def _hook(phase: str, tmp: str, cfg: str, attempt: int) -> int:
    env = hook_env(tmp, cfg, "42", 0, 0)
    env["SLURM_JOB_RESTART_COUNT"] = str(attempt)
    drains = Drains()
    rc = runner.run_hook(phase, env, cfg, drains)
    assert drains.calls == []
    return rc


def _fence_left(tmp: str) -> bool:
    return fence.read_rules(f"{tmp}/state/{NODE}", "42") is not None


def _requeued_with_epilog_lost(tmp: str, cfg: str) -> None:
    assert _hook("prolog", tmp, cfg, 0) == 0
    # attempt 0 is requeued; its epilog never arrives (slurmd died while it ran)
    assert _hook("prolog", tmp, cfg, 1) == 0
    rec = NodeState(f"{tmp}/state/{NODE}").read_job("42")
    assert rec is not None and rec.restart_count == 1 and rec.late_epilogs == 1
    assert len(SimBackend(f"{tmp}/sim/{NODE}.json").instances()) == 1  # attempt 0's is gone


def test_late_epilog_of_an_earlier_attempt_keeps_the_running_attempt(tmp_path: Any,
                                                                      monkeypatch: Any) -> None:
    tmp = str(tmp_path)
    cfg, ctld = _world(tmp, monkeypatch, answer=True)  # slurmctld: attempt 1 runs here
    _requeued_with_epilog_lost(tmp, cfg)
    # ... it was only late: attempt 0's epilog, with attempt 1's count
    assert _hook("epilog", tmp, cfg, 1) == 0
    assert ctld.asked == [("42", NODE, 1)]
    rec = NodeState(f"{tmp}/state/{NODE}").read_job("42")
    assert rec is not None and rec.status == "ready" and rec.late_epilogs == 0
    assert len(SimBackend(f"{tmp}/sim/{NODE}.json").instances()) == 1 and _fence_left(tmp)
    # attempt 1's own epilog (it completed: same count) releases without asking again
    assert _hook("epilog", tmp, cfg, 1) == 0
    assert len(ctld.asked) == 1
    assert leftovers(tmp) == [] and not _fence_left(tmp)


def test_lost_epilog_then_the_attempt_is_requeued_leaks_nothing(tmp_path: Any,
                                                                monkeypatch: Any) -> None:
    """The next attempt's epilog shows count 2: attempt 1 is over, whatever skip it owed."""
    tmp = str(tmp_path)
    cfg, ctld = _world(tmp, monkeypatch, answer=True)
    _requeued_with_epilog_lost(tmp, cfg)
    assert _hook("epilog", tmp, cfg, 2) == 0
    assert ctld.asked == []  # no question needed
    assert leftovers(tmp) == [] and not _fence_left(tmp)


def test_lost_epilog_then_the_attempt_ends_leaks_nothing(tmp_path: Any,
                                                         monkeypatch: Any) -> None:
    """Same count, a skip owed: slurmctld says the attempt no longer runs, so this epilog is
    its own and releases (the old code spent the skip here and leaked the instance)."""
    tmp = str(tmp_path)
    cfg, ctld = _world(tmp, monkeypatch, answer=False)
    _requeued_with_epilog_lost(tmp, cfg)
    assert _hook("epilog", tmp, cfg, 1) == 0
    assert ctld.asked == [("42", NODE, 1)]
    assert leftovers(tmp) == [] and not _fence_left(tmp)


def test_unknown_keeps_the_record_and_the_next_prolog_sweeps_it(tmp_path: Any,
                                                                 monkeypatch: Any) -> None:
    """slurmctld does not answer: a running job's isolation outranks a leak, so the record
    stays; the job's next prolog on this node (or reconcile) cleans it."""
    tmp = str(tmp_path)
    cfg, _ctld = _world(tmp, monkeypatch, answer=None)
    _requeued_with_epilog_lost(tmp, cfg)
    assert _hook("epilog", tmp, cfg, 1) == 0
    assert NodeState(f"{tmp}/state/{NODE}").read_job("42") is not None
    assert _hook("prolog", tmp, cfg, 2) == 0 and _hook("epilog", tmp, cfg, 3) == 0
    assert leftovers(tmp) == []


def test_an_epilog_of_an_older_count_never_touches_the_record(tmp_path: Any,
                                                              monkeypatch: Any) -> None:
    """On a Slurm whose epilog shows its own attempt's count, the earlier one is told apart
    by the count alone."""
    tmp = str(tmp_path)
    cfg, ctld = _world(tmp, monkeypatch, answer=False)
    _requeued_with_epilog_lost(tmp, cfg)
    assert _hook("epilog", tmp, cfg, 0) == 0
    assert ctld.asked == []
    rec = NodeState(f"{tmp}/state/{NODE}").read_job("42")
    assert rec is not None and rec.status == "ready" and rec.late_epilogs == 0
    assert _hook("epilog", tmp, cfg, 1) == 0 and leftovers(tmp) == []


def _squeue(monkeypatch: Any, out: str, seen: Optional[List[Sequence[str]]] = None) -> None:
    """slurmctld's answer as squeue prints it (each field padded to its width)."""
    from slurmiso.slurm import client

    def run(self: Any, cmd: str, args: Sequence[str], timeout: Optional[float] = None,
            env: Any = None) -> str:
        assert cmd == "squeue" and env is not None and env["SLURM_TIME_FORMAT"] == "standard"
        if seen is not None:
            seen.append(list(args))
        return out

    monkeypatch.setattr(client.SlurmCli, "run", run)


def _row(*values: str) -> str:
    return "".join(v.ljust(64) for v in values) + "\n"


@pytest.mark.parametrize("out, expect", [
    (_row("RUNNING", "1"), True),
    (_row("CONFIGURING", "1"), True),
    (_row("COMPLETING", "1"), False),
    (_row("RUNNING", "2"), False),  # a later attempt
    ("", False),  # squeue -w node1 lists it not: not on this node, or forgotten
    (_row("RUNNING"), None),  # no restart count: cannot tell, never guessed
    (_row("RUNNING", "1") + _row("RUNNING", "1"), None),  # two rows for one id
])
def test_attempt_running_reads_squeue(monkeypatch: Any, out: str,
                                      expect: Optional[bool]) -> None:
    seen: List[Sequence[str]] = []
    _squeue(monkeypatch, out, seen)
    assert runner.attempt_running("42", "node1", 1) is expect
    assert seen and seen[0][-2:] == ["-w", "node1"] and "42" in seen[0]


def test_attempt_running_is_unknown_when_slurmctld_fails(monkeypatch: Any) -> None:
    from slurmiso.slurm import client

    def fail(self: Any, cmd: str, args: Sequence[str], timeout: Optional[float] = None,
             env: Any = None) -> str:
        raise SlurmError("squeue: timed out")

    monkeypatch.setattr(client.SlurmCli, "run", fail)
    assert runner.attempt_running("42", "node1", 1) is None
