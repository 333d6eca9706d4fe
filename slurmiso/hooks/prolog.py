"""Slurm ``Prolog``: give the job its GPU share before it starts (runs as root).

Usage: point ``Prolog=`` (or a file in ``prolog.d/``) at ``slurmiso-prolog``. Exit 0 also
when the job is refused (its record says why; the task prolog tells the job); exit 1 only for
a node fault, after draining the node with the reason.
"""

from __future__ import annotations

import os
import sys
from typing import List, Optional

USAGE = """usage: slurmiso-prolog

Slurm Prolog: reads the job from Slurm's environment (SLURM_JOB_ID, SLURM_JOB_GPUS, ...),
picks its class and gives it its GPU share (whole GPU, MIG instance or MPS share).
Config: $SLURMISO_CONFIG or /etc/slurmiso/slurmiso.yaml.
Exit 0: job prepared or refused (see 'slurmiso status'); exit 1: node fault (node drained).
"""


def main(argv: Optional[List[str]] = None, phase: str = "prolog") -> int:
    args = sys.argv[1:] if argv is None else argv
    if args and args[0] in ("-h", "--help"):
        print(USAGE.replace("prolog", phase).replace("Prolog", phase.capitalize()))
        return 0
    from slurmiso.hooks.runner import run_hook

    return run_hook(phase, os.environ)


if __name__ == "__main__":
    sys.exit(main())
