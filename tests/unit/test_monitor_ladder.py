"""The ladder on running training (issue 24): each step, escalation and de-escalation with
dwell and hysteresis, budgets, unknown signals, forged latency, and the gate that now looks
only at GPUs inference uses. A small Slurm stand-in is driven through the real applier."""

from __future__ import annotations

import dataclasses
import random
from typing import Dict, List, Optional, Sequence, Tuple

import pytest

from slurmiso.exposition.job_series import JobSignals
from slurmiso.monitor.action import Action
from slurmiso.monitor.apply import Applier
from slurmiso.monitor.decide import decide, failed, reconcile_intent
from slurmiso.monitor.ladder_state import Restraint
from slurmiso.monitor.policy import (
    LadderPolicy,
    Memory,
    Policy,
    SloLimit,
    StepPolicy,
    override,
)
from slurmiso.monitor.snapshot import GpuSample, JobInfo, NodeInfo, Snapshot, dumps, loads

T0 = 2_000_000.0
DT = 30.0
STEPS = (StepPolicy("hold", 0, 60), StepPolicy("throttle", 60, 60, 6, 100),
         StepPolicy("suspend", 60, 60, 6, 100), StepPolicy("requeue", 60, 60, 6, 100))
POL = Policy(min_dwell_s=60, stagger_max_starts=100, max_data_age_s=90, admission="nodes",
             slo=(SloLimit("infer", None, 250, 0.05, class_latency=False),),
             ladder=LadderPolicy(STEPS, hysteresis_pct=10))
CALM_MS, BREACH_MS = 100.0, 400.0


class Cluster:
    """Nodes with GPUs, jobs placed on (node, GPU), per-job signals; the applier's calls
    change the jobs as Slurm would."""

    def __init__(self, nodes: Sequence[str] = ("n1",), gpus: int = 2,
                 mode: str = "mps") -> None:
        self.nodes = list(nodes)
        self.gpus = gpus
        self.mode = mode
        self.jobs: Dict[str, JobInfo] = {}
        self.place: Dict[str, Tuple[str, int]] = {}
        self.p99: Dict[str, Optional[float]] = {}
        self.age: Dict[str, Optional[float]] = {}
        self.sm: Dict[Tuple[str, int], float] = {}
        self.calls: List[Tuple[str, str]] = []
        #: job -> the agent's "signal:reason" items (figures it exports beside them)
        self.told: Dict[str, Tuple[str, ...]] = {}

    # -- set up ---------------------------------------------------------------------------
    def run_job(self, jid: str, cls: str, node: str = "n1", gpu: int = 0,
                priority: float = 0.0, p99: Optional[float] = CALM_MS) -> None:
        self.jobs[jid] = JobInfo(jid, "RUNNING", cls, ("shared",), cls, T0 - 1000,
                                 nodes=(node,), priority=priority)
        self.place[jid] = (node, gpu)
        if cls == "infer":
            self.p99[jid] = p99
            self.age[jid] = 5.0

    def submit(self, jid: str) -> None:
        self.jobs[jid] = JobInfo(jid, "PENDING", "train", ("shared",), "train", T0 - 500,
                                 reason="Priority")

    # -- what the applier calls -----------------------------------------------------------
    def _set(self, jid: str, **kw: object) -> None:
        self.jobs[jid] = dataclasses.replace(self.jobs[jid], **kw)  # type: ignore[arg-type]

    def signal_job(self, jid: str, sig: str) -> str:
        self.calls.append((f"signal-{sig}", jid))
        return "done"

    def suspend(self, jid: str) -> str:
        self.calls.append(("suspend", jid))
        self._set(jid, state="SUSPENDED")
        return "done"

    def resume_job(self, jid: str) -> str:
        self.calls.append(("resume", jid))
        self._set(jid, state="RUNNING")
        return "done"

    def requeue_job(self, jid: str, resume_first: bool = False) -> str:
        self.calls.append(("requeue", jid))
        self._set(jid, state="PENDING", nodes=(), reason="BeginTime")
        return "done"

    def update_jobs(self, ids: Sequence[str], fields: Dict[str, str]) -> None:
        for jid in ids:
            self._set(jid, exc_nodes=fields.get("ExcNodeList", ""),
                      comment=fields.get("Comment", self.jobs[jid].comment))

    def hold(self, ids: Sequence[str]) -> None:
        for jid in ids:
            self._set(jid, held=True, reason="JobHeldAdmin")

    def release(self, ids: Sequence[str]) -> None:
        for jid in ids:
            self._set(jid, held=False, reason="Priority")

    # -- what the monitor sees ------------------------------------------------------------
    def snapshot(self, ts: float) -> Snapshot:
        nodes = []
        for n in self.nodes:
            gpus = []
            for g in range(self.gpus):
                on = sorted(j for j, (pn, pg) in self.place.items() if (pn, pg) == (n, g)
                            and self.jobs[j].state in ("RUNNING", "SUSPENDED"))
                gpus.append(GpuSample(g, 20_000, 80_000, self.sm.get((n, g), 30.0), 30.0, 1,
                                      tuple(on), tuple(sorted({self.jobs[j].job_class
                                                               for j in on}))))
            nodes.append(NodeInfo(n, "MIXED", ("shared",), "p", self.mode, "", "",
                                  tuple(gpus), 5.0))
        signals = {}
        for jid, p99 in self.p99.items():
            node, gpu = self.place[jid]
            if self.jobs[jid].state == "RUNNING":
                signals[jid] = JobSignals(jid, "infer", node, ((gpu, ""),), p99_ms=p99,
                                          error_rate=0.0, requests=100.0,
                                          latency_age_s=self.age[jid],
                                          unknown=self.told.get(jid, ()))
        return Snapshot(ts, tuple(nodes), {"shared": tuple(self.nodes)},
                        tuple(self.jobs.values()), job_signals=signals)


