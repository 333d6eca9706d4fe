"""Bring the sandbox cluster up, take it down, say how it is.

    report = up("/var/lib/slurmiso-sandbox")   # then down(...), status(...)

``up`` is a list of small steps, each idempotent (assert, then act) and timed: packages,
test user, files, simulated GPUs, munge, MariaDB, slurmdbd, accounting, slurmctld, slurmds,
nodes idle. A second ``up`` finds everything in place and only checks; after a crash it
restarts only what died. The steps live in :mod:`.packages`, :mod:`.files`, :mod:`.munge`,
:mod:`.cgroups`, :mod:`.services` and :mod:`.accounting`; this module orders them.
"""

from __future__ import annotations

import logging
import os
import pwd
import shutil
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional

from slurmiso.errors import SandboxError, SlurmisoError
from slurmiso_sandbox import (
    accounting,
    cgroups,
    files,
    guard,
    layout,
    munge,
    oci,
    packages,
    roots,
    services,
    sites,
    state,
)
from slurmiso_sandbox.procs import file_lock, process_matches, read_pid, terminate

log = logging.getLogger(__name__)


@dataclass
class Step:
    name: str
    seconds: float = 0.0
    detail: str = ""


@dataclass
class UpReport:
    site: layout.Site
    steps: List[Step] = field(default_factory=list)

    @property
    def seconds(self) -> float:
        return sum(s.seconds for s in self.steps)


@contextmanager
def _step(report: UpReport, name: str) -> Iterator[Step]:
    """Time a step and name it in any error, so a failure says where ``up`` stopped."""
    step = Step(name)
    t0 = time.monotonic()
    log.info("sandbox up: %s ...", name)
    try:
        yield step
    except SandboxError as err:
        raise SandboxError(f"sandbox up, step '{name}': {err.message}", hint=err.hint) from err
    except SlurmisoError as err:
        raise SandboxError(f"sandbox up, step '{name}': {err}") from err
    except OSError as err:
        raise SandboxError(f"sandbox up, step '{name}': {err}") from err
    finally:
        step.seconds = time.monotonic() - t0
    report.steps.append(step)
    log.info("sandbox up: %s done in %.1fs %s", name, step.seconds, step.detail)


def lock_path(site: layout.Site) -> str:
    # Beside the dir, not in it: 'down --purge' removes the dir while holding the lock.
    return f"{site.root.rstrip('/')}.lock"


def up(root: Optional[str] = None, slurm: Optional[str] = None,
       from_packages: bool = False, force: bool = False,
       host: Optional[guard.Host] = None, plain: Optional[str] = None,
       cgroup: Optional[str] = None) -> UpReport:
    """Bring the sandbox up from whatever state it is in (one ``up``/``down`` at a time).

    ``from_packages``: Slurm runs the installed packages' hooks and plugins, not the checkout's.
    ``plain``: the GPU the exclusive, mps and timeslice nodes play (:func:`.sites.plain_gpu`).
    Before anything is touched, a host with a Slurm or munge setup the sandbox did not create
    is refused (:mod:`.guard`); ``force`` runs anyway and records it as the sandbox's.
    """
    if os.geteuid() != 0:
        raise SandboxError("sandbox up must run as root (it runs Slurm's daemons and mknod)")
    site = sites.make_site(root, slurm, plain, cgroup)
    if from_packages:
        if site.chroot:
            raise SandboxError("--from-packages runs the host's Slurm only",
                               hint="drop --slurm, or install the packages in the root")
        site = sites.packaged_site(site)
    host = host or guard.Host()
    before = guard.check_host(host, force=force)
    with file_lock(lock_path(site), "sandbox up"):
        return _up(site, lambda: guard.record_created(host, before))


