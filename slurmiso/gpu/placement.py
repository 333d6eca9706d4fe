"""Pure MIG placement logic: does a layout fit, and where should the next instance go.

Used by the config validator (a declared layout must be placeable), by ``mig apply`` (lay out a
GPU) and by the mig-dynamic prolog (choose the start that keeps the largest profiles possible
for later jobs). No hardware here: the inputs are a :class:`GpuModel` and occupied spans.
"""

from __future__ import annotations

from typing import Dict, List, Mapping, Optional, Sequence, Tuple

from slurmiso.gpu.profiles import GpuModel, MigProfile, free_placements

#: An existing instance: (profile name, start memory slice).
Placed = Tuple[str, int]


def _spans(model: GpuModel, placed: Sequence[Placed]) -> List[Tuple[int, int]]:
    out = []
    for name, start in placed:
        prof = model.profile(name)
        if prof is None:
            raise ValueError(f"{model.name} has no MIG profile {name!r}")
        out.append((start, prof.memory_slices))
    return out


def _compute_used(model: GpuModel, placed: Sequence[Placed]) -> int:
    total = 0
    for name, _ in placed:
        prof = model.profile(name)
        total += prof.compute_slices if prof else 0
    return total


def can_place(model: GpuModel, profile: MigProfile, placed: Sequence[Placed]) -> List[int]:
    """Legal free starts for ``profile`` beside ``placed``, honouring every NVML budget."""
    if _compute_used(model, placed) + profile.compute_slices > model.compute_slices:
        return []
    if sum(1 for n, _ in placed if n == profile.name) >= profile.max_instances:
        return []
    return free_placements(model, profile, _spans(model, placed))


def pack(
    model: GpuModel, counts: Mapping[str, int], placed: Sequence[Placed] = ()
) -> Optional[List[Placed]]:
    """Placements for ``counts`` more instances beside ``placed``, or None if impossible.

    Backtracking, largest profiles first: the search space is tiny (at most 7 instances on 8
    slices), and an exact answer beats a greedy one that rejects a layout NVML would accept.
    """
    todo: List[MigProfile] = []
    for name, n in counts.items():
        prof = model.profile(name)
        if prof is None:
            raise ValueError(f"{model.name} has no MIG profile {name!r}")
        todo.extend([prof] * int(n))
    todo.sort(key=lambda p: (-p.memory_slices, -p.compute_slices, p.name))

    def solve(i: int, cur: List[Placed]) -> Optional[List[Placed]]:
        if i == len(todo):
            return cur
        prev_start = -1
        if i > 0 and todo[i - 1] is todo[i]:  # same profile: keep starts increasing
            prev_start = cur[-1][1]
        for start in can_place(model, todo[i], cur):
            if start <= prev_start:
                continue
            found = solve(i + 1, cur + [(todo[i].name, start)])
            if found is not None:
                return found
        return None

    result = solve(0, list(placed))
    return None if result is None else result[len(placed) :]


def capacity(model: GpuModel, placed: Sequence[Placed]) -> Dict[str, int]:
    """How many more instances of each profile (alone) would still fit beside ``placed``."""
    out: Dict[str, int] = {}
    for prof in model.profiles:
        n = 0
        cur = list(placed)
        while True:
            starts = can_place(model, prof, cur)
            if not starts:
                break
            cur.append((prof.name, starts[0]))
            n += 1
        out[prof.name] = n
    return out


def best_placement(model: GpuModel, profile: str, placed: Sequence[Placed]) -> Optional[int]:
    """The start for a new ``profile`` instance that keeps the largest profiles possible later.

    Each free start is scored by the capacity left for every profile, largest profiles first
    (lexicographic); ties go to the highest start, which packs small instances at the end of
    the GPU, where the big profiles cannot be placed anyway.
    """
    prof = model.profile(profile)
    if prof is None:
        raise ValueError(f"{model.name} has no MIG profile {profile!r}")
    starts = can_place(model, prof, placed)
    if not starts:
        return None
    ranked = sorted(
        (p for p in model.profiles if not p.media_engines),
        key=lambda p: (-p.memory_slices, -p.compute_slices),
    )

    def score(start: int) -> Tuple[Tuple[int, ...], int]:
        left = capacity(model, list(placed) + [(prof.name, start)])
        return tuple(left[p.name] for p in ranked), start

    return max(starts, key=score)
