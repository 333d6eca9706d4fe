"""MIG on any model (issue 26): profiles read from the driver (a fake pynvml of a GPU the
catalogue lacks), ``mig show --profiles``, the MIG mode change advice (reset or not, who
holds the GPU) in ``mig apply``, and the holder scan on a recorded /proc tree."""

from __future__ import annotations

import json
import os
import sys
from types import SimpleNamespace
from typing import Any, Dict, List, Tuple

import pytest

import tests.unit.test_nvml_translate as fake_nvml
from slurmiso.gpu import holders
from slurmiso.gpu.backend import GpuProcess
from slurmiso.gpu.catalogue import entry_text
from slurmiso.gpu.nvml import NvmlBackend, profile_name
from slurmiso.gpu.placement import capacity, pack
from slurmiso.gpu.profiles import GpuModel, MigProfile, model_from_driver
from slurmiso.gpu.sim import SimBackend
from slurmiso.mig import mode
from tests.unit.test_cli_mig import node, run  # noqa: F401  (fixture)

# A GPU no table knows, "NVIDIA Z900": const -> (id, slices, max, MB, placements, name).
Z900 = {
    0: (19, 1, 7, 25088, [(i, 1) for i in range(7)], b"MIG 1g.25gb"),
    9: (15, 1, 4, 50176, [(0, 2), (2, 2), (4, 2), (6, 2)], b"MIG 1g.49gb"),
    1: (14, 2, 3, 50176, [(0, 2), (2, 2), (4, 2)], b"MIG 2g.49gb"),
    2: (9, 3, 2, 100352, [(0, 4), (4, 4)], b"MIG 3g.98gb"),
    3: (5, 4, 1, 100352, [(0, 4)], b"MIG 4g.98gb"),
    4: (0, 7, 1, 200704, [(0, 8)], b"MIG 7g.196gb"),
}


class FakeZ900(fake_nvml.FakeGpu):
    def nvmlDeviceGetName(self, handle: Any) -> bytes:
        return b"NVIDIA Z900"

    def nvmlDeviceGetArchitecture(self, handle: Any) -> int:
        return 10  # NVML_DEVICE_ARCH_BLACKWELL


@pytest.fixture
def z900(monkeypatch: pytest.MonkeyPatch) -> NvmlBackend:
    monkeypatch.setattr(fake_nvml, "H100_PROFILES", Z900)
    monkeypatch.setitem(sys.modules, "pynvml", FakeZ900().module())
    return NvmlBackend()


def test_unknown_gpu_profiles_come_from_the_driver(z900: NvmlBackend) -> None:
    (dev,) = z900.devices()
    assert (dev.name, dev.model, dev.architecture) == ("NVIDIA Z900", "", "blackwell")
    got = {p.name: (p.profile_id, p.compute_slices, p.memory_slices, p.max_instances,
                    p.placements) for p in z900.profiles(0)}
    assert got == {
        "1g.25gb": (19, 1, 1, 7, (0, 1, 2, 3, 4, 5, 6)),
        "1g.49gb": (15, 1, 2, 4, (0, 2, 4, 6)),
        "2g.49gb": (14, 2, 2, 3, (0, 2, 4)),
        "3g.98gb": (9, 3, 4, 2, (0, 4)),
        "4g.98gb": (5, 4, 4, 1, (0,)),
        "7g.196gb": (0, 7, 8, 1, (0,)),
    }


def test_driver_profiles_make_a_catalogue_entry(z900: NvmlBackend) -> None:
    dev = z900.device(0)
    made = model_from_driver(dev.name, dev.memory_total_mb, z900.profiles(0), dev.architecture)
    from slurmiso.mig.mode import needs_reset

    assert (made.compute_slices, made.memory_slices, needs_reset(made.architecture)) == (7, 8, False)
    assert capacity(made, [])["1g.25gb"] == 7 and pack(made, {"4g.98gb": 1, "3g.98gb": 1})
    text = entry_text(made, "nvml on node z1")
    from slurmiso.gpu import catalogue

    back = eval(text.strip().split("\n", 1)[1].rstrip(","),  # noqa: S307 - our own output
                {"GpuModel": GpuModel, "_p": catalogue._p})
    assert back.profiles == made.profiles and back.product_name == "NVIDIA Z900"


