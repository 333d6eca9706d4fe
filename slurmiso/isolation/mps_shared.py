"""A shared MPS server per GPU (``mps_server: shared``): MPS v3, a namespace per job.

Both classes become clients of one server, so idle SMs are lent across classes and the
client priority orders them (docs/mps-v3.md). The layout, all root's:

* one ``-p 3 -m`` control daemon per GPU, its pipe directory ``mps/gpu<N>/shared/pipe``
  (0711: searchable, not listable); its top-level socket, which routes by uid into root's
  default namespace and takes verbs, is closed to everyone but root (0600);
* one server, :data:`SERVER` (uid 0, as multi-user mode requires), whose own socket (its
  default namespace) is closed the same way;
* one namespace per job, ``job_<id>_<64 random bits>``, holding the class's thread
  percentage, pinned-memory limit and client priority; its directory is given to the job's
  user, 0700, so no other user can reach it, and its name cannot be guessed in the window
  between ``namespace create`` and the hand-over.

What a job cannot be kept from (NVIDIA documents it): its own ``CUDA_MPS_CLIENT_PRIORITY``
wins over its namespace's. The namespace's thread percentage overrides the job's variable, so
the compute cap holds whatever the job sets.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import stat
from typing import TYPE_CHECKING, Dict, List, Optional

from slurmiso.errors import NodeFault
from slurmiso.isolation.mps_dirs import DIR_MODE, PRIVATE_MODE, gpu_dir, remove_tree

if TYPE_CHECKING:
    from slurmiso.isolation.mps_daemon import MpsControl

log = logging.getLogger(__name__)

#: The arrangement's name in records, the journal and ``slurmiso status``.
ARRANGEMENT = "shared-v3"
#: The one server of each GPU's daemon.
SERVER = "slurmiso"
SOCKET = "control"
#: Searchable, not listable: clients reach their namespace's directory by its full name.
SEARCH_ONLY = 0o711
CLOSED_SOCKET = 0o600
NAMESPACE_RE = re.compile(r"job_[0-9_]{1,30}_[0-9a-f]{16}")


def shared_paths(state_dir: str, gpu: int) -> Dict[str, str]:
    base = os.path.join(gpu_dir(state_dir, gpu), "shared")
    return {"base": base, "pipe": os.path.join(base, "pipe"), "log": os.path.join(base, "log")}


def namespace_dir(pipe_dir: str, namespace: str) -> str:
    """Where a namespace's socket lives: ``<pipe>/<server>/<namespace>`` (NVIDIA's routing)."""
    return os.path.join(pipe_dir, SERVER, namespace)


def new_namespace(job_id: str) -> str:
    """A fresh namespace name for ``job_id``: the job, and 64 bits no other user can guess."""
    return f"job_{job_id}_{os.urandom(8).hex()}"


def prepare_dirs(paths: Dict[str, str]) -> None:
    """Fresh root-owned directories for a GPU's shared daemon (stale ones removed first)."""
    for path in (os.path.dirname(os.path.dirname(paths["base"])),
                 os.path.dirname(paths["base"])):
        os.makedirs(path, DIR_MODE, exist_ok=True)
        os.chmod(path, DIR_MODE)
    remove_tree(paths["base"])
    os.mkdir(paths["base"], DIR_MODE)
    os.chmod(paths["base"], DIR_MODE)
    os.mkdir(paths["pipe"], SEARCH_ONLY)
    os.chmod(paths["pipe"], SEARCH_ONLY)
    os.mkdir(paths["log"], PRIVATE_MODE)
    os.chmod(paths["log"], PRIVATE_MODE)


def close_door(folder: str, mode: int = SEARCH_ONLY) -> None:
    """Root's socket in ``folder`` closed to others, the folder searchable only.

    NodeFault when it does not hold: a socket others can reach routes them into a namespace
    without their class's limits."""
    sock = os.path.join(folder, SOCKET)
    try:
        os.chmod(folder, mode)
        os.chmod(sock, CLOSED_SOCKET)
        st = os.lstat(sock)
    except OSError as exc:
        raise NodeFault(f"cannot close the MPS socket {sock} to jobs: {exc}") from None
    if st.st_uid != 0 or stat.S_IMODE(st.st_mode) & 0o077:
        raise NodeFault(f"the MPS socket {sock} stays open to jobs (uid {st.st_uid}, "
                        f"mode {stat.S_IMODE(st.st_mode):o})")


