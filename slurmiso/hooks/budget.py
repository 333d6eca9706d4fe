"""How long a hook may wait for a lock: Slurm's ``PrologEpilogTimeout``, less a margin.

slurmd kills a Prolog/Epilog that runs past ``PrologEpilogTimeout`` and drains the node, so a
lock wait longer than that only turns a clear reason into a kill; a shorter fixed timeout
(the old 30 s) drained nodes that were merely busy. slurmd exports ``SLURM_CONF`` to the
hooks; the setting is read from that file (includes are not followed: the setting lives in
slurm.conf itself on every site we know). Unset means Slurm waits forever; then the hooks
wait :data:`DEFAULT_WAIT_S`, so a hung holder still ends in a drain with its name.
"""

from __future__ import annotations

import re
from typing import Mapping, Optional

DEFAULT_WAIT_S = 300.0
_SETTING_RE = re.compile(rb"^\s*PrologEpilogTimeout\s*=\s*([0-9]{1,7})\s*(?:#.*)?$",
                         re.IGNORECASE | re.MULTILINE)
_MAX_CONF_BYTES = 4 * 1024 * 1024


def prolog_epilog_timeout(env: Mapping[str, str]) -> Optional[int]:
    """``PrologEpilogTimeout`` in seconds from the hook's slurm.conf; None if unset/unknown."""
    path = env.get("SLURM_CONF") or "/etc/slurm/slurm.conf"
    try:
        with open(path, "rb") as fh:
            text = fh.read(_MAX_CONF_BYTES)
    except OSError:
        return None
    found = _SETTING_RE.findall(text)
    if not found:
        return None
    seconds = int(found[-1])  # the last setting wins, as in slurm.conf
    return seconds if seconds > 0 else None


def lock_wait_s(env: Mapping[str, str]) -> float:
    """Seconds a hook may spend waiting for locks in all: the timeout less 10% (at least
    2 s, so the drain reason is written before slurmd's kill)."""
    timeout = prolog_epilog_timeout(env)
    if timeout is None:
        return DEFAULT_WAIT_S
    return max(1.0, timeout - max(2.0, 0.1 * timeout))
