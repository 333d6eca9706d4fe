"""The monitor's action table: every kind has one entry, each entry is consistent, and the
ladder's requeue is told from a re-layout's by its kind, never by its details."""

from __future__ import annotations

import doctest
import json
from typing import Any, List

import pytest

import slurmiso.monitor.actions as actions_module
from slurmiso.monitor.action import Action, ActionKind
from slurmiso.monitor.actions import KIND, RECONCILE_BY_JOURNAL
from slurmiso.monitor.admission_state import Hold
from slurmiso.monitor.apply import Applier, Outcome
from slurmiso.monitor.decide import failed, intent_of, reconcile_intent
from slurmiso.monitor.ladder_state import Restraint
from slurmiso.monitor.loop import DryRunOverlay
from slurmiso.monitor.policy import Memory
from tests.unit.test_monitor_decide import T0, job, snap

#: The journal's names, in the order a cycle applies them (what the journal has always said).
JOURNAL_ORDER = ["resume", "drain", "requeue", "requeue", "throttle", "host-limit", "park",
                 "suspend", "mig-apply", "partition-update", "qos-limit", "hold", "exclude",
                 "uncomment", "release", "begin-now", "resume-job", "unpark", "unthrottle",
                 "host-unlimit", "ladder-end", "reconcile"]
LADDER = {ActionKind.THROTTLE, ActionKind.UNTHROTTLE, ActionKind.SUSPEND,
          ActionKind.RESUME_JOB, ActionKind.LADDER_REQUEUE, ActionKind.LADDER_END,
          ActionKind.HOST_LIMIT, ActionKind.HOST_UNLIMIT, ActionKind.PARK, ActionKind.UNPARK}
BATCHED = {ActionKind.HOLD, ActionKind.RELEASE, ActionKind.EXCLUDE, ActionKind.UNCOMMENT,
           ActionKind.BEGIN_NOW}


def test_every_kind_has_one_entry_applied_one_way() -> None:
    assert set(KIND) == set(ActionKind)
    for kind, spec in KIND.items():
        assert (spec.call is None) != (spec.batch is None), kind
        assert (spec.batch is not None) == (kind in BATCHED), kind
        assert spec.ladder == (kind in LADDER), kind
    ranked = sorted(KIND.items(), key=lambda kv: kv[1].rank)
    assert [kind.journal for kind, _ in ranked] == JOURNAL_ORDER
    assert all(kind.journal == kind.value for kind in KIND
               if kind is not ActionKind.RELAYOUT_REQUEUE)


def test_journal_names_that_are_reconciled_name_one_kind() -> None:
    reconciled = [kind.journal for kind, spec in KIND.items() if spec.reconcile is not None]
    assert len(reconciled) == len(set(reconciled)) == len(RECONCILE_BY_JOURNAL)


def test_the_two_requeues_are_kinds_of_their_own_with_one_journal_name() -> None:
    ladder, relayout = KIND[ActionKind.LADDER_REQUEUE], KIND[ActionKind.RELAYOUT_REQUEUE]
    assert ActionKind.LADDER_REQUEUE.journal == ActionKind.RELAYOUT_REQUEUE.journal == "requeue"
    assert ladder.rank == relayout.rank
    assert ladder.ladder and not relayout.ladder
    assert ladder.call is not relayout.call and ladder.undo is not relayout.undo
    assert ladder.overlay is not None and relayout.overlay is None
    act = Action(ActionKind.RELAYOUT_REQUEUE, "7", "re-layout")
    assert act.to_dict()["kind"] == "requeue" and act.describe() == "requeue 7: re-layout"
    assert intent_of([act])[0][0] == "requeue"
    assert json.loads(json.dumps(act.to_dict()))["kind"] == "requeue"


def test_a_kinds_value_finds_its_kinds_entry() -> None:
    assert KIND[Action("hold", "1", "x").kind] is KIND[ActionKind.HOLD]  # type: ignore[arg-type]
    assert Action("requeue", "1", "x").kind == ActionKind.LADDER_REQUEUE  # type: ignore[arg-type]
    assert KIND[Action("requeue", "1", "x").kind].ladder  # type: ignore[arg-type]
    assert ActionKind("relayout-requeue") is ActionKind.RELAYOUT_REQUEUE
    with pytest.raises(KeyError):
        assert KIND[Action("nap", "1", "x").kind]  # type: ignore[arg-type]
    assert f"{ActionKind.BEGIN_NOW}" == str(ActionKind.BEGIN_NOW) == "begin-now"


class _Slurm:
    def __init__(self) -> None:
        self.calls: List[Any] = []

    def requeue(self, ids: List[str]) -> None:
        self.calls.append(("requeue", list(ids)))

    def requeue_job(self, jid: str, resume_first: bool) -> str:
        self.calls.append(("requeue_job", jid, resume_first))
        return "done"


def test_each_requeue_makes_its_own_slurm_call() -> None:
    slurm = _Slurm()
    rec = Restraint("n1", 0, "i1").to_dict()
    outs = Applier(None, slurm).apply([
        Action(ActionKind.RELAYOUT_REQUEUE, "1", "re-layout"),
        Action(ActionKind.LADDER_REQUEUE, "2", "ladder", {"restraint": rec,
                                                          "suspended": True})])
    assert [o.ok for o in outs] == [True, True]
    assert slurm.calls == [("requeue", ["1"]), ("requeue_job", "2", True)]


def test_a_failed_requeue_is_undone_as_its_kind_says() -> None:
    rec = Restraint("n1", 0, "i1", throttled_since=T0)
    mem = Memory(relayout={"node": "n1", "requeued": ["1", "2"]})
    back = failed(mem, Action(ActionKind.RELAYOUT_REQUEUE, "1", "x"), "error")
    assert back.relayout is not None and back.relayout["requeued"] == ["2"]
    assert back.restrained == {}
    back = failed(mem, Action(ActionKind.LADDER_REQUEUE, "1", "x",
                              {"restraint": rec.to_dict()}), "error")
    assert back.restrained == {"1": rec} and back.relayout == mem.relayout


def test_only_the_ladders_requeue_shows_in_a_dry_runs_next_snapshot() -> None:
    overlay = DryRunOverlay()
    overlay.record([_ok(Action(ActionKind.RELAYOUT_REQUEUE, "1", "x")),
                    _ok(Action(ActionKind.LADDER_REQUEUE, "2", "x"))])
    assert overlay.requeued == {"2"}


def test_intent_is_reconciled_by_journal_name() -> None:
    pending = job("1", held=False)
    mem = Memory(holds={}, intent=[["hold", "1", "", ""], ["requeue", "2", "", ""]])
    mem.holds["1"] = Hold(T0, ("p",), "why")
    reconcile_intent(snap([], [pending], ts=T0), mem)
    assert "1" not in mem.holds and mem.intent == []


def test_the_module_example_runs() -> None:
    assert doctest.testmod(actions_module).failed == 0


def _ok(act: Action) -> Outcome:
    return Outcome(act, True)
