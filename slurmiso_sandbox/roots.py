"""Other Slurm releases for the sandbox: a cached Debian root per release, entered by chroot.

Debian 12 ships Slurm 22.05; sites run 24.x-26.x. ``sandbox up --slurm 24.11`` runs the same
cluster from a ``debootstrap --variant=minbase`` root of the Debian release that ships that
Slurm (24.11: trixie, 26.05: sid), with the packages the sandbox needs installed by apt inside
it and nothing started by them (``policy-rc.d`` exits 101). A root is built once, cached under
``/var/cache/slurmiso-dev/slurm-roots/<suite>`` (env ``SLURMISO_SLURM_ROOTS``), and rebuilt when
its recipe (suite and package list) changed. Daemons and clients run in it through
``chroot``, with the host's ``/proc``, ``/sys`` (cgroups included), ``/dev``, ``/tmp`` and the
sandbox directory bind-mounted at the same paths, so device stand-ins, cgroups, job scripts and
logs are the same files inside and out.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from slurmiso.errors import SandboxError
from slurmiso_sandbox import packages
from slurmiso_sandbox.procs import environ_with, run

log = logging.getLogger(__name__)

DEBOOTSTRAP = "/usr/sbin/debootstrap"
CHROOT = "/usr/sbin/chroot"
SLURMD_BIN = "/usr/sbin/slurmd"
MOUNT = "/usr/bin/mount"
UMOUNT = "/usr/bin/umount"
DEFAULT_ROOTS = "/var/cache/slurmiso-dev/slurm-roots"
STAMP = ".slurmiso-slurm-root.json"
STAGE_OK = ".slurmiso-debootstrap-ok"

#: Slurm release -> the Debian suite whose archive ships it (measured: trixie 24.11.5, sid
#: 26.05.5). The host's own release needs no root.
SUITES: Dict[str, str] = {"24.11": "trixie", "26.05": "sid"}
KNOWN = ("22.05",) + tuple(SUITES)

#: What the sandbox runs inside a root: the daemons and clients, the database, the Python
#: the hooks run with (and its three libraries), the compiler and headers the SPANK plugins
#: are built with (libc6-dev is only a Recommends of gcc). job_submit/lua and cli_filter/lua
#: come with slurm-wlm-basic-plugins, a dependency of slurmctld.
PACKAGES: Tuple[str, ...] = (
    "slurmctld", "slurmd", "slurmdbd", "slurm-client", "slurm-wlm-mysql-plugin", "munge",
    "mariadb-server", "mariadb-client", "python3", "python3-yaml", "python3-psutil",
    "python3-prometheus-client", "libslurm-dev", "gcc", "make", "libc6-dev", "procps",
    "crun",  # srun --container (slurmiso_sandbox/oci.py)
)
#: What only some suites package: apptainer (tests/integration/test_apptainer.py) is in sid
#: (1.4.5), not in Debian 12.
SUITE_PACKAGES: Dict[str, Tuple[str, ...]] = {"sid": ("apptainer",)}


def suite_packages(suite: str) -> Tuple[str, ...]:
    return PACKAGES + SUITE_PACKAGES.get(suite, ())

#: The clients slurmiso and the tests call, plus runuser: the tests submit as the test user
#: with ``runuser -u sbxuser -- sbatch``, which must happen inside the root too.
CLIENTS: Tuple[str, ...] = (
    "sbatch", "srun", "salloc", "squeue", "scancel", "scontrol", "sinfo", "sacct", "sacctmgr",
    "sprio", "sshare", "sstat", "sreport", "runuser",
)

#: Host paths bind-mounted into the root at the same path (recursively: cgroup mounts
#: under /sys, devpts under /dev). The sandbox dir is added per sandbox.
SYSTEM_MOUNTS: Tuple[str, ...] = ("/proc", "/sys", "/dev", "/tmp")


def roots_dir() -> str:
    return os.environ.get("SLURMISO_SLURM_ROOTS") or DEFAULT_ROOTS


def check_version(version: str) -> str:
    """``24.11`` (or ``24.11.5``) -> ``24.11``; anything else is one clear error."""
    short = ".".join(version.strip().split(".")[:2])
    if short not in KNOWN:
        raise SandboxError(f"unknown Slurm release {version!r} for the sandbox",
                           hint=f"choose one of {', '.join(KNOWN)}")
    return short


def suite_for(version: str) -> str:
    return SUITES[check_version(version)]


def recipe(suite: str) -> Dict[str, object]:
    """What a root is made of; a cached root with another recipe is stale."""
    return {"suite": suite, "variant": "minbase", "packages": list(suite_packages(suite))}


def root_path(version: str) -> str:
    return os.path.join(roots_dir(), suite_for(version))


def root_is_current(root: str, suite: str) -> bool:
    try:
        stamp = json.loads(Path(root, STAMP).read_text())
    except (OSError, ValueError):
        return False
    return isinstance(stamp, dict) and stamp.get("recipe") == recipe(suite)


def mounts_under(path: str) -> List[str]:
    """Mount points at or below ``path`` (deepest first), from /proc/self/mountinfo."""
    path = os.path.realpath(path).rstrip("/")
    out = []
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return []
    for line in lines:
        fields = line.split()
        if len(fields) > 4:
            point = fields[4].replace("\\040", " ")
            if point == path or point.startswith(path + "/"):
                out.append(point)
    return sorted(set(out), key=lambda p: (-p.count("/"), p))


def ensure_root(version: str) -> Tuple[str, str]:
    """The root for ``version``, built when missing or stale; returns (path, what happened)."""
    suite = suite_for(version)
    root = root_path(version)
    if root_is_current(root, suite):
        return root, "cached"
    os.makedirs(roots_dir(), exist_ok=True)
    for old in (root, f"{root}.stage"):
        if mounts_under(old):  # never rm -rf through a bind mount of /dev, /tmp, ...
            raise SandboxError(
                f"{old} is stale but has mounts under it ({', '.join(mounts_under(old)[:3])})",
                hint="stop the sandbox that uses it ('slurmiso sandbox down --dir ...')")
    t0 = time.monotonic()
    stage = f"{root}.stage"
    logfile = os.path.join(roots_dir(), f"{suite}.log")
    if not os.path.exists(os.path.join(stage, STAGE_OK)):
        shutil.rmtree(stage, ignore_errors=True)
        ensure_debootstrap(logfile)
        log.info("debootstrap --variant=minbase %s into %s", suite, stage)
        _logged([DEBOOTSTRAP, "--variant=minbase", suite, stage], logfile, timeout=1200,
                env=environ_with({}))
        Path(stage, STAGE_OK).touch()
    _install(stage, suite, logfile)
    Path(stage, STAMP).write_text(json.dumps(
        {"recipe": recipe(suite), "built": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
         "seconds": round(time.monotonic() - t0, 1)}, indent=2) + "\n")
    if os.path.exists(root):
        shutil.rmtree(root)
    os.rename(stage, root)
    return root, f"built {suite} in {time.monotonic() - t0:.0f}s"


def ensure_debootstrap(logfile: str) -> None:
    """Install Debian's ``debootstrap`` on the host when it is missing: a fresh machine (CI's
    included) has none, and ``make test SLURM=26.05`` must bring everything it needs."""
    if os.path.exists(DEBOOTSTRAP):
        return
    log.info("installing debootstrap (needed to build a Slurm root)")
    packages.install_named(["debootstrap"])
    if not os.path.exists(DEBOOTSTRAP):
        raise SandboxError(f"apt-get installed debootstrap, but {DEBOOTSTRAP} is missing; "
                           f"see {logfile}", hint="apt-get install debootstrap")


def _logged(argv: Sequence[str], logfile: str, env: Dict[str, str], timeout: float) -> None:
    """Run a build command and keep its output in ``logfile``."""
    cp = run(argv, check=False, env=env, timeout=timeout, logfile=logfile)
    with open(logfile, "a") as fh:
        fh.write(f"$ {' '.join(argv)}\n{cp.stdout}{cp.stderr}\n")
    if cp.returncode != 0:
        raise SandboxError(f"'{' '.join(argv)}' failed (exit {cp.returncode}) building a "
                           f"Slurm root; see {logfile}",
                           hint="check that apt reaches Debian's archive from this machine")


def _install(stage: str, suite: str, logfile: str) -> None:
    """apt-get install the packages inside the staged root, with nothing allowed to start."""
    policy = Path(stage, "usr", "sbin", "policy-rc.d")
    policy.write_text("#!/bin/sh\n# slurmiso sandbox root: packages start nothing.\nexit 101\n")
    policy.chmod(0o755)
    for name in ("resolv.conf", "hosts"):
        shutil.copyfile(f"/etc/{name}", os.path.join(stage, "etc", name))
    env = environ_with({"DEBIAN_FRONTEND": "noninteractive"})
    mounted = []
    try:
        for src in ("/proc", "/dev"):
            dest = stage + src
            if dest not in mounts_under(dest):
                run([MOUNT, "--rbind", src, dest])
                run([MOUNT, "--make-rslave", dest])
                mounted.append(dest)
        # The archive's Release files may be older than their Valid-Until where the clock
        # runs ahead of the mirror this machine reaches (measured on sid): still use them.
        _logged([CHROOT, stage, "apt-get", "-o", "Acquire::Check-Valid-Until=false", "update",
                 "-q"], logfile, env=env, timeout=600)
        _logged([CHROOT, stage, "apt-get", "install", "-y", "-q", "--no-install-recommends",
                 *suite_packages(suite)], logfile, env=env, timeout=1800)
        _logged([CHROOT, stage, "apt-get", "clean"], logfile, env=env, timeout=120)
    finally:
        for dest in reversed(mounted):
            run([UMOUNT, "-R", dest], check=False)


# --- running inside a root ---------------------------------------------------------------


@dataclass(frozen=True)
class Root:
    """A built root a sandbox runs from: where it is and which Slurm it has."""

    path: str
    version: str

    def argv(self, *argv: str) -> List[str]:
        return [CHROOT, self.path, *argv]

    def has(self, path: str) -> bool:
        return os.path.exists(self.path + path)

    def which(self, name: str) -> str:
        for d in ("/usr/bin", "/usr/sbin", "/bin", "/sbin"):
            if os.path.isfile(f"{self.path}{d}/{name}"):
                return f"{d}/{name}"
        raise SandboxError(f"{name} is missing from the Slurm {self.version} root {self.path}",
                           hint=f"remove {self.path} so the next 'sandbox up' rebuilds it")


def ensure_mounts(root: Root, sandbox_dir: str) -> List[str]:
    """Bind the host paths and the sandbox dir into the root (idempotent); returns new ones.

    ``--make-rslave``: an unmount inside the root never propagates back to the host.
    """
    made = []
    have = set(mounts_under(root.path))
    for src in (*SYSTEM_MOUNTS, sandbox_dir):
        dest = root.path + src
        if dest in have:
            continue
        os.makedirs(dest, exist_ok=True)
        run([MOUNT, "--rbind" if src in SYSTEM_MOUNTS else "--bind", src, dest])
        run([MOUNT, "--make-rslave", dest])
        made.append(src)
    return made


def release_mounts(root: Root, sandbox_dir: str) -> List[str]:
    """Unmount this sandbox's dir from the root, and the host paths once no sandbox is left."""
    done = []
    mine = root.path + sandbox_dir
    if mine in mounts_under(mine):
        run([UMOUNT, "-R", mine], check=False)
        done.append(sandbox_dir)
    system = {root.path + s for s in SYSTEM_MOUNTS}
    top = [m for m in mounts_under(root.path)
           if not any(m == s or m.startswith(s + "/") for s in system)]
    if top:
        return done  # another sandbox still runs from this root
    for src in reversed(SYSTEM_MOUNTS):
        if root.path + src in mounts_under(root.path + src):
            run([UMOUNT, "-R", root.path + src], check=False)
            done.append(src)
    return done


