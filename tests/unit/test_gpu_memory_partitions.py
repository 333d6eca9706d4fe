"""Per-job GPU memory partitions (issue 35, item 2): the class's share in the config, the
simulated driver as NVIDIA documents the calls, NVML's call as nvidia-ml-py defines it, and
the agent's round that sets them on a job's cgroup."""

from __future__ import annotations

import json
import os
import pathlib
import shutil
from typing import Any, Dict, List

import pynvml
import pytest
import yaml

from slurmiso.agent import gpu_memory
from slurmiso.agent.gpu_memory import memory_round
from slurmiso.config.loader import parse_config
from slurmiso.config.model import GpuMemoryShare
from slurmiso.errors import (
    ConfigError,
    GpuError,
    GpuInsufficientResources,
    GpuNotFound,
    GpuNotSupported,
)
from slurmiso.gpu.memory_limits import LIMIT_MAX, MIB, JobMemoryLimits
from slurmiso.gpu.nvml import NvmlBackend
from slurmiso.gpu.sim import SimBackend, init_state
from slurmiso.state import Journal
from slurmiso.state.record import JobRecord, RecordStatus, Resource, ResourceState
from tests.unit.test_host_quota import config_with
from tests.unit.test_host_rung import ETC, FIX, V2_JOB

NOW = 1_733_460_000.0
GIB = 1 << 30


def _config(**classes: Dict[str, Any]) -> Any:
    return config_with("gpu_memory", **classes)


