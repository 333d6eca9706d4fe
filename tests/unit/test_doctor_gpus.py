"""doctor's GPU checks of any model (slurmiso/doctor/gpus.py), planted in the recorded sandbox
snapshot: model against config, MPS memory against what the node reports, MIG mode (pending,
on where it must be off, what a change takes and who holds the GPU), MPS across users."""

from __future__ import annotations

import copy
from typing import Any, Dict, List

import yaml

from slurmiso.config import parse_config
from slurmiso.config.model import Config
from slurmiso.doctor import Finding, run_checks
from slurmiso.doctor.collect import _gpu_node
from slurmiso.gpu.sim import SimBackend, init_state
from slurmiso.state import NodeState
from slurmiso.state.record import JobRecord, RecordStatus, Resource
from tests.unit.test_doctor import recorded, sandbox_config


def _found(snap: Dict[str, Any], cfg: Config, code: str) -> List[Finding]:
    return [f for f in run_checks(snap, cfg) if f.code == code]


def _on(snap: Dict[str, Any], node: str, pool: str) -> Dict[str, Any]:
    gpu = snap["gpu_node"]
    gpu.update(node=node, pool=pool, instances=[])
    for d in gpu["devices"]:
        d.update(mig_enabled=False, mig_pending=False)
    return gpu


def _cfg_with(pool: str, **changes: Any) -> Config:
    data = yaml.safe_load(_yaml())
    for p in data["pools"]:
        if p["name"] == pool:
            p.update(changes)
            for key in [k for k, v in changes.items() if v is None]:
                del p[key]
    return parse_config(data, "sandbox.yaml")


def _yaml() -> str:
    from slurmiso_sandbox import layout as L
    from tests.unit.test_doctor import _site

    return L.render_slurmiso_yaml(_site())


def test_the_recorded_sandbox_has_only_the_mps_info() -> None:
    found = [f for f in run_checks(recorded(), sandbox_config())
             if f.code.startswith(("gpu-model", "mps-", "mig-mode"))]
    assert [(f.severity, f.code) for f in found] == [("info", "mps-cross-user")]
    assert "pool 'mps'" in found[0].message and "one service account" in found[0].fix


def test_a_node_of_another_model_is_an_error() -> None:
    snap = copy.deepcopy(recorded())
    for d in snap["gpu_node"]["devices"]:
        d.update(name="NVIDIA A100-SXM4-80GB", model="A100-80GB")
    (f,) = _found(snap, sandbox_config(), "gpu-model")
    assert f.severity == "error" and "says gpu_model H100-80GB" in f.message
    assert "A100-80GB" in f.fix


def test_a_free_model_name_is_compared_by_name() -> None:
    snap = copy.deepcopy(recorded())
    _on(snap, "n1", "excl")
    for d in snap["gpu_node"]["devices"]:
        d.update(name="NVIDIA GeForce RTX 4090", model="")
    assert _found(snap, _cfg_with("excl", gpu_model="RTX 4090"), "gpu-model") == []
    (f,) = _found(snap, _cfg_with("excl", gpu_model="Future X1"), "gpu-model")
    assert f.severity == "warning" and "compares names only" in f.message


def test_mixed_models_and_unset_model() -> None:
    snap = copy.deepcopy(recorded())
    _on(snap, "n1", "excl")
    snap["gpu_node"]["devices"][1].update(name="NVIDIA L40S", model="L40S",
                                          memory_total_mb=46068)
    cfg = _cfg_with("excl", gpu_model=None)
    assert _found(snap, cfg, "gpu-model-mixed")[0].severity == "warning"
    (unset,) = _found(snap, cfg, "gpu-model-unset")
    assert unset.severity == "info" and "46068 MiB" in unset.message


def test_mps_limits_against_the_memory_the_node_reports() -> None:
    snap = copy.deepcopy(recorded())
    _on(snap, "n2", "mps")
    for d in snap["gpu_node"]["devices"]:
        d.update(name="NVIDIA L4", model="L4", memory_total_mb=23034)
    cfg = _cfg_with("mps", gpu_model=None)  # any GPU: only the node can check
    codes = {f.message.split(":")[0] for f in _found(snap, cfg, "mps-memory")}
    assert codes == {"class infer", "class train"}  # 32G and 24G + 10% > 23034 MiB
    assert all(f.severity == "error" for f in _found(snap, cfg, "mps-memory"))
    for d in snap["gpu_node"]["devices"]:
        d["memory_total_mb"] = 97871
    assert _found(snap, cfg, "mps-memory") == []


