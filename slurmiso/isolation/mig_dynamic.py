"""mig-dynamic: the prolog carves a MIG device for the job, the epilog destroys it.

Slurm schedules ``gres/shard`` on a GPU and says nothing of MIG (it does not support dynamic
MIG), so the profile comes from the job's class or a validated ``--iso-mig-profile``, and the
placement from :func:`~slurmiso.gpu.placement.best_placement`, which keeps the GPU able to
take large profiles later. Intent is recorded before the GPU is touched, so an epilog after a
prolog killed halfway finds (and destroys) what may have been created.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Dict, Iterable, List, Optional, Set, Tuple

from slurmiso.errors import GpuInsufficientResources, GpuInUse, GpuNotFound, JobProblem, NodeFault
from slurmiso.gpu.backend import MigInstance, create_mig_device, destroy_mig_device
from slurmiso.gpu.placement import best_placement, capacity
from slurmiso.gpu.profiles import GpuModel, lookup_model
from slurmiso.isolation import processes
from slurmiso.isolation.base import Context, ReconcileContext
from slurmiso.mig.claims import claim_key, claimed_instances
from slurmiso.state.record import JobRecord, Resource, ResourceState

if TYPE_CHECKING:  # the protocols are costly to define; hooks only annotate with them
    from slurmiso.gpu.protocols import GpuBackend

log = logging.getLogger(__name__)
KIND = "mig-dynamic"
READY, PENDING, RELEASED = ResourceState.READY, ResourceState.PENDING, ResourceState.RELEASED


def choose_profile(ctx: Context, model: GpuModel) -> str:
    """The job's profile: a validated ``--iso-mig-profile``, else its class's (JobProblem)."""
    requested = ctx.env.spank.get("iso_mig_profile", "")
    cls = ctx.job_class
    class_prof = cls.mig_profile_for(model.name) if cls else ""
    if requested:
        prof = model.profile(requested)
        if prof is None:
            raise JobProblem(
                f"--iso-mig-profile={requested} is not a MIG profile of {model.name}",
                hint=f"choose one of {', '.join(model.profile_names)}",
            )
        limit = model.profile(class_prof) if class_prof else None
        if limit is not None and prof.compute_slices > limit.compute_slices:
            raise JobProblem(
                f"--iso-mig-profile={requested} is larger than class {cls.name if cls else ''}'s "
                f"{class_prof}",
                hint=f"ask for {class_prof} or smaller, or submit with a class that allows more",
            )
        return requested
    if not class_prof:
        who = f"class {cls.name}" if cls else "the job (no class)"
        raise JobProblem(
            f"{who} has no MIG profile for {model.name}",
            hint="pass --iso-mig-profile=PROFILE or use a class with mig_profile",
        )
    if model.profile(class_prof) is None:
        raise JobProblem(f"class profile {class_prof} is not a MIG profile of {model.name}")
    return class_prof


def _describe(inst: MigInstance) -> str:
    end = inst.placement_start + inst.placement_size - 1
    return f"{inst.profile} (GI {inst.gi_id}) at slices {inst.placement_start}-{end}"


def _no_fit(model: GpuModel, gpu: int, profile: str, insts: List[MigInstance]) -> JobProblem:
    placed = [(i.profile, i.placement_start) for i in insts]
    left = capacity(model, placed)
    fits = ", ".join(f"{p} x{n}" for p, n in left.items() if n and not p.endswith("+me"))
    return JobProblem(
        f"profile {profile} does not fit on GPU {gpu} now: occupied "
        f"{', '.join(_describe(i) for i in insts) or 'nothing'}; free placements for "
        f"{profile}: none; still fits: {fits or 'nothing'}",
        hint="resubmit with a smaller --iso-mig-profile, or wait for jobs on that GPU to end",
    )


def _guarded_spots(state: Any, job_id: str) -> Tuple[Dict[Tuple[int, int], str],
                                                   Set[Tuple[int, int, str]]]:
    """What other jobs hold: claimed (gpu, gi) -> job, and their pending (gpu, start, profile)."""
    claims = claimed_instances(state)
    return claims, _others_pending(state.jobs(), job_id)


def _find(ctx: Context, backend: GpuBackend, res: Resource) -> Optional[MigInstance]:
    """The live instance a ready resource names, by GPU instance id alone.

    Not by UUID: a GI whose compute instance is gone (an epilog killed between the two
    destroys) has no UUID any more and must still be found. GI ids are reused, so an instance
    with our gi is ours only if it sits where we made it and no other job claims it or is
    creating one there; otherwise ours is already gone.
    """
    if res.gpu is None:
        return None
    claims, others = _guarded_spots(ctx.state, ctx.job_id)
    for inst in backend.instances(res.gpu):
        if inst.gi_id != res.gi:
            continue
        if (inst.profile, inst.placement_start) != (res.profile, res.start):
            return None
        holder = claims.get((inst.gpu_index, inst.gi_id))
        if holder and holder != ctx.job_id:
            return None
        if (inst.gpu_index, inst.placement_start, inst.profile) in others:
            return None
        return inst
    return None


def _occupied(ctx: Context, gpu: int, insts: List[MigInstance]) -> List[Tuple[str, int]]:
    """(profile, start) taken on ``gpu``: live instances plus other jobs' creations in flight
    (their intent is recorded; the driver call runs without the node lock)."""
    placed = [(i.profile, i.placement_start) for i in insts]
    for g, start, profile in _others_pending(ctx.state.jobs(), ctx.job_id):
        if g == gpu and (profile, start) not in placed:
            placed.append((profile, start))
    return placed


class MigDynamic:
    mode = KIND

    def setup(self, ctx: Context) -> None:
        backend = ctx.backend
        mine = [r for r in ctx.record.of_kind(KIND) if r.state is not RELEASED]
        if mine and all(r.state is READY and _find(ctx, backend, r) for r in mine):
            return  # already set up
        if mine:  # a setup cut short: undo it, then start again
            self._release(ctx, backend, mine)
        if not ctx.env.gpus:
            raise JobProblem(
                "the job holds no GPU on this mig-dynamic node",
                hint="request a GPU share with --gres=shard:N",
            )
        made: List[Resource] = []
        try:
            for gpu in ctx.env.gpus:
                made.append(self._create(ctx, backend, gpu))
        except JobProblem:
            self._release(ctx, backend, made)  # nothing left behind for a refused job
            ctx.release_claims()
            ctx.save()
            raise
        ctx.set_env("CUDA_VISIBLE_DEVICES", ",".join(r.uuid or "" for r in made))
        ctx.save()

    def _create(self, ctx: Context, backend: GpuBackend, gpu: int) -> Resource:
        dev = backend.device(gpu)
        if not dev.mig_enabled:
            raise NodeFault(
                f"GPU {gpu} has MIG disabled on mig-dynamic node {ctx.env.node}",
                hint=f"drain the node and enable MIG: nvidia-smi -i {gpu} -mig 1",
            )
        model = lookup_model(dev.model or ctx.pool.gpu_model)
        if model is None or not model.profiles:
            raise NodeFault(f"GPU {gpu} ({dev.name}) is not a MIG model slurmiso knows",
                            hint="'slurmiso mig show --profiles' lists what the driver "
                            "reports; add its table to slurmiso/gpu/catalogue.py")
        profile = choose_profile(ctx, model)
        insts = backend.instances(gpu)
        start = best_placement(model, profile, _occupied(ctx, gpu, insts))
        if start is None:
            raise _no_fit(model, gpu, profile, insts)
        res = ctx.add_resource(Resource(KIND, gpu=gpu, profile=profile, start=start))
        try:
            with ctx.state.unlocked():  # the intent above keeps the spot ours meanwhile
                inst = create_mig_device(backend, gpu, profile, start)
        except GpuInsufficientResources as err:
            # Someone outside slurmiso took the space first; nothing was created.
            ctx.record.resources.remove(res)
            ctx.save()
            raise JobProblem(f"profile {profile} could not be created on GPU {gpu}: {err}",
                             hint="resubmit the job") from None
        res.gi, res.ci, res.uuid, res.state = inst.gi_id, inst.ci_id, inst.uuid, READY
        _check_not_held(ctx, inst)
        ctx.claim(claim_key(gpu, inst.gi_id))
        ctx.save()
        log.info("job %s: created %s on GPU %d", ctx.job_id, _describe(inst), gpu)
        return res

    def teardown(self, ctx: Context) -> None:
        mine = [r for r in ctx.record.of_kind(KIND) if r.state is not RELEASED]
        if mine:
            self._release(ctx, ctx.backend, mine)
        ctx.release_claims()
        ctx.save()

    def _release(self, ctx: Context, backend: GpuBackend, resources: List[Resource]) -> None:
        """Destroy what each resource names; idempotent, and safe to kill at any point.

        A resource is marked released only after its instance is gone, so a rerun after a
        SIGKILL finds the instance again (by GI id alone, see :func:`_find`).
        """
        for res in resources:
            if res.state is READY:
                inst = _find(ctx, backend, res)
            else:
                inst = self._pending_instance(ctx, backend, res)
            if inst is not None:
                # The claim goes first, under the lock: once the driver has destroyed the
                # instance it may hand the same GI id to a job starting beside this one, and
                # that job's claim must not meet ours (a normal turnover is never a drain).
                # Until then the record's ready entry keeps the spot: no placement picks it.
                ctx.release_claim(claim_key(inst.gpu_index, inst.gi_id))
                try:
                    with ctx.state.unlocked():  # the record still names it: nobody takes it
                        if inst.uuid:
                            processes.clean_job_devices(
                                backend, ctx.job_id, ctx.env.uid, mig_uuids=[inst.uuid],
                                sluid=ctx.env.sluid,
                            )
                        destroy_mig_device(backend, inst)
                except GpuNotFound:
                    pass  # already gone: what teardown wanted
                except GpuInUse as err:
                    raise NodeFault(
                        f"cannot destroy job {ctx.job_id}'s MIG device {_describe(inst)} on "
                        f"GPU {inst.gpu_index}: {err}",
                        hint="processes survived SIGKILL; the GPU may need a reset",
                    ) from None
                log.info("job %s: destroyed %s on GPU %d", ctx.job_id, _describe(inst),
                         inst.gpu_index)
            res.state = RELEASED
            ctx.save()

    def _pending_instance(
        self, ctx: Context, backend: GpuBackend, res: Resource
    ) -> Optional[MigInstance]:
        """The instance a prolog killed between intent and save may have made, if no other
        live job could own it."""
        if res.gpu is None:
            return None
        claims, others = _guarded_spots(ctx.state, ctx.job_id)
        for inst in backend.instances(res.gpu):
            if (inst.profile, inst.placement_start) != (res.profile, res.start):
                continue
            holder = claims.get((inst.gpu_index, inst.gi_id))
            if holder and holder != ctx.job_id:
                continue
            if (inst.gpu_index, inst.placement_start, inst.profile) in others:
                continue
            return inst
        return None

    def reconcile(self, ctx: ReconcileContext) -> List[str]:
        """Destroy instances no live job record holds (unless dry-run; busy ones are kept)."""
        records = {
            j: r for j, r in ctx.state.jobs().items()
            if ctx.live_jobs is None or j in ctx.live_jobs
        }
        held, spots = _held_and_spots(records.values())
        held |= {k for k, job in claimed_instances(ctx.state).items() if job in records}
        procs = ctx.backend.processes()
        lines = []
        for inst in ctx.backend.instances():
            if ((inst.gpu_index, inst.gi_id) in held
                    or (inst.gpu_index, inst.placement_start, inst.profile) in spots):
                continue
            what = f"GPU {inst.gpu_index}: orphan MIG device {_describe(inst)}"
            users = [p.pid for p in procs if inst.uuid and p.mig_uuid == inst.uuid]
            if users:
                lines.append(f"{what} kept: pid(s) {', '.join(map(str, users))} still use it")
            elif ctx.dry_run:
                lines.append(f"{what} would be destroyed")
            else:
                destroy_mig_device(ctx.backend, inst)
                ctx.journal.append("mig.orphan-destroyed", gpu=inst.gpu_index, gi=inst.gi_id,
                                   profile=inst.profile, start=inst.placement_start)
                lines.append(f"{what} destroyed")
        return lines


def _check_not_held(ctx: Context, inst: MigInstance) -> None:
    """NodeFault if another live job still claims the GI id the driver just gave us.

    The driver never hands out a GI id that exists, and an ending job lets go of its claim
    before it destroys its instance; so a claim still held here means that job's instance
    vanished under it (destroyed outside slurmiso, a GPU reset): say which one.
    """
    holder = ctx.state.allocations().get(claim_key(inst.gpu_index, inst.gi_id))
    if not holder or holder == ctx.job_id:
        return
    record = ctx.state.read_job(holder)
    if record is None:
        return  # a stale claim of a job without a record: claim() takes it over
    theirs = next((r for r in record.of_kind(KIND) if r.gpu == inst.gpu_index
                   and r.gi == inst.gi_id and r.state is READY), None)
    what = (f"{theirs.profile} (GI {theirs.gi}) at slice {theirs.start}" if theirs is not None
            else f"GI {inst.gi_id}")
    raise NodeFault(
        f"job {holder}'s MIG device {what} on GPU {inst.gpu_index} is gone from the driver "
        f"while the job runs: the driver has just given GI {inst.gi_id} to job "
        f"{ctx.job_id}'s new {inst.profile}",
        hint=f"something outside slurmiso destroyed it (nvidia-smi mig -dgi, a GPU reset); "
        f"job {holder} runs without its MIG device: cancel it, then 'slurmiso reconcile'",
    )


def _others_pending(records: Dict[str, JobRecord], job_id: str) -> Set[Tuple[int, int, str]]:
    """(gpu, start, profile) of other jobs' pending resources: their epilogs clean those."""
    out: Set[Tuple[int, int, str]] = set()
    for jid, rec in records.items():
        if jid == job_id:
            continue
        out.update(_spot(res) for res in rec.of_kind(KIND) if res.state is PENDING)
    return out


