"""The sandbox's cgroup version: which one it runs, and the v2 mount namespace.

    choose_cgroup(root, "v2")   # --cgroup, else what up recorded, else the host's
    v2_fields(root, "v2")       # the Site fields of that version
    start_cgroup_ns(site)       # the namespace holder every Slurm daemon enters

On a hybrid host (v1 controllers mounted) a v2 sandbox runs its daemons in a mount namespace
whose /sys/fs/cgroup is the cgroup2 hierarchy alone, with hybrid_shim.c preloaded.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any, Dict, Optional, Tuple

from slurmiso.errors import SandboxError
from slurmiso_sandbox import files, layout, services, state
from slurmiso_sandbox.procs import process_matches, run, wait_until

log = logging.getLogger(__name__)

GCC = "/usr/bin/gcc"
#: A cgroup v2 sandbox on a hybrid host moves its default ports (beside the v1 one).
V2_PORT_SHIFT = 500
CGROUP_VERSIONS = ("v1", "v2")


def host_cgroup() -> str:
    """``v1`` where the host mounts the v1 devices controller, else ``v2`` (pure unified)."""
    return "v1" if os.path.isdir("/sys/fs/cgroup/devices") else "v2"


def choose_cgroup(root: str, cgroup: Optional[str]) -> str:
    """The cgroup version a sandbox runs: ``--cgroup`` (or ``SLURMISO_SANDBOX_CGROUP``), else
    the one ``up`` recorded in the dir, else the host's (v1 on a hybrid host). A dir made for
    one version is not switched to the other while it holds a sandbox."""
    recorded = str(state.recorded(root).get("cgroup") or "")
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
        return os.statvfs("/sys/fs/cgroup") is not None and fstype("/sys/fs/cgroup") == "cgroup2"
    except OSError:
        return False


def fstype(path: str, mountinfo: str = "/proc/self/mountinfo") -> str:
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


def build_shim(site: layout.Site) -> str:
    """Compile hybrid_shim.c for the Slurm daemons (in the root, against its C library)."""
    src = os.path.join(site.pythonpath or files.checkout(), "slurmiso_sandbox", "hybrid_shim.c")
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


def _ns_ready(site: layout.Site, pid: int) -> bool:
    """The holder's namespace is set up: cgroup2 at /sys/fs/cgroup (and in the root)."""
    mountinfo = f"/proc/{pid}/mountinfo"
    want = ["/sys/fs/cgroup"] + ([site.chroot + "/sys/fs/cgroup"] if site.chroot else [])
    return all(fstype(w, mountinfo) == "cgroup2" for w in want) and process_matches(
        pid, ("sleep",))


def start_cgroup_ns(site: layout.Site) -> str:
    """The mount namespace every Slurm daemon of a cgroup v2 sandbox runs in. A holder that
    died leaves the daemons in its namespace: they are restarted in the new one."""
    done = [build_shim(site)] if site.hybrid_shim else []
    svc = services.cgroup_ns_service(site)
    pid = svc.pid()
    if pid and _ns_ready(site, pid):
        return "; ".join(done + [f"running (pid {pid})"])
    stranded = services.stop([s for s in services.daemons(site) if s.ns])
    if stranded:
        log.warning("cgroup v2 namespace holder gone: restarting %s in a new one",
                    ", ".join(stranded))
    pid = services.start(site, svc)
    wait_until("cgroup v2 namespace", lambda: _ns_ready(site, pid), timeout=20,
               logfile=svc.logfile, alive=services.alive(svc), interval=0.1)
    shown = ", ".join(site.v2_controllers) or "none"
    return "; ".join(done + [f"started (pid {pid}; cgroup2 root controllers: {shown})"])
