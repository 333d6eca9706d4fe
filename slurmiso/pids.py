"""Is a process alive? One answer for the sim backend, the hooks and the state store.

``os.kill(pid, 0)`` (no psutil on the hooks' start-up path), and a zombie counts as dead: it
holds no GPU context, no lock and no file, it only waits for its parent to reap it.
"""

from __future__ import annotations

import os


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
