"""What ``up`` puts on disk: directories, device stand-ins, configs, hook wrappers, simulated
GPU state and the SPANK plugins. Each is written only when it differs (assert, then act).

    changed = write_files(site)          # relative paths of the configs that changed
    if SLURMD_CONFS & set(changed): ...  # the daemons must restart to read them
"""

from __future__ import annotations

import json
import os
import stat
from dataclasses import replace
from pathlib import Path
from typing import List

from slurmiso_sandbox import layout, oci
from slurmiso_sandbox.procs import run

MAKE = "/usr/bin/make"
#: Files whose change needs the daemons restarted (slurmd reads them at start).
SLURMD_CONFS = {"etc/slurm.conf", "etc/gres.conf", "etc/cgroup.conf", "etc/plugstack.conf",
                "etc/oci.conf"}


def write_files(site: layout.Site) -> List[str]:
    """Directories, device stand-ins, configs and hook wrappers; returns changed files."""
    for d in ("etc", "bin", "lib", "run", "log", "spool/ctld", "sim", "mysql", "dev"):
        os.makedirs(site.path(*d.split("/")), exist_ok=True)
    for n in site.nodes:
        os.makedirs(site.path("state", n.name), exist_ok=True)
    os.chmod(site.root, 0o755)
    changed = [d.path for d in layout.device_nodes(site) if _mknod(d)]
    rendered = layout.rendered_files(site)
    if oci.supported(site):
        rendered["etc/oci.conf"] = oci.render_oci_conf(site, oci.slurm_version(site))
    for rel, text in rendered.items():
        mode = 0o755 if rel.startswith("bin/") else 0o600 if rel.endswith("dbd.conf") else 0o644
        if write_if_changed(site.path(*rel.split("/")), text, mode):
            changed.append(rel)
    for stale in set(os.listdir(site.path("bin"))) - set(layout.hook_wrappers(site)):
        os.unlink(site.path("bin", stale))  # hooks removed from the repo: drop wrappers
    return changed


def write_bundle(site: layout.Site) -> str:
    """The sandbox's OCI bundle (oci.py): rootfs skeleton, config.json, state root."""
    rootfs = oci.prepare_dirs(site)
    text = json.dumps(oci.bundle_config(site, oci.crun_spec(site)), indent=1) + "\n"
    path = os.path.join(os.path.dirname(rootfs), "config.json")
    return f"bundle {os.path.dirname(rootfs)} " + (
        "written" if write_if_changed(path, text, 0o644) else "unchanged")


def write_if_changed(path: str, text: str, mode: int) -> bool:
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


def _mknod(dev: layout.DeviceNode) -> bool:
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


def with_live_slots(site: layout.Site) -> layout.Site:
    """``site`` with each MIG node's ``live_slots`` read from its simulated GPUs, so gres.conf
    and ``Gres=`` describe the instances that exist (a re-laid node included); a node without
    simulated state or instances keeps its planned slots (``init_sim`` creates them)."""
    from slurmiso.gpu.sim import SimBackend

    nodes = []
    for n in site.nodes:
        path = layout.sim_path(site, n)
        if n.mig_slots and os.path.exists(path):
            backend = SimBackend(path)
            try:
                live = tuple(layout.MigSlot(i.gpu_index, i.profile, i.placement_start,
                                            i.gi_id, i.ci_id)
                             for i in sorted(backend.instances(),
                                             key=lambda i: (i.gpu_index, i.placement_start)))
            finally:
                backend.close()
            if live:
                n = replace(n, live_slots=live)
        nodes.append(n)
    return replace(site, nodes=tuple(nodes))


def init_sim(site: layout.Site) -> List[str]:
    """Simulated GPU state per node, created only when absent; n3 gets its MIG layout."""
    from slurmiso.gpu.backend import create_mig_device
    from slurmiso.gpu.sim import SimBackend, init_state

    made = []
    os.makedirs(site.path("sim"), exist_ok=True)
    for n in site.nodes:
        path = layout.sim_path(site, n)
        if os.path.exists(path) and not n.mig_slots and n.mode in layout.PLAIN_MODES:
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


def checkout() -> str:
    import slurmiso

    return str(Path(slurmiso.__file__).resolve().parent.parent)


def spank_source(pkg_parent: str) -> str:
    return os.path.join(pkg_parent, "spank", "slurmiso_spank.c")


def build_spank(site: layout.Site) -> str:
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
