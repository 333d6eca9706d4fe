"""Slurm 24.05+ names a finished attempt PREEMPTED when an earlier attempt was preempted and
requeued by ``scontrol requeue`` (its grace mark stays; seen on 24.11.5: one preemption and
0.011 GPU-h too many). The audit counts no preemption for such an attempt only where the
epilog, as root, had slurmctld confirm it (``not-preempted``): the wrapper's own
``requeue-closed`` line is the job's claim, which its user can write, and counts for nothing.
"""

from __future__ import annotations

import time
from typing import Any, Dict, List, Optional

import pytest

from slurmiso.audit.figures.aggregate import Aggregator
from slurmiso.audit.read.digest import JournalDigest
from slurmiso.audit.read.sacct import AcctRecord
from slurmiso.config import load_config
from slurmiso.errors import SlurmError
from slurmiso.hooks import events
from slurmiso.hooks.requeue import check_not_preempted, closed_claimed
from slurmiso.state.journal import parse_ts
from tests.audit_helpers import CONFIG

CFG = load_config(CONFIG)
T0 = parse_ts("2026-01-01T00:00:00.000Z").timestamp()


def _rec(state: str, start: float, run: float) -> AcctRecord:
    return AcctRecord(job="7", name="n", user="u", account="a", partition="train", qos="train",
                     state=state, submit=0.0, eligible=0.0, start=start, end=start + run,
                     elapsed=run, timelimit_s=None, gpus=2.0, mps=0, shards=0, nodes="gpu033")


def _closed(ts: str) -> Dict[str, Any]:
    return {"event": "requeue-closed", "job": "7", "restart_count": 1, "status": 0, "ok": True,
            "source": "job", "ts": ts}


def _confirmed(start: float, source: Optional[str] = None) -> Dict[str, Any]:
    """The epilog's root line, with Slurm's StartTime as squeue prints it (local time)."""
    rec = {"event": "not-preempted", "job": "7", "restart_count": 1, "node": "gpu033",
           "start": time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(start)),
           "ts": "2026-01-01T00:01:40.000Z"}
    if source:
        rec["source"] = source
    return rec


def _train(d: JournalDigest) -> Dict[str, Any]:
    agg = Aggregator(CFG, d)
    agg.add_all([_rec("REQUEUED", T0, 11), _rec("PREEMPTED", T0 + 60, 39)])
    return agg.classes["train"].to_dict()


def _preempted_then_requeued(d: JournalDigest) -> None:
    d.add({"event": "preempt-signal", "job": "7", "cause": "preempted", "source": "job",
           "ts": "2026-01-01T00:00:10.400Z"})
    d.add({"event": "requeue", "job": "7", "reason": "preempted", "count": 1, "by": "slurmiso",
           "source": "job", "ts": "2026-01-01T00:00:10.500Z"})


def test_an_attempt_slurmctld_confirmed_unpreempted_is_not_a_preemption() -> None:
    d = JournalDigest()
    _preempted_then_requeued(d)
    d.add(_closed("2026-01-01T00:01:39.900Z"))
    d.add(_confirmed(T0 + 60))
    assert d.confirmed_unpreempted("7", T0 + 60) and not d.confirmed_unpreempted("7", T0)
    s = _train(d)
    assert (s["jobs"], s["attempts"], s["preemptions"], s["preemptions_user_reported"]) == \
        (1, 2, 0, 1)
    assert s["lost_gpu_hours"] == 0 and s["lost_gpu_hours_estimated"] == 0


def test_the_jobs_own_claim_alone_hides_no_preemption() -> None:
    """A user who writes requeue-closed into the events file of a job that *was* preempted:
    the preemption and its lost work still count (the trust gap of session 12)."""
    d = JournalDigest()
    _preempted_then_requeued(d)
    d.add(_closed("2026-01-01T00:01:39.900Z"))
    s = _train(d)
    assert s["preemptions"] == 1 and s["lost_gpu_hours"] + s["lost_gpu_hours_estimated"] > 0


def test_a_forged_confirmation_is_rejected() -> None:
    """The events file cannot carry it (not a wrapper event), and a line with any source is
    not the epilog's."""
    line = b'{"event": "not-preempted", "start": "2026-01-01T00:01:00"}'
    assert events.parse_line(line) is None
    d = JournalDigest()
    d.add(_confirmed(T0 + 60, source="job"))
    assert d.rejected == 1 and _train(d)["preemptions"] == 1


def test_a_confirmation_of_another_attempt_does_not_count() -> None:
    d = JournalDigest()
    d.add(_confirmed(T0 + 1800))
    assert _train(d)["preemptions"] == 1


