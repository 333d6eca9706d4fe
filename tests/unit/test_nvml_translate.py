"""NVML backend without a GPU: error translation, profile naming, and the call sequence
against a small fake ``pynvml`` module (a test double of the library, injected via
``sys.modules``)."""

from __future__ import annotations

import ctypes
import sys
import types
from types import SimpleNamespace
from typing import Any, Dict, List, Optional, Set, Tuple, Type

import pynvml as real_pynvml
import pytest

from slurmiso.errors import (
    GpuError,
    GpuInsufficientResources,
    GpuInUse,
    GpuLost,
    GpuNotFound,
    GpuNotSupported,
    GpuUnavailable,
)
from slurmiso.gpu.backend import GpuBackend, create_mig_device, destroy_mig_device
from slurmiso.gpu.nvml import NvmlBackend, profile_name, translate_error
from slurmiso.gpu.profiles import MODELS

#: The NVML codes the tests need, from the real library (nvidia-ml-py, an install requirement),
#: never a copy of the backend's own fallback table: that table is checked against these.
NAMES = (
    "NVML_ERROR_UNINITIALIZED", "NVML_ERROR_INVALID_ARGUMENT", "NVML_ERROR_NOT_SUPPORTED",
    "NVML_ERROR_NO_PERMISSION", "NVML_ERROR_NOT_FOUND", "NVML_ERROR_DRIVER_NOT_LOADED",
    "NVML_ERROR_LIBRARY_NOT_FOUND", "NVML_ERROR_FUNCTION_NOT_FOUND", "NVML_ERROR_GPU_IS_LOST",
    "NVML_ERROR_IN_USE", "NVML_ERROR_INSUFFICIENT_RESOURCES", "NVML_ERROR_UNKNOWN",
)
CODES = {name: int(getattr(real_pynvml, name)) for name in NAMES}


class FakeNVMLError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value

    def __str__(self) -> str:
        return {v: k for k, v in CODES.items()}.get(self.value, "?").title()


class Placement(ctypes.Structure):
    _fields_ = [("start", ctypes.c_uint), ("size", ctypes.c_uint)]


# const -> (profile id, slices, max, memory MB, placements (start, size), NVML's name)
H100_PROFILES: Dict[int, Tuple[int, int, int, int, List[Tuple[int, int]], bytes]] = {
    0: (19, 1, 7, 9856, [(i, 1) for i in range(7)], b"MIG 1g.10gb"),
    1: (14, 2, 3, 19968, [(0, 2), (2, 2), (4, 2)], b"MIG 2g.20gb"),
    2: (9, 3, 2, 40192, [(0, 4), (4, 4)], b"MIG 3g.40gb"),
    3: (5, 4, 1, 40192, [(0, 4)], b"MIG 4g.40gb"),
    4: (0, 7, 1, 80896, [(0, 8)], b"MIG 7g.80gb"),
    7: (20, 1, 1, 9856, [(i, 1) for i in range(7)], b"MIG 1g.10gb+me"),
    9: (15, 1, 4, 19968, [(0, 2), (2, 2), (4, 2), (6, 2)], b"MIG 1g.20gb"),
}
_GI_HANDLE = 1000  # GPU instance handles are GI id + this (ctypes void pointers)


