"""The sandbox cluster does what the rest of slurmiso's tests rely on.

Each GPU mode's node schedules its kind of GRES, QoS preemption requeues, the simulated GPUs
match what Slurm was told, and ``up``/``down`` are idempotent and leave nothing behind.
"""

from __future__ import annotations

import json
import os
import re
from collections import Counter

import pytest

from slurmiso_sandbox import layout as L

ENV_DUMP = "#!/bin/bash\nenv | sort\n"


def env_of(output: str) -> dict:
    return dict(ln.split("=", 1) for ln in output.splitlines() if "=" in ln)


def test_all_nodes_idle(sandbox):
    assert sandbox.wait_idle() == {n.name: "idle" for n in L.NODES}


def test_exclusive_gpu_job_sees_cuda_visible_devices(submit, wait_for, job_output):
    job = submit(ENV_DUMP, "-p", "gpu", "--gres=gpu:1")
    wait_for(job)
    env = env_of(job_output(job))
    assert env.get("CUDA_VISIBLE_DEVICES") in {"0", "1"}


def test_mps_job_gets_thread_percentage(sandbox, submit, wait_for, job_output):
    job = submit(ENV_DUMP, "-p", "mps", "--gres=mps:50")
    wait_for(job)
    assert "gres/mps=50" in sandbox.alloc_tres(job)
    pct = env_of(job_output(job)).get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE")
    if sandbox.hooks:  # slurmiso's TaskProlog applies the job class's share instead
        assert pct is not None and 1 <= int(pct) <= 100
    else:
        assert pct == "50"


def test_mig_typed_gres_job_runs(sandbox, submit, wait_for):
    job = submit(ENV_DUMP, "-p", "mig", "--gres=gpu:3g.40gb:1")
    wait_for(job)
    fields = sandbox.job_fields(job)
    assert fields["NodeList"] == "n3"
    assert "gres/gpu=1" in sandbox.alloc_tres(job)


def test_two_shard_jobs_share_gpu0_on_n4(sandbox, submit, wait_for, job_output):
    script = "#!/bin/bash\nenv | sort\nsleep 4\n"
    # shard counts match the class's MIG profile (job_submit.lua): infer 3g, train 4g
    a = submit(script, "-p", "migd", "--gres=shard:3", "--qos=infer")
    b = submit(script, "-p", "migd", "--gres=shard:4")
    wait_for(a, {"RUNNING"}, timeout=30)
    wait_for(b, {"RUNNING"}, timeout=30)  # both at once: 3 + 4 shards fit GPU 0's 7
    for job, shards in ((a, 3), (b, 4)):
        assert sandbox.gres_per_gpu(job, "shard") == {0: shards}
    wait_for(a)
    wait_for(b)
    for job, shards in ((a, "3"), (b, "4")):
        env = env_of(job_output(job))
        assert env.get("SLURM_SHARDS_ON_NODE") == shards
        assert env.get("SLURM_JOB_GPUS") == "0"
        if not sandbox.hooks:  # with hooks, mig-dynamic puts a MIG UUID here
            assert env.get("CUDA_VISIBLE_DEVICES") == "0"


def test_job_of_the_non_root_test_user_runs(sandbox, submit, wait_for, job_output):
    job = submit("#!/bin/bash\nid -un\n", "-p", "gpu", "--gres=gpu:1", "--qos=debug",
                 user=L.TEST_USER)
    wait_for(job)
    assert job_output(job).strip().splitlines()[-1] == L.TEST_USER
    assert sandbox.job_fields(job)["UserId"].startswith(f"{L.TEST_USER}(")


