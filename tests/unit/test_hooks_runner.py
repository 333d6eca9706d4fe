"""Prolog/epilog policy end to end on a simulated node (no Slurm): records, refusals, faults."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any, Dict

import pytest
import yaml

from slurmiso.gpu.sim import SimBackend
from slurmiso.hooks import task_prolog
from slurmiso.hooks.runner import run_hook
from slurmiso.isolation.base import PREPARING
from slurmiso.state import NodeState
from slurmiso.state.record import JobRecord, Resource
from tests.hookctx import Drains, job_env, journal, state, write_config

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_exclusive_job_round_trip(tmp_path: Any) -> None:
    tmp = str(tmp_path)
    cfg = write_config(tmp, "exclusive")
    drains = Drains()
    before = SimBackend(f"{tmp}/sim/node1.json").state()
    assert run_hook("prolog", job_env(gpus="1"), cfg, drains) == 0
    rec = state(tmp).read_job("42")
    assert rec is not None and rec.status == "ready" and rec.job_class == "debug"
    assert rec.env["CUDA_VISIBLE_DEVICES"] == "1"
    assert state(tmp).allocations() == {"gpu/1": "42"}
    with open(f"{tmp}/dcgm/1") as fh:
        assert fh.read().split() == ["42"]
    lines = task_prolog.lines_for(rec, "42")
    assert "export CUDA_VISIBLE_DEVICES=1" in lines and "export SLURMISO_CLASS=debug" in lines
    assert run_hook("epilog", job_env(gpus="1"), cfg, drains) == 0
    assert state(tmp).read_job("42") is None and state(tmp).allocations() == {}
    assert not os.path.exists(f"{tmp}/dcgm/1")
    events = [e["event"] for e in journal(tmp)]
    assert events == ["prolog", "job-end"]
    assert SimBackend(f"{tmp}/sim/node1.json").state() == before
    assert drains.calls == []


def test_every_prolog_of_an_mps_config_makes_the_mps_root_containers_bind(
        tmp_path: Any) -> None:
    """Containers bind the MPS root whole (gen oci-conf --config-json, APPTAINER_BIND), and a
    runtime refuses a bind whose source is missing: a job on an exclusive node of a config
    with an MPS pool finds it there too, root's 0755; a config without one makes none."""
    import stat

    tmp = str(tmp_path)
    pools = [{"name": "p", "nodes": "node1", "partition": "part", "gpu_model": "A100-80GB",
              "gpus_per_node": 2, "mode": "exclusive"},
             {"name": "m", "nodes": "node2", "partition": "mps", "gpu_model": "A100-80GB",
              "gpus_per_node": 2, "mode": "mps"}]
    cfg = write_config(tmp, "exclusive", pools=pools)
    assert run_hook("prolog", job_env(gpus="1"), cfg, Drains()) == 0
    root = f"{tmp}/state/node1/mps"
    assert stat.S_IMODE(os.stat(root).st_mode) == 0o755 and not os.listdir(root)
    plain = str(tmp_path / "plain")
    os.makedirs(plain)
    cfg = write_config(plain, "exclusive")
    assert run_hook("prolog", job_env(gpus="1"), cfg, Drains()) == 0
    assert not os.path.exists(f"{plain}/state/node1/mps")


def test_prolog_twice_and_epilog_twice_are_harmless(tmp_path: Any) -> None:
    tmp = str(tmp_path)
    cfg = write_config(tmp, "exclusive")
    assert run_hook("prolog", job_env(), cfg, Drains()) == 0
    first = state(tmp).read_job("42")
    assert run_hook("prolog", job_env(), cfg, Drains()) == 0
    assert state(tmp).read_job("42").times == first.times
    assert run_hook("epilog", job_env(), cfg, Drains()) == 0
    assert run_hook("epilog", job_env(), cfg, Drains()) == 0
    assert [e["event"] for e in journal(tmp)] == ["prolog", "job-end"]


