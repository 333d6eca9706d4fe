"""Every MIG table of the catalogue against NVIDIA's published one (slurmiso/gpu/catalogue.py
names each source): profile names, instance counts, fractions of memory and SMs, placements.

The expected rows are written out here from the MIG user guide's "Supported MIG Profiles"
tables (and, for GPUs the guide lists without a table, NVIDIA's mig-parted defaults), not
computed by the catalogue's own builders, so a builder slip shows up as a difference.
"""

from __future__ import annotations

from fractions import Fraction
from typing import Dict, List, Tuple

import pytest

from slurmiso.gpu import profiles
from slurmiso.gpu.placement import capacity, pack
from slurmiso.gpu.profiles import lookup_model

F = Fraction
FULL = F(1)

# model -> [(profile, fraction of memory, fraction of SMs, instances)], as the tables print them.
PUBLISHED: Dict[str, List[Tuple[str, Fraction, Fraction, int]]] = {
    "A100-40GB": [
        ("1g.5gb", F(1, 8), F(1, 7), 7), ("1g.5gb+me", F(1, 8), F(1, 7), 1),
        # the guide prints 1/8 for 1g.10gb here; 10 GB of 40 GB, four at most, is 2/8 (the
        # 80GB table prints 1/4 for its 1g.20gb), and NVML places it on 2 memory slices
        ("1g.10gb", F(2, 8), F(1, 7), 4), ("2g.10gb", F(2, 8), F(2, 7), 3),
        ("3g.20gb", F(4, 8), F(3, 7), 2), ("4g.20gb", F(4, 8), F(4, 7), 1),
        ("7g.40gb", FULL, FULL, 1)],
    "A100-80GB": [
        ("1g.10gb", F(1, 8), F(1, 7), 7), ("1g.10gb+me", F(1, 8), F(1, 7), 1),
        ("1g.20gb", F(1, 4), F(1, 7), 4), ("2g.20gb", F(2, 8), F(2, 7), 3),
        ("3g.40gb", F(4, 8), F(3, 7), 2), ("4g.40gb", F(4, 8), F(4, 7), 1),
        ("7g.80gb", FULL, FULL, 1)],
    "A30-24GB": [
        ("1g.6gb", F(1, 4), F(1, 4), 4), ("1g.6gb+me", F(1, 4), F(1, 4), 1),
        ("2g.12gb", F(2, 4), F(2, 4), 2), ("2g.12gb+me", F(2, 4), F(2, 4), 1),
        ("4g.24gb", FULL, FULL, 1)],
    "H100-80GB": [
        ("1g.10gb", F(1, 8), F(1, 7), 7), ("1g.10gb+me", F(1, 8), F(1, 7), 1),
        ("1g.20gb", F(1, 4), F(1, 7), 4), ("2g.20gb", F(2, 8), F(2, 7), 3),
        ("3g.40gb", F(4, 8), F(3, 7), 2), ("4g.40gb", F(4, 8), F(4, 7), 1),
        ("7g.80gb", FULL, FULL, 1)],
    "H100-94GB": [
        ("1g.12gb", F(1, 8), F(1, 7), 7), ("1g.12gb+me", F(1, 8), F(1, 7), 1),
        ("1g.24gb", F(1, 4), F(1, 7), 4), ("2g.24gb", F(2, 8), F(2, 7), 3),
        ("3g.47gb", F(4, 8), F(3, 7), 2), ("4g.47gb", F(4, 8), F(4, 7), 1),
        ("7g.94gb", FULL, FULL, 1)],
    "H100-96GB": [
        ("1g.12gb", F(1, 8), F(1, 7), 7), ("1g.12gb+me", F(1, 8), F(1, 7), 1),
        ("1g.24gb", F(1, 4), F(1, 7), 4), ("2g.24gb", F(2, 8), F(2, 7), 3),
        ("3g.48gb", F(4, 8), F(3, 7), 2), ("4g.48gb", F(4, 8), F(4, 7), 1),
        ("7g.96gb", FULL, FULL, 1)],
    # no table in the guide; mig-parted's all-balanced groups H20 with H100-96GB
    "H20-96GB": [
        ("1g.12gb", F(1, 8), F(1, 7), 7), ("1g.12gb+me", F(1, 8), F(1, 7), 1),
        ("1g.24gb", F(1, 4), F(1, 7), 4), ("2g.24gb", F(2, 8), F(2, 7), 3),
        ("3g.48gb", F(4, 8), F(3, 7), 2), ("4g.48gb", F(4, 8), F(4, 7), 1),
        ("7g.96gb", FULL, FULL, 1)],
    "H200-141GB": [
        ("1g.18gb", F(1, 8), F(1, 7), 7), ("1g.18gb+me", F(1, 8), F(1, 7), 1),
        ("1g.35gb", F(1, 4), F(1, 7), 4), ("2g.35gb", F(2, 8), F(2, 7), 3),
        ("3g.71gb", F(4, 8), F(3, 7), 2), ("4g.71gb", F(4, 8), F(4, 7), 1),
        ("7g.141gb", FULL, FULL, 1)],
    # mig-parted's "GH200 144G HBM3e" configs
    "GH200-144GB": [
        ("1g.18gb", F(1, 8), F(1, 7), 7), ("1g.18gb+me", F(1, 8), F(1, 7), 1),
        ("1g.36gb", F(1, 4), F(1, 7), 4), ("2g.36gb", F(2, 8), F(2, 7), 3),
        ("3g.72gb", F(4, 8), F(3, 7), 2), ("4g.72gb", F(4, 8), F(4, 7), 1),
        ("7g.144gb", FULL, FULL, 1)],
    "B200-180GB": [
        ("1g.23gb", F(1, 8), F(1, 7), 7), ("1g.23gb+me", F(1, 8), F(1, 7), 1),
        ("1g.45gb", F(2, 8), F(1, 7), 4), ("2g.45gb", F(2, 8), F(2, 7), 3),
        ("3g.90gb", F(4, 8), F(3, 7), 2), ("4g.90gb", F(4, 8), F(4, 7), 1),
        ("7g.180gb", FULL, FULL, 1)],
    # mig-parted's GB200 HGX configs (R580 names)
    "GB200-189GB": [
        ("1g.24gb", F(1, 8), F(1, 7), 7), ("1g.24gb+me", F(1, 8), F(1, 7), 1),
        ("1g.47gb", F(2, 8), F(1, 7), 4), ("2g.47gb", F(2, 8), F(2, 7), 3),
        ("3g.95gb", F(4, 8), F(3, 7), 2), ("4g.95gb", F(4, 8), F(4, 7), 1),
        ("7g.189gb", FULL, FULL, 1)],
    "RTX-PRO-6000": [
        ("1g.24gb", F(1, 4), F(1, 4), 4), ("1g.24gb+me", F(1, 4), F(1, 4), 1),
        ("1g.24gb+gfx", F(1, 4), F(1, 4), 4), ("1g.24gb+me.all", F(1, 4), F(1, 4), 1),
        ("1g.24gb-me", F(1, 4), F(1, 4), 4), ("2g.48gb", F(1, 2), F(1, 2), 2),
        ("2g.48gb+gfx", F(1, 2), F(1, 2), 2), ("2g.48gb+me.all", F(1, 2), F(1, 2), 1),
        ("2g.48gb-me", F(1, 2), F(1, 2), 2), ("4g.96gb", FULL, FULL, 1),
        ("4g.96gb+gfx", FULL, FULL, 1)],
    "RTX-PRO-5000": [
        ("1g.24gb", F(1, 2), F(1, 2), 2), ("1g.24gb+me", F(1, 2), F(1, 2), 1),
        ("1g.24gb+gfx", F(1, 2), F(1, 2), 2), ("1g.24gb+me.all", F(1, 2), F(1, 2), 1),
        ("1g.24gb-me", F(1, 2), F(1, 2), 2), ("2g.48gb", FULL, FULL, 1),
        ("2g.48gb+gfx", FULL, FULL, 1)],
    "RTX-PRO-4500": [
        ("1g.16gb", F(1, 2), F(1, 2), 2), ("1g.16gb+gfx", F(1, 2), F(1, 2), 2),
        ("1g.16gb+me.all", F(1, 2), F(1, 2), 1), ("1g.16gb-me", F(1, 2), F(1, 2), 2),
        ("2g.32gb", FULL, FULL, 1), ("2g.32gb+gfx", FULL, FULL, 1)],
}

