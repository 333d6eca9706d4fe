"""The monitor against the live sandbox: holds and releases training under simulated load,
lends a node between partitions and takes it back, re-lays MIG on a drained node.

Each test runs ``slurmiso monitor --once`` (in-process GPU backends: the five simulated
nodes share this host) with a copy of the sandbox config whose dwell is 0 and which applies
its decisions; whatever the test changes in the sandbox is restored in ``finally``.
"""

from __future__ import annotations

import functools
import json
import os
import re
import sys
from typing import Any, Callable, List

import pytest

from slurmiso.hostlist import expand
from tests import waiting

#: Sandbox reads are Slurm commands: poll them gently.
until = functools.partial(waiting.wait_for, every=0.3)

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXTRA_LAYOUT = """    sandbox-all-3g:
      - devices: all
        mig-enabled: true
        mig-devices:
          3g.40gb: 2
"""


@pytest.fixture
def monitor(sandbox: Any, tmp_path: Any) -> Callable[..., str]:
    """Run one applied monitor cycle; returns its stdout (fails on a non-zero exit)."""
    from slurmiso_sandbox.demo import run_monitor
    from slurmiso_sandbox.scenes import monitor_config

    cfg = monitor_config(sandbox, str(tmp_path), EXTRA_LAYOUT)

    def run(*args: str) -> str:
        return run_monitor(sandbox, cfg, str(tmp_path), *args)

    run.config = cfg  # type: ignore[attr-defined]
    return run


def _held(sandbox: Any, job: str) -> bool:
    return sandbox.job_fields(job).get("Reason", "") in ("JobHeldAdmin", "JobHeldUser")


def _nodes(sandbox: Any, partition: str) -> List[str]:
    out = sandbox.cmd("scontrol", "show", "partition", "-o", partition)
    value = re.search(r" Nodes=(\S+)", out)
    return expand(value.group(1)) if value and value.group(1) != "(null)" else []


def test_load_holds_training_and_calm_releases_it(sandbox: Any, tmp_path: Any) -> None:
    from slurmiso_sandbox.demo import monitor_hold_scenario

    r = monitor_hold_scenario(sandbox, str(tmp_path))
    pending = r["pending_job"]
    assert f"did hold {pending}: training held: n2 GPU" in r["hot"], r["hot"]
    assert "inference job" in r["hot"], r["hot"]  # the cause named: the job whose GPU it is
    assert r["held"]
    assert "no action" in r["still_hot"], "hot still: nothing more to do"
    assert f"did release {pending}" in r["calm"], r["calm"]
    assert r["pending_state"] == "COMPLETED"
    journal = sandbox.path("log", f"journal-{os.uname().nodename.split('.')[0]}.jsonl")
    with open(journal) as fh:
        lines = [json.loads(ln) for ln in fh if '"monitor-action"' in ln]
    mine = [ln for ln in lines if ln.get("target") == pending]
    assert [ln["action"] for ln in mine][-2:] == ["hold", "release"]
    assert mine[-2]["details"]["memory_pct"] > 75 and mine[-2]["dry_run"] is False


def test_idle_node_lent_and_reclaimed(sandbox: Any, submit: Any, wait_for: Any,
                                      monitor: Callable[..., str]) -> None:
    original = _nodes(sandbox, "tslice")
    try:
        sandbox.wait_idle()
        out = monitor("--lend", "mps:tslice")
        assert "did partition-update tslice: lend idle n2 of mps to tslice" in out, out
        assert sorted(_nodes(sandbox, "tslice")) == sorted(original + ["n2"])
        infer = submit("#!/bin/bash\nsleep 20\n", "-p", "mps", "--qos=infer", "--gres=mps:50")
        until(lambda: sandbox.job_state(infer) in ("RUNNING", "PENDING"), "infer job", timeout=20)
        out = monitor("--lend", "mps:tslice")
        assert "did partition-update tslice: reclaim n2 for mps" in out, out
        assert _nodes(sandbox, "tslice") == original
    finally:
        sandbox.cmd("scontrol", "update", "PartitionName=tslice",
                    f"Nodes={','.join(original)}")


