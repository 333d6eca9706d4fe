"""Scenarios over snapshot sequences: the monitor against a fake cluster that applies what
it is told (holds, exclusions, partition lists, BeginTime), cycle after cycle.

Each scenario states its bound: gate flips per node, starts per interval, partition updates
and re-layouts per hour, time to drain a backlog.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from slurmiso.hostlist import expand
from slurmiso.monitor.action import Action
from slurmiso.monitor.apply import Applier
from slurmiso.monitor.decide import decide
from slurmiso.monitor.policy import Memory, Policy, SloLimit
from slurmiso.monitor.snapshot import GpuSample, JobInfo, NodeInfo, Snapshot

T0 = 1_000_000.0
BASE = Policy(memory_used_pct=75, sm_active_pct=85, hysteresis_pct=10, min_dwell_s=300,
              stagger_max_starts=4, stagger_interval_s=60, max_data_age_s=90,
              admission="nodes")


def gpu(mem_pct: Optional[float], sm: Optional[float], index: int = 0,
        classes: Tuple[str, ...] = ("infer",)) -> GpuSample:
    """A GPU that inference shares (the agent labels it so), unless ``classes`` says not."""
    return GpuSample(index, int(800 * (mem_pct or 0)), 80_000 if mem_pct is not None else 0,
                     sm, sm, classes=classes)


class FakeCluster:
    """A Slurm stand-in the applier drives; ``snapshot()`` shows the result."""

    def __init__(self, nodes: Sequence[str], parts: Dict[str, Sequence[str]],
                 mode: str = "mps") -> None:
        self.names = list(nodes)
        self.parts = {p: list(ns) for p, ns in parts.items()}
        self.mode = mode
        self.jobs: Dict[str, JobInfo] = {}
        self.load: Dict[str, Tuple[Optional[float], Optional[float], Optional[float]]] = {
            n: (10.0, 10.0, 5.0) for n in nodes}
        self.state: Dict[str, str] = {n: "MIXED" for n in nodes}
        self.calls: List[Tuple[str, int]] = []
        self.updates: List[Tuple[float, str]] = []
        self.now = T0

    # -- what the applier calls ----------------------------------------------------------
    def _set(self, ids: Sequence[str], **kw: object) -> None:
        for i in ids:
            if i in self.jobs:
                self.jobs[i] = dataclasses.replace(self.jobs[i], **kw)  # type: ignore[arg-type]

    def hold(self, ids: Sequence[str]) -> None:
        self.calls.append(("hold", len(ids)))
        self._set(ids, held=True, reason="JobHeldAdmin")

    def release(self, ids: Sequence[str]) -> None:
        self.calls.append(("release", len(ids)))
        self._set(ids, held=False, reason="Priority")

    def update_jobs(self, ids: Sequence[str], fields: Dict[str, str]) -> None:
        self.calls.append(("update", len(ids)))
        if "ExcNodeList" in fields:
            self._set(ids, exc_nodes=fields["ExcNodeList"])
        if "Comment" in fields:
            self._set(ids, comment=fields["Comment"])
        if fields.get("StartTime") == "now":
            self._set(ids, reason="Priority", begin_ts=0.0)

    def set_partition_nodes(self, part: str, nodes: str) -> None:
        self.calls.append(("partition", 1))
        self.updates.append((self.now, part))
        self.parts[part] = expand(nodes) if nodes else []

    def drain(self, node: str, reason: str) -> None:
        self.state[node] = "MIXED+DRAIN"

    def resume(self, node: str) -> None:
        self.state[node] = "MIXED"

    def requeue(self, ids: Sequence[str]) -> None:
        self._set(ids, state="PENDING", nodes=(), reason="BeginTime")

    # -- what the monitor sees -----------------------------------------------------------
    def snapshot(self, ts: float) -> Snapshot:
        self.now = ts
        nodes = []
        for n in self.names:
            mem, sm, age = self.load[n]
            member = tuple(p for p, ns in self.parts.items() if n in ns)
            nodes.append(NodeInfo(n, self.state[n], member, "p", self.mode, "", "",
                                  (gpu(mem, sm),) if mem is not None or sm is not None
                                  else (), age))
        return Snapshot(ts, tuple(nodes), {p: tuple(ns) for p, ns in self.parts.items()},
                        tuple(self.jobs.values()))

    def submit(self, jid: str, cls: str = "train", part: str = "shared", ts: float = T0,
               priority: float = 0.0, reason: str = "Priority") -> None:
        self.jobs[jid] = JobInfo(jid, "PENDING", cls, (part,), cls, ts, False, reason,
                                 priority=priority)


def run(cluster: FakeCluster, policy: Policy, steps: int, dt: float = 30.0,
        before: Optional[Callable[[int, float], None]] = None,
        memory: Optional[Memory] = None, start: float = T0,
        ) -> Tuple[List[List[Action]], Memory]:
    applier = Applier(None, cluster)
    mem = memory or Memory()
    out = []
    for i in range(steps):
        ts = start + i * dt
        if before is not None:
            before(i, ts)
        actions, mem = decide(cluster.snapshot(ts), policy, mem)
        for o in applier.apply(actions):
            assert o.ok, o.error
        out.append(actions)
    return out, mem


def flips(mem_history: List[Dict[str, bool]]) -> Dict[str, int]:
    out: Dict[str, int] = {}
    for a, b in zip(mem_history, mem_history[1:]):
        for k in set(a) | set(b):
            if a.get(k, False) != b.get(k, False):
                out[k] = out.get(k, 0) + 1
    return out


# ------------------------------------------------------------------------------ scenarios
def test_oscillating_load_flips_each_node_gate_at_most_twice() -> None:
    """Load 90 % / 60 % every other cycle for 50 cycles: the gate closes once and never
    re-opens (never 300 s calm in a row), so at most 2 flips per node."""
    c = FakeCluster(["n1", "n2"], {"shared": ["n1", "n2"]})
    c.submit("1")
    history: List[Dict[str, bool]] = []

    def step(i: int, ts: float) -> None:
        c.load["n1"] = (90.0 if i % 2 == 0 else 60.0, 10.0, 5.0)
        history.append({})

    mem = Memory()
    applier = Applier(None, c)
    for i in range(50):
        step(i, T0 + 30 * i)
        actions, mem = decide(c.snapshot(T0 + 30 * i), BASE, mem)
        applier.apply(actions)
        history[-1] = {k: g.closed for k, g in mem.gates.items()}
    assert all(n <= 2 for n in flips(history).values()), flips(history)
    assert c.jobs["1"].exc_nodes == "n1", "the hot node stays excluded, the calm one open"


def test_slow_ramp_closes_once_and_opens_after_dwell() -> None:
    """Memory ramps 40 -> 80 -> 40 % over an hour: one close at 75 %, one open after the
    ramp has been below 65 % for the dwell."""
    c = FakeCluster(["n1"], {"shared": ["n1"]})
    c.submit("1")
    ramp = [40 + i for i in range(41)] + [80 - i for i in range(41)] + [40] * 20
    history: List[Dict[str, bool]] = []
    mem = Memory()
    applier = Applier(None, c)
    for i, pct in enumerate(ramp):
        c.load["n1"] = (float(pct), 10.0, 5.0)
        actions, mem = decide(c.snapshot(T0 + 30 * i), BASE, mem)
        applier.apply(actions)
        history.append({k: g.closed for k, g in mem.gates.items()})
    closes = [i for i, h in enumerate(history) if h.get("node:n1") and
              (i == 0 or not history[i - 1].get("node:n1"))]
    assert closes == [ramp.index(75)]
    opened = next(i for i in range(closes[0], len(history)) if not history[i].get("node:n1"))
    below = next(i for i in range(ramp.index(80), len(ramp)) if ramp[i] < 65)
    assert 30 * (opened - below) >= BASE.min_dwell_s
    assert c.jobs["1"].exc_nodes == "", "exclusion removed once calm"


def test_stale_and_unknown_agents_admit_no_new_training() -> None:
    """n1 stale, n2 answers without GPU series, n3 fresh and calm: new training is kept off
    n1 and n2 and may start on n3; running work is untouched; unknown_admits switches it."""
    c = FakeCluster(["n1", "n2", "n3"], {"shared": ["n1", "n2", "n3"]})
    c.load["n1"] = (10.0, 10.0, 500.0)
    c.load["n2"] = (None, None, 1.0)
    c.submit("1")
    c.jobs["9"] = JobInfo("9", "RUNNING", "train", ("shared",), "train", T0, nodes=("n1",))
    # n2's agent names no GPU, but Slurm shows inference there: unknown, not calm
    c.jobs["8"] = JobInfo("8", "RUNNING", "infer", ("shared",), "infer", T0, nodes=("n2",))
    steps, mem = run(c, BASE, 1)
    assert c.jobs["1"].exc_nodes == "n[1-2]" and "calm GPUs" in c.jobs["1"].comment
    assert not any(a.target in ("8", "9") for a in steps[0])
    assert {"n1", "n2"} <= set(mem.stale)
    c2 = FakeCluster(["n1", "n2"], {"shared": ["n1", "n2"]})
    c2.load["n1"] = (10.0, 10.0, 500.0)
    c2.submit("1")
    run(c2, dataclasses.replace(BASE, unknown_admits=True), 1)
    assert c2.jobs["1"].exc_nodes == "", "unknown_admits: unknown data admits as calm"


def test_slo_breach_with_idle_gpus_keeps_training_off_inference_nodes_only() -> None:
    """An inference job waits for GPUs past its SLO while GPUs are calm: training is kept off
    the inference partition's nodes, and stays free on the others."""
    c = FakeCluster(["i1", "i2", "t1"], {"infer": ["i1", "i2"], "shared": ["i1", "i2", "t1"]})
    c.submit("50", cls="infer", part="infer", ts=T0 - 600, reason="Resources")
    c.submit("1")
    pol = dataclasses.replace(BASE, slo=(SloLimit("infer", 120, None),))
    run(c, pol, 1)
    assert c.jobs["1"].exc_nodes == "i[1-2]"
    assert "infer jobs wait" in c.jobs["1"].comment


