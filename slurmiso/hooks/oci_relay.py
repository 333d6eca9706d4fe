"""Stay between Slurm and a throttled class's container runtime, passing every signal on.

Slurm signals a step's task, and in a container step the task is the runtime. Measured on
the sandbox (Slurm 26.05, crun 1.28): a program in a crun container received SIGURG, SIGUSR2
and SIGTERM, which crun forwards, but never SIGWINCH, which crun keeps for itself. SIGWINCH
is the ladder's unthrottle, so containerised training would stay throttled for good.

:func:`run` starts the runtime as a child, sends SIGWINCH straight to the container's own
process (its host pid from the runtime's ``state`` command) and every other relayed signal to
the runtime, and ends as the runtime ended. slurmiso-oci-gate uses it only for classes the
ladder throttles; other containers get the runtime exec'd in its place.
"""

from __future__ import annotations

import os
import signal
import subprocess
from typing import Any, List, Sequence

#: What Slurm, the ladder and ``scancel --signal`` may send a step (SIGKILL and SIGSTOP
#: cannot be caught: Slurm sends those to the step's whole cgroup).
RELAYED = ("HUP", "INT", "QUIT", "USR1", "USR2", "ALRM", "TERM", "URG", "WINCH", "CONT")
#: The runtime does not forward these: they go to the container's process itself.
DIRECT = ("WINCH",)


def _number(name: str) -> int:
    return int(getattr(signal, f"SIG{name}"))


def state_command(runtime: Sequence[str]) -> List[str]:
    """``RT [GLOBAL...] state NAME`` for a ``RT [GLOBAL...] run [OPTS...] NAME`` command."""
    return [*runtime[:list(runtime).index("run", 1)], "state", runtime[-1]]


def container_pid(runtime: Sequence[str], timeout: float = 5.0) -> int:
    """The container's first process as the host sees it (0 if the runtime cannot say)."""
    import json

    try:
        cp = subprocess.run(state_command(runtime), capture_output=True, text=True,
                            timeout=timeout, check=False)
        pid = json.loads(cp.stdout).get("pid", 0) if cp.returncode == 0 else 0
    except (OSError, ValueError, AttributeError, subprocess.SubprocessError):
        return 0
    return pid if isinstance(pid, int) and pid > 0 else 0


def run(runtime: Sequence[str]) -> int:
    """Run ``runtime`` and relay signals to it until it ends; its exit status."""
    child = subprocess.Popen(list(runtime))
    direct = {_number(n) for n in DIRECT}

    def on_signal(signum: int, frame: Any) -> None:
        target = container_pid(runtime) if signum in direct else child.pid
        if target > 0 and child.poll() is None:
            try:
                os.kill(target, signum)
            except OSError:
                pass  # it just ended: the wait below reports how

    for name in RELAYED:
        signal.signal(_number(name), on_signal)
    status = child.wait()
    if status < 0:  # killed by a signal: end the same way, so Slurm reports it as such
        try:
            signal.signal(-status, signal.SIG_DFL)
        except (OSError, ValueError):
            pass  # SIGKILL and SIGSTOP keep their default
        os.kill(os.getpid(), -status)
        return 128 - status
    return status
