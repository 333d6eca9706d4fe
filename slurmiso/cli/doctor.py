"""``slurmiso doctor``: every mismatch between the live Slurm, this node and the config.

Exit 0 when nothing is wrong (info lines only), 1 when an error or warning is found, 5 when
Slurm cannot be reached. Each finding names its fix.
"""

from __future__ import annotations

import argparse
from typing import Any

from slurmiso.cli.output import print_json

_EPILOG = """\
examples:
  slurmiso doctor                         # on the controller: slurm.conf, QoS, partitions
  slurmiso doctor --node gpu017           # on a GPU node: also its GPUs, MIG, hook files
  slurmiso doctor --json --ignore mig-mixed-gpu
  slurmiso doctor --save-snapshot snap.json; slurmiso doctor --snapshot snap.json
"""


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "doctor", help="check the live Slurm cluster and this GPU node against the config",
        description=__doc__.splitlines()[0].split(": ", 1)[1], epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--node", default="",
                   help="this GPU node's Slurm name (default: $SLURMD_NODENAME or hostname)")
    p.add_argument("--json", action="store_true",
                   help="findings as JSON: {severity, code, message, fix}")
    p.add_argument("--ignore", action="append", default=[], metavar="CODE",
                   help="leave out findings with this code (repeatable)")
    p.add_argument("--snapshot", metavar="FILE",
                   help="check a recorded snapshot instead of the live cluster")
    p.add_argument("--save-snapshot", metavar="FILE",
                   help="also write what was read from the cluster to FILE (JSON)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from slurmiso.config import load_config
    from slurmiso.doctor import run_checks
    from slurmiso.doctor.collect import collect, load_snapshot, save_snapshot

    cfg = load_config(args.config)
    snap = load_snapshot(args.snapshot) if args.snapshot else collect(cfg, args.node)
    if args.save_snapshot:
        save_snapshot(snap, args.save_snapshot)
    findings = run_checks(snap, cfg, args.ignore)
    problems = [f for f in findings if f.is_problem]
    gpu = snap.get("gpu_node") or {}
    if args.json:
        print_json({"ok": not problems, "problems": len(problems),
                    "slurm_version": snap.get("slurm_version", ""),
                    "node": gpu.get("node"), "config": cfg.source,
                    "findings": [f.to_dict() for f in findings]})
        return 1 if problems else 0
    where = f" and node {gpu['node']}" if gpu else ""
    print(f"slurmiso doctor: Slurm {snap.get('slurm_version') or '?'}{where} "
          f"against {cfg.source}")
    for f in findings:
        print(f"{f.severity.upper():7} {f.code}: {f.message}")
        print(f"        fix: {f.fix}")
    print(f"{len(problems)} problem(s) found" if problems else "no problems found")
    return 1 if problems else 0