def test_mig_relayout_drains_applies_resumes_and_new_gres_schedule(
        sandbox: Any, submit: Any, wait_for: Any, monitor: Callable[..., str]) -> None:
    """Pending 3g.40gb demand beyond n3's three: drain n3, wait for its jobs (never killed),
    lay out 4x 3g.40gb, tell Slurm (the sandbox's after-relayout step restarts slurmctld:
    22.05 keeps GRES counts across reconfigure), resume; then four 3g.40gb jobs run at once,
    each on its own instance, the two that waited through the re-layout among them."""
    cfg = monitor.config  # type: ignore[attr-defined]
    sync = f"{sys.executable} -m slurmiso sandbox sync-gres"
    hold = "#!/bin/bash\necho CVD=$CUDA_VISIBLE_DEVICES\nsleep {secs}\n"
    try:
        running = [submit(hold.format(secs=8), "-p", "mig", "--gres=gpu:3g.40gb:1",
                          "--qos=infer") for _ in range(3)]
        for job in running:
            wait_for(job, {"RUNNING"}, timeout=40)
        waiting = [submit(hold.format(secs=15), "-p", "mig", "--gres=gpu:3g.40gb:1",
                          "--qos=infer") for _ in range(2)]
        out = monitor()
        assert "did drain n3: MIG re-layout to sandbox-all-3g" in out, out
        assert "DRAIN" in sandbox.cmd("scontrol", "show", "node", "n3")
        assert "no action" in monitor(), "jobs still run: wait for them"
        for job in running:
            wait_for(job, timeout=40)  # they finish: nothing was killed
        until(lambda: not sandbox.cmd("squeue", "-h", "-w", "n3").strip(), "n3 empty", timeout=30)
        out = monitor("--after-relayout", sync)
        assert "did mig-apply n3: drained and empty: lay out MIG sandbox-all-3g" in out, out
        shown = json.loads(sandbox.slurmiso("--config", cfg, "mig", "show", "--node", "n3",
                                            "--json").stdout)
        assert sorted(i["profile"] for i in shown["instances"]) == ["3g.40gb"] * 4
        node = sandbox.cmd("scontrol", "show", "node", "n3")
        assert "Gres=gpu:3g.40gb:4" in node and "DRAIN" in node, node  # still drained
        out = monitor()
        assert "did resume n3: MIG layout sandbox-all-3g applied" in out, out
        more = [submit(hold.format(secs=15), "-p", "mig", "--gres=gpu:3g.40gb:1",
                       "--qos=infer") for _ in range(2)]
        for job in waiting + more:  # four at once: the fourth GRES is schedulable
            wait_for(job, {"RUNNING"}, timeout=40)
        cvd = set()
        for job in waiting + more:
            until(lambda j=job: "CVD=MIG-" in sandbox.job_output(j), f"job {job} output", timeout=20)
            cvd.add(re.search(r"CVD=(\S+)", sandbox.job_output(job)).group(1))  # type: ignore
        assert cvd == {i["uuid"] for i in shown["instances"]}
    finally:
        sandbox.cmd("scancel", "-p", "mig", check=False)
        until(lambda: not sandbox.cmd("squeue", "-h", "-w", "n3").strip(), "n3 empty", timeout=30)
        for args in [("mig", "apply", "--node", "n3"), ("sandbox", "sync-gres")]:
            cp = sandbox.slurmiso(*args)  # the sandbox's own layout, and Slurm told
            assert cp.returncode == 0, cp.stdout + cp.stderr
        sandbox.cmd("scontrol", "update", "nodename=n3", "state=resume", check=False)
    assert "Gres=gpu:3g.40gb:3" in sandbox.cmd("scontrol", "show", "node", "n3")
    assert sandbox.slurmiso("mig", "assert", "--node", "n3").returncode == 0


