"""What slurmdbd must hold for the sandbox: its cluster, accounts, users and QoS.

The MariaDB under it is :mod:`.database`. Associations and QoS are asserted, then set: a second
``up`` reads them back and changes nothing. The QoS go through the one QoS model and diff
sites use (:mod:`slurmiso.slurm.qos`, what ``slurmiso qos apply`` runs).
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Dict, List, Optional, Sequence

from slurmiso.errors import SandboxError
from slurmiso.slurm import qos
from slurmiso_sandbox import layout
from slurmiso_sandbox.procs import environ_with, run

log = logging.getLogger(__name__)

SACCTMGR = "/usr/bin/sacctmgr"

ACCOUNTS = ("research", "ops")
USERS = ("root", layout.TEST_USER)
USER_ACCOUNT = "research"
ALL_QOS = ("normal", "infer", "train", "debug")
DEFAULT_QOS = "normal"


def sacctmgr(site: layout.Site, *args: str, check: bool = True, commit: bool = True) -> str:
    """``sacctmgr [-i] ARGS`` with the sandbox's SLURM_CONF (``-i``: commit without asking)."""
    env = environ_with({"SLURM_CONF": site.slurm_conf})
    cp = run(site.exe(SACCTMGR, *(("-i",) if commit else ()), *args), env=env, timeout=30,
             check=False, logfile=site.path("log", "slurmdbd.log"))
    out = (cp.stdout + cp.stderr).strip()
    # sacctmgr exits 1 when asked to change nothing; that is success for an idempotent step.
    if check and cp.returncode != 0 and "Nothing" not in out:
        raise SandboxError(f"sacctmgr {' '.join(args)} failed: {out}")
    return cp.stdout


def dbd_ready(site: layout.Site) -> bool:
    env = environ_with({"SLURM_CONF": site.slurm_conf})
    cp = run(site.exe(SACCTMGR, "-n", "-P", "show", "cluster", "format=cluster"), env=env,
             check=False, timeout=15)
    return cp.returncode == 0


def _rows(site: layout.Site, *args: str) -> List[List[str]]:
    out = sacctmgr(site, "-n", "-P", "show", *args)
    return [line.split("|") for line in out.splitlines() if line.strip()]


def sandbox_qos(site: layout.Site) -> List[qos.Qos]:
    """The QoS the sandbox holds: its own slurmiso.yaml's classes as ``qos apply`` makes them
    (priority, preemption, GraceTime), without the per-job limits (MaxWall, MaxTRESPerJob),
    which the QoS integration test applies and takes off again."""
    return [replace(q, max_wall_s=None, max_gpus_per_job=None)
            for q in qos.desired_qos(layout.sandbox_config(site))]


def qos_changes(want: Sequence[qos.Qos], live: Dict[str, qos.Qos]) -> List[qos.Change]:
    """What makes slurmdbd's QoS ``live`` hold ``want`` (assert, then act: [] when it does)."""
    return qos.diff(want, live)


class _Sacctmgr:
    """:class:`slurmiso.slurm.qos.Runner` over the sandbox's sacctmgr (in its root, if any)."""

    def __init__(self, site: layout.Site) -> None:
        self.site = site

    def run(self, cmd: str, args: Sequence[str], timeout: Optional[float] = None) -> str:
        if cmd != "sacctmgr":
            raise SandboxError(f"the sandbox's QoS runner runs sacctmgr only, not {cmd}")
        return sacctmgr(self.site, *args, commit=False)


def ensure_accounting(site: layout.Site) -> List[str]:
    """Cluster, QoS, accounts, users and their QoS grants; returns what was changed."""
    changed: List[str] = []
    if [layout.CLUSTER] not in _rows(site, "cluster", "format=cluster"):
        sacctmgr(site, "add", "cluster", layout.CLUSTER)
        changed.append(f"cluster {layout.CLUSTER}")
    runner = _Sacctmgr(site)
    changes = qos_changes(sandbox_qos(site), qos.read_live(runner))
    qos.apply_changes(runner, changes)
    changed += [f"qos {name}" for name in dict.fromkeys(c.qos for c in changes)]
    accounts = {r[0] for r in _rows(site, "account", "format=account")}
    for a in ACCOUNTS:
        if a not in accounts:
            sacctmgr(site, "add", "account", a, f"cluster={layout.CLUSTER}", "description=sandbox",
                     "organization=slurmiso")
            changed.append(f"account {a}")
    changed += _ensure_users(site)
    return changed


def _ensure_users(site: layout.Site) -> List[str]:
    changed: List[str] = []
    assoc = {
        (r[0], r[1]): r
        for r in _rows(site, "assoc", "where", f"cluster={layout.CLUSTER}",
                       "format=account,user,qos,defaultqos")
    }
    for u in USERS:
        if (USER_ACCOUNT, u) not in assoc:
            sacctmgr(site, "add", "user", u, f"account={USER_ACCOUNT}", f"cluster={layout.CLUSTER}")
            changed.append(f"user {u}")
    want = set(ALL_QOS)
    stale = [u for u in USERS
             if set(filter(None, assoc.get((USER_ACCOUNT, u), ["", "", ""])[2].split(",")))
             != want or assoc.get((USER_ACCOUNT, u), ["", "", "", ""])[3] != DEFAULT_QOS]
    if stale:
        sacctmgr(site, "modify", "user", "where", f"name={','.join(stale)}",
                 f"cluster={layout.CLUSTER}", "set", f"qos={','.join(ALL_QOS)}",
                 f"defaultqos={DEFAULT_QOS}")
        changed.append(f"qos grants {','.join(stale)}")
    defaults = {r[0]: r[1] for r in _rows(site, "user", "format=user,defaultaccount")}
    wrong = [u for u in USERS if defaults.get(u) != USER_ACCOUNT]
    if wrong:
        sacctmgr(site, "modify", "user", "where", f"name={','.join(wrong)}", "set",
                 f"defaultaccount={USER_ACCOUNT}")
        changed.append(f"default account {','.join(wrong)}")
    return changed