def drive(c: Cluster, cycles: int, policy: Policy = POL, mem: Optional[Memory] = None,
          start: float = T0, each: Optional[object] = None,
          ) -> Tuple[List[List[Action]], Memory]:
    """Cycles every DT seconds through the real applier; ``each(i, ts)`` changes the world
    first. No action ever targets an inference job."""
    applier = Applier(None, c)
    mem = mem or Memory()
    out = []
    for i in range(cycles):
        ts = start + i * DT
        if callable(each):
            each(i, ts)
        actions, mem = decide(c.snapshot(ts), policy, mem)
        for o in applier.apply(actions):
            assert o.ok, o.error
        for a in actions:
            job = c.jobs.get(a.target)
            assert job is None or job.job_class != "infer", f"inference touched: {a}"
        out.append(actions)
    return out, mem


def ladder_kinds(steps: List[List[Action]]) -> List[Tuple[int, str, str]]:
    return [(i, a.kind, a.target) for i, acts in enumerate(steps) for a in acts
            if a.kind in ("throttle", "suspend", "requeue", "resume-job", "unthrottle",
                          "ladder-end")]


def shared_pair(mode: str = "mps") -> Cluster:
    """i1 breaching beside t1 on n1 GPU 0; n2 calm, so p1 is excluded, not held."""
    c = Cluster(nodes=("n1", "n2"), mode=mode)
    c.run_job("i1", "infer", p99=BREACH_MS)
    c.run_job("t1", "train")
    c.submit("p1")
    return c


# ------------------------------------------------------------------- each step, in order
def test_escalates_one_step_per_dwell_and_names_the_cause() -> None:
    """P99 400 ms against 250: hold at once (the pending job is kept off n1, its comment
    names the inference job and the signal), throttle 60 s later, suspend 60 s after that,
    requeue last; the inference job is never touched."""
    c = shared_pair()
    steps, mem = drive(c, 8)
    assert [k for k in ladder_kinds(steps)] == [(2, "throttle", "t1"), (4, "suspend", "t1"),
                                                (6, "requeue", "t1")]
    assert c.jobs["p1"].exc_nodes == "n1"
    assert "inference job i1 on n1 GPU 0: P99 400 ms (SLO 250 ms)" in c.jobs["p1"].comment
    assert c.calls == [("signal-URG", "t1"), ("suspend", "t1"), ("requeue", "t1")]
    throttle = steps[2][0]
    assert throttle.details["cause"] == "i1" and throttle.details["signal"] == "p99_ms"
    assert throttle.details["figure"] == 400.0 and throttle.details["limit"] == 250.0
    requeue = next(a for a in steps[6] if a.kind == "requeue")
    assert requeue.details["suspended"] and requeue.details["suspended_s"] == 60.0
    assert requeue.details["throttled_s"] == 120.0
    assert c.jobs["t1"].state == "PENDING" and "t1" not in mem.restrained


def test_requeued_job_is_kept_off_the_node_it_left() -> None:
    c = shared_pair()
    drive(c, 8)
    assert c.jobs["t1"].exc_nodes == "n1", "hold keeps the requeued job off n1"


def test_mig_pools_skip_suspend() -> None:
    """On MIG a suspended job keeps its instance: throttle, then requeue."""
    c = shared_pair(mode="mig-static")
    steps, _ = drive(c, 8)
    assert [k[1] for k in ladder_kinds(steps)] == ["throttle", "requeue"]


