"""Can this node's kernel take slurmiso_fence.so's cgroup v2 fence? (doctor's fact).

Apart from :mod:`slurmiso.isolation.fence` because ``ctypes`` is for doctor only: the prolog,
which imports the fence module on every job, must not pay for it.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
from typing import Any, Dict, List, Optional, Tuple

#: bpf(2) by machine (asm-generic numbering for aarch64 and riscv64)
_NR_BPF = {"x86_64": 321, "aarch64": 280, "ppc64le": 361, "s390x": 351, "riscv64": 280}
_BPF_PROG_LOAD = 5
_BPF_PROG_TYPE_CGROUP_DEVICE = 15
#: "r0 = 1; exit": a device program that allows everything, loaded and dropped at once
_ALLOW_ALL = bytes([0xB7, 0, 0, 0, 1, 0, 0, 0, 0x95, 0, 0, 0, 0, 0, 0, 0])


class _ProgLoad(ctypes.Structure):
    """The head of ``union bpf_attr`` for BPF_PROG_LOAD (the kernel zero-fills the rest)."""

    _fields_ = [("prog_type", ctypes.c_uint32), ("insn_cnt", ctypes.c_uint32),
                ("insns", ctypes.c_uint64), ("license", ctypes.c_uint64),
                ("log_level", ctypes.c_uint32), ("log_size", ctypes.c_uint32),
                ("log_buf", ctypes.c_uint64), ("kern_version", ctypes.c_uint32),
                ("prog_flags", ctypes.c_uint32), ("prog_name", ctypes.c_char * 16)]


def cgroup2_mount(mountinfo: str = "/proc/self/mountinfo") -> Optional[str]:
    """Where the unified hierarchy is mounted (/sys/fs/cgroup, or .../unified on a hybrid host)."""
    try:
        with open(mountinfo, encoding="ascii", errors="replace") as fh:
            for line in fh:
                fields, _sep, fstype = line.partition(" - ")
                if fstype.startswith("cgroup2 ") and len(fields.split()) > 4:
                    return fields.split()[4]
    except OSError:
        return None
    return None


def bpf_device_support() -> Tuple[Optional[bool], str]:
    """Can this kernel load the BPF device program slurmiso_fence.so attaches on cgroup v2?
    (True, ...) loaded; (False, why) refused; (None, why) not measured (not root, unknown
    machine). Loads a 2-instruction allow-all program and closes it: nothing is attached."""
    nr = _NR_BPF.get(platform.machine())
    if nr is None:
        return None, f"bpf(2) number unknown for {platform.machine()}"
    if os.geteuid() != 0:
        return None, "not root: loading a BPF device program needs root"
    insns = ctypes.create_string_buffer(_ALLOW_ALL, len(_ALLOW_ALL))
    lic = ctypes.create_string_buffer(b"Apache-2.0")
    attr = _ProgLoad(prog_type=_BPF_PROG_TYPE_CGROUP_DEVICE, insn_cnt=2,
                     insns=ctypes.addressof(insns), license=ctypes.addressof(lic),
                     prog_name=b"slurmiso_probe")
    libc = ctypes.CDLL(None, use_errno=True)
    fd = libc.syscall(ctypes.c_long(nr), ctypes.c_int(_BPF_PROG_LOAD), ctypes.byref(attr),
                      ctypes.c_uint(ctypes.sizeof(attr)))
    if fd >= 0:
        os.close(fd)
        return True, "the kernel loads BPF_PROG_TYPE_CGROUP_DEVICE programs"
    err = ctypes.get_errno()
    if err == errno.ENOSYS:
        return False, "no bpf(2) system call (CONFIG_BPF_SYSCALL is off)"
    if err == errno.EINVAL:
        return False, "the kernel has no cgroup device programs (CONFIG_CGROUP_BPF is off)"
    return False, f"the kernel refused a BPF device program: {os.strerror(err)}"


# --- what is attached where (doctor on a cgroup v2 node) ---------------------------------

_BPF_PROG_GET_FD_BY_ID = 13
_BPF_OBJ_GET_INFO_BY_FD = 15
_BPF_PROG_QUERY = 16
_BPF_CGROUP_DEVICE = 6  # enum bpf_attach_type
_BPF_F_QUERY_EFFECTIVE = 1
_MAX_PROGS = 64
#: What each side names its device programs (BPF_PROG_LOAD's prog_name): Slurm's cgroup/v2
#: plugin, src/plugins/cgroup/v2/ebpf.c (load_ebpf_prog, 24.11 and 26.05), and
#: slurmiso_fence.so (spank/slurmiso_bpf.h).
SLURM_PROG_NAME = "Slurm_Cgroup_v2"
FENCE_PROG_NAME = "slurmiso_fence"


class _Query(ctypes.Structure):
    _fields_ = [("target_fd", ctypes.c_uint32), ("attach_type", ctypes.c_uint32),
                ("query_flags", ctypes.c_uint32), ("attach_flags", ctypes.c_uint32),
                ("prog_ids", ctypes.c_uint64), ("prog_cnt", ctypes.c_uint32),
                ("_pad", ctypes.c_uint32 * 8)]


class _GetId(ctypes.Structure):
    _fields_ = [("id", ctypes.c_uint32), ("next_id", ctypes.c_uint32),
                ("open_flags", ctypes.c_uint32), ("_pad", ctypes.c_uint32 * 8)]


class _Info(ctypes.Structure):
    _fields_ = [("bpf_fd", ctypes.c_uint32), ("info_len", ctypes.c_uint32),
                ("info", ctypes.c_uint64), ("_pad", ctypes.c_uint32 * 8)]


def _bpf(cmd: int, attr: ctypes.Structure) -> int:
    nr = _NR_BPF.get(platform.machine())
    if nr is None:
        raise OSError(errno.ENOSYS, "bpf(2) number unknown here")
    libc = ctypes.CDLL(None, use_errno=True)
    rc = libc.syscall(ctypes.c_long(nr), ctypes.c_int(cmd), ctypes.byref(attr),
                      ctypes.c_uint(ctypes.sizeof(attr)))
    if rc < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return int(rc)


def prog_name(prog_id: int) -> str:
    """The name a device program was loaded with ("" if it is gone)."""
    try:
        fd = _bpf(_BPF_PROG_GET_FD_BY_ID, _GetId(id=prog_id))
    except OSError:
        return ""
    try:
        info = ctypes.create_string_buffer(256)
        _bpf(_BPF_OBJ_GET_INFO_BY_FD, _Info(bpf_fd=fd, info_len=80,
                                            info=ctypes.addressof(info)))
        return info.raw[64:80].split(b"\0")[0].decode("ascii", "replace")
    except OSError:
        return ""
    finally:
        os.close(fd)


def device_programs(cgroup_dir: str, effective: bool) -> Tuple[int, List[str]]:
    """(attach flags, [program name, ...]) of the BPF device programs of a cgroup: attached
    there (``effective`` False; flags are its own) or in effect for its processes (True, its
    ancestors' MULTI ones included; flags 0). OSError when the cgroup cannot be queried."""
    cg = os.open(cgroup_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        ids = (ctypes.c_uint32 * _MAX_PROGS)()
        q = _Query(target_fd=cg, attach_type=_BPF_CGROUP_DEVICE,
                   query_flags=_BPF_F_QUERY_EFFECTIVE if effective else 0,
                   prog_ids=ctypes.addressof(ids), prog_cnt=_MAX_PROGS)
        _bpf(_BPF_PROG_QUERY, q)
        return int(q.attach_flags), [prog_name(ids[i]) for i in range(q.prog_cnt)]
    finally:
        os.close(cg)


def _scopes(mount: str, node: str) -> List[str]:
    """Slurm's cgroup/v2 stepd scopes of ``node`` under ``mount``: ``<slice>/<node>_slurmstepd
    .scope`` (several slurmd per host) or ``<slice>/slurmstepd.scope`` (cgroup_v2.c,
    _set_int_cg_ns; the slice is CgroupSlice, default system.slice). One reader with the
    agent's host figures (:func:`slurmiso.host.job_cgroups.v2_scopes`)."""
    from slurmiso.host.job_cgroups import v2_scopes

    return v2_scopes(mount, node)


def v2_node_facts(node: str, state_dir: str, mount: str = "/sys/fs/cgroup") -> Dict[str, Any]:
    """What doctor needs to tell that the v2 fences are in place on this node, now: whether
    /sys/fs/cgroup is the unified hierarchy alone, and, for each job running here, the device
    programs on its job cgroup and in effect for each of its tasks, beside the job's fence file
    (how many ``deny``/``narrow`` rules slurmiso_fence.so had to attach)."""
    import glob

    from slurmiso.isolation import fence
    from slurmiso.sluid import is_sluid, job_of_dir

    facts: Dict[str, Any] = {"mount": mount, "unified": _fstype(mount) == "cgroup2",
                   "hybrid_proc": _hybrid_proc(), "scopes": [], "jobs": [], "error": ""}
    if not facts["unified"]:
        return facts
    by_sluid: Dict[str, str] = {}
    try:
        from slurmiso.state import NodeState

        for jid, rec in NodeState(state_dir).jobs().items():
            if is_sluid(str(rec.fence.get("sluid", ""))):
                by_sluid[str(rec.fence["sluid"])] = jid
    except Exception as exc:  # a corrupt state dir is another check's finding
        facts["error"] = f"cannot read the job records of {state_dir}: {exc}"
    for scope in _scopes(mount, node):
        facts["scopes"].append(scope)
        for name in sorted(os.listdir(scope)):
            path = os.path.join(scope, name)
            key = job_of_dir(name)
            if key is None or not os.path.isdir(path):
                continue
            job = by_sluid.get(key, "") if is_sluid(key) else key
            entry: Dict[str, Any] = {"dir": name, "job": job, "own": [], "flags": 0, "deny": 0,
                           "narrow": 0, "tasks": []}
            try:
                entry["flags"], entry["own"] = device_programs(path, False)
            except OSError as exc:
                entry["error"] = f"cannot query {path}: {exc.strerror}"
            if job:
                entry["deny"] = len(fence.read_rules(state_dir, job) or [])
                entry["narrow"] = len(fence.read_rules(state_dir, job, "narrow") or [])
            for task in sorted(glob.glob(os.path.join(glob.escape(path), "step_*", "user",
                                                      "task_*"))):
                if "step_extern" in task:  # no task of the job's: the fence never sees it
                    continue
                try:
                    _flags, eff = device_programs(task, True)
                    with open(os.path.join(task, "cgroup.procs"), encoding="ascii") as fh:
                        procs = len(fh.read().split())
                except OSError:
                    continue  # the task ended meanwhile
                entry["tasks"].append({"path": os.path.relpath(task, path), "effective": eff,
                                       "procs": procs})
            facts["jobs"].append(entry)
    return facts


def _fstype(path: str, mountinfo: str = "/proc/self/mountinfo") -> str:
    found = ""
    try:
        with open(mountinfo, encoding="ascii", errors="replace") as fh:
            for line in fh:
                head, sep, tail = line.partition(" - ")
                fields = head.split()
                if sep and len(fields) > 4 and fields[4] == path:
                    found = tail.split()[0]
    except OSError:
        return ""
    return found


def _hybrid_proc(path: str = "/proc/self/cgroup") -> bool:
    """Whether the kernel lists cgroup v1 hierarchies for this process (a hybrid host)."""
    try:
        with open(path, encoding="ascii", errors="replace") as fh:
            return any(ln.strip() and not ln.startswith("0::") for ln in fh)
    except OSError:
        return False