def test_pending_mig_mode_says_reset_and_names_holders() -> None:
    snap = copy.deepcopy(recorded())
    gpu = _on(snap, "n4", "migd")
    gpu["devices"][0].update(mig_enabled=True, mig_pending=True)
    gpu["devices"][1].update(mig_pending=True, architecture="ampere")
    gpu["holders"] = [{"pid": 911, "name": "nvidia-persiste", "devices": ["/dev/nvidia1"],
                       "gpus": [1]},
                      {"pid": 912, "name": "nv-hostengine", "devices": ["/dev/nvidiactl"],
                       "gpus": []}]
    (f,) = _found(snap, sandbox_config(), "mig-mode-pending")
    assert "GPU 1" in f.message and "only at a GPU reset" in f.message
    assert "nvidia-smi -i 1 -r" in f.fix and "systemctl stop nvidia-persistenced" in f.fix
    assert "pid 912 nv-hostengine" in f.fix


def test_mig_on_in_a_plain_pool_is_an_error() -> None:
    snap = copy.deepcopy(recorded())
    gpu = _on(snap, "n2", "mps")
    gpu["devices"][0].update(mig_enabled=True, mig_pending=True, architecture="hopper")
    (f,) = _found(snap, sandbox_config(), "mig-mode-plain")
    assert f.severity == "error" and "nvidia-smi -i 0 -mig 0" in f.fix
    assert "without a GPU reset" in f.fix


def test_mig_off_on_a_mig_node_with_holders_is_explained() -> None:
    snap = copy.deepcopy(recorded())
    gpu = _on(snap, "n4", "migd")
    gpu["devices"][0]["architecture"] = "hopper"
    gpu["holders"] = [{"pid": 5, "name": "Xorg", "devices": ["/dev/nvidia0"], "gpus": [0]}]
    (f,) = _found(snap, sandbox_config(), "mig-mode-holders")
    assert "display manager" in f.fix and "without a GPU reset" in f.message
    mig_mode = _found(snap, sandbox_config(), "mig-mode")[0]
    assert "GPU 0 (hopper)" in mig_mode.fix


def test_mps_users_now() -> None:
    snap = copy.deepcopy(recorded())
    gpu = _on(snap, "n2", "mps")
    gpu["mps_clients"] = {"0": [{"job": "11", "uid": 0}, {"job": "12", "uid": 1001}],
                          "1": [{"job": "13", "uid": 1001}, {"job": "14", "uid": 1001}]}
    (f,) = _found(snap, sandbox_config(), "mps-users-now")
    assert f.severity == "warning" and "MPS GPU 0 serves jobs of 2 users" in f.message
    assert f.subjects == ("11", "12")
    # clients of one shared MPS v3 server run together: nothing time-sliced to say
    gpu["mps_clients"]["0"] = [dict(c, shared=True) for c in gpu["mps_clients"]["0"]]
    assert _found(snap, sandbox_config(), "mps-users-now") == []


def test_collect_reads_holders_and_mps_clients(tmp_path: Any) -> None:
    data = {
        "version": 1,
        "paths": {"state_dir": f"{tmp_path}/state", "journal": f"{tmp_path}/j.jsonl",
                  "dev_root": f"{tmp_path}/dev"},
        "gpu": {"backend": "sim", "sim_state": f"{tmp_path}/sim.json"},
        "classes": [{"name": "infer", "match": {"qos": ["infer"]}, "isolation": "mps"}],
        "default_class": "",
        "pools": [{"name": "p", "nodes": "g1", "partition": "p", "gpus_per_node": 1,
                   "mode": "mps"}],
    }
    cfg = parse_config(data)
    init_state(f"{tmp_path}/sim.json", "L40S", 1, node="g1")
    state = NodeState(f"{tmp_path}/state")
    for job, uid in (("7", 1000), ("8", 1001)):
        rec = JobRecord(job, RecordStatus.READY)
        rec.resources.append(Resource("mps", gpu=0, uid=uid, thread_percentage=100))
        state.write_job(job, rec)
    state.set_allocations({"mps/0/job/7": "7", "mps/0/job/8": "8"})
    gpu = _gpu_node(cfg, "g1")
    assert gpu is not None and gpu["devices"][0]["name"] == "NVIDIA L40S"
    assert gpu["devices"][0]["architecture"] == "ada" and gpu["holders"] == []
    assert gpu["mps_clients"] == {"0": [{"job": "7", "uid": 1000, "shared": False},
                                        {"job": "8", "uid": 1001, "shared": False}]}
    SimBackend(f"{tmp_path}/sim.json").close()
