"""GPU memory a run's processes held, sampled through the simulated GPU backend: per process
the largest figure, the job's peak as the largest sum of one sample, only the run's own
processes (its session), and None with the reason where nothing was measured, never 0."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import List

import pytest

from slurmiso.gpu.sim import SimBackend, init_state
from slurmiso.probe import gpumem
from slurmiso.probe.session import HEADROOM_MIN_PCT
from tests.unit.test_probe_local import probe


@pytest.fixture
def sim(tmp_path) -> SimBackend:
    path = str(tmp_path / "sim.json")
    init_state(path, "H100-80GB", 2, node="probe-test", force=True)
    return SimBackend(path)


@pytest.fixture
def procs():
    started: List[subprocess.Popen] = []

    def spawn(*argv: str, session: bool = True) -> subprocess.Popen:
        p = subprocess.Popen(list(argv), start_new_session=session, stdout=subprocess.PIPE,
                             text=True)
        started.append(p)
        return p

    yield spawn
    for p in started:
        if p.poll() is None and os.getpgid(p.pid) == p.pid:
            os.killpg(p.pid, 9)  # the leader and its children
        elif p.poll() is None:
            p.kill()
        p.wait()


def test_per_process_max_and_the_jobs_peak_of_its_own_processes(sim, procs) -> None:
    leader = procs("sh", "-c", "sleep 600 & echo $!; wait")  # a job: its command and a child
    child = int(leader.stdout.readline())
    other = procs("sleep", "600", session=False)  # another job's process on the same GPU
    assert os.getsid(child) == leader.pid != os.getsid(other.pid)  # premise
    s = gpumem.Sampler(sim, "sim")
    s.sample(force=True)
    assert s.samples == 0, "nothing is sampled before the command's session is known"
    s.track(leader.pid)
    sim.add_process(0, leader.pid, 1000)
    sim.add_process(0, child, 3000)
    sim.add_process(0, other.pid, 50000)
    s.sample(force=True)
    sim.add_process(0, leader.pid, 6000)  # grows
    sim.add_process(0, child, 500)  # shrinks: its own peak stays
    s.sample(force=True)
    r = s.result()
    assert r["source"] == "sim" and r["samples"] == 2
    assert r["per_process_mb"] == {str(leader.pid): 6000, str(child): 3000}
    assert r["peak_mb"] == 6500  # the largest sum of one sample (1000+3000, then 6000+500)
    assert "why" not in r


def test_samples_are_throttled_unless_forced(sim, procs) -> None:
    p = procs("sleep", "600")
    s = gpumem.Sampler(sim, "sim", interval_s=3600)
    s.track(p.pid)
    s.sample(force=True)
    s.sample()  # within the interval: skipped
    s.sample(force=True)
    assert s.samples == 2


def test_nothing_seen_is_unknown_never_zero(sim, procs) -> None:
    p = procs("sleep", "600")
    s = gpumem.Sampler(sim, "sim")
    s.track(p.pid)
    s.sample(force=True)
    r = s.result()
    assert r["peak_mb"] is None and r["samples"] == 1
    assert "no process of the run held GPU memory in 1 samples" in r["why"]


def test_a_backend_error_costs_a_sample_not_the_run(procs) -> None:
    class Broken:
        name = "nvml"

        def processes(self):
            raise RuntimeError("NVML_ERROR_GPU_IS_LOST")

    p = procs("sleep", "600")
    s = gpumem.Sampler(Broken(), "nvml")
    s.track(p.pid)
    s.sample(force=True)
    r = s.result()
    assert r["peak_mb"] is None and r["errors"] == 1 and "GPU_IS_LOST" in r["why"]


def test_open_sampler_says_why_not(tmp_path, sim) -> None:
    assert gpumem.open_sampler({}, "n1") == (None, "no GPU backend named for sampling")
    none, why = gpumem.open_sampler({"backend": "sim", "sim_state": str(tmp_path / "no.json")},
                                    "n1")
    assert none is None and why.startswith("no GPU backend here (")
    assert gpumem.open_sampler({"backend": "warp"}, "n1")[1] == \
        "unknown GPU backend 'warp' for sampling"
    ok, why = gpumem.open_sampler({"backend": "sim", "sim_state": sim.state_path,
                                   "interval_s": 2}, "n1")
    assert ok is not None and why == "" and ok.source == "sim" and ok.interval_s == 2
    ok, _ = gpumem.open_sampler({"backend": "config", "kind": "sim",
                                 "sim_state": str(tmp_path / "%n.json")}, "sim")
    assert ok is not None  # %n expanded on the node: tmp_path/sim.json


def test_peaks_of_several_runs() -> None:
    runs = [gpumem.unmeasured("no GPU backend here (GpuUnavailable: no driver)"),
            {"source": "nvml", "peak_mb": 700, "per_process_mb": {"9": 700}},
            {"source": "nvml", "peak_mb": 900, "per_process_mb": {"7": 900}}]
    assert gpumem.peaks(runs) == {"peak_mb": 900, "source": "nvml",
                                  "per_process_mb": {"7": 900}}
    none = gpumem.peaks(runs[:1])
    assert none["peak_mb"] is None and none["source"] is None
    assert none["why"] == "no GPU backend here (GpuUnavailable: no driver)"


TRAIN = """\
import os, sys, time
from slurmiso.gpu.sim import SimBackend
SimBackend(sys.argv[1]).add_process(0, os.getpid(), int(sys.argv[2]), name="train")
print('{"gpu_mem_peak_mb": 20000}', flush=True)
stop = os.environ["SLURMISO_PROBE_STOP_FILE"]
while not os.path.exists(stop):
    print(0.02, flush=True)
    time.sleep(0.02)
