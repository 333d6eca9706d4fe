"""The job record: the typed, versioned contract between prolog, epilog, reconcile, status,
the monitor's agent and the wrapper (``state_dir/jobs/<jobid>.json``).

Two enums keep two different things apart: :class:`RecordStatus` is where the *job* is in
its lifecycle (preparing, ready, refused, releasing); :class:`ResourceState` is where one
*resource* the job holds is (pending: intent recorded, the driver call may or may not have
happened; ready; released; kept). There is no "released" job: an epilog that finished
deletes the record.

:meth:`JobRecord.from_dict` is the only way a record is read: it validates every field and
migrates older on-disk versions (schema 1: the untyped dict of slurmiso <= 0.1, read and
written as is). Anything it cannot trust raises :class:`RecordError`, which the store turns
into the state-corruption error naming the file (the hooks drain with it).

Plain classes with ``__slots__``, not dataclasses: every hook imports this module, and
``dataclasses`` costs about 7 ms to import (it pulls in ``inspect``) plus about 0.4 ms per
class it builds by ``exec`` (measured on the dev machine). Executing this module costs about
0.3 ms. Stdlib only (``enum`` is already loaded by ``re``).
"""

from __future__ import annotations

from enum import Enum
from typing import Any, Dict, Iterable, Iterator, List, Mapping, Optional

#: The version this code writes. 1: slurmiso 0.1's dict (same keys; status "released" was
#: checked but never written). 2: typed, with separate record and resource states.
SCHEMA = 2


class RecordError(ValueError):
    """A record that cannot be trusted; the message says which field and why."""


class RecordStatus(str, Enum):
    """Where the job is: prolog working, job may run, job refused, epilog working."""

    PREPARING = "preparing"
    READY = "ready"
    REFUSED = "refused"
    RELEASING = "releasing"


class ResourceState(str, Enum):
    """Where one resource is. ``pending``: intent saved before the driver call, so an epilog
    after a killed prolog looks for what may exist; ``kept``: survives a teardown."""

    PENDING = "pending"
    READY = "ready"
    RELEASED = "released"
    KEPT = "kept"


