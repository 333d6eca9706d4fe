"""``slurmiso audit --live`` on the sandbox finds what was planted: an orphaned MIG instance,
a GPU process no job owns, and a QoS that drifted from the config; each plant is undone."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any, Dict, List

from slurmiso.gpu.backend import create_mig_device, destroy_mig_device
from slurmiso.gpu.sim import SimBackend


def audit_live(sandbox: Any, node: str) -> List[Dict[str, Any]]:
    cp = sandbox.slurmiso("audit", "--live", "--node", node, "--since", "1h", "--format", "json")
    assert cp.returncode in (0, 1), cp.stderr
    return json.loads(cp.stdout)["findings"]


def codes(findings: List[Dict[str, Any]]) -> Dict[str, str]:
    return {f["code"]: f["message"] for f in findings}


def test_orphaned_mig_instance_is_reported(sandbox: Any) -> None:
    sim = SimBackend(sandbox.path("sim", "n4.json"))
    orphan = create_mig_device(sim, 1, "1g.10gb")
    try:
        found = codes(audit_live(sandbox, "n4"))
        assert "orphaned-mig-instances" in found and "1g.10gb" in found["orphaned-mig-instances"]
    finally:
        destroy_mig_device(sim, orphan)
    assert "orphaned-mig-instances" not in codes(audit_live(sandbox, "n4"))


def test_gpu_process_of_no_job_is_reported(sandbox: Any) -> None:
    sim = SimBackend(sandbox.path("sim", "n1.json"))
    stray = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        sim.add_process(0, stray.pid, used_memory_mb=2048, name="stray")
        found = audit_live(sandbox, "n1")
        hits = [f for f in found if str(stray.pid) in f["message"]]
        assert hits, found
    finally:
        stray.kill()
        stray.wait()


def test_qos_drift_is_reported(sandbox: Any) -> None:
    sandbox.cmd("sacctmgr", "-i", "modify", "qos", "where", "name=train", "set", "GraceTime=5")
    try:
        found = codes(audit_live(sandbox, "n1"))
        drift = [m for c, m in found.items() if "qos" in c]
        assert drift and any("train" in m for m in drift), found
    finally:
        sandbox.cmd("sacctmgr", "-i", "modify", "qos", "where", "name=train", "set",
                    "GraceTime=30")
