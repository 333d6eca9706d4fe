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
from typing import Any, List, Optional, Sequence

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


#: Linux's largest pid (pid_max can be at most 2**22).
PID_MAX = 1 << 22
#: Signals whose default action dumps core: the relay reports them as an exit status
#: rather than dump its own core.
CORE = ("QUIT", "ILL", "ABRT", "FPE", "SEGV", "BUS", "SYS", "TRAP", "XCPU", "XFSZ")


def _name(signum: int) -> str:
    try:
        return signal.Signals(signum).name[3:]
    except ValueError:
        return ""


def _parent(pid: int, proc: str = "/proc") -> int:
    """``pid``'s parent (0 if unreadable): the field after the state in /proc/PID/stat."""
    try:
        with open(f"{proc}/{pid}/stat", encoding="ascii", errors="replace") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
        return int(fields[1])
    except (OSError, IndexError, ValueError):
        return 0


def container_pid(runtime: Sequence[str], runtime_pid: int, timeout: float = 2.0) -> int:
    """The container's first process as the host sees it, if the runtime says it runs and
    it is the runtime's own child (the state file is the user's: its pid is checked); 0
    otherwise."""
    import json

    try:
        cp = subprocess.run(state_command(runtime), capture_output=True, text=True,
                            timeout=timeout, check=False)
        state = json.loads(cp.stdout) if cp.returncode == 0 else {}
        pid, status = state.get("pid"), state.get("status")
    except (OSError, ValueError, AttributeError, subprocess.SubprocessError):
        return 0
    if type(pid) is not int or not 0 < pid < PID_MAX or status != "running":
        return 0
    return pid if _parent(pid) == runtime_pid else 0


class _Relay:
    """The signal handler: signals that arrive before the runtime started wait for it; the
    container's pid is looked up once, at the first signal that needs it."""

    def __init__(self, runtime: Sequence[str]) -> None:
        self.runtime = list(runtime)
        self.child: Optional[subprocess.Popen[bytes]] = None
        self.pending: List[int] = []
        self.inner = 0
        self.direct = {_number(n) for n in DIRECT}

    def __call__(self, signum: int, frame: Any) -> None:
        if self.child is None:
            self.pending.append(signum)
            return
        try:
            self._send(signum)
        except Exception:  # noqa: BLE001 - a handler must never end the relay
            pass

    def _send(self, signum: int) -> None:
        assert self.child is not None
        if signum not in self.direct:
            self.child.send_signal(signum)
            return
        if not self.inner:
            self.inner = container_pid(self.runtime, self.child.pid)
        if self.inner:
            os.kill(self.inner, signum)

    def start(self) -> subprocess.Popen[bytes]:
        self.child = subprocess.Popen(self.runtime)
        for signum in self.pending:
            self(signum, None)
        self.pending = []
        return self.child


def run(runtime: Sequence[str]) -> int:
    """Run ``runtime`` and relay signals to it until it ends; its exit status."""
    relay = _Relay(runtime)
    for name in RELAYED:  # before the runtime starts: no signal finds the default action
        signal.signal(_number(name), relay)
    child = relay.start()
    try:
        status = child.wait()
    except BaseException:
        child.kill()
        child.wait()
        raise
    if status < 0 and _name(-status) not in CORE:
        try:  # killed by a signal: end the same way, so Slurm reports it as such
            signal.signal(-status, signal.SIG_DFL)
        except (OSError, ValueError):
            pass  # SIGKILL and SIGSTOP keep their default
        os.kill(os.getpid(), -status)
    return 128 - status if status < 0 else status
