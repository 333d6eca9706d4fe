"""MIG profile catalogues and placement rules of the GPU models slurmiso knows.

These tables are what NVML reports (``nvmlDeviceGetGpuInstanceProfileInfo`` and
``nvmlDeviceGetGpuInstancePossiblePlacements``) on each model; the simulated backend plays them
and the config validator checks profile names against them. Placements are counted in *memory*
slices (8 on 7-compute-slice parts, 4 on A30): a profile at start ``s`` with ``size`` memory slices
occupies ``[s, s+size)``. Compute slices (7 or 4) are a second budget.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Set, Tuple

from slurmiso.values import Value


class MigProfile(Value, eq=True):
    """One GPU instance profile as NVML describes it."""

    name: str  # e.g. "3g.40gb"
    profile_id: int  # nvidia-smi "ID" column (e.g. 9 for 3g.40gb on A100-80GB)
    compute_slices: int  # sevenths (quarters on A30) of the SMs
    memory_slices: int  # eighths (quarters on A30) of the memory
    memory_mb: int
    max_instances: int  # instances of this profile alone on an empty GPU
    placements: Tuple[int, ...]  # allowed start memory slices
    media_engines: bool = False  # "+me" variants

    @property
    def compute_fraction(self) -> float:
        return self.compute_slices / 7.0


class GpuModel(Value, eq=True):
    """A GPU model: identity, memory and its MIG catalogue (empty when MIG is unsupported)."""

    name: str  # canonical short name used in configs: "H100-80GB"
    product_name: str  # what NVML's nvmlDeviceGetName returns
    memory_mb: int
    sm_count: int
    compute_slices: int
    memory_slices: int
    profiles: Tuple[MigProfile, ...]

    def profile(self, name: str) -> Optional[MigProfile]:
        for p in self.profiles:
            if p.name == name:
                return p
        return None

    @property
    def profile_names(self) -> List[str]:
        return [p.name for p in self.profiles]


def _p(name: str, pid: int, c: int, m: int, mem_mb: int, n: int, pl: Tuple[int, ...]) -> MigProfile:
    return MigProfile(name, pid, c, m, mem_mb, n, pl, media_engines=name.endswith("+me"))


_SEVEN = {
    # kind: (compute, memory slices, placements)
    "1g": (1, 1, (0, 1, 2, 3, 4, 5, 6)),
    "1g+me": (1, 1, (0, 1, 2, 3, 4, 5, 6)),
    "1g2": (1, 2, (0, 2, 4, 6)),
    "2g": (2, 2, (0, 2, 4)),
    "3g": (3, 4, (0, 4)),
    "4g": (4, 4, (0,)),
    "7g": (7, 8, (0,)),
}


def _seven_slice(mem_mb: int, names: Dict[str, str], per_slice_mb: int) -> Tuple[MigProfile, ...]:
    """Catalogue of a 7-compute/8-memory-slice part (A100, H100, H200)."""
    ids = {"1g": 19, "1g+me": 20, "1g2": 15, "2g": 14, "3g": 9, "4g": 5, "7g": 0}
    maxn = {"1g": 7, "1g+me": 1, "1g2": 4, "2g": 3, "3g": 2, "4g": 1, "7g": 1}
    out = []
    for kind in ("1g", "1g+me", "1g2", "2g", "3g", "4g", "7g"):
        c, m, pl = _SEVEN[kind]
        mb = mem_mb if kind == "7g" else m * per_slice_mb
        out.append(_p(names[kind], ids[kind], c, m, mb, maxn[kind], pl))
    return tuple(out)


def _names(small: int, double: int, three: int, full: int) -> Dict[str, str]:
    return {
        "1g": f"1g.{small}gb",
        "1g+me": f"1g.{small}gb+me",
        "1g2": f"1g.{double}gb",
        "2g": f"2g.{double}gb",
        "3g": f"3g.{three}gb",
        "4g": f"4g.{three}gb",
        "7g": f"7g.{full}gb",
    }


MODELS: Dict[str, GpuModel] = {
    m.name: m
    for m in (
        GpuModel(
            "A100-40GB",
            "NVIDIA A100-SXM4-40GB",
            40960,
            108,
            7,
            8,
            _seven_slice(40960, _names(5, 10, 20, 40), 4864),
        ),
        GpuModel(
            "A100-80GB",
            "NVIDIA A100-SXM4-80GB",
            81920,
            108,
            7,
            8,
            _seven_slice(81920, _names(10, 20, 40, 80), 9856),
        ),
        GpuModel(
            "H100-80GB",
            "NVIDIA H100 80GB HBM3",
            81559,
            132,
            7,
            8,
            _seven_slice(81559, _names(10, 20, 40, 80), 9856),
        ),
        GpuModel(
            "H200-141GB",
            "NVIDIA H200",
            143771,
            132,
            7,
            8,
            _seven_slice(143771, _names(18, 35, 71, 141), 17920),
        ),
        GpuModel(
            "A30-24GB",
            "NVIDIA A30",
            24576,
            56,
            4,
            4,
            (
                _p("1g.6gb", 14, 1, 1, 5836, 4, (0, 1, 2, 3)),
                _p("1g.6gb+me", 21, 1, 1, 5836, 1, (0, 1, 2, 3)),
                _p("2g.12gb", 5, 2, 2, 11904, 2, (0, 2)),
                _p("2g.12gb+me", 6, 2, 2, 11904, 1, (0, 2)),
                _p("4g.24gb", 0, 4, 4, 24576, 1, (0,)),
            ),
        ),
    )
}

#: Accepted spellings of model names (configs and ``sim init --model``).
ALIASES: Dict[str, str] = {
    "A100": "A100-40GB",
    "A100-SXM4-40GB": "A100-40GB",
    "A100-SXM4-80GB": "A100-80GB",
    "H100": "H100-80GB",
    "H200": "H200-141GB",
    "A30": "A30-24GB",
}


def lookup_model(name: str) -> Optional[GpuModel]:
    """Model by canonical name, alias or NVML product name (case-insensitive)."""
    key = name.strip()
    for cand in (key, ALIASES.get(key, ""), ALIASES.get(key.upper(), "")):
        if cand in MODELS:
            return MODELS[cand]
    low = key.lower()
    for m in MODELS.values():
        if low in (m.name.lower(), m.product_name.lower()):
            return m
    return None


def span(profile: MigProfile, start: int) -> range:
    """Memory slices occupied by ``profile`` placed at ``start``."""
    return range(start, start + profile.memory_slices)


def free_placements(
    model: GpuModel, profile: MigProfile, occupied: List[Tuple[int, int]]
) -> List[int]:
    """Start slices where ``profile`` fits beside ``occupied`` ``(start, size)`` memory spans.

    Only the memory-slice geometry; the compute-slice budget and per-profile instance limits
    are the caller's second check (see the sim backend).
    """
    used: Set[int] = set()
    for start, size in occupied:
        used.update(range(start, start + size))
    return [
        s
        for s in profile.placements
        if s + profile.memory_slices <= model.memory_slices
        and not used.intersection(span(profile, s))
    ]
