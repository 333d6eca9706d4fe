"""``--live`` checks of this node and the Slurm controller, as findings.

Read-only apart from the journal line ``reconcile --dry-run`` writes: orphaned MIG instances,
MPS daemons and leftover GPU processes (``lifecycle.node_status`` and a dry-run
``reconcile_node``),
QoS drift against the config (``sacctmgr show qos -P``), hooks missing from ``slurm.conf``
(``scontrol show config``), and MIG-typed GRES vs the MIG instances really on the GPUs. Each
check that cannot run becomes a finding that says why, so an unreachable Slurm degrades the
report instead of failing it.
"""

from __future__ import annotations

import logging
from collections import Counter
from typing import Any, Dict, List, Optional

from slurmiso.audit.findings import Finding, make
from slurmiso.errors import SlurmisoError, SlurmUnavailable

log = logging.getLogger(__name__)

_HOOKS = ("Prolog", "Epilog", "TaskProlog")


def live_findings(cfg: Any, node: str, slurm: Any) -> List[Finding]:
    """All live checks; ``slurm`` is a ``SlurmCli`` (injected so tests can fake it)."""
    from slurmiso.hostlist import node_name

    node = node_name(node)
    out: List[Finding] = []
    running: Optional[List[str]] = None
    checks = [
        ("jobs on the node", lambda: slurm.jobs_on_node(node)),
        ("QoS", lambda: qos_drift(cfg, parse_qos(slurm.run("sacctmgr", ["show", "qos", "-P"])))),
        ("hooks", lambda: hook_findings(slurm.run("scontrol", ["show", "config"]))),
    ]
    for what, check in checks:
        try:
            result = check()
        except SlurmUnavailable as err:
            out.append(make("error", "slurm-unreachable",
                            f"live checks could not reach Slurm: {err}",
                            "check slurmctld/slurmdbd (scontrol ping; sacctmgr show cluster); "
                            "QoS drift, hooks and job records were not checked", [node]))
            break
        except SlurmisoError as err:
            out.append(make("warning", "live-check-failed", f"live check of {what}: {err}",
                            "run the command by hand to see why"))
            continue
        if what == "jobs on the node":
            running = result
        else:
            out.extend(result)
    out.extend(_node_checks(cfg, node, running, slurm))
    return out


def _node_checks(cfg: Any, node: str, running: Optional[List[str]], slurm: Any) -> List[Finding]:
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
    if running is not None:
        try:
            out.extend(gres_drift(cfg, node, status, slurm.show_node(node)))
        except SlurmisoError as err:
            log.warning("GRES check of %s skipped: %s", node, err)
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


def parse_qos(text: str) -> Dict[str, Dict[str, str]]:
    """``sacctmgr show qos -P`` -> {name: {field: value}}."""
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if not lines:
        return {}
    header = lines[0].split("|")
    return {row[0]: dict(zip(header, row)) for row in (ln.split("|") for ln in lines[1:])}


def qos_drift(cfg: Any, qos: Dict[str, Dict[str, str]]) -> List[Finding]:
    """Differences between each class's QoS and what ``qos apply`` would have made."""
    from slurmiso.units import parse_slurm_time

    out = []
    for c in cfg.classes:
        spec = c.qos
        have = qos.get(spec.name)
        if have is None:
            out.append(make("error", "qos-missing", f"QoS {spec.name} (class {c.name}) does "
                            "not exist in Slurm", "slurmiso qos apply", [spec.name]))
            continue
        diffs = []
        if str(spec.priority) != have.get("Priority", ""):
            diffs.append(f"Priority {have.get('Priority')} (config {spec.priority})")
        preempt = {p for p in have.get("Preempt", "").split(",") if p}
        if set(spec.preempt) != preempt:
            diffs.append(f"Preempt {','.join(sorted(preempt)) or '-'} (config "
                         f"{','.join(sorted(spec.preempt)) or '-'})")
        if c.preemptible and have.get("PreemptMode", "").lower() not in ("requeue", ""):
            diffs.append(f"PreemptMode {have.get('PreemptMode')} (want requeue)")
        if c.checkpoint is not None and have.get("GraceTime"):
            grace = _seconds(have["GraceTime"], parse_slurm_time)
            if grace is not None and grace != c.checkpoint.grace_s:
                diffs.append(f"GraceTime {grace}s (config {c.checkpoint.grace_s}s)")
        if diffs:
            out.append(make("warning", "qos-drift", f"QoS {spec.name}: " + "; ".join(diffs),
                            "slurmiso qos apply (or sacctmgr modify qos)", [spec.name]))
    return out


def hook_findings(config_text: str) -> List[Finding]:
    values: Dict[str, str] = {}
    for line in config_text.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            values[key.strip()] = value.strip()
    missing = [h for h in _HOOKS if "slurmiso" not in values.get(h, "")]
    if not missing:
        return []
    return [make("error", "hooks-missing",
                 f"slurm.conf does not run slurmiso's {', '.join(missing)}: jobs get no "
                 "isolation and nothing is cleaned up",
                 "set Prolog=/usr/local/bin/slurmiso-prolog, Epilog=..., TaskProlog=... and "
                 "PrologFlags=Alloc, then scontrol reconfigure", missing)]


def gres_drift(cfg: Any, node: str, status: Dict[str, Any], show: Dict[str, str]) -> List[Finding]:
    """mig-static: MIG-typed GRES counts in Slurm vs instances on the GPUs."""
    if (status.get("mode") or "") != "mig-static":
        return []
    from slurmiso.slurm.gres import gpu_types

    gres = Counter({t: c for t, c in gpu_types(show.get("Gres", "")).items() if "g." in t})
    actual: Counter = Counter(i.get("profile", "?") for i in status.get("mig_instances", []))
    if not gres or gres == actual:
        return []
    return [make("error", "gres-mig-drift",
                 f"node {node}: Slurm GRES {dict(sorted(gres.items()))} but the GPUs hold "
                 f"{dict(sorted(actual.items()))}", "drain the node, slurmiso mig apply, "
                 "regenerate gres.conf (slurmiso gen gres-conf), restart slurmd", [node])]


def _seconds(text: str, parse: Any) -> Optional[int]:
    try:
        value = parse(text)
    except ValueError:
        return None
    return None if value is None else int(value)
