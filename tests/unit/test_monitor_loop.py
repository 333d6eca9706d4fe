"""The monitor loop: memory across restarts, dry-run, failures, back-off, one leader."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from typing import Any, Dict, List

from slurmiso.errors import SlurmError, SlurmUnavailable
from slurmiso.monitor.apply import Applier
from slurmiso.monitor.loop import Monitor
from slurmiso.monitor.policy import Policy
from slurmiso.monitor.snapshot import GpuSample, JobInfo, NodeInfo, Snapshot, save
from slurmiso.state import Journal

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HOT = Snapshot(1000.0, (NodeInfo("n1", "MIXED", ("p",), "x", "mps", "", "",
                                 (GpuSample(0, 70_000, 80_000, 95.0, classes=("infer",)),), 1.0),),
               {"p": ("n1",)}, (JobInfo("7", "PENDING", "train", ("p",), "train", 900.0),))


class FakeSlurm:
    def __init__(self, fail: bool = False) -> None:
        self.calls: List[Any] = []
        self.comments: List[Any] = []
        self.fail = fail

    def hold(self, ids: List[str]) -> None:
        self.calls.append(("hold", list(ids)))
        if self.fail:
            raise SlurmUnavailable("scontrol hold 7 failed: Unable to contact slurm controller")

    def release(self, ids: List[str]) -> None:
        self.calls.append(("release", list(ids)))

    def update_jobs(self, ids: List[str], fields: Dict[str, str]) -> None:
        self.comments.append((list(ids), fields.get("Comment")))


def _monitor(tmp: str, slurm: FakeSlurm, dry_run: bool = False, snap: Snapshot = HOT) -> Monitor:
    applier = Applier(None, slurm, Journal(os.path.join(tmp, "journal.jsonl")))
    return Monitor(Policy(), lambda: snap, applier, os.path.join(tmp, "state.json"),
                   os.path.join(tmp, "leader.lock"), 30, dry_run, sleep=lambda s: None)


def test_memory_survives_restart_and_journal(tmp_path: os.PathLike[str]) -> None:
    tmp = str(tmp_path)
    slurm = FakeSlurm()
    mon = _monitor(tmp, slurm)
    outcomes = next(mon.run(once=True))
    mon.close()
    assert [o.ok for o in outcomes] == [True] and slurm.calls == [("hold", ["7"])]
    # the held job's owner reads why in squeue's comment
    assert slurm.comments == [(["7"], "slurmiso: training held: n1 GPU 0 memory 88% (limit "
                                      "75%), inference there")], slurm.comments
    again = _monitor(tmp, slurm)
    assert set(again.memory.holds) == {"7"}, "a restart knows the holds it placed"
    rec = Journal(os.path.join(tmp, "journal.jsonl")).read()
    line = next(iter(rec))
    assert line["event"] == "monitor-action" and line["action"] == "hold"
    assert line["target"] == "7" and line["dry_run"] is False and line["source"] == "monitor"
    assert line["details"]["sm_active_pct"] == 95.0


def test_dry_run_changes_nothing(tmp_path: os.PathLike[str]) -> None:
    tmp = str(tmp_path)
    slurm = FakeSlurm()
    mon = _monitor(tmp, slurm, dry_run=True)
    dry = next(mon.run(once=True))
    mon.close()
    assert slurm.calls == [] and not os.path.exists(os.path.join(tmp, "state.json"))
    real = _monitor(tmp, FakeSlurm())
    wet = next(real.run(once=True))
    real.close()
    assert [o.action for o in dry] == [o.action for o in wet], "same decisions"


def test_failed_action_is_retried_and_backoff(tmp_path: os.PathLike[str]) -> None:
    tmp = str(tmp_path)
    slurm = FakeSlurm(fail=True)
    mon = _monitor(tmp, slurm)
    out = next(mon.run(once=True))
    assert not out[0].ok and "Unable to contact" in out[0].error
    assert mon.memory.holds == {}, "not held: the next cycle tries again"
    down = Snapshot(2000.0, slurm_ok=False, errors=("slurm: down",))
    mon.snapshot_fn = lambda: down
    waits = []
    mon.sleep = waits.append
    list(mon.run(cycles=4))
    mon.close()
    assert waits == [60, 120, 240, 480], "doubling back-off while Slurm is down"


def test_second_monitor_stays_idle(tmp_path: os.PathLike[str]) -> None:
    """Two processes on one lock file: the second is idle until the first is gone."""
    tmp = str(tmp_path)
    snap_path = os.path.join(tmp, "snap.json")
    quiet = Snapshot(1000.0, (NodeInfo("n1", "IDLE", ("p",)),), {"p": ("n1",)})
    save(quiet, snap_path)
    cfg = os.path.join(REPO, "etc", "slurmiso.yaml")
    base = [sys.executable, "-m", "slurmiso", "--config", cfg, "monitor", "--snapshot",
            snap_path, "--lock", os.path.join(tmp, "leader.lock"), "--apply"]
    env = dict(os.environ, PYTHONPATH=REPO)
    first = subprocess.Popen(base + ["--state", os.path.join(tmp, "a.json"), "--interval",
                                     "0.2"], env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 20
        while not os.path.exists(os.path.join(tmp, "a.json")):
            assert first.poll() is None, first.communicate()
            assert time.monotonic() < deadline, "first monitor never ran a cycle"
            time.sleep(0.05)
        second = subprocess.run(base + ["--once", "--state", os.path.join(tmp, "b.json")],
                                env=env, capture_output=True, text=True, timeout=30)
        assert second.returncode == 9, second.stderr + second.stdout
        assert "idle: another monitor leads" in second.stdout
        assert not os.path.exists(os.path.join(tmp, "b.json"))
    finally:
        first.terminate()
        first.wait(10)
    third = subprocess.run(base + ["--once", "--state", os.path.join(tmp, "b.json")],
                           env=env, capture_output=True, text=True, timeout=30)
    assert third.returncode == 0 and "no action" in third.stdout, third.stdout + third.stderr


def test_applier_batches_and_splits_on_failure() -> None:
    from slurmiso.monitor.action import Action

    class Picky(FakeSlurm):
        def hold(self, ids: List[str]) -> None:
            self.calls.append(("hold", list(ids)))
            if "2" in ids:
                raise SlurmError("scontrol hold failed: Invalid job id specified")

    slurm = Picky()
    acts = [Action("hold", str(i), "hot") for i in range(1, 4)]
    outs = Applier(None, slurm).apply(acts)
    assert [o.ok for o in outs] == [True, False, True]
    assert slurm.calls[0] == ("hold", ["1", "2", "3"])


def test_a_state_file_of_the_previous_version_loads_typed_and_saves_the_same(
        tmp_path: os.PathLike[str]) -> None:
    """tests/fixtures/monitor/state-v1-dict-records.json was written by the version whose
    holds, gates, loans and caps were dicts read by string keys: it loads into the records,
    the monitor acts on them, and saving writes the keys that version wrote."""
    import json
    import shutil

    from slurmiso.monitor.admission_state import Cap, Gate, Hold, Loan

    tmp = str(tmp_path)
    old = os.path.join(REPO, "tests", "fixtures", "monitor", "state-v1-dict-records.json")
    shutil.copy(old, os.path.join(tmp, "state.json"))
    mon = _monitor(tmp, FakeSlurm())
    mem = mon.memory
    assert mem.holds["7"] == Hold(900.0, ("p", "slo"), "training held: n1 GPU 0 SM 95%")
    assert mem.holds["8"].kind == "stagger" and mem.holds["9"] == Hold(0.0, (), "")
    assert mem.gates["p"] == Gate(True, 900.0, 960.0, "n1 GPU 0 SM 95%")
    assert mem.gates["node:n2"] == Gate(False, 800.0, None, "calm")
    assert mem.lent == {"i3": Loan("infer", "train", 500.0), "i4": Loan("", "train", 0.0)}
    assert mem.caps == {"train": Cap({"gpu": 4, "shard": 0}, 700.0)}
    assert mem.ladder["n1/0"].step == "throttle" and mem.restrained["t1"].throttled_since == 930
    mon.save_memory()
    mon.close()
    with open(old, encoding="utf-8") as fh:
        before = json.load(fh)["memory"]
    with open(os.path.join(tmp, "state.json"), encoding="utf-8") as fh:
        after = json.load(fh)["memory"]
    before["holds"]["9"]["reason"] = ""  # a hold restored after a failed release had none
    for rung in before["ladder"].values():  # issue 33: a rung's bound timer, None while hot
        rung.setdefault("not_hot_since", None)
    assert after == before
