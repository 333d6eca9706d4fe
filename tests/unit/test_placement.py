"""MIG packing and placement choice against the real placement tables."""

from __future__ import annotations

from typing import Dict, List, Tuple

import pytest

from slurmiso.gpu.placement import best_placement, can_place, capacity, pack
from slurmiso.gpu.profiles import MODELS

H100 = MODELS["H100-80GB"]
A30 = MODELS["A30-24GB"]


@pytest.mark.parametrize(
    "counts,fits",
    [
        ({"4g.40gb": 1, "3g.40gb": 1}, True),
        ({"3g.40gb": 2}, True),
        ({"4g.40gb": 2}, False),
        ({"7g.80gb": 1}, True),
        ({"7g.80gb": 1, "1g.10gb": 1}, False),
        ({"1g.10gb": 7}, True),
        ({"1g.10gb": 8}, False),
        ({"2g.20gb": 3, "1g.10gb": 1}, True),
        ({"2g.20gb": 3, "1g.10gb": 2}, False),  # compute budget: 6 + 2 > 7
        ({"1g.20gb": 4}, True),
        ({"1g.20gb": 4, "1g.10gb": 1}, False),  # memory slices all used
        ({"1g.10gb+me": 2}, False),  # +me allows one instance
        ({"4g.40gb": 1, "2g.20gb": 1, "1g.10gb": 1}, True),
        ({"3g.40gb": 1, "2g.20gb": 2}, True),
    ],
)
def test_pack_h100(counts: Dict[str, int], fits: bool) -> None:
    got = pack(H100, counts)
    assert (got is not None) is fits
    if got:
        assert sorted(n for n, _ in got) == sorted(n for n, k in counts.items() for _ in range(k))
        used: List[int] = []
        for name, start in got:
            prof = H100.profile(name)
            assert prof is not None and start in prof.placements
            cells = list(range(start, start + prof.memory_slices))
            assert not set(cells) & set(used), got
            used.extend(cells)


def test_pack_beside_existing() -> None:
    assert pack(H100, {"3g.40gb": 1}, [("4g.40gb", 0)]) == [("3g.40gb", 4)]
    assert pack(H100, {"4g.40gb": 1}, [("3g.40gb", 0)]) is None


def test_a30() -> None:
    assert pack(A30, {"2g.12gb": 2}) is not None
    assert pack(A30, {"2g.12gb": 1, "1g.6gb": 2}) is not None
    assert pack(A30, {"4g.24gb": 1, "1g.6gb": 1}) is None


def test_unknown_profile_is_value_error() -> None:
    with pytest.raises(ValueError, match="3g.20gb"):
        pack(H100, {"3g.20gb": 1})


@pytest.mark.parametrize(
    "placed,profile,expect",
    [
        ([], "1g.10gb", 6),  # small instance goes to the end, keeping 4g/3g at 0 possible
        ([], "3g.40gb", 4),  # keeps 4g.40gb possible at 0
        ([], "2g.20gb", 4),  # keeps 4g at 0 (2g at 0/2 would kill it)
        ([("4g.40gb", 0)], "1g.10gb", 6),
        ([("3g.40gb", 4)], "1g.10gb", 3),  # 3g.40gb at 0 is lost either way; keep 2g at 0
        ([], "7g.80gb", 0),
        ([("7g.80gb", 0)], "1g.10gb", None),
    ],
)
def test_best_placement(placed: List[Tuple[str, int]], profile: str, expect: object) -> None:
    assert best_placement(H100, profile, placed) == expect


def test_best_placement_keeps_large_profiles_over_a_sequence() -> None:
    """Seven 1g jobs arriving one by one, then the GPU still fits what a naive packer loses."""
    placed: List[Tuple[str, int]] = []
    for _ in range(3):
        start = best_placement(H100, "1g.10gb", placed)
        assert start is not None
        placed.append(("1g.10gb", start))
    # three 1g placed: a 4g.40gb must still fit at 0
    assert can_place(H100, H100.profile("4g.40gb"), placed) == [0]  # type: ignore[arg-type]
    naive = [("1g.10gb", 0), ("1g.10gb", 1), ("1g.10gb", 2)]
    assert capacity(H100, naive)["4g.40gb"] == 0