def _up(site: layout.Site, record_host: Callable[[], List[str]] = lambda: []) -> UpReport:
    """The steps; ``record_host`` marks the munge key (and any Slurm config) they made as the
    sandbox's, after each step that can make one (apt's munge postinst, ``mungekey``)."""
    report = UpReport(site)
    if site.chroot:
        with _step(report, f"slurm {site.slurm} root") as s:
            path, s.detail = roots.ensure_root(site.slurm)
    else:
        with _step(report, "packages") as s:
            s.detail = packages.install_packages(site)
            made = record_host()
            if made:
                s.detail += f"; recorded as the sandbox's: {', '.join(made)}"
        if os.path.isdir(site.path("slurm-bin")):
            shutil.rmtree(site.path("slurm-bin"))
    with _step(report, "test user") as s:
        s.detail = packages.ensure_test_user()
        if site.chroot:
            s.detail += "; " + packages.ensure_root_user(site)
    if site.chroot:
        with _step(report, "root mounts+slurmiso") as s:
            s.detail = prepare_root(site)
    os.makedirs(site.path("run"), exist_ok=True)
    state.record(site, slurm=site.slurm, port_base=site.port_base,
                 plain_gpu=state.plain_spec(site), cgroup=site.cgroup)
    with _step(report, "spank plugin") as s:
        s.detail = files.build_spank(site)
    with _step(report, "simulated GPUs") as s:
        # first: gres.conf names the caps of the instances the simulated GPUs really have
        s.detail = ", ".join(files.init_sim(site)) or "unchanged"
    with _step(report, "files") as s:
        site = report.site = files.with_live_slots(site)
        changed = files.write_files(site)
        s.detail = f"{len(changed)} changed" if changed else "unchanged"
    if oci.supported(site):
        with _step(report, "oci bundle") as s:
            s.detail = files.write_bundle(site)
    with _step(report, "munge") as s:
        s.detail = munge.ensure_munge(site)
        made = record_host()
        if made:
            s.detail += f"; recorded as the sandbox's: {', '.join(made)}"
    if site.cgroup_ns:
        with _step(report, "cgroup v2 namespace") as s:
            s.detail = cgroups.start_cgroup_ns(site)
    with _step(report, "mariadb") as s:
        s.detail = services.start_mariadb(site)
    with _step(report, "slurmdbd") as s:
        s.detail = services.start_slurmdbd(site, restart="etc/slurmdbd.conf" in changed)
    with _step(report, "accounting") as s:
        s.detail = ", ".join(accounting.ensure_accounting(site)) or "unchanged"
    with _step(report, "slurmctld+slurmd") as s:
        conf_changed = bool(files.SLURMD_CONFS & set(changed))
        s.detail = services.start_slurm(site, restart=conf_changed)
    with _step(report, "nodes") as s:
        s.detail = services.wait_nodes(site)
    return report


def prepare_root(site: layout.Site) -> str:
    """Mounts, this checkout's slurmiso for the root's Python, and the client wrappers."""
    root = sites.site_root(site)
    assert root is not None
    os.makedirs(site.root, exist_ok=True)
    made = roots.ensure_mounts(root, site.root)
    copied = roots.copy_checkout(files.checkout(), site.path("lib", "py"))
    os.makedirs(site.path("slurm-bin"), exist_ok=True)
    for name, text in roots.client_wrappers(root).items():
        files.write_if_changed(site.path("slurm-bin", name), text, 0o755)
    done = [f"mounted {', '.join(made)}"] if made else []
    if copied:
        done.append("slurmiso copied")
    return "; ".join(done) or "in place"


def sync_gres(root: Optional[str] = None) -> List[str]:
    """Tell Slurm about the simulated GPUs' MIG instances as they are now: rewrite gres.conf
    and the nodes' ``Gres=``, and restart slurmctld and the slurmds when that changed them.

    The sandbox's after-re-layout step: slurmctld 22.05 keeps a node's GRES counts across
    ``scontrol reconfigure`` (measured), so a new count needs the restart. Drained nodes stay
    drained (whoever drained them resumes them); returns the files changed.
    """
    if os.geteuid() != 0:
        raise SandboxError("sandbox sync-gres must run as root (it restarts Slurm's daemons)")
    site = sites.make_site(root)
    with file_lock(lock_path(site), "sandbox sync-gres"):
        site = files.with_live_slots(site)
        changed = files.write_files(site)
        if files.SLURMD_CONFS & set(changed):
            services.start_slurm(site, restart=True)
            services.wait_registered(site)
        return changed


@dataclass
class DownReport:
    stopped: List[str] = field(default_factory=list)
    killed: List[str] = field(default_factory=list)
    purged: bool = False


def down(root: Optional[str] = None, purge: bool = False) -> DownReport:
    """Stop every sandbox process and check that none is left; ``purge`` removes the dir."""
    site = sites.make_site(root)
    with file_lock(lock_path(site), "sandbox down"):
        return _down(site, purge)


