"""The SLO ladder on the live sandbox, one step at a time (issue 24, "how it must be shown").

One scene serves the whole module (:class:`slurmiso_sandbox.protect.Ladder`): on n2 (MPS) an
inference job (the stand-in server, ``--iso-metrics``) and a training job (``slurmiso run``
around the stand-in training program) share one GPU; a second training job holds a GPU of n5
(time-slice), run hot by simulated load with no inference on the node; real agents for n2 and n5 and a real monitor daemon (``--apply``, 1 s cycles, 2 s
dwells) do the rest. The tests drive the stand-in's latency over its SLO and back, and read
what happened from Slurm, the monitor's journal and memory, and the programs' own logs.

The tests run in file order and each leaves the scene as it found it (no rung, training
running at full speed); each restarts the monitor (same memory) with the steps it shows.
Every wait is for a state, polled under a deadline that only guards a hang; "nothing happened"
is asserted over a counted number of monitor cycles (each at least one interval long) that
exceeds the dwell it would have taken, never over a time.
"""

from __future__ import annotations

import functools
import os
import re
from typing import Any, Dict, Iterator, List

import pytest

from slurmiso_sandbox.protect import (
    CALM_MS,
    HOT_MS,
    SLO_MS,
    Ladder,
    contiguous,
    http_get,
    read_text,
)
from tests import waiting

HANG = 120  # seconds: a deadline that only says "this hangs"
#: Sandbox reads are Slurm commands: poll them gently; only a hang times out.
until = functools.partial(waiting.wait_for, every=0.3, timeout=HANG)
DWELL = 2  # the scene's dwell: throttle after 2 s, suspend/requeue 4 s after it
#: Budgets per job and hour: the forged-latency test spends the throttle budget.
BUDGETS = {"throttle": "per_job: 8, per_hour: 120", "suspend": "per_job: 3, per_hour: 30",
           "requeue": "per_job: 1, per_hour: 10"}
HELD = ("JobHeldAdmin", "JobHeldUser")

#: How the journal words a breach of the stand-in's TTFT SLO (issue 32: the share of requests
#: over the bound, judged on vLLM's buckets, the interpolated P99 beside it).
BREACH = re.compile(r"time to first token of model standin: \d+\.\d% of requests over "
                    f"{SLO_MS} ms" r" \(SLO: at most 1\.0%\), P99 about \d+ ms")


@pytest.fixture(autouse=True)
def _empty_queue() -> Iterator[None]:
    """The scene spans the module: the conftest's per-test queue clearing would end it (the
    scene's own teardown empties the queue)."""
    yield