def test_qos_limit_admission_caps_training_and_lifts_the_cap_when_calm(
        sandbox: Any, submit: Any, wait_for: Any, tmp_path: Any) -> None:
    """admission: qos-limit. Training holds 2 shards of n5 and runs GPU 0 hot; a training job
    that becomes eligible then waits with reason QOSGrpGRES under the cap the monitor set
    (nothing is held); calm: the cap is raised by that job's shards and it runs; nothing waits:
    the cap is removed."""
    from slurmiso_sandbox.demo import run_monitor
    from slurmiso_sandbox.scenes import monitor_config

    cfg = monitor_config(sandbox, str(tmp_path))
    with open(cfg) as fh:
        text = fh.read()
    text = text.replace("  stagger:\n    max_starts: 4\n    interval: 60s\n",
                        "  stagger:\n    max_starts: 4\n    interval: 0s\n")
    text = text.replace("monitor:\n", "monitor:\n  admission: qos-limit\n", 1)
    with open(cfg, "w") as fh:
        fh.write(text)
    # The hot GPUs are an inference job's (training's own load holds nothing): an inference
    # job on the MPS node n2 loads both its GPUs, a training job runs beside it on n2.
    state = sandbox.path("sim", "n2.json")
    flag = os.path.join(sandbox.jobs_dir, f"stop-load-{os.getpid()}-qos")
    sim = (f"PYTHONPATH={sandbox.job_pythonpath} {sandbox.job_python} -m slurmiso sim load "
           f"--state {state}")

    def grp_tres() -> str:
        return sandbox.cmd("sacctmgr", "-n", "-P", "show", "qos", "train",
                           "format=GrpTRES").strip()

    try:
        load = submit(f"#!/bin/bash\n{sim} --gpu 0 --sm 95 --mem 70G\n"
                      f"{sim} --gpu 1 --sm 95 --mem 70G\necho loaded\n"
                      f"while [ ! -e {flag} ]; do sleep 0.3; done\n"
                      f"{sim} --gpu 0 --sm 0\n{sim} --gpu 1 --sm 0\n",
                      "-p", "mps", "--qos=infer", "--gres=mps:50", "-w", "n2")
        wait_for(load, {"RUNNING"}, timeout=40)
        until(lambda: "loaded" in sandbox.job_output(load), "the load to start", timeout=30)
        beside = submit(f"#!/bin/bash\nwhile [ ! -e {flag} ]; do sleep 0.3; done\n",
                        "-p", "mps", "--qos=train", "--gres=mps:50", "-w", "n2")
        wait_for(beside, {"RUNNING"}, timeout=40)
        # 60 mps: more than the cap of 50 even once the others have ended and freed theirs,
        # so the job waits on the cap until the monitor raises it
        later = submit("#!/bin/bash\nsleep 1\n", "-p", "mps", "--qos=train",
                       "--gres=mps:60", "--begin=now+15")
        out = run_monitor(sandbox, cfg, str(tmp_path))
        assert "did qos-limit train: training capped at what it uses: n2 GPU" in out, out
        assert "gres/mps=50" in grp_tres().split(","), grp_tres()
        until(lambda: sandbox.job_fields(later).get("Reason") == "QOSGrpGRES", "the eligible training job to wait on the cap", timeout=60)
        assert sandbox.job_fields(later).get("JobState") == "PENDING"
        open(flag, "w").close()
        wait_for(load, timeout=40)
        wait_for(beside, timeout=40)
        out = run_monitor(sandbox, cfg, str(tmp_path))
        assert "did qos-limit train: calm for 0s: cap raised for the next 1 training job" in out
        wait_for(later, timeout=60)
        assert sandbox.job_state(later) == "COMPLETED"
        out = run_monitor(sandbox, cfg, str(tmp_path))
        assert "did qos-limit train: calm and no training waits: cap removed" in out, out
        assert grp_tres() == ""
    finally:
        open(flag, "w").close()
        for gpu in ("0", "1"):
            sandbox.slurmiso("sim", "load", "--state", state, "--clear", "--gpu", gpu)
        sandbox.cmd("sacctmgr", "-i", "modify", "qos", "where", "name=train", "set",
                    "GrpTRES=gres/gpu=-1,gres/shard=-1,gres/mps=-1", check=False)


