"""The ladder's restraints on this node (issue 33): each one is visible with its age and
cause, and one that outlived its bound or its monitor is a warning.

``snap["restraints"]`` is :func:`slurmiso.restraints.node_view` of the inspected
node: the restraints the monitor noted in its jobs' ``AdminComment`` (through root's record
on the node) and the age of the monitor's heartbeat (its last scrape of the agent).
"""

from __future__ import annotations

from typing import Any, Dict, List

from slurmiso.config.model import Config
from slurmiso.doctor import Check, Finding, Snapshot


def _subjects(items: List[Dict[str, Any]]) -> tuple:
    return tuple(str(r["job"]) for r in items)


def check_restraints(snap: Snapshot, cfg: Config) -> List[Finding]:
    from slurmiso.restraints import describe

    view = snap.get("restraints")
    if not view:
        return []
    items: List[Dict[str, Any]] = list(view.get("restraints") or [])
    out: List[Finding] = []
    if view.get("error"):
        out.append(Finding("warning", "ladder-restraints-unread",
                           f"the ladder's restraints here could not be read from Slurm "
                           f"({view['error']}); shown as last read",
                           "check that slurmctld answers (scontrol ping)"))
    if not items:
        return out
    age = view.get("heartbeat_age_s")
    alive = bool(view.get("monitor_alive"))
    over = [r for r in items if r.get("over_bound")]
    for r in over:
        out.append(Finding(
            "warning", "ladder-restraint-over-bound",
            f"job {r['job']}: {describe(r)}",
            "slurmiso reconcile on this node ends it as on_bound says once the monitor is "
            "not alive; with a live monitor, see its 'monitor status' ladder section",
            (str(r["job"]),), 1))
    if not alive:
        seen = "never" if age is None else f"{age:.0f}s ago"
        out.append(Finding(
            "warning", "ladder-monitor-silent",
            f"{len(items)} job(s) restrained by the ladder here and the monitor last scraped "
            f"this node {seen} (limit {view.get('alive_limit_s', 0):.0f}s): nothing will "
            f"release them before their bound",
            "start slurmiso-monitor (systemctl status slurmiso-monitor), or run "
            "'slurmiso reconcile' here to end those past their bound",
            _subjects(items), len(items)))
    rest = [r for r in items if not r.get("over_bound")]
    if rest:
        out.append(Finding("info", "ladder-restraint",
                           "; ".join(f"job {r['job']}: {describe(r)}" for r in rest[:5]),
                           "", _subjects(rest), len(rest)))
    return out


CHECKS: List[Check] = [check_restraints]
