"""What the prolog and epilog do, and the failure policy around it.

    prolog:  classify -> record "preparing" -> handler.setup -> record "ready" | "refused"
    epilog:  record "releasing" -> handler.teardown -> journal "job-end" -> record removed

State transactions run under the node lock; slow GPU driver calls do not (handlers let go of
it around them, after recording their intent), and every lock wait is bounded by Slurm's
``PrologEpilogTimeout`` (see hooks/budget.py). Exit status is policy (Slurm drains the node
on non-zero): a :class:`JobProblem` exits 0 and refuses only that job, with a record (no
record must never mean no isolation: the task prolog hides the GPUs then too); a node fault
(NodeFault, GpuError, StateError, a broken config) drains the node with a one-line reason
naming the file or device, and exits 1.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from typing import Any, Callable, Dict, List, Mapping, Optional

from slurmiso.errors import GpuError, JobProblem, NodeFault, SlurmError, SlurmisoError
from slurmiso.isolation.base import PREPARING, READY, REFUSED, RELEASING, Context, handler_for
from slurmiso.state.record import JobRecord

log = logging.getLogger("slurmiso.hooks")

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
        from slurmiso.hooks.hooklog import SyslogHandler

        root.addHandler(SyslogHandler(f"slurmiso-{phase}[{job_id}]"))


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
    from slurmiso.slurm.jobenv import HOOK_VARS, JobEnv, job_id

    setup_logging(phase, job_id(env) or "?")
    node = env.get(HOOK_VARS["node"], "")
    try:
        from slurmiso.hooks.budget import lock_wait_s

        deadline = time.monotonic() + lock_wait_s(env)
        job = JobEnv.from_env(env, node)
        node = job.node
        ctx = _context(job, config_path or env.get("SLURMISO_CONFIG"), backend_factory)
        if ctx is None:
            return 0
        ctx.state.deadline = deadline
        ctx.state.lock_timeout = max(0.0, deadline - time.monotonic())
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
    except OSError as exc:  # e.g. the journal's disk is full: name the file, not a traceback
        where = f"{exc.filename}: " if exc.filename else ""
        return _node_fault(phase, node, f"{where}{exc.strerror or exc}", drain)
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
        facts = SlurmCli(timeout=QOS_LOOKUP_TIMEOUT_S).job_fields(ctx.job_id, ("QOS",))
    except SlurmError as exc:
        raise JobProblem(
            f"cannot learn the job's QoS to pick its class: {exc}",
            hint="resubmit when slurmctld answers",
        ) from None
    if facts is None:
        raise JobProblem("cannot learn the job's QoS to pick its class: slurmctld does not "
                         "list the job", hint="resubmit when slurmctld answers")
    return facts["QOS"]


def prolog(ctx: Context, env: Mapping[str, str]) -> None:
    from slurmiso.config.classify import classify
    from slurmiso.isolation import dcgm

    old = ctx.state.read_job(ctx.job_id)
    if (
        old is not None
        and old.status in (READY, REFUSED)
        and old.restart_count == ctx.env.restart_count
    ):
        log.info("job %s already prepared (%s); nothing to do", ctx.job_id, old.status.value)
        return
    # An earlier attempt's record whose epilog has not run yet: that epilog may still come,
    # after this prolog, and it carries the job's *current* restart count (measured on 22.05:
    # an epilog's SLURM_JOB_RESTART_COUNT is the count at the time it runs), so it cannot tell
    # the attempts apart. The new record owes it one skip (see epilog() for when it is void).
    late = int(old is not None and old.status in (READY, REFUSED, PREPARING)
               and old.restart_count != ctx.env.restart_count)
    if old is not None:  # a killed prolog, or an earlier run of a requeued job: clean it first
        ctx.record = old
        from slurmiso.isolation.lifecycle import teardown

        teardown(ctx, why="stale record from an earlier prolog")
    started = time.time()
    ctx.record = JobRecord(
        ctx.job_id,
        PREPARING,
        uid=ctx.env.uid,
        user=ctx.env.user,
        node=ctx.env.node,
        partition=ctx.env.partition,
        account=ctx.env.account,
        pool=ctx.pool.name,
        mode=ctx.pool.mode,
        gpus=list(ctx.env.gpus),
        restart_count=ctx.env.restart_count,
        times={"prolog_start": round(started, 3)},
        fence=_fence_facts(ctx, env),
        late_epilogs=late,
    )
    handler = handler_for(ctx.pool.mode)
    _fence(ctx, refused=True)  # until the job is prepared, it reaches no GPU device
    try:
        _check_identity(ctx)
        _check_options(ctx)
        if any(p.mode == "mps" for p in ctx.config.pools):
            from slurmiso.isolation.mps_dirs import ensure_root

            ensure_root(ctx.state.state_dir)  # a container's bind of it holds on every node
        qos = _job_qos(ctx)
        ctx.record.qos = qos
        cls, why = classify(
            ctx.config, qos, ctx.env.partition, ctx.env.account, ctx.env.spank.get("iso_class", "")
        )
        if cls is None:
            raise JobProblem(
                f"no job class matches (qos {qos or 'none'}, partition {ctx.env.partition})",
                hint="submit with --qos=<class> or set default_class in slurmiso.yaml",
            )
        ctx.job_class = cls
        ctx.record.job_class, ctx.record.class_reason = cls.name, why
        _record_metrics(ctx)
        from slurmiso.config.model import ISOLATION_STRENGTH, MODE_ISOLATION

        gives = MODE_ISOLATION[ctx.pool.mode]
        if ISOLATION_STRENGTH[gives] < ISOLATION_STRENGTH[cls.isolation]:
            raise JobProblem(
                f"class {cls.name} needs {cls.isolation} isolation or stronger; partition "
                f"{ctx.env.partition} (pool {ctx.pool.name}) gives only {gives}",
                hint="submit to a partition whose pool isolates at least that much",
            )
        ctx.save()
        handler.setup(ctx)
        _open_events_file(ctx)
        _name_steps_file(ctx)
    except JobProblem as problem:
        _refuse(ctx, str(problem))
        return
    except GpuError as err:
        from slurmiso.isolation.lifecycle import teardown_or_fault

        teardown_or_fault(ctx)
        raise NodeFault(str(err)) from None
    _fence(ctx, refused=False)
    ctx.record.status = READY
    ctx.record.times["prolog_end"] = round(time.time(), 3)
    ctx.save()
    dcgm.update(ctx.config.paths.dcgm_job_mapping_dir, ctx.job_id, ctx.record.resources, True)
    ctx.journal.append(
        "prolog",
        job=ctx.job_id,
        node=ctx.env.node,
        outcome="ready",
        **_journal_facts(ctx.record, "restart_count"),
        resources=[r.to_dict() for r in ctx.record.resources],
        warnings=list(ctx.record.warnings),
        ms=round(1000 * (time.time() - started), 1),
    )


def _journal_facts(record: JobRecord, *more: str) -> Dict[str, Any]:
    """The record's facts every journal line of a job carries (the audit reads them), under
    their on-disk names; an empty text (no class yet) is left out of to_dict, so it is null."""
    rec = record.to_dict()
    return {k: rec.get(k) for k in ("class", "pool", "mode", "gpus", "uid", *more)}


def _fence_facts(ctx: Context, env: Mapping[str, str]) -> Dict[str, Any]:
    """What a device fence needs to close a refused job off its GPUs: who, and which devices
    Slurm gave it (GRES indices, and the raw device list for MIG-typed GRES)."""
    visible = env.get("CUDA_VISIBLE_DEVICES", "")[:4096]
    facts: Dict[str, Any] = {
        "uid": ctx.env.uid,
        "gpus": list(ctx.env.gpus),
        "slurm_visible_devices": visible if visible.isprintable() else "",
    }
    if ctx.env.sluid:  # 26.05+: the name of the job's cgroup/v2 directory (slurmiso/sluid.py)
        facts["sluid"] = ctx.env.sluid
    return facts


def _check_identity(ctx: Context) -> None:
    """A job whose owner Slurm did not name usably is refused before anything is made for it:
    daemons, directories and records are keyed by uid, and one made for uid -1 would be
    something no epilog can undo."""
    if ctx.env.uid < 0:
        from slurmiso.slurm.jobenv import HOOK_VARS

        raise JobProblem(
            f"{HOOK_VARS['uid']} is missing or not a uid Slurm gives (a whole number below "
            "2^32-1); slurmiso cannot tell whose job this is",
            hint="check slurmd's Prolog environment; resubmit once Slurm names the job's user",
        )


def _check_options(ctx: Context) -> None:
    """The SPANK options again, with the config's allow-lists (JobProblem: a refusal)."""
    if ctx.env.option_problems:
        raise JobProblem(
            "; ".join(ctx.env.option_problems),
            hint="fix the option or leave it out and resubmit",
        )
    profile = ctx.env.spank.get("iso_mig_profile")
    if profile:
        from slurmiso.submit.options import problem
        from slurmiso.submit.plugstack import mig_profile_names

        why = problem("iso_mig_profile", profile, profiles=mig_profile_names(ctx.config))
        if why:
            raise JobProblem(why, hint="fix the option or leave it out and resubmit")


