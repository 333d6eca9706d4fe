"""mig-static: the node's MIG layout is fixed (``slurmiso mig apply``); jobs get its devices.

Slurm hands the job MIG-typed ``gres/gpu`` entries; their indices (``SLURM_JOB_GPUS``) are
positions in the node's gres.conf, mapped to instances by :mod:`slurmiso.mig.gres` in the same
order ``gen gres-conf`` wrote them. If the live instances are not what gres.conf was generated
from, that mapping would hand out the wrong device: the node is drained instead. Nothing is
created or destroyed per job.
"""

from __future__ import annotations

import logging
from typing import Any, List, Tuple

from slurmiso.errors import NodeFault
from slurmiso.gpu.profiles import lookup_model
from slurmiso.isolation import processes
from slurmiso.isolation.base import Context, ReconcileContext, Resource, ResourceState
from slurmiso.mig import gres
from slurmiso.mig.apply import read_node
from slurmiso.mig.claims import claim_key, claimed_instances
from slurmiso.mig.plan import plan_layout

log = logging.getLogger(__name__)
KIND = "mig-static"


def _expected(ctx: Context, ngpus: int) -> Tuple[List[Tuple[Any, ...]], str]:
    """Entry identities gres.conf was generated from: the apply record, else the layout."""
    recorded = gres.load_record(ctx.state.state_dir)
    if recorded is not None:
        return [tuple(r) for r in recorded], "the layout 'slurmiso mig apply' recorded"
    layout = ctx.config.mig_layout(ctx.pool.mig_layout)
    model = lookup_model(ctx.pool.gpu_model)
    if layout is None or model is None:
        raise NodeFault(f"pool {ctx.pool.name} has no usable MIG layout {ctx.pool.mig_layout!r}")
    planned = gres.layout_entries(model, layout, ngpus)
    # Without a record the GI ids are unknown: compare what Slurm's types depend on.
    return [(e.gpu, e.profile, e.start) for e in planned], f"layout {layout.name!r}"


class MigStatic:
    mode = KIND

    def setup(self, ctx: Context) -> None:
        mine = list(ctx.record.of_kind(KIND))
        if mine and all(r.state is ResourceState.READY for r in mine):
            return  # already set up: setup is idempotent
        # A setup killed halfway created nothing (static layout): start over cleanly.
        ctx.record.resources = [r for r in ctx.record.resources if r.kind != KIND]
        backend = ctx.backend
        devices = backend.devices()
        # The mapping needs no device files: skip /proc (one failure mode fewer in the prolog).
        live = gres.live_entries(devices, backend.instances())
        expected, source = _expected(ctx, len(devices))
        width = len(expected[0]) if expected else 4
        if [e.identity()[:width] for e in live] != expected:
            raise NodeFault(
                f"MIG state not as recorded: live devices {_show(live)} differ from {source}",
                hint="drain the node, run 'slurmiso mig apply', regenerate gres.conf "
                "('slurmiso gen gres-conf') and restart slurmd",
            )
        if not ctx.env.gpus:
            ctx.warn("the job holds no GPU on this mig-static node; it gets no MIG device")
            return
        found, missing = gres.map_gres_indices(ctx.env.gpus, live)
        if missing:
            raise NodeFault(
                f"MIG state not as recorded: GRES index(es) {missing} have no device "
                f"(the node has {len(live)} gpu GRES entries)",
                hint="gres.conf and the MIG layout disagree; regenerate gres.conf and "
                "restart slurmd",
            )
        procs = backend.processes()
        for entry in found:
            on_it = processes.on_devices(
                procs, gpus=[entry.gpu], mig_uuids=[entry.uuid] if entry.is_mig else []
            )
            foreign = processes.foreign_processes(on_it, ctx.job_id, sluid=ctx.env.sluid)
            if foreign:
                pids = ", ".join(str(p.pid) for p in foreign)
                raise NodeFault(
                    f"{_name(entry)} given to job {ctx.job_id} is in use by pid(s) {pids} "
                    "of no job of this node",
                    hint="a process outside Slurm holds the device; stop it, then resume the node",
                )
        for entry in found:
            res = ctx.add_resource(_resource(entry))
            res.state = ResourceState.READY
            gi = entry.gi_id
            ctx.claim(claim_key(entry.gpu, gi) if gi is not None else f"gpu/{entry.gpu}")
        ctx.set_env("CUDA_VISIBLE_DEVICES", ",".join(e.uuid for e in found))
        ctx.save()

    def teardown(self, ctx: Context) -> None:
        backend = None
        for res in ctx.record.of_kind(KIND):
            if res.state is ResourceState.RELEASED or res.gpu is None:
                continue
            backend = backend or ctx.backend
            uuids = [res.uuid] if res.profile and res.uuid else []
            processes.clean_job_devices(
                backend, ctx.job_id, ctx.env.uid, gpus=[res.gpu], mig_uuids=uuids,
                sluid=ctx.env.sluid,
            )
            left = processes.job_processes(
                processes.on_devices(backend.processes(), [res.gpu], uuids),
                ctx.job_id, ctx.env.uid, sluid=ctx.env.sluid,
            )
            if left:
                pids = ", ".join(str(p.pid) for p in left)
                raise NodeFault(
                    f"job {ctx.job_id}'s pid(s) {pids} survived SIGKILL on {_name_res(res)}",
                    hint="a process stuck in the driver; the GPU may need a reset",
                )
            res.state = ResourceState.RELEASED
        ctx.release_claims()
        ctx.save()

    def reconcile(self, ctx: ReconcileContext) -> List[str]:
        """Report drift from the pool's layout; fixing it is ``slurmiso mig apply``'s job."""
        layout = ctx.config.mig_layout(ctx.pool.mig_layout)
        model = lookup_model(ctx.pool.gpu_model)
        if layout is None or model is None:
            return [f"pool {ctx.pool.name}: no usable MIG layout {ctx.pool.mig_layout!r}"]
        snap = read_node(ctx.backend, claimed_instances(ctx.state))
        plan = plan_layout(model, layout, len(snap.devices), snap.existing,
                           snap.mig_enabled, snap.busy)
        return [f"{line}; fix: slurmiso mig apply --layout {layout.name}"
                for line in plan.differences()]


def _resource(e: gres.GresEntry) -> Resource:
    return Resource(KIND, gpu=e.gpu, gi=e.gi_id, ci=e.ci_id, uuid=e.uuid,
                    profile=e.profile, start=e.start, gres_index=e.index)


def _name(e: gres.GresEntry) -> str:
    if not e.is_mig:
        return f"GPU {e.gpu} (whole)"
    return f"MIG {e.profile} at slice {e.start} of GPU {e.gpu} (GI {e.gi_id})"


def _name_res(res: Resource) -> str:
    if not res.profile:
        return f"GPU {res.gpu}"
    return f"MIG {res.profile} of GPU {res.gpu} (GI {res.gi})"


def _show(entries: List[gres.GresEntry]) -> str:
    return "[" + ", ".join(
        f"{e.gpu}:{e.profile or 'whole'}@{e.start}" + (f"/gi{e.gi_id}" if e.is_mig else "")
        for e in entries
    ) + "]"


HANDLER = MigStatic()
