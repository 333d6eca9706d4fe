"""The ladder's own requeues in the audit (issue 33, item 5): the wrapper reads the
monitor's ``scontrol requeue`` SIGTERM as a preemption, finds Slurm showing the job requeued
and reports a declined requeue. The audit names those ladder requeues (with the work they
cost) and keeps the ``requeue-declined`` finding for the genuine declines."""

from __future__ import annotations

from typing import Any, Dict, List

from slurmiso.audit.read.digest import JournalDigest
from tests.audit_helpers import utc  # noqa: F401
from tests.unit.test_audit_figures import codes, row
from tests.unit.test_audit_ladder import WINDOW, act, at, checkpoint, ladder, prolog


def declined(job: str, hms: str, reason: str, folded: str = "") -> Dict[str, Any]:
    """The wrapper's line as the epilog folds it: its own time, the fold's time."""
    return {"ts": at(folded or hms), "job_ts": at(hms), "event": "requeue-declined",
            "job": job, "reason": reason, "source": "job"}


#: What the wrapper wrote after the ladder's requeue on the 22.05 sandbox (before it learnt
#: to say "cancelled it, or requeued it"): journals of that time are read the same way.
CANCELLED = ("Slurm shows the job COMPLETING: it was cancelled, not preempted (a preempted "
             "job stays RUNNING until its grace ends)")
LIMIT = ("restart count 5 has reached the class's max_requeues (5); raise "
         "checkpoint.max_requeues or resubmit by hand")

#: Job 12: the ladder requeued it at 02:30 (checkpointed at 02:00, 3 GPUs): its wrapper's
#: decline, folded by the epilog at 02:31, is the ladder's. Job 50: a genuine decline (time
#: limit, max_requeues reached). Job 51: declined at 01:00, long before the ladder requeued
#: it at 03:00: its own decline. Job 52: a requeue the monitor only dry-ran.
JOURNAL: List[Dict[str, Any]] = [
    prolog("12", "gpu001", [1]),
    prolog("12", "gpu002", [0, 1]),
    prolog("51", "gpu003", [0]),
    prolog("52", "gpu004", [0]),
    act("throttle", "12", "02:00:00", figure=400.0, figure_before=400.0),
    checkpoint("12", "02:00:00"),
    declined("51", "01:00:00", LIMIT, folded="03:01:00"),
    act("requeue", "12", "02:30:00", figure=420.0, figure_before=400.0,
        throttled_s=1800.0, suspended=False),
    {"ts": at("02:30:01"), "event": "preempt-signal", "job": "12", "cause": "preempted",
     "source": "job"},
    declined("12", "02:30:20", CANCELLED, folded="02:31:00"),
    prolog("12", "gpu005", [0], hms="02:35:00", restart=1),
    declined("50", "02:40:00", LIMIT),
    act("requeue", "51", "03:00:00", figure=400.0, throttled_s=60.0),
    act("requeue", "52", "03:00:00", dry_run=True, figure=400.0),
    declined("52", "03:00:10", CANCELLED, folded="03:00:30"),
]
ROWS = [
    row("12", qos="train", part="infer", state="REQUEUED", tres="gres/gpu=3",
        nodes="gpu[001-002]", start="00:00:00", end="02:30:00"),
    row("12", qos="train", part="infer", tres="gres/gpu=1", nodes="gpu005",
        start="02:35:00", end="04:00:00"),
    row("50", qos="train", part="infer", state="TIMEOUT", nodes="gpu006",
        start="00:00:00", end="02:40:00"),
    row("51", qos="train", part="infer", state="REQUEUED", nodes="gpu003",
        start="00:00:00", end="03:00:00"),
    row("52", qos="train", part="infer", nodes="gpu004", start="00:00:00", end="04:00:00"),
]


def test_ladder_requeues_are_named_and_genuine_declines_kept(tmp_path, utc, capsys,  # noqa: F811
                                                              monkeypatch):
    r = ladder(tmp_path, capsys, monkeypatch, JOURNAL, rows=ROWS, extra=WINDOW)
    found = codes(r)
    declines = found["requeue-declined"]
    assert sorted(declines["subjects"]) == ["50", "51", "52"], declines
    assert "4 requeue" not in declines["message"] and declines["message"].startswith("3 ")
    named = found["ladder-requeue"]
    assert named["subjects"] == ["12", "51"] and named["severity"] == "info"
    assert named["message"].startswith("2 ladder requeue(s) of training"), named["message"]
    # 12's attempt ran 00:00-02:30 on 3 GPUs and checkpointed at 02:00: 1.5 GPU-hours;
    # 51's ran 00:00-03:00 on 1 GPU with no checkpoint: 3 GPU-hours, estimated
    assert "4.50 GPU-hours of work since the last checkpoint lost (3.00 of them " \
        "estimated" in named["message"], named["message"]
    assert "1 job(s)' wrappers reported it as a declined requeue" in named["message"]


def test_no_ladder_requeue_no_finding_of_it(tmp_path, utc, capsys, monkeypatch):  # noqa: F811
    r = ladder(tmp_path, capsys, monkeypatch,
               [prolog("1", "gpu001", [0]), act("throttle", "1", "00:10:00", figure=300.0),
                declined("50", "02:40:00", LIMIT)], rows=[row("1"), row("50")])
    assert "ladder-requeue" not in codes(r)
    assert codes(r)["requeue-declined"]["subjects"] == ["50"]


def test_a_re_layout_requeue_is_named_too() -> None:
    d = JournalDigest()
    d.add({"ts": at("01:00:00"), "event": "monitor-action", "source": "monitor",
           "action": "requeue", "target": "60", "ok": True, "dry_run": False,
           "reason": "re-layout of gpu001 to big: training requeued after 600s of drain",
           "details": {"node": "gpu001", "pool": "mixed", "job_class": "train"}})
    d.add(declined("60", "01:00:05", CANCELLED, folded="01:00:40"))
    assert d.monitor_requeue_declines == [("60", "monitor")] and not d.requeue_declined


def test_a_failed_requeue_explains_nothing() -> None:
    d = JournalDigest()
    d.add(act("requeue", "61", "01:00:00", ok=False, figure=400.0))
    d.add(declined("61", "01:00:05", CANCELLED))
    assert d.requeue_declined and not d.monitor_requeue_declines


def test_the_next_attempts_own_decline_is_its_own() -> None:
    """Requeued by the ladder; the next attempt (its prolog) later declines a time-limit
    requeue: that one is a genuine decline."""
    d = JournalDigest()
    d.add(act("requeue", "62", "01:00:00", figure=400.0))
    d.add(prolog("62", "gpu001", [0], hms="01:05:00", restart=1))
    d.add(declined("62", "05:00:00", LIMIT))
    assert d.requeue_declined == [("62", LIMIT)] and not d.monitor_requeue_declines


def test_a_requeue_before_the_window_explains_a_decline_folded_in_it() -> None:
    from slurmiso.state.journal import parse_ts

    d = JournalDigest(since=parse_ts(at("01:00:00")).timestamp())
    d.add(act("requeue", "63", "00:59:50", figure=400.0))
    d.add(declined("63", "00:59:58", CANCELLED, folded="01:00:30"))
    assert d.monitor_requeue_declines == [("63", "ladder")] and not d.requeue_declined