def _open_events_file(ctx: Context) -> None:
    """Name the file the job's wrapper may write its events to (see hooks/events.py).

    It lives in the job's own working directory, created by the job itself: a user who fills
    it fills their own quota, never root's state dir.
    """
    from slurmiso.jobfiles import events_path

    path = events_path(ctx.env.work_dir, ctx.job_id)
    if path is None:
        ctx.warn("no events file for the job wrapper: Slurm gave no usable working directory")
        return
    ctx.record.events_file = path
    ctx.set_env("SLURMISO_EVENTS_FILE", path)
    from slurmiso.hooks.requeue import ENV_FLAG

    ctx.set_env(ENV_FLAG, "1")  # this epilog requeues on the wrapper's request (hooks/requeue.py)


def _record_metrics(ctx: Context) -> None:
    """The job's ``--iso-metrics`` endpoint (validated with the other options), normalized to
    PORT/PATH, for the node's agent: which job owns which port is root's record, not the
    job's word at scrape time."""
    value = ctx.env.spank.get("iso_metrics", "")
    if value:
        from slurmiso.submit.options import metrics_endpoint

        port, path = metrics_endpoint(value)
        ctx.record.metrics = f"{port}{path}"


def _name_steps_file(ctx: Context) -> None:
    """Name the file the job's wrapper folds its training step times into (hooks/stepfiles.py),
    in the job's working directory, as the events file."""
    from slurmiso.jobfiles import steps_path

    path = steps_path(ctx.env.work_dir, ctx.job_id)
    if path is not None:
        ctx.record.steps_file = path
        ctx.set_env("SLURMISO_STEPS_FILE", path)


