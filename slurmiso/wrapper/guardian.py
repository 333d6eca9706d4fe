"""The guardian: a small process between the wrapper and the program, which ends the program's
whole tree when the wrapper dies, however it dies (issue 22).

Why a process of its own: a SIGKILLed wrapper can clean up nothing, and the program's
parent-death signal reaches the program alone, not its workers nor what it moved to a session
of its own (``setsid``, a daemon's double fork); outside a cgroup (interactive use,
containers) those would run on. So the wrapper forks the guardian (no exec: no interpreter
start-up to pay), and the guardian starts the program::

    slurmiso run (supervises, signals the program's group)
     `- guardian (own session; child subreaper; parent-death signal; every signal blocked)
         `- program (own session and group; SIGKILL when the guardian dies) -> its tree

Being a child subreaper, the guardian stays an ancestor of every process of the program's
tree: a process whose parent exits is re-parented to it, never to PID 1. It waits, with
every signal blocked, for two things only:

* a child's exit: it reaps it; the program's wait status goes to the wrapper as a line on a
  pipe (:data:`EXITED`); once it has no child left, nothing of the program is left, and it
  exits, which the wrapper sees as SIGCHLD;
* its parent-death signal (:data:`DEATH_SIGNAL`), or a periodic look at its parent
  (:data:`LIFELINE_S`, in case a signal is ever missed): when the wrapper is gone, it
  SIGKILLs every descendant, again and again until none is left (each kill can orphan a
  process forked meanwhile, which is re-parented to it), and exits.

It lives in a session of its own, so a terminal's signals and a kill of the wrapper's whole
process group (``kill -9 %1``) never reach it; and since it blocks every signal, none of
those Slurm sends to every process of a step (SIGTERM, the ``--signal``, ``scancel -s``)
ends it. The wrapper still signals the program's group itself, and ends leftovers itself on
its own exit paths, as before; the guardian only guarantees the end when the wrapper cannot.

Each race with a wrapper that dies at any moment is closed: the wrapper blocks signals
across the fork; the guardian checks its parent after arming the parent-death signal (a
wrapper already gone means it starts nothing); and the program does the same with the
guardian (:func:`slurmiso.wrapper.procctl.die_with_parent`).

Code here runs in the forked guardian only and never returns into the wrapper's code: every
path ends in ``os._exit``. No logging (the guardian has no one to tell but the wrapper).
"""

from __future__ import annotations

import gc
import os
import signal
import subprocess
import time
from typing import Mapping, NoReturn, Optional, Sequence, Tuple

from slurmiso.wrapper import procctl

#: The parent-death signal: caught (by ``sigtimedwait``), so the guardian can clean up.
#: Any signal would do; the parent is always checked, so a HUP from elsewhere is harmless.
DEATH_SIGNAL = int(signal.SIGHUP)
#: Between looks at the parent when no signal comes (a backstop only).
LIFELINE_S = 5.0
#: How long the guardian keeps killing and reaping after the wrapper died (a process stuck
#: in the kernel, e.g. in a GPU driver call, dies when it returns; its SIGKILL is pending).
KILL_BOUND_S = 30.0
_KILL_POLL_S = 0.005
NAME = "slurmiso-guard"

#: Report lines, guardian -> wrapper: the program started (its pid), could not be started
#: (errno), or exited (its raw wait status).
STARTED, FAILED, EXITED = "started", "failed", "exited"
_WAITED = {int(signal.SIGCHLD), DEATH_SIGNAL}


def guard(
    argv: Sequence[str],
    env: Mapping[str, str],
    ignore: Sequence[int],
    wrapper: int,
    report_fd: int,
    close_fds: Sequence[int] = (),
) -> NoReturn:
    """The guardian's life, in the child of ``os.fork`` (all signals already blocked)."""
    status = 70  # EX_SOFTWARE: something unexpected; the wrapper sees the missing report
    try:
        for fd in close_fds:
            os.close(fd)
        status = _guard(argv, env, ignore, wrapper, report_fd)
    except BaseException:  # noqa: BLE001 - never unwind into the wrapper's code
        pass
    finally:
        os._exit(status)