@pytest.mark.parametrize(
    "mode,env,reason",
    [
        ("timeslice", job_env(qos="debug"), "needs exclusive isolation or stronger"),
        ("exclusive", job_env(qos="batch"), "no job class matches"),
        ("exclusive", job_env(SPANK_SLURMISO_CLASS="gold"), "--iso-class=gold is not a job class"),
        ("exclusive", job_env(qos="train", SPANK_SLURMISO_CLASS="debug"), "conflicts with QoS 'train'"),
        ("exclusive", job_env(**{"SPANK__SLURM_SPANK_OPTION_slurmiso_iso_class": "x;rm -rf /"}),
         "--iso-class=x;rm -rf / must be a letter"),
    ],
)
def test_job_problems_refuse_the_job_not_the_node(tmp_path: Any, mode: str, env: Dict[str, str], reason: str) -> None:
    tmp = str(tmp_path)
    cfg = write_config(tmp, mode)
    drains = Drains()
    assert run_hook("prolog", env, cfg, drains) == 0
    assert drains.calls == []
    rec = state(tmp).read_job("42")
    assert rec is not None, "a refused job must leave a record (no record is no isolation)"
    assert rec.status == "refused" and reason in rec.reason
    assert state(tmp).allocations() == {}
    lines = task_prolog.lines_for(rec, "42")
    assert lines[0] == "export CUDA_VISIBLE_DEVICES="
    assert any(reason in ln for ln in lines)
    assert run_hook("epilog", env, cfg, drains) == 0 and state(tmp).read_job("42") is None


def test_comment_never_selects_a_class(tmp_path: Any) -> None:
    tmp = str(tmp_path)
    cfg = write_config(tmp, "exclusive")
    env = job_env(qos="batch", SLURM_JOB_COMMENT="class=debug", SLURMISO_CLASS="debug")
    assert run_hook("prolog", env, cfg, Drains()) == 0
    assert state(tmp).read_job("42").status == "refused"


def test_lost_gpu_drains_node_with_reason(tmp_path: Any) -> None:
    tmp = str(tmp_path)
    cfg = write_config(tmp, "exclusive")
    SimBackend(f"{tmp}/sim/node1.json").set_lost(0, True)
    drains = Drains()
    assert run_hook("prolog", job_env(gpus="0"), cfg, drains) == 1
    assert len(drains.calls) == 1 and drains.calls[0][0] == "node1"
    assert drains.calls[0][1].startswith("slurmiso prolog:") and "\n" not in drains.calls[0][1]
    assert state(tmp).allocations() == {}


def test_foreign_process_on_gpu_is_a_node_fault(tmp_path: Any) -> None:
    tmp = str(tmp_path)
    cfg = write_config(tmp, "exclusive")
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env={"PATH": "/usr/bin"})
    try:
        SimBackend(f"{tmp}/sim/node1.json").add_process(0, sleeper.pid, used_memory_mb=1000)
        drains = Drains()
        assert run_hook("prolog", job_env(gpus="0"), cfg, drains) == 1
        assert f"pid {sleeper.pid} on GPU 0" in drains.calls[0][1]
    finally:
        sleeper.kill()
        sleeper.wait()


def test_epilog_ends_the_jobs_leftover_process_only(tmp_path: Any) -> None:
    tmp = str(tmp_path)
    cfg = write_config(tmp, "exclusive")
    assert run_hook("prolog", job_env(gpus="0,1"), cfg, Drains()) == 0
    code = "import time; time.sleep(60)"
    mine = subprocess.Popen([sys.executable, "-c", code], env={"SLURM_JOB_ID": "42"})
    other = subprocess.Popen([sys.executable, "-c", code], env={"SLURM_JOB_ID": "7"})
    try:
        sim = SimBackend(f"{tmp}/sim/node1.json")
        sim.add_process(0, mine.pid, used_memory_mb=500)
        sim.add_process(1, other.pid, used_memory_mb=500)
        assert run_hook("epilog", job_env(gpus="0,1"), cfg, Drains()) == 0
        assert mine.wait(timeout=10) != 0
        assert other.poll() is None
    finally:
        for p in (mine, other):
            p.kill()
            p.wait()


def test_broken_config_drains(tmp_path: Any) -> None:
    tmp = str(tmp_path)
    cfg = write_config(tmp, "exclusive", bogus=1)
    drains = Drains()
    assert run_hook("prolog", job_env(), cfg, drains) == 1
    assert "bogus" in drains.calls[0][1]


