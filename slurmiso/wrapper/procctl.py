"""Linux process control that lets the wrapper act as the init of its job step.

* ``PR_SET_CHILD_SUBREAPER``: a process the program leaves behind (a double-forked helper, a
  worker whose parent died) is re-parented to the nearest subreaper above it instead of to
  PID 1, so it stays where it can be seen, ended and reaped. The guardian
  (:mod:`slurmiso.wrapper.guardian`) is one, so the program's whole tree stays below it; the
  wrapper is one too, for what a guardian that died leaves.
* ``PR_SET_PDEATHSIG``: a signal when the parent dies, even of SIGKILL. The guardian gets a
  catchable one and then ends the program's tree; the program gets SIGKILL when the guardian
  dies. It fires when the parent *thread* ends, so whoever gets it checks its parent.
* The processes below one, found in ``/proc`` (``/proc/PID/task/*/children`` needs a kernel
  option that is not always set).

Elsewhere than Linux these are unavailable; :func:`unavailable` says so once, in words.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import sys
from typing import Any, Dict, List, Optional, Tuple

log = logging.getLogger(__name__)

PR_SET_PDEATHSIG = 1
PR_SET_NAME = 15
PR_SET_CHILD_SUBREAPER = 36
PR_GET_CHILD_SUBREAPER = 37

_libc: Any = None


def _prctl() -> Any:
    """libc's ``prctl``, loaded once (before any fork: never dlopen in a forked child)."""
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
        _libc.prctl.restype = ctypes.c_int
        _libc.prctl.argtypes = [ctypes.c_int] + [ctypes.c_ulong] * 4
    return _libc.prctl


def unavailable() -> Optional[str]:
    """Why subreaper and parent-death signal cannot be used here, or None when they can."""
    if not sys.platform.startswith("linux"):
        return (
            f"{sys.platform} has no prctl(): processes the program leaves behind are not "
            "adopted, and a SIGKILLed wrapper does not take its program with it"
        )
    try:
        _prctl()
    except (OSError, AttributeError) as exc:  # a libc without prctl (unusual builds)
        return f"prctl() is not available ({exc})"
    return None


def set_subreaper(on: bool = True) -> Optional[str]:
    """Adopt orphaned descendants (or stop adopting); returns why not, or None when done."""
    why = unavailable()
    if why:
        return why
    if _prctl()(PR_SET_CHILD_SUBREAPER, 1 if on else 0, 0, 0, 0) != 0:
        err = ctypes.get_errno()
        return f"prctl(PR_SET_CHILD_SUBREAPER) failed: {os.strerror(err)}"
    return None


def is_subreaper() -> bool:
    """Whether this process adopts orphans now (False where that cannot be asked)."""
    if unavailable():
        return False
    flag = ctypes.c_int(0)
    if _prctl()(PR_GET_CHILD_SUBREAPER, ctypes.addressof(flag), 0, 0, 0) != 0:
        return False
    return bool(flag.value)


def watch_parent(parent_pid: int, signum: int) -> bool:
    """In a forked child: get ``signum`` when the parent (thread) dies; whether the parent
    is still there once that is armed (if not, it died first and nothing will come).

    Async-signal-safe work only (no logging, no allocation beyond ctypes' call): it also runs
    between fork and exec.
    """
    if _libc is None:
        return True  # not loaded before the fork (not Linux): nothing to arm safely here
    _libc.prctl(PR_SET_PDEATHSIG, signum, 0, 0, 0)
    return os.getppid() == parent_pid


def die_with_parent(parent_pid: int, signum: int = int(signal.SIGKILL)) -> None:
    """In the forked child, before exec: get ``signum`` when the parent (thread) dies.

    Closes the race with a parent that died before the call: then the child is already
    re-parented, and it kills itself instead of running unwatched.
    """
    if not watch_parent(parent_pid, signum):
        os.kill(os.getpid(), signum)


def set_name(name: str) -> None:
    """This process's name in ``ps`` and ``/proc/PID/comm`` (15 bytes at most); best effort."""
    if _libc is None:
        return
    buf = ctypes.create_string_buffer(name.encode()[:15])
    _libc.prctl(PR_SET_NAME, ctypes.addressof(buf), 0, 0, 0)


def read_stat(pid: int, proc: str = "/proc") -> Optional[Tuple[str, int, int]]:
    """(state, ppid, pgid) of ``pid`` from ``/proc/PID/stat``; None when it is gone."""
    try:
        with open(f"{proc}/{pid}/stat", "rb") as fh:
            raw = fh.read()
    except OSError:
        return None
    # The command name is in parentheses and may itself contain ") ": split at the last one.
    fields = raw[raw.rfind(b")") + 2 :].split()
    try:
        return fields[0].decode(), int(fields[1]), int(fields[2])
    except (IndexError, ValueError):
        return None


def children(parent: int, proc: str = "/proc") -> List[int]:
    """Live (non-zombie) processes whose parent is ``parent``."""
    out: List[int] = []
    try:
        names = os.listdir(proc)
    except OSError:
        return out
    for name in names:
        if not name.isdigit():
            continue
        st = read_stat(int(name), proc)
        if st is not None and st[1] == parent and st[0] != "Z":
            out.append(int(name))
    return out


def descendants(root: int, proc: str = "/proc") -> List[int]:
    """Live (non-zombie) processes below ``root``, from one scan of ``/proc``."""
    below: Dict[int, List[int]] = {}
    try:
        names = os.listdir(proc)
    except OSError:
        return []
    for name in names:
        if not name.isdigit():
            continue
        st = read_stat(int(name), proc)
        if st is not None and st[0] != "Z":
            below.setdefault(st[1], []).append(int(name))
    out: List[int] = []
    todo = below.pop(root, [])
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(below.pop(pid, ()))
    return out
