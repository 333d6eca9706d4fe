"""The monitor's throttle on the wrapper's side: two signals turned into one file.

    monitor (ladder)  scancel --signal=URG [--full]    -> wrapper: create the throttle file
                      scancel --signal=WINCH [--full]  -> wrapper: remove it
    program           slurmiso.checkpoint.throttled() (one lstat) between steps

Why a file and not the signal itself: a program learns the state when it is ready to act on
it (between steps), with no handler to install, in any language; and a file is a state, not
an event, so a process started mid-throttle (a data-loader worker) sees it too. Why two signals and
not a toggle: each is a set or a clear, so one that arrives twice (srun forwarding what the
batch step got) or late never inverts the state; the last one received wins. (Two pending
at the same instant are delivered in signal-number order, whatever order they were sent in:
the kernel keeps one bit per signal. The monitor sends them minutes apart.)

The file is ``<ckpt dir>/.slurmiso/throttle`` (:data:`THROTTLE_ENV` names it for the
program). That directory is the job user's to write, so the name is hostile ground: it is
only ever replaced by rename (a symlink planted there is replaced, never followed) or
unlinked (which removes the name, never a target), and whatever goes wrong is an OSError
logged once to the job's output: the throttle is advice, and it never stops a job.

At start the wrapper removes a file an earlier attempt left: a requeued job starts at full
speed. That matches the monitor, which ends a restraint when the job stops running where it
restrained it (``ladder-end``, with no unthrottle sent), so a file kept across a requeue
could throttle the job for good; a monitor that still wants it slower throttles it again.
"""

from __future__ import annotations

import json
import logging
import os
import stat
import time
from typing import Callable, Dict, Optional

from slurmiso.atomic import write_atomic
from slurmiso.wrapper.checkpoint_protocol import meta_dir

log = logging.getLogger(__name__)

#: Set by the wrapper for the program: the file that exists while the job is throttled.
THROTTLE_ENV = "SLURMISO_THROTTLE_FILE"
FILE_NAME = "throttle"
REASON = "monitor ladder throttle"


def throttle_path(ckpt_dir: str) -> str:
    return os.path.join(meta_dir(os.path.abspath(ckpt_dir)), FILE_NAME)


class ThrottleFile:
    """The throttle file and the wrapper's view of it; no method ever raises OSError."""

    def __init__(self, path: str, clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time) -> None:
        self.path = path
        self.clock = clock
        self.wall = wall
        #: When (``clock``) the current throttle began; None while at full speed.
        self.since: Optional[float] = None
        self._warned = False

    @property
    def throttled(self) -> bool:
        return self.since is not None

    def env(self) -> Dict[str, str]:
        return {THROTTLE_ENV: self.path}

    def start(self) -> None:
        """Remove what an earlier attempt left (see the module docstring for why)."""
        if self._unlink():
            log.info("removed the throttle file %s an earlier run left: starting at full "
                     "speed", self.path)

    def set(self, signame: str) -> bool:
        """Throttle (idempotent); whether this changed the state. The file is made again if
        it went missing, and left alone if it is there."""
        changed = self.since is None
        if changed:
            self.since = self.clock()
        try:
            present = stat.S_ISREG(os.lstat(self.path).st_mode)
        except FileNotFoundError:
            present = False
        except OSError as exc:
            self._failed("cannot look at", exc)
            return changed
        if not present:  # missing, or a symlink, FIFO, ...: replaced, never followed
            self._write(signame)
        return changed

    def clear(self) -> Optional[float]:
        """Back to full speed (idempotent): seconds it was throttled, or None when it was
        not (the file is removed either way)."""
        since, self.since = self.since, None
        self._unlink()
        return None if since is None else round(max(0.0, self.clock() - since), 3)

    def finish(self) -> None:
        """The program is gone: leave no file behind (only if this wrapper made one)."""
        if self.since is not None:
            self.since = None
            self._unlink()

    def _write(self, signame: str) -> None:
        body = json.dumps({"since": round(self.wall(), 3), "reason": REASON,
                           "signal": signame, "pid": os.getpid()})
        try:
            # a fresh temp file (O_EXCL, random name) renamed onto the name: a reader sees
            # no file or a whole one, and rename replaces a planted symlink, not its target
            write_atomic(self.path, body + "\n", 0o644, durable=False)
        except OSError as exc:
            self._failed("cannot create", exc)

    def _unlink(self) -> bool:
        try:
            os.unlink(self.path)  # the name only: unlink never follows a symlink
        except FileNotFoundError:
            return False
        except OSError as exc:
            self._failed("cannot remove", exc)
            return False
        return True

    def _failed(self, what: str, exc: OSError) -> None:
        if not self._warned:
            log.warning("%s the throttle file %s (%s): the program may not see the "
                        "monitor's throttle; the job goes on", what, self.path,
                        exc.strerror or exc)
        else:
            log.debug("%s the throttle file %s: %s", what, self.path, exc)
        self._warned = True
