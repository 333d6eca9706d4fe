"""Slurm's OCI containers in the sandbox: crun from the Debian root, oci.conf from slurmiso's
own generator, and one bundle made of the root itself (no registry, no network).

    if oci.supported(site):
        files["etc/oci.conf"] = oci.render_oci_conf(site, oci.slurm_version(site))
        cfg = oci.bundle_config(site, oci.crun_spec(site))  # files.write_bundle writes it

Every site runs them: the roots' crun, or the host's (Debian's package, installed with
Slurm). On the host's Slurm 22.05, which writes a container's config.json before the
TaskProlog (docs/admin-guide.md, "Containers"), oci.conf keeps only the keys 22.05 parses,
and the gate refuses every container of a managed node: the tests show that refusal there.
The bundle's config.json starts as what the site's own ``crun spec --rootless`` writes, so
its shape is
the runtime's, then binds the root's ``/usr`` and ``/etc`` read-only and the sandbox dir and
``/tmp`` at the same paths: the MPS pipe root, the device stand-ins and the jobs' files are
where the host has them, as ``slurmiso gen oci-conf --config-json`` asks of every bundle.
"""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Tuple

from slurmiso.slurm.ociconf import env_after_task_prolog
from slurmiso_sandbox.procs import run

if TYPE_CHECKING:
    from slurmiso_sandbox import layout

CRUN = "/usr/bin/crun"
#: What the rootfs holds: mount points for the binds, and the merged-/usr links.
ROOTFS_DIRS = ("usr", "etc", "proc", "dev", "sys", "tmp", "run", "home", "var/tmp")
ROOTFS_LINKS = {"bin": "usr/bin", "lib": "usr/lib", "lib64": "usr/lib64", "sbin": "usr/sbin"}
#: Mounts of crun's default spec the sandbox leaves out: a cgroup mount needs a cgroup
#: namespace the rootless runtime may not get; the container's cgroup is the step's anyway.
DROPPED_MOUNTS = ("/sys/fs/cgroup",)


def supported(site: layout.Site) -> bool:
    """Whether this site has a runtime for ``srun --container`` (the roots install crun;
    the host gets Debian's with Slurm)."""
    return bool(site.chroot) or os.path.exists(CRUN)


def slurm_version(site: layout.Site) -> Optional[Tuple[int, int, int]]:
    """The site's slurmstepd release (``slurmd -V``); None if it cannot say."""
    from slurmiso.slurm.client import parse_version

    cp = run(site.exe("slurmd", "-V"), timeout=30, check=False)
    return parse_version(cp.stdout) if cp.returncode == 0 else None


def bundle_dir(site: layout.Site) -> str:
    return site.path("oci", "bundle")


def state_root(site: layout.Site, version: Optional[Tuple[int, int, int]] = None) -> str:
    """Each user's runtime state: the roots have no /run/user/<uid> (no logind). By uid
    (``%U``, 23.02+); 22.05's slurmstepd knows only the user's name (``%u``) and dies on
    ``%U`` (measured: "unexpected replacement character: U")."""
    return site.path("oci", "run") + ("/%U/" if env_after_task_prolog(version) else "/%u/")


def render_oci_conf(site: layout.Site, version: Optional[Tuple[int, int, int]]) -> str:
    """The generator's own oci.conf, with the sandbox's gate wrapper and state root, less
    the keys ``version``'s slurmstepd would not parse."""
    from slurmiso.slurm.ociconf import known_keys
    from slurmiso.slurm.ociconf import render_oci_conf as render

    text = render((), "crun", site.slurmiso_yaml, gate=site.path("bin", "slurmiso-oci-gate"),
                  state_root=state_root(site, version))
    keys = {k.lower() for k in known_keys(version)}
    # 22.05 fails its parse on any key it does not know (IgnoreFileConfigJson, EnvExclude)
    return "".join(ln for ln in text.splitlines(keepends=True)
                   if ln.startswith("#") or "=" not in ln
                   or ln.split("=", 1)[0].strip().lower() in keys)


def _bind(path: str, read_only: bool) -> Dict[str, Any]:
    opts = ["rbind", "nosuid"] + (["ro", "nodev"] if read_only else [])
    return {"destination": path, "type": "bind", "source": path, "options": opts}


def bundle_config(site: layout.Site, spec: Dict[str, Any]) -> Dict[str, Any]:
    """crun's default rootless ``spec`` made into the sandbox's bundle (pure). The sandbox
    dir keeps its device files usable (no ``nodev``): the GPU stand-ins live there, and the
    device cgroup, not the mount, is what must fence them."""
    cfg = json.loads(json.dumps(spec))
    cfg["process"]["terminal"] = False
    cfg["process"]["args"] = ["/bin/sh"]
    cfg["root"] = {"path": os.path.join(bundle_dir(site), "rootfs"), "readonly": True}
    cfg["hostname"] = "sbx-container"
    linux = cfg.setdefault("linux", {})
    # host network: the agent reads --iso-metrics listeners in the node's namespace
    linux["namespaces"] = [n for n in linux.get("namespaces", []) if n.get("type") != "network"]
    linux.pop("resources", None)  # the step's cgroup holds the limits (cgroup-manager=disabled)
    mounts: List[Dict[str, Any]] = [m for m in cfg.get("mounts", [])
                                    if m.get("destination") not in DROPPED_MOUNTS]
    mounts += [_bind("/usr", True), _bind("/etc", True), _bind(site.root, False),
               _bind("/tmp", False)]
    cfg["mounts"] = mounts
    return cfg


def crun_spec(site: layout.Site) -> Dict[str, Any]:
    """What the root's crun writes as its default rootless config.json."""
    work = site.path("oci", "spec")
    os.makedirs(work, exist_ok=True)
    path = os.path.join(work, "config.json")
    if os.path.exists(path):
        os.unlink(path)
    run(site.exe("/bin/sh", "-c", f'cd "{work}" && {CRUN} spec --rootless'), timeout=30)
    with open(path, encoding="utf-8") as fh:
        spec: Dict[str, Any] = json.load(fh)
    return spec


def prepare_dirs(site: layout.Site) -> str:
    """The rootfs skeleton and the runtime's state root; returns the rootfs."""
    rootfs = os.path.join(bundle_dir(site), "rootfs")
    for d in ROOTFS_DIRS + (site.root.lstrip("/"),):
        os.makedirs(os.path.join(rootfs, d), exist_ok=True)
    for name, target in ROOTFS_LINKS.items():
        if not os.path.islink(os.path.join(rootfs, name)):
            os.symlink(target, os.path.join(rootfs, name))
    os.makedirs(site.path("oci", "run"), exist_ok=True)
    os.chmod(site.path("oci", "run"), 0o1777)  # crun makes each user's <uid> dir itself
    for d in (site.path("oci"), bundle_dir(site)):
        os.chmod(d, 0o755)
    return rootfs
