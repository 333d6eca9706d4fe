"""Checkpoint on request, for Python programs run under ``slurmiso run``.

    from slurmiso import checkpoint

    start = load(checkpoint.resume_path()) if checkpoint.resume_path() else fresh()
    with checkpoint.on_request() as req:
        for step in range(start, total):
            train_one_step()
            if req.pending:
                path = save(f"ckpt-{step}.pt")      # a NEW file, flushed and fsynced
                req.done(path, step=step)          # report it: the wrapper records it
                break                               # then exit; the job is requeued

The signal handler only sets a flag (saving inside a handler is what hangs jobs in NCCL or
the allocator); the program checks ``req.pending`` at a safe point. ``done()`` writes the
marker file atomically, so a crash while saving leaves the previous checkpoint the one
offered as ``SLURMISO_RESUME``. The contract for other languages is in docs/checkpoint.md.

Training step times for the monitor (how much the inference beside the job slows it):

    for batch in loader:
        train_one_step(batch)
        checkpoint.report_step(samples=len(batch))   # or report_step(seconds=measured)

Whether the monitor asks the job to slow down (an inference job beside it misses its SLO):

    for batch in loader:
        train_one_step(batch)
        if checkpoint.throttled():                   # one lstat
            time.sleep(0.5)                          # or smaller batches, fewer workers

Standard library only at import; :func:`done` and :func:`restart_count` import two small
slurmiso modules (``atomic``, ``slurm.jobenv``) when called, so a container that runs the
program needs slurmiso importable (``pip install slurmiso``; it pulls in nothing for this).
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import signal
import time
from types import FrameType
from typing import Any, Dict, Iterator, List, Optional

__all__ = [
    "Request",
    "ckpt_dir",
    "done",
    "install",
    "on_request",
    "report_step",
    "requested",
    "restart_count",
    "resume_path",
    "resume_step",
    "throttled",
]

log = logging.getLogger("slurmiso.checkpoint")

DEFAULT_SIGNAL = "USR2"


def _signal_from_env() -> signal.Signals:
    name = os.environ.get("SLURMISO_CKPT_SIGNAL", "") or DEFAULT_SIGNAL
    name = name.strip().upper()
    try:
        return (
            signal.Signals(int(name))
            if name.isdigit()
            else signal.Signals[name if name.startswith("SIG") else "SIG" + name]
        )
    except (KeyError, ValueError):
        raise ValueError(
            f"SLURMISO_CKPT_SIGNAL={name!r} is not a signal name (use e.g. USR2)"
        ) from None


class Request:
    """The checkpoint request flag; the handler sets it, :meth:`done` clears it."""

    def __init__(self) -> None:
        self._pending = False
        self.count = 0  # how many requests arrived (several signals still mean one save)
        self.signum: Optional[int] = None
        self._previous: Any = None

    @property
    def pending(self) -> bool:
        return self._pending

    def _handle(self, signum: int, frame: Optional[FrameType]) -> None:
        self._pending = True  # a flag, nothing else: safe at any point of the program
        self.count += 1

    def install(self, signum: Optional[int] = None) -> Request:
        """Take over the checkpoint signal (``$SLURMISO_CKPT_SIGNAL``, default USR2)."""
        if self.signum is None:
            self.signum = int(signum if signum is not None else _signal_from_env())
            self._previous = signal.signal(self.signum, self._handle)
        return self

    def uninstall(self) -> None:
        if self.signum is not None:
            prev = self._previous if self._previous is not None else signal.SIG_DFL
            signal.signal(self.signum, prev)
            self.signum = None

    def done(self, path: str, step: Optional[int] = None) -> None:
        """Report a finished checkpoint at ``path`` and clear the request.

        Call it only after ``path`` is completely written and flushed. Outside the wrapper
        (no ``SLURMISO_CKPT_MARKER``) there is nobody to tell; the request is just cleared.
        """
        marker = os.environ.get("SLURMISO_CKPT_MARKER", "")
        if marker:
            _write_marker(marker, path, step)
        else:
            log.debug("not under slurmiso run: checkpoint %s not reported", path)
        self._pending = False


def _write_marker(marker: str, path: str, step: Optional[int]) -> None:
    """Atomic report: temp file in the same directory, fsync, rename onto the marker."""
    directory = os.path.dirname(marker) or "."
    os.makedirs(directory, exist_ok=True)
    body = {"path": os.path.abspath(path), "step": step, "pid": os.getpid()}
    from slurmiso.atomic import write_atomic

    write_atomic(marker, json.dumps(body))


_default = Request()


def install() -> Request:
    """Install the handler now; do it early so a request during start-up is not missed."""
    return _default.install()


def requested() -> bool:
    """Whether a checkpoint was asked for (installs the handler on first call)."""
    return _default.install().pending


def done(path: str, step: Optional[int] = None) -> None:
    """Report the checkpoint at ``path`` as complete (see :meth:`Request.done`)."""
    _default.done(path, step)


@contextlib.contextmanager
def on_request(signum: Optional[int] = None) -> Iterator[Request]:
    """A fresh :class:`Request` with the handler installed for the ``with`` block."""
    req = Request().install(signum)
    try:
        yield req
    finally:
        req.uninstall()


def resume_path() -> Optional[str]:
    """The last checkpoint the wrapper recorded as complete, or None (start fresh)."""
    return os.environ.get("SLURMISO_RESUME") or None


def resume_step() -> Optional[int]:
    """The step the program reported with that checkpoint, if it reported one."""
    text = os.environ.get("SLURMISO_RESUME_STEP", "")
    return int(text) if text.isdigit() else None


def restart_count() -> int:
    """How many times Slurm has requeued this job (0 on the first run).

    Read from Slurm's own ``SLURM_RESTART_COUNT`` by the same reader the wrapper uses
    (:func:`slurmiso.slurm.jobenv.step_restart_count`), so the two never disagree; the
    wrapper's ``SLURMISO_RESTART_COUNT`` is a copy for programs in other languages.
    """
    from slurmiso.slurm.jobenv import step_restart_count

    return step_restart_count(os.environ)


def ckpt_dir(default: str = ".") -> str:
    """Where to write checkpoints (``$SLURMISO_CKPT_DIR``; it survives requeues)."""
    return os.environ.get("SLURMISO_CKPT_DIR") or default


# --------------------------------------------------------------------------- throttle
#: Set by the wrapper (wrapper/throttle.py): the file that exists while the job is throttled.
THROTTLE_ENV = "SLURMISO_THROTTLE_FILE"


def throttled() -> bool:
    """Whether the monitor asks this job to slow down now: its throttle file exists.

    The monitor throttles a training job when an inference job on its GPU misses its SLO;
    the wrapper creates the file on the monitor's throttle signal and removes it on the
    unthrottle signal. Call it between steps (it costs one ``lstat``) and, while it is true,
    give the GPU back a little: smaller batches, fewer data-loader workers, a short pause
    between steps. Nothing forces it: a job that does not slow down is suspended or requeued
    by the monitor's next steps instead. False outside ``slurmiso run``; never raises.
    """
    path = os.environ.get(THROTTLE_ENV, "")
    if not path:
        return False
    try:
        os.lstat(path)
    except (OSError, ValueError):  # ValueError: a path with a NUL byte
        return False
    return True


# --------------------------------------------------------------------------- step times
#: Where the wrapper wants the running totals (wrapper/steps.py); unset: nobody listens.
STEP_REPORT_ENV = "SLURMISO_STEP_REPORT"
#: At most one write of the totals per this many seconds (and one at exit).
STEP_WRITE_S = 1.0
_FIRST_KEPT = 256


class _Steps:
    """Running totals of report_step; written to the wrapper's report, rate-limited."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.path: Optional[str] = None
        self.steps = 0
        self.timed = 0
        self.seconds = 0.0
        self.samples = 0.0
        self.first: List[float] = []
        self.last_call: Optional[float] = None
        self.next_write = 0.0
        self.failures = 0
        self.pid = os.getpid()

    def report(self, seconds: Optional[float], samples: Optional[float]) -> None:
        now = time.monotonic()
        if os.getpid() != self.pid:  # a forked child: only the process the wrapper
            self.reset()              # started reports (two writers would mix totals)
            self.path = ""
        if self.path is None:
            self.path = os.environ.get(STEP_REPORT_ENV, "")
            if self.path:
                import atexit

                atexit.register(self.write)
        if seconds is None and self.last_call is not None:
            seconds = now - self.last_call
        self.last_call = now
        self.steps += 1
        if seconds is not None and math.isfinite(seconds) and seconds >= 0:
            self.timed += 1
            self.seconds += seconds
            if len(self.first) < _FIRST_KEPT:
                self.first.append(round(seconds, 6))
        if samples is not None and math.isfinite(samples) and samples >= 0:
            self.samples += samples
        if self.path and now >= self.next_write and self.failures < 3:
            self.next_write = now + STEP_WRITE_S
            self.write()

    def write(self) -> None:
        if not self.path or os.getpid() != self.pid:
            return
        body: Dict[str, Any] = {
            "pid": self.pid, "steps": self.steps, "timed": self.timed,
            "seconds": round(self.seconds, 6), "samples": self.samples, "first": self.first,
        }
        try:
            from slurmiso.atomic import write_atomic

            write_atomic(self.path, json.dumps(body, separators=(",", ":")), durable=False)
        except OSError as exc:
            self.failures += 1
            if self.failures == 1:
                log.warning("step times not reported to slurmiso run (%s): %s", self.path, exc)


_steps = _Steps()


def report_step(seconds: Optional[float] = None, samples: Optional[float] = None) -> None:
    """Count one finished training step, for the monitor's view of the job's speed.

    ``seconds``: how long the step took (default: the time since the previous call, so the
    first call only starts the clock); ``samples``: how many samples it processed. Cheap (a
    few additions; the totals reach the wrapper at most once a second), and it never raises
    into the program: outside ``slurmiso run`` it only counts.
    """
    try:
        _steps.report(
            None if seconds is None else float(seconds),
            None if samples is None else float(samples),
        )
    except Exception as exc:  # noqa: BLE001 - never break the user's training loop
        log.debug("report_step: %s", exc)
