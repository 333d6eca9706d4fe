"""tests/gpu/gpu_check.py cannot run here (no GPU): it is checked for what it must never do,
and for failing clearly, with both summaries written, where there is no driver."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "tests", "gpu", "gpu_check.py")
CLIENT = os.path.join(ROOT, "tests", "gpu", "mps_client.py")


def test_it_never_changes_mig_or_compute_mode_nor_resets() -> None:
    for path in (SCRIPT, CLIENT):
        with open(path) as fh:
            src = fh.read()
        for forbidden in (r"-mig\b", r"--gpu-reset", r"-r\b", r"--compute-mode", r"-c\s+[0-3]",
                          r"set_mig_mode", r"nvmlDeviceSetMigMode", r"SetComputeMode",
                          r"create_gpu_instance", r"destroy_gpu_instance"):
            assert not re.search(forbidden, src), (path, forbidden)


def test_without_a_driver_it_says_so_and_writes_both_summaries(tmp_path) -> None:
    env = dict(os.environ, PATH="/nonexistent")
    cp = subprocess.run([sys.executable, SCRIPT, "--out", str(tmp_path)], env=env,
                        capture_output=True, text=True, timeout=60)
    assert cp.returncode == 2, cp.stderr
    summary = json.loads((tmp_path / "gpu-check.json").read_text())
    assert summary["exit"] == 2 and summary["checks"][0]["reason"] == "nvidia-smi is not on PATH"
    assert "FAIL nvidia driver" in (tmp_path / "gpu-check.txt").read_text()


def test_the_makefile_target_runs_it_within_eight_minutes() -> None:
    with open(os.path.join(ROOT, "Makefile")) as fh:
        make = fh.read()
    assert re.search(r"^gpu-check:\n\ttimeout 480 \$\(PYTHON\) tests/gpu/gpu_check.py", make,
                     re.M)