def test_the_claim_is_for_this_attempt_only() -> None:
    def ev(**fields: Any) -> events.UserEvent:
        return events.UserEvent("requeue-closed", None, fields)

    assert closed_claimed([ev(ok=True, restart_count=2)], 2)
    assert not closed_claimed([ev(ok=True, restart_count=1)], 2)
    assert not closed_claimed([ev(ok=False, restart_count=2)], 2)
    assert not closed_claimed([ev(ok=True, restart_count=True)], 1)
    assert not closed_claimed([events.UserEvent("requeue", None, {"restart_count": 2,
                                                                   "ok": True})], 2)


@pytest.mark.parametrize("facts, confirmed", [
    ({"PreemptTime": "N/A", "StartTime": "2026-01-01T00:01:00", "RestartCnt": "1",
      "Requeue": "0"}, True),
    # slurmctld preempted this attempt: the user's claim is not the truth
    ({"PreemptTime": "2026-01-01T00:01:30", "StartTime": "2026-01-01T00:01:00",
      "RestartCnt": "1", "Requeue": "0"}, False),
    # Requeue still on: the wrapper did not close it, Slurm may run it again
    ({"PreemptTime": "N/A", "StartTime": "2026-01-01T00:01:00", "RestartCnt": "1",
      "Requeue": "1"}, False),
    (None, False),  # slurmctld has forgotten the job
])
def test_check_not_preempted_believes_only_slurmctld(facts: Optional[Dict[str, str]],
                                                     confirmed: bool) -> None:
    got = check_not_preempted("7", lambda job: facts)
    assert (got is not None) is confirmed
    if got:
        assert got["start"] == "2026-01-01T00:01:00"


def test_check_not_preempted_without_slurmctld_is_no_confirmation() -> None:
    def down(job: str) -> Any:
        raise SlurmError("squeue: Unable to contact slurm controller")

    assert check_not_preempted("7", down) is None


def test_epilog_journals_only_what_slurmctld_confirms(monkeypatch: Any, tmp_path: Any) -> None:
    """The epilog path itself: a claim plus slurmctld's word gives one root line; no claim
    asks slurmctld nothing (the common epilog stays free of Slurm calls)."""
    from types import SimpleNamespace

    from slurmiso.hooks import requeue, runner

    asked: List[str] = []
    answer: Dict[str, str] = {"PreemptTime": "N/A", "StartTime": "2026-01-01T00:01:00",
                              "RestartCnt": "1", "Requeue": "0"}

    def facts(job: str, fct: Any = None) -> Any:
        asked.append(job)
        return check_not_preempted(job, lambda j: answer)

    monkeypatch.setattr(requeue, "check_not_preempted", facts)
    lines: List[Dict[str, Any]] = []

    class J:
        def append(self, event: str, **fields: Any) -> None:
            lines.append(dict(fields, event=event))

    ctx = SimpleNamespace(job_id="7", journal=J(), env=SimpleNamespace(node="gpu033"),
                          record=SimpleNamespace(restart_count=1))
    claim = events.UserEvent("requeue-closed", None, {"ok": True, "restart_count": 1})
    runner._journal_unpreempted_end(ctx, [])  # type: ignore[arg-type]
    assert asked == [] and lines == []
    runner._journal_unpreempted_end(ctx, [claim])  # type: ignore[arg-type]
    assert asked == ["7"] and [ln["event"] for ln in lines] == ["not-preempted"]
    assert "source" not in lines[0] and lines[0]["start"] == "2026-01-01T00:01:00"
    answer["PreemptTime"] = "2026-01-01T00:01:30"
    runner._journal_unpreempted_end(ctx, [claim])  # type: ignore[arg-type]
    assert len(lines) == 1


def test_epilog_requeue_of_a_job_slurmctld_already_requeued_is_no_failure() -> None:
    """24.05+ requeues a job preempted in its grace time itself; the epilog's request then
    meets a pending job (measured on 24.11.5): fulfilled, not a warning."""
    from slurmiso.hooks.requeue import ALREADY, DONE, requeue_job

    def pending(cmd: str, args: Any) -> str:
        raise SlurmError("scontrol requeue 7 failed: Job is pending execution for job 7")

    def down(cmd: str, args: Any) -> str:
        raise SlurmError("scontrol requeue 7 failed: Unable to contact slurm controller")

    assert requeue_job("7", lambda cmd, args: "") == (DONE, None)
    assert requeue_job("7", pending) == (ALREADY, None)
    outcome, why = requeue_job("7", down)
    assert outcome == "failed" and why is not None and "Unable to contact" in why
    assert requeue_job("7; rm", lambda cmd, args: "")[0] == "failed"
