"""What the prolog and epilog do, and the failure policy around it.

    prolog:  classify -> record "preparing" -> handler.setup -> record "ready" | "refused"
    epilog:  record "releasing" -> handler.teardown -> journal "job-end" -> record removed

All of it under the node lock. Exit status is policy (Slurm drains the node on non-zero):
a :class:`JobProblem` exits 0 and refuses only that job; a node fault (NodeFault, GpuError,
StateError, a broken config) drains the node with a one-line reason and exits 1.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from typing import Any, Callable, Dict, Mapping, Optional

from slurmiso.errors import GpuError, SlurmError, SlurmisoError
from slurmiso.isolation.base import (
    PREPARING,
    READY,
    REFUSED,
    RELEASING,
    Context,
    JobProblem,
    NodeFault,
    handler_for,
)

log = logging.getLogger("slurmiso.hooks")

#: How strong each isolation is; a class may land only on pools at least as strong as it asks.
STRENGTH = {"timeslice": 0, "mps": 1, "mig": 2, "exclusive": 3}
MODE_GIVES = {
    "exclusive": "exclusive",
    "mig-static": "mig",
    "mig-dynamic": "mig",
    "mps": "mps",
    "timeslice": "timeslice",
}
QOS_LOOKUP_TIMEOUT_S = 5.0
DRAIN_TIMEOUT_S = 5.0

Drain = Callable[[str, str], None]


def setup_logging(phase: str, job_id: str) -> None:
    """stderr (slurmd's log) plus syslog tagged ``slurmiso-<phase>[job]``, once per process."""
    root = logging.getLogger("slurmiso")
    if root.handlers:
        return
    root.setLevel(logging.INFO)
    stderr = logging.StreamHandler(sys.stderr)
    stderr.setFormatter(
        logging.Formatter(f"slurmiso-{phase}[{job_id}]: %(levelname)s: %(message)s")
    )
    root.addHandler(stderr)
    if os.path.exists("/dev/log"):
        from logging.handlers import SysLogHandler

        try:
            sys_h = SysLogHandler(address="/dev/log")
            sys_h.setFormatter(logging.Formatter(f"slurmiso-{phase}[{job_id}]: %(message)s"))
            root.addHandler(sys_h)
        except OSError:
            pass


def slurm_drain(node: str, reason: str) -> None:
    from slurmiso.slurm.client import SlurmCli

    SlurmCli(timeout=DRAIN_TIMEOUT_S).drain(node, reason)


def run_hook(
    phase: str,
    env: Mapping[str, str],
    config_path: Optional[str] = None,
    drain: Optional[Drain] = None,
    backend_factory: Optional[Callable[[], Any]] = None,
) -> int:
    """Run the prolog or epilog for the job described by ``env``; return the exit status."""
    from slurmiso.hooks.jobenv import JobEnv

    job_id = env.get("SLURM_JOB_ID", "?")
    setup_logging(phase, job_id)
    node = env.get("SLURMD_NODENAME", "")
    try:
        job = JobEnv.from_env(env, node)
        node = job.node
        ctx = _context(job, config_path or env.get("SLURMISO_CONFIG"), backend_factory)
        if ctx is None:
            return 0
        with ctx.state.locked():
            if phase == "prolog":
                prolog(ctx, env)
            else:
                epilog(ctx)
        return 0
    except JobProblem as problem:  # only reachable before a record exists (bad env)
        log.error("%s", problem)
        return 0
    except SlurmisoError as fault:
        return _node_fault(phase, node, str(fault), drain)
    except Exception as bug:  # noqa: BLE001 - a bug must still drain, not run unisolated
        log.exception("internal error")
        return _node_fault(phase, node, f"internal error: {type(bug).__name__}: {bug}", drain)


def _node_fault(phase: str, node: str, reason: str, drain: Optional[Drain]) -> int:
    log.error("slurmiso %s: %s", phase, reason)
    parts = [ln.strip() for ln in reason.splitlines() if ln.strip()]
    line = f"slurmiso {phase}: {'; '.join(parts[:2])}"
    if len(parts) > 2:
        line += f" (+{len(parts) - 2} more, see slurmd log)"
    line = line[:300]
    try:
        (drain or slurm_drain)(node, line)
    except SlurmisoError as exc:
        log.error("could not set the drain reason: %s", exc)
    return 1


def _context(job: Any, config_path: Optional[str], backend_factory: Any) -> Optional[Context]:
    from slurmiso.config import load_config
    from slurmiso.state import Journal, NodeState

    cfg = load_config(config_path)
    pool = cfg.pool_for_node(job.node)
    if pool is None:
        log.info("node %s is in no slurmiso pool; nothing to do", job.node)
        return None
    if backend_factory is None:
        from slurmiso.gpu import open_backend

        def backend_factory() -> Any:
            return open_backend(cfg.gpu.backend, cfg.gpu.sim_state, job.node)

    return Context(
        config=cfg,
        env=job,
        pool=pool,
        job_class=None,
        state=NodeState(cfg.paths.state_dir_for(job.node)),
        journal=Journal(cfg.paths.journal_for(job.node)),
        backend_factory=backend_factory,
    )


def _job_qos(ctx: Context) -> str:
    """The job's QoS: from the environment when Slurm exports it, else one bounded query."""
    if ctx.env.qos or not any(c.match.qos for c in ctx.config.classes):
        return ctx.env.qos
    from slurmiso.slurm.client import SlurmCli

    try:
        return SlurmCli(timeout=QOS_LOOKUP_TIMEOUT_S).show_job(ctx.job_id).get("QOS", "")
    except SlurmError as exc:
        raise JobProblem(
            f"cannot learn the job's QoS to pick its class: {exc}",
            hint="resubmit when slurmctld answers",
        ) from None


def prolog(ctx: Context, env: Mapping[str, str]) -> None:
    from slurmiso.isolation import dcgm
    from slurmiso.isolation.classify import classify

    old = ctx.state.read_job(ctx.job_id)
    if (
        old
        and old.get("status") in (READY, REFUSED)
        and old.get("restart_count") == ctx.env.restart_count
    ):
        log.info("job %s already prepared (%s); nothing to do", ctx.job_id, old["status"])
        return
    if old:  # a killed prolog, or an earlier run of a requeued job: clean it first
        ctx.record = old
        _teardown(ctx, why="stale record from an earlier prolog")
    started = time.time()
    ctx.record = {
        "job_id": ctx.job_id,
        "uid": ctx.env.uid,
        "user": ctx.env.user,
        "node": ctx.env.node,
        "partition": ctx.env.partition,
        "account": ctx.env.account,
        "pool": ctx.pool.name,
        "mode": ctx.pool.mode,
        "gpus": list(ctx.env.gpus),
        "restart_count": ctx.env.restart_count,
        "status": PREPARING,
        "env": {},
        "resources": [],
        "claims": [],
        "warnings": [],
        "times": {"prolog_start": round(started, 3)},
    }
    handler = handler_for(ctx.pool.mode)
    _fence(ctx, refused=True)  # until the job is prepared, it reaches no GPU device
    try:
        qos = _job_qos(ctx)
        ctx.record["qos"] = qos
        cls, why = classify(
            ctx.config, qos, ctx.env.partition, ctx.env.account, ctx.env.spank.get("iso_class", "")
        )
        if cls is None:
            raise JobProblem(
                f"no job class matches (qos {qos or 'none'}, partition {ctx.env.partition})",
                hint="submit with --qos=<class> or set default_class in slurmiso.yaml",
            )
        ctx.job_class = cls
        ctx.record.update({"class": cls.name, "class_reason": why})
        gives = MODE_GIVES[ctx.pool.mode]
        if STRENGTH[gives] < STRENGTH[cls.isolation]:
            raise JobProblem(
                f"class {cls.name} needs {cls.isolation} isolation or stronger; partition "
                f"{ctx.env.partition} (pool {ctx.pool.name}) gives only {gives}",
                hint="submit to a partition whose pool isolates at least that much",
            )
        ctx.save()
        handler.setup(ctx)
        _open_events_file(ctx)
    except JobProblem as problem:
        _refuse(ctx, str(problem))
        return
    except GpuError as err:
        _teardown_quietly(ctx)
        raise NodeFault(str(err)) from None
    _fence(ctx, refused=False)
    ctx.record["status"] = READY
    ctx.record["times"]["prolog_end"] = round(time.time(), 3)
    ctx.save()
    dcgm.update(ctx.config.paths.dcgm_job_mapping_dir, ctx.job_id, ctx.record["resources"], True)
    ctx.journal.append(
        "prolog",
        job=ctx.job_id,
        node=ctx.env.node,
        outcome="ready",
        **{k: ctx.record.get(k) for k in ("class", "pool", "mode", "gpus", "uid", "restart_count")},
        resources=ctx.record["resources"],
        warnings=ctx.record["warnings"],
        ms=round(1000 * (time.time() - started), 1),
    )


def _open_events_file(ctx: Context) -> None:
    """Give the job's wrapper a file it may write its events to (see hooks/events.py)."""
    from slurmiso.hooks import events

    try:
        path = events.create(ctx.state.state_dir, ctx.job_id, ctx.env.uid)
    except OSError as exc:
        ctx.warn(f"no events file for the job wrapper: {exc}")
        return
    ctx.set_env("SLURMISO_EVENTS_FILE", path)


def _fold_events(ctx: Context) -> None:
    from slurmiso.hooks import events

    reserved = {"ts", "host", "event"}
    for rec in events.fold(ctx.state.state_dir, ctx.job_id):
        fields = {k: v for k, v in rec.items() if k not in reserved}
        fields.update(source="job", job=ctx.job_id, job_ts=rec.get("ts"))
        ctx.journal.append(str(rec["event"])[:64], **fields)


def _fence(ctx: Context, refused: bool) -> None:
    """Write the job's device fence (isolation/fence.py), applied by slurmiso_fence.so in
    slurmstepd; a fence that cannot be written is a node fault (the job must not start)."""
    from slurmiso.isolation import fence

    why, rules, narrow = fence.job_fence(
        ctx.record, refused, ctx.config.paths.dev_root_for(ctx.env.node), ctx.pool.gpus_per_node)
    try:
        fence.write(ctx.state.state_dir, ctx.job_id, why, rules, narrow)
    except OSError as exc:
        raise NodeFault(f"cannot write the device fence of job {ctx.job_id}: {exc}") from None


def _refuse(ctx: Context, reason: str) -> None:
    log.warning("job %s refused: %s", ctx.job_id, reason)
    _fence(ctx, refused=True)
    _teardown_quietly(ctx)
    ctx.record.update(status=REFUSED, reason=reason, env={})
    ctx.save()
    ctx.journal.append(
        "prolog",
        job=ctx.job_id,
        node=ctx.env.node,
        outcome="refused",
        reason=reason,
        **{k: ctx.record.get(k) for k in ("class", "pool", "mode", "gpus", "uid")},
    )


def _teardown(ctx: Context, why: str = "") -> None:
    """Undo whatever the record says exists, then drop the claims."""
    if why:
        log.info("job %s: cleaning up (%s)", ctx.job_id, why)
    _restore_class(ctx)
    handler_for(ctx.record.get("mode") or ctx.pool.mode).teardown(ctx)
    ctx.release_claims()
    ctx.record["resources"] = [
        r for r in ctx.record.get("resources", []) if r.get("state") == "kept"
    ]


def _teardown_quietly(ctx: Context) -> None:
    try:
        _teardown(ctx)
    except SlurmisoError as exc:
        log.error("cleanup after a failed prolog also failed: %s", exc)
        raise NodeFault(f"cleanup after a failed prolog failed: {exc}") from None


def _restore_class(ctx: Context) -> None:
    if ctx.job_class is None and ctx.record.get("class"):
        ctx.job_class = ctx.config.job_class(ctx.record["class"])


def epilog(ctx: Context) -> None:
    from slurmiso.isolation import dcgm

    record = ctx.state.read_job(ctx.job_id)
    if record is None:
        log.info("job %s has no record on this node; nothing to undo", ctx.job_id)
        return
    ctx.record = record
    started = time.time()
    resources = list(record.get("resources", []))
    record["status"] = RELEASING
    ctx.save()
    dcgm.update(ctx.config.paths.dcgm_job_mapping_dir, ctx.job_id, resources, False)
    _teardown(ctx)
    _fold_events(ctx)
    from slurmiso.isolation import fence

    fence.remove(ctx.state.state_dir, ctx.job_id)
    times: Dict[str, Any] = dict(record.get("times", {}))
    times["epilog_end"] = round(time.time(), 3)
    ctx.journal.append(
        "job-end",
        job=ctx.job_id,
        node=ctx.env.node,
        outcome=record.get("reason") and "refused" or "released",
        **{
            k: record.get(k)
            for k in ("class", "pool", "mode", "gpus", "uid", "user", "restart_count")
        },
        resources=resources,
        warnings=record.get("warnings", []),
        times=times,
        epilog_ms=round(1000 * (time.time() - started), 1),
    )
    ctx.state.delete_job(ctx.job_id)