def test_exclusive_pools_never_climb() -> None:
    c = shared_pair(mode="exclusive")
    steps, mem = drive(c, 8)
    assert not ladder_kinds(steps) and not mem.ladder


def test_steps_left_out_are_skipped() -> None:
    pol = override(POL, ["ladder.steps=hold,suspend"])
    c = shared_pair()
    steps, _ = drive(c, 6, pol)
    assert [k[1] for k in ladder_kinds(steps)] == ["suspend"]
    assert ("signal-URG", "t1") not in c.calls


# -------------------------------------------------------- de-escalation, dwell, hysteresis
def test_calm_steps_back_in_reverse_after_each_dwell_with_durations() -> None:
    c = shared_pair()

    def world(i: int, ts: float) -> None:
        c.p99["i1"] = BREACH_MS if i < 5 else CALM_MS

    steps, mem = drive(c, 16, each=world)
    got = ladder_kinds(steps)
    assert [k[1] for k in got] == ["throttle", "suspend", "resume-job", "unthrottle"]
    (_, _, _), (i_sus, _, _), (i_res, _, _), (i_unt, _, _) = got
    assert (i_res - 5) * DT >= 60 and (i_unt - i_res) * DT >= 60, "each release dwells"
    resume = next(a for a in steps[i_res] if a.kind == "resume-job")
    assert resume.details["suspended_s"] == (i_res - i_sus) * DT
    assert resume.details["figure_before"] == 400.0 and resume.details["figure_after"] == 100.0
    unthrottle = next(a for a in steps[i_unt] if a.kind == "unthrottle")
    assert unthrottle.details["throttled_s"] > 0 and unthrottle.details["sends"] == "WINCH"
    assert ("signal-WINCH", "t1") in c.calls and c.jobs["t1"].state == "RUNNING"
    assert not mem.restrained and not mem.ladder
    assert c.jobs["p1"].exc_nodes == "", "hold released last: new training admitted again"


@pytest.mark.parametrize("after,moves", [
    (230.0, False),   # below the SLO but within the hysteresis margin (225): no release
    (240.0, False),
    (200.0, True),    # calm: steps back
])
def test_hysteresis(after: float, moves: bool) -> None:
    c = shared_pair()

    def world(i: int, ts: float) -> None:
        c.p99["i1"] = BREACH_MS if i < 3 else after

    steps, _ = drive(c, 14, each=world)
    releases = [k for k in ladder_kinds(steps) if k[1] in ("unthrottle", "resume-job")]
    escalations = [k for k in ladder_kinds(steps) if k[0] > 3 and k[1] in ("suspend",
                                                                               "requeue")]
    assert bool(releases) is moves and not escalations, "below the SLO: no escalation"


def test_a_dip_resets_the_breach_dwell() -> None:
    """Breach, a cycle between SLO and calm, breach: the next step waits a full dwell."""
    c = shared_pair()
    pattern = [BREACH_MS, BREACH_MS, BREACH_MS, 240.0, BREACH_MS, BREACH_MS, BREACH_MS]

    def world(i: int, ts: float) -> None:
        c.p99["i1"] = pattern[i]

    steps, _ = drive(c, len(pattern), each=world)
    assert [k[:2] for k in ladder_kinds(steps)] == [(2, "throttle"), (6, "suspend")]


# --------------------------------------------------------------- unknown: hold position
@pytest.mark.parametrize("case", ["stale", "p99 missing", "signals gone", "agent silent",
                                  "told unknown, calm figure", "told unknown, hot figure"])
def test_unknown_signals_take_no_step_and_release_nothing(case: str) -> None:
    c = shared_pair()

    def world(i: int, ts: float) -> None:
        if i < 3:
            return
        if case == "stale":
            c.age["i1"] = 500.0
        elif case == "p99 missing":
            c.p99["i1"] = None
        elif case == "signals gone":
            c.p99.pop("i1", None)
        elif case.startswith("told unknown"):  # the agent exports a figure it distrusts
            c.p99["i1"] = CALM_MS if "calm" in case else BREACH_MS
            c.told["i1"] = ("latency:stale",)

    pol = POL
    if case == "agent silent":
        snap_fn = c.snapshot

        def silent(ts: float) -> Snapshot:
            s = snap_fn(ts)
            if ts >= T0 + 3 * DT:
                s = dataclasses.replace(s, nodes=tuple(dataclasses.replace(
                    n, gpus=(), telemetry_age_s=None) for n in s.nodes), job_signals={})
            return s
        c.snapshot = silent  # type: ignore[method-assign]
    steps, mem = drive(c, 20, pol, each=world)
    assert [k[1] for k in ladder_kinds(steps)] == ["throttle"], "no step, no release"
    assert mem.restrained["t1"].throttled_since == T0 + 2 * DT
    assert c.jobs["p1"].exc_nodes == "n1", "still held off"