def _fold_events(ctx: Context) -> List[Any]:
    """Copy the job's own report into the journal, as user data: bounded, allow-listed event
    names, scalar fields only, never passed as keyword arguments, marked ``source: job``.
    Returns what was folded (``UserEvent``s: hooks/events.py)."""
    from slurmiso.hooks import events
    from slurmiso.state.journal import JOB_SOURCE

    path = ctx.record.events_file
    if not path:
        return []
    folded = events.fold(path, ctx.env.uid)
    for rec in folded.records:
        fields = dict(rec.fields)
        fields.update(source=JOB_SOURCE, job=ctx.job_id, job_ts=rec.ts)
        ctx.journal.append_fields(rec.event, fields)
    if folded.dropped:
        # The job's own report is gone for good once folded: say so where the job's owner
        # (slurmd's log, the record's warnings) and the audit (the journal) will look.
        ctx.warn(f"dropped {folded.dropped} line(s) of the job's events file {path}"
                 f"{f' and {folded.unread_bytes} unread bytes' if folded.unread_bytes else ''}"
                 f": {folded.why}")
        ctx.journal.append("events-dropped", job=ctx.job_id, path=path, lines=folded.dropped,
                           unread_bytes=folded.unread_bytes, why=folded.why,
                           kept=len(folded.records))
    return list(folded.records)


