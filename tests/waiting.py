"""The one way a test waits: for a state, never for a time.

A test's premise must not depend on the machine's speed or load, so every wait polls a
condition and fails naming what never happened. ``timeout`` only guards a hang: set it two
orders of magnitude above the expected time, never to the expected time.
"""

from __future__ import annotations

import time
from typing import Callable, Optional, TypeVar

T = TypeVar("T")

#: The default bound on a wait: a hang guard, far above any expected wait.
HANG_S = 60.0


def wait_for(cond: Callable[[], T], what: str, *, timeout: float = HANG_S,
             every: float = 0.01, alive: Optional[Callable[[], bool]] = None) -> T:
    """``cond()``'s first truthy value; fails after ``timeout`` naming ``what``.

    ``alive``, when given, is checked each round: a process that ended cannot reach the
    state, so the test fails at once instead of waiting out the bound.
    """
    deadline = time.monotonic() + timeout
    while True:
        got = cond()
        if got:
            return got
        if alive is not None:
            assert alive(), f"ended before {what}"
        assert time.monotonic() < deadline, f"timed out after {timeout:g}s waiting for {what}"
        time.sleep(every)