def test_node_outside_every_pool_is_left_alone(tmp_path: Any) -> None:
    tmp = str(tmp_path)
    cfg = write_config(tmp, "exclusive")
    assert run_hook("prolog", job_env(SLURMD_NODENAME="login1"), cfg, Drains()) == 0
    assert not os.path.exists(f"{tmp}/state/login1/jobs/42.json")


def test_timeslice_headroom_warning(tmp_path: Any) -> None:
    tmp = str(tmp_path)
    cfg = write_config(tmp, "timeslice")
    with open(cfg) as fh:
        data = yaml.safe_load(fh)
    data["classes"][1]["memory_headroom"] = 30
    with open(cfg, "w") as fh:
        yaml.safe_dump(data, fh)
    SimBackend(f"{tmp}/sim/node1.json").set_load(0, memory_used_mb=70000)
    assert run_hook("prolog", job_env(qos="train"), cfg, Drains()) == 0
    rec = state(tmp).read_job("42")
    assert rec.status == "ready" and "below the class's 30% headroom" in rec.warnings[0]


def test_hook_executable_runs_without_path(tmp_path: Any) -> None:
    """The way slurmd runs it: a separate process, root's env reduced to Slurm's variables."""
    tmp = str(tmp_path)
    cfg = write_config(tmp, "exclusive")
    env = job_env(SLURMISO_CONFIG=cfg, PYTHONPATH=ROOT, SLURMISO_GPU_BACKEND="sim")
    for hook in ("prolog/slurmiso-prolog", "epilog/slurmiso-epilog"):
        proc = subprocess.run([sys.executable, os.path.join(ROOT, hook)], env=env,
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr
    assert [e["event"] for e in journal(tmp)] == ["prolog", "job-end"]
    assert json.loads(json.dumps(journal(tmp)[1]))["outcome"] == "released"


@pytest.mark.slow
def test_prolog_killed_at_every_step_then_epilog_leaves_gpu_clean(tmp_path: Any) -> None:
    """kill -9 the real prolog process before and after each of its driver calls and state
    writes (SLURMISO_SIM_KILL_AT: steps, not moments, so a faster machine hits the same
    ones), then run the epilog as slurmd would: no MIG instance, claim or record survives."""
    import signal

    from tests.killrounds import traced_kill_points

    tmp = str(tmp_path)
    cfg = write_config(tmp, "mig-dynamic", model="H100-80GB")
    with open(cfg) as fh:
        data = yaml.safe_load(fh)
    data["classes"][2].update(isolation="mig", mig_profile="3g.40gb")
    with open(cfg, "w") as fh:
        yaml.safe_dump(data, fh)
    SimBackend(f"{tmp}/sim/node1.json").set_mig_mode(0, True)
    sim = SimBackend(f"{tmp}/sim/node1.json")
    prolog = [sys.executable, os.path.join(ROOT, "prolog/slurmiso-prolog")]
    epilog = [sys.executable, os.path.join(ROOT, "epilog/slurmiso-epilog")]

    def env_for(job: str, **extra: str) -> Dict[str, str]:
        return job_env(job=job, SLURMISO_CONFIG=cfg, PYTHONPATH=ROOT,
                       SLURMISO_CACHE_DIR=os.environ["SLURMISO_CACHE_DIR"], **extra)

    def epilog_leaves_nothing(job: str, where: str) -> None:
        ep = subprocess.run(epilog, env=env_for(job), capture_output=True, text=True,
                            timeout=60)
        assert ep.returncode == 0, f"{where}: {ep.stderr}"
        assert sim.instances() == [], f"{where}: instance left behind"
        assert state(tmp).allocations() == {}, f"{where}: claim left behind"
        assert state(tmp).read_job(job) is None, f"{where}: record left behind"

    # One unkilled prolog, traced: the steps there are to kill at.
    trace = f"{tmp}/trace"
    calm = subprocess.Popen(prolog, env=env_for("99", SLURMISO_SIM_TRACE=trace),
                            stderr=subprocess.DEVNULL)
    assert calm.wait(timeout=60) == 0
    assert len(sim.instances()) == 1
    points = traced_kill_points(trace, calm.pid)
    epilog_leaves_nothing("99", "unkilled")
    steps = [p.step for p in points]
    assert any("create_gpu_instance" in s for s in steps), steps
    assert any("create_compute_instance" in s for s in steps), steps
    assert any("allocations.json" in s for s in steps), steps

    outcomes = []
    for round_, point in enumerate(points):
        job = str(100 + round_)
        proc = subprocess.run(prolog, env=env_for(job, SLURMISO_SIM_KILL_AT=point.spec),
                              stderr=subprocess.DEVNULL, timeout=60)
        assert proc.returncode == -signal.SIGKILL, f"{point.step}: the prolog was not killed"
        outcomes.append((point.step, len(sim.instances()), bool(state(tmp).allocations())))
        epilog_leaves_nothing(job, point.step)
    # The kills hit before an instance existed, once it existed but no claim named it yet
    # (the case the 200-round bench found), and once it was claimed: every step, every run.
    assert any(n == 0 for _, n, _ in outcomes), outcomes
    assert any(n == 1 and not claimed for _, n, claimed in outcomes), outcomes
    assert any(n == 1 and claimed for _, n, claimed in outcomes), outcomes


def test_epilog_reports_memory_not_released(tmp_path: Any) -> None:
    tmp = str(tmp_path)
    cfg = write_config(tmp, "exclusive")
    assert run_hook("prolog", job_env(), cfg, Drains()) == 0
    SimBackend(f"{tmp}/sim/node1.json").set_load(0, memory_used_mb=6000)
    assert run_hook("epilog", job_env(), cfg, Drains()) == 0
    end = [e for e in journal(tmp) if e["event"] == "job-end"][0]
    assert any("6000 MiB in use after the job ended" in w for w in end["warnings"])


BAD_UIDS = ("-5", "-1", "4294967295", "4294967296", "99999999999999", "", "abc", "1e3", " 12",
            "١٢")


@pytest.mark.parametrize("uid", BAD_UIDS)
@pytest.mark.parametrize("mode,qos", [("mps", "infer"), ("exclusive", "debug"),
                                      ("timeslice", "train")])
def test_an_unusable_job_uid_refuses_the_job_before_anything_is_made(
    tmp_path: Any, uid: str, mode: str, qos: str
) -> None:
    """Issue 22: SLURM_JOB_UID -5 or above 2^32 started an MPS daemon for uid -1 and wrote a
    record the epilog could not read; daemon and record leaked and later prologs drained."""
    import psutil

    tmp = str(tmp_path)
    cfg = write_config(tmp, mode)
    drains = Drains()
    env = job_env(qos=qos, SLURM_JOB_UID=uid)
    assert run_hook("prolog", env, cfg, drains) == 0 and drains.calls == []
    rec = state(tmp).read_job("42")
    assert rec is not None and rec.status == "refused" and "SLURM_JOB_UID" in rec.reason
    assert rec.resources == []
    assert not os.path.exists(f"{tmp}/state/node1/mps")
    assert not [p for p in psutil.process_iter(["cmdline"])
                if any(tmp in part for part in p.info["cmdline"] or [])]
    assert run_hook("epilog", env, cfg, drains) == 0 and drains.calls == []
    assert state(tmp).read_job("42") is None
    good = job_env(job="43", qos=qos)  # the node still takes the next job
    assert run_hook("prolog", good, cfg, drains) == 0 and drains.calls == []
    assert state(tmp).read_job("43").status == "ready"
    assert run_hook("epilog", good, cfg, drains) == 0 and drains.calls == []


def test_a_record_that_would_not_read_back_is_never_written(tmp_path: Any) -> None:
    from slurmiso.errors import StateError

    st = NodeState(str(tmp_path / "state"))
    rec = JobRecord("7", PREPARING, resources=[Resource("mps", gpu=0, uid=-1)])
    with pytest.raises(StateError, match="would not read back: .*'uid' is negative"):
        st.write_job("7", rec)
    assert st.read_job("7") is None


def test_the_epilog_of_a_job_without_a_record_removes_its_fence(tmp_path: Any) -> None:
    """A prolog killed between writing the job's fence and its first record save."""
    from slurmiso.isolation import fence

    tmp = str(tmp_path)
    cfg = write_config(tmp, "exclusive")
    fence.write(f"{tmp}/state/node1", "42", "refused until prepared", ["c 195:* rwm"])
    assert run_hook("epilog", job_env(), cfg, Drains()) == 0
    assert fence.read_rules(f"{tmp}/state/node1", "42") is None
