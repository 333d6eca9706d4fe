"""Timeslice pools: jobs share GPUs through ``gres/shard`` with no fencing at all.

slurmiso cannot isolate here and says so; it does the accounting (which job is on which GPU)
and a memory-headroom check, so a job that starts on an almost-full GPU carries a warning
the audit reports, instead of failing later with an out-of-memory nobody can explain.
"""

from __future__ import annotations

from typing import List

from slurmiso.isolation.base import Context, ReconcileContext, Resource, ResourceState
from slurmiso.isolation.exclusive import device_indices
from slurmiso.isolation.processes import clean_job_devices


class TimesliceIsolation:
    mode = "timeslice"

    def setup(self, ctx: Context) -> None:
        gpus = device_indices(ctx)
        headroom = ctx.job_class.memory_headroom_pct if ctx.job_class else 0
        resources = []
        for g in gpus:
            dev = ctx.backend.device(g)
            free_pct = (
                100.0 * (dev.memory_total_mb - dev.memory_used_mb) / max(dev.memory_total_mb, 1)
            )
            if headroom and free_pct < headroom:
                ctx.warn(
                    f"GPU {g} has {free_pct:.0f}% memory free, below the class's "
                    f"{headroom}% headroom: timeslice pools do not fence memory"
                )
            ctx.claim(f"ts/{g}/job/{ctx.job_id}")
            resources.append(Resource("shared-gpu", ResourceState.READY, gpu=g, uuid=dev.uuid))
        ctx.record.resources = resources
        ctx.record.isolation_note = "timeslice: shared GPU, no compute or memory fencing"
        if ctx.pool.timeslice:
            _set_timeslice(ctx, gpus)

    def teardown(self, ctx: Context) -> None:
        gpus = [r.gpu for r in ctx.record.of_kind("shared-gpu") if r.gpu is not None]
        if gpus:
            clean_job_devices(ctx.backend, ctx.job_id, ctx.env.uid, gpus=gpus,
                              sluid=ctx.env.sluid)

    def reconcile(self, ctx: ReconcileContext) -> List[str]:
        return []


def _set_timeslice(ctx: Context, gpus: List[int]) -> None:
    """The pool's time slice on the job's GPUs, once a boot (:mod:`slurmiso.gpu.timeslice`).
    A failure is a warning, not a refusal: the slice is a tuning of a pool that fences
    nothing, and refusing the job would take its GPU from everyone for no isolation."""
    from slurmiso.errors import GpuError
    from slurmiso.gpu.timeslice import Timeslice, boot_id, ensure

    want = Timeslice.parse(ctx.pool.timeslice)
    try:
        done = ensure(ctx.backend, ctx.state.state_dir, gpus,
                      lambda i: ctx.backend.device(i).uuid, want, boot_id())
    except GpuError as exc:
        ctx.warn(f"the GPU time slice stays as it was, not {want.value}: {exc}")
        return
    if done:
        ctx.journal.append("timeslice-set", job=ctx.job_id, gpus=done, value=want.value)


HANDLER = TimesliceIsolation()
