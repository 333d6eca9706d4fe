"""The device fence of a job: which NVIDIA devices its tasks must never open.

Slurm's device constraint (``ConstrainDevices=yes``) closes the gres.conf files a job was not
given. What it cannot know, slurmiso closes: on a mig-dynamic node, every MIG capability
device but the job's own instance's two (the shard hands the job ``/dev/nvidiaN``, and the
other jobs' instances live on that GPU); for a job slurmiso refused, every NVIDIA device.

The prolog writes the rules here, root-owned, at ``<state_dir>/fence/<job id>``, *before*
it says the job may start: first "deny everything" (so a prolog that dies half-way leaves a
fenced job), then the job's real fence. ``spank/slurmiso_fence.c`` applies them in slurmstepd,
as root, after Slurm has put the task into its device cgroup: on cgroup v1 by writing each rule
into that cgroup's ``devices.deny``, on cgroup v2 as a BPF device program attached to the
task's cgroup beside Slurm's own. A job with no fence file gets every NVIDIA device denied.
The epilog removes the file. See docs/security.md for what this guarantees on which cgroup
version; :mod:`slurmiso.isolation.bpf_probe` tells doctor whether this kernel can take the v2 fence
(kept apart: ctypes costs the hook path milliseconds it never needs).
"""

from __future__ import annotations

import os
import stat
from typing import TYPE_CHECKING, Dict, Iterable, List, Optional, Sequence, Set, Tuple

from slurmiso.atomic import write_atomic

if TYPE_CHECKING:
    from slurmiso.state.record import JobRecord

FENCE_DIR = "fence"
NVIDIA_MAJOR = 195  # the driver's fixed major for /dev/nvidiaN and /dev/nvidiactl
# The driver's numbering of MIG access caps when mig-minors cannot be read (mig/gres.py).
_GI_IDS = 15
_CI_IDS = 8


def fence_path(state_dir: str, job_id: str) -> str:
    return os.path.join(state_dir, FENCE_DIR, str(job_id))


def _major_of(path: str) -> Optional[int]:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return os.major(st.st_rdev) if stat.S_ISCHR(st.st_mode) else None


def _proc_majors(proc_root: str = "/proc") -> Dict[str, int]:
    """Character device name -> major from /proc/devices."""
    out: Dict[str, int] = {}
    try:
        with open(os.path.join(proc_root, "devices"), encoding="ascii", errors="replace") as fh:
            text = fh.read()
    except OSError:
        return out
    in_char = False
    for line in text.splitlines():
        if line.startswith("Character devices:"):
            in_char = True
        elif line.startswith("Block devices:"):
            in_char = False
        elif in_char:
            parts = line.split()
            if len(parts) == 2 and parts[0].isdigit():
                out[parts[1]] = int(parts[0])
    return out


def caps_major(dev_root: str, proc_root: str = "/proc") -> Optional[int]:
    """The nvidia-caps major: the driver's (/proc/devices), else a cap file's under dev_root."""
    if dev_root == "/dev":
        major = _proc_majors(proc_root).get("nvidia-caps")
        if major is not None:
            return major
    folder = os.path.join(dev_root, "nvidia-caps")
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        return None
    for name in names:
        major = _major_of(os.path.join(folder, name))
        if major is not None:
            return major
    return None


def nvidia_majors(dev_root: str, proc_root: str = "/proc") -> List[int]:
    """Every NVIDIA character major: 195, nvidia-caps, nvidia-uvm (and any other nvidia-*)."""
    majors: Set[int] = {NVIDIA_MAJOR}
    if dev_root == "/dev":
        majors |= {m for name, m in _proc_majors(proc_root).items() if name.startswith("nvidia")}
    for name in ("nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset"):
        major = _major_of(os.path.join(dev_root, name))
        if major is not None:
            majors.add(major)
    cap = caps_major(dev_root, proc_root)
    if cap is not None:
        majors.add(cap)
    return sorted(majors)


def deny_all_rules(dev_root: str, proc_root: str = "/proc") -> List[str]:
    """A job slurmiso refused (or has not finished preparing) reaches no NVIDIA device."""
    return [f"c {m}:*" for m in nvidia_majors(dev_root, proc_root)]


def node_cap_minors(gpu_minors: Iterable[int], minors: Optional[Dict[str, int]]) -> Set[int]:
    """Every MIG capability minor of the node's GPUs: the driver's table when it exists,
    else the driver's numbering (config 1, monitor 2, then 15 GIs x (GI + 8 CIs) per GPU)."""
    if minors is not None:
        return set(minors.values())
    from slurmiso.mig.gres import computed_cap_minor

    out = {1, 2}
    for g in gpu_minors:
        for gi in range(_GI_IDS):
            out.add(computed_cap_minor(g, gi))
            out |= {computed_cap_minor(g, gi, ci) for ci in range(_CI_IDS)}
    return out


