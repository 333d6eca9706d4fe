"""The agent's collector on a simulated node, on a registry the test builds."""

from __future__ import annotations

import os

from prometheus_client import CollectorRegistry, generate_latest

from slurmiso.agent.gpus import NodeCollector, gather_node
from slurmiso.errors import GpuLost
from slurmiso.exposition import gpu_series as gs
from slurmiso.exposition.job_series import SERIES
from slurmiso.exposition.text import parse_prometheus_text
from slurmiso.gpu.backend import create_mig_device
from slurmiso.gpu.sim import SimBackend, init_state
from slurmiso.monitor import telemetry as t
from slurmiso.state.record import JobRecord


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
    records = {j: JobRecord.from_dict(r) for j, r in {
        "41": {"class": "infer", "resources": [{"kind": "mig-static", "gpu": 0,
                                                "gi": inst.gi_id, "uuid": inst.uuid}]},
        "42": {"class": "train", "resources": [{"kind": "shared-gpu", "gpu": 1,
                                                "uuid": backend.device(1).uuid}]},
        "43": {"class": "train", "resources": [{"kind": "shared-gpu", "gpu": 1}]},
    }.items()}
    registry = CollectorRegistry(auto_describe=False)
    registry.register(NodeCollector(
        lambda: gather_node(None, "n3", backend=backend, records=records, clock=lambda: 123.0),
        "n3", job_labels=True))
    text = generate_latest(registry).decode()
    samples = parse_prometheus_text(text)
    used = {(s.labels["gpu"], s.labels["gi"]): s for s in samples if s.name == gs.M_MEM_USED}
    assert used[("0", str(inst.gi_id))].value == 10_000 * gs.MIB
    assert used[("0", str(inst.gi_id))].labels["job"] == "41"
    assert used[("0", str(inst.gi_id))].labels["class"] == "infer"
    assert used[("1", "")].labels["job"] == "42,43" and used[("1", "")].labels["class"] == "train"
    assert used[("1", "")].value == 30_000 * gs.MIB
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
    assert gs.M_MEM_USED not in text


def test_no_job_label_by_default_and_dcgm_names(tmp_path: os.PathLike[str]) -> None:
    """Per-GPU series carry no job id unless asked (cardinality; the per-job series of
    exposition/job_series.py are one per job anyway); DCGM exporter names and labels are there for
    existing dashboards: FB in MiB, SM as a ratio, GPU_UTIL in %."""
    backend = _node(str(tmp_path))
    inst = backend.instances(0)[0]
    records = {"42": JobRecord.from_dict(
        {"class": "train", "resources": [{"kind": "shared-gpu", "gpu": 1}]})}
    registry = CollectorRegistry(auto_describe=False)
    registry.register(NodeCollector(
        lambda: gather_node(None, "n3", backend=backend, records=records, clock=lambda: 1.0),
        "n3"))
    samples = parse_prometheus_text(generate_latest(registry).decode())
    assert not any("job" in s.labels or "hpc_job" in s.labels for s in samples
                   if s.name not in SERIES)
    dcgm = {(s.name, s.labels["gpu"], s.labels["GPU_I_ID"]): s for s in samples
            if s.name.startswith("DCGM_")}
    assert dcgm[(gs.DCGM_USED, "1", "")].value == 30_000, "MiB, as DCGM"
    assert dcgm[(gs.DCGM_SM, "1", "")].value == 0.9
    assert dcgm[(gs.DCGM_UTIL, "1", "")].value == 50.0, "percent, graphics engine"
    mig = dcgm[(gs.DCGM_USED, "0", str(inst.gi_id))]
    assert mig.labels["GPU_I_PROFILE"] == "3g.40gb" and mig.labels["Hostname"] == "n3"
    assert {"UUID", "device", "modelName"} <= set(mig.labels)
    assert (gs.DCGM_UTIL, "0", str(inst.gi_id)) not in dcgm, "no GPU_UTIL on MIG (as DCGM)"
    assert (gs.DCGM_USED, "0", "") not in dcgm, "a MIG GPU is reported per instance"


def test_sim_reports_sm_by_gpm_dcgm_or_not_at_all(tmp_path: os.PathLike[str]) -> None:
    """The simulated node reports SM through each path; without GPM or DCGM it is unknown
    (None, no series), never 0, while graphics-engine activity is still there."""
    backend = _node(str(tmp_path))
    for source, expected in (("gpm", 0.9), ("dcgm", 0.9), ("none", None)):
        backend.set_load(1, sm_source=source)
        tel = backend.telemetry(1)
        assert tel.sm_active == expected and tel.gr_engine_active == 0.5
        assert tel.sm_source == ("" if source == "none" else source)
    report = gather_node(None, "n3", backend=backend, records={}, clock=lambda: 1.0)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(NodeCollector(lambda: report, "n3"))
    text = generate_latest(registry).decode()
    sm = [s for s in parse_prometheus_text(text) if s.name in (gs.M_SM, gs.DCGM_SM)]
    assert sm and all(s.labels["gpu"] != "1" for s in sm), "no SM series for GPU 1"
    view, _ = t.agent_view(text, 1.0)
    assert view[1].sm_active_pct is None and view[1].gr_active_pct == 50.0


def test_the_local_source_folds_the_agents_rows_it_is_handed(tmp_path: os.PathLike[str]
                                                             ) -> None:
    """``--telemetry local``: the CLI hands the monitor the agent's reader (the monitor never
    imports the agent); MIG instances fold into their GPU, as the agent's series do."""
    backend = _node(str(tmp_path))
    inst = backend.instances(0)[0]
    records = {"41": JobRecord.from_dict({"class": "infer", "resources": [
        {"kind": "mig-static", "gpu": 0, "gi": inst.gi_id, "uuid": inst.uuid}]})}

    class Cfg:
        def pool_for_node(self, node: str) -> object:
            return node if node == "n3" else None

    def read(cfg: object, node: str) -> object:
        return gather_node(None, node, backend=backend, records=records, clock=lambda: 123.0)

    reading = t.BackendSource(Cfg(), read).read({"n3": "", "elsewhere": ""}, 130.0)
    assert set(reading.gpus) == {"n3"} and reading.ages == {"n3": 7.0}
    gpu0, gpu1 = reading.gpus["n3"]
    assert gpu0.jobs == ("41",) and gpu0.classes == ("infer",)
    assert gpu0.mig_profiles == ("3g.40gb",) and gpu0.memory_used_mb == 10_000
    assert gpu1.sm_active_pct == 90.0 and gpu1.processes == 1 and gpu1.jobs == ()