class FakeGpu:
    """One H100 as NVML shows it; enough state to exercise the backend's call sequence."""

    def __init__(self, mig: bool = True) -> None:
        self.mig = mig
        self.gis: Dict[int, Dict[str, Any]] = {}  # gi id -> profile id, start, size, ci
        self.procs: Dict[Tuple[int, int], List[Any]] = {}  # (gi, ci) -> processes
        self.lost = False
        #: nvmlDeviceGetProcessUtilization's samples (pid, smUtil, timeStamp in us), or the
        #: NVML error it raises
        self.samples: List[Tuple[int, int, int]] = []
        self.sample_error = ""
        self.asked_since: List[int] = []

    def module(self) -> types.ModuleType:
        mod = types.ModuleType("pynvml")
        mod.NVMLError = FakeNVMLError  # type: ignore[attr-defined]
        for name, value in CODES.items():
            setattr(mod, name, value)
        for name, value in [
            ("1_SLICE", 0),
            ("2_SLICE", 1),
            ("3_SLICE", 2),
            ("4_SLICE", 3),
            ("7_SLICE", 4),
            ("8_SLICE", 5),
            ("6_SLICE", 6),
            ("1_SLICE_REV1", 7),
            ("2_SLICE_REV1", 8),
            ("1_SLICE_REV2", 9),
        ]:
            setattr(mod, f"NVML_GPU_INSTANCE_PROFILE_{name}", value)
            if "REV" not in name:
                setattr(mod, f"NVML_COMPUTE_INSTANCE_PROFILE_{name}", value)
        mod.NVML_GPU_INSTANCE_PROFILE_COUNT = 10  # type: ignore[attr-defined]
        mod.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED = 0  # type: ignore[attr-defined]
        mod.c_nvmlGpuInstancePlacement_t = Placement  # type: ignore[attr-defined]
        mod.c_nvmlGpuInstance_t = ctypes.c_void_p  # type: ignore[attr-defined]
        for attr in dir(self):
            if attr.startswith("nvml"):
                setattr(mod, attr, getattr(self, attr))
        return mod

    # -- helpers
    def _check(self, handle: Any) -> None:
        if self.lost:
            raise FakeNVMLError(CODES["NVML_ERROR_GPU_IS_LOST"])

    def _fail(self, name: str) -> None:
        raise FakeNVMLError(CODES[name])

    # -- device
    def nvmlInit(self) -> None: ...
    def nvmlShutdown(self) -> None: ...

    def nvmlDeviceGetCount(self) -> int:
        return 1

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Tuple[str, int]:
        self._check(None)
        return ("gpu", index)

    def nvmlDeviceGetName(self, handle: Any) -> bytes:
        return b"NVIDIA H100 80GB HBM3"

    def nvmlDeviceGetUUID(self, handle: Any) -> str:
        return f"MIG-fake-{handle[1]}-{handle[2]}" if handle[0] == "mig" else "GPU-fake-0"

    def nvmlDeviceGetMinorNumber(self, handle: Any) -> int:
        return 0

    def nvmlDeviceGetPciInfo(self, handle: Any) -> Any:
        return SimpleNamespace(busId=b"00000000:18:00.0")

    def nvmlDeviceGetMemoryInfo(self, handle: Any) -> Any:
        if handle[0] == "mig":
            used = sum(p.usedGpuMemory or 0 for p in self.procs.get(handle[1:], []))
            return SimpleNamespace(total=40192 << 20, used=used)
        return SimpleNamespace(total=81559 << 20, used=1234 << 20)

    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> Any:
        if self.mig:
            self._fail("NVML_ERROR_NOT_SUPPORTED")
        return SimpleNamespace(gpu=42, memory=7)

    def nvmlDeviceGetMigMode(self, handle: Any) -> List[int]:
        self._check(handle)
        return [int(self.mig), int(self.mig)]

    # -- profiles and placements
    def nvmlDeviceGetGpuInstanceProfileInfo(self, handle: Any, const: int, version: int = 2) -> Any:
        if const not in H100_PROFILES:
            self._fail("NVML_ERROR_INVALID_ARGUMENT")
        pid, slices, count, mem, _, name = H100_PROFILES[const]
        return SimpleNamespace(
            id=pid, sliceCount=slices, instanceCount=count, memorySizeMB=mem, name=name
        )

    def _by_id(self, profile_id: int) -> Tuple[int, int, int, int, List[Tuple[int, int]], bytes]:
        return next(p for p in H100_PROFILES.values() if p[0] == profile_id)

    def nvmlDeviceGetGpuInstancePossiblePlacements(
        self, handle: Any, profile_id: int, array: Any, count: Any
    ) -> None:
        spots = self._by_id(profile_id)[4]
        for i, (start, size) in enumerate(spots):
            array[i].start, array[i].size = start, size
        count._obj.value = len(spots)

    def nvmlDeviceGetGpuInstanceRemainingCapacity(self, handle: Any, profile_id: int) -> int:
        prof = self._by_id(profile_id)
        return prof[2] - sum(1 for g in self.gis.values() if g["profile"] == profile_id)

    def _used(self) -> Set[int]:
        return {s for g in self.gis.values() for s in range(g["start"], g["start"] + g["size"])}

    def _create(self, profile_id: int, start: Optional[int]) -> int:
        if not self.mig:
            self._fail("NVML_ERROR_NOT_SUPPORTED")
        spots = self._by_id(profile_id)[4]
        free = [(s, n) for s, n in spots if not self._used() & set(range(s, s + n))]
        chosen = [f for f in free if start is None or f[0] == start]
        if not chosen:
            self._fail("NVML_ERROR_INSUFFICIENT_RESOURCES")
        gi_id = min(set(range(1, 9)) - set(self.gis))
        self.gis[gi_id] = {
            "profile": profile_id,
            "start": chosen[0][0],
            "size": chosen[0][1],
            "ci": None,
        }
        return _GI_HANDLE + gi_id

    def nvmlDeviceCreateGpuInstance(self, handle: Any, profile_id: int) -> int:
        return self._create(profile_id, None)

    def nvmlDeviceCreateGpuInstanceWithPlacement(
        self, handle: Any, profile_id: int, ref: Any
    ) -> int:
        assert ref._obj.size == self._by_id(profile_id)[4][0][1]
        return self._create(profile_id, ref._obj.start)

    def nvmlDeviceGetGpuInstances(
        self, handle: Any, profile_id: int, array: Any, count: Any
    ) -> None:
        ids = sorted(i for i, g in self.gis.items() if g["profile"] == profile_id)
        for n, gi_id in enumerate(ids):
            array[n] = _GI_HANDLE + gi_id
        count._obj.value = len(ids)

    def nvmlDeviceGetGpuInstanceById(self, handle: Any, gi_id: int) -> int:
        if gi_id not in self.gis:
            self._fail("NVML_ERROR_NOT_FOUND")
        return _GI_HANDLE + gi_id

    def nvmlGpuInstanceGetInfo(self, gi: int) -> Any:
        g = self.gis[gi - _GI_HANDLE]
        return SimpleNamespace(
            id=gi - _GI_HANDLE,
            profileId=g["profile"],
            placement=SimpleNamespace(start=g["start"], size=g["size"]),
        )

    def nvmlGpuInstanceDestroy(self, gi: int) -> None:
        if self.gis[gi - _GI_HANDLE]["ci"] is not None:
            self._fail("NVML_ERROR_IN_USE")
        del self.gis[gi - _GI_HANDLE]

    # -- compute instances and MIG devices
    def nvmlGpuInstanceGetComputeInstanceProfileInfo(self, gi: int, const: int, eng: int) -> Any:
        slices = self._by_id(self.gis[gi - _GI_HANDLE]["profile"])[1]
        assert const == {1: 0, 2: 1, 3: 2, 4: 3, 7: 4}[slices], "CI must be full-size"
        return SimpleNamespace(id=const)

    def nvmlGpuInstanceCreateComputeInstance(self, gi: int, ci_profile: int) -> Tuple[int, int]:
        self.gis[gi - _GI_HANDLE]["ci"] = 0
        return (gi - _GI_HANDLE, 0)

    def nvmlComputeInstanceGetInfo(self, ci: Tuple[int, int]) -> Any:
        return SimpleNamespace(id=ci[1])

    def nvmlGpuInstanceGetComputeInstanceById(self, gi: int, ci_id: int) -> Tuple[int, int]:
        if self.gis[gi - _GI_HANDLE]["ci"] != ci_id:
            self._fail("NVML_ERROR_NOT_FOUND")
        return (gi - _GI_HANDLE, ci_id)

    def nvmlComputeInstanceDestroy(self, ci: Tuple[int, int]) -> None:
        if self.procs.get(ci):
            self._fail("NVML_ERROR_IN_USE")
        self.gis[ci[0]]["ci"] = None

    def _mig_handles(self) -> List[Tuple[str, int, int]]:
        return [("mig", i, g["ci"]) for i, g in sorted(self.gis.items()) if g["ci"] is not None]

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: Any) -> int:
        return 7

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: Any, slot: int) -> Tuple[str, int, int]:
        devices = self._mig_handles()
        if slot >= len(devices):
            self._fail("NVML_ERROR_NOT_FOUND")
        return devices[slot]

    def nvmlDeviceGetGpuInstanceId(self, mig: Tuple[str, int, int]) -> int:
        return mig[1]

    def nvmlDeviceGetComputeInstanceId(self, mig: Tuple[str, int, int]) -> int:
        return mig[2]

    def nvmlDeviceGetProcessUtilization(self, handle: Any, since: int) -> List[Any]:
        """As nvidia-ml-py: samples newer than ``since``; NOT_FOUND when there are none."""
        self.asked_since.append(since)
        if self.sample_error:
            self._fail(self.sample_error)
        out = [SimpleNamespace(pid=pid, smUtil=sm, memUtil=0, encUtil=0, decUtil=0,
                               timeStamp=ts) for pid, sm, ts in self.samples if ts > since]
        if not out:
            self._fail("NVML_ERROR_NOT_FOUND")
        return out

    def nvmlDeviceGetComputeRunningProcesses(self, handle: Any) -> List[Any]:
        if handle[0] == "mig":
            return list(self.procs.get(handle[1:], []))
        if self.mig:  # aggregate query on the parent needs root; the backend must not rely on it
            self._fail("NVML_ERROR_NO_PERMISSION")
        return [SimpleNamespace(pid=1, usedGpuMemory=None)]


