"""What a containerised job needs from the host for slurmiso's isolation to hold inside it.

    >>> from slurmiso.config import load_config
    >>> roots = bind_roots(load_config("etc/slurmiso.yaml"), "gpu017", ["/scratch"])
    >>> print(render_enroot_mounts(roots, "etc/slurmiso.yaml"))   # doctest: +SKIP

One table for every runtime (Slurm's OCI support, pyxis/enroot, Apptainer): the host paths
that must appear at the same path inside (:func:`bind_roots`) and the variables the task
prolog exports that must reach the program (:data:`NEEDED_ENV`). The per-runtime renderers
here and in :mod:`slurmiso.slurm.ociconf` only format that table, so they cannot drift
apart. docs/admin-guide.md ("Containers") says what each runtime does with them and where
that was read.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from typing import Any, Dict, List, Sequence

from slurmiso.config.model import Config
from slurmiso.errors import UsageError


@dataclass(frozen=True)
class EnvNeed:
    """A variable the containerised program must see, and why."""

    name: str
    why: str


_MPS_WHY = "MPS client: the daemon's door and the limits it may narrow"
_WRAPPER_WHY = "slurmiso run: its events and step files, and the epilog's requeue flag"

#: What must reach the program: the task prolog's exports (hooks/task_prolog.py: the
#: record's env, set by the isolation modules and hooks/runner.py, plus SLURMISO_CLASS and
#: SLURMISO_REFUSED), and NVIDIA_VISIBLE_DEVICES, which NVIDIA's container hooks read and
#: slurmiso does not export yet.
NEEDED_ENV = (
    EnvNeed("CUDA_VISIBLE_DEVICES", "the job's GPU, MIG UUID or MPS device; empty when refused"),
    EnvNeed("NVIDIA_VISIBLE_DEVICES",
            "the devices NVIDIA's container hooks mount (enroot hooks.d/98-nvidia.sh)"),
    EnvNeed("CUDA_MPS_PIPE_DIRECTORY", _MPS_WHY),
    EnvNeed("CUDA_MPS_LOG_DIRECTORY", _MPS_WHY),
    EnvNeed("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", _MPS_WHY),
    EnvNeed("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", _MPS_WHY),
    EnvNeed("SLURMISO_CLASS", "the job's class, as the prolog decided it"),
    EnvNeed("SLURMISO_REFUSED", "why the prolog refused the job (its GPUs are hidden)"),
    EnvNeed("SLURMISO_EVENTS_FILE", _WRAPPER_WHY),
    EnvNeed("SLURMISO_STEPS_FILE", _WRAPPER_WHY),
    EnvNeed("SLURMISO_EPILOG_REQUEUE", _WRAPPER_WHY),
)
#: The same, as families, for comments.
NEEDED_ENV_FAMILIES = "CUDA_VISIBLE_DEVICES, NVIDIA_VISIBLE_DEVICES, CUDA_MPS_*, SLURMISO_*"


@dataclass(frozen=True)
class BindRoot:
    """A host directory the container must see at the same path, and why."""

    path: str
    why: str


def mps_root(cfg: Config, node: str = "") -> str:
    """Where every MPS daemon's pipe and log directories live (isolation/mps_dirs.py); the
    prolog makes it on every node of a config with an MPS pool, so the bind holds there."""
    return os.path.join(cfg.paths.state_dir_for(node), "mps")


def uses_mps(cfg: Config) -> bool:
    return any(p.mode == "mps" for p in cfg.pools)


def _check_root(path: str) -> str:
    """An absolute, plain host path: it is written into fstab, bind lists and JSON."""
    norm = os.path.normpath(path) if path else ""
    if not norm.startswith("/") or ".." in path.split("/") or re.search(r"[\s,:\"'\\]", norm):
        raise UsageError(f"--ckpt-root {path!r} is not a plain absolute path",
                         hint="e.g. --ckpt-root /scratch (no spaces, commas or colons)")
    return norm


def bind_roots(cfg: Config, node: str, ckpt_roots: Sequence[str]) -> List[BindRoot]:
    """The host directories slurmiso needs inside every container, in mount order.

    The MPS root is bound whole, not one daemon's directory: the prolog may recreate a
    daemon's directory under it while a container runs (mps_dirs.prepare_dirs).
    """
    out: List[BindRoot] = []
    if uses_mps(cfg):
        out.append(BindRoot(mps_root(cfg, node),
                            "MPS pipe and log directories (CUDA_MPS_PIPE_DIRECTORY lies "
                            "under it): without them an MPS client cannot reach its daemon"))
    for root in ckpt_roots:
        out.append(BindRoot(_check_root(root),
                            "checkpoints (slurmiso run --ckpt-dir, $SLURMISO_CKPT_DIR) and "
                            "the wrapper's events and step files in the job's working "
                            "directory: they must outlive the container"))
    return out


CKPT_DEFAULT_NOTE = (
    "No --ckpt-root given: 'slurmiso run' defaults to ./slurmiso-ckpt/<job id> in the "
    "working directory, and SLURMISO_EVENTS_FILE lies in the job's working directory "
    "(Slurm's --chdir). Inside a container those are the image's unless the directory "
    "holding them is bound: pass --ckpt-root for each (e.g. /home, /scratch)."
)


def config_json_mounts(roots: Sequence[BindRoot]) -> List[Dict[str, Any]]:
    """OCI runtime-spec ``mounts`` entries binding each root at the same path.

    Fields per https://github.com/opencontainers/runtime-spec/blob/main/config.md#mounts
    (destination, source, type, options); ``rbind`` so mounts below a root come along.
    """
    return [{"destination": r.path, "type": "bind", "source": r.path,
             "options": ["rbind", "rw", "nosuid", "nodev"]} for r in roots]


def config_json_fragment(roots: Sequence[BindRoot]) -> str:
    """The ``mounts`` entries to append to a bundle's config.json, as JSON."""
    return json.dumps({"mounts": config_json_mounts(roots)}, indent=2) + "\n"