@pytest.mark.parametrize("p99,error_rate,unknown,error_limit,kind", [
    (100.0, 0.0, (), 0.05, "calm"),
    (100.0, 0.0, ("latency:stale",), 0.05, "unknown"),  # every latency figure distrusted
    (400.0, 0.0, ("latency:timeout",), 0.05, "unknown"),  # a distrusted breach: no step
    (100.0, 0.0, ("latency:no-quantiles",), None, "unknown"),
    (100.0, None, ("latency:no-error-series",), 0.05, "unknown"),
    (100.0, 0.0, ("latency:no-error-series",), None, "calm"),  # names the error rate only
    (400.0, 0.0, ("latency:no-error-series",), 0.05, "hot"),
    (100.0, 0.0, ("steps:no-report",), 0.05, "calm"),  # training's signal, not latency
])
def test_a_figure_the_agent_names_unknown_is_unknown(p99: float, error_rate: Optional[float],
                                                     unknown: Tuple[str, ...],
                                                     error_limit: Optional[float],
                                                     kind: str) -> None:
    from slurmiso.monitor.ladder import job_verdict

    sig = JobSignals("i1", "infer", "n1", ((0, ""),), p99_ms=p99, error_rate=error_rate,
                     requests=100.0, latency_age_s=5.0, unknown=unknown)
    slo = SloLimit("infer", None, 250, error_limit, class_latency=False)
    assert job_verdict("i1", sig, slo, POL).kind == kind


def test_an_idle_inference_job_is_calm() -> None:
    """No requests in the window: nobody waits on it, the ladder steps back."""
    c = shared_pair()
    steps, mem = drive(c, 3)
    s = c.snapshot
    c.snapshot = lambda ts: dataclasses.replace(  # type: ignore[method-assign]
        s(ts), job_signals={"i1": JobSignals("i1", "infer", "n1", ((0, ""),), requests=0.0,
                                             latency_age_s=5.0)})
    steps, mem = drive(c, 10, mem=mem, start=T0 + 3 * DT)
    assert "unthrottle" in [k[1] for k in ladder_kinds(steps)]


# ------------------------------------------------------------------------------- budgets
def test_per_hour_budget_goes_to_lowest_priority_first_and_caps_the_climb() -> None:
    pol = override(POL, ["ladder.throttle.per_hour=2"])
    c = Cluster()
    c.run_job("i1", "infer", p99=BREACH_MS)
    for jid, prio in (("t1", 300.0), ("t2", 100.0), ("t3", 200.0)):
        c.run_job(jid, "train", priority=prio)
    steps, mem = drive(c, 12, pol)
    got = ladder_kinds(steps)
    assert [k[1:] for k in got] == [("throttle", "t2"), ("throttle", "t3")]
    assert "t1" not in mem.restrained
    assert "throttle budget spent" in mem.ladder["n1/0"].capped
    assert "suspend waits" in mem.ladder["n1/0"].capped or \
        mem.ladder["n1/0"].step == "throttle", "no suspend while throttle is unapplied"
    assert mem.ladder["n1/0"].step == "throttle"


def test_per_job_budget_bounds_a_job_that_keeps_breaching() -> None:
    """requeue per_job 1: one requeue an hour caused by i1, however often it breaches."""
    pol = override(POL, ["ladder.requeue.per_job=1"])
    c = shared_pair()
    c.run_job("t2", "train", gpu=0, priority=5.0)
    steps, mem = drive(c, 12, pol)
    requeues = [k for k in ladder_kinds(steps) if k[1] == "requeue"]
    assert len(requeues) == 1
    assert "requeue budget of inference job i1 spent" in mem.ladder["n1/0"].capped


