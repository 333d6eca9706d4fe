"""Lifecycle operations on a node's jobs: teardown, reconcile and status.

The epilog, ``slurmiso reconcile``/``status``, the monitor and ``audit --live`` all need the
same three operations, so they live here, in the library, and the CLI only prints what they
return. Importing this module costs the hooks nothing beyond :mod:`slurmiso.isolation.base`:
everything else is imported inside the functions that need it.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Set

from slurmiso.errors import NodeFault, SlurmisoError
from slurmiso.isolation.base import Context, handler_for

if TYPE_CHECKING:
    from slurmiso.config.model import Config

log = logging.getLogger("slurmiso.hooks")


def teardown(ctx: Context, why: str = "") -> None:
    """Undo whatever the job's record says exists, then drop its claims.

    Resources the record marks ``kept`` stay in the record; everything else is gone after.
    """
    if why:
        log.info("job %s: cleaning up (%s)", ctx.job_id, why)
    from slurmiso.state.record import ResourceState

    if ctx.job_class is None and ctx.record.job_class:
        ctx.job_class = ctx.config.job_class(ctx.record.job_class)
    handler_for(ctx.record.mode or ctx.pool.mode).teardown(ctx)
    ctx.release_claims()
    ctx.record.resources = [r for r in ctx.record.resources if r.state is ResourceState.KEPT]


def teardown_or_fault(ctx: Context) -> None:
    """:func:`teardown` after a failed prolog; a failure of it is a node fault."""
    try:
        teardown(ctx)
    except SlurmisoError as exc:
        log.error("cleanup after a failed prolog also failed: %s", exc)
        raise NodeFault(f"cleanup after a failed prolog failed: {exc}") from None


def reconcile_node(
    cfg: Config, node: str, dry_run: bool, live_jobs: Optional[List[str]]
) -> List[str]:
    """Fix (or, dry-run, list) what ended jobs left on ``node``; one line per fix.

    ``live_jobs`` is what Slurm runs on the node; ``None`` means "unknown", and then no job
    record is touched (a record is only undone when Slurm says its job is gone). The GPU
    backend opened here is closed before returning, because the monitor calls this
    periodically.
    """
    from slurmiso.gpu import open_backend
    from slurmiso.hostlist import node_name
    from slurmiso.isolation.base import ReconcileContext
    from slurmiso.sluid import valid_sluid
    from slurmiso.slurm.jobenv import JobEnv
    from slurmiso.state import Journal, NodeState

    node = node_name(node)
    pool = cfg.pool_for_node(node)
    if pool is None:
        return []
    state = NodeState(cfg.paths.state_dir_for(node))
    journal = Journal(cfg.paths.journal_for(node))
    fixes: List[str] = []
    with open_backend(cfg.gpu.backend, cfg.gpu.sim_state, node) as backend, state.locked():
        if live_jobs is not None:
            for jid, rec in state.jobs().items():
                if jid in live_jobs or jid.split("_")[0] in live_jobs:
                    continue
                fixes.append(
                    f"job {jid} ended but its record remained: undo {rec.mode} setup"
                )
                if dry_run:
                    continue
                env = JobEnv(
                    jid, rec.uid, rec.user, node, rec.partition, rec.account, rec.qos,
                    tuple(rec.gpus), rec.restart_count,
                    sluid=valid_sluid(str(rec.fence.get("sluid", ""))),
                )
                ctx = Context(
                    cfg,
                    env,
                    pool,
                    cfg.job_class(rec.job_class),
                    state,
                    journal,
                    lambda: backend,
                    record=rec,
                )
                teardown(ctx, why="reconcile: job no longer runs here")
                state.delete_job(jid)
            records = state.jobs()
            allocs = state.allocations()
            stale = {k: v for k, v in allocs.items() if v not in records}
            if stale:
                fixes.extend(
                    f"allocation {k} held by ended job {v}: released"
                    for k, v in stale.items()
                )
                if not dry_run:
                    state.set_allocations(
                        {k: v for k, v in allocs.items() if k not in stale}
                    )
        fixes.extend(_stale_fences(state.state_dir, set(state.jobs()), dry_run))
        rctx = ReconcileContext(cfg, pool, state, journal, backend, dry_run, live_jobs)
        fixes.extend(handler_for(pool.mode).reconcile(rctx))
    for line in fixes:
        journal.append("reconcile", node=node, fix=line, dry_run=dry_run)
    return fixes


def _stale_fences(state_dir: str, records: Set[str], dry_run: bool) -> List[str]:
    """Fence files of jobs without a record, and temp files of fence writes that never
    finished (a prolog killed mid-write): both are left by the dead, under the node lock.

    Removing a fence opens nothing: the plugin denies every GPU device to a job without one.
    """
    import os
    import re

    from slurmiso.isolation.fence import FENCE_DIR
    from slurmiso.pids import pid_alive

    folder = os.path.join(state_dir, FENCE_DIR)
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        return []
    temp = re.compile(r"\.(.+)\.([0-9]+)\.[0-9a-f]+\.tmp")
    fixes = []
    for name in names:
        m = temp.fullmatch(name)
        if m:
            if pid_alive(int(m.group(2))):
                continue
            what = f"remove unfinished fence write {name} (writer pid {m.group(2)} is gone)"
        elif name in records:
            continue
        else:
            what = f"remove fence of job {name} (no job record)"
        fixes.append(what)
        if not dry_run:
            try:
                os.unlink(os.path.join(folder, name))
            except FileNotFoundError:
                pass
            except OSError as exc:
                fixes[-1] = f"{what}: failed: {exc.strerror}"
    return fixes


def node_status(cfg: Config, node: str, with_gpus: bool) -> Dict[str, Any]:
    """Which job holds which GPU, MIG instance or MPS share on ``node``, as plain data."""
    from slurmiso.hostlist import node_name
    from slurmiso.state import NodeState

    node = node_name(node)
    pool = cfg.pool_for_node(node)
    state = NodeState(cfg.paths.state_dir_for(node))
    jobs = state.jobs()
    out: Dict[str, Any] = {
        "node": node,
        "pool": pool.name if pool else None,
        "mode": pool.mode if pool else None,
        "jobs": [
            {
                "job": jid,
                "class": rec.job_class or None,
                "status": rec.status.value,
                "uid": rec.uid,
                "gpus": list(rec.gpus),
                "resources": [r.to_dict() for r in rec.resources],
                "env": dict(rec.env),
                "reason": rec.reason,
                "warnings": list(rec.warnings),
            }
            for jid, rec in sorted(jobs.items(), key=lambda kv: int(kv[0].split("_")[0]))
        ],
        "allocations": state.allocations(),
    }
    if with_gpus:
        from slurmiso.gpu import open_backend

        with open_backend(cfg.gpu.backend, cfg.gpu.sim_state, node) as backend:
            out["gpus"] = [d.to_dict() for d in backend.devices()]
            out["mig_instances"] = [i.to_dict() for i in backend.instances()]
            out["processes"] = [p.to_dict() for p in backend.processes()]
    return out
