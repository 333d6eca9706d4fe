"""``slurmiso reconcile``: clean what crashed jobs and nodes left behind on this node."""

from __future__ import annotations

import argparse
from typing import Any, List, Optional

from slurmiso.cli.output import print_json


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "reconcile",
        help="remove orphaned MIG instances, dead MPS daemons and stale job records",
        description=(
            "Compares this node's slurmiso records with the jobs Slurm runs here and with the "
            "GPUs, then undoes what belongs to no running job: records of ended jobs (as the "
            "epilog would), orphaned dynamic MIG instances, MPS daemons with no client. Run "
            "as root; the monitor runs it periodically."
        ),
        epilog="examples:\n  slurmiso reconcile --dry-run\n  slurmiso reconcile --json",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--node", default="", help="node name (default: $SLURMD_NODENAME or hostname)")
    p.add_argument(
        "--dry-run", action="store_true", help="report what would be done, change nothing"
    )
    p.add_argument(
        "--no-slurm",
        action="store_true",
        help="do not ask Slurm which jobs run here (then job records are kept)",
    )
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=run)


def reconcile_node(cfg: Any, node: str, dry_run: bool, live_jobs: Optional[List[str]]) -> List[str]:
    """Fix (or, dry-run, list) this node's leftovers; one line per fix."""
    from slurmiso.config.model import node_name
    from slurmiso.gpu import open_backend
    from slurmiso.hooks.jobenv import JobEnv
    from slurmiso.hooks.runner import _teardown
    from slurmiso.isolation.base import Context, ReconcileContext, handler_for
    from slurmiso.state import Journal, NodeState

    node = node_name(node)
    pool = cfg.pool_for_node(node)
    if pool is None:
        return []
    state = NodeState(cfg.paths.state_dir_for(node))
    journal = Journal(cfg.paths.journal_for(node))
    backend = open_backend(cfg.gpu.backend, cfg.gpu.sim_state, node)
    fixes: List[str] = []
    with state.locked():
        if live_jobs is not None:
            for jid, rec in state.jobs().items():
                if jid in live_jobs or jid.split("_")[0] in live_jobs:
                    continue
                fixes.append(
                    f"job {jid} ended but its record remained: undo {rec.get('mode')} setup"
                )
                if dry_run:
                    continue
                env = JobEnv(
                    jid,
                    int(rec.get("uid", -1)),
                    rec.get("user", ""),
                    node,
                    rec.get("partition", ""),
                    rec.get("account", ""),
                    rec.get("qos", ""),
                    tuple(rec.get("gpus", [])),
                    int(rec.get("restart_count", 0)),
                )
                ctx = Context(
                    cfg,
                    env,
                    pool,
                    cfg.job_class(rec.get("class") or ""),
                    state,
                    journal,
                    lambda: backend,
                    record=rec,
                )
                _teardown(ctx, why="reconcile: job no longer runs here")
                state.delete_job(jid)
            records = state.jobs()
            allocs = state.allocations()
            stale = {k: v for k, v in allocs.items() if v not in records}
            if stale:
                fixes.extend(
                    f"allocation {k} held by ended job {v}: released" for k, v in stale.items()
                )
                if not dry_run:
                    state.set_allocations({k: v for k, v in allocs.items() if k not in stale})
        rctx = ReconcileContext(cfg, pool, state, journal, backend, dry_run, live_jobs)
        fixes.extend(handler_for(pool.mode).reconcile(rctx))
    for line in fixes:
        journal.append("reconcile", node=node, fix=line, dry_run=dry_run)
    return fixes


def run(args: argparse.Namespace) -> int:
    from slurmiso.config import load_config
    from slurmiso.config.model import node_name

    cfg = load_config(args.config)
    live: Optional[List[str]] = None
    if not args.no_slurm:
        from slurmiso.slurm.client import SlurmCli

        live = SlurmCli().jobs_on_node(node_name(args.node))
    fixes = reconcile_node(cfg, args.node, args.dry_run, live)
    if args.json:
        print_json({"dry_run": args.dry_run, "fixes": fixes})
    else:
        for line in fixes:
            print(("would: " if args.dry_run else "fixed: ") + line)
        if not fixes:
            print("nothing to reconcile")
    return 0
