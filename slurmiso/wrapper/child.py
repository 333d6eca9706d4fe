"""The wrapped program: its own session and process group, signalled as a group.

Why a group: a training program forks data-loader workers and helpers; the checkpoint signal
and the final SIGKILL must reach all of them, and none may outlive the wrapper.

Why SIGTERM starts ignored: on preemption Slurm sends SIGTERM to *every* process of the job,
the program included. A program with no SIGTERM handler (most of them) would die at once,
before it is asked to checkpoint. The ignore disposition survives ``exec``, so the program
sees only the checkpoint signal from the wrapper; a program that installs its own SIGTERM
handler still gets SIGTERM as well (its choice). The wrapper ends it with SIGKILL when the
grace is over.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import time
from typing import Mapping, Optional, Sequence

from slurmiso.errors import UsageError

log = logging.getLogger(__name__)


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

    @classmethod
    def start(
        cls,
        argv: Sequence[str],
        env: Mapping[str, str],
        ignore: Sequence[int] = (signal.SIGTERM,),
    ) -> Child:
        """Start ``argv``; UsageError (exit 2) when it cannot be run at all."""
        if not argv:
            raise UsageError(
                "no program to run", hint="usage: slurmiso run [OPTIONS] -- CMD [ARGS...]"
            )
        ignored = tuple(int(s) for s in ignore)

        def _in_child() -> None:  # runs between fork and exec: signal dispositions only
            for signum in ignored:
                signal.signal(signum, signal.SIG_IGN)

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

    def poll(self) -> Optional[int]:
        """The program's shell-style exit status, or None while it runs."""
        rc = self.proc.poll()
        return None if rc is None else exit_status(rc)

    def wait(self, timeout: float) -> Optional[int]:
        """Wait up to ``timeout`` seconds for the program to exit."""
        try:
            return exit_status(self.proc.wait(timeout=max(0.0, timeout)))
        except subprocess.TimeoutExpired:
            return None

    def signal_group(self, signum: int) -> bool:
        """Send ``signum`` to the program's process group; False when the group is gone."""
        try:
            os.killpg(self.pgid, signum)
            return True
        except ProcessLookupError:
            return False
        except PermissionError:  # a setuid helper in the group; the leader still got it
            log.warning("could not signal every process of group %d", self.pgid)
            return True

    def kill(self) -> int:
        """SIGKILL the whole group (leftover workers too) and reap the program."""
        self.signal_group(signal.SIGKILL)
        rc = self.proc.wait()
        return exit_status(rc)

    def reap_leftovers(self) -> None:
        """After the program exited: kill what it left in its group (orphaned workers)."""
        self.signal_group(signal.SIGKILL)
