"""Which MPS control protocols this node's driver speaks: read from the control binary, never
assumed from a version number (issue 35: capability is read from the driver).

    >>> from_help("usage: ... Modules: server namespace client device", 0).v3
    True

MPS v3 (protocol 3) first ships with driver r615 / CUDA 13.4 and is opt-in: version 2 stays
the default. NVIDIA's documented check (the requirements of NVIDIA Dynamo's "Per-GPU Compute
and Memory Limits with MPS") is that ``nvidia-cuda-mps-control -p 3 -h`` lists the ``server``
and ``namespace`` modules. An older binary lists neither (its v2 help names commands such as
``start_server``, which is not the word ``server``), or rejects ``-p``.
"""

from __future__ import annotations

import re
import subprocess
from typing import Dict, List, NamedTuple, Optional

#: The v3 modules the help must name as words (``start_server`` does not count).
_MODULES = (re.compile(r"(?<![\w-])server(?![\w-])"), re.compile(r"(?<![\w-])namespace(?![\w-])"))
HELP_TIMEOUT_S = 10.0


class MpsProtocol(NamedTuple):
    """Whether protocol 3 is there, and why this was concluded (for doctor and status)."""

    v3: bool
    reason: str


def from_help(text: str, rc: int) -> MpsProtocol:
    """Read ``-p 3 -h``'s output and exit status."""
    if all(m.search(text) for m in _MODULES):
        return MpsProtocol(True, "the MPS control binary's -p 3 -h lists the server and "
                                 "namespace modules: MPS v3 (driver r615+)")
    if rc != 0:
        return MpsProtocol(False, f"the MPS control binary's -p 3 -h failed (exit {rc}): a "
                                  "control daemon before MPS v3 (driver r615)")
    return MpsProtocol(False, "the MPS control binary's -p 3 -h lists no server and namespace "
                              "modules: a control daemon before MPS v3 (driver r615)")


def read_protocol(argv: List[str], env: Optional[Dict[str, str]] = None) -> MpsProtocol:
    """Run the control binary (``argv``: how to start it, ``env``: anything it needs beyond a
    plain PATH) with ``-p 3 -h`` and read it."""
    try:
        cp = subprocess.run([*argv, "-p", "3", "-h"], capture_output=True, text=True,
                            timeout=HELP_TIMEOUT_S, check=False,
                            env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C",
                                 **(env or {})})
    except (OSError, subprocess.TimeoutExpired) as exc:
        return MpsProtocol(False, f"nvidia-cuda-mps-control could not be asked: {exc}")
    return from_help(cp.stdout + cp.stderr, cp.returncode)