class Scene:
    """The module's scene: the Ladder plus the facts the tests check against."""

    def __init__(self, lad: Ladder, gpu: int, far: str, probes: Dict[str, str]) -> None:
        self.lad, self.sbx, self.gpu = lad, lad.sbx, gpu
        self.infer, self.train = lad.infer, lad.train
        self.far, self.probes = far, probes
        self.served = lad.served()

    # -- reading the monitor -----------------------------------------------------------------
    def entries(self, job: str, kinds: Any = None) -> List[Dict[str, Any]]:
        return [e for e in self.lad.actions() if e.get("target") == job
                and (kinds is None or e.get("action") in kinds)]

    def kinds(self, job: str) -> List[str]:
        return self.lad.ladder_kinds(job)

    def wait_new(self, before: int, want: List[str]) -> List[str]:
        """Wait until the training job's ladder actions after the first ``before`` include
        ``want`` in order; returns them."""
        def got() -> Any:
            new = [k for k in self.kinds(self.train)[before:] if k != "ladder-end"]
            return new if new[:len(want)] == want else None

        return list(until(got, f"{want} on training job {self.train} "
                               f"(so far {self.kinds(self.train)[before:]}; monitor log "
                               f"{self.lad.work})"))

    def entry(self, kind: str, nth: int = -1) -> Dict[str, Any]:
        return self.entries(self.train, (kind,))[nth]

    def rung(self) -> Dict[str, Any]:
        return dict((self.lad.memory().get("ladder") or {}).get(f"n2/{self.gpu}") or {})

    def restraint(self) -> Dict[str, Any]:
        return dict((self.lad.memory().get("restrained") or {}).get(self.train) or {})

    # -- reading the programs ----------------------------------------------------------------
    def throttle_file(self) -> bool:
        from slurmiso.wrapper.throttle import throttle_path

        return os.path.lexists(throttle_path(os.path.join(self.lad.work, "ckpt")))

    def last_step_line(self) -> str:
        lines = re.findall(r"^step=\d+ .*$", read_text(self.lad.train_log), re.M)
        return lines[-1] if lines else ""

    def progressed(self, log: str, n: int) -> None:
        base = len(self.lad.steps(log))
        until(lambda: len(self.lad.steps(log)) >= base + n, f"{n} more steps in {log}")

    def probe(self, pool: str) -> Dict[str, str]:
        f = self.sbx.job_fields(self.probes[pool])
        comment = self.sbx.cmd("squeue", "-h", "-j", self.probes[pool], "-o", "%k",
                               check=False).strip()
        return {"exclude": f.get("ExcNodeList", ""), "reason": f.get("Reason", ""),
                "comment": comment}

    def kept_off_n2(self) -> bool:
        p = self.probe("mps")
        return "n2" in p["exclude"] or p["reason"] in HELD

    def settle(self) -> None:
        """Wait for the scene as every test starts it: no rung on the shared GPU, training
        running unthrottled, the arriving mps job no longer kept off n2."""
        until(lambda: not self.rung() and not self.restraint(), "the ladder to step down")
        until(lambda: self.sbx.job_state(self.train) == "RUNNING", "training to run")
        until(lambda: not self.kept_off_n2(), "the hold on n2 to end")
        assert not self.throttle_file()

    def untouched(self) -> None:
        """The inference job and the bystanders: same jobs, running, never acted on, never
        signalled, the server still serving."""
        sbx = self.sbx
        assert self.entries(self.infer) == [], "the monitor acted on the inference job"
        f = sbx.job_fields(self.infer)
        assert f.get("JobState") == "RUNNING" and f.get("Restarts", "0") == "0", f
        assert f.get("SuspendTime", "None") in ("None", "", "(null)"), f
        assert self.lad.infer_signals() == [], "the inference job was signalled"
        served = self.lad.served()
        until(lambda: self.lad.served() > served, "the inference job to serve on")
        job = self.far
        assert self.entries(job) == [], f"the monitor acted on bystander {job}"
        g = sbx.job_fields(job)
        assert g.get("JobState") == "RUNNING" and g.get("Restarts", "0") == "0", g
        assert self.lad.throttled_steps(self.lad.others[job]) == []


@pytest.fixture(scope="module")
def scene(sandbox: Any) -> Iterator[Scene]:
    from slurmiso.gpu.sim import SimBackend
    from slurmiso_sandbox.scenes import record_gpu

    lad = Ladder(sandbox, ("hold", "throttle"), dwell_s=DWELL, window_s=4, budgets=BUDGETS)
    sims = {n: SimBackend(sandbox.path("sim", f"{n}.json")) for n in ("n2", "n5")}
    loaded: List[Any] = []
    probes: Dict[str, str] = {}
    for sim in sims.values():  # the scene's GPUs start idle, whatever an earlier run injected
        sim.clear_load()
    try:
        lad.start_jobs()
        gpus = lad.gpus()
        assert len(set(gpus.values())) == 1, f"the two jobs do not share one GPU: {gpus}"
        gpu = gpus[lad.infer]
        far = lad.add_training("train-far", "-p", "tslice", "--gres=shard:4", "-w", "n5")
        far_gpu = record_gpu(sandbox, "n5", far)
        # a training-only GPU runs hot: training's own load is training's business
        sims["n5"].set_load(far_gpu, util=95, sm_active=95, memory_used_mb=72 * 1024)
        loaded.append(("n5", far_gpu))
        lad.start_daemons(more=("n5",))
        for pool, part in (("mps", "mps"), ("tslice", "tslice")):
            probes[pool] = sandbox.submit("#!/bin/bash\nsleep 1\n", "-p", part, "--qos=train",
                                          "--gres=" + ("mps:50" if pool == "mps" else "shard:1"),
                                          "--begin=now+600", "-J", f"arrives-{pool}")
        yield Scene(lad, gpu, far, probes)
    except BaseException:
        lad.debug_cycle()
        raise
    finally:
        lad.stop()
        for node, g in loaded:
            sims[node].clear_load(g)
        for job in probes.values():
            sandbox.cmd("scancel", job, check=False)
        sandbox.clear_queue()


def test_calm_inference_and_training_only_hot_gpus_take_no_step(scene: Scene) -> None:
    """Attribution: a GPU of n5 runs at 95 % SM and 90 % memory with only training on the
    node; inference (on n2) is within its SLO. No training is held, no step is taken."""
    lad = scene.lad
    lad.wait_cycles(2 * DWELL + 4)
    # the premise: the agents show those GPUs hot
    text = http_get(lad.agents["n5"][1], "/metrics")
    assert re.search(r'^DCGM_FI_PROF_SM_ACTIVE\{[^}]*\} 0\.95', text, re.M), text
    assert lad.actions() == [], "the monitor acted with inference calm"
    for pool in ("mps", "tslice"):
        p = scene.probe(pool)
        assert p["exclude"] in ("", "(null)") and p["reason"] not in HELD, (pool, p)
    assert not lad.memory().get("ladder") and not lad.memory().get("restrained")
    assert lad.throttled_steps() == []
    scene.untouched()


