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
            "--no-gpus, the GPUs through the configured backend; unless --no-slurm, the "
            "restraints the monitor's ladder put on jobs here (suspended, throttled: their "
            "AdminComment note), with their age, bound and cause, and whether the monitor "
            "is alive (its last scrape of the agent)."
        ),
        epilog="examples:\n  slurmiso status\n  slurmiso status --node n3 --json",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--node", default="", help="node name (default: $SLURMD_NODENAME or hostname)")
    p.add_argument("--no-gpus", action="store_true", help="do not open the GPU backend")
    p.add_argument("--no-slurm", action="store_true",
                   help="do not ask Slurm for the ladder's restraints here (show the node's "
                        "record of them as last read)")
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


#: A restrained job's status by the note's step.
_RESTRAINED = {"suspend": "suspended", "throttle": "throttled", "host-limit": "host-limited"}


def run(args: argparse.Namespace) -> int:
    from slurmiso.config import load_config

    cfg = load_config(args.config)
    from slurmiso.isolation.lifecycle import node_status

    data = node_status(cfg, args.node, not args.no_gpus)
    if data["mode"] == "mps" and not args.no_gpus:
        data["mps"] = _mps_arrangement(cfg, data["node"])
    data["ladder"] = _ladder(cfg, data["node"], args.no_slurm)
    restrained = {r["job"]: r for r in data["ladder"]["restraints"]}
    for j in data["jobs"]:
        r = restrained.get(j["job"])
        j["restraint"] = r
        if r is not None:
            j["status"] = _RESTRAINED.get(r["step"], "restrained")
    if args.json:
        print_json(data)
        return 0
    print(f"node {data['node']}: pool {data['pool'] or '(none)'} ({data['mode'] or '-'})")
    if "mps" in data:
        from slurmiso.isolation.mps_view import lines

        print("\n".join(lines(data["mps"])))
    rows: List[List[Any]] = []
    for j in data["jobs"]:
        shares = ", ".join(_share(r) for r in j["resources"]) or "-"
        gpus = ",".join(str(g) for g in j["gpus"]) or "-"
        rows.append([j["job"], j["class"] or "-", j["status"], gpus, shares])
    print(table(rows, ["JOB", "CLASS", "STATUS", "GPUS", "SHARE"]) if rows else "no jobs")
    for j in data["jobs"]:
        if j["restraint"] is not None:
            from slurmiso.restraints import describe

            print(f"  job {j['job']}: {describe(j['restraint'])}")
        if j["reason"]:
            print(f"  job {j['job']}: {j['reason']}")
        for w in j["warnings"]:
            print(f"  job {j['job']}: warning: {w}")
    _ladder_lines(data["ladder"], {j["job"] for j in data["jobs"]})
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


def _mps_arrangement(cfg: Any, node: str) -> Dict[str, Any]:
    """Which MPS arrangement this node's GPUs run and why, whether the driver has MPS v3
    (read from the control binary: docs/mps-v3.md), and each GPU's servers in force."""
    from slurmiso.errors import SlurmisoError
    from slurmiso.gpu import open_backend
    from slurmiso.isolation.mps_daemon import mps_control_for
    from slurmiso.isolation.mps_view import arrangement
    from slurmiso.state import NodeState

    state = NodeState(cfg.paths.state_dir_for(node))
    try:
        with open_backend(cfg.gpu.backend, cfg.gpu.sim_state, node) as backend:
            control = mps_control_for(backend)
            return arrangement(cfg.pool_for_node(node), control.protocol(), state.state_dir,
                               control, state.jobs())
    except SlurmisoError as exc:
        return {"arrangement": "unknown", "why": f"not read: {exc}", "v3": False,
                "v3_reason": f"not read: {exc}", "gpus": []}


def _ladder(cfg: Any, node: str, no_slurm: bool) -> Dict[str, Any]:
    """The ladder's restraints here and the monitor's heartbeat (slurmiso/restraints.py)."""
    import time

    from slurmiso.restraints import node_view

    slurm = None
    if not no_slurm:
        from slurmiso.slurm.client import SlurmCli

        slurm = SlurmCli()
    return node_view(cfg.paths.state_dir_for(node), node, cfg.monitor.interval_s,
                     time.time(), slurm)


def _ladder_lines(view: Dict[str, Any], shown: Any) -> None:
    from slurmiso.restraints import describe

    for r in view["restraints"]:
        if r["job"] not in shown:  # a restrained job without a record here
            print(f"  job {r['job']} (no slurmiso record here): {describe(r)}")
    age = view["heartbeat_age_s"]
    if view.get("error") and (view["restraints"] or age is not None):
        print(f"  restraints as last read: Slurm did not answer ({view['error']})")
    if view["restraints"] or age is not None:
        seen = "never" if age is None else f"{age:.0f}s ago"
        state = "alive" if view["monitor_alive"] else "NOT ALIVE"
        print(f"monitor: last scraped this node {seen} ({state}; limit "
              f"{view['alive_limit_s']:.0f}s)")
