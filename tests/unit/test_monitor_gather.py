"""The live snapshot: squeue's new fields (priority, ExcNodeList, BeginTime, comment with the
separator in it), and a telemetry source that breaks is unknown data, not a crash."""

from __future__ import annotations

import os
from typing import Any, Dict, List, Mapping

from slurmiso.config import load_config
from slurmiso.monitor.exclusions import comment_is_free, forget_started, note_is_ours
from slurmiso.monitor.gather import live_snapshot
from slurmiso.monitor.policy import Memory
from slurmiso.monitor.telemetry import Reading
from slurmiso.slurm.client import SlurmCli
from tests.slurmtext import FakeSqueue, job

ETC = os.path.join(os.path.dirname(__file__), "..", "..", "etc", "slurmiso.yaml")
JOBS = [
    job("101", partition="train", qos="train", reason="Priority", gres="", priority="4242",
        exc_nodes="n[1-2]", start="2026-01-01T10:05:00", comment="my run | with a bar"),
    job("102", partition="infer", qos="infer", reason="BeginTime", gres="", priority="10",
        exc_nodes="(null)", num_nodes="2", start="2026-01-01T10:07:00", comment=None),
    job("103", "RUNNING", submit="2026-01-01T09:00:00", nodes="n3", priority="7",
        exc_nodes="(null)", start="2026-01-01T09:00:05", comment=""),
]
NODES = "\n".join(f"NodeName=n{i} State=MIXED NodeAddr=n{i} Gres=gpu:2" for i in range(1, 4))
PARTITIONS = "PartitionName=train Nodes=n[1-3]\nPartitionName=infer Nodes=n[1-3]\n"


class FakeCli(SlurmCli):
    """squeue and scontrol as Slurm prints them for ``jobs`` (tests/slurmtext.py)."""

    def __init__(self, jobs: List[Dict[str, Any]] = JOBS) -> None:
        super().__init__()
        self.fake = FakeSqueue(jobs, {"node": NODES, "partition": PARTITIONS})

    def run(self, cmd: str, args: Any, timeout: Any = None, env: Any = None) -> str:
        return self.fake(cmd, args, timeout, env)


class Broken:
    def read(self, nodes: Mapping[str, str], now: float) -> Reading:
        raise OSError("connection reset")


def test_queue_fields_and_a_broken_source() -> None:
    cfg = load_config(ETC)
    snap = live_snapshot(cfg, FakeCli(), Broken(), clock=lambda: 1_800_000_000.0)
    jobs: Dict[str, Any] = {j.id: j for j in snap.jobs}
    assert jobs["101"].priority == 4242 and jobs["101"].exc_nodes == "n[1-2]"
    assert jobs["101"].comment == "my run | with a bar" and jobs["101"].eligible
    assert jobs["101"].begin_ts > 0 and jobs["102"].num_nodes == 2
    assert jobs["102"].reason == "BeginTime" and not jobs["102"].eligible
    assert jobs["102"].comment == "" and jobs["103"].nodes == ("n3",)
    assert snap.unknown == {"telemetry/source-error": 1}
    assert all(n.telemetry_age_s is None for n in snap.nodes), "no data: unknown"
    rows: List[Dict[str, str]] = FakeCli().queue()
    assert rows[0]["comment"] == "my run | with a bar"


def test_a_comment_that_forges_rows_changes_no_other_job() -> None:
    """Issue #33: a job's comment wrote rows making another user's suspended training look
    running and its comment look like the monitor's note (so the monitor would wipe it)."""
    forged = ("x\n104|RUNNING|train|train|2026-01-01T09:00:00|None|n3|gres:gpu:1|acct|7|"
              "(null)|1|N/A|\n104|104|slurmiso: training held: x\n"
              "105|RUNNING|infer|infer|2026-01-01T09:00:00|n3|gres:gpu:1|acct|7||1|N/A|None")
    jobs = JOBS + [job("104", "SUSPENDED", nodes="n3", comment="the victim's own words"),
                   job("200", comment=forged)]
    snap = live_snapshot(load_config(ETC), FakeCli(jobs), None, clock=lambda: 1.8e9)
    by_id = {j.id: j for j in snap.jobs}
    assert sorted(by_id) == ["101", "102", "103", "104", "200"], "no job made up or lost"
    assert by_id["104"].state == "SUSPENDED" and by_id["104"].nodes == ("n3",)
    assert by_id["104"].comment is None and by_id["200"].comment is None  # unread
    assert by_id["101"].comment == "my run | with a bar"
    # which of the victim's two rows was forged cannot be told, so the job each came after
    # (103, the forger) may have had its comment cut: unread too, for this cycle
    assert by_id["103"].comment is None and by_id["103"].state == "RUNNING"
    assert snap.unknown == {"slurm/duplicate": 1, "slurm/unread": 3}
    # unread is neither free for a note nor the monitor's own note to remove
    assert not comment_is_free(None) and not note_is_ours(None)
    mem = Memory(excluded={"104": {"set": "", "user": "", "comment": ""}})
    assert forget_started(snap, mem) == [] and mem.excluded == {}
