"""GPU models and their MIG profile catalogues, as values, with the placement geometry.

The tables themselves (which model has which profiles, and where NVIDIA publishes them) are in
:mod:`slurmiso.gpu.catalogue`; ``MODELS`` and ``ALIASES`` are re-exported here on first use,
so code that only names the value classes does not build the catalogue.

A profile's numbers are what NVML reports (``nvmlDeviceGetGpuInstanceProfileInfo`` and
``nvmlDeviceGetGpuInstancePossiblePlacements``) on each model; the simulated backend plays
them and the config validator checks profile names against them. Placements are counted in
*memory* slices (8 on 7-compute-slice parts, 4 on A30 and RTX PRO 6000): a profile at start
``s`` with ``size`` memory slices occupies ``[s, s+size)``. Compute slices are a second budget.

A model with no profiles is a GPU without MIG (L40S, L4, ...): known only for its name and
memory. A GPU slurmiso has no entry for at all still works in exclusive, mps and timeslice
pools; the node's backend reports its name and memory.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence, Set, Tuple

from slurmiso.values import Value, as_dict

if TYPE_CHECKING:
    from slurmiso.gpu.catalogue import ALIASES as ALIASES
    from slurmiso.gpu.catalogue import MODELS as MODELS

#: Architectures that switch MIG mode only through a GPU reset (NVIDIA's k8s-dra-driver-gpu
#: ``supportsMIGModeToggle``: Hopper and later toggle without one; the MIG user guide: "the
#: driver will attempt to reset the GPU", A100/A30 in VMs need a reboot).
RESET_FOR_MIG_MODE = {"ampere": True, "hopper": False, "blackwell": False}


def __getattr__(name: str) -> Any:
    """``MODELS`` and ``ALIASES``, built on first use (a hook that never looks up a model
    never builds them)."""
    if name in ("MODELS", "ALIASES"):
        from slurmiso.gpu import catalogue

        return getattr(catalogue, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class MigProfile(Value, eq=True):
    """One GPU instance profile as NVML describes it."""

    name: str  # e.g. "3g.40gb"
    profile_id: int  # nvidia-smi "ID" column (9 for 3g.40gb on A100-80GB); -1 = not published
    compute_slices: int  # sevenths (quarters on A30) of the SMs
    memory_slices: int  # eighths (quarters on A30) of the memory
    memory_mb: int
    max_instances: int  # instances of this profile alone on an empty GPU
    placements: Tuple[int, ...]  # allowed start memory slices
    media_engines: bool = False  # "+me" / "+me.all" variants

    @property
    def compute_fraction(self) -> float:
        return self.compute_slices / 7.0

    def to_dict(self) -> Dict[str, Any]:
        return as_dict(self)


class GpuModel(Value, eq=True):
    """A GPU model: identity, memory and its MIG catalogue (empty when MIG is unsupported)."""

    name: str  # canonical short name used in configs: "H100-80GB"
    product_name: str  # what NVML's nvmlDeviceGetName returns
    memory_mb: int
    sm_count: int
    compute_slices: int
    memory_slices: int
    profiles: Tuple[MigProfile, ...]
    architecture: str = ""  # "ampere", "hopper", "blackwell", "ada", ... ("" unknown)
    #: Where the MIG table comes from (document and section); "" for models without MIG.
    source: str = ""

    def profile(self, name: str) -> Optional[MigProfile]:
        for p in self.profiles:
            if p.name == name:
                return p
        return None

    @property
    def profile_names(self) -> List[str]:
        return [p.name for p in self.profiles]

    @property
    def mig_capable(self) -> bool:
        return bool(self.profiles)


def lookup_model(name: str) -> Optional[GpuModel]:
    """Model by canonical name, alias or NVML product name (case-insensitive)."""
    from slurmiso.gpu import catalogue as cat

    key = name.strip()
    if key in cat.MODELS:
        return cat.MODELS[key]
    low = key.lower()
    alias = cat.LOWER_ALIASES.get(low)
    if alias:
        return cat.MODELS[alias]
    for m in cat.MODELS.values():
        if low in (m.name.lower(), m.product_name.lower()):
            return m
    return None


def mig_models() -> List[GpuModel]:
    """The catalogue's MIG-capable models, in catalogue order."""
    from slurmiso.gpu import catalogue

    return [m for m in catalogue.MODELS.values() if m.profiles]


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


def model_from_driver(
    product_name: str, memory_mb: int, found: Sequence[MigProfile], architecture: str = ""
) -> GpuModel:
    """A :class:`GpuModel` from what a node's driver reports (``slurmiso mig show
    --profiles``), for a GPU the catalogue lacks: the entry to add to it.

    The slice budgets are those of the largest profile (the whole GPU), so placement checks
    hold as NVML states them.
    """
    compute = max((p.compute_slices for p in found), default=0)
    memory = max((s + p.memory_slices for p in found for s in p.placements), default=0)
    short = product_name.replace("NVIDIA ", "").strip().replace(" ", "-") or "GPU"
    return GpuModel(short, product_name, memory_mb, 0, compute, memory, tuple(found),
                    architecture=architecture, source="the node's driver (NVML)")