def test_mig_relayout_preempts_training_never_inference(
        sandbox: Any, submit: Any, wait_for: Any, tmp_path: Any) -> None:
    """relayout.drain: preempt-training. n3 runs two training jobs and one inference job;
    the drained node's training is requeued at once (preempt_after 0s, Restarts=1, back to
    PENDING), the inference job is waited for; then the node is laid out and resumed."""
    from slurmiso_sandbox.demo import run_monitor
    from slurmiso_sandbox.scenes import monitor_config

    cfg = monitor_config(sandbox, str(tmp_path), EXTRA_LAYOUT)
    with open(cfg) as fh:
        text = fh.read()
    text = text.replace("monitor:\n", "monitor:\n  relayout:\n    drain: preempt-training\n"
                        "    preempt_after: 0s\n", 1)
    with open(cfg, "w") as fh:
        fh.write(text)

    def cycle(*args: str) -> str:
        return run_monitor(sandbox, cfg, str(tmp_path), *args)

    g = "--gres=gpu:3g.40gb:1"
    try:
        train = [submit("#!/bin/bash\nsleep 300\n", "-p", "mig", g, "--qos=train")
                 for _ in range(2)]
        infer = submit("#!/bin/bash\nsleep 8\n", "-p", "mig", g, "--qos=infer")
        for job in train + [infer]:
            wait_for(job, {"RUNNING"}, timeout=40)
        waiting = [submit("#!/bin/bash\nsleep 2\n", "-p", "mig", g, "--qos=infer")
                   for _ in range(2)]
        assert "did drain n3: MIG re-layout to sandbox-all-3g" in cycle()
        out = cycle()
        for job in train:
            assert f"did requeue {job}: re-layout of n3 to sandbox-all-3g: training requeued" \
                in out, out
        assert f"requeue {infer}" not in out and "1 other job(s) are waited for" in out
        assert sandbox.job_state(infer) == "RUNNING"
        for job in train:
            until(lambda j=job: sandbox.job_state(j) == "PENDING", f"job {job} requeued", timeout=40)
            assert int(sandbox.job_fields(job).get("Restarts", "0")) == 1
        wait_for(infer, timeout=40)
        assert sandbox.job_state(infer) == "COMPLETED"  # waited for, never killed
        until(lambda: not sandbox.cmd("squeue", "-h", "-w", "n3").strip(), "n3 empty", timeout=30)
        out = cycle("--after-relayout", f"{sys.executable} -m slurmiso sandbox sync-gres")
        assert "did mig-apply n3" in out, out
        assert "did resume n3" in cycle()
        for job in waiting:
            wait_for(job, timeout=60)
            assert sandbox.job_state(job) == "COMPLETED"
    finally:
        sandbox.cmd("scancel", "-p", "mig", check=False)
        until(lambda: not sandbox.cmd("squeue", "-h", "-w", "n3").strip(), "n3 empty", timeout=30)
        for args in [("mig", "apply", "--node", "n3"), ("sandbox", "sync-gres")]:
            cp = sandbox.slurmiso(*args)
            assert cp.returncode == 0, cp.stdout + cp.stderr
        sandbox.cmd("scontrol", "update", "nodename=n3", "state=resume", check=False)
    assert sandbox.slurmiso("mig", "assert", "--node", "n3").returncode == 0
