"""Read a node's MIG state into plan inputs, and execute a :class:`~slurmiso.mig.plan.MigPlan`.

Side effects live here, decisions in :mod:`slurmiso.mig.plan`. Each executed step is one
journal line, so an apply interrupted halfway is visible in ``slurmiso audit`` and the next
apply (which re-reads the node and plans again) simply finishes the job.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Dict, List, Mapping, Optional, Tuple, cast

from slurmiso.gpu import holders
from slurmiso.gpu.backend import (
    DeviceInfo,
    GpuBackend,
    MigInstance,
    MigModeSetter,
    create_mig_device,
    destroy_mig_device,
)
from slurmiso.mig import mode
from slurmiso.mig.plan import CREATE, DESTROY, ENABLE_MIG, Existing, MigPlan, MigPlanError, Step

if TYPE_CHECKING:
    from slurmiso.state import Journal

log = logging.getLogger(__name__)

#: Allocation-table key of a MIG device held by a job (the handlers claim it).


@dataclass
class NodeMig:
    """A snapshot of a node's GPUs and MIG instances, with who uses each instance."""

    devices: List[DeviceInfo]
    instances: List[MigInstance]
    existing: Dict[int, List[Existing]] = field(default_factory=dict)
    mig_enabled: Dict[int, bool] = field(default_factory=dict)
    busy: Dict[int, str] = field(default_factory=dict)


def read_node(backend: GpuBackend, claims: Mapping[Tuple[int, int], str]) -> NodeMig:
    """Snapshot ``backend``; ``claims`` from :func:`claimed_instances` marks jobs' devices."""
    devices = backend.devices()
    instances = backend.instances()
    procs = backend.processes()
    snap = NodeMig(devices, instances)
    for dev in devices:
        snap.mig_enabled[dev.index] = dev.mig_enabled
        snap.existing[dev.index] = []
        on_gpu = [p.pid for p in procs if p.gpu_index == dev.index]
        n_inst = sum(1 for i in instances if i.gpu_index == dev.index)
        reasons = []
        if n_inst:
            reasons.append(f"{n_inst} MIG instance(s) exist")
        if on_gpu:
            reasons.append(f"pid(s) {', '.join(map(str, on_gpu))} run on it")
        snap.busy[dev.index] = " and ".join(reasons)
    for inst in instances:
        pids = [p.pid for p in procs if inst.uuid and p.mig_uuid == inst.uuid]
        job = claims.get((inst.gpu_index, inst.gi_id), "")
        holders = ([f"job {job}"] if job else []) + (
            [f"pid(s) {', '.join(map(str, pids))}"] if pids else []
        )
        snap.existing.setdefault(inst.gpu_index, []).append(
            Existing(
                inst.profile,
                inst.placement_start,
                inst.gi_id,
                in_use=bool(holders),
                holder=" and ".join(holders),
                complete=inst.ci_id is not None,
            )
        )
    return snap


def check_applicable(plan: MigPlan, backend: GpuBackend, enable_mig: bool) -> None:
    """Raise :class:`MigPlanError` unless ``plan`` may be executed as it stands."""
    if plan.problems:
        raise MigPlanError(
            f"MIG layout {plan.layout!r} cannot be applied:\n  " + "\n  ".join(plan.problems)
        )
    need = [g.gpu for g in plan.gpus if g.needs_mig_enable]
    if not need:
        return
    gpus = ", ".join(map(str, need))
    how_to = "; ".join(mode.how(g, backend.device(g).architecture) for g in need)
    if not enable_mig:
        raise MigPlanError(
            f"MIG mode is disabled on GPU(s) {gpus} but layout {plan.layout!r} enables it",
            hint=f"changing MIG mode is an admin action: {how_to}; or pass --enable-mig "
            "where the backend can set the mode (simulated GPUs)",
        )
    if not backend.capabilities.set_mig_mode:
        raise MigPlanError(
            f"--enable-mig: the {backend.name} backend cannot change MIG mode",
            hint=how_to,
        )


def apply_plan(
    backend: GpuBackend,
    plan: MigPlan,
    journal: Optional[Journal] = None,
    dry_run: bool = False,
    enable_mig: bool = False,
) -> List[Step]:
    """Execute ``plan`` (destroy CI then GI, create GI then CI); return the steps done.

    ``dry_run`` checks and returns the steps without touching anything. The caller holds the
    node lock, so no prolog claims an instance between planning and acting.
    """
    check_applicable(plan, backend, enable_mig)
    if dry_run:
        return list(plan.steps)
    done: List[Step] = []
    for step in plan.steps:
        _execute(backend, plan, step, journal)
        done.append(step)
    return done


def _execute(
    backend: GpuBackend, plan: MigPlan, step: Step, journal: Optional[Journal]
) -> None:
    fields: Dict[str, object] = {"layout": plan.layout, "gpu": step.gpu}
    if step.op == ENABLE_MIG:
        cast(MigModeSetter, backend).set_mig_mode(step.gpu, True)  # declared capability
        event = "mig.enable"
    elif step.op == DESTROY:
        inst = _find(backend, step)
        destroy_mig_device(backend, inst)
        fields.update(profile=inst.profile, start=inst.placement_start, gi=inst.gi_id,
                      uuid=inst.uuid)
        event = "mig.destroy"
    elif step.op == CREATE:
        inst = create_mig_device(backend, step.gpu, step.profile, step.start)
        fields.update(profile=inst.profile, start=inst.placement_start, gi=inst.gi_id,
                      ci=inst.ci_id, uuid=inst.uuid)
        event = "mig.create"
    else:  # pragma: no cover - plan only makes the three ops
        raise MigPlanError(f"unknown plan step {step.op!r}")
    log.info("%s", step.describe())
    if journal is not None:
        journal.append(event, **fields)


def _find(backend: GpuBackend, step: Step) -> MigInstance:
    """The instance a destroy step means, checked against what was planned."""
    for inst in backend.instances(step.gpu):
        if inst.gi_id == step.gi_id:
            if (inst.profile, inst.placement_start) != (step.profile, step.start):
                break
            return inst
    raise MigPlanError(
        f"GPU {step.gpu}: GI {step.gi_id} ({step.profile} at slice {step.start}) changed "
        "while the plan was applied",
        hint="something outside slurmiso changes MIG instances; run 'slurmiso mig apply' again",
    )


def mode_changes(plan: MigPlan) -> List[Tuple[int, bool]]:
    """GPUs whose MIG mode the layout changes: (gpu, enable)."""
    return [(g.gpu, g.mig_wanted) for g in plan.gpus
            if g.covered and g.mig_wanted != g.mig_enabled]


def mode_change_advice(
    backend: GpuBackend, plan: MigPlan, proc_root: str = "/proc", dev_root: str = "/dev"
) -> List[str]:
    """Before a re-layout that switches MIG mode: per GPU, whether a reset is needed (by
    architecture) and what holds the GPU now (compute processes, device-file holders such
    as nvidia-persistenced, DCGM or a display server). Empty when no mode changes."""
    changes = mode_changes(plan)
    if not changes:
        return []
    found = holders.scan(proc_root, dev_root, exclude=(os.getpid(),))
    devices = {d.index: d for d in backend.devices()}
    procs = backend.processes()
    out: List[str] = []
    for gpu, enable in changes:
        dev = devices.get(gpu)
        out += mode.advice(gpu, dev.architecture if dev else "",
                           holders.on_gpu(found, dev.minor if dev else gpu), procs,
                           enable, found.unreadable)
    return out
