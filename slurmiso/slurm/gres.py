"""Slurm GRES strings, read one way everywhere.

Slurm prints GRES in several places and spellings: ``scontrol show node``'s ``Gres=``
(``gpu:h100:2(S:0-1),mps:h100:200``), ``GresUsed=`` (``gpu:h100:1(IDX:0,2)``), squeue's
``tres-per-node`` (``gres:gpu:3g.40gb:1``, ``gres/gpu:1``), a job's ``--gres`` (``gpu``,
``shard:3``), and ``(null)`` or ``N/A`` for none. An item is ``name[:type][:count]``; a
missing count is 1. Doctor, the monitor, the audit and the report all read them here.
"""

from __future__ import annotations

import re
from typing import Dict, List, NamedTuple

#: ``(S:0-1)``, ``(IDX:0,2)``: socket and index suffixes, which may contain commas.
_SUFFIX = re.compile(r"\([^)]*\)")
_NONE = ("", "N/A", "null", "none")


class GresItem(NamedTuple):
    name: str
    type: str  # "" when untyped
    number: int  # the count (``count`` would hide tuple.count)


def parse_gres(value: str) -> List[GresItem]:
    """Every item of a GRES string: ``gpu:3g.40gb:3(S:0),mps:200`` ->
    [("gpu", "3g.40gb", 3), ("mps", "", 200)]. Unparseable items are skipped."""
    out: List[GresItem] = []
    for raw in _SUFFIX.sub("", value or "").split(","):
        item = raw.strip()
        if item.startswith(("gres:", "gres/")):
            item = item[5:]
        parts = item.split(":")
        name = parts[0]
        if name in _NONE or not name[0].isalpha() or len(parts) > 3:
            continue
        if len(parts) == 3:
            gtype, count = parts[1], parts[2]
        elif len(parts) == 2 and not parts[1].isdigit():
            gtype, count = parts[1], "1"
        else:
            gtype, count = "", parts[1] if len(parts) == 2 else "1"
        if not count.isdigit():
            continue
        out.append(GresItem(name, gtype, int(count)))
    return out


def gres_counts(value: str) -> Dict[str, int]:
    """Counts by GRES name, types summed: ``gres:gpu:a100:2,gres:shard:3`` ->
    {"gpu": 2, "shard": 3}."""
    out: Dict[str, int] = {}
    for item in parse_gres(value):
        out[item.name] = out.get(item.name, 0) + item.number
    return out


def gpu_types(value: str) -> Dict[str, int]:
    """Typed GPU counts: ``gpu:3g.40gb:3,gpu:4g.40gb:1(S:0)`` -> {"3g.40gb": 3, "4g.40gb": 1};
    untyped GPUs are left out."""
    out: Dict[str, int] = {}
    for item in parse_gres(value):
        if item.name == "gpu" and item.type:
            out[item.type] = out.get(item.type, 0) + item.number
    return out
