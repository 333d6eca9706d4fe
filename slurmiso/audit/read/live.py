"""``--live``: doctor's checks on the cluster as it is now, plus this node's leftovers.

The cluster checks (slurm.conf settings, QoS against the config, hooks, GRES against the MIG
instances really on the GPUs) are doctor's pure checks run on a snapshot collected now
(:func:`slurmiso.doctor.collect.collect`): one implementation, one set of finding codes.
Added here, because only a live node has them: what ended jobs left behind (a dry-run
``reconcile_node``, which writes only its journal line) and MIG instances or GPU processes
no job record accounts for (``lifecycle.node_status``). A check that cannot run becomes a
finding that says why, so an unreachable Slurm degrades the report instead of failing it.
"""

from __future__ import annotations

import logging
from typing import Any, Dict, List, Optional

from slurmiso.audit.figures.findings import make
from slurmiso.doctor import Finding
from slurmiso.errors import SlurmisoError, SlurmUnavailable

log = logging.getLogger(__name__)


def live_findings(cfg: Any, node: str, slurm: Any) -> List[Finding]:
    """All live checks; ``slurm`` is a ``SlurmCli`` (injected so tests can fake it)."""
    from slurmiso.doctor import run_checks
    from slurmiso.doctor.collect import collect
    from slurmiso.hostlist import node_name

    node = node_name(node)
    out: List[Finding] = []
    running: Optional[List[str]] = None
    try:
        snap = collect(cfg, node, slurm)
        running = slurm.jobs_on_node(node)
    except SlurmUnavailable as err:
        out.append(make("error", "slurm-unreachable",
                        f"live checks could not reach Slurm: {err}",
                        "check slurmctld/slurmdbd (scontrol ping; sacctmgr show cluster); "
                        "cluster settings, QoS, hooks and job records were not checked", [node]))
    except SlurmisoError as err:
        out.append(make("warning", "live-check-failed", f"live checks of the cluster: {err}",
                        "run 'slurmiso doctor' to see why"))
    else:
        out.extend(run_checks(snap, cfg))
    out.extend(_node_checks(cfg, node, running))
    return out


def _node_checks(cfg: Any, node: str, running: Optional[List[str]]) -> List[Finding]:
    from slurmiso.isolation.lifecycle import node_status, reconcile_node

    out: List[Finding] = []
    if cfg.pool_for_node(node) is None:
        return [make("info", "live-node-not-in-pool",
                     f"node {node} is in no pool of the config: no GPU checks here",
                     "run 'slurmiso audit --live' on a GPU node (or pass --node)", [node])]
    try:
        status = node_status(cfg, node, True)
        fixes = reconcile_node(cfg, node, True, running)
    except SlurmisoError as err:
        return [make("error", "live-node-check-failed", f"node {node}: {err}",
                     "run 'slurmiso status' on the node for details", [node])]
    if fixes:
        out.append(make("warning", "leftovers",
                        f"node {node}: {len(fixes)} leftover(s) of ended jobs: "
                        + "; ".join(fixes[:5]),
                        "run 'slurmiso reconcile' on the node (the monitor does it "
                        "periodically)", [node]))
    out.extend(gpu_leftovers(status))
    return out


def gpu_leftovers(status: Dict[str, Any]) -> List[Finding]:
    """MIG instances and GPU processes no job record accounts for."""
    owned = set()
    for job in status.get("jobs", []):
        for r in job.get("resources", []):
            owned.add(str(r.get("uuid") or ""))
            owned.add(str(r.get("gpu")))
        owned.update(str(g) for g in job.get("gpus", []))
    node = status.get("node", "?")
    out = []
    if (status.get("mode") or "") == "mig-dynamic":
        orphans = [i for i in status.get("mig_instances", []) if i.get("uuid") not in owned]
        if orphans:
            out.append(make("warning", "orphaned-mig-instances",
                            f"node {node}: {len(orphans)} MIG instance(s) belong to no job: "
                            + ", ".join(f"GPU{i['gpu_index']} {i['profile']}" for i in orphans),
                            "slurmiso reconcile (destroys them)", [node]))
    procs = [p for p in status.get("processes", [])
             if str(p.get("gpu_index")) not in owned and (p.get("mig_uuid") or "") not in owned]
    if procs and not status.get("jobs"):
        out.append(make("warning", "leftover-gpu-processes",
                        f"node {node}: {len(procs)} GPU process(es) with no job on the node "
                        "(pids " + ", ".join(str(p["pid"]) for p in procs[:10]) + ")",
                        "kill them or find who started them outside Slurm", [node]))
    return out