def test_throttle_then_unthrottle(scene: Scene) -> None:
    """Over the SLO: the training on the inference job's GPU is throttled, its program sees
    the throttle file, new training is kept off n2; within the SLO for the dwell: unthrottled,
    the file is gone, training runs at full speed."""
    lad, infer, gpu = scene.lad, scene.infer, scene.gpu
    scene.settle()
    before = len(scene.kinds(scene.train))
    lad.set_latency(HOT_MS)
    scene.wait_new(before, ["throttle"])
    e = scene.entry("throttle")
    assert e["ok"] is True and e["dry_run"] is False
    assert e["reason"].startswith(
        f"training throttled: asked to slow down: inference job {infer} on n2 GPU {gpu}: "
    ) and BREACH.search(e["reason"]), e["reason"]
    d = e["details"]
    assert (d["cause"], d["signal"], d["gpu"], d["sends"]) == (infer, "p99_ms", f"n2/{gpu}",
                                                               "URG")
    assert d["figure"] > SLO_MS and d["limit"] == SLO_MS
    assert re.fullmatch(r"throttle \d+/120 this hour", d["budget"]), d["budget"]
    until(scene.throttle_file, "the wrapper to create the throttle file")
    until(lambda: "throttled=1" in scene.last_step_line(), "a throttled step")
    until(scene.kept_off_n2, "new training to be kept off n2")
    held = scene.entries(scene.probes["mps"], ("hold", "exclude"))
    assert held and f"inference job {infer} on n2 GPU {gpu}: time to first token" in held[-1][
        "reason"], held
    assert scene.probe("tslice")["exclude"] in ("", "(null)"), "n5 was not in breach"

    lad.set_latency(CALM_MS)
    assert scene.wait_new(before, ["throttle", "unthrottle"]) == ["throttle", "unthrottle"]
    e = scene.entry("unthrottle")
    assert e["ok"] is True and e["reason"].startswith("training back to full speed after ")
    assert f"inference on n2 GPU {gpu} within its SLO" in e["reason"], e["reason"]
    assert e["details"]["throttled_s"] > 0 and e["details"]["sends"] == "WINCH"
    until(lambda: not scene.throttle_file(), "the throttle file to go")
    until(lambda: scene.last_step_line() and "throttled=1" not in scene.last_step_line(), "a step at full speed")
    scene.settle()
    events = _wrapper_events(scene)
    assert events.count("throttle") >= 1 and events.count("unthrottle") >= 1, events
    assert scene.kinds(scene.train)[before:] == ["throttle", "unthrottle"]
    scene.untouched()


def test_unknown_signals_take_no_step_and_release_nothing(scene: Scene) -> None:
    """An endpoint answering garbage while the server is over its SLO: no step. Throttled,
    then the agent stops while the server is calm again: no release (the throttle file
    stays); the agent back: released."""
    lad = scene.lad
    scene.settle()
    before = len(scene.kinds(scene.train))
    lad.set_garbage(HOT_MS)
    until(lambda: re.search(r'^slurmiso_job_signal_unknown\{[^}]*job="' + scene.infer
                            + r'"[^}]*reason="no-known-series"', lad.scrape(), re.M), "the agent to call the garbage unknown")
    lad.wait_cycles(3 * DWELL + 4)  # longer than hold and throttle would take
    assert scene.kinds(scene.train)[before:] == [], "a step on unknown signals"
    assert not scene.rung() and not scene.throttle_file()

    lad.set_latency(HOT_MS)  # readable again, and over the SLO
    scene.wait_new(before, ["throttle"])
    until(scene.throttle_file, "the throttle file")
    lad.stop_agent()
    lad.set_latency(CALM_MS)
    until(lambda: re.search(r'^slurmiso_monitor_unknown_signals\{[^}]*source="agents"',
                            http_get(lad.metrics_port, "/metrics"), re.M), "the monitor to count n2's agent unknown")  # n5's answers: n2's is the one missing
    lad.wait_cycles(3 * DWELL + 4)  # longer than the release would take
    assert scene.kinds(scene.train)[before:] == ["throttle"], "released on unknown signals"
    assert scene.rung().get("step") == "throttle" and scene.throttle_file()
    assert scene.restraint().get("throttled_since") is not None

    lad.start_agent()
    assert scene.wait_new(before, ["throttle", "unthrottle"]) == ["throttle", "unthrottle"]
    until(lambda: not scene.throttle_file(), "the throttle file to go")
    scene.settle()
    scene.untouched()


