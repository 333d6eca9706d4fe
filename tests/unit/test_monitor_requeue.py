"""The requeue delay: a preempted training job comes back with a BeginTime ~120 s ahead; the
monitor starts it (StartTime=now) once the preempting job runs, within the start budget."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import replace
from typing import List

from test_monitor_scenarios import BASE, T0, FakeCluster

from slurmiso.monitor.action import Action
from slurmiso.monitor.apply import Applier
from slurmiso.monitor.decide import decide
from slurmiso.monitor.policy import Memory
from slurmiso.monitor.snapshot import JobInfo
from slurmiso.state import Journal

#: The release is off by default (it can start a job whose Prolog slurmd skips); on here.
RELEASING = replace(BASE, release_requeue_delay=True)


def test_the_release_is_off_by_default() -> None:
    from slurmiso.monitor.policy import Policy

    assert Policy().release_requeue_delay is False


def _cycle(c: FakeCluster, ts: float, mem: Memory, journal: Journal) -> List[Action]:
    actions, new = decide(c.snapshot(ts), RELEASING, mem)
    for o in Applier(None, c, journal).apply(actions):
        assert o.ok
    mem.__dict__.update(new.__dict__)
    return actions


def test_requeued_training_starts_once_the_preemptor_runs(tmp_path: os.PathLike[str]) -> None:
    journal = Journal(os.path.join(str(tmp_path), "journal.jsonl"))
    c = FakeCluster(["n1"], {"shared": ["n1"], "infer": ["n1"]})
    c.jobs["7"] = JobInfo("7", "RUNNING", "train", ("shared",), "train", T0 - 900,
                          nodes=("n1",))
    mem = Memory()
    assert _cycle(c, T0, mem, journal) == []
    # preempted: requeued with a BeginTime, the inference job not started yet
    c.jobs["7"] = dataclasses.replace(c.jobs["7"], state="PENDING", nodes=(),
                                      reason="BeginTime", begin_ts=T0 + 150)
    c.submit("50", cls="infer", part="infer", ts=T0 + 20, reason="Resources")
    assert _cycle(c, T0 + 30, mem, journal) == [], "the preempting job still waits"
    assert "7" in mem.requeued
    c.jobs["50"] = dataclasses.replace(c.jobs["50"], state="RUNNING", nodes=("n1",))
    actions = _cycle(c, T0 + 60, mem, journal)
    assert [(a.kind, a.target) for a in actions] == [("begin-now", "7")]
    assert c.jobs["7"].reason == "Priority" and c.calls[-1] == ("update", 1)
    assert _cycle(c, T0 + 90, mem, journal) == [] and not mem.requeued
    lines = [r for r in journal.read() if r.get("action") == "begin-now"]
    assert len(lines) == 1 and lines[0]["details"]["waited_s"] == 30.0


def test_user_begin_times_are_left_alone() -> None:
    """A job submitted with --begin (never ran) is not a requeued one."""
    c = FakeCluster(["n1"], {"shared": ["n1"]})
    c.submit("8", reason="BeginTime")
    mem = Memory()
    for i in range(3):
        actions, mem = decide(c.snapshot(T0 + 30 * i), RELEASING, mem)
        assert actions == []


def test_begin_now_shares_the_start_budget() -> None:
    c = FakeCluster(["n1"], {"shared": ["n1"]})
    for i in range(10):
        c.jobs[str(i)] = JobInfo(str(i), "RUNNING", "train", ("shared",), "train", T0 - 900,
                                 nodes=("n1",))
    _, mem = decide(c.snapshot(T0), RELEASING, Memory())
    for i in range(10):
        c.jobs[str(i)] = dataclasses.replace(c.jobs[str(i)], state="PENDING", nodes=(),
                                             reason="BeginTime", priority=float(i))
    actions, mem = decide(c.snapshot(T0 + 30), RELEASING, mem)
    assert [a.target for a in actions] == ["9", "8", "7", "6"], "budget 4, by priority"
