"""The sandbox's daemons: how each is started, recognised, waited for and stopped.

    for svc in daemons(site):          # in start order: mariadb, slurmdbd, slurmctld, slurmds
        start(site, svc)               # no-op when its pid file names a live daemon
    stop(daemons(site))                # SIGTERM together, then SIGKILL

Daemons run in the foreground (``-D``) in their own session, so the pid we record is the
daemon's and our exit does not take them along. munged is apart (:mod:`.munge`).
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, List, Optional, Set, Tuple

from slurmiso.errors import SandboxError
from slurmiso_sandbox import accounting, database, layout
from slurmiso_sandbox.procs import (
    environ_with,
    has_env,
    process_matches,
    read_pid,
    run,
    spawn,
    tail,
    terminate,
    wait_until,
)

log = logging.getLogger(__name__)

SLURMCTLD = "/usr/sbin/slurmctld"
SLURMD = "/usr/sbin/slurmd"
SLURMDBD = "/usr/sbin/slurmdbd"
SCONTROL = "/usr/bin/scontrol"
SINFO = "/usr/bin/sinfo"
UNSHARE = "/usr/bin/unshare"
NSENTER = "/usr/bin/nsenter"
BASH = "/bin/bash"
ENV = "/usr/bin/env"

NODES_TIMEOUT = 60.0
#: Node states that count as "up" for a warm cluster that may be running jobs.
USABLE_STATES = {"idle", "mixed", "allocated", "completing"}
DAEMON_NAMES = ("slurmd", "slurmctld", "slurmdbd", "slurmstepd", "mariadbd", "mysqld")


def slurm_env(site: layout.Site) -> Dict[str, str]:
    return environ_with({"SLURM_CONF": site.slurm_conf})


@dataclass(frozen=True)
class Service:
    """A sandbox daemon: how to start it and how to recognise it among all processes."""

    name: str
    argv: Tuple[str, ...]
    pidfile: str
    logfile: str
    proc_names: Tuple[str, ...]
    needles: Tuple[str, ...] = ()
    port: int = 0
    #: Runs in the sandbox's cgroup v2 mount namespace (where the site has one).
    ns: bool = False

    def pid(self) -> Optional[int]:
        pid = read_pid(self.pidfile)
        if pid and process_matches(pid, self.proc_names, self.needles):
            return pid
        return None


#: The cgroup v2 namespace holder: a mount namespace whose /sys/fs/cgroup (and the Slurm
#: root's) is the cgroup2 hierarchy alone; every Slurm daemon of the sandbox enters it.
#: ``$1`` is the Slurm root ("" for the host's Slurm), ``$2`` the sandbox dir.
CGROUP_NS_SCRIPT = """set -e
umount -l /sys/fs/cgroup 2>/dev/null || true
mount -t cgroup2 cgroup2 /sys/fs/cgroup
if [ -n "$1" ]; then
  umount -l "$1/sys/fs/cgroup" 2>/dev/null || true
  mount --bind /sys/fs/cgroup "$1/sys/fs/cgroup"
fi
exec -a "slurmiso-cgroup-ns $2" sleep infinity
"""


def cgroup_ns_service(site: layout.Site) -> Service:
    return Service(
        "cgroup-ns",
        (UNSHARE, "--mount", "--propagation", "slave", "--", BASH, "-c", CGROUP_NS_SCRIPT,
         "slurmiso-cgroup-ns", site.chroot, site.root),
        site.path("run", "cgroup-ns.pid"), site.path("log", "cgroup-ns.out"), ("sleep",),
        (f"slurmiso-cgroup-ns {site.root}",))


def _daemon(site: layout.Site, *argv: str, node: bool = False) -> Tuple[str, ...]:
    """A Slurm daemon's argv in this site: in its root, and for a ``node`` (slurmd) with the
    hybrid-host shim (hybrid_shim.c) preloaded where the site needs it (``env`` inside the
    root: the shim is built against the root's C library, not the host's). A slurmd is
    pivoted into the root, not chrooted, so its jobs' containers can run rootless."""
    enter = site.pivoted if node else site.exe
    if node and site.hybrid_shim:
        return tuple(enter(ENV, f"LD_PRELOAD={site.hybrid_shim}", *argv))
    return tuple(enter(*argv))


