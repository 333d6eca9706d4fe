"""decide(): table-driven over small snapshots; the oscillation bound; dry-run equality."""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple

import pytest

from slurmiso.monitor.action import Action
from slurmiso.monitor.admission_state import Hold
from slurmiso.monitor.decide import decide, failed
from slurmiso.monitor.policy import Memory, Policy, SloLimit
from slurmiso.monitor.snapshot import GpuSample, JobInfo, NodeInfo, Snapshot, dumps, loads

T0 = 1_000_000.0
POLICY = Policy(memory_used_pct=75, sm_active_pct=85, hysteresis_pct=10, min_dwell_s=300,
                stagger_max_starts=2, stagger_interval_s=60, max_data_age_s=90)


def node(name: str, mem_pct: float = 10, sm: float = 10, age: Optional[float] = 5,
         part: str = "shared", mode: str = "mps", state: str = "MIXED", gres: str = "",
         pool: str = "p") -> NodeInfo:
    # inference shares the GPU: only such GPUs' load keeps training off a node (issue 24)
    gpus = (GpuSample(0, int(800 * mem_pct), 80_000, sm, sm, classes=("infer",)),)
    return NodeInfo(name, state, (part,), pool, mode, gres, "", gpus, age)


def job(jid: str, cls: str = "train", part: str = "shared", state: str = "PENDING",
        held: bool = False, submit: float = T0 - 100, nodes: Sequence[str] = (),
        gres: str = "") -> JobInfo:
    return JobInfo(jid, state, cls, (part,), cls, submit, held,
                   "JobHeldAdmin" if held else "", tuple(nodes), gres)


def snap(nodes: Sequence[NodeInfo], jobs: Sequence[JobInfo], ts: float = T0,
         parts: Optional[Dict[str, Tuple[str, ...]]] = None, **kw: Any) -> Snapshot:
    if parts is None:
        parts = {}
        for n in nodes:
            for p in n.partitions:
                parts[p] = parts.get(p, ()) + (n.name,)
    return Snapshot(ts, tuple(nodes), parts, tuple(jobs), **kw)


def kinds(actions: List[Action]) -> List[Tuple[str, str]]:
    return [(a.kind, a.target) for a in actions]


# ------------------------------------------------------------------------ admission table
ADMISSION = [
    # (name, nodes, jobs, expected actions)
    ("hot memory holds pending train", [node("n1", mem_pct=80)], [job("1"), job("2")],
     [("hold", "1"), ("hold", "2")]),
    ("hot SM holds", [node("n1", sm=90)], [job("1")], [("hold", "1")]),
    ("calm: nothing", [node("n1", mem_pct=60, sm=60)], [job("1")], []),
    ("between thresholds on an open gate: nothing", [node("n1", mem_pct=70)], [job("1")], []),
    ("infer jobs are never held", [node("n1", mem_pct=95)], [job("1", cls="infer")], []),
    ("someone else's hold is left alone", [node("n1", mem_pct=95)], [job("1", held=True)], []),
    ("stale telemetry: no change", [node("n1", mem_pct=95, age=500)], [job("1")], []),
    ("missing telemetry: no change", [node("n1", mem_pct=95, age=None)], [job("1")], []),
    ("exclusive pools never gate", [node("n1", mem_pct=95, mode="exclusive")], [job("1")], []),
    ("other partition hot: no hold", [node("n1", mem_pct=95, part="other")],
     [job("1", part="shared")], []),
    ("down node ignored", [node("n1", mem_pct=95, state="DOWN*")], [job("1")], []),
]


@pytest.mark.parametrize("name,nodes,jobs,expected", ADMISSION, ids=[a[0] for a in ADMISSION])
def test_admission(name: str, nodes: List[NodeInfo], jobs: List[JobInfo],
                   expected: List[Tuple[str, str]]) -> None:
    s = snap(nodes, jobs, parts={"shared": tuple(n.name for n in nodes if "shared" in
                                                 n.partitions)} | {"other": ("n1",)})
    actions, _ = decide(s, POLICY, Memory())
    assert kinds(actions) == expected


