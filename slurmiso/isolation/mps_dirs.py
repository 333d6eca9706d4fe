"""Where an MPS daemon lives on disk, and who may enter: one directory per (GPU, uid, limits).

Layout (see :mod:`slurmiso.isolation.mps` for why daemons are keyed this way)::

    <state_dir>/mps/gpu<N>/                  root 0755
    <state_dir>/mps/gpu<N>/u<U>-t<P>-m<M>/   root 0755 (one daemon: uid U, P %, M MiB)
        pipe   CUDA_MPS_PIPE_DIRECTORY  owner U, 0700 (root-only until the limits are set)
        log    CUDA_MPS_LOG_DIRECTORY   owner U, 0700

The parents stay root's so nobody can swap a daemon's directory; what is inside ``pipe`` and
``log`` belongs to the job's user and is never trusted (see ``mps_daemon._read_pid``).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
from dataclasses import dataclass
from typing import Dict

DIR_MODE = 0o755
PRIVATE_MODE = 0o700
DAEMON_DIR_RE = re.compile(r"u([0-9]+)-t([0-9]+)-m([0-9]+)")
#: Directories of the one-daemon-per-GPU layout before per-user daemons (1777 pipe dir).
LEGACY_DIRS = ("pipe", "log")


@dataclass(frozen=True)
class DaemonKey:
    """What one daemon serves: one GPU, one uid, one set of server-side limits."""

    gpu: int
    uid: int
    thread_percentage: int
    memory_limit_mb: int  # 0 = no pinned-memory limit

    @property
    def name(self) -> str:
        return f"u{self.uid}-t{self.thread_percentage}-m{self.memory_limit_mb}"


def mps_root(state_dir: str) -> str:
    """Where every MPS daemon's directories live on a node (containers bind it whole)."""
    return os.path.join(state_dir, "mps")


def ensure_root(state_dir: str) -> None:
    """The MPS root, root-owned 0755, on every node of a config with an MPS pool: containers
    bind it whole (``slurmiso gen oci-conf --config-json``, ``APPTAINER_BIND``), and a runtime
    refuses a bind whose source is missing (apptainer 1.4.5, measured), also on nodes that
    never run an MPS job. ``state_dir`` is root's and checked (NodeState.ensure)."""
    root = mps_root(state_dir)
    if not os.path.isdir(root):
        os.makedirs(root, DIR_MODE, exist_ok=True)
        os.chmod(root, DIR_MODE)


def gpu_dir(state_dir: str, gpu: int) -> str:
    return os.path.join(mps_root(state_dir), f"gpu{gpu}")


def daemon_paths(state_dir: str, key: DaemonKey) -> Dict[str, str]:
    base = os.path.join(gpu_dir(state_dir, key.gpu), key.name)
    return {"base": base, "pipe": os.path.join(base, "pipe"), "log": os.path.join(base, "log")}


def prepare_dirs(paths: Dict[str, str]) -> None:
    """Fresh daemon directories, root-only. chmod after mkdir: slurmd's umask may be 077.

    The parents stay root-owned 0755 so nobody can swap a daemon's directory; a stale one
    (e.g. after a reboot) is removed first (rmtree does not follow symlinks).
    """
    for path in (os.path.dirname(os.path.dirname(paths["base"])),
                 os.path.dirname(paths["base"])):
        os.makedirs(path, DIR_MODE, exist_ok=True)
        os.chmod(path, DIR_MODE)
    if os.path.lexists(paths["base"]):
        if os.path.islink(paths["base"]):
            os.unlink(paths["base"])
        else:
            shutil.rmtree(paths["base"])
    os.mkdir(paths["base"], DIR_MODE)
    os.chmod(paths["base"], DIR_MODE)
    for name in ("pipe", "log"):
        os.mkdir(paths[name], PRIVATE_MODE)
        os.chmod(paths[name], PRIVATE_MODE)


def hand_over(paths: Dict[str, str], uid: int) -> None:
    """Give the pipe and log directories to the job's user, 0700: that user and root only.

    Called once the daemon runs and holds its limits, so every file the root daemon creates
    at start exists before the user can touch the directory. The MPS server runs as the
    client's uid and makes its pipes here, so the directory must be that user's.
    """
    for name in ("pipe", "log"):
        os.chown(paths[name], uid, -1, follow_symlinks=False)
        os.chmod(paths[name], PRIVATE_MODE)


def has_leftovers(pipe_dir: str) -> bool:
    try:
        return bool(os.listdir(pipe_dir))
    except OSError:
        return False


def remove_tree(path: str) -> None:
    """Remove a daemon directory (a symlink is removed, never followed)."""
    if os.path.islink(path):
        os.unlink(path)
    else:
        with contextlib.suppress(FileNotFoundError):
            shutil.rmtree(path)