def test_20k_burst_is_staggered_in_priority_order_and_drains_in_bound() -> None:
    """20,000 training jobs arrive at once while calm: a budget starts per interval, the rest
    are held and released highest priority first, all within backlog_drain_s."""
    names = [f"n{i:02d}" for i in range(10)]
    c = FakeCluster(names, {"shared": names})
    pol = dataclasses.replace(BASE, backlog_drain_s=3600)
    run(c, pol, 1)  # a first cycle: jobs already pending then are not "arrivals"

    def burst(i: int, ts: float) -> None:
        if i == 0:
            for j in range(20_000):
                c.submit(str(100_000 + j), ts=ts - 1, priority=float(j % 997))
            c.now = ts

    steps, mem = run(c, pol, 1, before=burst, memory=Memory(last_ts=T0 - 5))
    held = [a for a in steps[0] if a.kind == "hold"]
    assert 19_000 < len(held) < 20_000
    admitted = [j for j in c.jobs.values() if not j.held]
    assert min(j.priority for j in admitted) >= max(
        c.jobs[a.target].priority for a in held[:1]) - 997, "admitted first: high priority"
    t, cycles = T0 + 60, 0
    applier = Applier(None, c)
    while any(j.held for j in c.jobs.values()):
        actions, mem = decide(c.snapshot(t), pol, mem)
        rel = [c.jobs[a.target].priority for a in actions if a.kind == "release"]
        assert rel == sorted(rel, reverse=True), "releases in Slurm's priority order"
        assert len(rel) <= 20_000 * 60 / 600, "spread out, not all at once"
        applier.apply(actions)
        t += 60
        cycles += 1
        assert cycles < 1000
    assert t - T0 <= pol.backlog_drain_s + 2 * pol.stagger_interval_s