@pytest.fixture
def gpu(monkeypatch: pytest.MonkeyPatch) -> FakeGpu:
    fake = FakeGpu()
    monkeypatch.setitem(sys.modules, "pynvml", fake.module())
    return fake


@pytest.fixture
def nvml(gpu: FakeGpu) -> NvmlBackend:
    return NvmlBackend()


# ------------------------------------------------------------------ translation
@pytest.mark.parametrize(
    "code_name,cls",
    [
        ("NVML_ERROR_NOT_FOUND", GpuNotFound),
        ("NVML_ERROR_INSUFFICIENT_RESOURCES", GpuInsufficientResources),
        ("NVML_ERROR_IN_USE", GpuInUse),
        ("NVML_ERROR_NOT_SUPPORTED", GpuNotSupported),
        ("NVML_ERROR_GPU_IS_LOST", GpuLost),
        ("NVML_ERROR_LIBRARY_NOT_FOUND", GpuUnavailable),
        ("NVML_ERROR_DRIVER_NOT_LOADED", GpuUnavailable),
        ("NVML_ERROR_UNINITIALIZED", GpuUnavailable),
        ("NVML_ERROR_INVALID_ARGUMENT", GpuError),
        ("NVML_ERROR_NO_PERMISSION", GpuError),
        ("NVML_ERROR_UNKNOWN", GpuError),
    ],
)
def test_translate_error_classes(gpu: FakeGpu, code_name: str, cls: Type[GpuError]) -> None:
    err = translate_error(FakeNVMLError(CODES[code_name]), "GPU 1: do something")
    assert type(err) is cls
    assert str(err).startswith("GPU 1: do something: ") and code_name in str(err)
    assert getattr(err, "nvml_code", None) == CODES[code_name]