def comment(text: str) -> List[str]:
    """``text`` as '# ' lines of at most 92 columns (generated files are read in terminals)."""
    import textwrap

    return ["# " + ln for ln in textwrap.wrap(text, 90, break_on_hyphens=False)]


def _header(what: str, source: str, notes: Sequence[str]) -> List[str]:
    out = comment(what) + comment(f"generated by 'slurmiso gen' from {source}; regenerate, "
                                  "do not edit")
    for note in notes:
        out += comment(note)
    return out


def render_enroot_mounts(roots: Sequence[BindRoot], source: str,
                         notes: Sequence[str] = ()) -> str:
    """A file for /etc/enroot/mounts.d/ (``*.fstab``).

    Format per enroot's doc/configuration.md and doc/image-format.md: fstab(5) lines whose
    target is relative to the container rootfs (a leading / is taken from the rootfs),
    with enroot's ``x-create=dir`` to make the mountpoint in the image first.
    """
    lines = _header("enroot mounts for slurmiso: install as /etc/enroot/mounts.d/"
                    "50-slurmiso.fstab on every GPU node", source, notes)
    if not roots:
        lines.append("# nothing to bind: no mps pool and no --ckpt-root")
    lines += comment(
        "GPUs: pyxis starts the container (enroot start) in its SPANK task_init hook, with the "
        "job's environment, and Slurm runs task_init before the TaskProlog (pyxis_slurmstepd.c "
        "enroot_start_once; Slurm's src/slurmd/slurmstepd/task.c), so slurmiso's exports are "
        "not there yet. enroot's hooks.d/98-nvidia.sh mounts the "
        "devices NVIDIA_VISIBLE_DEVICES names (the job's value, else the image's; unset or "
        "'void': none). slurmiso does not set it yet: the device cgroup is what fences.")
    if roots:
        lines += comment("no 'nofail': a root missing on the node must stop the container, "
                         "never start it without its MPS daemon or its checkpoints")
    for r in roots:
        lines += comment(r.why)
        lines.append(f"{r.path} {r.path} none x-create=dir,rbind,rw,nosuid,nodev 0 -1")
    return "\n".join(lines) + "\n"


def render_apptainer_binds(roots: Sequence[BindRoot], source: str,
                           notes: Sequence[str] = ()) -> str:
    """``bind path`` lines for apptainer.conf, and the APPTAINER_BIND equivalent.

    Syntax per https://apptainer.org/docs/admin/main/configfiles.html (``bind path = SRC``,
    bound at the same path) and https://apptainer.org/docs/user/main/bind_paths_and_mounts.html
    (APPTAINER_BIND: comma-separated ``src[:dest[:opts]]``).
    """
    lines = _header("Apptainer bind paths for slurmiso: add to /etc/apptainer/apptainer.conf "
                    "on every GPU node", source, notes)
    if not roots:
        lines.append("# nothing to bind: no mps pool and no --ckpt-root")
    for r in roots:
        lines += comment(r.why)
        lines.append(f"bind path = {r.path}")
    if roots:
        lines += comment("the same per job, where apptainer.conf cannot be changed (a "
                         "user's APPTAINER_BIND adds to it; apptainer refuses a bind whose "
                         "source is missing, so the prolog makes the MPS root on every node "
                         "of this config):")
        lines.append("# export APPTAINER_BIND=" + ",".join(r.path for r in roots))
    return "\n".join(lines) + "\n"
