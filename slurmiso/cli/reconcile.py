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
            "epilog would), orphaned dynamic MIG instances, MPS daemons with no client; and "
            "ends a ladder restraint (suspend, throttle) past its bound while no monitor is "
            "alive, as monitor.ladder.on_bound says. Run as root; the monitor runs it "
            "periodically."
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


def run(args: argparse.Namespace) -> int:
    from slurmiso.config import load_config
    from slurmiso.hostlist import node_name

    cfg = load_config(args.config)
    live: Optional[List[str]] = None
    if not args.no_slurm:
        from slurmiso.slurm.client import SlurmCli

        live = SlurmCli().jobs_on_node(node_name(args.node))
    from slurmiso.isolation.lifecycle import reconcile_node

    fixes = reconcile_node(cfg, args.node, args.dry_run, live)
    if not args.no_slurm:
        fixes += _restraints(cfg, node_name(args.node), args.dry_run)
    if args.json:
        print_json({"dry_run": args.dry_run, "fixes": fixes})
    else:
        for line in fixes:
            print(("would: " if args.dry_run else "fixed: ") + line)
        if not fixes:
            print("nothing to reconcile")
    return 0


def _restraints(cfg: Any, node: str, dry_run: bool) -> List[str]:
    """The ladder's restraints on this node past their bound while no monitor is alive
    (its heartbeat, stamped by the agent, is old): ended, journaled (issue 33)."""
    import time

    from slurmiso import restraints as r
    from slurmiso.slurm.client import SlurmCli
    from slurmiso.state import Journal

    slurm = SlurmCli()
    state_dir = cfg.paths.state_dir_for(node)
    now = time.time()
    book = r.refresh(slurm, state_dir, node, now)
    if "error" in book:
        return [f"restraints not checked: Slurm did not answer ({book['error']})"]
    return r.end_over_bound(slurm, state_dir, book["restraints"], now, cfg.monitor.interval_s,
                            cfg.monitor.ladder.unthrottle_signal, dry_run,
                            Journal(cfg.paths.journal_for(node)))
