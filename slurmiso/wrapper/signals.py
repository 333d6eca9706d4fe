"""Signals the wrapper reacts to, as flags: the handlers never do more than record.

Heavy work in a signal handler is what makes checkpoint-on-preemption hang in the field
(a handler that saves a model re-enters the allocator, NCCL, or the logging lock), so here a
handler only stores the signal number; the supervisor's main loop acts on it. A pipe from
:func:`signal.set_wakeup_fd` wakes that loop at once, so forwarding costs no polling delay.

Like submitit's ``SignalHandler``, the object is built on an injected :class:`JobEnvironment`
(read by :mod:`slurmiso.slurm.jobenv`, the one reader of Slurm's variables, not from
``os.environ`` deep inside), so tests describe a job with a plain dict.
"""

from __future__ import annotations

import logging
import os
import select
import signal
from types import FrameType
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from slurmiso.errors import UsageError
from slurmiso.slurm.jobenv import JobEnvironment

log = logging.getLogger(__name__)

PREEMPTED = "preempted"
CHLD = int(signal.SIGCHLD)
TIME_LIMIT = "time-limit"
#: Never caught, so never forwarded: SIGKILL and SIGSTOP cannot be; SIGCHLD is the wrapper's
#: own wake-up; the fault signals (SEGV, BUS, FPE, ILL, TRAP, SYS) report the wrapper's own
#: crash, and a handler that returns re-runs the faulting instruction; SIGPIPE and SIGXFSZ
#: stay ignored as Python sets them, so the wrapper's own write to a closed pipe or past a
#: file-size limit is an error it handles, never a signal it would pass on. A wrapper killed
#: by one of these still takes its program's whole tree with it (wrapper/guardian.py).
NOT_FORWARDED = frozenset(
    int(getattr(signal, name))
    for name in (
        "SIGKILL", "SIGSTOP", "SIGCHLD", "SIGSEGV", "SIGBUS", "SIGFPE", "SIGILL",
        "SIGTRAP", "SIGSYS", "SIGPIPE", "SIGXFSZ",
    )
    if hasattr(signal, name)
)
#: Job control: passed to the program, which is then stopped (SIGSTOP: the kernel drops these
#: in the program's orphaned group), after which the wrapper stops itself too, as a shell
#: expects of a foreground job on Ctrl-Z (the SIGCONT that resumes it is forwarded as well).
JOB_CONTROL = frozenset(
    int(getattr(signal, n)) for n in ("SIGTSTP", "SIGTTIN", "SIGTTOU") if hasattr(signal, n)
)


def forwardable() -> Tuple[int, ...]:
    """Every signal the wrapper passes to the program's process group (all it can catch,
    real-time signals included, less :data:`NOT_FORWARDED`): a signal that would end an
    init-less wrapper (USR2, ALRM, ...) must never leave the program running unsupervised."""
    return tuple(sorted(int(s) for s in signal.valid_signals() if int(s) not in NOT_FORWARDED))


FORWARDED: Tuple[int, ...] = forwardable()


def parse_signal(name: str) -> signal.Signals:
    """``USR2``, ``SIGUSR2`` or ``12`` -> ``signal.SIGUSR2``; UsageError names the choices."""
    text = str(name).strip().upper()
    try:
        if text.isdigit():
            return signal.Signals(int(text))
        return signal.Signals[text if text.startswith("SIG") else "SIG" + text]
    except (KeyError, ValueError):
        raise UsageError(
            f"unknown signal {name!r}",
            hint="use a name such as USR1, USR2, TERM, INT, HUP or URG",
        ) from None


