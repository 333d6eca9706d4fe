"""``slurmiso run -- CMD``: the job wrapper (isolation env, checkpoint on preemption, requeue)."""

from __future__ import annotations

import argparse
import logging
import os
from typing import Any, Dict, List, Optional

EPILOG = """\
examples:
  # in a batch script: run the program as a job step; Slurm signals every step's
  # processes (no 'B:', which would signal only the batch shell)
  #SBATCH --qos=train --requeue --signal=USR1@300
  srun slurmiso run -- python train.py --epochs 90
  slurmiso run --ckpt-dir /scratch/$USER/run1 --grace 60 -- ./train
  slurmiso run -- python train.py        # on a laptop: checkpoint-on-signal still works

The program is asked to checkpoint with SLURMISO_CKPT_SIGNAL (USR2 by default) and reports
a finished checkpoint through the marker file SLURMISO_CKPT_MARKER; on restart it finds the
last good one in SLURMISO_RESUME. The monitor's throttle signals (URG, WINCH by default)
are the wrapper's own: it creates SLURMISO_THROTTLE_FILE on the first and removes it on the
second. See docs/checkpoint.md (and slurmiso.checkpoint).
exit status: the program's own, 143 when the wrapper stopped it for a checkpoint,
1 when the prolog refused the job, 2 when the command cannot be run."""


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "run",
        help="run a program with its job's GPU isolation; checkpoint and requeue on preemption",
        description=(
            "Applies the isolation the prolog recorded for this job (or refuses to start, "
            "with the reason), runs CMD in its own process group, and on Slurm's preemption "
            "SIGTERM or its time-limit --signal asks CMD to checkpoint, waits up to the "
            "grace, ends it and lets the job be requeued (requeuing itself before the time "
            "limit). Outside Slurm it only runs CMD, still with checkpoint-on-signal."
        ),
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--class",
        dest="job_class",
        default="",
        metavar="C",
        help="job class whose checkpoint settings apply (default: the class the "
        "prolog recorded, else the config's default_class)",
    )
    p.add_argument(
        "--ckpt-dir",
        default="",
        metavar="DIR",
        help="checkpoint directory (default: $SLURMISO_CKPT_DIR, else ./slurmiso-ckpt/<job id>)",
    )
    p.add_argument(
        "--grace",
        type=float,
        default=None,
        metavar="S",
        help="seconds between the stop signal and Slurm's SIGKILL (default: the "
        "class's checkpoint.grace; match the QoS GraceTime)",
    )
    p.add_argument(
        "--signal",
        default="USR1",
        metavar="SIG",
        help="the signal Slurm sends before the time limit (sbatch "
        "--signal=SIG@T, no 'B:': the wrapper runs as a step under srun); on it the "
        "wrapper checkpoints and requeues (default: USR1)",
    )
    p.add_argument(
        "--ckpt-signal",
        default="",
        metavar="SIG",
        help="signal that asks the program to checkpoint (default: the class's "
        "checkpoint.signal, USR2; NCCL uses USR1)",
    )
    p.add_argument(
        "--max-requeues",
        type=int,
        default=None,
        metavar="N",
        help="requeue before the time limit only while SLURM_RESTART_COUNT < N "
        "(default: the class's checkpoint.max_requeues)",
    )
    p.add_argument(
        "--rank",
        type=int,
        default=0,
        metavar="N",
        help="the task (SLURM_PROCID) that checkpoints in a multi-task job; "
        "the others wait for its report (default: 0)",
    )
    p.add_argument(
        "--events",
        default="",
        metavar="FILE",
        help="append the job's events (JSON lines) here (default: "
        "$SLURMISO_EVENTS_FILE, set by the prolog)",
    )
    p.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- CMD [ARGS...]")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from slurmiso.config.model import Checkpoint, Ladder
    from slurmiso.errors import SlurmisoError, UsageError
    from slurmiso.hostlist import node_name
    from slurmiso.wrapper.record import (
        isolation_env,
        load_config_quietly,
        read_job_record,
        refusal,
    )
    from slurmiso.wrapper.resume import default_ckpt_dir
    from slurmiso.wrapper.signals import JobEnvironment, parse_signal
    from slurmiso.wrapper.supervisor import Events, Settings, Supervisor

    log = logging.getLogger("slurmiso.wrapper")
    if getattr(args, "verbose", 0) == 0:
        log.setLevel(logging.INFO)  # the job's output should say what the wrapper did
    argv: List[str] = list(args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd)
    if not argv:
        raise UsageError("no program to run", hint="usage: slurmiso run [OPTIONS] -- CMD [ARGS...]")
    env = dict(os.environ)
    job = JobEnvironment.from_env(env)
    # outside Slurm only a config asked for (--class, -c) is read: a laptop has none
    cfg = (
        load_config_quietly(getattr(args, "config", None))
        if job.in_slurm or args.job_class or getattr(args, "config", None)
        else None
    )
    record = read_job_record(cfg, job.job_id, node_name(job.node)) if job.in_slurm else None
    why = refusal(record, env)
    if why:
        raise SlurmisoError(
            f"job {job.job_id or '(local)'} was refused by slurmiso and will not start: {why}",
            hint="resubmit as the reason says; the node is fine",
        )
    if job.in_slurm and cfg is not None and record is None:
        log.warning(
            "no slurmiso record for job %s on this node (node not in a pool, or the prolog is "
            "not installed): running without slurmiso isolation",
            job.job_id,
        )
    ckpt = _checkpoint_settings(cfg, args.job_class, record, env) or Checkpoint()
    ladder = cfg.monitor.ladder if cfg is not None else Ladder()
    settings = Settings(
        ckpt_dir=os.path.abspath(args.ckpt_dir)
        if args.ckpt_dir
        else default_ckpt_dir(env, job.job_id, os.getcwd()),
        ckpt_signal=parse_signal(args.ckpt_signal or ckpt.signal),
        warn_signal=parse_signal(args.signal),
        grace_s=float(args.grace if args.grace is not None else ckpt.grace_s),
        max_requeues=args.max_requeues if args.max_requeues is not None else ckpt.max_requeues,
        rank=args.rank,
        throttle_signal=parse_signal(ladder.throttle_signal),
        unthrottle_signal=parse_signal(ladder.unthrottle_signal),
    )
    if settings.grace_s <= 0:
        raise UsageError(f"--grace must be positive, not {settings.grace_s:g}")
    events_path = args.events or env.get("SLURMISO_EVENTS_FILE", "")
    journal = None
    if events_path:
        from slurmiso.state import Journal

        journal = Journal(events_path)
    keep_dirs = bool(job.in_slurm or args.ckpt_dir or env.get("SLURMISO_CKPT_DIR"))
    steps = _step_folder(env, job, settings.rank)
    # exit_process: after a stop, end the process at once (no interpreter teardown on the
    # preemption path); outside Slurm the empty folders must still be cleaned up below.
    supervisor = Supervisor(argv, settings, job, env, isolation_env(record), Events(journal),
                            exit_process=keep_dirs, tick=steps.tick if steps else None)
    created = [] if keep_dirs else _missing_dirs(settings.ckpt_dir, os.getcwd())
    try:
        return supervisor.run()
    finally:
        if steps is not None:
            steps.finish()
        # Outside Slurm with the default directory: leave nothing behind unless a checkpoint
        # was written (directories that stayed empty are removed; rmdir never removes content).
        _remove_if_empty(created)