def _guard(
    argv: Sequence[str], env: Mapping[str, str], ignore: Sequence[int], wrapper: int, report: int
) -> int:
    gc.disable()  # no collection (and no finalizer of the wrapper's objects) runs here
    signal.set_wakeup_fd(-1)  # the wrapper's wake-up pipe is the wrapper's
    for signum in signal.valid_signals():
        # the wrapper's Python handlers are meaningless here; what the program inherits is
        # then what exec would have left: handled -> default, ignored -> ignored
        if callable(signal.getsignal(signum)):
            signal.signal(signum, signal.SIG_DFL)
    for waited in _WAITED:
        signal.signal(waited, signal.SIG_DFL)  # never SIG_IGN: CHLD must report, HUP queue
    os.setsid()
    procctl.set_name(NAME)
    procctl.set_subreaper()
    if not procctl.watch_parent(wrapper, DEATH_SIGNAL):
        return 0  # the wrapper died before it could be watched: start nothing
    me = os.getpid()
    ignored = tuple(ignore)

    def _in_program() -> None:  # between fork and exec: dispositions, prctl, mask only
        for signum in ignored:
            signal.signal(signum, signal.SIG_IGN)
        procctl.die_with_parent(me)
        signal.pthread_sigmask(signal.SIG_SETMASK, ())

    try:
        proc = subprocess.Popen(
            list(argv),
            env=dict(env),
            start_new_session=True,
            preexec_fn=_in_program,  # noqa: PLW1509 - the guardian is single-threaded
        )
    except OSError as exc:
        _report(report, FAILED, exc.errno or 0)
        return 0
    _report(report, STARTED, proc.pid)
    _watch(proc, wrapper, report)
    return 0


def _watch(proc: subprocess.Popen[bytes], wrapper: int, report: int) -> None:
    """Reap and report until nothing of the program is left, or end it all if the wrapper
    dies."""
    while True:
        signal.sigtimedwait(_WAITED, LIFELINE_S)
        if os.getppid() != wrapper:  # re-parented: the wrapper is gone
            kill_tree(proc.pid)
            return
        ended, left = _reap(proc, report)
        if not left:
            return  # nothing of the program is left; the wrapper sees this process exit
        if ended:  # the program ended, leftovers remain: wake the wrapper to end them
            try:
                os.kill(wrapper, signal.SIGCHLD)
            except OSError:
                pass


def _reap(proc: subprocess.Popen[bytes], report: int) -> Tuple[bool, bool]:
    """Reap every exited child, reporting the program's status: (program ended now,
    children left)."""
    ended = False
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return ended, False
        if pid == 0:
            return ended, True
        if pid == proc.pid:
            proc.returncode = os.waitstatus_to_exitcode(status)  # Popen must never wait
            _report(report, EXITED, status)
            ended = True


def kill_tree(program: int, bound_s: float = KILL_BOUND_S) -> None:
    """SIGKILL every descendant of this process until none is left (or ``bound_s`` passed),
    reaping as they go."""
    me = os.getpid()
    deadline = time.monotonic() + bound_s
    while True:
        try:
            os.killpg(program, signal.SIGKILL)  # the program's group at once
        except OSError:
            pass
        for pid in procctl.descendants(me):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        while True:
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return  # no child left, so no descendant either (a subreaper's property)
            if pid == 0:
                break
        if time.monotonic() > deadline:
            return
        time.sleep(_KILL_POLL_S)


def _report(fd: int, what: str, value: int) -> None:
    """One line to the wrapper; a wrapper gone (EPIPE) is no error here."""
    try:
        os.write(fd, f"{what} {value}\n".encode())
    except OSError:
        pass


def parse_report(line: str) -> Optional[Tuple[str, int]]:
    """``(what, value)`` of one report line, None when it is not one."""
    what, _, value = line.strip().partition(" ")
    if what not in (STARTED, FAILED, EXITED) or not value.lstrip("-").isdigit():
        return None
    return what, int(value)