def test_hold_details_and_memory() -> None:
    actions, mem = decide(snap([node("n1", mem_pct=80)], [job("7")]), POLICY, Memory())
    assert actions[0].details["memory_pct"] == 80.0 and actions[0].details["node"] == "n1"
    assert "memory 80%" in actions[0].reason
    assert set(mem.holds) == {"7"} and mem.gates["shared"].closed


def _run(snaps: Sequence[Snapshot], policy: Policy = POLICY,
         mem: Optional[Memory] = None) -> Tuple[List[List[Action]], Memory]:
    """Feed snapshots in order; a hold/release shows in the next snapshot's job."""
    mem = mem or Memory()
    out = []
    held: Dict[str, bool] = {}
    for s in snaps:
        jobs = tuple(JobInfo(j.id, j.state, j.job_class, j.partitions, j.qos, j.submit_ts,
                             held.get(j.id, j.held), j.reason, j.nodes, j.gres) for j in s.jobs)
        s = Snapshot(s.ts, s.nodes, s.partitions, jobs, s.latency_p99_ms, s.latency_age_s,
                     s.slurm_ok, s.errors)
        actions, mem = decide(s, policy, mem)
        for a in actions:
            if a.kind in ("hold", "release"):
                held[a.target] = a.kind == "hold"
        out.append(actions)
    return out, mem