def test_translate_lost_says_fallen_off_the_bus(gpu: FakeGpu) -> None:
    err = translate_error(FakeNVMLError(15), "GPU 1")
    assert "GPU 1: the GPU has fallen off the bus" in str(err) and "drain" in str(err)


def test_translate_with_real_pynvml_codes() -> None:
    err = translate_error(real_pynvml.NVMLError(real_pynvml.NVML_ERROR_IN_USE), "x", real_pynvml)
    assert type(err) is GpuInUse and "NVML_ERROR_IN_USE" in str(err)


def test_fallback_table_is_the_real_librarys() -> None:
    """The backend names codes from its own table when pynvml is not loaded: every entry
    must be NVML's number, or a lost GPU would be reported as something else."""
    from slurmiso.gpu import nvml as backend

    assert {n: int(getattr(real_pynvml, n)) for n in
                                      backend._DEFAULT_CODES} == backend._DEFAULT_CODES
    for name, code in backend._DEFAULT_CODES.items():
        assert name in str(translate_error(FakeNVMLError(code), "x", types.ModuleType("none")))


def test_lost_gpu_on_a_call(gpu: FakeGpu, nvml: NvmlBackend) -> None:
    gpu.lost = True
    with pytest.raises(GpuLost, match="fallen off the bus"):
        nvml.device(0)


