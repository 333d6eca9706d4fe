"""Simulated nodes of an L40S (no MIG), an H100 NVL and a B200 (MIG), and of a GPU the
catalogue lacks: what each reports, MIG where it exists, and hooks on them (issue 26)."""

from __future__ import annotations

import os
from typing import Any, Iterator

import psutil
import pytest

from slurmiso.errors import GpuInsufficientResources, GpuNotSupported, JobProblem, UsageError
from slurmiso.gpu.backend import create_mig_device
from slurmiso.gpu.placement import pack
from slurmiso.gpu.profiles import lookup_model
from slurmiso.gpu.sim import SimBackend, init_state
from slurmiso.isolation.mps import HANDLER
from tests.hookctx import job_env, make_context, state, write_config

NODES = [
    # model, NVML name, memory MiB, MIG, architecture
    ("L40S", "NVIDIA L40S", 46068, False, "ada"),
    ("H100-NVL", "NVIDIA H100 NVL", 95830, True, "hopper"),
    ("B200", "NVIDIA B200", 183359, True, "blackwell"),
]


@pytest.fixture(autouse=True)
def no_leaked_daemons(tmp_path: Any) -> Iterator[None]:
    yield
    for proc in psutil.process_iter(["pid", "cmdline"]):
        try:
            if proc.pid != os.getpid() and any(str(tmp_path) in p for p in proc.info["cmdline"]
                                               or []):
                proc.kill()
        except psutil.Error:
            pass


@pytest.mark.parametrize("model,name,memory,mig,arch", NODES, ids=[n[0] for n in NODES])
def test_sim_node_reports_the_model(tmp_path: Any, model: str, name: str, memory: int,
                                    mig: bool, arch: str) -> None:
    path = str(tmp_path / "n.json")
    init_state(path, model, 2, mig=mig, node="n")
    sim = SimBackend(path)
    dev = sim.device(1)
    canonical = lookup_model(model)
    assert canonical is not None
    assert (dev.name, dev.model, dev.memory_total_mb, dev.architecture, dev.mig_enabled) == (
        name, canonical.name, memory, arch, mig)
    assert sim.telemetry(0).memory_total_mb == memory
    assert sim.profiles(0) == list(canonical.profiles)
    if not mig:
        assert sim.profiles(0) == []
        with pytest.raises(GpuNotSupported, match="no MIG support"):
            sim.set_mig_mode(0, True)
        with pytest.raises(UsageError, match="no MIG support"):
            init_state(str(tmp_path / "m.json"), model, 1, mig=True)


@pytest.mark.parametrize("model,small,mid,half,big", [
    ("H100-NVL", "1g.12gb", "2g.24gb", "3g.47gb", "4g.47gb"),
    ("B200", "1g.23gb", "2g.45gb", "3g.90gb", "4g.90gb"),
])
def test_mig_layouts_on_the_sim(tmp_path: Any, model: str, small: str, mid: str, half: str,
                                big: str) -> None:
    """mig-parted's all-balanced (2x 1g, 1x 2g, 1x 3g) fits where the packer puts it (a 1g
    cannot start at slice 7, so the 3g goes last); 4g+3g fits, 4g twice does not."""
    path = str(tmp_path / "n.json")
    init_state(path, model, 2, mig=True, node="n")
    sim = SimBackend(path)
    catalogue = lookup_model(model)
    assert catalogue is not None
    layout = pack(catalogue, {half: 1, mid: 1, small: 2})
    assert layout is not None and sorted((s, p) for p, s in layout) == [
        (0, mid), (2, small), (3, small), (4, half)]
    made = [create_mig_device(sim, 0, p, s) for p, s in layout]
    assert all(i.uuid.startswith("MIG-") for i in made)
    assert sim.free_placements(0, small) == []
    create_mig_device(sim, 1, big)
    assert sim.free_placements(1, half) == [4] and sim.free_placements(1, big) == []
    with pytest.raises(GpuInsufficientResources):
        sim.create_gpu_instance(1, big)


def test_a_gpu_without_a_catalogue_entry(tmp_path: Any) -> None:
    path = str(tmp_path / "n.json")
    init_state(path, "RTX-A5000", 2, node="n", memory_mb=24564)
    sim = SimBackend(path)
    dev = sim.device(0)
    assert (dev.name, dev.model, dev.memory_total_mb, dev.mig_enabled) == (
        "NVIDIA RTX-A5000", "RTX-A5000", 24564, False)
    assert sim.profiles(0) == [] and SimBackend(path).state()["custom_model"] == {
        "product_name": "NVIDIA RTX-A5000", "memory_mb": 24564}


def test_mps_headroom_uses_the_memory_the_l40s_reports(tmp_path: Any) -> None:
    """Two train jobs (30 GiB pinned each) fit an H100 but not an L40S's 46068 MiB."""
    a = make_context(str(tmp_path), "mps", job_id="101", model="L40S")
    a.save()
    b = make_context(str(tmp_path), "mps", job_id="102", model="L40S")
    b.save()
    HANDLER.setup(a)
    with pytest.raises(JobProblem, match=r"61440 MiB > 46068 MiB"):
        HANDLER.setup(b)
    HANDLER.teardown(a)


def test_exclusive_prolog_and_epilog_on_an_l40s(tmp_path: Any) -> None:
    from slurmiso.hooks.runner import run_hook

    tmp = str(tmp_path)
    cfg = write_config(tmp, "exclusive", model="L40S")
    assert run_hook("prolog", job_env(gpus="1"), cfg, lambda n, r: None) == 0
    rec = state(tmp).read_job("42")
    assert rec is not None and rec.env["CUDA_VISIBLE_DEVICES"] == "1"
    assert run_hook("epilog", job_env(gpus="1"), cfg, lambda n, r: None) == 0
    assert state(tmp).read_job("42") is None