def test_lend_and_reclaim_under_bursty_inference() -> None:
    """A short inference job every 6 minutes: lending stays within its hourly limit, each
    burst takes back one node (what it needs), never all of them."""
    c = FakeCluster(["i1", "i2", "i3", "i4"], {"infer": ["i1", "i2", "i3", "i4"],
                                               "train": []})
    for n in c.names:
        c.state[n] = "IDLE"
    pol = dataclasses.replace(BASE, lend=(("infer", "train"),), min_dwell_s=120)
    reclaimed: List[int] = []

    def burst(i: int, ts: float) -> None:
        jid = f"q{i}"
        if i % 12 == 6:
            c.submit(jid, cls="infer", part="infer", ts=ts, reason="Resources")
        for j in [j for j in c.jobs.values() if j.pending and j.job_class == "infer"
                  and ts - j.submit_ts >= 30]:
            del c.jobs[j.id]

    steps, mem = run(c, pol, 240, before=burst)  # 2 hours
    for acts in steps:
        for a in acts:
            if a.kind == "partition-update" and a.details["op"] == "reclaim":
                reclaimed.append(len(a.details["moved"]))
    per_hour = [sum(1 for t, _ in c.updates if T0 + h * 3600 <= t < T0 + (h + 1) * 3600)
                for h in range(2)]
    assert reclaimed and all(n == 1 for n in reclaimed), reclaimed
    lends = [a for acts in steps for a in acts if a.kind == "partition-update"
             and a.details["op"] == "lend"]
    assert len(lends) <= 2 * pol.partition_updates_per_hour
    assert max(per_hour) <= pol.partition_updates_per_hour + 2, per_hour