def own_cap_minors(
    instances: Sequence[Tuple[int, int, int]], minors: Optional[Dict[str, int]]
) -> Set[int]:
    """The GI and CI access caps of the job's own instances, (gpu minor, gi, ci) each."""
    from slurmiso.mig.gres import cap_minor

    out: Set[int] = set()
    for gpu, gi, ci in instances:
        out.add(cap_minor(gpu, gi, None, minors))
        out.add(cap_minor(gpu, gi, ci, minors))
    return out


def mig_rules(cap_major: int, node_caps: Set[int], own: Set[int]) -> List[str]:
    """Deny every cap of the node but the job's own (v1 cannot allow inside a denied range,
    so each other minor is denied by number)."""
    return [f"c {cap_major}:{m}" for m in sorted(node_caps - own)]


def render(job_id: str, why: str, rules: Sequence[str], narrow: Sequence[str] = ()) -> str:
    """``deny`` lines must be applied or the task does not start; ``narrow`` lines close
    what Slurm's own constraint already covers in substance (a MIG node's monitor cap, cap
    files of no instance), applied where the device cgroup can take them."""
    head = f"# slurmiso fence v1: job {job_id}: {why}\n"
    return (head + "".join(f"deny {r}\n" for r in rules)
            + "".join(f"narrow {r}\n" for r in narrow))


def write(
    state_dir: str, job_id: str, why: str, rules: Sequence[str], narrow: Sequence[str] = ()
) -> str:
    """Atomically (re)write the job's fence, root-owned 0600, durable before the prolog ends."""
    folder = os.path.join(state_dir, FENCE_DIR)
    os.makedirs(folder, mode=0o700, exist_ok=True)
    path = fence_path(state_dir, job_id)
    write_atomic(path, render(job_id, why, rules, narrow).encode("ascii"), 0o600)
    return path


def remove(state_dir: str, job_id: str) -> None:
    try:
        os.unlink(fence_path(state_dir, job_id))
    except FileNotFoundError:
        pass


def read_rules(state_dir: str, job_id: str, verb: str = "deny") -> Optional[List[str]]:
    """The ``verb`` rules the plugin would apply (None: no fence file), for status and tests."""
    try:
        with open(fence_path(state_dir, job_id), encoding="ascii") as fh:
            lines = fh.read().splitlines()
    except FileNotFoundError:
        return None
    return [ln[len(verb) + 1:] for ln in lines if ln.startswith(verb + " ")]


def job_fence(
    record: JobRecord, refused: bool, dev_root: str, gpus_per_node: int,
    proc_root: str = "/proc",
) -> Tuple[str, List[str], List[str]]:
    """(why, deny rules, narrow rules) for a job's record: what its tasks must not open
    beyond Slurm's own fence (see :func:`render` for the two kinds)."""
    if refused:
        return "refused by slurmiso: no GPU device", deny_all_rules(dev_root, proc_root), []
    mode = record.mode
    if mode not in ("mig-dynamic", "mig-static"):
        return "Slurm's device constraint is the whole fence", [], []
    from slurmiso.mig.gres import read_mig_minors

    major = caps_major(dev_root, proc_root)
    if major is None:
        if mode == "mig-static":  # gres.conf names the caps; Slurm fences them
            return "Slurm's device constraint (no nvidia-caps files found)", [], []
        return ("no nvidia-caps devices to fence a MIG instance with: no GPU device",
                deny_all_rules(dev_root, proc_root), [])
    minors = read_mig_minors(proc_root) if dev_root == "/dev" else None
    own: List[Tuple[int, int, int]] = []
    for res in record.of_kind(mode):
        if res.gi is not None and res.ci is not None:
            minor = res.minor if res.minor is not None else res.gpu
            if minor is None:
                continue  # no GPU named: nothing of it to leave open
            own.append((minor, res.gi, res.ci))
    rules = mig_rules(major, node_cap_minors(range(gpus_per_node), minors),
                      own_cap_minors(own, minors))
    why = f"MIG capability devices other than the job's own ({len(own)} instance(s))"
    # mig-static: Slurm already closes every instance's caps but the job's (gres.conf)
    return (why, rules, []) if mode == "mig-dynamic" else (why, [], rules)
