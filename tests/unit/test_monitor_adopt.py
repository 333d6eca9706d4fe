"""Restraints Slurm shows that the monitor's memory lost (slurmiso/monitor/adopt.py): a
monitor restarted with an empty memory ends them as it would its own, never leaves a job
suspended, parked or host-limited with nobody to release it."""

from __future__ import annotations

import dataclasses
from typing import Dict, List, Optional, Tuple

from slurmiso.monitor.action import Action
from slurmiso.monitor.decide import decide
from slurmiso.monitor.policy import Memory
from slurmiso.monitor.snapshot import Snapshot, dumps, loads
from slurmiso.restraints import Note, OnBound, RestraintStep
from tests.unit.test_monitor_ladder import CALM_MS, POL, T0, Cluster, drive


def note(step: RestraintStep, node: str = "n1", level: int = 0) -> Note:
    return Note(step, T0 - 600, node, 0, "i1", 1800, OnBound.RESUME, level)


class Noted(Cluster):
    """The Slurm stand-in whose jobs carry the notes Slurm would show (None: not read)."""

    def __init__(self, notes: Optional[Dict[str, Note]]) -> None:
        super().__init__(nodes=("n1", "n2"))
        self.notes = notes
        self.run_job("i1", "infer", p99=CALM_MS)
        self.run_job("t1", "train")

    def set_restraint_note(self, job: str, n: Optional[Note]) -> None:
        assert self.notes is not None
        if n is None:
            self.notes.pop(job, None)
        else:
            self.notes[job] = n

    def snapshot(self, ts: float) -> Snapshot:
        notes = None if self.notes is None else dict(self.notes)
        return dataclasses.replace(super().snapshot(ts), notes=notes)


def kinds(steps: List[List[Action]]) -> List[Tuple[int, str, str]]:
    return [(i, str(a.kind), a.target) for i, acts in enumerate(steps) for a in acts]


def test_a_suspend_the_memory_lost_is_resumed_and_unthrottled() -> None:
    """Calm: resumed after the release dwell, then unthrottled after the next, each line
    saying it was adopted; the note gone, the memory empty."""
    c = Noted({"t1": note(RestraintStep.SUSPEND)})
    c.jobs["t1"] = dataclasses.replace(c.jobs["t1"], state="SUSPENDED")
    steps, mem = drive(c, 8, POL)
    got = [(k, j) for _, k, j in kinds(steps)]
    assert got == [("resume-job", "t1"), ("unthrottle", "t1")]
    resume = next(a for s in steps for a in s if a.kind == "resume-job")
    assert "adopted to end it" in resume.details["restraint"]["why"]
    assert c.jobs["t1"].state == "RUNNING" and c.notes == {} and not mem.restrained
    assert not mem.ladder


def test_a_park_and_a_host_limit_the_memory_lost_are_released() -> None:
    c = Noted({"t1": note(RestraintStep.PARK)})
    c.run_job("t2", "train", gpu=1)
    c.notes["t2"] = note(RestraintStep.HOST_LIMIT, level=2)  # type: ignore[index]
    steps, mem = drive(c, 8, POL)
    got = [(k, j) for _, k, j in kinds(steps)]
    assert ("unpark", "t1") in got and ("host-unlimit", "t2") in got
    unlimit = next(a for s in steps for a in s if a.kind == "host-unlimit")
    assert unlimit.details["level"] == 0 and unlimit.details["from_level"] == 2
    assert c.notes == {} and not mem.restrained and not mem.host_limited


def test_nothing_is_adopted_where_the_notes_are_unknown_or_already_held() -> None:
    c = Noted(None)
    c.jobs["t1"] = dataclasses.replace(c.jobs["t1"], state="SUSPENDED")
    steps, mem = drive(c, 4, POL)
    assert kinds(steps) == [] and not mem.restrained, "notes not read: nothing to act on"
    c = Noted({"t1": note(RestraintStep.SUSPEND)})
    c.jobs["t1"] = dataclasses.replace(c.jobs["t1"], state="SUSPENDED")
    from slurmiso.monitor.ladder_state import Restraint

    mine = Restraint("n1", 0, "i1", why="the monitor's own", suspended_since=T0 - 60)
    actions, _ = decide(c.snapshot(T0), POL, Memory(restrained={"t1": mine}))
    (resume,) = [a for a in actions if a.kind == "resume-job"]
    assert resume.details["restraint"]["why"] == "the monitor's own", "not replaced"


def test_a_note_for_another_node_or_an_ended_job_is_left_alone() -> None:
    c = Noted({"t1": note(RestraintStep.THROTTLE, node="n2"), "t9": note(RestraintStep.PARK)})
    actions, mem = decide(c.snapshot(T0), POL, Memory())
    assert actions == [] and not mem.restrained


def test_a_breach_still_on_keeps_the_adopted_restraint() -> None:
    """The GPU is still hot: the adopted throttle is the rung's, kept (no unthrottle), and the
    ladder goes on from there."""
    c = Noted({"t1": note(RestraintStep.THROTTLE)})
    c.p99["i1"] = 400.0
    steps, mem = drive(c, 3, POL)
    assert "unthrottle" not in [k for _, k, _ in kinds(steps)]
    assert mem.restrained["t1"].throttled_since == T0 - 600


def test_the_snapshot_keeps_the_notes_and_says_when_they_were_not_read() -> None:
    c = Noted({"t1": note(RestraintStep.HOST_LIMIT, level=1)})
    snap = c.snapshot(T0)
    assert loads(dumps(snap)).notes == snap.notes
    assert loads(dumps(dataclasses.replace(snap, notes=None))).notes is None


def test_the_live_snapshot_reads_the_notes_from_squeue() -> None:
    from slurmiso.config import load_config
    from slurmiso.monitor.gather import live_snapshot
    from tests.slurmtext import job
    from tests.unit.test_monitor_gather import ETC, FakeCli

    text = note(RestraintStep.SUSPEND).text()
    slurm = FakeCli([job("41", "SUSPENDED", nodes="n1", admin_comment=f"site text {text}"),
                   job("42", "RUNNING", nodes="n1", admin_comment="site text only")])
    snap = live_snapshot(load_config(ETC), slurm, None, clock=lambda: T0)
    assert snap.notes == {"41": note(RestraintStep.SUSPEND)}
