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
from dataclasses import dataclass, field
from typing import Any, Dict, Mapping, Optional

from slurmiso.errors import ConfigError, SlurmisoError, StateError

log = logging.getLogger(__name__)

_SAFE = set("ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_")


@dataclass(frozen=True)
class JobRecord:
    """What the wrapper uses from the prolog's record."""

    status: str
    env: Dict[str, str] = field(default_factory=dict)
    reason: str = ""
    job_class: str = ""

    @property
    def refused(self) -> bool:
        return self.status == "refused"

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> JobRecord:
        env = data.get("env") or {}
        return cls(
            status=str(data.get("status", "")),
            env={
                str(k): str(v)
                for k, v in (env.items() if isinstance(env, dict) else [])
                if set(str(k)) <= _SAFE and "\n" not in str(v)
            },
            reason=" ".join(str(data.get("reason", "")).split()),
            job_class=str(data.get("class") or ""),
        )


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
        data = state.read_job(job_id)
    except StateError as exc:
        raise SlurmisoError(
            f"cannot read this job's isolation record: {exc}",
            hint="ask the admin to check the slurmiso state dir on this node "
            "(it must be readable by job users)",
        ) from None
    return JobRecord.from_dict(data) if data is not None else None


def refusal(record: Optional[JobRecord], env: Mapping[str, str]) -> str:
    """Why this job must not start ("" when it may): the record, or the TaskProlog's mark."""
    if record is not None and record.refused:
        return record.reason or "refused by the slurmiso prolog (no reason recorded)"
    marked = env.get("SLURMISO_REFUSED", "")
    return " ".join(marked.split())


def isolation_env(record: Optional[JobRecord]) -> Dict[str, str]:
    """The variables to set in the program's environment (empty without a ready record)."""
    if record is None or record.status != "ready":
        return {}
    out = dict(record.env)
    if record.job_class:
        out["SLURMISO_CLASS"] = record.job_class
    return out
