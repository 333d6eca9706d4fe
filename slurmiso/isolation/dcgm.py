"""DCGM-exporter job mapping files (``--hpc-job-mapping-dir``): GPU -> job ids.

dcgm-exporter reads one file per GPU, named by GPU index (or, for MIG, by the MIG device's
UUID), holding the ids of the jobs on it, one per line, and labels the GPU's series with them.
"""

from __future__ import annotations

import logging
import os
from typing import Iterable, List

from slurmiso.atomic import write_atomic
from slurmiso.state.record import Resource, ResourceState

log = logging.getLogger(__name__)


def mapping_names(resources: Iterable[Resource]) -> List[str]:
    """File names for a job's resources: the MIG UUID where there is one, else the GPU index."""
    names = []
    for r in resources:
        if r.state is not ResourceState.READY:
            continue
        if r.is_mig and r.uuid:
            names.append(r.uuid)
        elif r.gpu is not None:
            names.append(str(r.gpu))
    return sorted(set(names))


def _rewrite(path: str, job_id: str, add: bool) -> None:
    try:
        with open(path, encoding="ascii") as fh:
            jobs = [ln.strip() for ln in fh if ln.strip()]
    except FileNotFoundError:
        jobs = []
    jobs = [j for j in jobs if j != job_id] + ([job_id] if add else [])
    if not jobs:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        return
    write_atomic(path, "\n".join(jobs) + "\n", 0o644)


def update(directory: str, job_id: str, resources: Iterable[Resource], add: bool) -> None:
    """Add or remove ``job_id`` in the mapping files of ``resources`` (caller holds the lock).

    Best effort: telemetry labels are not worth failing a job over, so errors are logged.
    """
    if not directory:
        return
    try:
        os.makedirs(directory, 0o755, exist_ok=True)
        for name in mapping_names(resources):
            _rewrite(os.path.join(directory, name), job_id, add)
    except OSError as exc:
        log.warning("cannot update DCGM job mapping in %s: %s", directory, exc)
