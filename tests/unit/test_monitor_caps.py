"""The monitor's alternatives to holding and waiting: capping the training QoS (qos-limit
admission) and requeueing training to empty a node for a MIG re-layout."""

from __future__ import annotations

import os
import stat
from typing import Any, Dict, List, Tuple

import pytest

from slurmiso.config import parse_config
from slurmiso.errors import ConfigError
from slurmiso.monitor.action import Action, ActionKind
from slurmiso.monitor.apply import Applier
from slurmiso.monitor.decide import decide, failed
from slurmiso.monitor.policy import Memory, Policy, policy_from_config
from slurmiso.slurm.client import SlurmCli
from slurmiso.slurm.gres import gres_counts
from tests.unit.test_monitor_decide import MIG, POLICY, T0, _mig_node, job, kinds, node, snap

CAPS = Policy(**{**POLICY.__dict__, "admission": "qos-limit", "train_qos": ("train",)})
NO_CAP = {"gpu": -1, "shard": -1, "mps": -1}


def _run(jid: str, gres: str, nodes: Tuple[str, ...] = ("n1",)) -> Any:
    return job(jid, state="RUNNING", nodes=nodes, gres=gres)


@pytest.mark.parametrize("gres,counts", [
    ("gres:gpu:a100:2,gres:shard:3", {"gpu": 2, "shard": 3}),
    ("gres/gpu:3g.40gb:1", {"gpu": 1}),
    ("gpu:2(S:0-1),mps:50", {"gpu": 2, "mps": 50}),
    ("gres:gpu", {"gpu": 1}),
    ("N/A", {}),
    ("(null)", {}),
    ("", {}),
])
def test_gres_counts(gres: str, counts: Dict[str, int]) -> None:
    assert gres_counts(gres) == counts


def test_hot_caps_the_train_qos_at_what_training_uses_and_holds_nothing() -> None:
    jobs = [_run("1", "gres:shard:2"), _run("2", "gres:gpu:1", ("n1", "n2")), job("3"),
            job("4", cls="infer", state="RUNNING", nodes=["n1"], gres="gres:gpu:4")]
    actions, mem = decide(snap([node("n1", mem_pct=80)], jobs), CAPS, Memory())
    assert kinds(actions) == [("qos-limit", "train")]
    a = actions[0]
    assert a.details["tres"] == {"gpu": 2, "shard": 2, "mps": 0}  # infer's GPUs not counted
    assert a.details["previous"] is None and "memory 80%" in a.reason
    assert not mem.holds and mem.caps["train"].tres == a.details["tres"]
    # still hot, nothing changed: no new action; a training job ends: the cap follows it down
    again, mem = decide(snap([node("n1", mem_pct=80)], jobs, ts=T0 + 30), CAPS, mem)
    assert again == []
    fewer, mem = decide(snap([node("n1", mem_pct=80)], jobs[1:], ts=T0 + 60), CAPS, mem)
    assert [a.details["tres"] for a in fewer] == [{"gpu": 2, "shard": 0, "mps": 0}]
    more, mem = decide(snap([node("n1", mem_pct=80)], jobs + [_run("5", "gres:gpu:8")],
                            ts=T0 + 90), CAPS, mem)
    assert more == [], "never raised while hot (a job started before the cap took effect)"


def test_calm_raises_the_cap_by_the_next_jobs_per_interval_then_removes_it() -> None:
    waiting = [job(str(i), gres="gres:gpu:1", submit=T0 - 100 + i) for i in range(5)]
    running = [_run("r", "gres:gpu:2")]
    _, mem = decide(snap([node("n1", mem_pct=80)], running + waiting), CAPS, Memory())
    assert mem.caps["train"].tres["gpu"] == 2
    calm = [node("n1", mem_pct=20, sm=20)]
    t = T0 + 30
    a, mem = decide(snap(calm, running + waiting, ts=t), CAPS, mem)
    assert a == [], "calm must last min_dwell before anything opens"
    t = T0 + 30 + 300
    a, mem = decide(snap(calm, running + waiting, ts=t), CAPS, mem)
    assert kinds(a) == [("qos-limit", "train")] and a[0].details["jobs"] == ["0", "1"]
    assert a[0].details["tres"]["gpu"] == 4  # 2 running + the next 2 (stagger 2 per 60 s)
    b, mem = decide(snap(calm, running + waiting, ts=t + 30), CAPS, mem)
    assert b == [], "one raise per stagger interval"
    b, mem = decide(snap(calm, running + waiting[2:], ts=t + 61), CAPS, mem)
    assert b[0].details["jobs"] == ["2", "3"] and b[0].details["tres"]["gpu"] == 4
    c, mem = decide(snap(calm, running, ts=t + 122), CAPS, mem)
    assert kinds(c) == [("qos-limit", "train")] and c[0].details["tres"] is None
    assert "cap removed" in c[0].reason and "train" not in mem.caps


def test_stale_data_keeps_the_cap_and_a_failed_cap_is_forgotten() -> None:
    _, mem = decide(snap([node("n1", mem_pct=80)], [job("1")]), CAPS, Memory())
    a, mem2 = decide(snap([node("n1", age=500)], [job("1")], ts=T0 + 900), CAPS, mem)
    assert a == [] and mem2.caps == mem.caps
    new, _ = decide(snap([node("n1", age=500)], [job("1")], ts=T0 + 900), CAPS, Memory())
    assert [x.kind for x in new] == ["qos-limit"], \
        "unknown data caps training at what runs (no cap existed before)"
    assert new[0].details["tres"]["gpu"] == 0 and "telemetry" in new[0].reason
    act, fresh = decide(snap([node("n1", mem_pct=80)], [job("1")]), CAPS, Memory())
    assert "train" not in failed(fresh, act[0], "sacctmgr: error").caps


