"""The sandbox's accounting side: a private MariaDB and what slurmdbd must hold.

The database lives under ``<dir>/mysql`` with its own socket and a loopback port, so a site's
MariaDB (if any) is never touched. Associations and QoS are asserted, then set: a second
``up`` reads them back and changes nothing. The QoS go through the one QoS model and diff
sites use (:mod:`slurmiso.slurm.qos`, what ``slurmiso qos apply`` runs).
"""

from __future__ import annotations

import logging
import os
import shutil
from dataclasses import replace
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence

from slurmiso.errors import SandboxError
from slurmiso.slurm import qos as Q
from slurmiso_sandbox import layout as L
from slurmiso_sandbox.procs import environ_with, run, wait_until

log = logging.getLogger(__name__)

MARIADB_INSTALL_DB = "/usr/bin/mariadb-install-db"
MARIADB = "/usr/bin/mariadb"
MARIADB_ADMIN = "/usr/bin/mariadb-admin"
MARIADBD = "/usr/sbin/mariadbd"
SACCTMGR = "/usr/bin/sacctmgr"

ACCOUNTS = ("research", "ops")
USERS = ("root", L.TEST_USER)
USER_ACCOUNT = "research"
ALL_QOS = ("normal", "infer", "train", "debug")
DEFAULT_QOS = "normal"


def mysql_paths(site: L.Site) -> Dict[str, str]:
    return {
        "datadir": site.path("mysql", "data"),
        "socket": site.path("mysql", "mysqld.sock"),
        "marker": site.path("mysql", ".installed"),
        "pidfile": site.path("run", "mariadb.pid"),
        "log": site.path("log", "mariadb.log"),
    }


def install_db(site: L.Site) -> bool:
    """Create the datadir once; a half-made one (crash during install) is made again."""
    p = mysql_paths(site)
    if os.path.exists(p["marker"]):
        return False
    shutil.rmtree(p["datadir"], ignore_errors=True)
    os.makedirs(p["datadir"], exist_ok=True)
    run(site.exe(
        MARIADB_INSTALL_DB, "--no-defaults", "--user=root", f"--datadir={p['datadir']}",
        "--auth-root-authentication-method=socket", "--skip-test-db",
    ), timeout=180, env=environ_with({}))
    Path(p["marker"]).write_text("ok\n")
    return True


def mariadbd_argv(site: L.Site) -> List[str]:
    p = mysql_paths(site)
    return site.exe(
        MARIADBD, "--no-defaults", "--user=root", f"--datadir={p['datadir']}",
        f"--socket={p['socket']}", f"--pid-file={p['pidfile']}", f"--log-error={p['log']}",
        f"--port={site.mysql_port}", "--bind-address=127.0.0.1", "--skip-name-resolve",
        "--skip-log-bin", "--innodb-buffer-pool-size=256M", "--innodb-log-file-size=64M",
        "--innodb-lock-wait-timeout=900",
        # MariaDB 11.4+ (the roots' 11.8) turns snapshot isolation on; slurmdbd 26.05 warns
        # it "will fatal when a write conflicts" (measured). --loose-: older servers ignore it.
        *(["--loose-innodb-snapshot-isolation=OFF"] if site.chroot else []),
    )


def mysql_ready(site: L.Site) -> bool:
    p = mysql_paths(site)
    cp = run(site.exe(MARIADB_ADMIN, "--no-defaults", f"--socket={p['socket']}", "ping"),
             check=False, timeout=10)
    return cp.returncode == 0


def wait_mysql(site: L.Site, alive: Callable[[], bool]) -> None:
    wait_until("mariadbd", lambda: mysql_ready(site), timeout=60,
               logfile=mysql_paths(site)["log"], alive=alive)


def ensure_db_user(site: L.Site) -> None:
    """Database and the loopback account slurmdbd connects with (idempotent SQL)."""
    user = f"'{L.DB_USER}'@'127.0.0.1'"
    sql = (
        f"CREATE DATABASE IF NOT EXISTS {L.DB_NAME};"
        f"CREATE USER IF NOT EXISTS {user} IDENTIFIED BY '{L.DB_PASS}';"
        f"GRANT ALL ON {L.DB_NAME}.* TO {user};"
        "FLUSH PRIVILEGES;"
    )
    p = mysql_paths(site)
    run(site.exe(MARIADB, "--no-defaults", f"--socket={p['socket']}", "-u", "root", "-e", sql),
        timeout=30, logfile=p["log"])


# --- slurmdbd contents -----------------------------------------------------------------


