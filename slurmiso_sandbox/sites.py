"""The sandbox's :class:`~slurmiso_sandbox.layout.Site` on this machine, right now.

    site = make_site("/var/lib/slurmiso-sandbox", slurm="24.11", cgroup="v2")

Everything ``up`` chose for a dir (release, port base, plain GPU, cgroup version) is read back
from it, so later commands describe the same cluster.
"""

from __future__ import annotations

import os
import socket
import stat
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any, Optional

from slurmiso.errors import SandboxError
from slurmiso_sandbox import cgroups, files, layout, packages, roots, state

#: Where the Debian/RPM packages put the hooks and the SPANK plugins (``make deb``).
PACKAGED_BIN = "/usr/bin"
PACKAGED_SPANK = "/usr/lib/slurmiso/slurmiso.so"
#: Default port base per root release (PORT_BASE + 1000 * shift): beside the host's sandbox.
RELEASE_PORT_SHIFT = {"24.11": 1, "26.05": 2}


def default_dir() -> str:
    return os.environ.get("SLURMISO_SANDBOX_DIR") or layout.DEFAULT_DIR


def hooks_wanted() -> bool:
    """``SLURMISO_SANDBOX_HOOKS=0`` runs the cluster without slurmiso's hooks, to tell a
    sandbox problem from a hook problem."""
    return os.environ.get("SLURMISO_SANDBOX_HOOKS", "1").lower() not in ("0", "off", "no")


def make_site(root: Optional[str] = None, slurm: Optional[str] = None,
              plain: Optional[str] = None, cgroup: Optional[str] = None) -> layout.Site:
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
    version = cgroups.choose_cgroup(root, cgroup)
    v2_shift = cgroups.V2_PORT_SHIFT if version == "v2" and cgroups.host_cgroup() == "v1" else 0
    base = port_base(state.recorded(root).get("port_base")
                     or layout.PORT_BASE + 1000 * RELEASE_PORT_SHIFT.get(release, 0) + v2_shift)
    nodes = layout.with_plain_gpu(tuple(replace(n, port=n.port - layout.PORT_BASE + base)
                                        for n in layout.NODES), plain_gpu(root, plain))
    v2 = cgroups.v2_fields(root, version)
    if release:
        py = os.path.join(root, "lib", "py")
        return layout.Site(
            **v2,
            root=root,
            host=socket.gethostname().split(".")[0],
            python=packages.SYSTEM_PYTHON,
            prolog=os.path.join(py, "prolog", "slurmiso-prolog") if hooks else "",
            epilog=os.path.join(py, "epilog", "slurmiso-epilog") if hooks else "",
            pythonpath=py,
            task_python=packages.SYSTEM_PYTHON,
            spank_plugin=os.path.join(root, "lib", "slurmiso.so")
            if os.path.isfile(files.spank_source(pkg_parent)) else "",
            nodes=nodes,
            port_base=base,
            slurm=release,
            ignore_systemd=True,  # measured: 24.11's cgroup/v1 asks systemd for a scope
            first_job_id=int(release.replace(".", "")) * 1000,
            chroot=roots.root_path(release),
        )
    return layout.Site(
        **v2,
        root=root,
        host=socket.gethostname().split(".")[0],
        python=sys.executable,
        prolog=prolog if hooks else "",
        epilog=epilog if hooks else "",
        pythonpath=pkg_parent,
        task_python="" if world_reachable(sys.executable) else packages.SYSTEM_PYTHON,
        spank_plugin=os.path.join(root, "lib", "slurmiso.so")
        if os.path.isfile(files.spank_source(pkg_parent)) else "",
        nodes=nodes,
        port_base=base,
    )


def packaged_site(site: layout.Site) -> layout.Site:
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
    raw = os.environ.get("SLURMISO_SANDBOX_PORT_BASE") or recorded or layout.PORT_BASE
    try:
        base = int(raw)
    except (TypeError, ValueError):
        base = -1
    if not 1024 <= base <= 65000:
        raise SandboxError(f"SLURMISO_SANDBOX_PORT_BASE={raw!r} is not a port base",
                           hint="a number from 1024 to 65000, e.g. 17800")
    return base


def host_release() -> str:
    """The host's Slurm release (``22.05``), "" when it has none."""
    full = roots.slurm_version(None)
    return ".".join(full.split(".")[:2]) if full else ""


def choose_release(root: str, slurm: Optional[str]) -> str:
    """The release a sandbox runs: ``--slurm``, else the one ``up`` recorded in the dir; ""
    means the host's own Slurm. A dir made for one release is not reused for another."""
    recorded = str(state.recorded(root).get("slurm") or "")
    if slurm is None:
        return recorded
    want = roots.check_version(slurm)
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
            or str(state.recorded(root).get("plain_gpu") or ""))
    if spec:
        layout.parse_plain_gpu(spec)
    return spec.strip()


def site_root(site: layout.Site) -> Optional[roots.Root]:
    return roots.Root(site.chroot, site.slurm) if site.chroot else None


def world_reachable(path: str) -> bool:
    """Whether any user can run/read ``path`` (every directory above it searchable).

    The TaskProlog runs as the job's user: an interpreter under /root (pyenv) fails there
    with exit 126, so such sites fall back to the system Python (see packages.TASK_PACKAGES).
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