def _spot(res: Resource) -> Tuple[int, int, str]:
    """(gpu, start, profile) of a mig-dynamic resource (the record validated they exist)."""
    assert res.gpu is not None and res.start is not None and res.profile is not None
    return res.gpu, res.start, res.profile


HANDLER = MigDynamic()


def unaccounted_instances(state: Any, backend: GpuBackend, gpus: Iterable[int]) -> List[str]:
    """MIG devices on ``gpus`` that no job record or claim accounts for (one line each).

    The epilog of a job without a record asks this: a record or ``jobs/`` dir deleted under
    a running job must not let its instance leak silently.
    """
    held, spots = _held_and_spots(state.jobs().values())
    held |= set(claimed_instances(state))
    out = []
    for gpu in gpus:
        for inst in backend.instances(gpu):
            if (gpu, inst.gi_id) in held or (gpu, inst.placement_start, inst.profile) in spots:
                continue
            out.append(f"GPU {gpu}: {_describe(inst)}")
    return out


def _held_and_spots(
    records: Iterable[JobRecord],
) -> Tuple[Set[Tuple[int, int]], Set[Tuple[int, int, str]]]:
    """(gpu, gi) of the records' ready instances, and (gpu, start, profile) of the ones still
    being made (intent recorded, instance not confirmed): neither is an orphan."""
    held: Set[Tuple[int, int]] = set()
    spots: Set[Tuple[int, int, str]] = set()
    for rec in records:
        for res in rec.of_kind(KIND):
            if res.state is RELEASED:
                continue
            if res.state is READY and res.gpu is not None and res.gi is not None:
                held.add((res.gpu, res.gi))
            else:
                spots.add(_spot(res))
    return held, spots
