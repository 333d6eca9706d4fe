"""The wrapped program: its own session and process group, signalled and ended as a group.

Why a group: a training program forks data-loader workers and helpers; the checkpoint signal
and the final SIGKILL must reach all of them, and none may outlive the wrapper. The program
is started by a guardian (:mod:`slurmiso.wrapper.guardian`), a small process forked from the
wrapper, which is the program's parent and a child subreaper: processes that leave the group
(``setsid``, a double fork) are re-parented to it and stay in the program's tree, and when
the wrapper dies, even of SIGKILL, the guardian ends that whole tree. While the wrapper
lives, it does everything itself: it signals the group, and ends what is left of the program
on each of its exit paths (the group, and whatever the guardian adopted).

Why SIGTERM starts ignored: on preemption Slurm sends SIGTERM to *every* process of the job,
the program included. A program with no SIGTERM handler (most of them) would die at once,
before it is asked to checkpoint. The ignore disposition survives ``exec``, so the program
sees only the checkpoint signal from the wrapper; a program that installs its own SIGTERM
handler still gets SIGTERM as well (its choice). That is also why ending the group is
SIGTERM, then SIGKILL after a bound: an ignored SIGTERM must not keep anything alive.

The program's exit status comes from the guardian, a line on a pipe (the program is its
child, not the wrapper's), with a SIGCHLD to wake the wrapper; the guardian exits once
nothing of the program is left, so "the guardian is gone" is "the program's tree is gone".
The wrapper reaps its own children (``waitpid(-1)``): the guardian, and what a guardian that
died left to the wrapper, a subreaper too. Without prctl (not Linux) there is no guardian:
the program is the wrapper's child, and a SIGKILLed wrapper leaves it running.
"""

from __future__ import annotations

import errno
import logging
import os
import signal
import subprocess
import time
from typing import Callable, List, Mapping, Optional, Sequence, Tuple

