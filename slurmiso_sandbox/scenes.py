"""What the demo (:mod:`.demo`) and the ladder's scene (:mod:`.protect`) both use.

    config = monitor_config(sbx, folder)   # the sandbox config, its monitor acting at once
    gpu = record_gpu(sbx, "n2", job)       # the GPU the prolog gave a job on a node
"""

from __future__ import annotations

import json
import os
import re
import time

from slurmiso.errors import SandboxError
from slurmiso_sandbox.client import SandboxClient


def monitor_config(sbx: SandboxClient, folder: str, extra_layouts: str = "") -> str:
    """A copy of the sandbox config whose monitor acts at once (no dwell, not dry-run)."""
    with open(sbx.slurmiso_config) as fh:
        text = fh.read()
    text = re.sub(r"min_dwell: \S+", "min_dwell: 0s", text)
    text = re.sub(r"dry_run: true", "dry_run: false", text)
    if extra_layouts:
        text = text.replace("  mig-configs:\n", "  mig-configs:\n" + extra_layouts, 1)
    path = os.path.join(folder, "slurmiso-monitor.yaml")
    with open(path, "w") as fh:
        fh.write(text)
    return path


def record_gpu(sbx: SandboxClient, node: str, job: str, timeout: float = 30) -> int:
    """The GPU the prolog gave ``job`` on ``node``, from its record (what the agent reads)."""
    path = sbx.path("state", node, "jobs", f"{job}.json")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with open(path) as fh:
                rec = json.load(fh)
            gpus = [r["gpu"] for r in rec.get("resources", []) if r.get("gpu") is not None]
            if rec.get("status") == "ready" and gpus:
                return int(gpus[0])
        except (OSError, ValueError):
            pass
        time.sleep(0.2)
    raise SandboxError(f"job {job} has no ready record with a GPU on {node}")