def test_infer_job_preempts_and_requeues_train_job(sandbox, submit, wait_for):
    """QoS preemption requeues the train job (Restarts, PREEMPTED in sacct).

    Measured on 22.05: preemption SIGTERMs the job's steps at once but the batch shell only
    when GraceTime (30 s) runs out; and a job that *ends by itself* during the grace time is
    recorded COMPLETED/FAILED, not requeued. Only Slurm's own kill at the end of the grace
    time requeues. So this job just sleeps in the batch shell and the test takes ~30 s.
    """
    train = submit("#!/bin/bash\necho attempt ${SLURM_RESTART_COUNT:-0}\nsleep 300\n",
                   "-p", "gpu", "--gres=gpu:2", "--qos=train")
    wait_for(train, {"RUNNING"}, timeout=30)
    infer = submit("#!/bin/bash\nsleep 1\n", "-p", "gpu", "--gres=gpu:1", "--qos=infer")
    wait_for(infer, timeout=75)
    fields = sandbox.job_fields(train)
    assert int(fields.get("Restarts", "0")) >= 1, (fields, sandbox.job_output(train))
    states = [r["State"] for r in sandbox.sacct(train)]
    assert "PREEMPTED" in states, states


def test_n3_sim_state_matches_mig_gres(sandbox, sim_state):
    from slurmiso.gpu.sim import SimBackend

    backend = SimBackend(sim_state("n3"))
    instances = backend.instances()
    backend.close()
    assert Counter(i.profile for i in instances) == Counter({"3g.40gb": 3})  # one MIG type
    assert all(i.uuid.startswith("MIG-") for i in instances)
    node = sandbox.cmd("scontrol", "show", "node", "-o", "n3")
    gres = re.search(r"\bGres=(\S+)", node)
    assert gres is not None
    slurm = Counter({m.group(1): int(m.group(2))
                     for m in re.finditer(r"gpu:([^:,(]+):(\d+)", gres.group(1))})
    assert slurm == Counter(i.profile for i in instances)


def test_up_twice_is_idempotent(sandbox):
    before = json.loads(sandbox.slurmiso("sandbox", "status", "--json").stdout)
    cp = sandbox.slurmiso("sandbox", "up", "--json")
    assert cp.returncode == 0, cp.stderr
    report = json.loads(cp.stdout)
    details = {s["name"]: s["detail"] for s in report["steps"]}
    assert details["files"] == "unchanged"
    assert details["simulated GPUs"] == "unchanged"
    assert details["accounting"] == "unchanged"
    assert details["slurmctld+slurmd"] == "running"
    # nothing installed or built again (how long that takes is bench/, not a test's business)
    assert details.get("packages", "all installed") == "all installed", report["steps"]
    roots = [d for n, d in details.items() if n.startswith("slurm ") and n.endswith(" root")]
    assert all(d == "cached" for d in roots), report["steps"]
    after = json.loads(sandbox.slurmiso("sandbox", "status", "--json").stdout)
    assert [(s["name"], s["pid"]) for s in after["services"]] == \
        [(s["name"], s["pid"]) for s in before["services"]]


@pytest.mark.slow
def test_down_leaves_no_process_and_up_again_works(sandbox):
    import psutil

    cp = sandbox.slurmiso("sandbox", "down")
    assert cp.returncode == 0, cp.stderr
    left = []
    for proc in psutil.process_iter(["pid", "name", "cmdline"]):
        if proc.info["name"] not in ("slurmd", "slurmctld", "slurmdbd", "slurmstepd",
                                     "mariadbd", "mysqld"):
            continue
        try:
            with open(f"/proc/{proc.pid}/environ", "rb") as fh:
                env = fh.read().split(b"\0")
        except OSError:
            env = []
        cmd = " ".join(proc.info["cmdline"] or [])
        if sandbox.root in cmd or f"SLURM_CONF={sandbox.slurm_conf}".encode() in env:
            left.append(f"{proc.pid} {cmd}")
    assert left == []
    status = json.loads(sandbox.slurmiso("sandbox", "status", "--json").stdout)
    assert not any(s["running"] for s in status["services"] if s["name"] != "munged")
    cp = sandbox.slurmiso("sandbox", "up")
    assert cp.returncode == 0, cp.stdout + cp.stderr
    assert sandbox.wait_idle() == {n.name: "idle" for n in L.NODES}
    assert os.path.exists(sandbox.path("sim", "n3.json"))
