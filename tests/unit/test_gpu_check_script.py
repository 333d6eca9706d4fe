"""tests/gpu/gpu_check.py, as far as it runs without a GPU: what it must never do (read from its
source), failing clearly without a driver, and its whole run in --sim (a simulated node, its MPS
daemon, the probe's CPU stand-ins): every stage bounded and recorded, a hanging stage ended with
its children and the next one still run, the summaries written whatever happens."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tarfile
import time
from typing import Any, Dict

import psutil

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "tests", "gpu", "gpu_check.py")
CLIENT = os.path.join(ROOT, "tests", "gpu", "mps_client.py")


def run(tmp_path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURMISO_")}
    return subprocess.run([sys.executable, SCRIPT, "--out", str(tmp_path / "out"), *args],
                          env=env, capture_output=True, text=True, timeout=timeout)


def summary(tmp_path) -> Dict[str, Any]:
    return json.loads((tmp_path / "out" / "gpu-check.json").read_text())


def by_name(s: Dict[str, Any]) -> Dict[str, Dict[str, Any]]:
    return {r["check"]: r for r in s["checks"]}


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_it_never_changes_mig_or_compute_mode_nor_resets() -> None:
    for path in (SCRIPT, CLIENT):
        with open(path) as fh:
            src = fh.read()
        for forbidden in (r"-mig\b", r"--gpu-reset", r"-r\b", r"--compute-mode", r"-c\s+[0-3]",
                          r"set_mig_mode", r"nvmlDeviceSetMigMode", r"SetComputeMode",
                          r"create_gpu_instance", r"destroy_gpu_instance", r"create_mig_device",
                          r"mig-dynamic", r"mig-static"):
            assert not re.search(forbidden, src), (path, forbidden)


def test_without_a_driver_it_says_so_and_writes_both_summaries(tmp_path) -> None:
    env = dict(os.environ, PATH="/nonexistent")
    cp = subprocess.run([sys.executable, SCRIPT, "--out", str(tmp_path / "out")], env=env,
                        capture_output=True, text=True, timeout=60)
    assert cp.returncode == 2, cp.stderr
    s = summary(tmp_path)
    assert s["exit"] == 2 and s["checks"][0]["reason"] == "nvidia-smi is not on PATH"
    assert "FAIL nvidia driver" in (tmp_path / "out" / "gpu-check.txt").read_text()


def test_the_makefile_target_runs_it_within_eight_minutes() -> None:
    with open(os.path.join(ROOT, "Makefile")) as fh:
        make = fh.read()
    assert re.search(r"^gpu-check:\n\ttimeout 480 \$\(PYTHON\) tests/gpu/gpu_check.py", make,
                     re.M)
    sys.path.insert(0, os.path.dirname(SCRIPT))
    try:
        import gpu_check
    finally:
        sys.path.remove(os.path.dirname(SCRIPT))
    # the stages' own limits fit the budget, and the budget leaves make's limit room
    assert sum(t for _, t in gpu_check.STAGES) + gpu_check.FINAL_RESERVE_S <= \
        gpu_check.BUDGET_S < 480


def test_a_whole_sim_run_records_every_stage_and_leaves_nothing(tmp_path) -> None:
    cp = run(tmp_path, "--sim")
    assert cp.returncode == 0, cp.stdout + cp.stderr
    s = summary(tmp_path)
    assert s["exit"] == 0 and s["state"] == "done"
    checks = by_name(s)
    for name in ("python", "module yaml", "module psutil", "tests/nvml", "mps daemon limits",
                 "mps client granted", "probe --local", "probe memory sampled",
                 "gpu state unchanged", "nothing left on the GPU"):
        assert name in checks, name
    assert checks["mps daemon limits"]["status"] == "pass"
    assert "'active_thread_percentage': 60.0" in checks["mps client granted"]["reason"]
    assert checks["mps memory limit"]["status"] == "skip"  # no CUDA client in --sim
    probe = checks["probe --local"]
    assert probe["status"] == "pass" and set(probe["modes"]) == {
        "timeslice", "mps", "mps-priority", "mps-v3", "mps-sm-partition"}
    assert checks["probe mps-v3"]["status"] == "pass"  # the stand-in speaks protocol 3
    assert checks["probe mps-sm-partition"]["status"] == "pass"  # and has -S
    assert "workload cpu-stand-in" in probe["reason"]
    assert checks["tests/nvml"]["status"] == "skip"  # no driver: every NVML test skips
    assert checks["gpu state unchanged"]["status"] == "pass"
    text = (tmp_path / "out" / "gpu-check.txt").read_text()
    assert text.endswith("exit 0\n") and "PASS probe --local" in text
    out = sorted(os.listdir(tmp_path / "out"))  # few files: a device sends back at most 8
    assert out == ["gpu-check-logs.tar.gz", "gpu-check.json", "gpu-check.txt", "probe.html",
                   "probe.json"]
    with tarfile.open(tmp_path / "out" / "gpu-check-logs.tar.gz") as tar:
        names = tar.getnames()
    assert "gpu-check-work/nvml-tests.txt" in names
    assert "gpu-check-work/stage-probe---local.log" in names
    assert not [p for p in psutil.process_iter(["cmdline"])
                if str(tmp_path) in " ".join(p.info["cmdline"] or [])]


def test_a_hanging_stage_is_ended_with_its_children_and_the_next_one_runs(tmp_path) -> None:
    cp = run(tmp_path, "--sim", "--stages", "preflight,tests/nvml", "--hang", "preflight",
             "--timeout", "preflight=2", "--keep-work")
    assert cp.returncode == 1, cp.stdout + cp.stderr
    s = summary(tmp_path)
    checks = by_name(s)
    assert checks["hang"]["status"] == "pass"  # premise: the stage got as far as hanging
    assert checks["preflight"]["status"] == "fail"
    assert checks["preflight"]["reason"].startswith("timed out after 2s (hung?) and was ended")
    assert checks["tests/nvml"]["status"] == "skip"  # the next stage ran
    names = [r["check"] for r in s["checks"]]
    assert names.index("tests/nvml") > names.index("preflight")
    assert names[-2:] == ["gpu state unchanged", "nothing left on the GPU"]
    stage_pid, child_pid = map(int, (tmp_path / "out" / "work" / "hang.pids").read_text()
                               .split())
    assert gone(stage_pid) and gone(child_pid)


def test_sigterm_from_outside_still_writes_the_summary(tmp_path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURMISO_")}
    proc = subprocess.Popen([sys.executable, SCRIPT, "--out", str(tmp_path / "out"), "--sim",
                             "--stages", "preflight", "--hang", "preflight", "--keep-work"],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    pids = tmp_path / "out" / "work" / "hang.pids"
    deadline = time.monotonic() + 120  # an upper bound, polled: the readiness marker
    while not pids.exists() or not pids.read_text().strip():
        assert proc.poll() is None and time.monotonic() < deadline
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)  # as make's `timeout 480` would
    assert proc.wait(60) == 1
    s = summary(tmp_path)
    assert s["state"] == "interrupted" and s["exit"] == 1
    assert by_name(s)["gpu-check"]["reason"].startswith("interrupted (SIGTERM")
    assert (tmp_path / "out" / "gpu-check.txt").read_text().endswith("interrupted\n")
    assert (tmp_path / "out" / "gpu-check-logs.tar.gz").exists()
    stage_pid, child_pid = map(int, pids.read_text().split())
    assert gone(stage_pid) and gone(child_pid)


def test_hang_is_refused_outside_sim(tmp_path) -> None:
    cp = run(tmp_path, "--hang", "preflight", timeout=60)
    assert cp.returncode == 2 and "--hang is for --sim tests only" in cp.stderr