def _down(site: layout.Site, purge: bool) -> DownReport:
    report = DownReport()
    svcs = services.daemons(site)
    # Slurmds first (they report to slurmctld), slurmdbd before its database.
    for group in ("slurmd-", "slurmctld", "slurmdbd", "mariadb", "cgroup-ns"):
        report.stopped += services.stop([s for s in svcs if s.name.startswith(group)])
    munged = state.recorded(site.root).get("munged_pid")
    if munged and process_matches(int(munged), ("munged",)):
        terminate([int(munged)])
        report.stopped.append("munged")
        state.record(site, munged_pid=None)
    rest = services.leftovers(site)
    if rest:
        terminate([pid for pid, _ in rest], timeout=10)
        report.killed = [f"{pid} {cmd}" for pid, cmd in rest]
    still = services.leftovers(site)
    if still:
        raise SandboxError("sandbox down: processes survived SIGKILL: "
                           + "; ".join(f"{p} {c}" for p, c in still))
    root = sites.site_root(site)
    if root is not None:
        released = roots.release_mounts(root, site.root)
        if released:
            log.info("unmounted %s from %s", ", ".join(released), root.path)
    if purge and os.path.isdir(site.root):
        _purge(site)
        report.purged = True
    return report


def _purge(site: layout.Site) -> None:
    conf = Path(site.slurm_conf)
    if site.root in ("/", "") or not conf.is_file() or f"ClusterName={layout.CLUSTER}" not in \
            conf.read_text():
        raise SandboxError(f"refusing to purge {site.root}: it does not hold a sandbox "
                           f"({site.slurm_conf} missing or not ours)")
    shutil.rmtree(site.root)


def status(root: Optional[str] = None) -> Dict[str, Any]:
    """Services, nodes and paths of the sandbox, as plain data (for text or JSON)."""
    site = sites.make_site(root)
    svcs: List[Dict[str, Any]] = []
    if site.chroot:
        host_munge = os.path.isdir(site.chroot) and munge.munge_works(site)
        munge_pid = read_pid(site.chroot + munge.MUNGE_PIDFILE)
    else:
        host_munge = munge.munge_works() if os.path.exists(munge.MUNGE) else False
        munge_pid = read_pid(munge.MUNGE_PIDFILE)
    ours = state.recorded(site.root).get("munged_pid")
    svcs.append({"name": "munged", "running": host_munge, "pid": munge_pid,
                 "started_by_sandbox": bool(ours and host_munge)})
    for svc in services.daemons(site):
        pid = svc.pid()
        svcs.append({"name": svc.name, "running": pid is not None, "pid": pid,
                     "log": svc.logfile})
    ctld_up = any(s["name"] == "slurmctld" and s["running"] for s in svcs)
    nodes = [{"name": n, "state": s, "reason": r}
             for n, (s, r) in sorted(services.node_states(site).items())] if ctld_up else []
    try:
        uid: Optional[int] = pwd.getpwnam(layout.TEST_USER).pw_uid
    except KeyError:
        uid = None
    holder = services.cgroup_ns_service(site).pid() if site.cgroup_ns else None
    return {
        "dir": site.root,
        "exists": os.path.isdir(site.root),
        "cluster": layout.CLUSTER,
        "cgroup_version": 2 if site.cgroup == "v2" else 1,
        # where the daemons see cgroup2 at /sys/fs/cgroup: enter it with
        # nsenter --mount=/proc/<pid>/ns/mnt (null: the host's own mount namespace)
        "cgroup_namespace": {"pid": holder, "hybrid_shim": site.hybrid_shim or None}
        if site.cgroup_ns else None,
        "constrain_off": [opt for opt, _ctl in layout.v2_constrain_off(site)],
        "slurm_version": roots.slurm_version(sites.site_root(site)) if not site.chroot
        or os.path.isdir(site.chroot) else "",
        "slurm_root": site.chroot,
        "ports": {"slurmctld": site.ctld_port, "slurmdbd": site.dbd_port,
                  "mariadb": site.mysql_port},
        "slurm_conf": site.slurm_conf,
        "slurmiso_config": site.slurmiso_yaml,
        "hooks": site.hooks,
        "services": svcs,
        "nodes": nodes,
        "test_user": {"name": layout.TEST_USER, "uid": uid},
    }


def report_dict(report: UpReport) -> Dict[str, Any]:
    return {"dir": report.site.root, "slurm_conf": report.site.slurm_conf,
            "seconds": round(report.seconds, 2),
            "steps": [asdict(s) for s in report.steps]}
