"""Read-only checks of the NVML backend against ``nvidia-smi`` on a real GPU node.

Nothing here changes the GPU: no MIG mode change, no instance created or destroyed. Without an
NVIDIA driver every test is skipped with the reason.
"""

from __future__ import annotations

import csv
import io
import shutil
import subprocess
from typing import Dict, Iterator, List, Set

import pytest

from slurmiso.errors import GpuUnavailable
from slurmiso.gpu.nvml import NvmlBackend
from slurmiso.gpu.profiles import lookup_model

pytestmark = pytest.mark.nvml

FIELDS = [
    "index",
    "uuid",
    "name",
    "memory.total",
    "memory.used",
    "utilization.gpu",
    "mig.mode.current",
    "pci.bus_id",
]


def _smi(*args: str) -> str:
    return subprocess.run(
        ["nvidia-smi", *args], capture_output=True, text=True, check=True, timeout=60
    ).stdout


@pytest.fixture(scope="module")
def backend() -> Iterator[NvmlBackend]:
    if shutil.which("nvidia-smi") is None:
        pytest.skip("no NVIDIA driver: nvidia-smi is not on PATH")
    try:
        _smi("-L")
    except (subprocess.CalledProcessError, OSError, subprocess.TimeoutExpired) as exc:
        pytest.skip(f"no usable NVIDIA driver: nvidia-smi -L failed ({exc})")
    nvml = NvmlBackend()
    try:
        nvml.connect()
    except GpuUnavailable as err:
        pytest.skip(f"NVML unavailable: {err}")
    yield nvml
    nvml.close()


@pytest.fixture(scope="module")
def smi_rows(backend: NvmlBackend) -> List[Dict[str, str]]:
    text = _smi(f"--query-gpu={','.join(FIELDS)}", "--format=csv,noheader,nounits")
    rows = [dict(zip(FIELDS, (c.strip() for c in row))) for row in csv.reader(io.StringIO(text))]
    return [r for r in rows if r.get("index")]


def test_devices_match_nvidia_smi(backend: NvmlBackend, smi_rows: List[Dict[str, str]]) -> None:
    devices = backend.devices()
    assert len(devices) == len(smi_rows)
    for dev, row in zip(devices, smi_rows):
        assert dev.index == int(row["index"])
        assert dev.uuid == row["uuid"]
        assert dev.name == row["name"]
        assert dev.pci_bus_id.upper() == row["pci.bus_id"].upper()
        assert abs(dev.memory_total_mb - int(row["memory.total"])) <= 1
        assert 0 <= dev.memory_used_mb <= dev.memory_total_mb


def test_memory_used_close_to_nvidia_smi(
    backend: NvmlBackend, smi_rows: List[Dict[str, str]]
) -> None:
    for row in smi_rows:
        ours = backend.device(int(row["index"])).memory_used_mb
        assert abs(ours - int(row["memory.used"])) <= 1024, "memory moved by more than 1 GiB"


def test_mig_mode_and_utilization(backend: NvmlBackend, smi_rows: List[Dict[str, str]]) -> None:
    for row in smi_rows:
        index = int(row["index"])
        current, pending = backend.mig_mode(index)
        smi_mode = row["mig.mode.current"]
        if smi_mode in ("Enabled", "Disabled"):
            assert current == (smi_mode == "Enabled")
        else:  # "[N/A]": no MIG on this part
            assert (current, pending) == (False, False)
        util = backend.device(index).utilization_pct
        tele = backend.telemetry(index)
        if current:  # NVML reports no utilization in MIG mode: unknown, never 0
            assert util is None and tele.gr_engine_active is None
        else:
            assert util is not None and 0 <= util <= 100
            assert tele.gr_engine_active is not None and 0.0 <= tele.gr_engine_active <= 1.0
        assert tele.memory_total_mb > 0


def test_profiles_agree_with_catalogue(backend: NvmlBackend) -> None:
    for dev in backend.devices():
        model = lookup_model(dev.name)
        profiles = backend.profiles(dev.index)
        if model is None:
            pytest.skip(f"{dev.name} is not in slurmiso's catalogue; nothing to compare")
        if not model.profiles:
            continue
        by_id = {p.profile_id: p for p in profiles}
        for known in model.profiles:
            if known.profile_id not in by_id:
                continue  # a driver may hide a profile (e.g. +me on some SKUs)
            got = by_id[known.profile_id]
            assert got.name == known.name
            assert got.max_instances == known.max_instances, known.name
            assert got.placements == known.placements, known.name
            assert got.compute_slices == known.compute_slices, known.name


def test_instances_match_nvidia_smi_list(backend: NvmlBackend) -> None:
    listed = [ln for ln in _smi("-L").splitlines() if ln.strip().startswith("MIG ")]
    uuids = {i.uuid for i in backend.instances() if i.uuid}
    assert len(uuids) == len(listed)
    for uuid in uuids:
        assert uuid.startswith("MIG-") and any(uuid in ln for ln in listed)


def test_processes_match_nvidia_smi(backend: NvmlBackend) -> None:
    def sample() -> Set[int]:
        text = _smi("--query-compute-apps=pid", "--format=csv,noheader")
        return {int(t) for t in text.split() if t.strip().isdigit()}

    for _ in range(3):  # processes come and go; agree on one of three samples
        ours = {p.pid for p in backend.processes()}
        if ours == sample():
            break
    else:
        pytest.fail(f"NVML processes {sorted(ours)} differ from nvidia-smi {sorted(sample())}")
    for proc in backend.processes():
        assert proc.pid > 0 and proc.used_memory_mb >= 0