# ------------------------------------------------------- a job can lie only about itself
def test_forged_latency_reaches_only_the_training_on_its_own_gpu() -> None:
    """i1 reports 10 s on n1 GPU 0 and its signals claim GPU 1 and node n2 too: only t1
    (sharing GPU 0) is acted on; t2 (GPU 1 of n1) and t3 (n2) never; the budgets bound
    what it costs."""
    c = Cluster(nodes=("n1", "n2"))
    c.run_job("i1", "infer", "n1", 0, p99=10_000.0)
    c.run_job("t1", "train", "n1", 0)
    c.run_job("t2", "train", "n1", 1)
    c.run_job("t3", "train", "n2", 0)
    real = c.snapshot

    def forged(ts: float) -> Snapshot:
        s = real(ts)
        sig = s.job_signals["i1"]
        lie = dataclasses.replace(sig, gpus=((0, ""), (1, "")))
        elsewhere = dataclasses.replace(sig, node="n2", gpus=((0, ""),))
        return dataclasses.replace(s, job_signals={"i1": lie, "i1x": elsewhere})

    c.snapshot = forged  # type: ignore[method-assign]
    pol = override(POL, ["ladder.throttle.per_job=1", "ladder.suspend.per_job=1",
                         "ladder.requeue.per_job=1"])
    steps, mem = drive(c, 40, pol)
    touched = {k[2] for k in ladder_kinds(steps)}
    assert touched == {"t1"}
    assert len(ladder_kinds(steps)) <= 3, "one of each step an hour at most"
    assert set(mem.ladder) == {"n1/0"}


def test_signals_cannot_claim_a_gpu_on_a_node_slurm_does_not_show() -> None:
    c = Cluster(nodes=("n1", "n2"))
    c.run_job("i1", "infer", "n1", 0, p99=10_000.0)
    c.run_job("t3", "train", "n2", 0)
    real = c.snapshot
    c.snapshot = lambda ts: dataclasses.replace(  # type: ignore[method-assign]
        real(ts), job_signals={"i1": dataclasses.replace(real(ts).job_signals["i1"],
                                                         node="n2")})
    steps, mem = drive(c, 12)
    assert not ladder_kinds(steps) and set(mem.ladder) == {"n1/0"}, "n2 untouched"


def test_inference_jobs_are_never_acted_on_even_two_on_one_gpu() -> None:
    c = Cluster()
    c.run_job("i1", "infer", p99=BREACH_MS)
    c.run_job("i2", "infer", p99=CALM_MS)
    steps, mem = drive(c, 12)  # drive() asserts no action targets an inference job
    assert not ladder_kinds(steps) and mem.ladder["n1/0"].step == "hold"


# ------------------------------------------------------------ the gate, fixed (issue 24)
def test_training_only_hot_gpu_holds_no_training() -> None:
    """One training GPU at 95 % SM on a node with no inference: the pending training job is
    neither held nor excluded."""
    c = Cluster()
    c.run_job("t1", "train")
    c.sm[("n1", 0)] = 95.0
    c.submit("p1")
    steps, mem = drive(c, 3)
    assert not any(steps) and c.jobs["p1"].exc_nodes == "" and not c.jobs["p1"].held


def test_hot_gpu_shared_with_inference_names_the_inference_job() -> None:
    c = Cluster(nodes=("n1", "n2"))
    c.run_job("i1", "infer")
    c.run_job("t1", "train", gpu=1)
    c.sm[("n1", 0)] = 95.0
    c.sm[("n1", 1)] = 20.0
    c.submit("p1")
    drive(c, 1)
    assert c.jobs["p1"].exc_nodes == "n1"
    assert "n1 GPU 0 SM 95% (limit 85%), inference job i1 there" in c.jobs["p1"].comment


def test_hot_training_gpu_beside_calm_inference_gpu_holds_nothing() -> None:
    c = Cluster()
    c.run_job("i1", "infer", gpu=0)
    c.run_job("t1", "train", gpu=1)
    c.sm[("n1", 1)] = 99.0
    c.submit("p1")
    steps, _ = drive(c, 2)
    assert c.jobs["p1"].exc_nodes == ""


def test_thousand_nodes_five_percent_hot_only_breaching_inference_nodes_are_affected() -> None:
    """1,000 nodes x 8 GPUs, 5 % of GPUs at 95 % SM under training alone, inference on a
    tenth of the nodes, 7 of whose jobs breach: exactly those 7 nodes are kept off, the
    running training beside each breach gets the ladder, nothing else moves."""
    rnd = random.Random(24)
    names = [f"n{i:04d}" for i in range(1000)]
    c = Cluster(nodes=names, gpus=8)
    k = 0
    for n in names:
        for g in range(8):
            if rnd.random() < 0.05:
                c.sm[(n, g)] = 95.0
                c.run_job(f"t{k}", "train", n, g)
                k += 1
    breaching = set()
    for i, n in enumerate(names[::10]):
        hot = i < 7
        c.run_job(f"i{i}", "infer", n, 7, p99=BREACH_MS if hot else CALM_MS)
        c.sm[(n, 7)] = 30.0
        if hot:
            c.run_job(f"b{i}", "train", n, 7)
            breaching.add(n)
    for j in range(50):
        c.submit(f"p{j}")
    steps, mem = drive(c, 3)
    excluded = {c.jobs[f"p{j}"].exc_nodes for j in range(50)}
    from slurmiso.hostlist import expand
    assert {n for e in excluded for n in expand(e)} == breaching
    beside = {j for j, (n, g) in c.place.items()
              if n in breaching and g == 7 and c.jobs[j].job_class == "train"}
    assert {f"b{i}" for i in range(7)} <= beside
    assert {a.target for a in steps[2] if a.kind == "throttle"} == beside
    assert all(a.kind in ("exclude", "throttle") for s in steps for a in s)
    assert {k.split("/")[0] for k in mem.ladder} == breaching


