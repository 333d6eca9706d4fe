"""Linux process control that lets the wrapper act as the init of its job step.

* ``PR_SET_CHILD_SUBREAPER`` on the wrapper: a process the program leaves behind (a
  double-forked helper, a worker whose parent died) is re-parented to the wrapper instead of
  to PID 1, so the wrapper can see it, end it and reap it.
* ``PR_SET_PDEATHSIG`` on the program, set between fork and exec: if the wrapper is
  SIGKILLed (nothing it can catch), the kernel SIGKILLs the program, which would otherwise
  run on with SIGTERM ignored. The death signal fires when the *thread* that forked the
  program ends, so the program must be started from the wrapper's main thread.
* The wrapper's own children, found in ``/proc`` (``/proc/PID/task/*/children`` needs a
  kernel option that is not always set).

Elsewhere than Linux these are unavailable; :func:`unavailable` says so once, in words.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import sys
from typing import Any, List, Optional, Tuple

log = logging.getLogger(__name__)

PR_SET_PDEATHSIG = 1
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


def die_with_parent(parent_pid: int, signum: int = int(signal.SIGKILL)) -> None:
    """In the forked child, before exec: get ``signum`` when the parent (thread) dies.

    Closes the race with a parent that died before the call: then the child is already
    re-parented, and it kills itself instead of running unwatched. Only async-signal-safe
    work here (no logging, no allocation beyond ctypes' call).
    """
    if _libc is None:
        return  # not loaded before the fork (not Linux): nothing to do safely here
    _libc.prctl(PR_SET_PDEATHSIG, signum, 0, 0, 0)
    if os.getppid() != parent_pid:
        os.kill(os.getpid(), signum)


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


def alive(pid: int, proc: str = "/proc") -> bool:
    """Whether ``pid`` exists and is not a zombie (a zombie has already ended)."""
    st = read_stat(pid, proc)
    if st is not None:
        return st[0] != "Z"
    if os.path.isdir(proc):
        return False
    try:  # no /proc (not Linux): existence is all that can be asked
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