# ------------------------------------------------------------------------------ the config
def test_a_share_loads_in_sizes_or_shares_of_the_gpu() -> None:
    cfg = _config(infer={"hard": "40G", "soft": "20G"}, train={"hard": "45%", "soft": "30%"})
    got = {c.name: c.gpu_memory for c in cfg.classes}
    assert got["infer"] == GpuMemoryShare(hard_mb=40960, soft_mb=20480)
    assert got["train"].limits_mb(81920) == (81920 * 30 // 100, 81920 * 45 // 100)
    assert not got["debug"].any()


@pytest.mark.parametrize("share,words", [
    ({"hard": "10G", "soft": "20G"}, "soft limit"),
    ({"hard": "40%", "soft": "60%"}, "soft limit"),
    ({"hard": "140%"}, "share of the GPU's memory"),
    ({"hard": "lots"}, "memory size"),
    ({"max": "10G"}, "unknown key"),
])
def test_share_nonsense_is_one_clear_error(share: Dict[str, Any], words: str) -> None:
    with pytest.raises(ConfigError) as err:
        _config(train=share)
    lines = [p for p in err.value.problems if "gpu_memory" in p]
    assert len(lines) == 1 and words in lines[0], err.value.problems


# ------------------------------------------------------------------- the simulated driver
@pytest.fixture()
def sim(tmp_path: pathlib.Path) -> SimBackend:
    init_state(str(tmp_path / "node.json"), "A100-SXM4-80GB", 2, node="n1")
    return SimBackend(str(tmp_path / "node.json"))


def test_the_sim_sets_reads_and_clears_a_cgroups_limits(sim: SimBackend,
                                                        tmp_path: pathlib.Path) -> None:
    cg = str(tmp_path)
    with pytest.raises(GpuNotFound, match="NOT_FOUND"):
        sim.memory_limits(0, cg)  # none set yet: NVML's NOT_FOUND
    sim.set_memory_limits(0, cg, JobMemoryLimits.of(20480, 40960))
    assert sim.memory_limits(0, cg) == JobMemoryLimits(20 * GIB, 40 * GIB, 0)
    with pytest.raises(GpuNotFound):
        sim.memory_limits(1, cg)  # per GPU
    sim.set_memory_limits(0, cg, JobMemoryLimits())  # soft 0, hard max: cleared
    with pytest.raises(GpuNotFound):
        sim.memory_limits(0, cg)


@pytest.mark.parametrize("limits,cgroup,words", [
    (JobMemoryLimits(40 * GIB, 20 * GIB), "", "INVALID_ARGUMENT"),
    (JobMemoryLimits(0, 100 * GIB), "", "above the GPU"),
    (JobMemoryLimits(0, GIB), "/no/such/cgroup", "OPERATING_SYSTEM"),
])
def test_the_sim_refuses_what_nvml_refuses(sim: SimBackend, tmp_path: pathlib.Path,
                                           limits: JobMemoryLimits, cgroup: str,
                                           words: str) -> None:
    with pytest.raises(GpuError, match=words):
        sim.set_memory_limits(0, cgroup or str(tmp_path), limits)


def test_mig_gpus_and_old_drivers_have_no_partitions(tmp_path: pathlib.Path) -> None:
    init_state(str(tmp_path / "mig.json"), "A100-SXM4-80GB", 1, mig=True, node="n1")
    with pytest.raises(GpuNotSupported, match="MIG"):
        SimBackend(str(tmp_path / "mig.json")).set_memory_limits(
            0, str(tmp_path), JobMemoryLimits.of(0, 1024))
    init_state(str(tmp_path / "old.json"), "A100-SXM4-80GB", 1, node="n1")
    old = SimBackend(str(tmp_path / "old.json"))
    old.set_memory_partitioning(False)
    with pytest.raises(GpuNotSupported, match="r615"):
        old.set_memory_limits(0, str(tmp_path), JobMemoryLimits.of(0, 1024))


def test_an_allocation_past_the_hard_limit_fails_for_the_cgroup_and_below(
        sim: SimBackend, tmp_path: pathlib.Path) -> None:
    job = tmp_path / "job_1"
    (job / "step_0").mkdir(parents=True)
    sim.set_memory_limits(0, str(job), JobMemoryLimits.of(0, 10240))
    me = os.getpid()
    sim.add_process(0, me, 6000, cgroup=str(job / "step_0"))
    with pytest.raises(GpuInsufficientResources, match="OUT_OF_MEMORY"):
        sim.add_process(0, os.getppid(), 6000, cgroup=str(job))  # 12,000 MiB in job_1
    sim.add_process(0, os.getppid(), 4000, cgroup=str(job))  # 10,000: at the limit
    sim.add_process(1, os.getppid(), 30000, cgroup=str(job))  # another GPU: no partition
    sim.add_process(0, me, 9000, cgroup=str(tmp_path / "other"))  # another cgroup's pid
    used = sim.memory_limits(0, str(job)).used_bytes
    assert used == 4000 * MIB  # the pid moved out; the one left holds 4,000 MiB


# --------------------------------------------------------------------------------- NVML's call
class _FakeNvml:
    """pynvml's real structures and constants; the two calls recorded."""

    NVMLError = pynvml.NVMLError
    c_nvmlSetMemoryLimits_v1_t = pynvml.c_nvmlSetMemoryLimits_v1_t
    c_nvmlGetMemoryLimits_v1_t = pynvml.c_nvmlGetMemoryLimits_v1_t

    def __init__(self) -> None:
        self.calls: List[Any] = []

    def nvmlDeviceGetCount(self) -> int:
        return 1

    def nvmlDeviceGetHandleByIndex(self, index: int) -> str:
        return f"h{index}"

    def nvmlDeviceSetMemoryLimits_v1(self, handle: str, arg: Any) -> None:
        name = arg.nameSpace  # (pynvml's structures give a char* back as str)
        self.calls.append((handle, os.fsdecode(name), arg.softLimit, arg.hardLimit))

    def nvmlDeviceGetMemoryLimits_v1(self, handle: str, arg: Any) -> None:
        arg.softLimit, arg.hardLimit, arg.currentUsed = 1, LIMIT_MAX, 3


def test_nvml_gets_the_cgroups_path_and_bytes() -> None:
    backend = NvmlBackend()
    fake = _FakeNvml()
    backend._nvml = fake
    backend.set_memory_limits(0, "/sys/fs/cgroup/job_1", JobMemoryLimits.of(1, 0))
    assert fake.calls == [("h0", "/sys/fs/cgroup/job_1", MIB,
                           pynvml.NVML_DEVICE_MEMORY_LIMIT_MAX)]
    assert backend.memory_limits(0, "/x") == JobMemoryLimits(1, LIMIT_MAX, 3)


# ------------------------------------------------------------------------ the agent's round
@pytest.fixture()
def v2(tmp_path: pathlib.Path) -> pathlib.Path:
    shutil.copytree(os.path.join(FIX, "slurm-v2"), str(tmp_path / "cg"), symlinks=True)
    gpu_memory._SAID.clear()
    return tmp_path


def _records(cls: str = "train", kind: str = "mps") -> Dict[str, JobRecord]:
    res = (Resource(kind, ResourceState.READY, gpu=1) if kind != "mig-static"
           else Resource(kind, ResourceState.READY, gpu=1, uuid="MIG-x"))
    return {"4242": JobRecord("4242", RecordStatus.READY, job_class=cls, resources=[res])}


def _round(tmp: pathlib.Path, cfg: Any, records: Any, backend: Any) -> List[str]:
    return memory_round(cfg, "n1", records, backend, Journal(str(tmp / "journal")),
                        str(tmp / "cg"), now=NOW)


def test_a_jobs_cgroup_gets_its_classes_partition_once(v2: pathlib.Path, sim: SimBackend
                                                       ) -> None:
    cfg = _config(train={"hard": "50%", "soft": "25%"})
    cgroup = str(v2 / "cg" / V2_JOB)
    lines = _round(v2, cfg, _records(), sim)
    assert lines == ["job 4242: gpu-memory: class train: GPU 1: none -> soft 20480 MiB, "
                     "hard 40960 MiB"]
    assert sim.memory_limits(1, cgroup) == JobMemoryLimits(20 * GIB, 40 * GIB, 0)
    assert _round(v2, cfg, _records(), sim) == []  # in force: nothing set, nothing said
    sim.set_memory_limits(1, cgroup, JobMemoryLimits())  # come loose: put back
    assert len(_round(v2, cfg, _records(), sim)) == 1
    events = [json.loads(x) for x in (v2 / "journal").read_text().splitlines()]
    assert [(e["event"], e["target"], e["ok"]) for e in events] == [("gpu-memory", "4242",
                                                                     True)] * 2
    assert events[0]["details"]["hard"] == 40 * GIB


def test_what_the_round_leaves_alone(v2: pathlib.Path, sim: SimBackend) -> None:
    cfg = _config(train={"hard": "50%"})
    assert _round(v2, cfg, _records("infer"), sim) == []  # a class without a share
    assert _round(v2, cfg, _records(kind="mig-static"), sim) == []  # a MIG device
    with pytest.raises(GpuNotFound):
        sim.memory_limits(1, str(v2 / "cg" / V2_JOB))


def test_a_driver_without_partitions_is_said_once(v2: pathlib.Path, sim: SimBackend) -> None:
    sim.set_memory_partitioning(False)
    cfg = _config(train={"hard": "50%"})
    (line,) = _round(v2, cfg, _records(), sim)
    assert "not set" in line and "r615" in line
    assert _round(v2, cfg, _records(), sim) == []


def test_a_cgroup_v1_job_is_said_once_and_left_alone(tmp_path: pathlib.Path,
                                                      sim: SimBackend) -> None:
    """Slurm's cgroup/v1 tree (cpuset, memory, devices, freezer, as on the sandbox): the
    driver partitions v2 cgroups only, so the agent says so once instead of nothing."""
    gpu_memory._SAID.clear()
    for ctl in ("cpuset", "memory", "devices", "freezer"):
        job = tmp_path / "cg" / ctl / "slurm_n1" / "uid_1000" / "job_4242"
        job.mkdir(parents=True)
        (job / "cgroup.procs").write_text("")
    records = _records()
    records["4242"].uid = 1000
    cfg = _config(train={"hard": "50%"})
    (line,) = _round(tmp_path, cfg, records, sim)
    assert line == ("job 4242: gpu-memory: class train: GPU 1: not set (the job's cgroup is "
                    "v1; NVIDIA's memory partitions need cgroup v2)")
    assert _round(tmp_path, cfg, records, sim) == []


def test_a_share_on_a_mig_class_is_refused_by_check_config() -> None:
    with open(ETC, encoding="utf-8") as fh:
        data = yaml.safe_load(fh)
    (train,) = [c for c in data["classes"] if c["name"] == "train"]
    train.update(isolation="mig", gpu_memory={"hard": "50%"})
    with pytest.raises(ConfigError) as err:
        parse_config(data)
    (line,) = [p for p in err.value.problems if "gpu_memory" in p]
    assert "whole GPUs only" in line
