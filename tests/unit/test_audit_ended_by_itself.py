"""Slurm 24.05+ names a finished attempt PREEMPTED when an earlier attempt was preempted and
requeued by ``scontrol requeue`` (its grace mark stays); the wrapper journals
``requeue-closed`` when its program ends by itself, and the audit counts no preemption and
no lost work for that attempt (seen on 24.11.5: one preemption and 0.011 GPU-h too many)."""

from __future__ import annotations

from slurmiso.audit.analyze import Aggregator
from slurmiso.audit.digest import JournalDigest
from slurmiso.audit.sacct import JobRecord
from slurmiso.config import load_config
from slurmiso.hooks.events import USER_EVENTS
from tests.audit_helpers import CONFIG

CFG = load_config(CONFIG)


def _rec(state: str, start: float, run: float) -> JobRecord:
    return JobRecord(job="7", name="n", user="u", account="a", partition="train", qos="train",
                     state=state, submit=0.0, eligible=0.0, start=start, end=start + run,
                     elapsed=run, timelimit_s=None, gpus=2.0, mps=0, shards=0, nodes="gpu033")


def _closed(ts: str) -> dict:
    return {"event": "requeue-closed", "job": "7", "restart_count": 1, "status": 0, "ok": True,
            "source": "job", "ts": ts}


def test_the_epilog_folds_the_wrappers_requeue_closed() -> None:
    assert "requeue-closed" in USER_EVENTS


def test_finished_attempt_named_preempted_is_not_a_preemption() -> None:
    from slurmiso.state.journal import parse_ts

    t0 = parse_ts("2026-01-01T00:00:00.000Z").timestamp()
    d = JournalDigest()
    d.add({"event": "preempt-signal", "job": "7", "cause": "preempted", "source": "job",
           "ts": "2026-01-01T00:00:10.400Z"})
    d.add({"event": "requeue", "job": "7", "reason": "preempted", "count": 1, "by": "slurmiso",
           "source": "job", "ts": "2026-01-01T00:00:10.500Z"})
    d.add(_closed("2026-01-01T00:01:39.900Z"))
    assert d.ended_by_itself_within("7", t0 + 60, t0 + 99)  # End truncated to the second
    assert not d.ended_by_itself_within("7", t0, t0 + 11)
    agg = Aggregator(CFG, d)
    agg.add_all([_rec("REQUEUED", t0, 11), _rec("PREEMPTED", t0 + 60, 39)])
    s = agg.classes["train"].to_dict()
    assert (s["jobs"], s["attempts"], s["preemptions"], s["preemptions_user_reported"]) == \
        (1, 2, 0, 1)
    assert s["lost_gpu_hours"] == 0 and s["lost_gpu_hours_estimated"] == 0


def test_a_real_preemption_without_the_journal_line_still_counts() -> None:
    from slurmiso.state.journal import parse_ts

    t0 = parse_ts("2026-01-01T00:00:00.000Z").timestamp()
    d = JournalDigest()
    d.add(_closed("2026-01-01T00:30:00.000Z"))  # another attempt's end
    agg = Aggregator(CFG, d)
    agg.add_all([_rec("PREEMPTED", t0, 60)])
    assert agg.classes["train"].to_dict()["preemptions"] == 1
