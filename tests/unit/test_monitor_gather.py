"""The live snapshot: squeue's new fields (priority, ExcNodeList, BeginTime, comment with the
separator in it), and a telemetry source that breaks is unknown data, not a crash."""

from __future__ import annotations

import os
from typing import Any, Dict, List, Mapping

from slurmiso.config import load_config
from slurmiso.monitor.gather import live_snapshot
from slurmiso.monitor.telemetry import Reading
from slurmiso.slurm.client import SlurmCli

ETC = os.path.join(os.path.dirname(__file__), "..", "..", "etc", "slurmiso.yaml")
SQUEUE = (
    "101|PENDING|train|train|2026-01-01T10:00:00|Priority|||acct|4242|n[1-2]|1|"
    "2026-01-01T10:05:00|my run | with a bar\n"
    "102|PENDING|infer|infer|2026-01-01T10:00:00|BeginTime|||acct|10|(null)|2|"
    "2026-01-01T10:07:00|(null)\n"
    "103|RUNNING|train|train|2026-01-01T09:00:00|None|n3|gres:gpu:1|acct|7|(null)|1|"
    "2026-01-01T09:00:05|\n")


class FakeCli(SlurmCli):
    def run(self, cmd: str, args: Any, timeout: Any = None) -> str:
        if cmd == "squeue":
            return SQUEUE
        kind = args[1]
        if kind == "node":
            return "\n".join(f"NodeName=n{i} State=MIXED NodeAddr=n{i} Gres=gpu:2"
                             for i in range(1, 4))
        return "PartitionName=train Nodes=n[1-3]\nPartitionName=infer Nodes=n[1-3]\n"


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