# --------------------------------------------------------- dry-run = real; failures; restart
def test_dry_run_equals_real_run() -> None:
    from slurmiso.monitor.loop import Monitor

    def world(c: Cluster, i: int) -> None:
        c.p99["i1"] = BREACH_MS if i < 8 else CALM_MS

    def run(dry: bool, tmp: str) -> List[List[Tuple[str, str]]]:
        c = shared_pair()
        frozen = shared_pair()  # what a dry run sees: Slurm never changes
        clock = iter(range(20))
        seen = frozen if dry else c

        def snap() -> Snapshot:
            i = next(clock)
            world(seen, i)
            return seen.snapshot(T0 + i * DT)

        mon = Monitor(POL, snap, Applier(None, c), f"{tmp}/s{dry}.json", f"{tmp}/l{dry}",
                      30, dry_run=dry, sleep=lambda s: None)
        out = [[(o.action.kind, o.action.target) for o in outs]
               for outs in mon.run(cycles=20)]
        mon.close()
        return out

    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        assert run(True, tmp) == run(False, tmp)


def test_failed_escalations_give_the_budget_back_and_failed_releases_stay_owed() -> None:
    c = shared_pair()
    steps, mem = drive(c, 3)
    throttle = next(a for a in steps[2] if a.kind == "throttle")
    undone = failed(mem, throttle, "scancel failed")
    assert "t1" not in undone.restrained
    assert not undone.events.get("ladder:throttle")
    rec = Restraint("n1", 0, "i1", throttled_since=T0)
    release = Action("unthrottle", "t1", "calm", {"restraint": rec.to_dict()})
    kept = failed(Memory(), release, "scancel failed")
    assert kept.restrained["t1"].throttled_since == T0


def test_restart_reconciles_a_suspend_that_never_happened() -> None:
    c = shared_pair()
    mem = Memory(restrained={"t1": Restraint("n1", 0, "i1", throttled_since=T0,
                                             suspended_since=T0 + 30)},
                 intent=[["suspend", "t1", "", ""]])
    reconcile_intent(c.snapshot(T0 + 60), mem)  # Slurm shows t1 RUNNING
    assert mem.restrained["t1"].suspended_since is None
    mem2 = Memory(intent=[["resume-job", "t1", "", ""]])
    c.jobs["t1"] = dataclasses.replace(c.jobs["t1"], state="SUSPENDED")
    reconcile_intent(c.snapshot(T0 + 60), mem2)
    assert mem2.restrained["t1"].suspended_since == T0 + 60, "owed a resume"


def test_someone_elses_resume_is_respected() -> None:
    c = shared_pair()
    steps, mem = drive(c, 5)
    assert c.jobs["t1"].state == "SUSPENDED"
    c.jobs["t1"] = dataclasses.replace(c.jobs["t1"], state="RUNNING")  # an admin resumed it
    steps, mem = drive(c, 6, mem=mem, start=T0 + 5 * DT)
    ends = [a for s in steps for a in s if a.kind == "ladder-end"]
    assert ends and "someone else resumed it" in ends[0].reason
    assert not [k for k in ladder_kinds(steps) if k[1] != "ladder-end"]
    assert "t1" in mem.ladder_exempt


def test_a_job_that_ends_while_throttled_is_journaled_with_its_duration() -> None:
    c = shared_pair()
    steps, mem = drive(c, 3)
    del c.jobs["t1"], c.place["t1"]
    steps, mem = drive(c, 1, mem=mem, start=T0 + 4 * DT)
    end = next(a for a in steps[0] if a.kind == "ladder-end")
    assert end.details["throttled_s"] == 2 * DT and not mem.restrained