from slurmiso.errors import SlurmisoError, UsageError
from slurmiso.wrapper import guardian, procctl

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

    def __init__(
        self,
        pid: int,
        proc: Optional[subprocess.Popen[bytes]] = None,
        guardian_pid: int = 0,
        reports: int = -1,
    ) -> None:
        """``proc``: the program as the wrapper's own child (no guardian); else
        ``guardian_pid`` and the read end of its ``reports`` pipe."""
        self.pid = pid
        self.pgid = pid  # start_new_session: the program leads its own group
        self.proc = proc
        self.guardian = guardian_pid
        self.returncode: Optional[int] = None  # as Popen's: -N when killed by signal N
        self.started = time.monotonic()
        self.own_pgid = os.getpgrp()
        self._reports = reports
        self._pending = b""
        self._guardian_ended = not guardian_pid

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
        if procctl.unavailable() is None:  # also loads libc before the fork
            return cls._start_guarded(list(argv), env, ignored)
        return cls._start_direct(list(argv), env, ignored)

    @classmethod
    def _start_guarded(
        cls, argv: List[str], env: Mapping[str, str], ignored: Sequence[int]
    ) -> Child:
        wrapper = os.getpid()
        read_end, write_end = os.pipe()  # close-on-exec: the program never holds either
        # Blocked across the fork, so the guardian never runs the wrapper's handlers; a
        # signal meant for the wrapper stays pending here and is handled after the fork.
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, signal.valid_signals())
        try:
            pid = os.fork()
        except BaseException:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
            os.close(read_end)
            os.close(write_end)
            raise
        if pid == 0:  # the guardian: never returns
            guardian.guard(argv, env, ignored, wrapper, write_end, close_fds=(read_end,))
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        os.close(write_end)
        # once the program was exec'd, or failed (a quick program's exit may follow)
        (what, value), rest = _first_report(read_end)
        if what == guardian.STARTED:
            os.set_blocking(read_end, False)
            log.debug("started %s as pid %d (guardian %d)", argv[0], value, pid)
            child = cls(value, guardian_pid=pid, reports=read_end)
            child._take(rest)
            return child
        os.close(read_end)
        _, status = os.waitpid(pid, 0)  # it exits at once after a failure
        if what == guardian.FAILED:
            raise _start_error(argv[0], value)
        raise SlurmisoError(
            f"could not start {argv[0]!r}: its guardian process ended early "
            f"(wait status {status})",
            hint="see the messages above; is the node out of processes or memory?",
        )

    @classmethod
    def _start_direct(
        cls, argv: List[str], env: Mapping[str, str], ignored: Sequence[int]
    ) -> Child:
        """Without prctl: the program as the wrapper's child; it outlives a SIGKILLed wrapper."""

        def _in_child() -> None:  # between fork and exec: dispositions only
            for signum in ignored:
                signal.signal(signum, signal.SIG_IGN)

        try:
            proc = subprocess.Popen(
                argv,
                env=dict(env),
                start_new_session=True,
                preexec_fn=_in_child,  # noqa: PLW1509 - the wrapper is single-threaded
            )
        except OSError as exc:
            raise _start_error(argv[0], exc.errno or 0) from None
        log.debug("started %s as pid %d", argv[0], proc.pid)
        return cls(proc.pid, proc=proc)

    # -- status ---------------------------------------------------------------------------

    def reap(self) -> bool:
        """Collect every exited child of the wrapper (the guardian, or the program without
        one, and what a dead guardian left); returns whether the wrapper still has children
        running."""
        running = True
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                running = False
                break
            if pid == 0:
                break
            if self.proc is not None and pid == self.pid:
                self._exited(os.waitstatus_to_exitcode(status))
            elif pid == self.guardian:
                self._guardian_ended = True
                self._read_reports()  # everything it wrote is in the pipe by now
                self._close_reports()
                if self.returncode is None:
                    log.warning(
                        "the program's guardian (pid %d) ended before the program (wait "
                        "status %d): the program was killed with it", pid, status,
                    )
                    self._exited(-int(signal.SIGKILL))  # its parent-death signal
            else:
                log.debug("reaped pid %d left behind by the program", pid)
        if self.returncode is None and not self._guardian_ended:
            self._read_reports()
        return running

    def _read_reports(self) -> None:
        while self._reports >= 0:
            try:
                data = os.read(self._reports, 512)
            except BlockingIOError:
                return
            except OSError:
                data = b""
            if not data:  # the guardian is gone: nothing more will come
                self._close_reports()
                return
            self._take(data)

    def _close_reports(self) -> None:
        if self._reports >= 0:
            os.close(self._reports)
            self._reports = -1

    def _take(self, data: bytes) -> None:
        """Act on the guardian's complete report lines in ``data`` (keeping a partial one)."""
        *lines, self._pending = (self._pending + data).split(b"\n")
        for line in lines:
            report = guardian.parse_report(line.decode(errors="replace"))
            if report is not None and report[0] == guardian.EXITED:
                self._exited(os.waitstatus_to_exitcode(report[1]))

    def _exited(self, returncode: int) -> None:
        if self.returncode is None:
            self.returncode = returncode
            if self.proc is not None:
                self.proc.returncode = returncode  # Popen must never wait for it again

    def poll(self) -> Optional[int]:
        """The program's shell-style exit status, or None while it runs."""
        self.reap()
        rc = self.returncode
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

        Complete: the guardian exits only once nothing of the program is left (it is an
        ancestor of all of it); without one, whatever the program started is in its group,
        or was adopted by the wrapper (a child of it), or descends from one of those, whose
        parent is then alive.
        """
        children = self.reap()
        return children or self._killpg(self.pgid, 0)

    def leftovers(self) -> List[int]:
        """Live processes of the program: its group, and what the guardian or the wrapper
        adopted (never the guardian itself: it exits by itself once they are gone)."""
        if not self.anything_left():
            return []  # the common case, answered without scanning /proc
        me = os.getpid()
        adopters = (me, self.guardian) if self.guardian else (me,)
        found: List[int] = []
        try:
            names = os.listdir("/proc")
        except OSError:
            names = []
        for name in names:
            if not name.isdigit() or int(name) in (me, self.guardian):
                continue
            st = procctl.read_stat(int(name))
            if st is not None and st[0] != "Z" and (st[2] == self.pgid or st[1] in adopters):
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
        if self._wait_gone(REAP_BOUND_S, sleep, kill=True):
            return
        left = self.leftovers()
        if left:
            log.warning("processes %s did not die after SIGKILL (stuck in the kernel?)", left)
        elif not self._guardian_ended:  # nothing of the program left, yet it did not exit
            log.warning("the program's guardian (pid %d) did not exit; killing it", self.guardian)
            try:
                os.kill(self.guardian, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self._wait_gone(REAP_BOUND_S, sleep)

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


def _first_report(fd: int) -> Tuple[Tuple[str, int], bytes]:
    """The guardian's first report, waited for: ``(STARTED, pid)`` or ``(FAILED, errno)``,
    ``("", 0)`` when it ended without one; and whatever came after it."""
    data = b""
    while b"\n" not in data:
        chunk = os.read(fd, 512)
        if not chunk:
            break
        data += chunk
    first, _, rest = data.partition(b"\n")
    report = guardian.parse_report(first.decode(errors="replace"))
    return (report if report is not None else ("", 0)), rest


def _start_error(program: str, err: int) -> SlurmisoError:
    """The error for a program that could not be executed (errno ``err``)."""
    if err == errno.ENOENT:
        return UsageError(
            f"cannot run {program!r}: no such file or command",
            hint="check the command after '--' and the job's PATH",
        )
    if err in (errno.EACCES, errno.EPERM):
        return UsageError(f"cannot run {program!r}: permission denied", hint="is it executable?")
    return UsageError(f"cannot run {program!r}: {os.strerror(err)}")
