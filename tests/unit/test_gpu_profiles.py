"""The MIG catalogues match REFERENCE.md (names, counts, placements) and the geometry rules."""

from __future__ import annotations

from typing import List, Tuple

import pytest

from slurmiso.gpu import profiles
from slurmiso.gpu.profiles import free_placements, lookup_model

# (model, 1g, 1g double-mem, 2g, 3g, 4g, 7g) as in REFERENCE.md; "" where the model has none.
CATALOGUE = [
    ("A100-40GB", "1g.5gb", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"),
    ("A100-80GB", "1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"),
    ("H100-80GB", "1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"),
    ("H200-141GB", "1g.18gb", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb"),
    ("A30-24GB", "1g.6gb", "", "2g.12gb", "", "4g.24gb", ""),
]
SEVEN_SLICE_COUNTS = (7, 4, 3, 2, 1, 1)
A30_COUNTS = (4, 0, 2, 0, 1, 0)
SEVEN_SLICE_PLACEMENTS = (
    (0, 1, 2, 3, 4, 5, 6),
    (0, 2, 4, 6),
    (0, 2, 4),
    (0, 4),
    (0,),
    (0,),
)


@pytest.mark.parametrize("row", CATALOGUE, ids=[r[0] for r in CATALOGUE])
def test_catalogue_names_and_counts(row: Tuple[str, ...]) -> None:
    model = lookup_model(row[0])
    assert model is not None
    counts = A30_COUNTS if row[0] == "A30-24GB" else SEVEN_SLICE_COUNTS
    for name, count in zip(row[1:], counts):
        if not name:
            continue
        prof = model.profile(name)
        assert prof is not None, f"{row[0]} lacks {name}"
        assert prof.max_instances == count, name


@pytest.mark.parametrize("row", CATALOGUE[:4], ids=[r[0] for r in CATALOGUE[:4]])
def test_seven_slice_placements(row: Tuple[str, ...]) -> None:
    model = lookup_model(row[0])
    assert model is not None and (model.compute_slices, model.memory_slices) == (7, 8)
    for name, placements in zip(row[1:], SEVEN_SLICE_PLACEMENTS):
        prof = model.profile(name)
        assert prof is not None and prof.placements == placements, name
        for start in placements:  # every legal start fits inside the GPU
            assert start + prof.memory_slices <= model.memory_slices


@pytest.mark.parametrize(
    "model_name,profile,max_instances",
    [("H100-80GB", "1g.10gb+me", 1), ("A100-40GB", "1g.5gb+me", 1), ("A30-24GB", "2g.12gb+me", 1)],
)
def test_media_engine_profiles_allow_one(model_name: str, profile: str, max_instances: int) -> None:
    model = lookup_model(model_name)
    assert model is not None
    prof = model.profile(profile)
    assert prof is not None and prof.media_engines and prof.max_instances == max_instances


@pytest.mark.parametrize(
    "alias,canonical",
    [
        ("H100", "H100-80GB"),
        ("NVIDIA H100 80GB HBM3", "H100-80GB"),
        ("nvidia a100-sxm4-40gb", "A100-40GB"),
        ("A100-SXM4-80GB", "A100-80GB"),
        ("NVIDIA H200", "H200-141GB"),
        ("a30", "A30-24GB"),
    ],
)
def test_lookup_model_aliases(alias: str, canonical: str) -> None:
    model = lookup_model(alias)
    assert model is not None and model.name == canonical


def test_lookup_model_unknown() -> None:
    assert lookup_model("Tesla V100") is None


def _place(model_name: str, layout: List[str]) -> List[Tuple[int, int]]:
    """Place ``layout`` one by one at the lowest free start; fail the test if one does not fit."""
    model = lookup_model(model_name)
    assert model is not None
    occupied: List[Tuple[int, int]] = []
    for name in layout:
        prof = model.profile(name)
        assert prof is not None
        free = free_placements(model, prof, occupied)
        assert free, f"{name} does not fit after {occupied}"
        occupied.append((free[0], prof.memory_slices))
    return occupied


@pytest.mark.parametrize(
    "layout,expected",
    [
        (["4g.40gb", "3g.40gb"], [(0, 4), (4, 4)]),
        (["3g.40gb", "3g.40gb"], [(0, 4), (4, 4)]),
        (["2g.20gb", "2g.20gb", "2g.20gb", "1g.10gb"], [(0, 2), (2, 2), (4, 2), (6, 1)]),
        (["1g.20gb"] * 4, [(0, 2), (2, 2), (4, 2), (6, 2)]),
        (["7g.80gb"], [(0, 8)]),
    ],
)
def test_layouts_that_fit(layout: List[str], expected: List[Tuple[int, int]]) -> None:
    assert _place("H100-80GB", layout) == expected


@pytest.mark.parametrize(
    "occupied,profile,expected",
    [
        ([(0, 4)], "4g.40gb", []),  # 4g + 4g does not fit
        ([(0, 4)], "3g.40gb", [4]),
        ([(4, 4)], "4g.40gb", [0]),
        ([(0, 2), (2, 2), (4, 2)], "1g.10gb", [6]),  # after three 2g, 1g only at 6
        ([(0, 2), (2, 2), (4, 2)], "2g.20gb", []),
        ([(0, 8)], "1g.10gb", []),
        ([(3, 1)], "3g.40gb", [4]),  # a stray 1g blocks the first half for 3g
    ],
)
def test_free_placements_geometry(
    occupied: List[Tuple[int, int]], profile: str, expected: List[int]
) -> None:
    model = profiles.MODELS["H100-80GB"]
    prof = model.profile(profile)
    assert prof is not None
    assert free_placements(model, prof, occupied) == expected