def test_missing_library_is_unavailable(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeGpu().module()

    def no_lib() -> None:
        raise FakeNVMLError(12)

    fake.nvmlInit = no_lib  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    backend = NvmlBackend()  # no I/O yet
    with pytest.raises(GpuUnavailable, match="LIBRARY_NOT_FOUND"):
        backend.devices()


# ---------------------------------------------------------------- profile naming
def _info(pid: int, slices: int, mem: int, name: bytes = b"") -> Any:
    return SimpleNamespace(id=pid, sliceCount=slices, memorySizeMB=mem, name=name)


@pytest.mark.parametrize(
    "model,info,constant,expected",
    [
        ("H100-80GB", _info(9, 3, 40192), "", "3g.40gb"),  # catalogue by profile id
        ("H200-141GB", _info(19, 1, 17920, b"MIG 1g.18gb"), "", "1g.18gb"),
        ("A100-40GB", _info(20, 1, 4864), "", "1g.5gb+me"),
        (None, _info(9, 3, 40192, b"MIG 3g.40gb"), "", "3g.40gb"),  # NVML's own name
        (None, _info(47, 1, 24064), "NVML_GPU_INSTANCE_PROFILE_1_SLICE", "1g.24gb"),  # derived
        (None, _info(48, 1, 24064), "NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1", "1g.24gb+me"),
        (None, _info(49, 2, 47000), "NVML_GPU_INSTANCE_PROFILE_2_SLICE_NO_ME", "2g.46gb-me"),
    ],
)
def test_profile_name(model: Optional[str], info: Any, constant: str, expected: str) -> None:
    assert profile_name(MODELS[model] if model else None, info, constant) == expected


# --------------------------------------------------------- the backend on the fake
def test_is_a_gpu_backend(nvml: NvmlBackend) -> None:
    assert isinstance(nvml, GpuBackend) and nvml.name == "nvml"
    assert not nvml.capabilities.set_mig_mode and not nvml.capabilities.simulated


def test_context_manager_shuts_nvml_down(gpu: FakeGpu, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: List[str] = []
    monkeypatch.setattr(sys.modules["pynvml"], "nvmlShutdown", lambda: calls.append("shutdown"))
    with NvmlBackend() as backend:
        assert backend.devices()
        assert calls == []
    assert calls == ["shutdown"]
    backend.close()  # idempotent: no second shutdown
    assert calls == ["shutdown"]


def test_device_info(nvml: NvmlBackend) -> None:
    (dev,) = nvml.devices()
    assert (dev.name, dev.model, dev.uuid, dev.pci_bus_id) == (
        "NVIDIA H100 80GB HBM3",
        "H100-80GB",
        "GPU-fake-0",
        "00000000:18:00.0",
    )
    assert (dev.memory_total_mb, dev.memory_used_mb) == (81559, 1234)
    assert dev.utilization_pct is None and dev.mig_enabled  # NOT_SUPPORTED under MIG: unknown
    with pytest.raises(GpuNotFound, match="no GPU 3"):
        nvml.device(3)


def test_utilization_without_mig(gpu: FakeGpu, nvml: NvmlBackend) -> None:
    gpu.mig = False
    assert nvml.device(0).utilization_pct == 42
    assert nvml.telemetry(0).gr_engine_active == 0.42
    assert [p.pid for p in nvml.processes(0)] == [1]


def test_a_processes_sm_share_is_the_mean_of_its_recent_samples(gpu: FakeGpu,
                                                                 nvml: NvmlBackend) -> None:
    """smUtil per process (NVML: one sample per process with non-zero use in a period, CPU
    timestamps in us): the mean of the window's samples; an old one is not read."""
    import time

    gpu.mig = False
    now = int(time.time() * 1e6)
    gpu.samples = [(1, 30, now - 2_000_000), (1, 50, now - 1_000_000),
                   (1, 100, now - 3_600 * 10**6)]  # an hour old: outside the window
    (proc,) = nvml.processes(0)
    assert proc.sm_util == pytest.approx(0.4)
    assert now - gpu.asked_since[-1] == pytest.approx(10e6, rel=0.1)
    gpu.samples = []  # NOT_FOUND: no process used the SMs in the window
    assert nvml.processes(0)[0].sm_util == 0.0
    gpu.sample_error = "NVML_ERROR_NOT_SUPPORTED"  # the driver will not say: unknown
    assert nvml.processes(0)[0].sm_util is None


def test_mig_device_processes_have_no_sm_share(gpu: FakeGpu, nvml: NvmlBackend) -> None:
    gi = nvml.create_gpu_instance(0, "1g.10gb")
    nvml.create_compute_instance(0, gi.gi_id)
    gpu.procs[(gi.gi_id, 0)] = [SimpleNamespace(pid=7, usedGpuMemory=1 << 30)]
    (proc,) = nvml.processes(0)
    assert proc.mig_uuid and proc.sm_util is None and not gpu.asked_since


def test_profiles_match_catalogue(nvml: NvmlBackend) -> None:
    got = {
        p.name: (p.profile_id, p.max_instances, p.placements, p.memory_slices)
        for p in nvml.profiles(0)
    }
    catalogue = MODELS["H100-80GB"]
    for prof in catalogue.profiles:
        assert got[prof.name] == (
            prof.profile_id,
            prof.max_instances,
            prof.placements,
            prof.memory_slices,
        ), prof.name
    assert len(got) == len(catalogue.profiles)


def test_create_list_destroy(gpu: FakeGpu, nvml: NvmlBackend) -> None:
    big = create_mig_device(nvml, 0, "4g.40gb")
    assert (big.gi_id, big.ci_id, big.placement_start, big.uuid) == (1, 0, 0, "MIG-fake-1-0")
    assert nvml.free_placements(0, "3g.40gb") == [4]
    assert nvml.free_placements(0, "4g.40gb") == []
    with pytest.raises(GpuInsufficientResources, match="free placements: 4"):
        nvml.create_gpu_instance(0, "3g.40gb", 0)
    with pytest.raises(GpuError, match="legal starts: 0, 4"):
        nvml.create_gpu_instance(0, "3g.40gb", 2)
    small = create_mig_device(nvml, 0, "3g.40gb", 4)
    assert nvml.instances() == [big, small]
    gpu.procs[(2, 0)] = [SimpleNamespace(pid=4242, usedGpuMemory=512 << 20)]
    (proc,) = nvml.processes()
    assert (proc.pid, proc.used_memory_mb, proc.mig_uuid) == (4242, 512, small.uuid)
    with pytest.raises(GpuInUse):
        nvml.destroy_gpu_instance(0, small.gi_id)
    with pytest.raises(GpuInUse):
        destroy_mig_device(nvml, small)
    gpu.procs.clear()
    destroy_mig_device(nvml, small)
    destroy_mig_device(nvml, big)
    assert nvml.instances() == [] and gpu.gis == {}


def test_unknown_profile_names_allowed(nvml: NvmlBackend) -> None:
    with pytest.raises(GpuNotSupported, match="allowed profiles: .*3g.40gb"):
        nvml.create_gpu_instance(0, "3g.20gb")


def test_create_needs_mig_mode(gpu: FakeGpu, nvml: NvmlBackend) -> None:
    gpu.mig = False
    with pytest.raises(GpuNotSupported, match="MIG mode is disabled on GPU 0"):
        nvml.create_gpu_instance(0, "1g.10gb")
    assert nvml.free_placements(0, "1g.10gb") == []
    assert nvml.instances() == []


def test_unknown_gi_is_not_found(nvml: NvmlBackend) -> None:
    with pytest.raises(GpuNotFound):
        nvml.destroy_gpu_instance(0, 5)


def test_profiles_without_root_use_catalogue_placements(gpu: FakeGpu, nvml: NvmlBackend) -> None:
    def no_permission(*args: Any) -> None:
        raise FakeNVMLError(CODES["NVML_ERROR_NO_PERMISSION"])

    sys.modules["pynvml"].nvmlDeviceGetGpuInstancePossiblePlacements = no_permission  # type: ignore[attr-defined]
    prof = next(p for p in nvml.profiles(0) if p.name == "3g.40gb")
    assert (prof.placements, prof.memory_slices) == ((0, 4), 4)
