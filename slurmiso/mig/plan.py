"""What must change on a node to reach a MIG layout (pure: no backend, no I/O).

mig-parted's rule, assert then act: an instance that already matches the layout is kept, so
planning against a node that matches yields no step and a second ``mig apply`` is a no-op.
Missing instances are placed with :func:`slurmiso.gpu.placement.pack` beside the kept ones;
when the kept ones block every packing, the GPU's *unused* instances are destroyed and laid out
again. An instance in use (processes, or claimed by a job) is never planned for destruction:
that is a problem naming who holds it, and ``apply`` refuses a plan with problems.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any, Dict, List, Mapping, NamedTuple, Optional, Sequence, Tuple

from slurmiso.config.model import MigGroup, MigLayout
from slurmiso.errors import SlurmisoError
from slurmiso.gpu.placement import pack
from slurmiso.gpu.profiles import GpuModel
from slurmiso.mig.mode import how

CREATE, DESTROY, ENABLE_MIG = "create", "destroy", "enable-mig"


class MigPlanError(SlurmisoError):
    """A plan that cannot be applied as it stands (in-use instances, MIG mode, no packing)."""

    kind = "mig-plan"


class Existing(NamedTuple):
    """An instance found on a GPU; plain ``(profile, start, gi_id, in_use)`` tuples also do."""

    profile: str
    start: int
    gi_id: int
    in_use: bool = False
    holder: str = ""  # who uses it, for messages: "job 42", "pids 311, 312"
    complete: bool = True  # has its compute instance (a GI alone is a half-made device)


@dataclass(frozen=True)
class Step:
    """One change: ``create`` a GI+CI, ``destroy`` CI+GI, or ``enable-mig`` on a GPU."""

    op: str
    gpu: int
    profile: str = ""
    start: int = -1
    gi_id: Optional[int] = None

    def describe(self) -> str:
        if self.op == CREATE:
            return f"GPU {self.gpu}: create {self.profile} at slice {self.start}"
        if self.op == DESTROY:
            return f"GPU {self.gpu}: destroy GI {self.gi_id} ({self.profile} at slice {self.start})"
        return f"GPU {self.gpu}: enable MIG mode"

    def to_dict(self) -> Dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class GpuPlan:
    gpu: int
    covered: bool  # the layout has a group for this GPU
    mig_wanted: bool
    mig_enabled: bool
    keep: Tuple[Existing, ...] = ()
    steps: Tuple[Step, ...] = ()
    problems: Tuple[str, ...] = ()

    @property
    def noop(self) -> bool:
        return not self.steps and not self.problems

    @property
    def needs_mig_enable(self) -> bool:
        return any(s.op == ENABLE_MIG for s in self.steps)


@dataclass(frozen=True)
class MigPlan:
    layout: str
    model: str
    gpus: Tuple[GpuPlan, ...] = field(default_factory=tuple)

    @property
    def steps(self) -> List[Step]:
        return [s for g in self.gpus for s in g.steps]

    @property
    def problems(self) -> List[str]:
        return [p for g in self.gpus for p in g.problems]

    @property
    def noop(self) -> bool:
        return all(g.noop for g in self.gpus)

    def differences(self) -> List[str]:
        """One line per way the node differs from the layout (what ``mig assert`` prints)."""
        lines = []
        for g in self.gpus:
            for s in g.steps:
                if s.op == CREATE:
                    lines.append(f"GPU {g.gpu}: missing {s.profile} at slice {s.start}")
                elif s.op == DESTROY:
                    lines.append(
                        f"GPU {g.gpu}: unexpected {s.profile} at slice {s.start} (GI {s.gi_id})"
                    )
                else:
                    lines.append(f"GPU {g.gpu}: MIG mode is disabled, the layout enables it")
            lines.extend(g.problems)
        return lines

    def to_dict(self) -> Dict[str, Any]:
        return {
            "layout": self.layout,
            "model": self.model,
            "noop": self.noop,
            "steps": [s.to_dict() for s in self.steps],
            "problems": self.problems,
            "gpus": [
                {
                    "gpu": g.gpu,
                    "covered": g.covered,
                    "mig_wanted": g.mig_wanted,
                    "mig_enabled": g.mig_enabled,
                    "keep": [e._asdict() for e in g.keep],
                }
                for g in self.gpus
            ],
        }


def plan_layout(
    model: GpuModel,
    layout: MigLayout,
    gpu_count: int,
    current: Mapping[int, Sequence[Any]],
    mig_enabled: Optional[Mapping[int, bool]] = None,
    busy: Optional[Mapping[int, str]] = None,
) -> MigPlan:
    """The plan that takes GPUs ``0..gpu_count-1`` from ``current`` to ``layout``.

    ``current[i]`` lists GPU ``i``'s instances as :class:`Existing` (or 4-6 tuples);
    ``mig_enabled[i]`` defaults to True; ``busy[i]`` says why GPU ``i`` cannot change MIG mode
    now ("" = idle).
    """
    plans = []
    for index in range(gpu_count):
        found = tuple(Existing(*e) for e in current.get(index, ()))
        plans.append(
            _plan_gpu(
                model,
                index,
                layout.for_device(index),
                found,
                True if mig_enabled is None else bool(mig_enabled.get(index, True)),
                "" if busy is None else busy.get(index, ""),
            )
        )
    return MigPlan(layout.name, model.name, tuple(plans))


def _plan_gpu(
    model: GpuModel,
    index: int,
    group: Optional[MigGroup],
    found: Tuple[Existing, ...],
    mig_on: bool,
    busy: str,
) -> GpuPlan:
    if group is None:  # not ours to lay out: leave it exactly as it is
        return GpuPlan(index, False, mig_on, mig_on, keep=found)
    if not group.mig_enabled:
        return _plan_mig_off(index, found, mig_on, model.architecture)
    counts = {name: n for name, n in group.counts().items() if n > 0}
    unknown = [name for name in counts if model.profile(name) is None]
    if unknown:
        return GpuPlan(index, True, True, mig_on, problems=(
            f"GPU {index}: {', '.join(unknown)} not a MIG profile of {model.name}",))
    if not mig_on:
        return _plan_mig_enable(model, index, counts, busy)

    keep, extras = _match(found, counts)
    creates = pack(model, _minus(counts, keep), [(e.profile, e.start) for e in keep])
    if creates is None:
        # The kept instances block the layout: lay the GPU out again around the in-use ones.
        pinned = [e for e in keep if e.in_use]
        loose = [e for e in keep if not e.in_use]
        full = pack(model, _minus(counts, pinned), [(e.profile, e.start) for e in pinned])
        if full is None:
            held = ", ".join(_show(e) for e in pinned) or "nothing"
            return GpuPlan(index, True, True, True, keep=tuple(keep), problems=(
                f"GPU {index}: cannot lay out {_counts_text(counts)} beside the instances "
                f"in use ({held}); wait for those jobs to end or drain the node",))
        reuse = [e for e in loose if (e.profile, e.start) in full]
        keep = pinned + reuse
        extras = extras + [e for e in loose if e not in reuse]
        creates = [c for c in full if c not in {(e.profile, e.start) for e in reuse}]
    return _finish(index, keep, extras, creates)


def _plan_mig_off(
    index: int, found: Tuple[Existing, ...], mig_on: bool, architecture: str = ""
) -> GpuPlan:
    if not mig_on:
        return GpuPlan(index, True, False, False)
    destroys = tuple(_destroy(index, e) for e in found)
    problems = [_in_use_problem(index, e) for e in found if e.in_use]
    problems.append(
        f"GPU {index}: the layout disables MIG but it is enabled; slurmiso never disables MIG: "
        + how(index, architecture, enable=False)
    )
    return GpuPlan(index, True, False, True, steps=destroys, problems=tuple(problems))


def _plan_mig_enable(model: GpuModel, index: int, counts: Dict[str, int], busy: str) -> GpuPlan:
    creates = pack(model, counts)
    problems = []
    if creates is None:
        problems.append(f"GPU {index}: {_counts_text(counts)} does not fit on a {model.name}")
        creates = []
    if busy:
        problems.append(
            f"GPU {index}: MIG mode is disabled and cannot be enabled now: {busy}; "
            "drain the node and wait until the GPU is idle; then "
            + how(index, model.architecture).split(": ", 1)[1]
        )
    steps = (Step(ENABLE_MIG, index),) + tuple(
        Step(CREATE, index, p, s) for p, s in sorted(creates, key=lambda c: c[1])
    )
    return GpuPlan(index, True, True, False, steps=steps, problems=tuple(problems))


def _finish(
    index: int, keep: List[Existing], extras: List[Existing], creates: Sequence[Tuple[str, int]]
) -> GpuPlan:
    problems = tuple(_in_use_problem(index, e) for e in extras if e.in_use)
    steps = tuple(_destroy(index, e) for e in sorted(extras, key=lambda e: e.start)) + tuple(
        Step(CREATE, index, p, s) for p, s in sorted(creates, key=lambda c: c[1])
    )
    keep_sorted = tuple(sorted(keep, key=lambda e: e.start))
    return GpuPlan(index, True, True, True, keep=keep_sorted, steps=steps, problems=problems)


def _match(
    found: Tuple[Existing, ...], counts: Mapping[str, int]
) -> Tuple[List[Existing], List[Existing]]:
    """Split ``found`` into instances the layout keeps and extras (in-use ones kept first)."""
    left = dict(counts)
    keep, extras = [], []
    for e in sorted(found, key=lambda e: (not e.in_use, not e.complete, e.start)):
        if e.complete and left.get(e.profile, 0) > 0:
            left[e.profile] -= 1
            keep.append(e)
        else:
            extras.append(e)
    return keep, extras


def _minus(counts: Mapping[str, int], have: Sequence[Existing]) -> Dict[str, int]:
    left = Counter(counts)
    left.subtract(Counter(e.profile for e in have))
    return {k: v for k, v in left.items() if v > 0}


def _destroy(index: int, e: Existing) -> Step:
    return Step(DESTROY, index, e.profile, e.start, e.gi_id)


def _in_use_problem(index: int, e: Existing) -> str:
    return (
        f"GPU {index}: {_show(e)} must go for this layout but is in use by "
        f"{e.holder or 'a job'}; wait for it to end (or drain the node) and apply again"
    )


def _show(e: Existing) -> str:
    return f"GI {e.gi_id} ({e.profile} at slice {e.start})"


def _counts_text(counts: Mapping[str, int]) -> str:
    return ", ".join(f"{n}x {p}" for p, n in sorted(counts.items()))
