"""Exclusive pools: the job owns whole GPUs; verify nobody else is on them, clean up after.

Slurm already restricts the job to its GPUs (``CUDA_VISIBLE_DEVICES``, device cgroup where
configured); what it does not check is that the GPUs are *clean*: a process left by an earlier
job (or started outside Slurm) would share the GPU with this one. That is a node fault.
"""

from __future__ import annotations

from typing import List

from slurmiso.errors import NodeFault
from slurmiso.isolation.base import Context, ReconcileContext, Resource, ResourceState
from slurmiso.isolation.processes import (
    clean_job_devices,
    foreign_processes,
    job_processes,
    on_devices,
)


def device_indices(ctx: Context) -> List[int]:
    """NVML indices of the job's GPUs: GRES index i is ``/dev/nvidia<i>`` in generated
    gres.conf, so it is the device whose minor number is i."""
    by_minor = {d.minor: d.index for d in ctx.backend.devices()}
    out = []
    for g in ctx.env.gpus:
        if g not in by_minor:
            raise NodeFault(
                f"job {ctx.job_id} was given GPU {g} but this node has no /dev/nvidia{g}",
                hint="gres.conf does not match the GPUs; regenerate it: slurmiso gen gres-conf",
            )
        out.append(by_minor[g])
    return out


def check_clean(ctx: Context, gpus: List[int]) -> None:
    """NodeFault if a process that is not this job's holds one of ``gpus``."""
    strangers = foreign_processes(on_devices(ctx.backend.processes(), gpus), ctx.job_id,
                                  sluid=ctx.env.sluid)
    if strangers:
        desc = ", ".join(f"pid {p.pid} on GPU {p.gpu_index}" for p in strangers)
        raise NodeFault(
            f"GPU not clean for job {ctx.job_id}: {desc}",
            hint="a process outside this job holds the GPU; end it, then resume the node",
        )


#: Memory a GPU reports in use with no process on it (driver, ECC pages) that is not a leak.
RELEASED_SLACK_MB = 512


class ExclusiveIsolation:
    mode = "exclusive"

    def setup(self, ctx: Context) -> None:
        gpus = device_indices(ctx)
        check_clean(ctx, gpus)
        resources = []
        for g in gpus:
            ctx.claim(f"gpu/{g}")
            dev = ctx.backend.device(g)
            resources.append(Resource("gpu", ResourceState.READY, gpu=g, uuid=dev.uuid))
        ctx.record.resources = resources
        if gpus:
            ctx.set_env("CUDA_VISIBLE_DEVICES", ",".join(str(g) for g in ctx.env.gpus))

    def teardown(self, ctx: Context) -> None:
        gpus = [r.gpu for r in ctx.record.of_kind("gpu") if r.gpu is not None]
        if not gpus:
            return
        clean_job_devices(ctx.backend, ctx.job_id, ctx.env.uid, gpus=gpus, sluid=ctx.env.sluid)
        survivors = job_processes(
            on_devices(ctx.backend.processes(), gpus), ctx.job_id, ctx.env.uid,
            sluid=ctx.env.sluid,
        )
        if survivors:
            raise NodeFault(
                f"job {ctx.job_id}'s processes survived SIGKILL on GPU(s) "
                f"{sorted({p.gpu_index for p in survivors})}: pids {[p.pid for p in survivors]}",
                hint="the GPU may be hung; check nvidia-smi and reset it before resuming",
            )
        for g in gpus:  # memory still held with no process left: a driver-level leak
            dev = ctx.backend.device(g)
            if dev.memory_used_mb > RELEASED_SLACK_MB and not on_devices(
                ctx.backend.processes(), [g]
            ):
                ctx.warn(f"GPU {g} still has {dev.memory_used_mb} MiB in use after the job ended")

    def reconcile(self, ctx: ReconcileContext) -> List[str]:
        return []


HANDLER = ExclusiveIsolation()
