"""Can this node's kernel take slurmiso_fence.so's cgroup v2 fence? (doctor's fact).

Apart from :mod:`slurmiso.isolation.fence` because ``ctypes`` is for doctor only: the prolog,
which imports the fence module on every job, must not pay for it.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
from typing import Optional, Tuple

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
