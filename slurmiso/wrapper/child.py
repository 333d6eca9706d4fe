"""The wrapped program: its own session and process group, signalled and ended as a group.

Why a group: a training program forks data-loader workers and helpers; the checkpoint signal
and the final SIGKILL must reach all of them, and none may outlive the wrapper. Processes that
leave the group (``setsid``, a double fork) are re-parented to the wrapper, a child subreaper
(:mod:`slurmiso.wrapper.procctl`), and are ended with the group. The program dies with the
wrapper (``PR_SET_PDEATHSIG``), even when the wrapper is SIGKILLed.

Why SIGTERM starts ignored: on preemption Slurm sends SIGTERM to *every* process of the job,
the program included. A program with no SIGTERM handler (most of them) would die at once,
before it is asked to checkpoint. The ignore disposition survives ``exec``, so the program
sees only the checkpoint signal from the wrapper; a program that installs its own SIGTERM
handler still gets SIGTERM as well (its choice). That is also why ending the group is
SIGTERM, then SIGKILL after a bound: an ignored SIGTERM must not keep anything alive.

The wrapper reaps every child itself (``waitpid(-1)``): adopted orphans as well as the
program, whose status it hands to its ``Popen`` object so nothing waits twice.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import time
from typing import Callable, List, Mapping, Optional, Sequence

from slurmiso.errors import UsageError
from slurmiso.wrapper import procctl

log = logging.getLogger(__name__)

#: After SIGKILL, how long to wait for everything to be reaped (a process stuck in the
#: kernel, e.g. in a GPU driver call, cannot be hurried; the wrapper does not hang on it).
REAP_BOUND_S = 5.0
#: While waiting for processes that are not the wrapper's children (no SIGCHLD comes).
_POLL_S = 0.01

Sleeper = Callable[[float], None]


def exit_status(returncode: int) -> int:
    """A shell-style status: a program killed by signal N becomes 128+N."""
    return 128 - returncode if returncode < 0 else returncode


class Child:
    """A running program. Build with :meth:`start`."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        self.proc = proc
        self.pid = proc.pid
        self.pgid = proc.pid  # start_new_session: the program leads its own group
        self.started = time.monotonic()
        self.own_pgid = os.getpgrp()

    @classmethod
    def start(
        cls,
        argv: Sequence[str],
        env: Mapping[str, str],
        ignore: Sequence[int] = (signal.SIGTERM,),
    ) -> Child:
        """Start ``argv``; UsageError (exit 2) when it cannot be run at all.

        Call from the main thread: the parent-death signal is tied to the forking thread.
        """
        if not argv:
            raise UsageError(
                "no program to run", hint="usage: slurmiso run [OPTIONS] -- CMD [ARGS...]"
            )
        ignored = tuple(int(s) for s in ignore)
        parent = os.getpid()
        watch_parent = procctl.unavailable() is None  # also loads libc before the fork

        def _in_child() -> None:  # between fork and exec: dispositions and prctl only
            for signum in ignored:
                signal.signal(signum, signal.SIG_IGN)
            if watch_parent:
                procctl.die_with_parent(parent)

        try:
            proc = subprocess.Popen(
                list(argv),
                env=dict(env),
                start_new_session=True,
                preexec_fn=_in_child,  # noqa: PLW1509 - the wrapper is single-threaded
            )
        except FileNotFoundError:
            raise UsageError(
                f"cannot run {argv[0]!r}: no such file or command",
                hint="check the command after '--' and the job's PATH",
            ) from None
        except PermissionError:
            raise UsageError(
                f"cannot run {argv[0]!r}: permission denied", hint="is it executable?"
            ) from None
        log.debug("started %s as pid %d", argv[0], proc.pid)
        return cls(proc)

    # -- status ---------------------------------------------------------------------------

    def reap(self) -> bool:
        """Collect every exited child of the wrapper (the program, adopted orphans);
        returns whether the wrapper still has children running."""
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return False
            if pid == 0:
                return True
            if pid == self.pid and self.proc.returncode is None:
                self.proc.returncode = os.waitstatus_to_exitcode(status)
            elif pid != self.pid:
                log.debug("reaped pid %d left behind by the program", pid)

    def poll(self) -> Optional[int]:
        """The program's shell-style exit status, or None while it runs."""
        self.reap()
        rc = self.proc.returncode
        return None if rc is None else exit_status(rc)

    def wait(self, timeout: float, sleep: Sleeper = time.sleep) -> Optional[int]:
        """Wait up to ``timeout`` seconds for the program to exit.

        ``sleep`` should wake early on SIGCHLD (the supervisor's signal wake-up does), so
        the exit is seen at once rather than at the next poll.
        """
        deadline = time.monotonic() + max(0.0, timeout)
        while True:
            status = self.poll()
            if status is not None:
                return status
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            sleep(min(0.05, left))

    # -- signals --------------------------------------------------------------------------

    def signal_group(self, signum: int) -> bool:
        """Send ``signum`` to the program's process group; False when the group is gone."""
        return self._killpg(self.pgid, signum)

    def anything_left(self) -> bool:
        """Whether any process of the program is left, without reading ``/proc``.

        Complete: whatever the program started is in its group, or was adopted by the
        wrapper (a child of it), or descends from one of those, whose parent is then alive.
        """
        children = self.reap()
        return children or self._killpg(self.pgid, 0)

    def leftovers(self) -> List[int]:
        """Live processes of the program: its group, and what the wrapper adopted."""
        if not self.anything_left():
            return []  # the common case, answered without scanning /proc
        me = os.getpid()
        found: List[int] = []
        try:
            names = os.listdir("/proc")
        except OSError:
            names = []
        for name in names:
            if not name.isdigit() or int(name) == me:
                continue
            st = procctl.read_stat(int(name))
            if st is not None and st[0] != "Z" and (st[2] == self.pgid or st[1] == me):
                found.append(int(name))
        if not names:  # no /proc: the group is all that can be known
            found.append(self.pgid)
        return found

    def terminate(self, term_wait_s: float, sleep: Sleeper = time.sleep) -> None:
        """End everything of the program: SIGTERM (+SIGCONT), then SIGKILL after
        ``term_wait_s`` (0: at once), then reap. Returns as soon as nothing is left."""
        if not self.anything_left():
            return
        self._send_all(signal.SIGTERM)
        self._send_all(signal.SIGCONT)  # a stopped process acts on SIGTERM only once continued
        if self._wait_gone(term_wait_s, sleep):
            return
        log.info("processes of the program still running; killing them")
        self._wait_gone(REAP_BOUND_S, sleep, kill=True)
        left = self.leftovers()
        if left:
            log.warning("processes %s did not die after SIGKILL (stuck in the kernel?)", left)

    def _wait_gone(self, bound: float, sleep: Sleeper, kill: bool = False) -> bool:
        deadline = time.monotonic() + max(0.0, bound)
        while True:
            if kill:  # again each time: a process may fork between the scan and the kill
                self._send_all(signal.SIGKILL)
            if not self.anything_left():
                return True
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            sleep(min(_POLL_S, left))

    def _send_all(self, signum: int) -> None:
        self._killpg(self.pgid, signum)
        for pid in self.leftovers():
            try:
                os.kill(pid, signum)
            except ProcessLookupError:
                continue
            except PermissionError:
                log.warning("cannot signal pid %d (another user's setuid helper?)", pid)
                continue
            st = procctl.read_stat(pid)  # an adopted process that leads a group of its own
            if st is not None and st[2] not in (self.pgid, self.own_pgid) and st[2] == pid:
                self._killpg(pid, signum)

    @staticmethod
    def _killpg(pgid: int, signum: int) -> bool:
        try:
            os.killpg(pgid, signum)
            return True
        except ProcessLookupError:
            return False
        except PermissionError:  # a setuid helper in the group; the others still got it
            log.warning("could not signal every process of group %d", pgid)
            return True
