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
import threading
import time
from typing import Any, List, Optional, Sequence

#: What Slurm, the ladder and ``scancel --signal`` may send a step (SIGKILL and SIGSTOP
#: cannot be caught: Slurm sends those to the step's whole cgroup).
RELAYED = ("HUP", "INT", "QUIT", "USR1", "USR2", "ALRM", "TERM", "URG", "WINCH", "CONT")
#: The runtime does not forward these: they go to the container's process itself.
DIRECT = ("WINCH",)


def _number(name: str) -> int:
    return int(getattr(signal, f"SIG{name}"))


def runtime_command(runtime: Sequence[str], verb: str, *opts: str) -> List[str]:
    """``RT [GLOBAL...] VERB [OPTS...] NAME`` for a ``RT [GLOBAL...] run [...] NAME`` command
    (ValueError if it has no ``run``): the runtime's other verbs take the same globals."""
    return [*runtime[:list(runtime[:-1]).index("run", 1)], verb, *opts, runtime[-1]]


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
        cp = subprocess.run(runtime_command(runtime, "state"), capture_output=True, text=True,
                            timeout=timeout, check=False)
        state = json.loads(cp.stdout) if cp.returncode == 0 else {}
        pid, status = state.get("pid"), state.get("status")
    except (OSError, ValueError, AttributeError, subprocess.SubprocessError):
        return 0
    if type(pid) is not int or not 0 < pid < PID_MAX or status != "running":
        return 0
    return pid if _parent(pid) == runtime_pid else 0


class _Relay:
    """The signal handler: signals that arrive before the runtime started wait for it; a
    signal for the container's process that arrives before the runtime says it runs waits
    in a thread that looks again until it runs or the runtime ends (never dropped)."""

    def __init__(self, runtime: Sequence[str], retry: float = 0.1) -> None:
        self.runtime = list(runtime)
        self.child: Optional[subprocess.Popen[bytes]] = None
        self.pending: List[int] = []
        self.deferred: List[int] = []
        self.waiter: Optional[threading.Thread] = None
        self.retry = retry
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
            return
        self.deferred.append(signum)
        if self.waiter is None or not self.waiter.is_alive():
            self.waiter = threading.Thread(target=self._deliver_later, daemon=True)
            self.waiter.start()

    def _deliver_later(self) -> None:
        """Look for the container's process until it runs (then send what waited) or the
        runtime ends (nothing left to signal)."""
        assert self.child is not None
        while self.child.poll() is None:
            self.inner = self.inner or container_pid(self.runtime, self.child.pid)
            if self.inner:
                while self.deferred:
                    try:
                        os.kill(self.inner, self.deferred.pop(0))
                    except OSError:
                        return  # it ended meanwhile
                return
            time.sleep(self.retry)

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