def test_suspend_then_resume(scene: Scene) -> None:
    """Over the SLO with suspend on the ladder: throttled, then Slurm shows the training job
    SUSPENDED (no step counted while stopped); within the SLO for the dwell: RUNNING again,
    then unthrottled."""
    lad, sbx, infer, gpu = scene.lad, scene.sbx, scene.infer, scene.gpu
    scene.settle()
    lad.restart_monitor(("hold", "throttle", "suspend"))
    before = len(scene.kinds(scene.train))
    lad.set_latency(HOT_MS)
    scene.wait_new(before, ["throttle", "suspend"])
    until(lambda: sbx.job_state(scene.train) == "SUSPENDED", "Slurm to show SUSPENDED")
    e = scene.entry("suspend")
    assert e["ok"] is True and e["reason"].startswith(
        f"training suspended: inference job {infer} on n2 GPU {gpu}: ") and BREACH.search(
        e["reason"]), e["reason"]
    assert re.fullmatch(r"suspend \d+/30 this hour", e["details"]["budget"])
    steps = len(lad.steps())
    served = lad.served()
    lad.wait_cycles(3)
    assert sbx.job_state(scene.train) == "SUSPENDED"
    assert len(lad.steps()) == steps, "the suspended program counted steps"
    assert lad.served() > served, "inference stopped with the training"

    lad.set_latency(CALM_MS)
    new = scene.wait_new(before, ["throttle", "suspend", "resume-job", "unthrottle"])
    assert new == ["throttle", "suspend", "resume-job", "unthrottle"]
    e = scene.entry("resume-job")
    assert e["ok"] is True and e["reason"].startswith("training resumed after "), e["reason"]
    assert f"inference on n2 GPU {gpu} within its SLO" in e["reason"]
    assert e["details"]["suspended_s"] > 0
    until(lambda: sbx.job_state(scene.train) == "RUNNING", "Slurm to show RUNNING")
    scene.progressed(lad.train_log, 10)
    scene.settle()
    scene.untouched()


def test_requeue_checkpoints_and_resumes(scene: Scene) -> None:
    """Over the SLO with requeue on the ladder (after throttle): the training job is requeued,
    checkpoints on the way out, waits while n2 is held, and resumes from its checkpoint once
    calm; every step counted once, the requeue taken once."""
    lad, sbx, infer, gpu = scene.lad, scene.sbx, scene.infer, scene.gpu
    scene.settle()
    lad.restart_monitor(("hold", "throttle", "requeue"))
    before = len(scene.kinds(scene.train))
    lad.set_latency(HOT_MS)
    assert scene.wait_new(before, ["throttle", "requeue"]) == ["throttle", "requeue"]
    e = scene.entry("requeue")
    assert e["ok"] is True and e["reason"].startswith(
        "training requeued: checkpoints, then starts again off this node: inference job "
        f"{infer} on n2 GPU {gpu}: ") and BREACH.search(e["reason"]), e["reason"]
    assert e["details"]["budget"] == "requeue 1/10 this hour"
    ckpt = until(lambda: re.search(r"^# checkpoint step=(\d+)$", read_text(lad.train_log), re.M), "the training program's checkpoint")
    until(lambda: sbx.job_state(scene.train) == "PENDING", "the training job to leave n2")

    def kept_off() -> bool:
        f = sbx.job_fields(scene.train)
        return f.get("Reason") in HELD or "n2" in f.get("ExcNodeList", "")

    until(kept_off, "the requeued job to be kept off n2 while the breach lasts")
    lad.set_latency(CALM_MS)
    until(lambda: sbx.job_fields(scene.train).get("Restarts") == "1"
          and sbx.job_state(scene.train) == "RUNNING", "the requeued job to run again", timeout=180)
    until(lambda: re.search(rf"^# start at={ckpt.group(1)} restart=1 ", read_text(lad.train_log),
                            re.M), f"the program to resume from step {ckpt.group(1)}")
    scene.progressed(lad.train_log, 10)
    assert contiguous(lad.steps()), "a step lost or counted twice across the requeue"
    assert scene.kinds(scene.train).count("requeue") == 1
    assert "checkpoint-end" in _wrapper_events(scene)
    scene.settle()
    scene.untouched()


