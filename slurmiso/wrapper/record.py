"""The prolog's record of this job: which isolation env to apply, or why to refuse.

The prolog (root) writes ``<state_dir>/jobs/<jobid>.json`` (mode 0644) with ``status``
``ready`` and the ``env`` the job must see (``CUDA_VISIBLE_DEVICES`` with MIG UUIDs,
``CUDA_MPS_PIPE_DIRECTORY``, thread percentage, pinned-memory limit), or ``refused`` and a
``reason``. The wrapper re-applies that env (the TaskProlog does too; sites without one still
get it) and refuses to start a refused job, so the failure is one clear line in the job's
output instead of a program that silently runs without its GPU share.

Outside Slurm there is no record and nothing to apply. Inside Slurm, a missing config or
record means slurmiso does not manage this node (or its prolog is not installed): the wrapper
says so and runs the program as is; isolation itself is the prolog's job, not the wrapper's.
"""

from __future__ import annotations

import logging
from typing import Any, Dict, Mapping, Optional

from slurmiso.errors import ConfigError, SlurmisoError, StateError
from slurmiso.state.record import JobRecord, RecordStatus

__all__ = ["JobRecord", "isolation_env", "load_config_quietly", "read_job_record", "refusal"]

log = logging.getLogger(__name__)

_SAFE = set("ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_")


def load_config_quietly(config_path: Optional[str]) -> Any:
    """The config, or None when there is none (a laptop, a cluster without slurmiso)."""
    from slurmiso.config import load_config

    try:
        return load_config(config_path)
    except ConfigError as exc:
        log.debug("no usable slurmiso config (%s)", exc)
        return None


def read_job_record(config: Any, job_id: str, node: str) -> Optional[JobRecord]:
    """The record for ``job_id`` on ``node``; None when there is none.

    StateError (the record exists but cannot be read) propagates: running without the
    isolation the prolog set up would be worse than not running.
    """
    if config is None or not job_id:
        return None
    from slurmiso.state import NodeState

    state = NodeState(config.paths.state_dir_for(node))
    try:
        return state.read_job(job_id)
    except StateError as exc:
        raise SlurmisoError(
            f"cannot read this job's isolation record: {exc}",
            hint="ask the admin to check the slurmiso state dir on this node "
            "(it must be readable by job users)",
        ) from None


def refusal(record: Optional[JobRecord], env: Mapping[str, str]) -> str:
    """Why this job must not start ("" when it may): the record, or the TaskProlog's mark."""
    if record is not None and record.status is RecordStatus.REFUSED:
        reason = " ".join(record.reason.split())
        return reason or "refused by the slurmiso prolog (no reason recorded)"
    marked = env.get("SLURMISO_REFUSED", "")
    return " ".join(marked.split())


def isolation_env(record: Optional[JobRecord]) -> Dict[str, str]:
    """The variables to set in the program's environment (empty without a ready record)."""
    if record is None or record.status is not RecordStatus.READY:
        return {}
    out = {k: v for k, v in record.env.items() if set(k) <= _SAFE and "\n" not in v}
    if record.job_class:
        out["SLURMISO_CLASS"] = record.job_class
    return out