def _journal_unpreempted_end(ctx: Context, reported: List[Any]) -> None:
    """Where the job says its program ended by itself after a requeue (Slurm 24.05+ would
    call the attempt PREEMPTED), ask slurmctld, as root, and journal what it confirms."""
    from slurmiso.hooks.requeue import check_not_preempted, closed_claimed

    if not closed_claimed(reported, ctx.record.restart_count):
        return
    facts = check_not_preempted(ctx.job_id)
    if facts is None:
        log.info("job %s: its report of an unpreempted end is not confirmed by slurmctld; "
                 "the audit counts the attempt as Slurm recorded it", ctx.job_id)
        return
    ctx.journal.append("not-preempted", job=ctx.job_id, node=ctx.env.node,
                       restart_count=ctx.record.restart_count, start=facts["start"])


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
    from slurmiso.isolation.lifecycle import teardown_or_fault

    teardown_or_fault(ctx)
    ctx.record.status, ctx.record.reason, ctx.record.env = REFUSED, reason, {}
    ctx.save()
    ctx.journal.append(
        "prolog",
        job=ctx.job_id,
        node=ctx.env.node,
        outcome="refused",
        reason=reason,
        **_journal_facts(ctx.record),
    )


def epilog(ctx: Context) -> None:
    from slurmiso.isolation import dcgm

    record = ctx.state.read_job(ctx.job_id)
    if record is None:
        _check_nothing_left(ctx)
        from slurmiso.isolation import fence

        # A prolog killed before its first save leaves the fence it wrote first; without the
        # file the plugin denies every GPU, so removing it never opens anything.
        fence.remove(ctx.state.state_dir, ctx.job_id)
        log.info("job %s has no record on this node; nothing to undo", ctx.job_id)
        return
    ctx.record = record
    if _earlier_attempts_epilog(ctx, record):
        # that attempt was torn down by this one's prolog; this attempt's record stays
        record.late_epilogs = max(0, record.late_epilogs - 1)
        ctx.save()
        log.info("job %s: an earlier attempt's epilog; attempt %s keeps its isolation",
                 ctx.job_id, record.restart_count)
        return
    started = time.time()
    resources = [r.to_dict() for r in record.resources]
    record.status = RELEASING
    ctx.save()
    dcgm.update(ctx.config.paths.dcgm_job_mapping_dir, ctx.job_id, record.resources, False)
    # The requeue a preempted job's wrapper asked for, before the teardown: a teardown that
    # fails (node fault) must not also lose the job (see hooks/requeue.py).
    requeue: Dict[str, Any] = {}
    from slurmiso.hooks.requeue import requested

    reported = _fold_events(ctx)
    _journal_unpreempted_end(ctx, reported)
    if record.steps_file:
        from slurmiso.hooks import stepfiles

        stepfiles.remove(record.steps_file, record.uid)
    if requested(reported, ctx.record.restart_count):
        from slurmiso.hooks.requeue import requeue_job

        outcome, why = requeue_job(ctx.job_id)
        requeue = {"requeue": outcome}
        if why:
            ctx.warn(f"the job's wrapper asked for a requeue and it failed: {why}")
    from slurmiso.isolation.lifecycle import teardown

    teardown(ctx)
    from slurmiso.isolation import fence

    fence.remove(ctx.state.state_dir, ctx.job_id)
    times: Dict[str, Any] = dict(record.times)
    times["epilog_end"] = round(time.time(), 3)
    ctx.journal.append(
        "job-end",
        job=ctx.job_id,
        node=ctx.env.node,
        outcome=record.reason and "refused" or "released",
        **_journal_facts(record, "user", "restart_count"),
        resources=resources,
        warnings=list(record.warnings),
        times=times,
        epilog_ms=round(1000 * (time.time() - started), 1),
        **requeue,
    )
    ctx.state.delete_job(ctx.job_id)