def test_ladder_off_releases_what_it_holds() -> None:
    c = shared_pair()
    _, mem = drive(c, 5)
    steps, mem = drive(c, 2, override(POL, ["ladder.steps="]), mem=mem, start=T0 + 5 * DT)
    # the unthrottle waits a cycle: a signal to a step Slurm is still resuming is dropped
    assert [k[:2] for k in ladder_kinds(steps)] == [(0, "resume-job"), (1, "unthrottle")]
    assert not mem.restrained


# ------------------------------------------------------------------ snapshot and --set
def test_snapshot_round_trip_and_old_snapshots_load() -> None:
    s = shared_pair().snapshot(T0)
    back = loads(dumps(s))
    assert back.job_signals == s.job_signals
    old = s.to_dict()
    old["version"] = 1
    del old["job_signals"]
    import json
    assert loads(json.dumps(old)).job_signals == {}


@pytest.mark.parametrize("knob", ["ladder.steps=throttle", "ladder.steps=hold,requeue,suspend",
                                  "ladder.suspend.per_hour=0", "ladder.throttle.after_s=-1",
                                  "ladder.throttle_signal=USR1", "ladder.bogus=1"])
def test_set_rejects_nonsense(knob: str) -> None:
    from slurmiso.errors import UsageError

    with pytest.raises(UsageError):
        override(POL, [knob])


#: --set ladder.* and the same value under monitor.ladder in the file: one checker, one error.
SAME_AS_THE_FILE = [
    ("ladder.hysteresis_pct=100", {"hysteresis": 100}),  # calm would be unreachable
    ("ladder.hysteresis_pct=-5", {"hysteresis": -5}),
    ("ladder.hysteresis_pct=lots", {"hysteresis": "lots"}),
    ("ladder.unthrottle_signal=URG", {"unthrottle_signal": "URG"}),  # slow down == full speed
    ("ladder.throttle_signal=WINCH", {"throttle_signal": "WINCH"}),
    ("ladder.throttle_signal=USR1", {"throttle_signal": "USR1"}),
    ("ladder.steps=throttle", {"steps": ["throttle"]}),
    ("ladder.steps=hold,hold", {"steps": ["hold", "hold"]}),
    ("ladder.steps=hold,suspend,throttle", {"steps": ["hold", "suspend", "throttle"]}),
    ("ladder.steps=hold,pause", {"steps": ["hold", "pause"]}),
    ("ladder.requeue.per_hour=0", {"requeue": {"per_hour": 0}}),
    ("ladder.throttle.after_s=-30", {"throttle": {"after": -30}}),
    ("ladder.suspend.release_after_s=soon", {"suspend": {"release_after": "soon"}}),
    ("ladder.hold.per_hour=3", {"hold": {"per_hour": 3}}),
]


@pytest.mark.parametrize("knob,yaml_ladder", SAME_AS_THE_FILE)
def test_set_ladder_gets_the_config_checks_and_words(knob: str, yaml_ladder: Dict) -> None:
    import os

    import yaml

    from slurmiso.config import parse_config
    from slurmiso.errors import ConfigError, UsageError

    etc = os.path.join(os.path.dirname(__file__), "..", "..", "etc", "slurmiso.yaml")
    with open(etc, encoding="utf-8") as fh:
        data = yaml.safe_load(fh)
    data["monitor"]["ladder"] = yaml_ladder
    with pytest.raises(ConfigError) as cfg_err:
        parse_config(data, "x.yaml")
    in_file = [p.split(": ", 1)[1] for p in cfg_err.value.problems
               if p.startswith("x.yaml: monitor.ladder")]
    with pytest.raises(UsageError) as err:
        override(POL, [knob])
    line = str(err.value).splitlines()[0]
    assert line.startswith(f"--set {knob}: monitor.ladder."), line
    assert in_file and line.split(": ", 1)[1].startswith(in_file[0]), (line, in_file)


def test_set_ladder_is_checked_against_the_classes_checkpoint_signals() -> None:
    """A class checkpointing on URG is fine while the ladder never throttles; turning the
    throttle on with --set is refused with the file's words."""
    import os

    import yaml

    from slurmiso.config import parse_config
    from slurmiso.errors import ConfigError, UsageError
    from slurmiso.monitor.policy import policy_from_config

    etc = os.path.join(os.path.dirname(__file__), "..", "..", "etc", "slurmiso.yaml")
    with open(etc, encoding="utf-8") as fh:
        data = yaml.safe_load(fh)
    for c in data["classes"]:
        if c.get("checkpoint"):
            c["checkpoint"]["signal"] = "URG"
    data["monitor"]["ladder"] = {"steps": ["hold", "suspend", "requeue"]}
    cfg = parse_config(data, "x.yaml")
    with pytest.raises(UsageError) as err:
        override(policy_from_config(cfg), ["ladder.steps=hold,throttle"], cfg)
    data["monitor"]["ladder"] = {"steps": ["hold", "throttle"]}
    with pytest.raises(ConfigError) as cfg_err:
        parse_config(data, "x.yaml")
    in_file = [p.split(": ", 1)[1] for p in cfg_err.value.problems if "checkpoint signal" in p]
    assert in_file and str(err.value).startswith(
        f"--set ladder.steps=hold,throttle: {in_file[0]}"), (str(err.value), in_file)
    assert override(policy_from_config(cfg), ["ladder.hysteresis_pct=5"], cfg).ladder.names() \
        == ("hold", "suspend", "requeue"), "no throttle, no conflict"


