"""``slurmiso task-prolog``, ``slurmiso prolog``, ``slurmiso epilog``: the hooks as subcommands.

Same code as the ``slurmiso-prolog``/``-epilog``/``-task-prolog`` executables, for sites that
prefer one entry point (``TaskProlog=/usr/bin/slurmiso task-prolog`` is not valid in
slurm.conf, which takes no arguments, so the executables remain the documented form).
"""

from __future__ import annotations

import argparse
from typing import Any


def add_parser(sub: Any) -> None:
    for name, helptext in (
        ("prolog", "run the Slurm Prolog for $SLURM_JOB_ID (root; normally run by slurmd)"),
        ("epilog", "run the Slurm Epilog for $SLURM_JOB_ID (root; normally run by slurmd)"),
        ("task-prolog", "print the job's isolation environment as TaskProlog export lines"),
    ):
        p = sub.add_parser(name, help=helptext, description=helptext)
        p.set_defaults(func=_run, hook=name)


def _run(args: argparse.Namespace) -> int:
    import os

    if args.config:
        os.environ["SLURMISO_CONFIG"] = args.config
    if args.hook == "task-prolog":
        from slurmiso.hooks.task_prolog import main as task_main

        return task_main([])
    import sys

    from slurmiso.hooks.prolog import NO_JOB_EXIT, missing_job

    why = missing_job(os.environ, args.hook)
    if why:
        print(why, file=sys.stderr)
        return NO_JOB_EXIT
    from slurmiso.hooks.runner import run_hook

    return run_hook(args.hook, os.environ)
