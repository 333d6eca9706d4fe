"""Slurm ``Epilog``: undo exactly what the prolog did for the job (runs as root).

Ends the job's leftover GPU processes, destroys its dynamic MIG instance or leaves its MPS
daemon, checks the GPU is released and writes the job's journal record. Exit 1 (drain) only
when the GPU cannot be brought back to a clean state.
"""

from __future__ import annotations

import sys
from typing import List, Optional


def main(argv: Optional[List[str]] = None) -> int:
    from slurmiso.hooks.prolog import main as hook_main

    return hook_main(argv, phase="epilog")


if __name__ == "__main__":
    sys.exit(main())