def test_set_ladder_error_is_one_line_from_the_cli(tmp_path: pytest.TempPathFactory,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    import os

    from slurmiso.cli.main import main

    cfg = os.path.join(os.path.dirname(__file__), "..", "..", "etc", "slurmiso.yaml")
    state = os.path.join(str(tmp_path), "state.json")
    rc = main(["-c", cfg, "monitor", "status", "--state", state,
               "--set", "ladder.hysteresis_pct=100"])
    err = capsys.readouterr().err
    assert rc != 0 and "Traceback" not in err
    assert "--set ladder.hysteresis_pct=100: monitor.ladder.hysteresis: 100 is out of range " \
           "(allowed: 0..90)" in err, err


def test_set_ladder_still_sets_what_the_file_allows() -> None:
    pol = override(POL, ["ladder.hysteresis_pct=20", "ladder.throttle_signal=winch",
                         "ladder.unthrottle_signal=URG", "ladder.throttle.after_s=30",
                         "ladder.steps=hold,throttle,requeue", "ladder.requeue.per_job=2"])
    lad = pol.ladder
    assert (lad.hysteresis_pct, lad.throttle_signal, lad.unthrottle_signal) == (
        20.0, "WINCH", "URG")
    assert lad.names() == ("hold", "throttle", "requeue")
    assert lad.step("throttle") == StepPolicy("throttle", 30.0, 60.0, 6, 100)
    assert lad.step("requeue") == StepPolicy("requeue", 60.0, 60.0, 2, 100)
    back = override(pol, ["ladder.steps=hold,throttle,suspend,requeue"])
    assert back.ladder.step("suspend") == LadderPolicy().step("suspend"), "a step added back " \
        "gets the defaults"
    with pytest.raises(Exception, match="'suspend' is not in ladder.steps"):
        override(pol, ["ladder.suspend.per_job=2"])


def test_error_rate_breach_climbs_too() -> None:
    c = shared_pair()
    c.p99["i1"] = CALM_MS
    real = c.snapshot
    c.snapshot = lambda ts: dataclasses.replace(  # type: ignore[method-assign]
        real(ts), job_signals={"i1": dataclasses.replace(real(ts).job_signals["i1"],
                                                         error_rate=0.2)})
    steps, mem = drive(c, 3)
    throttle = next(a for a in steps[2] if a.kind == "throttle")
    assert throttle.details["signal"] == "error_rate"
    assert "error rate 20.0% (SLO 5.0%)" in throttle.reason


def test_unlabelled_gpus_get_their_jobs_from_signals_for_jobs_slurm_shows_there() -> None:
    """One place ties signals to GPUs (Attribution), live or replayed: the gather hands
    the samples on as the agents said them."""
    from slurmiso.monitor.attribution import Attribution

    jobs = (JobInfo("i1", "RUNNING", "infer", ("shared",), "infer", T0, nodes=("n1",)),
            JobInfo("t9", "RUNNING", "train", ("shared",), "train", T0, nodes=("n2",)))
    node = NodeInfo("n1", "MIXED", ("shared",), "p", "mps", "", "",
                    (GpuSample(0, 1, 80_000, 10.0), GpuSample(1, 1, 80_000, 10.0)), 5.0)
    sigs = {"i1": JobSignals("i1", "infer", "n1", ((1, ""),), p99_ms=10.0, latency_age_s=1.0),
            "t9": JobSignals("t9", "train", "n1", ((0, ""),))}  # t9 runs on n2, not n1
    who = Attribution(Snapshot(T0, (node,), {"shared": ("n1",)}, jobs, job_signals=sigs),
                      ["train"])
    assert who.jobs_on("n1", 0) == [] and [j.id for j in who.jobs_on("n1", 1)] == ["i1"]
    assert who.inference_gpus(node) == frozenset({1}), "only i1's GPU serves inference"
    assert who.gpus_of == {"i1": [("n1", 1)]}
