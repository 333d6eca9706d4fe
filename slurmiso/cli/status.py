"""``slurmiso status``: on a node, which job holds which GPU, MIG instance or MPS share."""

from __future__ import annotations

import argparse
from typing import Any, Dict, List

from slurmiso.cli.output import print_json, table


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "status",
        help="show which job holds which GPU, MIG instance or MPS share on this node",
        description=(
            "Reads this node's slurmiso records (state dir from the config) and, unless "
            "--no-gpus, the GPUs through the configured backend."
        ),
        epilog="examples:\n  slurmiso status\n  slurmiso status --node n3 --json",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--node", default="", help="node name (default: $SLURMD_NODENAME or hostname)")
    p.add_argument("--no-gpus", action="store_true", help="do not open the GPU backend")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=run)


def _share(r: Dict[str, Any]) -> str:
    kind = r.get("kind", "")
    if kind.startswith("mig"):
        return f"MIG {r.get('profile', '?')}@{r.get('start', '?')} {r.get('uuid', '')}".strip()
    if kind == "mps":
        mem = r.get("memory_limit_mb")
        return f"MPS {r.get('thread_percentage', '?')}%" + (f" {mem}MiB" if mem else "")
    if kind == "shared-gpu":
        return "timeslice"
    return "whole GPU"


def run(args: argparse.Namespace) -> int:
    from slurmiso.config import load_config

    cfg = load_config(args.config)
    from slurmiso.isolation.lifecycle import node_status

    data = node_status(cfg, args.node, not args.no_gpus)
    if args.json:
        print_json(data)
        return 0
    print(f"node {data['node']}: pool {data['pool'] or '(none)'} ({data['mode'] or '-'})")
    rows: List[List[Any]] = []
    for j in data["jobs"]:
        shares = ", ".join(_share(r) for r in j["resources"]) or "-"
        gpus = ",".join(str(g) for g in j["gpus"]) or "-"
        rows.append([j["job"], j["class"] or "-", j["status"], gpus, shares])
    print(table(rows, ["JOB", "CLASS", "STATUS", "GPUS", "SHARE"]) if rows else "no jobs")
    for j in data["jobs"]:
        if j["reason"]:
            print(f"  job {j['job']}: {j['reason']}")
        for w in j["warnings"]:
            print(f"  job {j['job']}: warning: {w}")
    if "gpus" in data:
        owners: Dict[str, str] = {}
        for j in data["jobs"]:
            for r in j["resources"]:
                owners[str(r.get("uuid") or r.get("gpu"))] = j["job"]
        print()
        grows = [
            [
                d["index"],
                d["name"],
                f"{d['memory_used_mb']}/{d['memory_total_mb']} MiB",
                "on" if d["mig_enabled"] else "off",
                owners.get(d["uuid"], owners.get(str(d["index"]), "-")),
            ]
            for d in data["gpus"]
        ]
        print(table(grows, ["GPU", "NAME", "MEMORY", "MIG", "JOB"]))
        if data["mig_instances"]:
            irows = [
                [
                    i["gpu_index"],
                    i["gi_id"],
                    i["profile"],
                    i["placement_start"],
                    i["uuid"] or "-",
                    owners.get(i["uuid"], "-"),
                ]
                for i in data["mig_instances"]
            ]
            print()
            print(table(irows, ["GPU", "GI", "PROFILE", "START", "UUID", "JOB"]))
    return 0
