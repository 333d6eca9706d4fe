"""``slurmiso probe`` through the real sandbox Slurm: jobs submitted to the mps, mig-dynamic and
timeslice pools with their QoS and GRES, the real prolog giving each its share, results
collected from files, and nothing left in the queue or on the simulated GPUs afterwards."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from typing import Any, Dict, List

from tests.integration.test_isolation import gpu_snapshot

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NODES = {"tslice": "n5", "mps": "n2", "migd": "n4"}


def probe(sandbox: Any, tmp_path: Any, *args: str, timeout: float = 900
          ) -> subprocess.CompletedProcess:
    work = os.path.join(sandbox.jobs_dir, f"probe-{time.monotonic_ns()}")
    os.makedirs(work)
    os.chmod(work, 0o1777)
    env = dict(sandbox.env, PYTHONPATH=os.pathsep.join([REPO, sandbox.job_pythonpath]))
    argv = [sys.executable, "-m", "slurmiso", "probe", "--work-dir", work,
            "--results-dir", str(tmp_path / "results"), "--job-python", sandbox.job_python,
            "--requests", "40", "--rate", "0", "--train-seconds", "3",
            "--queue-timeout", "120s", *args]
    return subprocess.run(argv, env=env, text=True, capture_output=True, timeout=timeout,
                          cwd=REPO)


def probe_jobs(sandbox: Any) -> List[str]:
    out = sandbox.cmd("squeue", "-h", "-o", "%i %j", check=False)
    return [ln for ln in out.splitlines() if "slurmiso-probe-" in ln]


def test_probe_through_slurm_on_three_pools(sandbox: Any, tmp_path: Any) -> None:
    before = {node: gpu_snapshot(sandbox, node) for node in NODES.values()}
    cp = probe(sandbox, tmp_path, "--modes", "timeslice,mps,mig-dynamic", "--workload",
               "builtin", "--json")
    assert cp.returncode in (0, 1), cp.stderr  # 1: no mode met the SLO, still a full report
    report: Dict[str, Any] = json.loads(cp.stdout)
    assert report["where"] == "slurm"
    assert [m["mode"] for m in report["modes"]] == ["timeslice", "mps", "mig-dynamic"]
    assert [m["pool"] for m in report["modes"]] == ["tslice", "mps", "migd"]
    for m in report["modes"]:
        assert not m.get("skipped") and not m.get("invalid"), m
        assert m["node"] == NODES[m["pool"]]
        # sampled GPU memory: the CPU stand-ins hold none on the simulated GPUs, so it is
        # unknown (None, with why), never 0; where a figure exists it names the sim backend
        mem = m["memory"]
        assert mem["train_sampled_mb"] != 0 and mem["infer_sampled_mb"] != 0
        assert mem["train_sampled_source"] in (None, "sim")
        assert mem["train_sampled_mb"] is not None or mem["train_sampled_why"]
        assert m["infer"]["requests"] == 40 and m["infer"]["p99_ms"] > 0
        assert m["train"]["step_s"] > 0 and m["train"]["throughput_vs_solo"] > 0
        # host figures per run: the command's CPU, and its job's own PSI on cgroup v2 (each
        # run is its own job); on v1 the node's pressure, said so
        for role in ("infer", "train"):
            for when in ("solo", "mixed"):
                h = m["host"][role][when]
                assert h["cpu_cores"] > 0, (m["mode"], role, when, h)
                if sandbox.cgroup_version == 2:
                    assert h["scope"] == "job" and h["stall"]["cpu"] is not None, h
                else:
                    assert h["scope"] in ("node", None) and h["memory_peak_mb"] is None, h
    assert report["recommendation"]["mode"] and report["recommendation"]["why"]
    assert len(report["runs"]) == 12 and all(r["where"].startswith("job ") for r in report["runs"])
    for r in report["runs"]:  # each job started once: none was requeued
        starts = r["output"][:-len(".out")] + ".starts"
        with open(starts) as fh:
            assert len(fh.read().splitlines()) == 1, r["run"]
    # the real prolog gave the mixed MPS jobs their classes' daemons
    mps = report["modes"][1]
    assert mps["gpus"]["infer"].startswith("n2:") and mps["gpus"]["train"].startswith("n2:")
    # every probe job ended; the hooks gave back every GPU share
    assert probe_jobs(sandbox) == []
    sandbox.wait_idle(60)
    for node, snap in before.items():
        assert gpu_snapshot(sandbox, node) == snap, node
    saved = report.get("saved") or ""
    assert saved and os.path.exists(saved)
    # accounting saw the jobs with the pools' partitions and the classes' QoS
    # (slurmdbd takes the last job's record a moment after it ends: wait for it, never time it)
    want = {("slurmiso-probe-mps-mixed-infer", "mps", "infer"),
            ("slurmiso-probe-mig-dynamic-mixed-train", "migd", "train")}
    rows: set = set()
    deadline = time.monotonic() + 60
    while not want <= rows and time.monotonic() < deadline:
        acct = sandbox.cmd("sacct", "-X", "-n", "-P", "-S", "now-1hour", "-o",
                           "JobName,Partition,QOS", check=False)
        rows = {tuple(ln.split("|")) for ln in acct.splitlines() if "slurmiso-probe-" in ln}
        if not want <= rows:
            time.sleep(1)
    assert want <= rows, rows


def test_a_failing_infer_cmd_leaves_nothing_running(sandbox: Any, tmp_path: Any) -> None:
    cp = probe(sandbox, tmp_path, "--modes", "mps", "--infer-cmd", "echo no; exit 3",
               "--train-cmd", "while :; do echo 0.1; sleep 0.1; done", timeout=300)
    assert cp.returncode == 1
    assert "Traceback" not in cp.stderr and "--infer-cmd 'echo no; exit 3'" in cp.stderr
    assert "exit status 3" in cp.stderr and "mps-solo-infer.out" in cp.stderr
    assert probe_jobs(sandbox) == []