#: The guide's ``nvidia-smi mig -lgipp`` on a 7-slice part: profile id -> (starts, size).
LGIPP = {19: ((0, 1, 2, 3, 4, 5, 6), 1), 20: ((0, 1, 2, 3, 4, 5, 6), 1),
         15: ((0, 2, 4, 6), 2), 14: ((0, 2, 4), 2), 9: ((0, 4), 4), 5: ((0,), 4),
         0: ((0,), 8)}

SEVEN_SLICE = [m for m in PUBLISHED if PUBLISHED[m][0][2] == F(1, 7)]


def test_every_mig_model_has_a_published_table() -> None:
    assert sorted(m.name for m in profiles.mig_models()) == sorted(PUBLISHED)


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_profiles_match_the_published_table(name: str) -> None:
    model = lookup_model(name)
    assert model is not None and model.mig_capable
    assert model.profile_names == [row[0] for row in PUBLISHED[name]]
    for prof_name, mem, sms, count in PUBLISHED[name]:
        prof = model.profile(prof_name)
        assert prof is not None
        assert F(prof.memory_slices, model.memory_slices) == mem, prof_name
        assert F(prof.compute_slices, model.compute_slices) == sms, prof_name
        assert prof.max_instances == count, prof_name
        assert prof.media_engines == ("+me" in prof_name), prof_name


