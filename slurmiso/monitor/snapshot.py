"""What the monitor sees in one cycle, as plain data that round-trips through JSON.

A snapshot is the only input of :func:`slurmiso.monitor.decide.decide` besides the policy and
the monitor's memory, so a recorded one (``slurmiso monitor snapshot -o FILE``) replays a
decision exactly: admins ask "what would it do now?", tests and benchmarks feed synthetic ones.
Telemetry that is missing or old is data here (``telemetry_age_s``), never an exception.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from slurmiso.exposition.job_series import JobSignals
from slurmiso.monitor.host_view import JobHostFigures, NodeHostFigures
from slurmiso.restraints import Note

SNAPSHOT_VERSION = 2
#: Versions that still load: 1 had no per-job signals (read as none reported).
READ_VERSIONS = (1, 2)
#: squeue reasons of a pending job that waits for GPUs and nothing else.
ELIGIBLE_REASONS = frozenset(("", "None", "Resources", "Priority", "ReqNodeNotAvail"))


@dataclass
class GpuSample:
    """One GPU of a node: memory, activity (percent; None = not reported) and its users."""

    index: int
    memory_used_mb: int = 0
    memory_total_mb: int = 0
    sm_active_pct: Optional[float] = None
    gr_active_pct: Optional[float] = None
    processes: int = 0
    jobs: Tuple[str, ...] = ()
    classes: Tuple[str, ...] = ()
    mig_profiles: Tuple[str, ...] = ()

    @property
    def memory_pct(self) -> Optional[float]:
        """Percent of memory in use; None when the total is unknown (never read as 0 %)."""
        return 100.0 * self.memory_used_mb / self.memory_total_mb if self.memory_total_mb else None

    def to_dict(self) -> Dict[str, Any]:
        out: Dict[str, Any] = {"index": self.index, "mem": self.memory_used_mb,
                               "mem_total": self.memory_total_mb}
        if self.sm_active_pct is not None:
            out["sm"] = self.sm_active_pct
        if self.gr_active_pct is not None:
            out["gr"] = self.gr_active_pct
        if self.processes:
            out["procs"] = self.processes
        if self.jobs:
            out["jobs"] = list(self.jobs)
        if self.classes:
            out["classes"] = list(self.classes)
        if self.mig_profiles:
            out["mig"] = list(self.mig_profiles)
        return out

    @classmethod
    def from_dict(cls, d: Dict[str, Any]) -> GpuSample:
        g = d.get
        return cls(d["index"], g("mem", 0), g("mem_total", 0), g("sm"), g("gr"), g("procs", 0),
                   tuple(g("jobs", ())), tuple(g("classes", ())), tuple(g("mig", ())))


@dataclass
class NodeInfo:
    """A node as Slurm states it (``state`` as ``scontrol`` prints it, e.g. ``IDLE+DRAIN``)
    and as its telemetry shows it; ``telemetry_age_s`` None = no telemetry at all."""

    name: str
    state: str = "IDLE"
    partitions: Tuple[str, ...] = ()
    pool: str = ""
    mode: str = ""
    gres: str = ""
    addr: str = ""
    gpus: Tuple[GpuSample, ...] = ()
    telemetry_age_s: Optional[float] = None

    @property
    def flags(self) -> Tuple[str, ...]:
        return tuple(self.state.upper().split("+"))

    @property
    def draining(self) -> bool:
        return any(f.startswith("DRAIN") for f in self.flags)

    @property
    def usable(self) -> bool:
        """Up and schedulable: not down, drained, failing or powered off."""
        bad = ("DOWN", "DRAIN", "DRAINED", "DRAINING", "FAIL", "FAILING", "POWERED_DOWN",
               "NOT_RESPONDING", "MAINT", "RESERVED", "INVAL")
        return not any(f.rstrip("*") in bad for f in self.flags)

    def to_dict(self) -> Dict[str, Any]:
        return {"name": self.name, "state": self.state, "partitions": list(self.partitions),
                "pool": self.pool, "mode": self.mode, "gres": self.gres, "addr": self.addr,
                "gpus": [gpu.to_dict() for gpu in self.gpus],
                "telemetry_age_s": self.telemetry_age_s}

    @classmethod
    def from_dict(cls, d: Dict[str, Any]) -> NodeInfo:
        g = d.get
        return cls(d["name"], g("state", "IDLE"), tuple(g("partitions", ())), g("pool", ""),
                   g("mode", ""), g("gres", ""), g("addr", ""),
                   tuple(GpuSample.from_dict(x) for x in g("gpus", ())), g("telemetry_age_s"))


@dataclass
class JobInfo:
    """A pending or running job: class (as slurmiso classifies it), where it may run, and
    whether it is held (``hold_reason`` JobHeldUser/JobHeldAdmin)."""

    id: str
    state: str  # PENDING | RUNNING | SUSPENDED
    job_class: str = ""
    partitions: Tuple[str, ...] = ()
    qos: str = ""
    submit_ts: float = 0.0
    held: bool = False
    reason: str = ""
    nodes: Tuple[str, ...] = ()
    gres: str = ""  # what the job asks per node, e.g. "gpu:3g.40gb:1"
    #: Slurm's priority (squeue %Q): releases go highest first, as Slurm would start them.
    priority: float = 0.0
    #: The job's ExcNodeList as Slurm shows it now (a hostlist expression, "" = none).
    exc_nodes: str = ""
    num_nodes: int = 1
    #: Pending: the earliest start Slurm allows (BeginTime), Unix seconds; 0 = none.
    begin_ts: float = 0.0
    #: The job's comment; None: unread (its squeue row could not be told from one a comment
    #: forged, slurmiso.slurm.rows), neither empty nor the monitor's note, so never written.
    comment: Optional[str] = ""

    #: Derived once (decide() asks 60,000 jobs several times per cycle): pending, and
    #: eligible = pending and waiting only on resources or priority (not held, not a
    #: BeginTime, dependency or limit): the only pending jobs that say a class is short of GPUs.
    pending: bool = field(init=False, repr=False, compare=False)
    eligible: bool = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.pending = self.state == "PENDING"
        self.eligible = self.pending and not self.held and self.reason in ELIGIBLE_REASONS

    def to_dict(self) -> Dict[str, Any]:
        out: Dict[str, Any] = {"id": self.id, "state": self.state, "class": self.job_class,
                               "partitions": list(self.partitions), "qos": self.qos,
                               "submit": self.submit_ts}
        if self.held:
            out["held"] = True
        if self.reason:
            out["reason"] = self.reason
        if self.nodes:
            out["nodes"] = list(self.nodes)
        if self.gres:
            out["gres"] = self.gres
        for key, value, empty in (("priority", self.priority, 0.0), ("exc", self.exc_nodes, ""),
                                  ("num_nodes", self.num_nodes, 1),
                                  ("begin", self.begin_ts, 0.0), ("comment", self.comment, "")):
            if value != empty:
                out[key] = value
        return out

    @classmethod
    def from_dict(cls, d: Dict[str, Any]) -> JobInfo:
        g = d.get
        return cls(str(d["id"]), d["state"], g("class", ""), tuple(g("partitions", ())),
                   g("qos", ""), float(g("submit", 0.0)), bool(g("held", False)),
                   g("reason", ""), tuple(g("nodes", ())), g("gres", ""),
                   float(g("priority", 0.0)), g("exc", ""), int(g("num_nodes", 1)),
                   float(g("begin", 0.0)), g("comment", ""))


@dataclass(frozen=True)
class ParkSeen:
    """What a node's agent says of one job's park (issue 35): its CUDA processes parked
    now, and the park notes (by their ``since``) the node will not park."""

    parked: bool = False
    refused: Tuple[float, ...] = ()

    def refuses(self, since: float) -> bool:
        """Whether the note the monitor wrote at ``since`` is one the node refused (the note
        carries whole seconds)."""
        return any(abs(s - since) < 1.0 for s in self.refused)

    def to_dict(self) -> Dict[str, Any]:
        return {"parked": self.parked, "refused": list(self.refused)}

    @classmethod
    def from_dict(cls, d: Dict[str, Any]) -> ParkSeen:
        return cls(bool(d.get("parked")), tuple(float(x) for x in d.get("refused") or ()))


@dataclass
class Snapshot:
    """Everything one decision cycle looks at, taken at ``ts`` (Unix seconds)."""

    ts: float
    nodes: Tuple[NodeInfo, ...] = ()
    partitions: Dict[str, Tuple[str, ...]] = field(default_factory=dict)
    jobs: Tuple[JobInfo, ...] = ()
    #: P99 inference latency per class (ms), where a latency query is configured and answered.
    latency_p99_ms: Dict[str, float] = field(default_factory=dict)
    #: Age of the oldest latency sample, from the samples' own timestamps (None: unknown).
    latency_age_s: Optional[float] = None
    slurm_ok: bool = True
    #: Why data is missing (Prometheus down, an agent unreachable): one line each.
    errors: Tuple[str, ...] = ()
    #: "source/reason" -> count of signals that came back unknown this cycle.
    unknown: Dict[str, int] = field(default_factory=dict)
    #: Per-job signals from the node agents (job id -> signals); the ladder's input.
    job_signals: Dict[str, JobSignals] = field(default_factory=dict)
    #: node -> "source/reason" where its own telemetry came back unknown this cycle (an
    #: agent unreachable, an answer that did not parse).
    telemetry_unknown: Dict[str, str] = field(default_factory=dict)
    #: The agents' host figures (issue 36), per node and per job (a job on several nodes:
    #: the first node's); empty where no agent exports them (then no diagnosis is made).
    host_nodes: Dict[str, NodeHostFigures] = field(default_factory=dict)
    host_jobs: Dict[str, JobHostFigures] = field(default_factory=dict)
    #: What the agents say of each job's park (job -> ParkSeen); empty without parks.
    parks: Dict[str, ParkSeen] = field(default_factory=dict)
    #: The restraint note in each running or suspended job's ``AdminComment`` (job -> Note;
    #: None: not read, e.g. a replayed snapshot or Slurm refused): what adopt.py squares
    #: with the memory.
    notes: Optional[Dict[str, Note]] = None

    def node(self, name: str) -> Optional[NodeInfo]:
        for n in self.nodes:
            if n.name == name:
                return n
        return None

    def to_dict(self) -> Dict[str, Any]:
        return {"version": SNAPSHOT_VERSION, "ts": self.ts,
                "nodes": [n.to_dict() for n in self.nodes],
                "partitions": {k: list(v) for k, v in self.partitions.items()},
                "jobs": [j.to_dict() for j in self.jobs],
                "latency_p99_ms": dict(self.latency_p99_ms),
                "latency_age_s": self.latency_age_s, "slurm_ok": self.slurm_ok,
                "errors": list(self.errors), "unknown": dict(self.unknown),
                "job_signals": [s.to_dict() for _, s in sorted(self.job_signals.items())],
                **({"telemetry_unknown": dict(self.telemetry_unknown)}
                   if self.telemetry_unknown else {}),
                **({"host_nodes": [n.to_dict() for _, n in sorted(self.host_nodes.items())]}
                   if self.host_nodes else {}),
                **({"host_jobs": [j.to_dict() for _, j in sorted(self.host_jobs.items())]}
                   if self.host_jobs else {}),
                **({"parks": {j: p.to_dict() for j, p in sorted(self.parks.items())}}
                   if self.parks else {}),
                **({"notes": {j: n.to_dict() for j, n in sorted(self.notes.items())}}
                   if self.notes is not None else {})}

    @classmethod
    def from_dict(cls, d: Dict[str, Any]) -> Snapshot:
        from slurmiso.errors import UsageError

        if not isinstance(d, dict) or d.get("version") not in READ_VERSIONS:
            raise UsageError("not a slurmiso monitor snapshot (version "
                             f"{', '.join(map(str, READ_VERSIONS))})")
        g = d.get
        return cls(
            float(d["ts"]),
            tuple(NodeInfo.from_dict(n) for n in g("nodes", ())),
            {k: tuple(v) for k, v in g("partitions", {}).items()},
            tuple(JobInfo.from_dict(j) for j in g("jobs", ())),
            dict(g("latency_p99_ms", {})),
            g("latency_age_s"),
            bool(g("slurm_ok", True)),
            tuple(g("errors", ())),
            {str(k): int(v) for k, v in (g("unknown") or {}).items()},
            {s.job: s for s in (JobSignals.from_dict(x) for x in g("job_signals") or ())},
            {str(k): str(v) for k, v in (g("telemetry_unknown") or {}).items()},
            {n.node: n for n in (NodeHostFigures.from_dict(x) for x in g("host_nodes") or ())},
            {j.job: j for j in (JobHostFigures.from_dict(x) for x in g("host_jobs") or ())},
            {str(k): ParkSeen.from_dict(v) for k, v in (g("parks") or {}).items()},
            _notes(g("notes")),
        )


def _notes(raw: Any) -> Optional[Dict[str, Note]]:
    return None if raw is None else {str(k): Note.from_dict(v) for k, v in raw.items()}


def dumps(snap: Snapshot) -> str:
    return json.dumps(snap.to_dict(), separators=(",", ":"))


def loads(text: str) -> Snapshot:
    from slurmiso.errors import UsageError

    try:
        data = json.loads(text)
    except ValueError as exc:
        raise UsageError(f"snapshot is not JSON: {exc}") from None
    try:
        return Snapshot.from_dict(data)
    except (KeyError, TypeError, ValueError) as exc:
        raise UsageError(f"malformed snapshot: {exc!r}") from None


def load(path: str) -> Snapshot:
    from slurmiso.errors import UsageError

    try:
        with open(path, encoding="utf-8") as fh:
            return loads(fh.read())
    except OSError as exc:
        raise UsageError(f"cannot read snapshot {path}: {exc.strerror}") from None


def load_sequence(path: str) -> List[Snapshot]:
    """Snapshots to replay in order, each with its own ``ts``: a folder of ``*.json`` files
    (sorted by name), a JSON-lines file (one snapshot a line), or a single snapshot file.
    Raises :class:`~slurmiso.errors.UsageError` naming the file and line that is bad."""
    import os

    from slurmiso.errors import UsageError

    if os.path.isdir(path):
        names = sorted(n for n in os.listdir(path) if n.endswith((".json", ".jsonl")))
        if not names:
            raise UsageError(f"no *.json snapshots in {path}")
        out: List[Snapshot] = []
        for name in names:
            out += load_sequence(os.path.join(path, name))
        return out
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    except OSError as exc:
        raise UsageError(f"cannot read snapshot {path}: {exc.strerror}") from None
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if len(lines) <= 1:
        return [loads(text)]
    seq = []
    for n, line in enumerate(lines, 1):
        try:
            seq.append(loads(line))
        except UsageError as exc:
            if n == 1:  # one pretty-printed snapshot over several lines
                return [loads(text)]
            raise UsageError(f"{path} line {n}: {exc}") from None
    prev = None
    for n, snap in enumerate(seq, 1):
        if prev is not None and snap.ts < prev:
            raise UsageError(f"{path} line {n}: ts {snap.ts} goes back in time")
        prev = snap.ts
    return seq


def save(snap: Snapshot, path: str) -> None:
    """Write atomically (temp file + rename) so a reader never sees half a snapshot."""
    from slurmiso.atomic import write_atomic

    write_atomic(path, dumps(snap))


def jobs_by_node(jobs: List[JobInfo]) -> Dict[str, List[JobInfo]]:
    """Running jobs per node name."""
    out: Dict[str, List[JobInfo]] = {}
    for j in jobs:
        if j.state == "RUNNING":
            for n in j.nodes:
                out.setdefault(n, []).append(j)
    return out
