"""MPS v3 read from the control binary (issue 35: capability read, never assumed)."""

from __future__ import annotations

import stat
from typing import Any, Dict

from slurmiso.config import load_config
from slurmiso.config.model import MpsServer
from slurmiso.doctor.gpus import check_mps_protocol
from slurmiso.isolation.mps_daemon import SimMpsControl
from slurmiso.isolation.mps_protocol import from_help, read_protocol
from slurmiso.values import replace
from tests.audit_helpers import CONFIG

V2_HELP = ("usage: nvidia-cuda-mps-control [-d | -f]\n  start_server -uid UID\n"
           "  get_server_list\n  set_default_active_thread_percentage PCT\n")


def test_the_v3_modules_are_read_from_the_help() -> None:
    assert from_help("Modules: server namespace client device sm-partition", 0).v3
    old = from_help(V2_HELP, 0)  # start_server is not the module "server"
    assert not old.v3 and "before MPS v3" in old.reason
    assert "exit 1" in from_help("unknown option -p", 1).reason


def test_a_binary_is_asked_with_p_3_h(tmp_path: Any) -> None:
    fake = tmp_path / "mps-control"
    fake.write_text('#!/bin/sh\n[ "$*" = "-p 3 -h" ] && echo "server namespace" && exit 0\n'
                    "exit 2\n")
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    assert read_protocol([str(fake)]).v3
    assert not read_protocol([str(tmp_path / "missing")]).v3  # cannot be asked: not v3
    assert SimMpsControl().protocol().v3  # the stand-in answers as an r615 binary


def test_doctor_names_the_arrangement_and_what_the_driver_offers() -> None:
    cfg = load_config(CONFIG)
    pool = next(p for p in cfg.pools if p.mode == "mps")
    gpu: Dict[str, Any] = {"node": "n2", "pool": pool.name,
                           "mps_protocol": {"v3": True, "reason": "lists server"}}
    (finding,) = check_mps_protocol({"gpu_node": gpu}, cfg)
    assert finding.severity == "info" and finding.code == "mps-arrangement"
    assert "one MPS control daemon per class" in finding.message
    assert "mps_server: shared on the pool would use it" in finding.message
    gpu["mps_protocol"] = {"v3": False, "reason": "exit 1"}
    assert "no MPS v3 here: exit 1" in check_mps_protocol({"gpu_node": gpu}, cfg)[0].message
    shared_cfg = replace(cfg, pools=tuple(replace(p, mps_server=MpsServer.SHARED)
                                          if p is pool else p for p in cfg.pools))
    (fell,) = check_mps_protocol({"gpu_node": gpu}, shared_cfg)
    assert fell.severity == "warning" and "asks for a shared MPS server" in fell.message
    gpu["mps_protocol"] = {"v3": True, "reason": "lists server"}
    (runs,) = check_mps_protocol({"gpu_node": gpu}, shared_cfg)
    assert runs.severity == "info" and "one shared MPS v3 server per GPU" in runs.message
    other = next(p for p in cfg.pools if p.mode != "mps")
    assert check_mps_protocol({"gpu_node": dict(gpu, pool=other.name)}, cfg) == []


def test_status_says_which_arrangement_runs_and_what_the_driver_offers(
        tmp_path: Any, monkeypatch: Any) -> None:
    from slurmiso.cli.status import _mps_arrangement
    from slurmiso.gpu.sim import init_state

    init_state(str(tmp_path / "n2.json"), "A100-SXM4-80GB", 1, node="n2")
    monkeypatch.setenv("SLURMISO_GPU_BACKEND", "sim")
    monkeypatch.setenv("SLURMISO_SIM_STATE", str(tmp_path / "n2.json"))
    got = _mps_arrangement(load_config(CONFIG), "n2")
    assert got["arrangement"] == "per-class daemons" and got["v3"] is True
    assert "server and namespace" in got["v3_reason"]
    from slurmiso import gpu
    from slurmiso.errors import GpuUnavailable

    def no_backend(*_: Any) -> Any:
        raise GpuUnavailable("no driver")

    monkeypatch.setattr(gpu, "open_backend", no_backend)
    broken = _mps_arrangement(load_config(CONFIG), "n2")
    assert broken["v3"] is False and broken["v3_reason"].startswith("not read: ")
