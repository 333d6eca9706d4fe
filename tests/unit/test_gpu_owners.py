"""Which job holds which GPU or MIG instance: records plus GPU processes mapped through their
cgroup, MIG per instance, foreign and unrecorded processes, MPS servers (issue 24)."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any, Dict, Iterator, List

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from slurmiso.agent.gpus import NodeCollector, gather_node
from slurmiso.exposition import job_series as sig
from slurmiso.exposition.text import parse_prometheus_text
from slurmiso.gpu.backend import create_mig_device
from slurmiso.gpu.sim import SimBackend, init_state
from slurmiso.sluid import job_of_cgroup
from slurmiso.state.record import JobRecord
from tests.unit.test_job_signals import signals_of

V1 = """12:freezer:/slurm_n1/uid_1000/job_41/step_0
11:devices:/slurm_n1/uid_1000/job_41/step_0/task_0
10:memory:/slurm/uid_1000/job_41/step_0
4:cpuset:/slurm/uid_1000/job_41/step_0
1:name=systemd:/user.slice
0::/
"""
V2 = "0::/system.slice/slurmstepd.scope/job_42/step_0/user/task_0\n"
#: A job whose delegated cgroup v2 subtree names a deeper "job_99": the first one counts.
NESTED = "0::/system.slice/slurmstepd.scope/job_43/step_0/user/job_99/x\n"


@pytest.mark.parametrize("text, job", [
    (V1, "41"), (V2, "42"), (NESTED, "43"),
    ("0::/user.slice/user-1000.slice/session-3.scope\n", None),  # an ssh login
    ("", None), ("garbage\x00\n::::\n", None),
    ("0::/system.slice/job_12x/\n", None),  # not a job_<digits> component
    ("3:freezer:/elsewhere\n2:devices:/slurm/uid_1/job_7/step_0\n", "7"),
])
def test_job_of_cgroup(text: str, job: Any) -> None:
    assert job_of_cgroup(text) == job


@pytest.fixture
def sleepers() -> Iterator[List[int]]:
    """Real processes (the simulated driver lists only live pids)."""
    procs = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
             for _ in range(6)]
    yield [p.pid for p in procs]
    for p in procs:
        p.kill()
        p.wait()


def _fake_proc(root: str, pid: int, cgroup: str, ppid: int = 1) -> None:
    d = os.path.join(root, str(pid))
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "cgroup"), "w") as fh:
        fh.write(cgroup)
    with open(os.path.join(d, "stat"), "w") as fh:
        fh.write(f"{pid} (nvidia-cuda-mps-server) S {ppid} 1 1 0 -1\n")


def test_mig_instances_per_instance_foreign_unrecorded_and_mps(
        tmp_path: Any, sleepers: List[int]) -> None:
    """GPU 0 is MIG with two instances held by two jobs; GPU 1 is whole, shared by a job and
    a process of no job; a process of a job unknown here; an MPS server under a recorded
    daemon is nobody's and not foreign."""
    path = os.path.join(str(tmp_path), "n3.json")
    init_state(path, "H100-80GB", 2, mig=True, node="n3")
    backend = SimBackend(path)
    backend.set_mig_mode(1, False)
    a = create_mig_device(backend, 0, "3g.40gb")
    b = create_mig_device(backend, 0, "3g.40gb")
    p41, p42, pforeign, punrec, pmps, pother_uid = sleepers
    backend.add_process(0, p41, 10_000, a.uuid, "vllm")
    backend.add_process(0, p42, 10_000, b.uuid, "train")
    backend.add_process(1, pforeign, 5_000, "", "miner")
    backend.add_process(1, punrec, 5_000, "", "x")
    backend.add_process(1, pmps, 100, "", "nvidia-cuda-mps-server")
    proc = os.path.join(str(tmp_path), "proc")
    _fake_proc(proc, p41, V1)
    _fake_proc(proc, p42, V2)
    _fake_proc(proc, pforeign, "0::/user.slice/user-1000.slice/session-3.scope\n")
    _fake_proc(proc, punrec, "0::/system.slice/slurmstepd.scope/job_77/step_0\n")
    _fake_proc(proc, pmps, "0::/system.slice/slurmiso.service\n", ppid=4242)
    me = os.getuid()
    records: Dict[str, JobRecord] = {j: JobRecord.from_dict(r) for j, r in {
        "41": {"class": "infer", "uid": me, "resources": [
            {"kind": "mig-static", "gpu": 0, "gi": a.gi_id, "uuid": a.uuid}]},
        "42": {"class": "train", "uid": me, "resources": [
            {"kind": "mig-dynamic", "gpu": 0, "gi": b.gi_id, "start": 0,
             "profile": "3g.40gb", "uuid": b.uuid, "state": "ready"}]},
        "44": {"class": "train", "uid": me, "resources": [
            {"kind": "mps", "gpu": 1, "daemon_pid": 4242}]},
    }.items()}
    report = gather_node(None, "n3", backend=backend, records=records, clock=lambda: 1.0,
                         proc=proc)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(NodeCollector(lambda: report, "n3"))
    text = generate_latest(registry).decode()
    got = signals_of(text, "n3")
    assert got["41"].gpus == ((0, str(a.gi_id)),), "a MIG instance, never its whole GPU"
    assert got["42"].gpus == ((0, str(b.gi_id)),)
    assert got["41"].job_class == "infer" and got["42"].job_class == "train"
    assert got["77"].job_class == sig.CLASS_UNRECORDED and got["77"].gpus == ((1, ""),)
    assert got["44"].gpus == ((1, ""),)
    foreign = {(x.labels["gpu"], x.labels["gi"]) for x in parse_prometheus_text(text)
               if x.name == sig.M_JOB_GPU and x.labels["class"] == sig.CLASS_FOREIGN}
    assert foreign == {("1", "")}, "the miner; the MPS server is not foreign"
    assert set(got) == {"41", "42", "44", "77"}