def client_wrapper(root: Root, name: str) -> str:
    """A script that runs the root's ``name`` in the root, in the caller's directory when the
    root has it (the sandbox dir and /tmp are the same paths inside), else in /."""
    real = root.which(name)
    inner = f'cd "$0" 2>/dev/null || cd /; exec {real} "$@"'
    return ("#!/bin/sh\n"
            f"# Generated by 'slurmiso sandbox up': {name} of Slurm {root.version}, run in "
            f"its root.\n"
            "# Called inside the root (a job, or runuser's child, with this dir on PATH), the\n"
            "# root's own command runs directly.\n"
            f"[ -d {root.path}/usr ] || exec {real} \"$@\"\n"
            f"exec {CHROOT} {root.path} /bin/sh -c '{inner}' \"$PWD\" \"$@\"\n")


def client_wrappers(root: Root) -> Dict[str, str]:
    return {name: client_wrapper(root, name) for name in CLIENTS}


def copy_checkout(pkg_parent: str, dest: str) -> bool:
    """Install this checkout's slurmiso (package and hook scripts) and the sandbox (its jobs
    run the demo workload) under ``dest`` for the root's own Python; returns whether anything
    changed."""
    changed = False
    for name in ("slurmiso", "slurmiso_sandbox", "prolog", "epilog", "spank"):
        src = os.path.join(pkg_parent, name)
        if not os.path.isdir(src):
            continue
        for dirpath, dirnames, filenames in os.walk(src):
            dirnames[:] = [d for d in dirnames if d != "__pycache__"]
            rel = os.path.relpath(dirpath, pkg_parent)
            os.makedirs(os.path.join(dest, rel), exist_ok=True)
            for f in filenames:
                if f.endswith((".pyc", ".so", ".o")):
                    continue
                s, d = os.path.join(dirpath, f), os.path.join(dest, rel, f)
                data = Path(s).read_bytes()
                try:
                    if Path(d).read_bytes() == data:
                        continue
                except OSError:
                    pass
                Path(d).write_bytes(data)
                os.chmod(d, os.stat(s).st_mode & 0o777)
                changed = True
    return changed


def slurm_version(root: Optional[Root]) -> str:
    """The root's (or the host's) Slurm release, e.g. ``24.11.5``; "" when absent.

    ``slurmd -V``: ``scontrol``/``sinfo --version`` with no slurm.conf to read first try a
    configless DNS SRV lookup and fail (measured on 22.05.8, 24.11.5 and 26.05.5), and the
    sandbox's slurm.conf is not visible in the root while the sandbox is down."""
    argv = root.argv(SLURMD_BIN, "-V") if root else [SLURMD_BIN, "-V"]
    try:
        cp = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False,
                            env=environ_with({}))
    except (OSError, subprocess.TimeoutExpired):
        return ""
    words = cp.stdout.split()
    return words[-1] if cp.returncode == 0 and words else ""