def test_profiles_without_root_have_no_placements_for_an_unknown_gpu(z900: NvmlBackend
                                                                       ) -> None:
    def no_permission(*args: Any) -> None:
        raise fake_nvml.FakeNVMLError(fake_nvml.CODES["NVML_ERROR_NO_PERMISSION"])

    sys.modules["pynvml"].nvmlDeviceGetGpuInstancePossiblePlacements = no_permission  # type: ignore[attr-defined]
    prof = next(p for p in z900.profiles(0) if p.name == "3g.98gb")
    assert prof.placements == () and prof.max_instances == 2


def _info(pid: int, slices: int, mem: int, name: bytes = b"") -> Any:
    return SimpleNamespace(id=pid, sliceCount=slices, memorySizeMB=mem, name=name)


@pytest.mark.parametrize("model,info,constant,expected", [
    (None, _info(70, 1, 24448), "NVML_GPU_INSTANCE_PROFILE_1_SLICE_ALL_ME", "1g.24gb+me.all"),
    (None, _info(71, 1, 24448), "NVML_GPU_INSTANCE_PROFILE_1_SLICE_GFX", "1g.24gb+gfx"),
    (None, _info(72, 2, 48896, b"MIG 2g.48gb+gfx"), "", "2g.48gb+gfx"),
    # an R570 GB200 calls profile 19 "1g.23gb": the catalogue's name wins, so configs hold
    ("GB200-189GB", _info(19, 1, 23552, b"MIG 1g.23gb"), "", "1g.24gb"),
    # same id but another slice count is not the catalogue's profile: NVML's name
    ("B200-180GB", _info(9, 2, 46080, b"MIG 2g.45gb-me"), "", "2g.45gb-me"),
])
def test_profile_names_of_newer_profiles(model: Any, info: Any, constant: str,
                                         expected: str) -> None:
    from slurmiso.gpu.profiles import MODELS

    assert profile_name(MODELS[model] if model else None, info, constant) == expected


def test_architecture_unknown_without_the_call(monkeypatch: pytest.MonkeyPatch) -> None:
    mod = fake_nvml.FakeGpu().module()
    monkeypatch.setitem(sys.modules, "pynvml", mod)
    assert not hasattr(mod, "nvmlDeviceGetArchitecture")
    assert NvmlBackend().device(0).architecture == ""


# --------------------------------------------------------------------- mig show --profiles
def test_show_profiles_names_the_table_source(node: SimBackend, capsys: Any) -> None:  # noqa: F811
    code, out, _ = run(capsys, "mig", "show", "--profiles")
    assert code == 0 and "GPU 0 H100-80GB [hopper] MIG on" in out
    assert "MIG profiles of NVIDIA H100 80GB HBM3 (GPU 0)" in out and "0,4" in out
    assert "supported-mig-profiles.html#h100-mig-profiles" in out
    code, out, _ = run(capsys, "mig", "show", "--profiles", "--json")
    entry = json.loads(out)["profiles"]["NVIDIA H100 80GB HBM3"]
    assert entry["architecture"] == "hopper" and len(entry["profiles"]) == 7


# --------------------------------------------------------------- MIG mode change advice
@pytest.mark.parametrize("arch,text", [
    ("hopper", "without a GPU reset"), ("blackwell", "without a GPU reset"),
    ("ampere", "only at a GPU reset"), ("", "if nvidia-smi reports the change pending"),
])
def test_how_a_mode_change_is_done(arch: str, text: str) -> None:
    line = mode.how(3, arch)
    assert text in line and "nvidia-smi -i 3 -mig 1" in line
    assert ("nvidia-smi -i 3 -r" in line) is (arch != "hopper" and arch != "blackwell")


def test_apply_says_what_the_mode_change_takes(node: SimBackend, capsys: Any) -> None:  # noqa: F811
    node.set_mig_mode(1, False)
    node.add_process(1, os.getppid(), 2048, name="python")
    code, _, err = run(capsys, "mig", "apply")
    assert code == 1
    assert "before the MIG mode change:" in err and "without a GPU reset" in err
    assert f"compute process pid {os.getppid()} python (2048 MiB)" in err
    code, out, _ = run(capsys, "mig", "assert", "--json")
    assert any("GPU 1 (hopper)" in line for line in json.loads(out)["mode_change"])


