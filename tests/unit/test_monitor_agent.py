"""The agent's collector on a simulated node, on a registry the test builds."""

from __future__ import annotations

import os

from prometheus_client import CollectorRegistry, generate_latest

from slurmiso.errors import GpuLost
from slurmiso.gpu.backend import create_mig_device
from slurmiso.gpu.sim import SimBackend, init_state
from slurmiso.monitor import telemetry as t
from slurmiso.monitor.agent import NodeCollector, gather_node


def _node(tmp: str) -> SimBackend:
    path = os.path.join(tmp, "n3.json")
    init_state(path, "H100-80GB", 2, mig=True, node="n3")
    backend = SimBackend(path)
    backend.set_mig_mode(1, False)
    inst = create_mig_device(backend, 0, "3g.40gb")
    backend.add_process(0, os.getpid(), 10_000, inst.uuid, "infer-server")
    backend.add_process(1, os.getpid(), 30_000, "", "trainer")
    backend.set_load(1, util=50, sm_active=90)
    return backend


def test_collector_exports_gpus_instances_jobs(tmp_path: os.PathLike[str]) -> None:
    backend = _node(str(tmp_path))
    inst = backend.instances(0)[0]
    records = {
        "41": {"class": "infer", "resources": [{"kind": "mig-static", "gpu": 0,
                                                "gi": inst.gi_id, "uuid": inst.uuid}]},
        "42": {"class": "train", "resources": [{"kind": "shared-gpu", "gpu": 1,
                                                "uuid": backend.device(1).uuid}]},
        "43": {"class": "train", "resources": [{"kind": "shared-gpu", "gpu": 1}]},
    }
    registry = CollectorRegistry(auto_describe=False)
    registry.register(NodeCollector(
        lambda: gather_node(None, "n3", backend=backend, records=records, clock=lambda: 123.0),
        "n3"))
    text = generate_latest(registry).decode()
    samples = t.parse_prometheus_text(text)
    used = {(s.labels["gpu"], s.labels["gi"]): s for s in samples if s.name == t.M_MEM_USED}
    assert used[("0", str(inst.gi_id))].value == 10_000 * t.MIB
    assert used[("0", str(inst.gi_id))].labels["job"] == "41"
    assert used[("0", str(inst.gi_id))].labels["class"] == "infer"
    assert used[("1", "")].labels["job"] == "42,43" and used[("1", "")].labels["class"] == "train"
    assert used[("1", "")].value == 30_000 * t.MIB
    gpus, collected = t.agent_gpus(samples)
    assert collected == 123.0
    assert gpus[1].sm_active_pct == 90.0 and gpus[1].processes == 1
    assert gpus[0].jobs == ("41",) and gpus[0].mig_profiles == ("3g.40gb",)


def test_collector_reports_down_instead_of_failing(tmp_path: os.PathLike[str]) -> None:
    def broken() -> object:
        raise GpuLost("GPU 0 fell off the bus")

    registry = CollectorRegistry(auto_describe=False)
    registry.register(NodeCollector(broken, "n3"))  # type: ignore[arg-type]
    text = generate_latest(registry).decode()
    assert 'slurmiso_agent_up{node="n3"} 0.0' in text
    assert t.M_MEM_USED not in text