def test_alternating_mig_demand_relayouts_within_hourly_limit() -> None:
    """Demand flips between 3g and 4g every 15 minutes for 2 hours: re-layouts stay within
    relayouts_per_hour (2/h), 4 at most, instead of 8."""
    pol = dataclasses.replace(BASE, min_dwell_s=60, mig_layouts={"migs": (
        ("mixed", (("3g.40gb", 2), ("4g.40gb", 1))), ("all-4g", (("4g.40gb", 2),)),
        ("all-3g", (("3g.40gb", 4),)))})
    node = {"gres": "gpu:3g.40gb:2,gpu:4g.40gb:1", "state": "MIXED"}
    drains = []
    mem = Memory()
    for i in range(240):
        ts = T0 + 30 * i
        want = "4g.40gb" if (i // 30) % 2 == 0 else "3g.40gb"
        jobs = tuple(JobInfo(f"j{k}", "PENDING", "infer", ("mig",), "infer", ts - 5,
                             gres=f"gpu:{want}:1") for k in range(4))
        snap = Snapshot(ts, (NodeInfo("m1", node["state"], ("mig",), "migs", "mig-static",
                                      node["gres"], "", (gpu(10, 10),), 5.0),),
                        {"mig": ("m1",)}, jobs)
        actions, mem = decide(snap, pol, mem)
        for a in actions:
            if a.kind == "drain":
                drains.append(ts)
                node["state"] = "IDLE+DRAIN"
            elif a.kind == "mig-apply":
                node["gres"] = ",".join(f"gpu:{p}:{n}" for name, counts in
                                        pol.mig_layouts["migs"] if name == a.details["layout"]
                                        for p, n in counts)
            elif a.kind == "resume":
                node["state"] = "MIXED"
    for start in drains:
        assert sum(1 for t in drains if start <= t < start + 3600) <= pol.relayouts_per_hour
    assert 1 <= len(drains) <= 4, drains


def test_a_job_that_starts_loses_the_waiting_note_and_its_record() -> None:
    """nodes admission: a job kept off n1 starts on n2. Its comment no longer says it waits
    (squeue showed running jobs "waiting for calm GPUs"), a user's own comment is never
    touched, and the monitor keeps no record of jobs that no longer pend (one per job ever
    excluded, for the daemon's lifetime, before)."""
    c = FakeCluster(["n1", "n2"], {"shared": ["n1", "n2"]})
    c.load["n1"] = (95.0, 95.0, 5.0)
    c.jobs["8"] = JobInfo("8", "RUNNING", "infer", ("shared",), "infer", T0, nodes=("n1",))
    for jid in ("1", "2", "3"):
        c.submit(jid)
    c.jobs["2"] = dataclasses.replace(c.jobs["2"], comment="my own note")
    _, mem = run(c, BASE, 1)
    assert "calm GPUs" in c.jobs["1"].comment and c.jobs["2"].comment == "my own note"
    assert set(mem.excluded) == {"1", "2", "3"}
    for jid in ("1", "2"):  # Slurm starts them on the calm node
        c.jobs[jid] = dataclasses.replace(c.jobs[jid], state="RUNNING", nodes=("n2",))
    del c.jobs["3"]  # cancelled while pending
    steps, mem = run(c, BASE, 1, memory=mem, start=T0 + 30)
    assert [(a.kind, a.target) for a in steps[0] if a.kind == "uncomment"] == [("uncomment", "1")]
    assert c.jobs["1"].comment == "" and c.jobs["2"].comment == "my own note"
    assert mem.excluded == {}
    steps, mem = run(c, BASE, 1, memory=mem, start=T0 + 60)
    assert not any(a.target in ("1", "2") for a in steps[0]), "once only"


def test_a_held_job_says_why_in_its_comment_and_loses_the_note_when_released() -> None:
    """Every node a job may use is hot: the job is held and its comment (empty before) names
    the cause, a job's own comment is never replaced; calm for the dwell: both are released,
    the note is gone, the job's own comment is still there. Under ``admission: hold`` too."""
    for admission in ("nodes", "hold"):
        c = FakeCluster(["n1"], {"shared": ["n1"]})
        c.load["n1"] = (90.0, 10.0, 5.0)
        c.submit("1")
        c.submit("2")
        c.jobs["2"] = dataclasses.replace(c.jobs["2"], comment="my sweep, lr=3e-4")
        pol = dataclasses.replace(BASE, admission=admission)
        steps, mem = run(c, pol, 1, memory=Memory(last_ts=T0 - 30))
        assert c.jobs["1"].held and c.jobs["2"].held, (admission, steps)
        assert c.jobs["1"].comment.startswith("slurmiso: training held:"), c.jobs["1"]
        assert "n1 GPU 0 memory 90%" in c.jobs["1"].comment, c.jobs["1"].comment
        assert c.jobs["2"].comment == "my sweep, lr=3e-4"
        c.load["n1"] = (10.0, 10.0, 5.0)
        steps, mem = run(c, pol, 15, memory=mem, start=T0 + 30)
        assert not c.jobs["1"].held and not c.jobs["2"].held, (admission, mem.holds)
        assert c.jobs["1"].comment == "", (admission, c.jobs["1"].comment)
        assert c.jobs["2"].comment == "my sweep, lr=3e-4"


def test_a_hold_someone_else_released_loses_the_monitors_note() -> None:
    """An admin releases a job the monitor held: the monitor respects it (never holds it
    again) and takes its note off, so squeue does not show a released job as held."""
    c = FakeCluster(["n1"], {"shared": ["n1"]})
    c.load["n1"] = (90.0, 10.0, 5.0)
    c.submit("1")
    _, mem = run(c, BASE, 1)
    assert c.jobs["1"].held and c.jobs["1"].comment.startswith("slurmiso:")
    c.jobs["1"] = dataclasses.replace(c.jobs["1"], held=False, reason="Priority")
    steps, mem = run(c, BASE, 1, memory=mem, start=T0 + 30)
    assert [a.kind for a in steps[0] if a.target == "1"] == ["uncomment"], steps
    assert c.jobs["1"].comment == "" and not c.jobs["1"].held


def test_a_refused_note_leaves_the_hold_standing() -> None:
    """The note only explains: Slurm refusing the comment update is logged, the hold is
    done and remembered (no retry loop of holds)."""
    from slurmiso.errors import SlurmError

    class NoComments(FakeCluster):
        def update_jobs(self, ids: Sequence[str], fields: Dict[str, str]) -> None:
            if "Comment" in fields:
                raise SlurmError("scontrol update failed: Access/permission denied")
            super().update_jobs(ids, fields)

    c = NoComments(["n1"], {"shared": ["n1"]})
    c.load["n1"] = (90.0, 10.0, 5.0)
    c.submit("1")
    steps, mem = run(c, BASE, 1)  # run() asserts every outcome ok
    assert c.jobs["1"].held and "1" in mem.holds and c.jobs["1"].comment == ""
