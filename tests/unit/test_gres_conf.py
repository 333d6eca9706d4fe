"""gres.conf generation and the one GRES order (golden files: delete one to regenerate it)."""

from __future__ import annotations

import os
from typing import Any, Optional

import pytest

from slurmiso.gpu.backend import DeviceInfo, MigInstance
from slurmiso.gpu.profiles import MODELS
from slurmiso.gpu.sim import SimBackend, init_state
from slurmiso.mig import gres
from slurmiso.mig.apply import apply_plan, read_node
from slurmiso.mig.plan import plan_layout
from tests.goldens import check_golden as _check
from tests.hookctx import sim_config

GOLDEN = os.path.join(os.path.dirname(os.path.dirname(__file__)), "golden", "gres")
PROC = os.path.join(GOLDEN, "proc")
H100 = MODELS["H100-80GB"]


def golden(name: str, text: str) -> None:
    _check(os.path.join(GOLDEN, name), text)


@pytest.mark.parametrize("mode,extra", [
    ("exclusive", {}),
    ("mps", {"mps_shares_per_gpu": 50}),
    ("mig-dynamic", {"shards_per_gpu": 7}),
    ("timeslice", {"shards_per_gpu": 4}),
])
def test_plain_modes_golden(tmp_path: Any, mode: str, extra: Any) -> None:
    cfg = sim_config(str(tmp_path), mode, gpus=4, **extra)
    golden(f"{mode}.conf", gres.render_gres_conf(cfg.pools[0], "node1"))


def test_mig_static_from_layout_golden(tmp_path: Any) -> None:
    cfg = sim_config(str(tmp_path), "mig-static", gpus=2)
    entries = gres.layout_entries(H100, cfg.mig_layout("mixed"), 2)  # type: ignore[arg-type]
    text = gres.render_gres_conf(cfg.pools[0], "node1", entries, source="layout 'mixed'")
    golden("mig-static-layout.conf", text)
    assert "Type=4g.40gb MultipleFiles=/dev/nvidia1,/dev/nvidia-caps/nvidia-cap147," in text


def test_mig_static_live_matches_layout_and_dev_root(tmp_path: Any) -> None:
    cfg = sim_config(str(tmp_path), "mig-static", gpus=2)
    init_state(cfg.gpu.sim_state, "H100-80GB", 2, mig=True, node="node1")
    sim = SimBackend(cfg.gpu.sim_state)
    lay = cfg.mig_layout("mixed")
    assert lay is not None
    snap = read_node(sim, {})
    apply_plan(sim, plan_layout(H100, lay, 2, snap.existing, snap.mig_enabled, snap.busy))
    minors = gres.read_mig_minors(PROC)
    live = gres.live_entries(sim.devices(), sim.instances(), minors, "/sandbox/dev")
    planned = gres.layout_entries(H100, lay, 2, minors, "/sandbox/dev")
    assert [e.identity() for e in live] == [e.identity() for e in planned]
    assert [e.files for e in live] == [e.files for e in planned]
    text = gres.render_gres_conf(cfg.pools[0], "node1", live, "/sandbox/dev", node_prefix=True)
    golden("mig-static-live-devroot.conf", text)
    assert all(line.startswith("NodeName=node1 Name=gpu Type=") for line in text.splitlines()
               if not line.startswith("#"))


def _dev(index: int, minor: int, mig: bool = True) -> DeviceInfo:
    return DeviceInfo(index, f"GPU-{index}", "H100", "H100-80GB", minor, "", 0, 0, 0, mig, mig)


def _inst(gpu: int, gi: int, prof: str, start: int, ci: Optional[int] = 0) -> MigInstance:
    return MigInstance(gpu, gi, prof, start, 1, ci, f"MIG-{gpu}-{gi}" if ci is not None else "")


def test_order_is_type_then_gpu_then_start_and_mapping_uses_it() -> None:
    """Whole GPUs, then MIG types in name order: how slurmctld numbers typed GRES (22.05)."""
    devices = [_dev(0, 0), _dev(1, 1, mig=False), _dev(2, 2)]
    insts = [_inst(2, 3, "1g.10gb", 6), _inst(0, 2, "3g.40gb", 4), _inst(2, 1, "4g.40gb", 0),
             _inst(0, 1, "3g.40gb", 0), _inst(2, 5, "1g.10gb", 5, ci=None)]
    entries = gres.live_entries(devices, insts)
    assert [(e.index, e.gpu, e.profile, e.start) for e in entries] == [
        (0, 1, "", -1), (1, 2, "1g.10gb", 6), (2, 0, "3g.40gb", 0),
        (3, 0, "3g.40gb", 4), (4, 2, "4g.40gb", 0)]  # the GI without a CI is no device
    found, missing = gres.map_gres_indices([1, 3, 9], entries)
    assert [e.uuid for e in found] == ["MIG-2-3", "MIG-0-2"]
    assert missing == [9]
    assert entries[0].conf_line("h100") == "Name=gpu Type=h100 File=/dev/nvidia1"
    assert gres.type_counts(entries, "h100") == [("h100", 1), ("1g.10gb", 1), ("3g.40gb", 2),
                                                 ("4g.40gb", 1)]


@pytest.mark.parametrize("gpu_minor,gi,ci,expected", [
    (0, 0, None, 3), (0, 0, 0, 4), (0, 1, None, 12), (0, 1, 0, 13), (0, 1, 7, 20),
    (0, 14, 7, 137), (1, 0, None, 138), (1, 2, 0, 157),
])
def test_computed_cap_minors(gpu_minor: int, gi: int, ci: Optional[int], expected: int) -> None:
    assert gres.computed_cap_minor(gpu_minor, gi, ci) == expected


def test_mig_minors_file_is_used_over_the_formula(tmp_path: Any) -> None:
    assert gres.read_mig_minors(str(tmp_path)) is None  # no driver: None, not an error
    recorded = gres.read_mig_minors(PROC)
    assert recorded is not None and recorded["gpu0/gi1/access"] == 12
    assert recorded["gpu1/gi2/ci0/access"] == 157
    text = "config 1\nmonitor 2\ngpu3/gi1/access 40\ngpu3/gi1/ci0/access 41\ngarbage\n"
    minors = gres.parse_mig_minors(text)
    assert minors == {"config": 1, "monitor": 2, "gpu3/gi1/access": 40, "gpu3/gi1/ci0/access": 41}
    # keyed by the GPU's minor (3), not its index
    assert gres.mig_files(3, 1, 0, minors, "/dev") == (
        "/dev/nvidia3", "/dev/nvidia-caps/nvidia-cap40", "/dev/nvidia-caps/nvidia-cap41")
    from slurmiso.errors import GpuError

    with pytest.raises(GpuError, match="gpu3/gi2/access is missing"):
        gres.mig_files(3, 2, 0, minors, "/dev")


@pytest.mark.parametrize("nums,text", [
    ([0], "0"), ([0, 1, 2, 3], "[0-3]"), ([0, 2, 3, 7], "[0,2-3,7]"), ([5, 4], "[4-5]"),
])
def test_bracket(nums: Any, text: str) -> None:
    assert gres.bracket(nums) == text


def test_record_roundtrip(tmp_path: Any) -> None:
    entries = gres.layout_entries(H100, sim_config(str(tmp_path), "mig-static").mig_layout("mixed"), 2)  # type: ignore[arg-type]
    assert gres.load_record(str(tmp_path / "st")) is None
    gres.save_record(str(tmp_path / "st"), "mixed", entries)
    assert gres.load_record(str(tmp_path / "st")) == [e.identity() for e in entries]
