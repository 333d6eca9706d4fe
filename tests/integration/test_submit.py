"""Submit-time checks in the real sandbox: job_submit.lua in slurmctld, cli_filter.lua and the
SPANK plugin in sbatch, each refusal seen on sbatch's stderr with its fix, and the validated
SPANK options arriving in the Prolog."""

from __future__ import annotations

import json
import subprocess
from typing import Any

import pytest

from slurmiso.slurm.gres import gres_counts
from tests.integration.test_isolation import HOLD, env_of, sim, wait_prolog


def sbatch(sandbox: Any, *args: str) -> subprocess.CompletedProcess:
    """sbatch as the non-root test user (SPANK and Lua treat root no differently)."""
    argv = ["runuser", "-u", "sbxuser", "--", "env", f"SLURM_CONF={sandbox.slurm_conf}",
            "sbatch", "--parsable", "-o", "/dev/null", *args, "--wrap", "sleep 1"]
    return subprocess.run(argv, env=sandbox.env, text=True, capture_output=True, timeout=30,
                          cwd="/tmp")


@pytest.mark.parametrize("args, message", [
    (("-p", "gpu", "--gres=gpu:1", "--qos=train", "--no-requeue"),
     "slurmiso: train jobs are preempted and requeued, so they must be requeueable: remove "
     "--no-requeue"),
    (("-p", "gpu", "--gres=gpu:1", "--qos=infer", "-t", "2-00:00:00"),
     "slurmiso: infer jobs may run at most 1-00:00:00 (asked 2-00:00:00): lower --time"),
    (("-p", "gpu", "--qos=debug", "--gpus=2"),
     "slurmiso: debug jobs may use at most 1 GPU(s) (asked 2): lower --gres=gpu/--gpus"),
    (("-p", "mps", "--gres=mps:80", "--qos=train"),
     "slurmiso: train jobs run at 60% of an MPS GPU on partition mps: ask --gres=mps:60 or "
     "less (asked mps:80)"),
    (("-p", "migd", "--gres=shard:3", "--qos=train"),
     "slurmiso: on partition migd a train job gets a 4g.40gb MIG instance (4 compute slices, "
     "class train): ask --gres=shard:4 (asked shard:3)"),
    (("-p", "migd", "--gres=shard:7", "--qos=infer", "--iso-mig-profile=7g.80gb"),
     "slurmiso: --iso-mig-profile=7g.80gb is larger than class infer's 3g.40gb: ask for "
     "3g.40gb or smaller"),
    (("-p", "gpu", "--qos=train", "--iso-class=infer"),
     "slurmiso: --iso-class=infer conflicts with --qos=train (class train): drop one of them"),
    (("-p", "gpu", "--gres=gpu:1", "--qos=train", "--signal=USR1@10"),
     "slurmiso: --signal=USR1@10 leaves less than the 30s checkpoint grace of train jobs "
     "before the time limit: use --signal=USR1@300"),
    (("-p", "gpu", "--gres=gpu:1", "--qos=train", "--signal=B:USR1@300"),
     "reaches only the batch shell, but train jobs run 'srun slurmiso run': use "
     "--signal=USR1@300 (without B:)"),
    (("--iso-class=bogus",),
     "slurmiso: --iso-class=bogus is not a job class of this cluster (allowed: "
     "infer,train,debug)"),
    (("--iso-mig-profile=3g.41gb",), "slurmiso: --iso-mig-profile=3g.41gb is not a MIG "
     "profile of this cluster's GPUs"),
    (("--iso-mps-mem=lots",), "slurmiso: --iso-mps-mem=lots is not a size"),
    (("--iso-ckpt-dir=/scratch/../etc",), "slurmiso: --iso-ckpt-dir=/scratch/../etc must be "
     "an absolute directory without '..' components"),
], ids=["no-requeue", "infer-time", "debug-gpus", "mps-share", "shard-count", "mig-larger",
        "class-conflict", "signal-grace", "signal-batch", "spank-class", "spank-mig",
        "spank-mem", "spank-dir"])
def test_refused_at_sbatch_with_the_fix(sandbox: Any, args: Any, message: str) -> None:
    cp = sbatch(sandbox, *args)
    assert cp.returncode != 0, f"accepted: {cp.stdout}"
    assert message in cp.stderr, cp.stderr


def test_valid_job_untouched_but_for_class_defaults(sandbox: Any) -> None:
    cp = sbatch(sandbox, "-p", "gpu", "--gres=gpu:1", "--qos=infer", "-t", "30", "-J", "ok",
                "--hold")
    assert cp.returncode == 0, cp.stderr
    f = sandbox.job_fields(cp.stdout.strip())
    assert (f["QOS"], f["Partition"], f["TimeLimit"], f["JobName"]) == ("infer", "gpu",
                                                                        "00:30:00", "ok")
    # gres:gpu:1 on 22.05, gres/gpu:1 from 24.11 on (measured): read as the monitor does
    assert gres_counts(f["TresPerNode"]) == {"gpu": 1} and f["Requeue"] == "1"  # JobRequeue=1
    cp = sbatch(sandbox, "-p", "gpu", "--gres=gpu:1", "--no-requeue", "--qos=debug", "--hold")
    assert cp.returncode == 0, cp.stderr
    f = sandbox.job_fields(cp.stdout.strip())
    assert (f["Requeue"], f["TimeLimit"]) == ("0", "02:00:00")  # debug: max_wall filled


def test_train_gets_requeue_and_max_wall(sandbox: Any) -> None:
    cp = sbatch(sandbox, "-p", "gpu", "--gres=gpu:1", "--qos=train", "--hold")
    assert cp.returncode == 0, cp.stderr
    f = sandbox.job_fields(cp.stdout.strip())
    assert (f["Requeue"], f["TimeLimit"]) == ("1", "7-00:00:00")


def test_iso_mig_profile_reaches_the_prolog(sandbox: Any, submit: Any, wait_for: Any,
                                            job_output: Any) -> None:
    """train's class profile is 4g.40gb; the validated option gets it a 3g.40gb instead."""
    job = submit(HOLD.format(secs=4), "-p", "migd", "--gres=shard:3", "--qos=train",
                 "--iso-mig-profile=3g.40gb")
    wait_for(job, {"RUNNING"}, timeout=40)
    wait_prolog(sandbox, "n4", job)
    status = json.loads(sandbox.slurmiso("status", "--node", "n4", "--json").stdout)
    [rec] = [j for j in status["jobs"] if j["job"] == job]
    assert rec["class"] == "train"
    assert [r["profile"] for r in rec["resources"]] == ["3g.40gb"]
    assert [i.profile for i in sim(sandbox, "n4").instances()] == ["3g.40gb"]
    wait_for(job)
    assert env_of(job_output(job))["CUDA_VISIBLE_DEVICES"].startswith("MIG-")


def test_iso_mps_mem_lowers_the_pinned_memory_limit(sandbox: Any, submit: Any, wait_for: Any,
                                                    job_output: Any) -> None:
    job = submit("#!/bin/bash\nenv | sort\n", "-p", "mps", "--gres=mps:50", "--qos=train",
                 "--iso-mps-mem=8G")
    wait_for(job, timeout=60)
    env = env_of(job_output(job))
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=8192M"  # class train: 24G