def sacctmgr(site: L.Site, *args: str, check: bool = True, commit: bool = True) -> str:
    """``sacctmgr [-i] ARGS`` with the sandbox's SLURM_CONF (``-i``: commit without asking)."""
    env = environ_with({"SLURM_CONF": site.slurm_conf})
    cp = run(site.exe(SACCTMGR, *(("-i",) if commit else ()), *args), env=env, timeout=30,
             check=False, logfile=site.path("log", "slurmdbd.log"))
    out = (cp.stdout + cp.stderr).strip()
    # sacctmgr exits 1 when asked to change nothing; that is success for an idempotent step.
    if check and cp.returncode != 0 and "Nothing" not in out:
        raise SandboxError(f"sacctmgr {' '.join(args)} failed: {out}")
    return cp.stdout


def dbd_ready(site: L.Site) -> bool:
    env = environ_with({"SLURM_CONF": site.slurm_conf})
    cp = run(site.exe(SACCTMGR, "-n", "-P", "show", "cluster", "format=cluster"), env=env,
             check=False, timeout=15)
    return cp.returncode == 0


def _rows(site: L.Site, *args: str) -> List[List[str]]:
    out = sacctmgr(site, "-n", "-P", "show", *args)
    return [line.split("|") for line in out.splitlines() if line.strip()]


def sandbox_qos(site: L.Site) -> List[Q.Qos]:
    """The QoS the sandbox holds: its own slurmiso.yaml's classes as ``qos apply`` makes them
    (priority, preemption, GraceTime), without the per-job limits (MaxWall, MaxTRESPerJob),
    which the QoS integration test applies and takes off again."""
    return [replace(q, max_wall_s=None, max_gpus_per_job=None)
            for q in Q.desired_qos(L.sandbox_config(site))]


def qos_changes(want: Sequence[Q.Qos], live: Dict[str, Q.Qos]) -> List[Q.Change]:
    """What makes slurmdbd's QoS ``live`` hold ``want`` (assert, then act: [] when it does)."""
    return Q.diff(want, live)


class _Sacctmgr:
    """:class:`slurmiso.slurm.qos.Runner` over the sandbox's sacctmgr (in its root, if any)."""

    def __init__(self, site: L.Site) -> None:
        self.site = site

    def run(self, cmd: str, args: Sequence[str], timeout: Optional[float] = None) -> str:
        if cmd != "sacctmgr":
            raise SandboxError(f"the sandbox's QoS runner runs sacctmgr only, not {cmd}")
        return sacctmgr(self.site, *args, commit=False)


def ensure_accounting(site: L.Site) -> List[str]:
    """Cluster, QoS, accounts, users and their QoS grants; returns what was changed."""
    changed: List[str] = []
    if [L.CLUSTER] not in _rows(site, "cluster", "format=cluster"):
        sacctmgr(site, "add", "cluster", L.CLUSTER)
        changed.append(f"cluster {L.CLUSTER}")
    runner = _Sacctmgr(site)
    changes = qos_changes(sandbox_qos(site), Q.read_live(runner))
    Q.apply_changes(runner, changes)
    changed += [f"qos {name}" for name in dict.fromkeys(c.qos for c in changes)]
    accounts = {r[0] for r in _rows(site, "account", "format=account")}
    for a in ACCOUNTS:
        if a not in accounts:
            sacctmgr(site, "add", "account", a, f"cluster={L.CLUSTER}", "description=sandbox",
                     "organization=slurmiso")
            changed.append(f"account {a}")
    changed += _ensure_users(site)
    return changed


def _ensure_users(site: L.Site) -> List[str]:
    changed: List[str] = []
    assoc = {
        (r[0], r[1]): r
        for r in _rows(site, "assoc", "where", f"cluster={L.CLUSTER}",
                       "format=account,user,qos,defaultqos")
    }
    for u in USERS:
        if (USER_ACCOUNT, u) not in assoc:
            sacctmgr(site, "add", "user", u, f"account={USER_ACCOUNT}", f"cluster={L.CLUSTER}")
            changed.append(f"user {u}")
    want = set(ALL_QOS)
    stale = [u for u in USERS
             if set(filter(None, assoc.get((USER_ACCOUNT, u), ["", "", ""])[2].split(",")))
             != want or assoc.get((USER_ACCOUNT, u), ["", "", "", ""])[3] != DEFAULT_QOS]
    if stale:
        sacctmgr(site, "modify", "user", "where", f"name={','.join(stale)}",
                 f"cluster={L.CLUSTER}", "set", f"qos={','.join(ALL_QOS)}",
                 f"defaultqos={DEFAULT_QOS}")
        changed.append(f"qos grants {','.join(stale)}")
    defaults = {r[0]: r[1] for r in _rows(site, "user", "format=user,defaultaccount")}
    wrong = [u for u in USERS if defaults.get(u) != USER_ACCOUNT]
    if wrong:
        sacctmgr(site, "modify", "user", "where", f"name={','.join(wrong)}", "set",
                 f"defaultaccount={USER_ACCOUNT}")
        changed.append(f"default account {','.join(wrong)}")
    return changed