def daemons(site: layout.Site) -> List[Service]:
    """Every daemon the sandbox runs, in start order (munged is listed separately)."""
    p = site.path
    my = database.mysql_paths(site)
    ns = site.cgroup_ns
    out = [cgroup_ns_service(site)] if ns else []
    out += [
        Service("mariadb", tuple(database.mariadbd_argv(site)), my["pidfile"], my["log"],
                ("mariadbd", "mysqld"), (f"--datadir={my['datadir']}",), site.mysql_port),
        Service("slurmdbd", _daemon(site, SLURMDBD, "-D"), p("run", "slurmdbd.pid"),
                p("log", "slurmdbd.log"), ("slurmdbd",), (), site.dbd_port, ns=ns),
        Service("slurmctld", _daemon(site, SLURMCTLD, "-D", "-f", site.slurm_conf),
                p("run", "slurmctld.pid"), p("log", "slurmctld.log"), ("slurmctld",),
                (site.slurm_conf,), site.ctld_port, ns=ns),
    ]
    for n in site.nodes:
        out.append(Service(
            f"slurmd-{n.name}",
            _daemon(site, SLURMD, "-D", "-f", site.slurm_conf, "-N", n.name, node=True),
            p("run", f"slurmd-{n.name}.pid"), p("log", f"slurmd-{n.name}.log"), ("slurmd",),
            (site.slurm_conf, f"-N {n.name}"), n.port, ns=ns,
        ))
    return out


def ns_argv(site: layout.Site, *argv: str) -> List[str]:
    """``argv`` run in the sandbox's cgroup v2 mount namespace (as is where it has none)."""
    if not site.cgroup_ns:
        return list(argv)
    holder = cgroup_ns_service(site).pid()
    if holder is None:
        raise SandboxError("the sandbox's cgroup v2 namespace holder is not running",
                           hint="slurmiso sandbox up")
    return [NSENTER, f"--mount=/proc/{holder}/ns/mnt", "--", *argv]


def service(site: layout.Site, name: str) -> Service:
    return next(s for s in daemons(site) if s.name == name)


def start(site: layout.Site, svc: Service) -> int:
    """Start ``svc`` unless it runs; returns its pid."""
    pid = svc.pid()
    if pid:
        return pid
    if svc.port:
        owner = port_owner(svc.port)
        if owner:
            raise SandboxError(
                f"cannot start {svc.name}: port {svc.port} is taken by {owner}",
                hint="is another sandbox running? stop it with 'slurmiso sandbox down --dir ...'",
            )
    out = site.path("log", f"{svc.name}.out")
    argv = ns_argv(site, *svc.argv) if svc.ns else list(svc.argv)
    pid = spawn(argv, env=slurm_env(site), logfile=out)
    Path(svc.pidfile).write_text(f"{pid}\n")
    log.info("started %s (pid %d)", svc.name, pid)
    return pid


def port_owner(port: int) -> str:
    """Who listens on TCP ``port`` ("" when free): the sandbox's ports are fixed."""
    import psutil

    try:
        conns = psutil.net_connections(kind="tcp")
    except (psutil.AccessDenied, OSError):
        return ""
    for c in conns:
        if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port:
            try:
                cmd = " ".join(psutil.Process(c.pid).cmdline()) if c.pid else ""
            except psutil.Error:
                cmd = ""
            return f"pid {c.pid} ({cmd})" if c.pid else "another process"
    return ""


def stop(svcs: List[Service], timeout: float = 20) -> List[str]:
    """SIGTERM the running ones together (then SIGKILL); returns the names that ran."""
    running = {svc.name: pid for svc in svcs if (pid := svc.pid())}
    if not running:
        return []
    t0 = time.monotonic()
    killed = terminate(list(running.values()), timeout=timeout)
    for name, pid in running.items():
        if pid in killed:
            log.warning("%s (pid %d) ignored SIGTERM for %gs and was killed", name, pid, timeout)
    log.info("stopped %s in %.1fs", ", ".join(running), time.monotonic() - t0)
    return list(running)


def alive(svc: Service) -> Callable[[], bool]:
    """Whether the daemon still runs. Slurm's daemons rewrite their pid file at start
    (open with O_TRUNC, then write): read in between it is empty, so look again before
    calling the daemon dead (a 24.11 sync-gres once failed on that)."""
    def check() -> bool:
        for _ in range(3):
            if svc.pid() is not None:
                return True
            time.sleep(0.1)
        return False

    return check


def leftovers(site: layout.Site) -> List[Tuple[int, str]]:
    """Processes of this sandbox still alive: daemons, step daemons and the jobs under them."""
    import psutil

    found: Dict[int, str] = {}
    for proc in psutil.process_iter(["pid", "name", "cmdline"]):
        try:
            if proc.info["name"] not in DAEMON_NAMES:
                continue
            cmd = " ".join(proc.info["cmdline"] or [])
            if site.root.rstrip("/") + "/" in cmd or has_env(proc.pid, "SLURM_CONF",
                                                              site.slurm_conf):
                found[proc.pid] = cmd or proc.info["name"]
                if proc.info["name"] == "slurmstepd":
                    for child in proc.children(recursive=True):
                        found[child.pid] = " ".join(child.cmdline()) or child.name()
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    found.pop(os.getpid(), None)
    return sorted(found.items())


def start_mariadb(site: layout.Site) -> str:
    fresh = database.install_db(site)
    svc = service(site, "mariadb")
    was = svc.pid()
    start(site, svc)
    database.wait_mysql(site, alive(svc))
    database.ensure_db_user(site)
    return ("initialised, " if fresh else "") + ("running" if was else "started")


