"""The park rung on the live sandbox (issue 35, item 3): the ladder parks a training job
beside a breaching inference job and restores it on calm, with the simulated cuda-checkpoint.

On n2 (MPS) the stand-in inference server and a training job share one GPU; the training
program is registered as a CUDA process of that simulated GPU and asks the simulated driver
for its CUDA state before each step, as a real program's CUDA calls would. A real agent (its
park rung) and a real monitor daemon (``hold, throttle, park, suspend``) do the rest. Every
wait is for a state; "nothing happened" is counted in monitor cycles, never in seconds.
"""

from __future__ import annotations

import functools
import re
from typing import Any, Iterator

import pytest

from slurmiso.gpu.sim import SimBackend
from slurmiso.state.journal import Journal
from slurmiso_sandbox.protect import CALM_MS, HOT_MS, Ladder, contiguous, read_text
from tests import waiting

HANG = 120  # seconds: a deadline that only says "this hangs"
until = functools.partial(waiting.wait_for, every=0.3, timeout=HANG)


@pytest.fixture
def scene(sandbox: Any) -> Iterator[Any]:
    lad = Ladder(sandbox, ("hold", "throttle", "park", "suspend"))
    try:
        lad.start_jobs(train_args=f"--sim-cuda {lad.sim_path()}")
        gpus = lad.gpus()
        assert len(set(gpus.values())) == 1, f"the two jobs did not share one GPU: {gpus}"
        lad.pid = lad.hold_sim_gpu()  # type: ignore[attr-defined]
        lad.start_daemons()
        yield lad
    finally:
        lad.stop()


def cuda_state(lad: Any) -> str:
    return SimBackend(lad.sim_path()).cuda_state(lad.pid).value


def node_events(lad: Any, job: str) -> list:
    return [e for e in Journal(lad.sbx.path("log", "journal-n2.jsonl")).read()
            if e.get("target") == job and str(e.get("event", "")).startswith("park")]


def test_the_ladder_parks_training_and_restores_it_on_calm(scene: Any) -> None:
    """Breach: throttle, then park (the note), the node parks the program's CUDA state (its
    GPU memory leaves the GPU, its steps stop) while Slurm still shows it RUNNING and no
    suspend is taken; calm: unpark, the node restores it, the steps go on, each counted once."""
    lad, sbx = scene, scene.sbx
    sim = SimBackend(lad.sim_path())
    gpu = lad.gpus()[lad.train]
    assert lad.pid in [p.pid for p in sim.processes(gpu)]
    lad.set_latency(HOT_MS)
    lad.wait_kinds(lad.train, ["throttle", "park"], timeout=HANG)
    until(lambda: cuda_state(lad) == "checkpointed", "the node to park the training program")
    until(lambda: "# parked before step" in read_text(lad.train_log), "the program to wait")
    assert lad.pid not in [p.pid for p in sim.processes(gpu)], "its GPU memory is released"
    stopped_at = len(lad.steps())
    lad.wait_cycles(6)  # past the suspend step's dwell (4 s at 1 s cycles)
    assert len(lad.steps()) == stopped_at, "a parked program takes no step"
    assert sbx.job_state(lad.train) == "RUNNING", "parked, never suspended by Slurm"
    assert "suspend" not in lad.ladder_kinds(lad.train)
    lad.set_latency(CALM_MS)
    lad.wait_kinds(lad.train, ["unpark", "unthrottle"], timeout=HANG)
    until(lambda: cuda_state(lad) == "running", "the node to restore the program")
    until(lambda: len(lad.steps()) >= stopped_at + 10, "training to go on")
    assert "# unparked" in read_text(lad.train_log)
    kinds = [k for k in lad.ladder_kinds(lad.train) if k != "ladder-end"]
    assert kinds == ["throttle", "park", "unpark", "unthrottle"]
    park = next(e for e in lad.actions() if e.get("action") == "park")
    assert park["details"]["left"]["step"] == "park" and park["details"]["cause"] == lad.infer
    events = [e["event"] for e in node_events(lad, lad.train)]
    assert events == ["park", "park-end"], events
    open(lad.stop_file, "w").close()
    assert sbx.wait_for(lad.train, ("COMPLETED",), timeout=HANG) == "COMPLETED"
    assert contiguous(lad.steps()), "a training step was lost or counted twice"
    assert [e for e in lad.actions() if e.get("target") == lad.infer] == []


def test_a_refused_park_falls_back_to_suspend(scene: Any) -> None:
    """The node finds no CUDA process of the job to park (the driver lists none): it refuses
    once with the reason, the monitor releases the note and suspends in the same cycle, and
    resumes on calm."""
    lad, sbx = scene, scene.sbx
    sim = SimBackend(lad.sim_path())
    sim.clear_load(lad.gpus()[lad.train])  # the driver forgets the program's context
    assert lad.pid not in [p.pid for p in sim.processes()]
    lad.set_latency(HOT_MS)
    lad.wait_kinds(lad.train, ["throttle", "park", "suspend"], timeout=HANG)
    refused = [e for e in node_events(lad, lad.train) if e["event"] == "park-refused"]
    assert len(refused) == 1 and "falls back to suspend" in refused[0]["reason"]
    assert "no CUDA process" in refused[0]["reason"]
    unpark = next(e for e in lad.actions() if e.get("action") == "unpark")
    assert unpark["details"].get("refused") is True
    suspend = next(e for e in lad.actions() if e.get("action") == "suspend")
    assert suspend["details"].get("instead_of") == "park"
    until(lambda: sbx.job_state(lad.train) == "SUSPENDED", "the suspend")
    assert re.search(r"^step=", read_text(lad.train_log), re.M)
    lad.set_latency(CALM_MS)
    lad.wait_kinds(lad.train, ["resume-job", "unthrottle"], timeout=HANG)
    until(lambda: sbx.job_state(lad.train) == "RUNNING", "training to run again")
    base = len(lad.steps())
    until(lambda: len(lad.steps()) >= base + 10, "training to go on")
