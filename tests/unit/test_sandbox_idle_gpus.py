"""A sandbox session starts with idle simulated GPUs, whatever an earlier run left in the
node state files (a crashed test's injected load, a machine image's stale processes)."""

from __future__ import annotations

import os
from pathlib import Path

from slurmiso.gpu.sim import SimBackend, init_state
from slurmiso_sandbox.client import SandboxClient


def test_idle_gpus_forgets_every_nodes_load_and_processes(tmp_path: Path) -> None:
    os.makedirs(tmp_path / "sim")
    sims = []
    for node in ("n1", "n2"):
        path = str(tmp_path / "sim" / f"{node}.json")
        init_state(path, "H100-80GB", 2, node=node)
        sim = SimBackend(path)
        sim.set_load(1, util=95, sm_active=95, memory_used_mb=70 * 1024)
        sim.add_process(0, 1, 4096, name="left")  # pid 1: alive, so it would count
        sims.append(sim)
    assert sims[1].device(1).memory_used_mb == 70 * 1024
    SandboxClient(str(tmp_path), str(tmp_path)).idle_gpus()
    for sim in sims:
        assert sim.processes() == []
        assert [sim.device(i).memory_used_mb for i in (0, 1)] == [0, 0]
        assert sim.state()["gpus"][1]["load"]["sm"] == 0
