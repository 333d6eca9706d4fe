"""Slurm ``TaskProlog``: hand the job the environment its GPU share needs.

Runs as the job's user before each task. Slurm reads its stdout: ``export NAME=value`` sets a
variable in the task, ``print TEXT`` writes to the task's output. For a job the prolog refused,
the GPUs are hidden (``CUDA_VISIBLE_DEVICES=``) and the reason printed, so a job that does not
use ``slurmiso run`` still cannot run unisolated.
"""

from __future__ import annotations

import os
import sys
from typing import Any, Dict, List, Mapping, Optional, TextIO

_SAFE = set("ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_")


def lines_for(record: Optional[Dict[str, Any]], job_id: str) -> List[str]:
    """The TaskProlog output lines for a job record (pure, so it is unit-tested)."""
    if record is None:
        return []
    if record.get("status") == "refused":
        reason = " ".join(str(record.get("reason", "")).split())
        return [
            "export CUDA_VISIBLE_DEVICES=",
            f"export SLURMISO_REFUSED={reason}",
            f"print slurmiso: job {job_id} refused: {reason}",
        ]
    out = []
    for name, value in sorted(record.get("env", {}).items()):
        if set(name) <= _SAFE and "\n" not in str(value):
            out.append(f"export {name}={value}")
    if record.get("class"):
        out.append(f"export SLURMISO_CLASS={record['class']}")
    for w in record.get("warnings", []):
        out.append(f"print slurmiso: warning: {' '.join(str(w).split())}")
    return out


def read_record(
    env: Mapping[str, str], config_path: Optional[str] = None
) -> Optional[Dict[str, Any]]:
    from slurmiso.config import load_config
    from slurmiso.state import NodeState

    cfg = load_config(config_path)
    node = env.get("SLURMD_NODENAME", "")
    return NodeState(cfg.paths.state_dir_for(node)).read_job(env.get("SLURM_JOB_ID", ""))


def main(argv: Optional[List[str]] = None, out: Optional[TextIO] = None) -> int:
    """Never fails the task: a TaskProlog error would only hide the real cause from the user."""
    out = out or sys.stdout
    job_id = os.environ.get("SLURM_JOB_ID", "")
    if not job_id:
        print("usage: slurmiso-task-prolog (run by Slurm's TaskProlog)", file=sys.stderr)
        return 0
    from slurmiso.errors import SlurmisoError

    try:
        record = read_record(os.environ)
    except SlurmisoError as exc:
        out.write(f"print slurmiso: warning: cannot read this job's isolation record: {exc}\n")
        return 0
    for line in lines_for(record, job_id):
        out.write(line + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