class SignalHandler:
    """Installs flag-setting handlers; the main loop reads and clears the flags.

    ``stop_signals`` maps a signal to why the job must stop (``preempted``: Slurm's SIGTERM;
    ``time-limit``: the ``--signal`` Slurm sends before the time limit). Only the first stop
    signal starts a checkpoint; later ones are counted (a double signal is one checkpoint).
    ``own``: signals the wrapper acts on itself and never passes on (the monitor's throttle
    and unthrottle), queued in arrival order; a stop signal keeps its stop meaning.
    """

    def __init__(
        self,
        job: JobEnvironment,
        stop_signals: Mapping[int, str],
        forward: Sequence[int] = FORWARDED,
        own: Sequence[int] = (),
    ) -> None:
        self.job = job
        self.stop_signals = {int(k): v for k, v in stop_signals.items()}
        for signum in self.stop_signals:
            if signum in NOT_FORWARDED:
                name = signal.Signals(signum).name
                raise UsageError(
                    f"{name} cannot be the signal that stops the job: the wrapper cannot or "
                    "must not catch it",
                    hint="use the signal sbatch --signal sends, e.g. USR1, USR2 or URG",
                )
        self.own = tuple(
            int(s) for s in own if int(s) not in self.stop_signals and int(s) not in NOT_FORWARDED
        )
        self.forward = tuple(
            int(s) for s in forward
            if int(s) not in self.stop_signals and int(s) not in self.own and int(s) != CHLD
        )
        #: Set once, by the first stop signal.
        self.stop_cause: Optional[str] = None
        self.stop_signum: Optional[int] = None
        self.stop_count = 0
        self._pending_forward: List[int] = []
        self._pending_own: List[int] = []
        self._saved: Dict[int, Any] = {}
        self._wake_r = self._wake_w = -1
        self._old_wakeup = -1

    # -- the handler: flags only ----------------------------------------------------------

    def handle(self, signum: int, frame: Optional[FrameType] = None) -> None:
        """Record the signal; the main loop does the work."""
        if signum in self.stop_signals:
            self.stop_count += 1
            if self.stop_cause is None:
                self.stop_cause = self.stop_signals[signum]
                self.stop_signum = signum
        elif signum in self.own:
            self._pending_own.append(signum)
        elif signum != signal.SIGCHLD:
            self._pending_forward.append(signum)

    def take_forward(self) -> List[int]:
        """Signals to pass on to the program since the last call (oldest first)."""
        out, self._pending_forward = self._pending_forward, []
        return out

    def take_own(self) -> List[int]:
        """The wrapper's own signals since the last call (oldest first: the last one wins)."""
        out, self._pending_own = self._pending_own, []
        return out

    # -- install / restore ----------------------------------------------------------------

    def install(self) -> SignalHandler:
        self._wake_r, self._wake_w = os.pipe()
        for fd in (self._wake_r, self._wake_w):
            os.set_blocking(fd, False)
        self._old_wakeup = signal.set_wakeup_fd(self._wake_w, warn_on_full_buffer=False)
        # SIGCHLD gets a no-op handler only so the wakeup fd reports a program's exit at once.
        for signum in (*self.stop_signals, *self.own, *self.forward, CHLD):
            self._saved[signum] = signal.signal(signum, self.handle)
        return self

    def restore(self) -> None:
        for signum, old in self._saved.items():
            signal.signal(signum, old if old is not None else signal.SIG_DFL)
        self._saved.clear()
        if self._wake_w >= 0:
            signal.set_wakeup_fd(self._old_wakeup)
            for fd in (self._wake_r, self._wake_w):
                os.close(fd)
            self._wake_r = self._wake_w = -1

    def __enter__(self) -> SignalHandler:
        return self.install()

    def __exit__(self, *exc: object) -> None:
        self.restore()

    def wait(self, timeout: float) -> None:
        """Sleep up to ``timeout`` seconds, waking early when any handled signal arrives."""
        if self._wake_r < 0:
            select.select([], [], [], max(0.0, timeout))
            return
        try:
            ready, _, _ = select.select([self._wake_r], [], [], max(0.0, timeout))
        except InterruptedError:  # pragma: no cover - PEP 475 retries; kept for safety
            return
        if ready:
            try:
                while os.read(self._wake_r, 512):
                    pass
            except BlockingIOError:
                pass
