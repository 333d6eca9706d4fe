"""Slurm ``TaskProlog``: hand the job the environment its GPU share needs.

Runs as the job's user before each task. Slurm reads its stdout: ``export NAME=value`` sets a
variable in the task, ``print TEXT`` writes to the task's output. For a job the prolog refused,
the GPUs are hidden (``CUDA_VISIBLE_DEVICES=``) and the reason printed, so a job that does not
use ``slurmiso run`` still cannot run unisolated.

Every job also gets ``NVIDIA_VISIBLE_DEVICES``, the variable NVIDIA's container hooks read to
choose the devices they put in a container (enroot's, the NVIDIA Container Toolkit's): the UUID
of each device the prolog readied (``MIG-...`` for an instance, ``GPU-...`` for a whole or
shared GPU), or ``void`` (no device, no driver files) for a refused job or one holding none.
An image's own ``NVIDIA_VISIBLE_DEVICES=all`` therefore never widens what a container sees.

Fail closed: on a node of a slurmiso pool, a job with *no* record, or whose record cannot be
read, is treated as refused. No record must never mean no isolation. (An empty variable is
the polite half of a refusal; the device fence is what a job cannot undo.)
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Dict, List, Mapping, Optional, TextIO

if TYPE_CHECKING:
    from slurmiso.state.record import JobRecord

_SAFE = set("ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_")
#: NVIDIA's container hooks' device list (NVIDIA Container Toolkit docs, "Specialized
#: Configurations with Docker", GPU Enumeration: UUIDs or indexes, all, none, or void).
NVIDIA_VISIBLE = "NVIDIA_VISIBLE_DEVICES"
#: Neither GPUs nor driver capabilities in the container.
NO_DEVICE = "void"


def nvidia_visible(record: JobRecord) -> str:
    """The UUID of each device the prolog readied for the job, in order, or ``void``."""
    from slurmiso.state.record import ResourceState

    ids: List[str] = []
    for r in record.resources:
        uuid = r.uuid or r.gpu_uuid or ""
        if r.state is ResourceState.READY and uuid and uuid not in ids \
                and set(uuid) <= _UUID_CHARS:
            ids.append(uuid)
    return ",".join(ids) or NO_DEVICE


_UUID_CHARS = set("abcdefABCDEF0123456789-GPUMI/")  # MIG-GPU-<uuid>/<gi>/<ci> too


def refusal_lines(job_id: str, reason: str) -> List[str]:
    reason = " ".join(reason.split())
    return [
        "export CUDA_VISIBLE_DEVICES=",
        f"export {NVIDIA_VISIBLE}={NO_DEVICE}",
        f"export SLURMISO_REFUSED={reason}",
        f"print slurmiso: job {job_id} refused: {reason}",
    ]


def exported(record: JobRecord) -> Dict[str, str]:
    """The variables a ready record's task prolog exports (slurmiso-oci-gate checks a
    container's environment against them)."""
    out = {name: value for name, value in record.env.items()
           if set(name) <= _SAFE and "\n" not in value}
    out[NVIDIA_VISIBLE] = nvidia_visible(record)
    if record.job_class:
        out["SLURMISO_CLASS"] = record.job_class
    return out


def lines_for(record: Optional[JobRecord], job_id: str) -> List[str]:
    """The TaskProlog output lines for a job record (pure, so it is unit-tested).

    ``None`` is a job the prolog left no record for (it failed before writing one, or the
    record was lost): refused, never "nothing to do".
    """
    if record is None:
        return refusal_lines(job_id, "the prolog left no isolation record for this job")
    if record.status != "ready":
        reason = record.reason or f"isolation is {record.status.value!r}"
        return refusal_lines(job_id, reason)
    env = exported(record)
    last = {"SLURMISO_CLASS": env.pop("SLURMISO_CLASS")} if record.job_class else {}
    out = [f"export {name}={value}" for name, value in [*sorted(env.items()), *last.items()]]
    for w in record.warnings:
        out.append(f"print slurmiso: warning: {' '.join(w.split())}")
    return out


def exports_of(record: Optional[JobRecord], job_id: str) -> Dict[str, str]:
    """Every variable the task prolog exports for this record, ready or refused, as the
    job's tasks (and slurmiso-oci-gate's check of a container) see them."""
    out: Dict[str, str] = {}
    for line in lines_for(record, job_id):
        name, sep, value = line[len("export "):].partition("=")
        if line.startswith("export ") and sep:
            out[name] = value
    return out


class NotManaged(Exception):
    """This node is in no slurmiso pool: the task prolog has nothing to say."""


def read_record(
    env: Mapping[str, str], config_path: Optional[str] = None
) -> Optional[JobRecord]:
    from slurmiso.config import load_config
    from slurmiso.slurm.jobenv import JobEnvironment
    from slurmiso.state import NodeState

    cfg = load_config(config_path)
    job = JobEnvironment.from_env(env)  # the TaskProlog runs in the step's environment
    if cfg.pool_for_node(job.node) is None:
        raise NotManaged(job.node)
    return NodeState(cfg.paths.state_dir_for(job.node)).read_job(job.job_id)


def main(argv: Optional[List[str]] = None, out: Optional[TextIO] = None) -> int:
    """Never fails the task (a TaskProlog error would only hide the real cause from the
    user), but never lets an unreadable or missing record through either."""
    out = out or sys.stdout
    from slurmiso.slurm.jobenv import job_id as slurm_job_id

    job_id = slurm_job_id(os.environ)
    if not job_id:
        print("usage: slurmiso-task-prolog (run by Slurm's TaskProlog)", file=sys.stderr)
        return 0
    try:
        record = read_record(os.environ)
    except NotManaged:
        return 0
    except Exception as exc:  # noqa: BLE001 - whatever broke, the job must not get the GPU
        reason = f"cannot read this job's isolation record: {exc}"
        lines = refusal_lines(job_id[:40], reason)
    else:
        lines = lines_for(record, job_id)
    for line in lines:
        out.write(line + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