def start_slurmdbd(site: layout.Site, restart: bool) -> str:
    svc = service(site, "slurmdbd")
    if restart and stop([svc]):
        log.info("slurmdbd.conf changed: restarting slurmdbd")
    was = svc.pid()
    start(site, svc)
    wait_until("slurmdbd", lambda: accounting.dbd_ready(site), timeout=90, logfile=svc.logfile,
               alive=alive(svc), interval=0.5)
    return "running" if was else "started"


def start_slurm(site: layout.Site, restart: bool) -> str:
    """slurmctld and the slurmds; restarted when slurm.conf/gres.conf changed under them."""
    ctld = service(site, "slurmctld")
    slurmds = [s for s in daemons(site) if s.name.startswith("slurmd-")]
    if restart:
        stopped = stop(slurmds) + stop([ctld])
        if stopped:
            log.info("slurm.conf/gres.conf changed: restarted %s", ", ".join(stopped))
    started = [s.name for s in [ctld, *slurmds] if not s.pid()]
    start(site, ctld)
    wait_until("slurmctld", lambda: _ctld_up(site), timeout=60, logfile=ctld.logfile,
               alive=alive(ctld), interval=0.3)
    for s in slurmds:
        start(site, s)
    return f"started {', '.join(started)}" if started else "running"


def _ctld_up(site: layout.Site) -> bool:
    cp = run(site.exe(SCONTROL, "ping"), env=slurm_env(site), check=False, timeout=15)
    return cp.returncode == 0 and "UP" in cp.stdout


def node_states(site: layout.Site) -> Dict[str, Tuple[str, str]]:
    """node -> (state, reason) as sinfo reports it (state like 'idle', 'down*', 'drained')."""
    cp = run(site.exe(SINFO, "-h", "-N", "-o", "%N|%T|%E"), env=slurm_env(site), check=False,
             timeout=15)
    out: Dict[str, Tuple[str, str]] = {}
    for line in cp.stdout.splitlines():
        name, state, reason = (line.split("|") + ["", ""])[:3]
        reason = reason.strip()
        out[name] = (state.strip(), "" if reason == "none" else reason)
    return out


def nodes_not_in(site: layout.Site, ok: Set[str]) -> Dict[str, Tuple[str, str]]:
    """node -> (state, reason) of each sandbox node whose state is not in ``ok``."""
    states = node_states(site)
    return {n.name: states.get(n.name, ("missing", "")) for n in site.nodes
            if states.get(n.name, ("", ""))[0] not in ok}


def wait_nodes(site: layout.Site) -> str:
    """Until every node is usable; drained nodes (a failed hook in an earlier run) resume."""
    deadline = time.monotonic() + NODES_TIMEOUT
    resumed: List[str] = []
    while True:
        bad = nodes_not_in(site, USABLE_STATES)
        if not bad:
            break
        for name, (state, reason) in bad.items():
            if ("drain" in state or state == "down") and name not in resumed:
                log.warning("node %s is %s (%s): resuming it", name, state, reason)
                run(site.exe(SCONTROL, "update", f"nodename={name}", "state=resume"),
                    env=slurm_env(site), check=False, timeout=15)
                resumed.append(name)
            if "inval" in state:
                raise SandboxError(_nodes_error(site, bad, "rejected its configuration"))
        if time.monotonic() > deadline:
            raise SandboxError(_nodes_error(site, bad, f"not up after {NODES_TIMEOUT:g}s"))
        time.sleep(0.3)
    detail = ", ".join(f"{n}={s}" for n, (s, _r) in sorted(node_states(site).items()))
    return detail + (f" (resumed {', '.join(resumed)})" if resumed else "")


def wait_registered(site: layout.Site) -> None:
    """Until every slurmd has registered again (drained is fine, unknown/down is not)."""
    deadline = time.monotonic() + NODES_TIMEOUT
    back = USABLE_STATES | {"drained", "draining"}
    while True:
        bad = nodes_not_in(site, back)
        if not bad:
            return
        if time.monotonic() > deadline:  # inval too: a slurmd re-registers once more
            raise SandboxError(_nodes_error(site, bad, f"not back after {NODES_TIMEOUT:g}s"))
        time.sleep(0.3)


def _nodes_error(site: layout.Site, bad: Dict[str, Tuple[str, str]], what: str) -> str:
    first = sorted(bad)[0]
    lines = [f"nodes {', '.join(f'{n}={s} {r}'.strip() for n, (s, r) in sorted(bad.items()))}"
             f": {what}"]
    for logfile in (site.path("log", f"slurmd-{first}.log"), site.path("log", "slurmctld.log")):
        lines += [f"--- last lines of {logfile} ---", tail(logfile, 10)]
    return "\n".join(lines)