def test_plan_problem_says_reset_on_ampere(tmp_path: Any) -> None:
    from slurmiso.config.model import MigGroup, MigLayout
    from slurmiso.gpu.profiles import lookup_model
    from slurmiso.mig.plan import plan_layout

    a100, h100 = lookup_model("A100-80GB"), lookup_model("H100-80GB")
    assert a100 is not None and h100 is not None
    layout = MigLayout("x", (MigGroup(None, True, (("3g.40gb", 2),)),))
    busy = {0: "pid(s) 7 run on it"}
    a = plan_layout(a100, layout, 1, {}, {0: False}, busy).problems[0]
    h = plan_layout(h100, layout, 1, {}, {0: False}, busy).problems[0]
    assert "only at a GPU reset" in a and "nvidia-smi -i 0 -r" in a
    assert "without a GPU reset" in h and "-r'" not in h
    off = MigLayout("off", (MigGroup(None, False),))
    assert "nvidia-smi -i 0 -mig 0" in plan_layout(a100, off, 1, {}, {0: True}).problems[-1]


# ----------------------------------------------------------------------- holder scan
def _proc(root: Any, pid: int, comm: str, targets: List[str]) -> None:
    fd = root / str(pid) / "fd"
    fd.mkdir(parents=True)
    (root / str(pid) / "comm").write_text(comm + "\n")
    for i, target in enumerate(targets):
        os.symlink(target, fd / str(i + 3))


def test_scan_finds_and_names_holders(tmp_path: Any) -> None:
    proc, dev = tmp_path / "proc", tmp_path / "dev"
    _proc(proc, 100, "nvidia-persiste", [f"{dev}/nvidia0", f"{dev}/nvidia1", f"{dev}/nvidiactl"])
    _proc(proc, 200, "nv-hostengine", [f"{dev}/nvidiactl"])
    _proc(proc, 300, "Xorg", [f"{dev}/nvidia1", "/dev/null"])
    _proc(proc, 400, "bash", ["/dev/pts/0"])
    _proc(proc, 500, "myjob", [f"{dev}/nvidia0"])
    found = holders.scan(str(proc), str(dev), exclude=(500,))
    by_pid: Dict[int, Tuple[str, Tuple[int, ...]]] = {
        h.pid: (h.name, h.gpus) for h in found.holders}
    assert by_pid == {100: ("nvidia-persiste", (0, 1)), 200: ("nv-hostengine", ()),
                      300: ("Xorg", (1,))}
    gpu0 = holders.on_gpu(found, 0)
    assert [h.pid for h in gpu0] == [100, 200]  # a control-device holder blocks every GPU
    lines = mode.advice(0, "ampere", gpu0, [GpuProcess(77, 0, 512, name="train")])
    assert "only at a GPU reset" in lines[0]
    assert "compute process pid 77 train (512 MiB)" in lines[1]
    assert "systemctl stop nvidia-persistenced" in lines[2]
    assert "nvidia-dcgm" in lines[3]
    assert "display manager" in holders.on_gpu(found, 1)[-1].describe()


def test_scan_counts_what_it_cannot_read(tmp_path: Any, monkeypatch: pytest.MonkeyPatch
                                         ) -> None:
    proc = tmp_path / "proc"
    _proc(proc, 100, "x", [])
    real = os.listdir

    def listdir(path: Any) -> List[str]:
        if str(path).endswith("/100/fd"):
            raise PermissionError(13, "denied")
        return real(path)

    monkeypatch.setattr(holders.os, "listdir", listdir)
    found = holders.scan(str(proc), str(tmp_path / "dev"))
    assert found.holders == () and found.unreadable == 1
    assert "could not be inspected" in mode.holder_lines(0, [], [], found.unreadable)[0]


def test_nothing_holds_an_idle_gpu() -> None:
    assert mode.advice(2, "hopper", [], [])[1] == "GPU 2: nothing holds it now"


def test_profile_value_to_dict() -> None:
    prof = MigProfile("1g.5gb", 19, 1, 1, 4864, 7, (0, 1))
    assert prof.to_dict()["placements"] in ((0, 1), [0, 1])