def _step_folder(env: Dict[str, str], job: Any, rank: int) -> Optional[Any]:
    """Where the prolog named a step file, the designated rank's wrapper folds the program's
    step report into it (wrapper/steps.py); the program learns where to report in its env."""
    from slurmiso.wrapper.steps import STEPS_FILE_ENV

    path = env.get(STEPS_FILE_ENV, "")
    if not path or job.procid != rank:
        return None
    from slurmiso.wrapper.steps import StepFolder

    folder = StepFolder(path, job.job_id or "local")
    env.update(folder.start())
    return folder


def _missing_dirs(ckpt_dir: str, stop: str) -> List[str]:
    """``ckpt_dir``'s metadata folder and its parents up to ``stop`` that do not exist yet,
    deepest first (the supervisor creates ``<ckpt_dir>/.slurmiso``)."""
    from slurmiso.wrapper.checkpoint_protocol import meta_dir

    out: List[str] = []
    d = meta_dir(os.path.abspath(ckpt_dir))
    stop = os.path.abspath(stop)
    while d != stop and d.startswith(stop + os.sep) and not os.path.exists(d):
        out.append(d)
        d = os.path.dirname(d)
    return out


def _remove_if_empty(dirs: List[str]) -> None:
    for d in dirs:  # deepest first
        try:
            os.rmdir(d)
        except OSError:
            return  # not empty (a checkpoint, a report): keep it and everything above


def _checkpoint_settings(cfg: Any, name: str, record: Any, env: dict) -> Optional[Any]:
    """The class's checkpoint block: --class, the prolog's class, $SLURMISO_CLASS, default."""
    from slurmiso.errors import UsageError

    if cfg is None:
        return None
    chosen = name or (record.job_class if record else "") or env.get("SLURMISO_CLASS", "")
    chosen = chosen or cfg.default_class
    cls = cfg.job_class(chosen) if chosen else None
    if name and cls is None:
        known = ", ".join(c.name for c in cfg.classes)
        raise UsageError(f"unknown job class {name!r}", hint=f"classes in {cfg.source}: {known}")
    return cls.checkpoint if cls is not None else None