"""


def test_a_local_probe_reports_the_sampled_peak_beside_the_printed_one(tmp_path,
                                                                     capsys) -> None:
    script = tmp_path / "train.py"
    script.write_text(TRAIN)
    state = tmp_path / "work" / "sim-node.json"  # the throw-away simulated node (no driver)
    train = f"{sys.executable} {script} {state} 22000"
    rc, out, err = probe(tmp_path, capsys, "--modes", "mps", "--json", "--infer-cmd",
                         "echo 3.5; echo 4.5", "--train-cmd", train, "--requests", "2",
                         "--train-seconds", "0.2")
    assert rc == 0, err
    report = json.loads(out)
    mem = report["modes"][0]["memory"]
    assert mem["train_printed_mb"] == 20000.0
    assert mem["train_sampled_mb"] == 22000 and mem["train_sampled_source"] == "sim"
    assert list(mem["train_sampled_per_process_mb"].values()) == [22000]
    assert mem["train_peak_mb"] == 22000.0 and mem["train_peak_source"] == "sim"
    assert mem["train_limit_mb"] == 24 * 1024  # the train class's MPS limit (shipped config)
    assert mem["train_headroom_pct"] == round(100 * (24576 - 22000) / 24576, 1)
    assert mem["train_headroom_pct"] < HEADROOM_MIN_PCT and mem["headroom_ok"] is False
    assert any("training peaked at 22000 MiB (sim) of 24576 MiB" in n for n in report["notes"])
    # inference printed no peak and held nothing: unknown, with why, never 0
    assert mem["infer_printed_mb"] is None and mem["infer_sampled_mb"] is None
    assert mem["infer_peak_mb"] is None and mem["infer_peak_source"] is None
    assert "no process of the run held GPU memory" in mem["infer_sampled_why"]


def test_figures_name_the_larger_peak_and_judge_the_headroom_on_it() -> None:
    sampled = {"source": "nvml", "peak_mb": 70000, "per_process_mb": {"5": 70000}}
    f = gpumem.figures({"infer": [None, 900.0], "train": [60000.0, None]},
                       {"infer": [None, None], "train": [None, sampled]}, 81559)
    assert f["train_peak_mb"] == 70000.0 and f["train_peak_source"] == "nvml"
    assert f["train_printed_mb"] == 60000.0 and f["train_sampled_per_process_mb"] == {"5": 70000}
    assert f["train_headroom_pct"] == 14.2 and f["headroom_ok"] is False
    assert f["infer_peak_mb"] == 900.0 and f["infer_peak_source"] == "printed"
    assert f["infer_sampled_mb"] is None and f["infer_sampled_why"] == \
        "the runner recorded no sample"
    none = gpumem.figures({"infer": [], "train": []}, {"infer": [], "train": []}, None)
    assert none["train_peak_mb"] is None and none["headroom_ok"] is None  # unknown, not 0
