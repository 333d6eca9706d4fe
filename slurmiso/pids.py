"""Is a process alive? One answer for the sim backend, the hooks and the state store.

``os.kill(pid, 0)`` (no psutil on the hooks' start-up path), and a zombie counts as dead: it
holds no GPU context, no lock and no file, it only waits for its parent to reap it.
"""

from __future__ import annotations

import os
from typing import Optional


def pid_alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by another user
        pass
    except OSError:
        return False
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as fh:
            return fh.read().rsplit(")", 1)[-1].split()[0] != "Z"
    except (OSError, IndexError):
        return True  # no /proc (or it just exited): trust kill(0)


def start_ticks(pid: int) -> Optional[int]:
    """When ``pid`` started, in clock ticks since boot (``/proc/<pid>/stat`` field 22).

    A pid alone names a process only until it exits: with its start time it names one process
    for good, so a pid written down earlier is never taken for whatever reuses it.
    """
    if pid <= 0:
        return None
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as fh:
            fields = fh.read().rsplit(")", 1)[-1].split()
        return int(fields[19])
    except (OSError, IndexError, ValueError):
        return None
