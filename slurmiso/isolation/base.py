"""The contract between the hooks and the per-mode isolation handlers.

Failure policy lives in the exception a handler raises, because Slurm drains a node whenever a
Prolog/Epilog exits non-zero:

* :class:`~slurmiso.errors.JobProblem` — this job cannot be isolated as asked (profile
  does not fit, bad option). The hook exits 0, the record says ``refused`` with the reason,
  and the task prolog / ``slurmiso run`` refuse to start the job with that message. The node
  stays up.
* :class:`~slurmiso.errors.NodeFault` (and any :class:`~slurmiso.errors.GpuError` other
  than "does not fit", and :class:`~slurmiso.errors.StateError`) — the node is not fit to
  run jobs. The hook drains the node with a one-line reason and exits non-zero.
"""

from __future__ import annotations

import importlib
import logging
import time
from typing import TYPE_CHECKING, Any, List, Optional, Protocol

from slurmiso.errors import NodeFault
from slurmiso.state.record import JobRecord, RecordStatus, Resource, ResourceState
from slurmiso.values import Value, field

if TYPE_CHECKING:
    from slurmiso.config.model import Config, JobClass, Pool
    from slurmiso.gpu.backend import GpuBackend
    from slurmiso.slurm.jobenv import JobEnv
    from slurmiso.state import Journal, NodeState

log = logging.getLogger(__name__)

#: Record status values, in lifecycle order (re-exported for the hooks).
PREPARING, READY, REFUSED, RELEASING = (
    RecordStatus.PREPARING,
    RecordStatus.READY,
    RecordStatus.REFUSED,
    RecordStatus.RELEASING,
)
__all__ = ["PREPARING", "READY", "REFUSED", "RELEASING", "Context", "Isolation",
           "ReconcileContext", "handler_for", "JobRecord", "Resource", "ResourceState"]


class Context(Value, frozen=False):
    """Everything a handler may use for one job on one node. Built by the hooks.

    ``record`` is the job's persisted :class:`JobRecord`; handlers add to
    ``record.resources`` *before* acting on the GPU (intent) and complete the entry after,
    calling :meth:`save` in between, so a prolog killed halfway leaves enough for the epilog.
    """

    config: Config
    env: JobEnv
    pool: Pool
    job_class: Optional[JobClass]
    state: NodeState
    journal: Journal
    backend_factory: Any  # () -> GpuBackend, so handlers that need no GPU never open one
    record: JobRecord = field(default_factory=JobRecord)
    _backend: Optional[GpuBackend] = None

    @property
    def backend(self) -> GpuBackend:
        if self._backend is None:
            self._backend = self.backend_factory()
        return self._backend

    @property
    def job_id(self) -> str:
        return self.env.job_id

    def save(self) -> None:
        """Persist the record now (callers hold the node lock)."""
        self.record.updated = round(time.time(), 3)
        self.state.write_job(self.job_id, self.record)

    def add_resource(self, entry: Resource) -> Resource:
        """Record a resource about to be created (state ``pending``) and persist it."""
        entry.state = ResourceState.PENDING
        self.record.resources.append(entry)
        self.save()
        return entry

    def set_env(self, name: str, value: str) -> None:
        """An environment variable the job must see (task prolog / ``slurmiso run`` export it)."""
        self.record.env[name] = value

    def warn(self, message: str) -> None:
        log.warning("job %s: %s", self.job_id, message)
        self.record.warnings.append(message)

    def claim(self, key: str) -> None:
        """Mark node resource ``key`` (e.g. ``gpu/0``) as this job's in the allocation table.

        A key held by another job that still has a live record is a node fault: handing it
        out twice is exactly what isolation must never do.
        """
        allocs = self.state.allocations()
        holder = allocs.get(key)
        if holder and holder != self.job_id and self.state.read_job(holder) is not None:
            raise NodeFault(
                f"{key} is already allocated to job {holder} on this node",
                hint="Slurm and slurmiso disagree about who holds this GPU; "
                "run 'slurmiso reconcile' after that job ends",
            )
        claims = self.record.claims
        if key not in claims:  # intent first: a kill after this leaves nothing unnamed
            claims.append(key)
            self.save()
        allocs[key] = self.job_id
        self.state.set_allocations(allocs)

    def release_claim(self, key: str) -> None:
        """Drop one allocation of this job's (no-op if another job, or nobody, holds it)."""
        allocs = self.state.allocations()
        if allocs.get(key) == self.job_id:
            del allocs[key]
            self.state.set_allocations(allocs)

    def release_claims(self) -> None:
        """Drop every allocation this job holds: those its record names and any the table
        gives it beyond (a hook killed between the two writes must not leak a claim)."""
        allocs = self.state.allocations()
        mine = [k for k, holder in allocs.items() if holder == self.job_id]
        for key in mine:
            del allocs[key]
        if mine:
            self.state.set_allocations(allocs)


class Isolation(Protocol):
    """One pool mode's per-job setup and teardown.

    Both methods run under the node lock and must be idempotent: ``setup`` again on a record
    that is already ``ready`` changes nothing, ``teardown`` twice is harmless, and
    ``teardown`` after a ``setup`` killed halfway cleans what the record's pending entries say
    may exist. A slow driver call should run inside ``ctx.state.unlocked()``, after the
    intent is saved (see mig_dynamic): the node lock guards state, not the driver, and every
    hook on the node waits for it.
    """

    mode: str

    def setup(self, ctx: Context) -> None:
        """Give the job its share; set ``ctx.record.env``; raise JobProblem/NodeFault."""

    def teardown(self, ctx: Context) -> None:
        """Undo what ``ctx.record`` says setup did (or may have done)."""

    def reconcile(self, ctx: ReconcileContext) -> List[str]:
        """Remove this mode's orphans (no live job record); return one line per fix."""


class ReconcileContext(Value, frozen=False):
    """What ``slurmiso reconcile`` hands each handler: the node, no particular job."""

    config: Config
    pool: Pool
    state: NodeState
    journal: Journal
    backend: GpuBackend
    dry_run: bool = False
    live_jobs: Optional[List[str]] = None  # job ids Slurm says run here (None = unknown)


#: Pool mode -> module defining ``HANDLER`` (imported lazily: a hook loads only its own).
HANDLERS = {
    "exclusive": "slurmiso.isolation.exclusive",
    "timeslice": "slurmiso.isolation.timeslice",
    "mig-static": "slurmiso.isolation.mig_static",
    "mig-dynamic": "slurmiso.isolation.mig_dynamic",
    "mps": "slurmiso.isolation.mps",
}


def handler_for(mode: str) -> Isolation:
    """The handler of a pool mode."""
    try:
        module = importlib.import_module(HANDLERS[mode])
    except KeyError:
        raise NodeFault(f"no isolation handler for pool mode {mode!r}") from None
    handler: Isolation = module.HANDLER
    return handler