def test_switching_to_qos_limit_releases_our_holds() -> None:
    _, mem = decide(snap([node("n1", mem_pct=80)], [job("1")]), POLICY, Memory())
    assert "1" in mem.holds
    a, mem = decide(snap([node("n1", mem_pct=80)], [job("1", held=True)], ts=T0 + 10),
                    CAPS, mem)
    assert ("release", "1") in kinds(a) and ("qos-limit", "train") in kinds(a)
    assert not mem.holds


PREEMPT = Policy(**{**MIG.__dict__, "preempt_training_after_s": 120.0})


def test_relayout_requeues_training_after_the_wait_never_inference() -> None:
    mem = Memory(relayout={"node": "m1", "pool": "migs", "layout": "all-4g",
                           "phase": "draining", "since": T0})
    on = [job("t1", part="mig", state="RUNNING", nodes=["m1"]),
          job("i1", cls="infer", part="mig", state="RUNNING", nodes=["m1"])]
    a, mem = decide(snap([_mig_node("MIXED+DRAIN")], on, ts=T0 + 60), PREEMPT, mem)
    assert a == [], "before preempt_after: wait"
    a, mem = decide(snap([_mig_node("MIXED+DRAIN")], on, ts=T0 + 121), PREEMPT, mem)
    assert kinds(a) == [(ActionKind.RELAYOUT_REQUEUE, "t1")] and a[0].name == "requeue"
    assert "1 other job(s) are waited for" in a[0].reason
    a, mem = decide(snap([_mig_node("MIXED+DRAIN")], on, ts=T0 + 150), PREEMPT, mem)
    assert a == [], "requeued once; the inference job is waited for"
    a, _ = decide(snap([_mig_node("MIXED+DRAIN")], on, ts=T0 + 150), MIG, Memory(
        relayout={"node": "m1", "pool": "migs", "layout": "all-4g", "phase": "draining",
                  "since": T0}))
    assert a == [], "drain: wait (the default) never requeues"
    back = failed(mem, Action(ActionKind.RELAYOUT_REQUEUE, "t1", "x", {}), "scontrol: error")
    assert back.relayout is not None and back.relayout["requeued"] == []  # tried again


def test_config_keys_and_policy() -> None:
    data = {"version": 1, "classes": [
        {"name": "infer", "match": {"qos": ["infer"]}, "isolation": "exclusive"},
        {"name": "train", "match": {"qos": ["train"]}, "isolation": "exclusive",
         "preemptible": True}],
        "monitor": {"admission": "qos-limit",
                    "relayout": {"drain": "preempt-training", "preempt_after": "10m"}}}
    pol = policy_from_config(parse_config(data))
    assert pol.admission == "qos-limit" and pol.train_qos == ("train",)
    assert pol.preempt_training_after_s == 600
    assert pol.cap_tres == ("gpu",)  # no pool uses shard or mps: those TRES are untracked
    assert policy_from_config(parse_config({**data, "monitor": {}})).preempt_training_after_s \
        is None
    with pytest.raises(ConfigError) as err:
        parse_config({**data, "monitor": {"admission": "cap", "relayout": {"drain": "kill"}}},
                     "x.yaml")
    text = str(err.value) + "\n".join(err.value.problems)
    assert "monitor.admission" in text and "qos-limit" in text
    assert "monitor.relayout.drain" in text and "preempt-training" in text


class _Slurm:
    def __init__(self) -> None:
        self.calls: List[Any] = []

    def requeue(self, ids: List[str]) -> None:
        self.calls.append(("requeue", list(ids)))

    def set_qos_grp_tres(self, qos: str, tres: Dict[str, int]) -> None:
        self.calls.append(("cap", qos, dict(tres)))


def test_applier_requeues_and_caps() -> None:
    slurm = _Slurm()
    outs = Applier(None, slurm).apply([
        Action("qos-limit", "train", "hot", {"tres": {"gpu": 2, "shard": 0, "mps": 0}}),
        Action("qos-limit", "train", "calm", {"tres": None, "lift": ["gpu", "shard", "mps"]}),
        Action(ActionKind.RELAYOUT_REQUEUE, "42", "relayout", {})])
    assert all(o.ok for o in outs)
    assert slurm.calls == [("cap", "train", {"gpu": 2, "shard": 0, "mps": 0}),
                           ("cap", "train", NO_CAP), ("requeue", ["42"])]


def test_cli_commands(tmp_path: Any, monkeypatch: Any) -> None:
    """The exact sacctmgr/scontrol argv (a recording stand-in for the Slurm binaries)."""
    log = tmp_path / "argv"
    for name in ("sacctmgr", "scontrol"):
        exe = tmp_path / name
        exe.write_text(f"#!/bin/sh\necho {name} \"$@\" >> {log}\n")
        exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("SLURMISO_SLURM_BIN", str(tmp_path))
    cli = SlurmCli()
    cli.set_qos_grp_tres("train", {"gpu": 2, "shard": -1})
    cli.requeue(["7", "8"])
    assert log.read_text().splitlines() == [
        "sacctmgr -i modify qos where name=train set GrpTRES=gres/gpu=2,gres/shard=-1",
        "scontrol requeue 7,8"]
    assert os.path.exists(str(log))
