"""slurmiso.slurm.gres: every spelling of GRES that Slurm prints, read one way."""

from __future__ import annotations

from typing import Dict, List, Tuple

import pytest

from slurmiso.slurm.gres import gpu_types, gres_counts, parse_gres


@pytest.mark.parametrize("value,items", [
    ("gpu:3g.40gb:3,gpu:4g.40gb:1", [("gpu", "3g.40gb", 3), ("gpu", "4g.40gb", 1)]),
    ("gpu:h100:2(S:0-1),mps:h100:200", [("gpu", "h100", 2), ("mps", "h100", 200)]),
    ("gpu:h100:2(IDX:0,2),shard:3", [("gpu", "h100", 2), ("shard", "", 3)]),  # comma in suffix
    ("gpu:2,shard:14", [("gpu", "", 2), ("shard", "", 14)]),
    ("gres:gpu:a100:2,gres:shard:3", [("gpu", "a100", 2), ("shard", "", 3)]),  # squeue
    ("gres/gpu:3g.40gb:1", [("gpu", "3g.40gb", 1)]),
    ("gpu:a100", [("gpu", "a100", 1)]),  # a type without a count is one
    ("gres:gpu", [("gpu", "", 1)]),
    ("gpu:a100:x,gpu:1:2:3:4", []),  # not GRES: skipped, never a crash
    ("(null)", []), ("N/A", []), ("", []),
])
def test_parse_gres(value: str, items: List[Tuple[str, str, int]]) -> None:
    assert [tuple(i) for i in parse_gres(value)] == items


@pytest.mark.parametrize("value,counts,types", [
    ("gres:gpu:a100:2,gres:shard:3", {"gpu": 2, "shard": 3}, {"a100": 2}),
    ("gpu:3g.40gb:3,gpu:4g.40gb:1(S:0),gpu:1", {"gpu": 5}, {"3g.40gb": 3, "4g.40gb": 1}),
    ("gpu:2(S:0-1),mps:50", {"gpu": 2, "mps": 50}, {}),
])
def test_counts_and_gpu_types(value: str, counts: Dict[str, int], types: Dict[str, int]) -> None:
    assert gres_counts(value) == counts
    assert gpu_types(value) == types
