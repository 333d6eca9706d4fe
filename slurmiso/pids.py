"""Is a process alive? One answer for the sim backend, the hooks, the state store and the
wrapper.

``os.kill(pid, 0)`` (no psutil on the hooks' start-up path), and a zombie counts as dead: it
holds no GPU context, no lock and no file, it only waits for its parent to reap it.
"""

from __future__ import annotations

import os
from typing import List, Optional


def pid_alive(pid: int, proc: str = "/proc") -> bool:
    """Whether ``pid`` exists and is not a zombie. ``proc``: a recorded ``/proc`` tree (tests),
    read alone; the live one is asked with ``kill(0)`` first."""
    if pid <= 0:
        return False
    live = proc == "/proc"
    others = False
    if live:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:  # exists, owned by another user
            others = True
        except OSError:
            return False
    fields = _stat_fields(pid, proc)
    if fields:
        return fields[0] != "Z"
    # No stat: it just exited, or /proc hides another user's process (hidepid), or there is
    # no /proc at all (not Linux): then kill(0) is all there is to go by.
    return live and (others or not os.path.isdir(proc))


def _stat_fields(pid: int, proc: str = "/proc") -> List[str]:
    """``/proc/<pid>/stat`` after the command name (state first); [] when unreadable."""
    try:
        with open(f"{proc}/{pid}/stat", encoding="ascii", errors="replace") as fh:
            # the name is in parentheses and may itself hold ") ": split at the last one
            return fh.read().rsplit(")", 1)[-1].split()
    except OSError:
        return []


def start_ticks(pid: int) -> Optional[int]:
    """When ``pid`` started, in clock ticks since boot (``/proc/<pid>/stat`` field 22).

    A pid alone names a process only until it exits: with its start time it names one process
    for good, so a pid written down earlier is never taken for whatever reuses it.
    """
    if pid <= 0:
        return None
    try:
        return int(_stat_fields(pid)[19])
    except (IndexError, ValueError):
        return None
