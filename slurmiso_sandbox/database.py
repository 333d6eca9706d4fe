"""The sandbox's private MariaDB: datadir, server argv, readiness, slurmdbd's database user.

The database lives under ``<dir>/mysql`` with its own socket and a loopback port, so a site's
MariaDB (if any) is never touched. :mod:`.services` runs the server; what slurmdbd holds in it
(accounts, users, QoS) is :mod:`.accounting`.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Callable, Dict, List

from slurmiso_sandbox import layout
from slurmiso_sandbox.procs import environ_with, run, wait_until

MARIADB_INSTALL_DB = "/usr/bin/mariadb-install-db"
MARIADB = "/usr/bin/mariadb"
MARIADB_ADMIN = "/usr/bin/mariadb-admin"
MARIADBD = "/usr/sbin/mariadbd"


def mysql_paths(site: layout.Site) -> Dict[str, str]:
    return {
        "datadir": site.path("mysql", "data"),
        "socket": site.path("mysql", "mysqld.sock"),
        "marker": site.path("mysql", ".installed"),
        "pidfile": site.path("run", "mariadb.pid"),
        "log": site.path("log", "mariadb.log"),
    }


def install_db(site: layout.Site) -> bool:
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


def mariadbd_argv(site: layout.Site) -> List[str]:
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


def mysql_ready(site: layout.Site) -> bool:
    p = mysql_paths(site)
    cp = run(site.exe(MARIADB_ADMIN, "--no-defaults", f"--socket={p['socket']}", "ping"),
             check=False, timeout=10)
    return cp.returncode == 0


def wait_mysql(site: layout.Site, alive: Callable[[], bool]) -> None:
    wait_until("mariadbd", lambda: mysql_ready(site), timeout=60,
               logfile=mysql_paths(site)["log"], alive=alive)


def ensure_db_user(site: layout.Site) -> None:
    """Database and the loopback account slurmdbd connects with (idempotent SQL)."""
    user = f"'{layout.DB_USER}'@'127.0.0.1'"
    sql = (
        f"CREATE DATABASE IF NOT EXISTS {layout.DB_NAME};"
        f"CREATE USER IF NOT EXISTS {user} IDENTIFIED BY '{layout.DB_PASS}';"
        f"GRANT ALL ON {layout.DB_NAME}.* TO {user};"
        "FLUSH PRIVILEGES;"
    )
    p = mysql_paths(site)
    run(site.exe(MARIADB, "--no-defaults", f"--socket={p['socket']}", "-u", "root", "-e", sql),
        timeout=30, logfile=p["log"])