def _earlier_attempts_epilog(ctx: Context, record: JobRecord) -> bool:
    """Whether this epilog belongs to an attempt before the record's, and must leave it be.

    The Epilog's restart count is the job's count when it runs (22.05, measured): a requeued
    attempt's own epilog already shows the next count, a late epilog of the attempt before
    the record's shows the record's count. So, with ``seen`` the epilog's count and ``mine``
    the record's attempt:

    * ``seen < mine``: an earlier attempt's epilog (a Slurm that shows each epilog its own
      attempt): leave the record alone;
    * ``seen > mine``: the job was requeued since the record's attempt began, so that attempt
      is over, whatever skip the record still owes (the earlier epilog was lost): release;
    * ``seen == mine`` with a skip owed: the earlier attempt's late epilog while this attempt
      runs, or this attempt's own last epilog with the earlier one lost (slurmd died during
      it). Only slurmctld knows: one bounded query, on this rare path only. Unknown keeps the
      record (a running job's isolation is worth more than a leak reconcile cleans).
    """
    seen, mine = ctx.env.restart_count, record.restart_count
    if seen != mine or record.late_epilogs <= 0:
        return seen < mine
    running = attempt_running(ctx.job_id, ctx.env.node, mine)
    if running is None:
        log.warning("job %s: cannot tell a late epilog of an earlier attempt from attempt %s's "
                    "own; keeping its record (if the job has ended, 'slurmiso reconcile' or "
                    "the next prolog on this node releases it)", ctx.job_id, mine)
        return True
    if not running:
        log.info("job %s: attempt %s is over (slurmctld); the earlier attempt's epilog was "
                 "lost, this one releases", ctx.job_id, mine)
    return running


def attempt_running(job_id: str, node: str, attempt: int) -> Optional[bool]:
    """Whether slurmctld says attempt ``attempt`` of the job runs on ``node`` (None: unknown)."""
    from slurmiso.slurm.client import SlurmCli
    from slurmiso.slurm.jobenv import whole_number

    try:
        info = SlurmCli(timeout=QOS_LOOKUP_TIMEOUT_S).job_fields(
            job_id, ("State", "RestartCnt"), node=node)
    except SlurmError as exc:
        log.warning("job %s: slurmctld did not say whether it still runs: %s", job_id, exc)
        return None
    if info is None:
        return False  # not on this node any more, or slurmctld has forgotten the job
    restarts = whole_number(info["RestartCnt"], -1, 10**6)
    if restarts < 0:
        return None
    return info["State"] in ("RUNNING", "SUSPENDED", "CONFIGURING") and restarts == attempt


def _check_nothing_left(ctx: Context) -> None:
    """No record: fine only if nothing on the node still names this job.

    A deleted record or ``jobs/`` dir must not let an instance leak silently with exit 0: a
    claim the allocation table still gives the job, or (mig-dynamic) a MIG device on the
    job's GPUs that no record or claim accounts for, is a node fault with its name.
    """
    held = sorted(k for k, j in ctx.state.allocations().items() if j == ctx.job_id)
    if held:
        raise NodeFault(
            f"job {ctx.job_id} has no record in {ctx.state.jobs_dir} but "
            f"{ctx.state.allocations_path} still gives it {', '.join(held)}",
            hint="the job's state was lost; run 'slurmiso reconcile' to clean what it held",
        )
    if ctx.pool.mode == "mig-dynamic" and ctx.env.gpus:
        from slurmiso.isolation.mig_dynamic import unaccounted_instances

        lost = unaccounted_instances(ctx.state, ctx.backend, ctx.env.gpus)
        if lost:
            raise NodeFault(
                f"job {ctx.job_id} has no record in {ctx.state.jobs_dir}, and MIG device(s) "
                f"{'; '.join(lost)} belong to no job record",
                hint="state was lost or deleted; run 'slurmiso reconcile' to destroy them",
            )