def _int(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise RecordError(f"{where} is {type(value).__name__}, expected a whole number")
    return value


def _opt_int(data: Mapping[str, Any], key: str, where: str) -> Optional[int]:
    value = data.get(key)
    return None if value is None else _int(value, f"{where}{key!r}")


def _str(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise RecordError(f"{where} is {type(value).__name__}, expected str")
    return value


def _opt_str(data: Mapping[str, Any], key: str, where: str) -> Optional[str]:
    value = data.get(key)
    return None if value is None else _str(value, f"{where}{key!r}")


def _field(data: Mapping[str, Any], key: str, kind: type, default: Any) -> Any:
    """``data[key]`` if it has JSON type ``kind`` (bool is not a number), else RecordError."""
    if key not in data or data[key] is None:
        return default
    value = data[key]
    if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
        raise RecordError(
            f"field {key!r} is {type(value).__name__}, expected {kind.__name__}")
    return value


#: Resource fields with a type (all optional: which ones a resource has depends on its kind).
_RES_INTS = ("gpu", "gi", "ci", "start", "uid", "daemon_pid", "thread_percentage",
             "memory_limit_mb", "gres_index", "minor")
_RES_STRS = ("profile", "uuid", "gpu_uuid", "pipe_dir", "log_dir")
#: Per kind: fields that must be present (when the resource's state says they exist).
_RES_NEEDS = {"mig-dynamic": ("gpu", "start"), "mps": ("gpu",)}


class Resource:
    """One thing a job holds on the node: a GPU, a MIG device, an MPS share.

    ``kind`` is the pool mode's resource kind (``gpu``, ``shared-gpu``, ``mig-static``,
    ``mig-dynamic``, ``mps``); the optional fields are the ones that kind uses. ``extra``
    keeps fields this version does not know, so a read-modify-write loses nothing.
    """

    __slots__ = ("kind", "state", *_RES_INTS, *_RES_STRS, "extra")

    kind: str
    state: ResourceState
    gpu: Optional[int]
    gi: Optional[int]
    ci: Optional[int]
    start: Optional[int]
    uid: Optional[int]
    daemon_pid: Optional[int]
    thread_percentage: Optional[int]
    memory_limit_mb: Optional[int]
    gres_index: Optional[int]
    minor: Optional[int]
    profile: Optional[str]
    uuid: Optional[str]
    gpu_uuid: Optional[str]
    pipe_dir: Optional[str]
    log_dir: Optional[str]
    extra: Dict[str, Any]

    def __init__(
        self, kind: str, state: ResourceState = ResourceState.PENDING, *,
        gpu: Optional[int] = None, gi: Optional[int] = None, ci: Optional[int] = None,
        start: Optional[int] = None, uid: Optional[int] = None,
        daemon_pid: Optional[int] = None, thread_percentage: Optional[int] = None,
        memory_limit_mb: Optional[int] = None, gres_index: Optional[int] = None,
        minor: Optional[int] = None, profile: Optional[str] = None,
        uuid: Optional[str] = None, gpu_uuid: Optional[str] = None,
        pipe_dir: Optional[str] = None, log_dir: Optional[str] = None,
        extra: Optional[Dict[str, Any]] = None,
    ) -> None:
        self.kind, self.state = kind, state
        self.gpu, self.gi, self.ci, self.start = gpu, gi, ci, start
        self.uid, self.daemon_pid = uid, daemon_pid
        self.thread_percentage, self.memory_limit_mb = thread_percentage, memory_limit_mb
        self.gres_index, self.minor = gres_index, minor
        self.profile, self.uuid, self.gpu_uuid = profile, uuid, gpu_uuid
        self.pipe_dir, self.log_dir = pipe_dir, log_dir
        self.extra = dict(extra or {})

    @property
    def is_mig(self) -> bool:
        return self.kind.startswith("mig")

    @classmethod
    def from_dict(cls, data: Any, where: str = "resource") -> Resource:
        if not isinstance(data, dict) or not isinstance(data.get("kind"), str):
            raise RecordError(f"{where} is not an object with a 'kind'")
        kind = data["kind"]
        try:
            state = ResourceState(data.get("state") or "pending")
        except ValueError:
            raise RecordError(f"{where}.state {str(data.get('state'))[:40]!r} is not one of "
                              f"{', '.join(s.value for s in ResourceState)}") from None
        fields: Dict[str, Any] = {}
        for name in _RES_INTS:
            fields[name] = _opt_int(data, name, f"{where} ({kind}) ")
            if fields[name] is not None and fields[name] < 0:
                raise RecordError(f"{where} ({kind}) {name!r} is negative ({fields[name]})")
        for name in _RES_STRS:
            fields[name] = _opt_str(data, name, f"{where} ({kind}) ")
        for name in _RES_NEEDS.get(kind, ()):
            if name == "start" and state is ResourceState.RELEASED:
                continue
            if fields[name] is None:
                raise RecordError(f"{where} ({kind}) has no whole-number {name!r}")
        if kind == "mig-dynamic":
            if fields["profile"] is None:
                raise RecordError(f"{where} (mig-dynamic) has no 'profile'")
            if state is ResourceState.READY and fields["gi"] is None:
                raise RecordError(f"{where} (mig-dynamic, ready) has no whole-number 'gi'")
        known = {"kind", "state", *_RES_INTS, *_RES_STRS}
        extra = {k: v for k, v in data.items() if k not in known}
        return cls(kind, state, extra=extra, **fields)

    def to_dict(self) -> Dict[str, Any]:
        out: Dict[str, Any] = dict(self.extra)
        out["kind"] = self.kind
        out["state"] = self.state.value
        for name in _RES_INTS + _RES_STRS:
            value = getattr(self, name)
            if value is not None:
                out[name] = value
        return out

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Resource) and self.to_dict() == other.to_dict()

    __hash__ = None  # type: ignore[assignment]  # mutable

    def __repr__(self) -> str:
        return f"Resource({self.to_dict()!r})"


#: Top-level scalar fields: attribute -> (JSON key, JSON type, default).
_SCALARS: Dict[str, Any] = {
    "job_id": ("job_id", str, ""), "uid": ("uid", int, -1), "user": ("user", str, ""),
    "node": ("node", str, ""), "partition": ("partition", str, ""),
    "account": ("account", str, ""), "qos": ("qos", str, ""), "pool": ("pool", str, ""),
    "mode": ("mode", str, ""), "job_class": ("class", str, ""),
    "class_reason": ("class_reason", str, ""), "reason": ("reason", str, ""),
    "events_file": ("events_file", str, ""), "isolation_note": ("isolation_note", str, ""),
    "restart_count": ("restart_count", int, 0), "late_epilogs": ("late_epilogs", int, 0),
    "metrics": ("metrics", str, ""), "steps_file": ("steps_file", str, ""),
}


class JobRecord:
    """The job's persisted record on one node (see the module docstring)."""

    __slots__ = ("job_id", "uid", "user", "node", "partition", "account", "qos", "pool",
                 "mode", "job_class", "class_reason", "reason", "events_file",
                 "isolation_note", "restart_count", "late_epilogs", "metrics", "steps_file",
                 "status", "gpus", "env", "resources", "claims", "warnings", "times", "fence",
                 "updated", "extra")

    job_id: str
    uid: int  # -1: unknown
    user: str
    node: str
    partition: str
    account: str
    qos: str
    pool: str
    mode: str
    job_class: str  # "class" on disk
    class_reason: str
    reason: str  # why the job was refused ("" if it was not)
    events_file: str
    isolation_note: str
    restart_count: int  # the attempt this record is for (Slurm's restart count)
    #: Epilogs of earlier attempts this record still owes a skip (see hooks/runner.epilog).
    late_epilogs: int
    #: ``--iso-metrics`` as validated, "PORT/PATH" ("" if none): the job's own endpoint the
    #: agent reads at 127.0.0.1 (schema 2 as before: older readers keep it in ``extra``).
    metrics: str
    #: The job's step file (wrapper/steps.py), named by the prolog in the job's work dir.
    steps_file: str
    status: RecordStatus
    gpus: List[int]  # the job's GPU GRES indices on this node
    env: Dict[str, str]  # what the job's tasks must see
    resources: List[Resource]
    claims: List[str]  # allocation-table keys this job holds
    warnings: List[str]
    times: Dict[str, float]
    #: What a device fence needs (uid, GRES indices, Slurm's device list); see hooks.runner.
    fence: Dict[str, Any]
    updated: Optional[float]
    extra: Dict[str, Any]

    def __init__(
        self, job_id: str = "", status: RecordStatus = RecordStatus.PREPARING, *,
        uid: int = -1, user: str = "", node: str = "", partition: str = "",
        account: str = "", qos: str = "", pool: str = "", mode: str = "",
        job_class: str = "", class_reason: str = "", reason: str = "",
        events_file: str = "", isolation_note: str = "", restart_count: int = 0,
        late_epilogs: int = 0, metrics: str = "", steps_file: str = "",
        gpus: Iterable[int] = (),
        env: Optional[Mapping[str, str]] = None, resources: Iterable[Resource] = (),
        claims: Iterable[str] = (), warnings: Iterable[str] = (),
        times: Optional[Mapping[str, float]] = None,
        fence: Optional[Mapping[str, Any]] = None, updated: Optional[float] = None,
        extra: Optional[Mapping[str, Any]] = None,
    ) -> None:
        self.job_id, self.status = job_id, status
        self.uid, self.user, self.node = uid, user, node
        self.partition, self.account, self.qos = partition, account, qos
        self.pool, self.mode = pool, mode
        self.job_class, self.class_reason, self.reason = job_class, class_reason, reason
        self.events_file, self.isolation_note = events_file, isolation_note
        self.restart_count, self.late_epilogs = restart_count, late_epilogs
        self.metrics, self.steps_file = metrics, steps_file
        self.gpus = list(gpus)
        self.env = dict(env or {})
        self.resources = list(resources)
        self.claims = list(claims)
        self.warnings = list(warnings)
        self.times = dict(times or {})
        self.fence = dict(fence or {})
        self.updated = updated
        self.extra = dict(extra or {})

    def of_kind(self, kind: str) -> Iterator[Resource]:
        """This job's resources of ``kind`` (a pool mode's own), in record order."""
        return (r for r in self.resources if r.kind == kind)

    @classmethod
    def from_dict(cls, data: Any) -> JobRecord:
        """Validate and, for an older schema, migrate a record read from disk."""
        if not isinstance(data, dict):
            raise RecordError(f"expected a JSON object, found {type(data).__name__}")
        schema = data.get("schema", 1)
        if isinstance(schema, bool) or not isinstance(schema, int) or not 1 <= schema <= SCHEMA:
            raise RecordError(f"schema version {str(schema)[:20]!r} is not one this slurmiso "
                              f"reads (1 to {SCHEMA}); was it written by a newer slurmiso?")
        if schema == 1:
            data = _migrate_v1(data)
        fields: Dict[str, Any] = {
            name: _field(data, key, kind, default)
            for name, (key, kind, default) in _SCALARS.items()
        }
        try:
            status = RecordStatus(_field(data, "status", str, "preparing"))
        except ValueError:
            raise RecordError(f"status {str(data.get('status'))[:40]!r} is not one of "
                              f"{', '.join(s.value for s in RecordStatus)}") from None
        gpus = _field(data, "gpus", list, [])
        if not all(isinstance(g, int) and not isinstance(g, bool) for g in gpus):
            raise RecordError("'gpus' holds something other than GPU indices")
        claims = _field(data, "claims", list, [])
        if not all(isinstance(c, str) for c in claims):
            raise RecordError("'claims' holds something other than allocation keys")
        warnings = _field(data, "warnings", list, [])
        env = _field(data, "env", dict, {})
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
            raise RecordError("'env' is not a map of strings")
        times = _field(data, "times", dict, {})
        if not all(isinstance(v, (int, float)) and not isinstance(v, bool)
                   for v in times.values()):
            raise RecordError("'times' holds something other than timestamps")
        updated = data.get("updated")
        if updated is not None and (isinstance(updated, bool)
                                    or not isinstance(updated, (int, float))):
            raise RecordError(f"field 'updated' is {type(updated).__name__}, expected a time")
        resources = [Resource.from_dict(r, f"resources[{i}]")
                     for i, r in enumerate(_field(data, "resources", list, []))]
        known = {key for key, _kind, _default in _SCALARS.values()} | {
            "schema", "status", "gpus", "claims", "warnings", "env", "times", "updated",
            "resources", "fence"}
        return cls(
            status=status, gpus=gpus, claims=claims,
            warnings=[str(w) for w in warnings], env=env, times=times,
            fence=_field(data, "fence", dict, {}), updated=updated, resources=resources,
            extra={k: v for k, v in data.items() if k not in known}, **fields,
        )

    def to_dict(self) -> Dict[str, Any]:
        """The JSON form written to disk (schema :data:`SCHEMA`)."""
        out: Dict[str, Any] = dict(self.extra)
        for name, (key, _kind, default) in _SCALARS.items():
            value = getattr(self, name)
            if value != "" or default != "":  # an empty optional text is left out, as in v1
                out[key] = value
        out.update(
            schema=SCHEMA, status=self.status.value, gpus=list(self.gpus), env=dict(self.env),
            resources=[r.to_dict() for r in self.resources], claims=list(self.claims),
            warnings=list(self.warnings), times=dict(self.times), fence=dict(self.fence),
        )
        if self.updated is not None:
            out["updated"] = self.updated
        return out

    def __eq__(self, other: object) -> bool:
        return isinstance(other, JobRecord) and self.to_dict() == other.to_dict()

    __hash__ = None  # type: ignore[assignment]  # mutable

    def __repr__(self) -> str:
        return f"JobRecord({self.job_id!r}, {self.status.value})"


def _migrate_v1(data: Mapping[str, Any]) -> Dict[str, Any]:
    """Schema 1 -> 2: same keys; the job status "released" (never written by 0.1, but
    checked for) becomes "releasing", which an epilog or reconcile finishes idempotently."""
    out = dict(data)
    if out.get("status") == "released":
        out["status"] = RecordStatus.RELEASING.value
    out["schema"] = SCHEMA
    return out
