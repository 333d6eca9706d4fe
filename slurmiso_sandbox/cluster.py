"""Bring the sandbox cluster up, take it down, say how it is.

``up`` is a list of small steps, each idempotent (assert, then act) and timed: packages,
test user, files, simulated GPUs, munge, MariaDB, slurmdbd, accounting, slurmctld, slurmds,
nodes idle. A second ``up`` finds everything in place and only checks; after a crash it
restarts only what died. Daemons run in the foreground (``-D``) in their own session so the
pid we record is the daemon's and our exit does not take them along.
"""

from __future__ import annotations

import glob
import json
import logging
import os
import pwd
import shutil
import socket
import stat
import sys
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Set, Tuple

from slurmiso.errors import SandboxError, SlurmisoError
from slurmiso_sandbox import accounting as A
from slurmiso_sandbox import guard as G
from slurmiso_sandbox import layout as L
from slurmiso_sandbox import roots as R
from slurmiso_sandbox.procs import (
    environ_with,
    file_lock,
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

#: lua5.1: the Lua job_submit/lua links (and the unit tests run the generated script with);
#: gcc, make and libslurm-dev build the SPANK plugin.
PACKAGES = ("slurm-wlm", "slurmdbd", "munge", "mariadb-server", "libslurm-dev", "lua5.1", "gcc",
            "make")
#: What the system Python needs to run ``slurmiso task-prolog`` when it stands in (make_site).
TASK_PACKAGES = ("python3-yaml", "python3-psutil")
SYSTEM_PYTHON = "/usr/bin/python3"
APT_GET = "/usr/bin/apt-get"
DPKG_QUERY = "/usr/bin/dpkg-query"
SLURMCTLD = "/usr/sbin/slurmctld"
SLURMD = "/usr/sbin/slurmd"
SLURMDBD = "/usr/sbin/slurmdbd"
MUNGED = "/usr/sbin/munged"
MUNGE = "/usr/bin/munge"
UNMUNGE = "/usr/bin/unmunge"
MUNGEKEY = "/usr/sbin/mungekey"
MUNGE_KEY = G.MUNGE_KEY
MUNGE_PIDFILE = "/run/munge/munged.pid"
RUNUSER = "/usr/sbin/runuser"
USERADD = "/usr/sbin/useradd"
GROUPADD = "/usr/sbin/groupadd"
SCONTROL = "/usr/bin/scontrol"
SINFO = "/usr/bin/sinfo"
MAKE = "/usr/bin/make"
GCC = "/usr/bin/gcc"
UNSHARE = "/usr/bin/unshare"
NSENTER = "/usr/bin/nsenter"
BASH = "/bin/bash"
ENV = "/usr/bin/env"

NODES_TIMEOUT = 60.0
#: Node states that count as "up" for a warm cluster that may be running jobs.
USABLE_STATES = {"idle", "mixed", "allocated", "completing"}


def default_dir() -> str:
    return os.environ.get("SLURMISO_SANDBOX_DIR") or L.DEFAULT_DIR


def hooks_wanted() -> bool:
    """``SLURMISO_SANDBOX_HOOKS=0`` runs the cluster without slurmiso's hooks, to tell a
    sandbox problem from a hook problem."""
    return os.environ.get("SLURMISO_SANDBOX_HOOKS", "1").lower() not in ("0", "off", "no")


#: Where the Debian/RPM packages put the hooks and the SPANK plugins (``make deb``).
PACKAGED_BIN = "/usr/bin"
PACKAGED_SPANK = "/usr/lib/slurmiso/slurmiso.so"


def packaged_site(site: L.Site) -> L.Site:
    """``site`` with the installed packages' hooks and plugins in place of the checkout's."""
    missing = [p for p in (os.path.join(PACKAGED_BIN, "slurmiso-prolog"),
                           os.path.join(PACKAGED_BIN, "slurmiso-epilog"),
                           os.path.join(PACKAGED_BIN, "slurmiso-task-prolog"), PACKAGED_SPANK,
                           PACKAGED_SPANK.replace("slurmiso.so", "slurmiso_fence.so"))
               if not os.path.exists(p)]
    if missing:
        raise SandboxError(f"--from-packages: not installed: {', '.join(missing)}",
                           hint="make deb, then apt-get install ./dist/deb/*.deb "
                           "(docs/admin-guide.md, 'Try it on one machine first')")
    return replace(site, prolog=os.path.join(PACKAGED_BIN, "slurmiso-prolog"),
                   epilog=os.path.join(PACKAGED_BIN, "slurmiso-epilog"), pythonpath="",
                   spank_plugin=PACKAGED_SPANK, packaged=True)


def port_base(recorded: Any = None) -> int:
    """``SLURMISO_SANDBOX_PORT_BASE``, else what ``up`` recorded, else the default ports."""
    raw = os.environ.get("SLURMISO_SANDBOX_PORT_BASE") or recorded or L.PORT_BASE
    try:
        base = int(raw)
    except (TypeError, ValueError):
        base = -1
    if not 1024 <= base <= 65000:
        raise SandboxError(f"SLURMISO_SANDBOX_PORT_BASE={raw!r} is not a port base",
                           hint="a number from 1024 to 65000, e.g. 17800")
    return base


#: Default port base per root release (PORT_BASE + 1000 * shift): beside the host's sandbox.
RELEASE_PORT_SHIFT = {"24.11": 1, "26.05": 2}


def host_release() -> str:
    """The host's Slurm release (``22.05``), "" when it has none."""
    full = R.slurm_version(None)
    return ".".join(full.split(".")[:2]) if full else ""


def choose_release(root: str, slurm: Optional[str]) -> str:
    """The release a sandbox runs: ``--slurm``, else the one ``up`` recorded in the dir; ""
    means the host's own Slurm. A dir made for one release is not reused for another."""
    recorded = str(_read_state_dir(root).get("slurm") or "")
    if slurm is None:
        return recorded
    want = R.check_version(slurm)
    if want == host_release():
        want = ""
    if os.path.exists(os.path.join(root, "etc", "slurm.conf")) and want != recorded:
        raise SandboxError(
            f"{root} holds a sandbox of Slurm {recorded or host_release() or 'host'}, "
            f"not {want or 'the host release'}",
            hint="use another --dir (SLURMISO_SANDBOX_DIR), or 'sandbox down --purge' it first")
    return want


def plain_gpu(root: str, wanted: Optional[str] = None) -> str:
    """The GPU the exclusive, mps and timeslice nodes play: ``--plain-gpu``, else
    ``SLURMISO_SANDBOX_PLAIN_GPU``, else what ``up`` recorded in the dir; "" = the defaults
    (A100-80GB, H100-80GB). Checked here, so a typo fails before anything starts."""
    spec = (wanted if wanted is not None else os.environ.get("SLURMISO_SANDBOX_PLAIN_GPU")
            or str(_read_state_dir(root).get("plain_gpu") or ""))
    if spec:
        L.parse_plain_gpu(spec)
    return spec.strip()


def make_site(root: Optional[str] = None, slurm: Optional[str] = None,
              plain: Optional[str] = None, cgroup: Optional[str] = None) -> L.Site:
    """The sandbox's :class:`~slurmiso_sandbox.layout.Site` on this machine, right now.

    Hooks are wired only once the repository has them, and run by this interpreter with this
    ``slurmiso`` package on ``PYTHONPATH`` (an uninstalled checkout works too). With a Slurm
    release the host lacks (``slurm``), everything runs in that release's Debian root, and the
    hooks run the root's Python on a copy of this checkout under ``<dir>/lib/py``.
    """
    import slurmiso

    pkg_parent = str(Path(slurmiso.__file__).resolve().parent.parent)
    prolog = os.path.join(pkg_parent, "prolog", "slurmiso-prolog")
    root = os.path.abspath(root or default_dir())
    epilog = os.path.join(pkg_parent, "epilog", "slurmiso-epilog")
    hooks = os.path.isfile(prolog) and os.path.isfile(epilog) and hooks_wanted()
    release = choose_release(root, slurm)
    version = choose_cgroup(root, cgroup)
    base = port_base(_read_state_dir(root).get("port_base")
                     or L.PORT_BASE + 1000 * RELEASE_PORT_SHIFT.get(release, 0)
                     + (V2_PORT_SHIFT if version == "v2" and host_cgroup() == "v1" else 0))
    nodes = L.with_plain_gpu(tuple(replace(n, port=n.port - L.PORT_BASE + base)
                                   for n in L.NODES), plain_gpu(root, plain))
    v2 = v2_fields(root, version)
    if release:
        py = os.path.join(root, "lib", "py")
        return L.Site(
            **v2,
            root=root,
            host=socket.gethostname().split(".")[0],
            python=SYSTEM_PYTHON,
            prolog=os.path.join(py, "prolog", "slurmiso-prolog") if hooks else "",
            epilog=os.path.join(py, "epilog", "slurmiso-epilog") if hooks else "",
            pythonpath=py,
            task_python=SYSTEM_PYTHON,
            spank_plugin=os.path.join(root, "lib", "slurmiso.so")
            if os.path.isfile(spank_source(pkg_parent)) else "",
            nodes=nodes,
            port_base=base,
            slurm=release,
            ignore_systemd=True,  # measured: 24.11's cgroup/v1 asks systemd for a scope
            first_job_id=int(release.replace(".", "")) * 1000,
            chroot=R.root_path(release),
        )
    return L.Site(
        **v2,
        root=root,
        host=socket.gethostname().split(".")[0],
        python=sys.executable,
        prolog=prolog if hooks else "",
        epilog=epilog if hooks else "",
        pythonpath=pkg_parent,
        task_python="" if world_reachable(sys.executable) else SYSTEM_PYTHON,
        spank_plugin=os.path.join(root, "lib", "slurmiso.so")
        if os.path.isfile(spank_source(pkg_parent)) else "",
        nodes=nodes,
        port_base=base,
    )


def site_root(site: L.Site) -> Optional[R.Root]:
    return R.Root(site.chroot, site.slurm) if site.chroot else None


def spank_source(pkg_parent: str) -> str:
    return os.path.join(pkg_parent, "spank", "slurmiso_spank.c")


def build_spank(site: L.Site) -> str:
    """``make -C spank`` (make rebuilds only when a source is newer), then install the
    plugins under the sandbox dir, where every user's sbatch can load them."""
    if site.packaged:
        return f"installed by the slurmiso-spank package ({site.spank_plugin})"
    if not site.spank_plugin:
        return "no spank/ in this checkout"
    src_dir = os.path.dirname(spank_source(site.pythonpath))
    run(site.exe(MAKE, "-s", "-C", src_dir), timeout=120)
    done = []
    for name in ("slurmiso.so", "slurmiso_fence.so"):
        dest = os.path.join(os.path.dirname(site.spank_plugin), name)
        built = Path(src_dir, name).read_bytes()
        try:
            if Path(dest).read_bytes() == built:
                continue
        except OSError:
            pass
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        tmp = f"{dest}.tmp"
        Path(tmp).write_bytes(built)
        os.chmod(tmp, 0o755)
        os.replace(tmp, dest)  # running slurmstepds keep the old file mapped
        done.append(dest)
    return f"installed {', '.join(done)}" if done else "up to date"


def world_reachable(path: str) -> bool:
    """Whether any user can run/read ``path`` (every directory above it searchable).

    The TaskProlog runs as the job's user: an interpreter under /root (pyenv) fails there
    with exit 126, so such sites fall back to the system Python (see TASK_PACKAGES).
    """
    for p in {os.path.abspath(path), os.path.realpath(path)}:
        try:
            if not os.stat(p).st_mode & (stat.S_IXOTH | stat.S_IROTH):
                return False
            for parent in Path(p).parents:
                if not os.stat(parent).st_mode & stat.S_IXOTH:
                    return False
        except OSError:
            return False
    return True


def slurm_env(site: L.Site) -> Dict[str, str]:
    return environ_with({"SLURM_CONF": site.slurm_conf})


# --- services --------------------------------------------------------------------------


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


def cgroup_ns_service(site: L.Site) -> Service:
    return Service(
        "cgroup-ns",
        (UNSHARE, "--mount", "--propagation", "slave", "--", BASH, "-c", CGROUP_NS_SCRIPT,
         "slurmiso-cgroup-ns", site.chroot, site.root),
        site.path("run", "cgroup-ns.pid"), site.path("log", "cgroup-ns.out"), ("sleep",),
        (f"slurmiso-cgroup-ns {site.root}",))


def _daemon(site: L.Site, *argv: str, shim: bool = False) -> Tuple[str, ...]:
    """A Slurm daemon's argv in this site: in its root, and with the hybrid-host shim
    (hybrid_shim.c) preloaded where ``shim`` and the site needs it (``env`` inside the root:
    the shim is built against the root's C library, not the host's)."""
    if shim and site.hybrid_shim:
        return tuple(site.exe(ENV, f"LD_PRELOAD={site.hybrid_shim}", *argv))
    return tuple(site.exe(*argv))


def services(site: L.Site) -> List[Service]:
    """Every daemon the sandbox runs, in start order (munged is listed separately)."""
    p = site.path
    my = A.mysql_paths(site)
    ns = site.cgroup_ns
    out = [cgroup_ns_service(site)] if ns else []
    out += [
        Service("mariadb", tuple(A.mariadbd_argv(site)), my["pidfile"], my["log"],
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
            _daemon(site, SLURMD, "-D", "-f", site.slurm_conf, "-N", n.name, shim=True),
            p("run", f"slurmd-{n.name}.pid"), p("log", f"slurmd-{n.name}.log"), ("slurmd",),
            (site.slurm_conf, f"-N {n.name}"), n.port, ns=ns,
        ))
    return out


def ns_argv(site: L.Site, *argv: str) -> List[str]:
    """``argv`` run in the sandbox's cgroup v2 mount namespace (as is where it has none)."""
    if not site.cgroup_ns:
        return list(argv)
    holder = cgroup_ns_service(site).pid()
    if holder is None:
        raise SandboxError("the sandbox's cgroup v2 namespace holder is not running",
                           hint="slurmiso sandbox up")
    return [NSENTER, f"--mount=/proc/{holder}/ns/mnt", "--", *argv]


def service(site: L.Site, name: str) -> Service:
    return next(s for s in services(site) if s.name == name)


def start(site: L.Site, svc: Service) -> int:
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


# --- steps -----------------------------------------------------------------------------


@dataclass
class Step:
    name: str
    seconds: float = 0.0
    detail: str = ""


@dataclass
class UpReport:
    site: L.Site
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


def missing_packages(wanted: Sequence[str]) -> List[str]:
    cp = run([DPKG_QUERY, "-W", "-f=${Package} ${Status}\\n", *wanted], check=False)
    ok = {ln.split()[0] for ln in cp.stdout.splitlines() if ln.endswith("install ok installed")}
    return [p for p in wanted if p not in ok]


def install_packages(site: L.Site) -> str:
    """apt-get install what is missing; ``apt-get update`` only when lists are absent/stale."""
    wanted = PACKAGES + (TASK_PACKAGES if site.task_python == SYSTEM_PYTHON else ())
    missing = missing_packages(wanted)
    if not missing:
        return "all installed"
    return install_named(missing)


def install_named(missing: Sequence[str]) -> str:
    """``apt-get install`` these Debian packages (``apt-get update`` first when the lists are
    absent, and again once if the install fails on stale lists)."""
    env = environ_with({"DEBIAN_FRONTEND": "noninteractive"})
    install = [APT_GET, "install", "-y", "-q", "-o", "Dpkg::Options::=--force-confold", *missing]
    if not glob.glob("/var/lib/apt/lists/*_Packages*"):
        run([APT_GET, "update", "-q"], env=env, timeout=300)
    if run(install, env=env, timeout=600, check=False).returncode != 0:
        run([APT_GET, "update", "-q"], env=env, timeout=300)
        run(install, env=env, timeout=600)
    return "installed " + " ".join(missing)


def ensure_test_user() -> str:
    try:
        return f"{L.TEST_USER} uid {pwd.getpwnam(L.TEST_USER).pw_uid}"
    except KeyError:
        run([USERADD, "-m", "-s", "/bin/bash", L.TEST_USER])
        return f"created {L.TEST_USER} uid {pwd.getpwnam(L.TEST_USER).pw_uid}"


def _write_if_changed(path: str, text: str, mode: int) -> bool:
    try:
        if Path(path).read_text() == text:
            os.chmod(path, mode)
            return False
    except OSError:
        pass
    tmp = f"{path}.tmp"
    with open(tmp, "w") as fh:
        fh.write(text)
    os.chmod(tmp, mode)
    os.replace(tmp, path)
    return True


def _mknod(dev: L.DeviceNode) -> bool:
    """Make the stand-in with the driver's mode (chmod after mknod: the umask would narrow it,
    and a narrower mode hides whether the device cgroup is what keeps a job out)."""
    want = os.makedev(dev.major, dev.minor)
    try:
        st = os.lstat(dev.path)
        if stat.S_ISCHR(st.st_mode) and st.st_rdev == want:
            if stat.S_IMODE(st.st_mode) == dev.mode and st.st_uid == 0:
                return False
            os.chown(dev.path, 0, 0)
            os.chmod(dev.path, dev.mode)
            return True
        os.unlink(dev.path)
    except FileNotFoundError:
        pass
    os.makedirs(os.path.dirname(dev.path), mode=0o755, exist_ok=True)
    os.mknod(dev.path, dev.mode | stat.S_IFCHR, want)
    os.chmod(dev.path, dev.mode)
    return True


def host_cgroup() -> str:
    """``v1`` where the host mounts the v1 devices controller, else ``v2`` (pure unified)."""
    return "v1" if os.path.isdir("/sys/fs/cgroup/devices") else "v2"


#: A cgroup v2 sandbox on a hybrid host moves its default ports (beside the v1 one).
V2_PORT_SHIFT = 500
CGROUP_VERSIONS = ("v1", "v2")


def choose_cgroup(root: str, cgroup: Optional[str]) -> str:
    """The cgroup version a sandbox runs: ``--cgroup`` (or ``SLURMISO_SANDBOX_CGROUP``), else
    the one ``up`` recorded in the dir, else the host's (v1 on a hybrid host). A dir made for
    one version is not switched to the other while it holds a sandbox."""
    recorded = str(_read_state_dir(root).get("cgroup") or "")
    want = (cgroup or os.environ.get("SLURMISO_SANDBOX_CGROUP") or "").strip().lower()
    if not want:
        return recorded or host_cgroup()
    want = want if want.startswith("v") else f"v{want}"
    if want not in CGROUP_VERSIONS:
        raise SandboxError(f"unknown cgroup version {cgroup!r} for the sandbox",
                           hint="choose v1 or v2")
    if want == "v1" and host_cgroup() == "v2":
        raise SandboxError("--cgroup v1: this host has no cgroup v1 devices controller "
                           "(/sys/fs/cgroup is the unified hierarchy)", hint="use --cgroup v2")
    if recorded and want != recorded and os.path.exists(os.path.join(root, "etc",
                                                                      "slurm.conf")):
        raise SandboxError(f"{root} holds a cgroup {recorded} sandbox, not {want}",
                           hint="use another --dir (SLURMISO_SANDBOX_DIR), or 'sandbox down "
                           "--purge' it first")
    return want


def proc_cgroup_is_hybrid(path: str = "/proc/self/cgroup") -> bool:
    """Whether the kernel lists cgroup v1 hierarchies for a process (lines other than the
    unified ``0::`` one): what Slurm's cgroup/v2 plugin refuses as "Hybrid mode"."""
    try:
        lines = [ln for ln in Path(path).read_text().splitlines() if ln.strip()]
    except OSError:
        return False
    return any(not ln.startswith("0::") for ln in lines)


def cgroup2_root_controllers() -> Tuple[str, ...]:
    """The controllers of the cgroup2 root (``cgroup.controllers``), wherever the host mounts
    it (/sys/fs/cgroup, or /sys/fs/cgroup/unified on a hybrid host); () when unmounted."""
    from slurmiso.isolation.bpf_probe import cgroup2_mount

    mount = cgroup2_mount()
    if not mount:
        return ()
    try:
        return tuple(Path(mount, "cgroup.controllers").read_text().split())
    except OSError:
        return ()


def v2_fields(root: str, version: str) -> Dict[str, Any]:
    """The :class:`~slurmiso_sandbox.layout.Site` fields of the cgroup version ``version``."""
    if version != "v2":
        return {"cgroup": "v1"}
    return {
        "cgroup": "v2",
        "cgroup_ns": host_cgroup() == "v1" or not _unified_at_sys_fs_cgroup(),
        "v2_controllers": cgroup2_root_controllers(),
        "hybrid_shim": os.path.join(root, "lib", "slurmiso-hybrid-shim.so")
        if proc_cgroup_is_hybrid() else "",
    }


def _unified_at_sys_fs_cgroup() -> bool:
    try:
        return os.statvfs("/sys/fs/cgroup") is not None and _fstype("/sys/fs/cgroup") == "cgroup2"
    except OSError:
        return False


def _fstype(path: str, mountinfo: str = "/proc/self/mountinfo") -> str:
    """The file system type mounted at ``path`` (from ``mountinfo``), "" if none."""
    try:
        lines = Path(mountinfo).read_text().splitlines()
    except OSError:
        return ""
    found = ""
    for line in lines:
        head, sep, tail = line.partition(" - ")
        fields = head.split()
        if sep and len(fields) > 4 and fields[4] == path:
            found = tail.split()[0]  # the last mount at a path is the one seen
    return found


def write_files(site: L.Site) -> List[str]:
    """Directories, device stand-ins, configs and hook wrappers; returns changed files."""
    for d in ("etc", "bin", "lib", "run", "log", "spool/ctld", "sim", "mysql", "dev"):
        os.makedirs(site.path(*d.split("/")), exist_ok=True)
    for n in site.nodes:
        os.makedirs(site.path("state", n.name), exist_ok=True)
    os.chmod(site.root, 0o755)
    changed = [d.path for d in L.device_nodes(site) if _mknod(d)]
    for rel, text in L.rendered_files(site).items():
        mode = 0o755 if rel.startswith("bin/") else 0o600 if rel.endswith("dbd.conf") else 0o644
        if _write_if_changed(site.path(*rel.split("/")), text, mode):
            changed.append(rel)
    for stale in set(os.listdir(site.path("bin"))) - set(L.hook_wrappers(site)):
        os.unlink(site.path("bin", stale))  # hooks removed from the repo: drop wrappers
    return changed


def with_live_slots(site: L.Site) -> L.Site:
    """``site`` with each MIG node's ``live_slots`` read from its simulated GPUs, so gres.conf
    and ``Gres=`` describe the instances that exist (a re-laid node included); a node without
    simulated state or instances keeps its planned slots (``init_sim`` creates them)."""
    from slurmiso.gpu.sim import SimBackend

    nodes = []
    for n in site.nodes:
        path = L.sim_path(site, n)
        if n.mig_slots and os.path.exists(path):
            backend = SimBackend(path)
            try:
                live = tuple(L.MigSlot(i.gpu_index, i.profile, i.placement_start, i.gi_id,
                                       i.ci_id)
                             for i in sorted(backend.instances(),
                                             key=lambda i: (i.gpu_index, i.placement_start)))
            finally:
                backend.close()
            if live:
                n = replace(n, live_slots=live)
        nodes.append(n)
    return replace(site, nodes=tuple(nodes))


#: Files whose change needs the daemons restarted (slurmd reads them at start).
SLURMD_CONFS = {"etc/slurm.conf", "etc/gres.conf", "etc/cgroup.conf", "etc/plugstack.conf"}


def init_sim(site: L.Site) -> List[str]:
    """Simulated GPU state per node, created only when absent; n3 gets its MIG layout."""
    from slurmiso.gpu.backend import create_mig_device
    from slurmiso.gpu.sim import SimBackend, init_state

    made = []
    os.makedirs(site.path("sim"), exist_ok=True)
    for n in site.nodes:
        path = L.sim_path(site, n)
        if os.path.exists(path) and not n.mig_slots and n.mode in L.PLAIN_MODES:
            playing = SimBackend(path).state()
            if playing["model"] != n.gpu_model and not playing["processes"]:
                os.remove(path)  # another --plain-gpu: an idle plain node is re-made
        if not os.path.exists(path):
            init_state(path, n.gpu_model, n.gpus, mig=n.mig_enabled, node=n.name,
                       memory_mb=n.gpu_memory_mb)
            made.append(f"{n.name} ({n.gpu_model})")
        if n.mig_slots:
            backend = SimBackend(path)
            if not backend.instances():  # never re-lay a node that has instances
                for slot in n.mig_slots:
                    create_mig_device(backend, slot.gpu, slot.profile, slot.placement)
                made.append(f"{n.name} MIG layout")
            backend.close()
    return made


def _plain_spec(site: L.Site) -> str:
    """The ``--plain-gpu`` a site was made with ("" for the default models)."""
    plain = [n for n in site.nodes if n.mode in L.PLAIN_MODES]
    if not plain or all(n.gpu_model == d.gpu_model for n, d in zip(plain, (
            d for d in L.NODES if d.mode in L.PLAIN_MODES))):
        return ""
    n = plain[0]
    return f"{n.gpu_model}:{n.gpu_memory_mb}M" if n.gpu_memory_mb else n.gpu_model


def _state_file(site: L.Site) -> str:
    return site.path("run", "sandbox.json")


def _read_state(site: L.Site) -> Dict[str, Any]:
    return _read_state_dir(site.root)


def _read_state_dir(root: str) -> Dict[str, Any]:
    try:
        data = json.loads(Path(root, "run", "sandbox.json").read_text())
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def _write_state(site: L.Site, **updates: Any) -> None:
    data = _read_state(site)
    data.update(updates)
    _write_if_changed(_state_file(site), json.dumps(data, indent=2, sort_keys=True) + "\n",
                      0o644)


def munge_works(site: Optional[L.Site] = None) -> bool:
    exe = site.exe if site is not None else (lambda *a: list(a))
    cp = run(exe(MUNGE, "-n"), check=False, timeout=10)
    if cp.returncode != 0:
        return False
    return run(exe(UNMUNGE), input=cp.stdout, check=False, timeout=10).returncode == 0


def ensure_munge(site: L.Site) -> str:
    """Use the host's munged if it works; otherwise start one and remember that we did.

    A Slurm root has its own munged, key and socket (its /run/munge): the host's is never
    touched."""
    if site.chroot:
        return _ensure_root_munge(site)
    if munge_works():
        return "running"
    if not os.path.exists(MUNGE_KEY):
        run([MUNGEKEY, "--create", f"--keyfile={MUNGE_KEY}"])
        shutil.chown(MUNGE_KEY, "munge", "munge")
        os.chmod(MUNGE_KEY, 0o400)
    os.makedirs("/run/munge", exist_ok=True)
    shutil.chown("/run/munge", "munge", "munge")
    os.chmod("/run/munge", 0o755)
    run([RUNUSER, "-u", "munge", "--", MUNGED], timeout=30, logfile="/var/log/munge/munged.log")
    wait_until("munged", munge_works, timeout=20, logfile="/var/log/munge/munged.log")
    _write_state(site, munged_pid=read_pid(MUNGE_PIDFILE))
    return "started"


def _ensure_root_munge(site: L.Site) -> str:
    if munge_works(site):
        return "running (in the root)"
    key = site.chroot + MUNGE_KEY
    setup = (f"[ -s {MUNGE_KEY} ] || {MUNGEKEY} --create --keyfile={MUNGE_KEY}; "
             f"chown munge:munge {MUNGE_KEY}; chmod 0400 {MUNGE_KEY}; "
             "mkdir -p /run/munge /var/log/munge /var/lib/munge; "
             "chown munge:munge /run/munge /var/log/munge /var/lib/munge; chmod 0755 /run/munge")
    run(site.exe("/bin/sh", "-c", setup), timeout=30)
    logfile = site.chroot + "/var/log/munge/munged.log"
    run(site.exe(RUNUSER, "-u", "munge", "--", MUNGED), timeout=30, logfile=logfile)
    wait_until("munged (root)", lambda: munge_works(site), timeout=20, logfile=logfile)
    _write_state(site, munged_pid=read_pid(site.chroot + MUNGE_PIDFILE))
    return f"started in the root (key {key})"


def ensure_root_user(site: L.Site) -> str:
    """The test user in the root, with the host's uid and gid (files are shared)."""
    pw = pwd.getpwnam(L.TEST_USER)
    cp = run(site.exe("/usr/bin/getent", "passwd", L.TEST_USER), check=False)
    if cp.returncode == 0:
        return f"{L.TEST_USER} in the root"
    run(site.exe("/bin/sh", "-c", f"getent group {pw.pw_gid} >/dev/null || "
                 f"{GROUPADD} -g {pw.pw_gid} {L.TEST_USER}"))
    run(site.exe(USERADD, "-m", "-u", str(pw.pw_uid), "-g", str(pw.pw_gid), "-s", "/bin/bash",
                 L.TEST_USER))
    return f"created {L.TEST_USER} uid {pw.pw_uid} in the root"


def prepare_root(site: L.Site) -> str:
    """Mounts, this checkout's slurmiso for the root's Python, and the client wrappers."""
    root = site_root(site)
    assert root is not None
    os.makedirs(site.root, exist_ok=True)
    made = R.ensure_mounts(root, site.root)
    copied = R.copy_checkout(_checkout(), site.path("lib", "py"))
    os.makedirs(site.path("slurm-bin"), exist_ok=True)
    for name, text in R.client_wrappers(root).items():
        _write_if_changed(site.path("slurm-bin", name), text, 0o755)
    done = [f"mounted {', '.join(made)}"] if made else []
    if copied:
        done.append("slurmiso copied")
    return "; ".join(done) or "in place"


def _checkout() -> str:
    import slurmiso

    return str(Path(slurmiso.__file__).resolve().parent.parent)


def build_shim(site: L.Site) -> str:
    """Compile hybrid_shim.c for the Slurm daemons (in the root, against its C library)."""
    src = os.path.join(site.pythonpath or _checkout(), "slurmiso_sandbox", "hybrid_shim.c")
    out = site.hybrid_shim
    try:
        if os.stat(out).st_mtime >= os.stat(src).st_mtime:
            return "shim up to date"
    except OSError:
        pass
    os.makedirs(os.path.dirname(out), exist_ok=True)
    tmp = f"{out}.tmp"
    run(site.exe(GCC, "-shared", "-fPIC", "-O2", "-Wall", "-o", tmp, src, "-ldl"), timeout=120)
    os.chmod(tmp, 0o755)
    os.replace(tmp, out)
    return f"built {out}"


def _ns_ready(site: L.Site, pid: int) -> bool:
    """The holder's namespace is set up: cgroup2 at /sys/fs/cgroup (and in the root)."""
    mountinfo = f"/proc/{pid}/mountinfo"
    want = ["/sys/fs/cgroup"] + ([site.chroot + "/sys/fs/cgroup"] if site.chroot else [])
    return all(_fstype(w, mountinfo) == "cgroup2" for w in want) and process_matches(
        pid, ("sleep",))


def start_cgroup_ns(site: L.Site) -> str:
    """The mount namespace every Slurm daemon of a cgroup v2 sandbox runs in. A holder that
    died leaves the daemons in its namespace: they are restarted in the new one."""
    done = [build_shim(site)] if site.hybrid_shim else []
    svc = cgroup_ns_service(site)
    pid = svc.pid()
    if pid and _ns_ready(site, pid):
        return "; ".join(done + [f"running (pid {pid})"])
    stranded = stop([s for s in services(site) if s.ns])
    if stranded:
        log.warning("cgroup v2 namespace holder gone: restarting %s in a new one",
                    ", ".join(stranded))
    pid = start(site, svc)
    wait_until("cgroup v2 namespace", lambda: _ns_ready(site, pid), timeout=20,
               logfile=svc.logfile, alive=alive(svc), interval=0.1)
    shown = ", ".join(site.v2_controllers) or "none"
    return "; ".join(done + [f"started (pid {pid}; cgroup2 root controllers: {shown})"])


def start_mariadb(site: L.Site) -> str:
    fresh = A.install_db(site)
    svc = service(site, "mariadb")
    was = svc.pid()
    start(site, svc)
    A.wait_mysql(site, alive(svc))
    A.ensure_db_user(site)
    return ("initialised, " if fresh else "") + ("running" if was else "started")


def start_slurmdbd(site: L.Site, restart: bool) -> str:
    svc = service(site, "slurmdbd")
    if restart and stop([svc]):
        log.info("slurmdbd.conf changed: restarting slurmdbd")
    was = svc.pid()
    start(site, svc)
    wait_until("slurmdbd", lambda: A.dbd_ready(site), timeout=90, logfile=svc.logfile,
               alive=alive(svc), interval=0.5)
    return "running" if was else "started"


def start_slurm(site: L.Site, restart: bool) -> str:
    """slurmctld and the slurmds; restarted when slurm.conf/gres.conf changed under them."""
    ctld = service(site, "slurmctld")
    slurmds = [s for s in services(site) if s.name.startswith("slurmd-")]
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


def _ctld_up(site: L.Site) -> bool:
    cp = run(site.exe(SCONTROL, "ping"), env=slurm_env(site), check=False, timeout=15)
    return cp.returncode == 0 and "UP" in cp.stdout


def node_states(site: L.Site) -> Dict[str, Tuple[str, str]]:
    """node -> (state, reason) as sinfo reports it (state like 'idle', 'down*', 'drained')."""
    cp = run(site.exe(SINFO, "-h", "-N", "-o", "%N|%T|%E"), env=slurm_env(site), check=False,
             timeout=15)
    out: Dict[str, Tuple[str, str]] = {}
    for line in cp.stdout.splitlines():
        name, state, reason = (line.split("|") + ["", ""])[:3]
        reason = reason.strip()
        out[name] = (state.strip(), "" if reason == "none" else reason)
    return out


def nodes_not_in(site: L.Site, ok: Set[str]) -> Dict[str, Tuple[str, str]]:
    """node -> (state, reason) of each sandbox node whose state is not in ``ok``."""
    states = node_states(site)
    return {n.name: states.get(n.name, ("missing", "")) for n in site.nodes
            if states.get(n.name, ("", ""))[0] not in ok}


def wait_nodes(site: L.Site) -> str:
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


def _nodes_error(site: L.Site, bad: Dict[str, Tuple[str, str]], what: str) -> str:
    first = sorted(bad)[0]
    lines = [f"nodes {', '.join(f'{n}={s} {r}'.strip() for n, (s, r) in sorted(bad.items()))}"
             f": {what}"]
    for logfile in (site.path("log", f"slurmd-{first}.log"), site.path("log", "slurmctld.log")):
        lines += [f"--- last lines of {logfile} ---", tail(logfile, 10)]
    return "\n".join(lines)


def lock_path(site: L.Site) -> str:
    # Beside the dir, not in it: 'down --purge' removes the dir while holding the lock.
    return f"{site.root.rstrip('/')}.lock"


def up(root: Optional[str] = None, slurm: Optional[str] = None,
       from_packages: bool = False, force: bool = False,
       host: Optional[G.Host] = None, plain: Optional[str] = None,
       cgroup: Optional[str] = None) -> UpReport:
    """Bring the sandbox up from whatever state it is in (one ``up``/``down`` at a time).

    ``from_packages``: Slurm runs the installed packages' hooks and plugins, not the checkout's.
    ``plain``: the GPU the exclusive, mps and timeslice nodes play (:func:`plain_gpu`).
    Before anything is touched, a host with a Slurm or munge setup the sandbox did not create
    is refused (:mod:`.guard`); ``force`` runs anyway and records it as the sandbox's.
    """
    if os.geteuid() != 0:
        raise SandboxError("sandbox up must run as root (it runs Slurm's daemons and mknod)")
    site = make_site(root, slurm, plain, cgroup)
    if from_packages:
        if site.chroot:
            raise SandboxError("--from-packages runs the host's Slurm only",
                               hint="drop --slurm, or install the packages in the root")
        site = packaged_site(site)
    host = host or G.Host()
    before = G.check_host(host, force=force)
    with file_lock(lock_path(site), "sandbox up"):
        return _up(site, lambda: G.record_created(host, before))


def _up(site: L.Site, record_host: Callable[[], List[str]] = lambda: []) -> UpReport:
    """The steps; ``record_host`` marks the munge key (and any Slurm config) they made as the
    sandbox's, after each step that can make one (apt's munge postinst, ``mungekey``)."""
    report = UpReport(site)
    if site.chroot:
        with _step(report, f"slurm {site.slurm} root") as s:
            path, s.detail = R.ensure_root(site.slurm)
    else:
        with _step(report, "packages") as s:
            s.detail = install_packages(site)
            made = record_host()
            if made:
                s.detail += f"; recorded as the sandbox's: {', '.join(made)}"
        if os.path.isdir(site.path("slurm-bin")):
            shutil.rmtree(site.path("slurm-bin"))
    with _step(report, "test user") as s:
        s.detail = ensure_test_user()
        if site.chroot:
            s.detail += "; " + ensure_root_user(site)
    if site.chroot:
        with _step(report, "root mounts+slurmiso") as s:
            s.detail = prepare_root(site)
    os.makedirs(site.path("run"), exist_ok=True)
    _write_state(site, slurm=site.slurm, port_base=site.port_base,
                 plain_gpu=_plain_spec(site), cgroup=site.cgroup)
    with _step(report, "spank plugin") as s:
        s.detail = build_spank(site)
    with _step(report, "simulated GPUs") as s:
        # first: gres.conf names the caps of the instances the simulated GPUs really have
        s.detail = ", ".join(init_sim(site)) or "unchanged"
    with _step(report, "files") as s:
        site = report.site = with_live_slots(site)
        changed = write_files(site)
        s.detail = f"{len(changed)} changed" if changed else "unchanged"
    with _step(report, "munge") as s:
        s.detail = ensure_munge(site)
        made = record_host()
        if made:
            s.detail += f"; recorded as the sandbox's: {', '.join(made)}"
    if site.cgroup_ns:
        with _step(report, "cgroup v2 namespace") as s:
            s.detail = start_cgroup_ns(site)
    with _step(report, "mariadb") as s:
        s.detail = start_mariadb(site)
    with _step(report, "slurmdbd") as s:
        s.detail = start_slurmdbd(site, restart="etc/slurmdbd.conf" in changed)
    with _step(report, "accounting") as s:
        s.detail = ", ".join(A.ensure_accounting(site)) or "unchanged"
    with _step(report, "slurmctld+slurmd") as s:
        conf_changed = bool(SLURMD_CONFS & set(changed))
        s.detail = start_slurm(site, restart=conf_changed)
    with _step(report, "nodes") as s:
        s.detail = wait_nodes(site)
    return report


def sync_gres(root: Optional[str] = None) -> List[str]:
    """Tell Slurm about the simulated GPUs' MIG instances as they are now: rewrite gres.conf
    and the nodes' ``Gres=``, and restart slurmctld and the slurmds when that changed them.

    The sandbox's after-re-layout step: slurmctld 22.05 keeps a node's GRES counts across
    ``scontrol reconfigure`` (measured), so a new count needs the restart. Drained nodes stay
    drained (whoever drained them resumes them); returns the files changed.
    """
    if os.geteuid() != 0:
        raise SandboxError("sandbox sync-gres must run as root (it restarts Slurm's daemons)")
    site = make_site(root)
    with file_lock(lock_path(site), "sandbox sync-gres"):
        site = with_live_slots(site)
        changed = write_files(site)
        if SLURMD_CONFS & set(changed):
            start_slurm(site, restart=True)
            _wait_registered(site)
        return changed


def _wait_registered(site: L.Site) -> None:
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


# --- down and status --------------------------------------------------------------------


@dataclass
class DownReport:
    stopped: List[str] = field(default_factory=list)
    killed: List[str] = field(default_factory=list)
    purged: bool = False


DAEMON_NAMES = ("slurmd", "slurmctld", "slurmdbd", "slurmstepd", "mariadbd", "mysqld")


def leftovers(site: L.Site) -> List[Tuple[int, str]]:
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


def down(root: Optional[str] = None, purge: bool = False) -> DownReport:
    """Stop every sandbox process and check that none is left; ``purge`` removes the dir."""
    site = make_site(root)
    with file_lock(lock_path(site), "sandbox down"):
        return _down(site, purge)


def _down(site: L.Site, purge: bool) -> DownReport:
    report = DownReport()
    svcs = services(site)
    # Slurmds first (they report to slurmctld), slurmdbd before its database.
    for group in ("slurmd-", "slurmctld", "slurmdbd", "mariadb", "cgroup-ns"):
        report.stopped += stop([s for s in svcs if s.name.startswith(group)])
    munged = _read_state(site).get("munged_pid")
    if munged and process_matches(int(munged), ("munged",)):
        terminate([int(munged)])
        report.stopped.append("munged")
        _write_state(site, munged_pid=None)
    rest = leftovers(site)
    if rest:
        terminate([pid for pid, _ in rest], timeout=10)
        report.killed = [f"{pid} {cmd}" for pid, cmd in rest]
    still = leftovers(site)
    if still:
        raise SandboxError("sandbox down: processes survived SIGKILL: "
                           + "; ".join(f"{p} {c}" for p, c in still))
    root = site_root(site)
    if root is not None:
        released = R.release_mounts(root, site.root)
        if released:
            log.info("unmounted %s from %s", ", ".join(released), root.path)
    if purge and os.path.isdir(site.root):
        _purge(site)
        report.purged = True
    return report


def _purge(site: L.Site) -> None:
    conf = Path(site.slurm_conf)
    if site.root in ("/", "") or not conf.is_file() or f"ClusterName={L.CLUSTER}" not in \
            conf.read_text():
        raise SandboxError(f"refusing to purge {site.root}: it does not hold a sandbox "
                           f"({site.slurm_conf} missing or not ours)")
    shutil.rmtree(site.root)


def status(root: Optional[str] = None) -> Dict[str, Any]:
    """Services, nodes and paths of the sandbox, as plain data (for text or JSON)."""
    site = make_site(root)
    svcs: List[Dict[str, Any]] = []
    if site.chroot:
        host_munge = os.path.isdir(site.chroot) and munge_works(site)
        munge_pid = read_pid(site.chroot + MUNGE_PIDFILE)
    else:
        host_munge = munge_works() if os.path.exists(MUNGE) else False
        munge_pid = read_pid(MUNGE_PIDFILE)
    ours = _read_state(site).get("munged_pid")
    svcs.append({"name": "munged", "running": host_munge, "pid": munge_pid,
                 "started_by_sandbox": bool(ours and host_munge)})
    for svc in services(site):
        pid = svc.pid()
        svcs.append({"name": svc.name, "running": pid is not None, "pid": pid,
                     "log": svc.logfile})
    ctld_up = any(s["name"] == "slurmctld" and s["running"] for s in svcs)
    nodes = [{"name": n, "state": s, "reason": r}
             for n, (s, r) in sorted(node_states(site).items())] if ctld_up else []
    try:
        uid: Optional[int] = pwd.getpwnam(L.TEST_USER).pw_uid
    except KeyError:
        uid = None
    holder = cgroup_ns_service(site).pid() if site.cgroup_ns else None
    return {
        "dir": site.root,
        "exists": os.path.isdir(site.root),
        "cluster": L.CLUSTER,
        "cgroup_version": 2 if site.cgroup == "v2" else 1,
        # where the daemons see cgroup2 at /sys/fs/cgroup: enter it with
        # nsenter --mount=/proc/<pid>/ns/mnt (null: the host's own mount namespace)
        "cgroup_namespace": {"pid": holder, "hybrid_shim": site.hybrid_shim or None}
        if site.cgroup_ns else None,
        "constrain_off": [opt for opt, _ctl in L.v2_constrain_off(site)],
        "slurm_version": R.slurm_version(site_root(site)) if not site.chroot
        or os.path.isdir(site.chroot) else "",
        "slurm_root": site.chroot,
        "ports": {"slurmctld": site.ctld_port, "slurmdbd": site.dbd_port,
                  "mariadb": site.mysql_port},
        "slurm_conf": site.slurm_conf,
        "slurmiso_config": site.slurmiso_yaml,
        "hooks": site.hooks,
        "services": svcs,
        "nodes": nodes,
        "test_user": {"name": L.TEST_USER, "uid": uid},
    }


def report_dict(report: UpReport) -> Dict[str, Any]:
    return {"dir": report.site.root, "slurm_conf": report.site.slurm_conf,
            "seconds": round(report.seconds, 2),
            "steps": [asdict(s) for s in report.steps]}
