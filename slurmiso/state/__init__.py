"""Node-local state (:class:`NodeState`) and the event journal (:class:`Journal`).

Imported by the hooks on every job start, so only the stdlib here; the flock-based
:mod:`slurmiso.state.lock` is imported when a lock is first taken.
"""

from slurmiso.state.journal import Journal, read_journals
from slurmiso.state.record import JobRecord, RecordStatus, Resource, ResourceState
from slurmiso.state.store import NodeState, validate_job_id

__all__ = ["JobRecord", "Journal", "NodeState", "RecordStatus", "Resource", "ResourceState",
           "read_journals", "validate_job_id"]