@pytest.mark.parametrize("name", SEVEN_SLICE)
def test_seven_slice_placements_are_the_guides(name: str) -> None:
    model = lookup_model(name)
    assert model is not None and (model.compute_slices, model.memory_slices) == (7, 8)
    got = {p.profile_id: (p.placements, p.memory_slices) for p in model.profiles}
    assert got == LGIPP


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_counts_follow_from_the_placements(name: str) -> None:
    """Each profile alone fits on an empty GPU exactly as many times as the table says, and
    every legal start stays inside the GPU: the placements and the counts agree."""
    model = lookup_model(name)
    assert model is not None
    left = capacity(model, [])
    for prof in model.profiles:
        assert left[prof.name] == prof.max_instances, prof.name
        assert all(s + prof.memory_slices <= model.memory_slices for s in prof.placements)


@pytest.mark.parametrize(
    "name,layout",
    [
        ("H100-94GB", {"3g.47gb": 1, "2g.24gb": 1, "1g.12gb": 2}),  # mig-parted all-balanced
        ("H100-96GB", {"3g.48gb": 1, "2g.24gb": 1, "1g.12gb": 2}),
        ("H20-96GB", {"3g.48gb": 1, "2g.24gb": 1, "1g.12gb": 2}),
        ("GH200-144GB", {"3g.72gb": 1, "2g.36gb": 1, "1g.18gb": 2}),
        ("B200-180GB", {"3g.90gb": 1, "2g.45gb": 1, "1g.23gb": 2}),
        ("GB200-189GB", {"3g.95gb": 1, "2g.47gb": 1, "1g.24gb": 2}),
        ("B200-180GB", {"4g.90gb": 1, "3g.90gb": 1}),
        ("RTX-PRO-6000", {"2g.48gb": 1, "1g.24gb": 2}),
    ],
)
def test_published_layouts_fit(name: str, layout: Dict[str, int]) -> None:
    model = lookup_model(name)
    assert model is not None and pack(model, layout) is not None


@pytest.mark.parametrize(
    "name,layout",
    [("B200-180GB", {"4g.90gb": 2}), ("H100-94GB", {"3g.47gb": 3}),
     ("RTX-PRO-5000", {"2g.48gb": 1, "1g.24gb": 1}), ("GB200-189GB", {"1g.24gb+me": 2})],
)
def test_layouts_nvml_refuses_do_not_fit(name: str, layout: Dict[str, int]) -> None:
    model = lookup_model(name)
    assert model is not None and pack(model, layout) is None


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_each_table_names_its_source(name: str) -> None:
    model = lookup_model(name)
    assert model is not None
    assert "nvidia" in model.source.lower() and model.architecture


@pytest.mark.parametrize(
    "alias,canonical",
    [
        ("NVIDIA H100 NVL", "H100-94GB"), ("H100-NVL", "H100-94GB"),
        ("NVIDIA H100 PCIe", "H100-80GB"), ("NVIDIA GH200 480GB", "H100-96GB"),
        ("GH200", "H100-96GB"), ("NVIDIA H20", "H20-96GB"), ("h20", "H20-96GB"),
        ("NVIDIA H200 NVL", "H200-141GB"), ("NVIDIA GH200 144G HBM3e", "GH200-144GB"),
        ("NVIDIA B200", "B200-180GB"), ("b200", "B200-180GB"), ("NVIDIA GB200", "GB200-189GB"),
        ("NVIDIA A100-PCIE-40GB", "A100-40GB"), ("NVIDIA A100 80GB PCIe", "A100-80GB"),
        ("NVIDIA RTX PRO 6000 Blackwell Workstation Edition", "RTX-PRO-6000"),
        ("NVIDIA L40S", "L40S"), ("l4", "L4"), ("NVIDIA GeForce RTX 4090", "RTX-4090"),
    ],
)
def test_nvml_names_and_aliases(alias: str, canonical: str) -> None:
    model = lookup_model(alias)
    assert model is not None and model.name == canonical


@pytest.mark.parametrize("name", ["L40S", "L40", "L4", "A10", "A40", "RTX-4090", "T4"])
def test_gpus_without_mig_have_memory_and_no_profiles(name: str) -> None:
    model = lookup_model(name)
    assert model is not None and not model.mig_capable and model.memory_mb > 10_000


@pytest.mark.parametrize(
    "name,needs_reset",
    [("A100-80GB", True), ("A30-24GB", True), ("H100-80GB", False), ("H200-141GB", False),
     ("B200-180GB", False), ("GB200-189GB", False)],
)
def test_mig_mode_reset_by_architecture(name: str, needs_reset: bool) -> None:
    model = lookup_model(name)
    from slurmiso.mig.mode import needs_reset as reset

    assert model is not None and reset(model.architecture) is needs_reset


def test_model_from_driver_takes_the_whole_gpu_as_budget() -> None:
    b200 = lookup_model("B200-180GB")
    assert b200 is not None
    made = profiles.model_from_driver("NVIDIA X300", 200_000, b200.profiles, "blackwell")
    assert (made.name, made.compute_slices, made.memory_slices) == ("X300", 7, 8)
    from slurmiso.mig.mode import needs_reset

    assert needs_reset(made.architecture) is False and capacity(made, []) == capacity(b200, [])