def test_a_process_in_a_jobs_cgroup_of_another_uid_is_foreign(tmp_path: Any) -> None:
    from types import SimpleNamespace

    from slurmiso.agent.gpu_owners import rows

    rec = JobRecord.from_dict({"class": "infer", "uid": 1000, "resources": []})
    procs = [SimpleNamespace(pid=5, gpu_index=2, mig_uuid="")]
    out = rows({"41": rec}, procs, [], cgroup=lambda pid: V1, uid_of=lambda pid: 2000)
    assert out == {("", sig.CLASS_FOREIGN, 2, "")}
    out = rows({"41": rec}, procs, [], cgroup=lambda pid: V1, uid_of=lambda pid: 1000)
    assert out == {("41", "infer", 2, "")}
    # a process on a MIG device the backend does not list: its GPU, instance unknown
    procs = [SimpleNamespace(pid=5, gpu_index=2, mig_uuid="MIG-gone")]
    out = rows({}, procs, [], cgroup=lambda pid: None, uid_of=lambda pid: 0)
    assert out == {("", sig.CLASS_FOREIGN, 2, "?")}


def test_a_process_in_a_sluid_cgroup_belongs_to_the_job_whose_record_names_that_sluid() -> None:
    """Slurm 26.05's cgroup/v2 names a job's directory by its SLUID (not job_<id>)."""
    from slurmiso.sluid import job_of_cgroup

    text = "0::/system.slice/n1_slurmstepd.scope/s42DM918PDCP00/step_0/user/task_0\n"
    assert job_of_cgroup(text, {"s42DM918PDCP00": "77"}) == "77"
    assert job_of_cgroup(text, {"s42DM918PDCP01": "78"}) is None  # no record names it
    assert job_of_cgroup(text, {}) is None  # the monitor's case: records name no SLUID
    assert job_of_cgroup(text) == "s42DM918PDCP00"  # the epilog's: the SLUID, to compare