def hand_over(folder: str, uid: int) -> None:
    """Give a namespace's directory to its job's user, 0700; NodeFault unless it holds."""
    try:
        os.chown(folder, uid, -1, follow_symlinks=False)
        os.chmod(folder, PRIVATE_MODE)
        st = os.lstat(folder)
    except OSError as exc:
        raise NodeFault(f"cannot give the MPS namespace {folder} to uid {uid}: {exc}") from None
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != uid or stat.S_IMODE(st.st_mode) != 0o700:
        raise NodeFault(f"the MPS namespace {folder} is not uid {uid}'s alone after hand-over")


def start_daemon(control: MpsControl, uuid: str, paths: Dict[str, str]) -> int:
    """Start a GPU's ``-p 3 -m`` daemon and its server, every door closed; its pid.

    Stops what it started when a step fails (fail closed: no job reaches a half-laid daemon).
    """
    prepare_dirs(paths)
    try:
        pid = control.start(uuid, paths["pipe"], paths["log"], protocol=3, multiuser=True)
        close_door(paths["pipe"])
        control.v3(paths["pipe"], ["server", "create", SERVER, "--uid=0"])
        close_door(os.path.join(paths["pipe"], SERVER))
    except NodeFault:
        control.stop(paths["pipe"], 10.0)
        remove_daemon_dirs(paths)
        raise
    return pid


def namespace_argv(namespace: str, thread_percentage: int, memory_limit_mb: int,
                   priority: int) -> List[str]:
    """The verb that sets a job's namespace to its class's terms."""
    return ["namespace", "set", namespace, f"--server={SERVER}",
            f"--active-thread-percentage={thread_percentage}",
            f"--client-priority={priority}",
            *([f"--pinned-memory-limit={memory_limit_mb}M"] if memory_limit_mb else [])]


def open_namespace(control: MpsControl, pipe_dir: str, namespace: str, uid: int,
                   terms: List[str]) -> str:
    """Create ``namespace`` with ``terms`` (:func:`namespace_argv`) and give it to ``uid``;
    its directory. On failure the namespace is deleted again before NodeFault goes up."""
    if not NAMESPACE_RE.fullmatch(namespace):
        raise NodeFault(f"refusing MPS namespace name {namespace!r}")
    control.v3(pipe_dir, ["namespace", "create", namespace, f"--server={SERVER}"])
    try:
        control.v3(pipe_dir, terms)
        folder = namespace_dir(pipe_dir, namespace)
        hand_over(folder, uid)
    except NodeFault:
        close_namespace(control, pipe_dir, namespace)
        raise
    return folder


def close_namespace(control: MpsControl, pipe_dir: str, namespace: str) -> None:
    """Delete a job's namespace (its clients were ended first) and its directory."""
    if not NAMESPACE_RE.fullmatch(namespace):
        log.warning("not deleting MPS namespace %r: not a name slurmiso makes", namespace)
        return
    if control.running(pipe_dir) is not None:
        try:
            control.v3(pipe_dir, ["namespace", "delete", namespace, f"--server={SERVER}",
                                  "--force"])
        except NodeFault as exc:
            log.warning("MPS namespace %s: %s", namespace, exc)
    remove_tree(namespace_dir(pipe_dir, namespace))


def namespaces(control: MpsControl, pipe_dir: str) -> List[Dict[str, str]]:
    """The server's namespaces as the daemon lists them (CSV with its header)."""
    out = control.v3(pipe_dir, ["namespace", "list", f"--server={SERVER}", "--format=csv"])
    lines = [line for line in out.splitlines() if line.strip()]
    if not lines:
        return []
    header = lines[0].split(",")
    return [dict(zip(header, line.split(","))) for line in lines[1:]]


def stale_namespaces(control: MpsControl, pipe_dir: str, live: List[str]) -> List[str]:
    """Namespaces of ours the daemon holds that no live job's record names."""
    names = [row.get("name", "") for row in namespaces(control, pipe_dir)]
    return [n for n in names if NAMESPACE_RE.fullmatch(n) and n not in live]


def namespace_of(extra: Dict[str, object]) -> Optional[str]:
    """A record's namespace name, where it is one slurmiso makes."""
    name = extra.get("namespace")
    return name if isinstance(name, str) and NAMESPACE_RE.fullmatch(name) else None


def has_leftovers(pipe_dir: str) -> bool:
    """A pipe directory with files in it: a daemon that died (or stale files after a boot)."""
    try:
        return bool(os.listdir(pipe_dir))
    except OSError:
        return False


def remove_daemon_dirs(paths: Dict[str, str]) -> None:
    remove_tree(paths["base"])
    with contextlib.suppress(OSError):
        os.rmdir(os.path.dirname(paths["base"]))