def test_release_after_dwell_with_hysteresis_and_stagger() -> None:
    jobs = [job(str(i), submit=T0 - 100 + i) for i in range(5)]
    seq = [snap([node("n1", mem_pct=80)], jobs, ts=T0)]
    seq += [snap([node("n1", mem_pct=70)], jobs, ts=T0 + 30 * k) for k in range(1, 12)]
    seq += [snap([node("n1", mem_pct=50)], jobs, ts=T0 + 400 + 30 * k) for k in range(0, 30)]
    steps, mem = _run(seq)
    assert kinds(steps[0]) == [("hold", str(i)) for i in range(5)]
    assert all(not s for s in steps[1:12]), "70% is above the release level (75-10)"
    releases = [(i, a.target) for i, s in enumerate(steps) for a in s if a.kind == "release"]
    first = releases[0][0]
    assert seq[first].ts - seq[12].ts >= 300, "calm must last min_dwell"
    assert [t for _, t in releases] == ["0", "1", "2", "3", "4"], "oldest first"
    per_window: Dict[int, int] = {}
    for i, _ in releases:
        per_window[int((seq[i].ts - seq[first].ts) // 60)] = \
            per_window.get(int((seq[i].ts - seq[first].ts) // 60), 0) + 1
    assert max(per_window.values()) <= 2, "stagger: at most 2 per 60 s"
    assert not mem.holds


def test_oscillating_load_is_bounded() -> None:
    """Load swinging across the threshold every cycle for two hours: the gate closes once
    and the number of actions stays bounded by the jobs, never one per swing."""
    jobs = [job(str(i)) for i in range(3)]
    seq = [snap([node("n1", mem_pct=80 if k % 2 == 0 else 40)], jobs, ts=T0 + 30 * k)
           for k in range(240)]
    steps, _ = _run(seq)
    total = sum(len(s) for s in steps)
    assert total <= 3 + 3, total
    seq2 = [snap([node("n1", mem_pct=76 if k % 2 == 0 else 68)], jobs, ts=T0 + 30 * k)
            for k in range(240)]
    steps2, _ = _run(seq2)
    assert sum(len(s) for s in steps2) == 3, "inside the hysteresis band nothing reopens"


def test_job_released_by_admin_is_not_held_again() -> None:
    s1 = snap([node("n1", mem_pct=90)], [job("1")])
    _, mem = decide(s1, POLICY, Memory())
    s2 = snap([node("n1", mem_pct=90)], [job("1", held=False)], ts=T0 + 30)
    actions, mem = decide(s2, POLICY, mem)
    assert actions == [] and "1" in mem.overridden and not mem.holds


def test_stale_keeps_holds() -> None:
    _, mem = decide(snap([node("n1", mem_pct=90)], [job("1")]), POLICY, Memory())
    later = [snap([node("n1", mem_pct=10, age=1000)], [job("1", held=True)], ts=T0 + 3600)]
    steps, mem = _run(later, mem=mem)
    assert steps == [[]] and "shared" in mem.stale and "1" in mem.holds


def test_slo_breach_holds_with_latency_in_details() -> None:
    pol = Policy(**{**POLICY.__dict__, "slo": (SloLimit("infer", 60, 250),)})
    s = snap([node("n1")], [job("1")], latency_p99_ms={"infer": 400.0}, latency_age_s=5)
    actions, _ = decide(s, pol, Memory())
    assert kinds(actions) == [("hold", "1")]
    assert actions[0].details["p99_latency_ms"] == 400.0
    s = snap([node("n1")], [job("1"), job("9", cls="infer", submit=T0 - 120)])
    actions, _ = decide(s, pol, Memory())
    assert kinds(actions) == [("hold", "1")] and "wait 120s" in actions[0].reason


def test_slurm_down_changes_nothing() -> None:
    s = Snapshot(T0, slurm_ok=False, errors=("slurm: down",))
    mem = Memory(holds={"1": Hold(0.0, ("x",))})
    actions, new = decide(s, POLICY, mem)
    assert actions == [] and new.holds == mem.holds


def test_dry_run_equality_and_replay() -> None:
    """The same snapshot (also after a JSON round trip) gives the same decisions."""
    s = snap([node("n1", mem_pct=90), node("n2", part="infer", state="IDLE")],
             [job("1"), job("2")])
    pol = Policy(**{**POLICY.__dict__, "lend": (("infer", "shared"),), "min_dwell_s": 0})
    a1, m1 = decide(s, pol, Memory())
    a2, m2 = decide(loads(dumps(s)), pol, Memory())
    assert a1 == a2 and m1.to_dict() == m2.to_dict()
    assert Memory().to_dict() == Memory().to_dict()  # decide() did not touch its input


# ----------------------------------------------------------------------------- partitions
LEND = Policy(**{**POLICY.__dict__, "lend": (("infer", "train"),)})


def test_lend_after_dwell_then_reclaim_on_demand() -> None:
    nodes = [node("i1", part="infer", state="IDLE"), node("i2", part="infer", state="IDLE"),
             node("t1", part="train", state="ALLOCATED")]
    parts = {"infer": ("i1", "i2"), "train": ("t1",)}
    a, mem = decide(snap(nodes, [], parts=parts), LEND, Memory())
    assert a == []  # idle, but not for min_dwell yet
    a, mem = decide(snap(nodes, [], ts=T0 + 301, parts=parts), LEND, mem)
    assert kinds(a) == [("partition-update", "train")]
    assert a[0].details == {"op": "lend", "from": "infer", "moved": ["i1", "i2"],
                            "nodes": ["t1", "i1", "i2"]}
    parts2 = {"infer": ("i1", "i2"), "train": ("t1", "i1", "i2")}
    a, mem = decide(snap(nodes, [], ts=T0 + 330, parts=parts2), LEND, mem)
    assert a == []
    demand = [job("50", cls="infer", part="infer")]
    a, mem = decide(snap(nodes, demand, ts=T0 + 360, parts=parts2), LEND, mem)
    assert kinds(a) == [("partition-update", "train")]
    assert a[0].details["op"] == "reclaim" and a[0].details["moved"] == ["i1"], \
        "one waiting 1-node job takes back one node, not every lent one"
    assert a[0].details["nodes"] == ["t1", "i2"] and set(mem.lent) == {"i2"}


def test_reclaim_when_inference_runs_on_lent_node_and_reserve() -> None:
    nodes = [node("i1", part="infer", state="IDLE"), node("i2", part="infer", state="IDLE")]
    parts = {"infer": ("i1", "i2"), "train": ()}
    pol = Policy(**{**LEND.__dict__, "lend_reserve": 1, "min_dwell_s": 0})
    a, mem = decide(snap(nodes, [], parts=parts), pol, Memory())
    assert a[0].details["moved"] == ["i1"], "one idle node stays in reserve"
    busy = [node("i1", part="infer", state="MIXED"), node("i2", part="infer", state="IDLE")]
    running = [job("60", cls="infer", part="infer", state="RUNNING", nodes=["i1"])]
    a, mem = decide(snap(busy, running, ts=T0 + 10,
                         parts={"infer": ("i1", "i2"), "train": ("i1",)}), pol, mem)
    assert a[0].details["op"] == "reclaim" and "60" in a[0].reason


# ---------------------------------------------------------------------------- MIG layout
MIG = Policy(**{**POLICY.__dict__, "min_dwell_s": 60, "mig_layouts": {
    "migs": (("mixed", (("3g.40gb", 3), ("4g.40gb", 1))), ("all-4g", (("4g.40gb", 2),)))}})


def _mig_node(state: str = "MIXED") -> NodeInfo:
    return node("m1", part="mig", mode="mig-static", state=state, pool="migs",
                gres="gpu:3g.40gb:3,gpu:4g.40gb:1(S:0)")


def test_mig_relayout_drain_apply_resume() -> None:
    pend = [job(str(i), part="mig", gres="gres:gpu:4g.40gb:1") for i in range(2)]
    run = [job("9", part="mig", state="RUNNING", nodes=["m1"], gres="gres:gpu:4g.40gb:1")]
    a, mem = decide(snap([_mig_node()], pend + run), MIG, Memory())
    assert a == [] and "migs" in mem.mig_mismatch_since, "must persist before acting"
    a, mem = decide(snap([_mig_node()], pend + run, ts=T0 + 61), MIG, mem)
    assert kinds(a) == [("drain", "m1")] and a[0].details["layout"] == "all-4g"
    a, mem = decide(snap([_mig_node("MIXED+DRAIN")], pend + run, ts=T0 + 90), MIG, mem)
    assert a == [], "a job still runs: wait, never kill it"
    a, mem = decide(snap([_mig_node("IDLE+DRAIN")], pend, ts=T0 + 120), MIG, mem)
    assert kinds(a) == [("mig-apply", "m1")]
    a, mem = decide(snap([_mig_node("IDLE+DRAIN")], pend, ts=T0 + 150), MIG, mem)
    assert kinds(a) == [("resume", "m1")] and mem.relayout is None


def test_mig_no_relayout_when_layout_fits_or_failed_apply_resumes() -> None:
    pend = [job("1", part="mig", gres="gres:gpu:3g.40gb:1")]
    _, mem = decide(snap([_mig_node()], pend), MIG, Memory())
    a, mem = decide(snap([_mig_node()], pend, ts=T0 + 600), MIG, mem)
    assert a == [] and not mem.mig_mismatch_since
    mem = Memory(relayout={"node": "m1", "pool": "migs", "layout": "all-4g",
                           "phase": "applying", "since": T0})
    mem = failed(mem, Action("mig-apply", "m1", "x", {"pool": "migs", "layout": "all-4g"}),
                 "boom")
    a, mem = decide(snap([_mig_node("IDLE+DRAIN")], []), MIG, mem)
    assert kinds(a) == [("resume", "m1")] and "boom" in a[0].reason


def test_drain_timeout_resumes() -> None:
    mem = Memory(relayout={"node": "m1", "pool": "migs", "layout": "all-4g",
                           "phase": "draining", "since": T0})
    run = [job("9", part="mig", state="RUNNING", nodes=["m1"])]
    a, _ = decide(snap([_mig_node("MIXED+DRAIN")], run, ts=T0 + 3601), MIG, mem)
    assert kinds(a) == [("resume", "m1")] and "abandoned" in a[0].reason


def test_reconcile_periodic() -> None:
    pol = Policy(**{**POLICY.__dict__, "reconcile_nodes": ("n1",), "reconcile_every_s": 600})
    run = [job("5", state="RUNNING", nodes=["n1"])]
    a, mem = decide(snap([node("n1")], run), pol, Memory())
    assert kinds(a) == [("reconcile", "n1")] and a[0].details["live_jobs"] == ["5"]
    a, mem = decide(snap([node("n1")], run, ts=T0 + 300), pol, mem)
    assert a == []


def test_failed_hold_is_forgotten() -> None:
    acts, mem = decide(snap([node("n1", mem_pct=90)], [job("1")]), POLICY, Memory())
    mem = failed(mem, acts[0], "Invalid job id")
    assert not mem.holds