def test_per_job_gpu_memory_on_a_shared_gpu_adds_up_to_its_processes(
        tmp_path: Any, sleepers: List[int]) -> None:
    """Issue 36 item 2: on a shared (MPS) GPU each job's memory is its own processes', never
    the whole GPU's copied to every job (DCGM exporter's figure on a shared GPU); the rows add
    up to what the GPU's processes use, less the MPS server (slurmiso's, no job's)."""
    path = os.path.join(str(tmp_path), "n3.json")
    init_state(path, "H100-80GB", 2, mig=False, node="n3")
    backend = SimBackend(path)
    a1, a2, b, foreign, unrec, mps = sleepers
    # memory in MiB and SM (3D/compute) % as NVML samples them per process (sim)
    for pid, mb, name, sm in ((a1, 9_000, "vllm", 20.0), (a2, 1_000, "vllm", 5.0),
                              (b, 20_000, "train", 60.0), (foreign, 3_000, "miner", 10.0),
                              (unrec, 700, "x", 0.0),
                              (mps, 300, "nvidia-cuda-mps-server", 0.0)):
        backend.add_process(0, pid, mb, "", name, sm_util=sm)
    backend.add_process(1, b, 4_000, "", "train")  # the same job on another GPU: its own row
    proc = os.path.join(str(tmp_path), "proc")
    _fake_proc(proc, a1, "0::/system.slice/slurmstepd.scope/job_41/step_0/user/task_0\n")
    _fake_proc(proc, a2, "0::/system.slice/slurmstepd.scope/job_41/step_1/user/task_0\n")
    _fake_proc(proc, b, V1.replace("job_41", "job_42"))
    _fake_proc(proc, foreign, "0::/user.slice/user-1000.slice/session-3.scope\n")
    _fake_proc(proc, unrec, "0::/system.slice/slurmstepd.scope/job_77/step_0\n")
    _fake_proc(proc, mps, "0::/system.slice/slurmiso.service\n", ppid=4242)
    me = os.getuid()
    records = {j: JobRecord.from_dict(r) for j, r in {
        "41": {"class": "infer", "uid": me, "resources": [
            {"kind": "mps", "gpu": 0, "daemon_pid": 4242}]},
        "42": {"class": "train", "uid": me, "resources": [
            {"kind": "mps", "gpu": 0, "daemon_pid": 4242}, {"kind": "mps", "gpu": 1}]},
        "43": {"class": "train", "uid": me, "resources": [
            {"kind": "mps", "gpu": 0, "daemon_pid": 4242}]},  # no process yet
    }.items()}
    report = gather_node(None, "n3", backend=backend, records=records, clock=lambda: 1.0,
                         proc=proc)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(NodeCollector(lambda: report, "n3"))
    text = generate_latest(registry).decode()
    used = {(x.labels["job"], x.labels["class"], x.labels["gpu"]): x.value
            for x in parse_prometheus_text(text) if x.name == sig.M_JOB_GPU_MEMORY}
    mib = 1024 * 1024
    assert used == {("41", "infer", "0"): 10_000 * mib, ("42", "train", "0"): 20_000 * mib,
                    ("", sig.CLASS_FOREIGN, "0"): 3_000 * mib,
                    ("77", sig.CLASS_UNRECORDED, "0"): 700 * mib,
                    ("42", "train", "1"): 4_000 * mib}
    on_gpu0 = sum(p.used_memory_mb for p in backend.processes() if p.gpu_index == 0)
    assert on_gpu0 == 34_000, "the premise: six processes on GPU 0"
    assert sum(v for (_, _, g), v in used.items() if g == "0") == (on_gpu0 - 300) * mib
    assert ("43", "train", "0") not in used, "no process: no figure, not 0"
    sm = {(x.labels["job"], x.labels["class"], x.labels["gpu"]): round(x.value, 6)
          for x in parse_prometheus_text(text) if x.name == sig.M_JOB_GPU_SM}
    assert sm == {("41", "infer", "0"): 0.25, ("42", "train", "0"): 0.6,
                  ("", sig.CLASS_FOREIGN, "0"): 0.1, ("77", sig.CLASS_UNRECORDED, "0"): 0.0}
    sampled = sum(p.sm_util or 0.0 for p in backend.processes() if p.gpu_index == 0)
    assert round(sum(v for (_, _, g), v in sm.items() if g == "0"), 6) == round(sampled, 6)
    assert ("42", "train", "1") not in sm, "a process with no sample: unknown, not 0"


def test_a_process_whose_memory_the_driver_hides_makes_its_rows_memory_unknown() -> None:
    from slurmiso.agent.gpu_owners import attribute
    from slurmiso.gpu.backend import GpuProcess

    rec = JobRecord.from_dict({"class": "infer", "uid": 1000, "resources": []})
    procs = [GpuProcess(5, 0, 900), GpuProcess(6, 0, 0, memory_known=False),
             GpuProcess(7, 1, 100)]
    _, memory = attribute({"41": rec}, procs, [], cgroup=lambda pid: V2.replace("42", "41"),
                          uid_of=lambda pid: 1000)
    assert memory == {("41", "infer", 0, ""): None, ("41", "infer", 1, ""): 100}


def test_one_process_without_a_sample_makes_its_rows_sm_unknown() -> None:
    """NVML samples no MIG device's processes: a row with one such process has no SM figure
    (never the share of the processes that had one)."""
    from slurmiso.agent.gpu_owners import attribute_all
    from slurmiso.gpu.backend import GpuProcess

    rec = JobRecord.from_dict({"class": "infer", "uid": 1000, "resources": []})
    procs = [GpuProcess(5, 0, 900, sm_util=0.3), GpuProcess(6, 0, 10, sm_util=None),
             GpuProcess(7, 1, 100, sm_util=0.45), GpuProcess(8, 1, 100, sm_util=0.05)]
    found = attribute_all({"41": rec}, procs, [], cgroup=lambda pid: V2.replace("42", "41"),
                          uid_of=lambda pid: 1000)
    assert found.sm == {("41", "infer", 0, ""): None, ("41", "infer", 1, ""): 0.5}