def test_forged_latency_costs_only_its_own_gpu_within_budgets(scene: Scene) -> None:
    """An inference job can report any latency for itself. Forged over the SLO with every
    step on the ladder and the throttle budget per job spent: the training on its GPU is not
    throttled again (so not suspended or requeued either), the rung says why; training on
    another node (n5) is never acted on; calm releases the hold (never budgeted)."""
    lad, sbx = scene.lad, scene.sbx
    scene.settle()
    spent = scene.kinds(scene.train).count("throttle")
    if spent == 0:  # run alone: spend one
        test_throttle_then_unthrottle(scene)
        spent = 1
    lad.restart_monitor(("hold", "throttle", "suspend", "requeue"),
                        budgets={"throttle": f"per_job: {spent}, per_hour: 120"})
    before = len(scene.kinds(scene.train))
    lad.set_latency(HOT_MS)
    until(lambda: f"throttle budget of job {scene.train} spent" in scene.rung().get("capped", ""), "the rung to say the budget is spent")
    until(scene.kept_off_n2, "new training to be kept off n2 (hold is not budgeted)")
    lad.wait_cycles(3 * 2 * DWELL + 4)  # past suspend's and requeue's dwells
    assert scene.kinds(scene.train)[before:] == [], "a step beyond the budget"
    assert sbx.job_state(scene.train) == "RUNNING" and not scene.throttle_file()
    assert scene.probe("tslice")["exclude"] in ("", "(null)")
    scene.untouched()
    scene.progressed(lad.others[scene.far], 3)

    lad.set_latency(CALM_MS)
    scene.settle()
    assert scene.kinds(scene.train)[before:] == []
    scene.untouched()


def test_inference_gone_under_a_rung_releases_within_one_cycle(scene: Scene) -> None:
    """Issue 33: training suspended and throttled for an inference job, then that job is
    cancelled. The cause is gone, not calm: the monitor resumes and unthrottles the training
    in the first cycles that see Slurm no longer run it (no release dwell per rung), and its
    journal says the inference job ended, never "within its SLO". Runs last: it ends the
    scene's inference job."""
    lad, sbx = scene.lad, scene.sbx
    scene.settle()
    lad.restart_monitor(("hold", "throttle", "suspend"))
    before = len(scene.kinds(scene.train))
    lad.set_latency(HOT_MS)
    scene.wait_new(before, ["throttle", "suspend"])
    until(lambda: sbx.job_state(scene.train) == "SUSPENDED", "Slurm to show SUSPENDED")
    sbx.cmd("scancel", scene.infer)
    until(lambda: sbx.job_state(scene.infer) != "RUNNING", "the inference job to end")
    gone_at = lad.cycles()  # the cycle now running may still have read it running
    new = scene.wait_new(before, ["throttle", "suspend", "resume-job", "unthrottle"])
    assert new == ["throttle", "suspend", "resume-job", "unthrottle"]
    released = [scene.entry("resume-job"), scene.entry("unthrottle")]
    # the cycle running when Slurm changed, the one that resumed, the one that unthrottled
    # (a signal to a step still being resumed is dropped), one the poll may lag by; a
    # release dwell per rung would have taken 2 x DWELL s of calm per rung
    assert lad.cycles() - gone_at <= 4, "released later than the cycles after Slurm showed it"
    apart = released[1]["details"]["ts"] - released[0]["details"]["ts"]
    assert 0 < apart <= 2.5 * lad.interval_s, f"unthrottled {apart:.1f}s after the resume"
    for e in released:
        assert e["ok"] is True and e["details"].get("cause_gone") is True, e
        assert f"inference job {scene.infer} " in e["reason"], e["reason"]
        assert "within its SLO" not in e["reason"], e["reason"]
    until(lambda: sbx.job_state(scene.train) == "RUNNING", "Slurm to show RUNNING")
    until(lambda: not scene.rung() and not scene.restraint(), "the ladder to let go")
    until(lambda: not scene.throttle_file(), "the throttle file to go")
    scene.progressed(lad.train_log, 5)
    assert contiguous(lad.steps()), "a step lost or counted twice across the suspension"


def _wrapper_events(scene: Scene) -> List[str]:
    """The training job's own events: those the epilogs folded into the node journals, then
    those of the running attempt, still in its events file."""
    import json

    from slurmiso.jobfiles import events_path
    from slurmiso_sandbox.protect import journal_events

    found = journal_events(scene.sbx, scene.train)
    for line in read_text(events_path(scene.sbx.jobs_dir, scene.train) or "").splitlines():
        try:
            found.append(str(json.loads(line).get("event")))
        except ValueError:
            pass
    return found
