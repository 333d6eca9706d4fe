"""A restraint as the node sees it, without the monitor's memory (issue 33).

The monitor runs on the controller; a node shares nothing with it but Slurm. So each
restraint the ladder puts on a running training job is written where only an admin writes
and every node reads: the job's ``AdminComment`` (``scontrol update`` by root or SlurmUser;
a job's user can read it, never set it). One token there, no spaces, beside whatever the
site keeps in it::

    slurmiso-restraint:step=suspend,since=1733460000,gpu=n3/0,cause=4711,max=1800,on=resume

``step`` is the rung the job is at (``throttle``, ``suspend``, ``host-limit`` or ``park``),
``since`` when it was taken (the monitor's clock), ``cause`` the inference job behind it,
``max`` the step's bound (``monitor.ladder.<step>.max``) and ``on`` how the bound ends it
(``on_bound``). A ``park`` token has the same fields as ``throttle`` and ``suspend``.
A ``host-limit`` token also names the level the node applies (``lvl=1``..``lvl=9``, a level
of the node's own ``monitor.ladder.host_limit``) and is always ``on=resume``: the node ends it
by restoring the job's cgroup (:mod:`slurmiso.agent.host_rung`, docs/host-contention.md):
``step=host-limit,since=1733460000,gpu=n3/0,cause=4711,max=3600,on=resume,lvl=1`` after the
prefix, one word.

The monitor proves it is alive by scraping the node's agent with the
:data:`HEARTBEAT_HEADER` header holding a MUNGE credential root made for that node
(:func:`heartbeat_credential`); the agent (root) stamps :data:`HEARTBEAT_FILE` in the node's
state dir only for a credential munged vouches for (:func:`heartbeat_vouched`): any local
user can send a header, none can make root's credential, and munged decodes each one once.
A restraint whose age reaches its ``max`` while that stamp is older than the
monitor's data age limit is ended on the node (``slurmiso reconcile``, the agent) in the
direction ``on`` names, journaled as a ``ladder-end`` line with ``by: node``.

Root's own record of what the node last read from Slurm is :data:`BOOK_FILE` in the state
dir: ``slurmiso status`` and ``doctor`` show it even while slurmctld does not answer.
"""

from __future__ import annotations

import enum
import json
import logging
import os
import re
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence

log = logging.getLogger(__name__)

#: The header the monitor sends when it scrapes an agent: the node's proof that it lives.
HEARTBEAT_HEADER = "X-Slurmiso-Monitor"
#: Beside the monitor's credential: read the node's restraints from Slurm now (a note the
#: node acts on was just written); the agent's watch runs at once, at most once a second.
WAKE_HEADER = "X-Slurmiso-Wake"
WAKE_RESTRAINTS = "restraints"
#: In the node's state dir: the last time the monitor scraped the agent (root writes it).
HEARTBEAT_FILE = "monitor-heartbeat"
#: In the node's state dir: the restraints the node last read from Slurm.
BOOK_FILE = "restraints.json"
PREFIX = "slurmiso-restraint:"
#: The agent's series (slurmiso/agent/restraint_watch.py).
M_RESTRAINT = "slurmiso_job_restraint_seconds"
M_RESTRAINT_BOUND = "slurmiso_job_restraint_bound_seconds"
M_HEARTBEAT = "slurmiso_monitor_heartbeat_age_seconds"
#: Per knob of a host limit the node applied (slurmiso/agent/host_rung.py): seconds in force.
M_HOST_LIMIT = "slurmiso_job_host_limit_seconds"
#: Per park the node made (slurmiso/agent/park_rung.py): seconds the job has been parked.
M_PARK = "slurmiso_job_park_seconds"
#: Per park note the node will not park (refused, cut short, ended at its bound), by the
#: note's ``since``: the monitor lets suspend stand in for it.
M_PARK_REFUSED = "slurmiso_job_park_refused"
#: The longest ``AdminComment`` squeue is asked to print (the site's own text included).
ADMIN_COMMENT_WIDTH = 1024  # SlurmCli.ADMIN_COMMENT_WIDTH


class RestraintStep(str, enum.Enum):
    """The rungs that restrain a running job (hold and requeue leave nothing on it)."""

    THROTTLE = "throttle"
    SUSPEND = "suspend"
    #: The host rung: the node rate-limits the job's cgroup (slurmiso/agent/host_rung.py).
    HOST_LIMIT = "host-limit"
    #: The park rung: the node checkpoints the job's CUDA processes to host memory with
    #: cuda-checkpoint (slurmiso/agent/park_rung.py, docs/park.md).
    PARK = "park"


class OnBound(str, enum.Enum):
    """How a restraint past its bound ends: given back, or checkpointed and requeued."""

    RESUME = "resume"
    REQUEUE = "requeue"


_TOKEN = re.compile(
    re.escape(PREFIX) + r"step=(?P<step>throttle|suspend|host-limit|park),"
    r"since=(?P<since>[0-9]{1,12}),gpu=(?P<node>[A-Za-z0-9._-]{1,64})/(?P<gpu>[0-9]{1,3}),cause=(?P<cause>[A-Za-z0-9_+]{0,24}),"
    r"max=(?P<max>[0-9]{1,9}),on=(?P<on>resume|requeue)(?:,lvl=(?P<lvl>[1-9]))?(?=\s|$)")
#: The host rung's levels: ``lvl=1``..``lvl=9`` (``monitor.ladder.host_limit.levels``).
MAX_HOST_LEVEL = 9
_ANY_TOKEN = re.compile(re.escape(PREFIX) + r"\S*")


@dataclass(frozen=True)
class Note:
    """The restraint as the monitor wrote it in the job's ``AdminComment``."""

    step: RestraintStep
    since: float
    node: str
    gpu: int
    cause: str
    max_s: float
    on_bound: OnBound
    #: The host rung's level (1..9) on a ``host-limit`` note; 0 on every other step.
    level: int = 0

    def __post_init__(self) -> None:
        if self.step is RestraintStep.HOST_LIMIT:
            if not 1 <= self.level <= MAX_HOST_LEVEL:
                raise ValueError(f"a host-limit note needs a level 1..{MAX_HOST_LEVEL}, "
                                 f"got {self.level}")
            if self.on_bound is not OnBound.RESUME:
                raise ValueError("a host-limit note ends by resume (the node restores the "
                                 "job's cgroup), never requeue")
        elif self.level != 0:
            raise ValueError(f"a {self.step.value} note has no level")

    def text(self) -> str:
        lvl = f",lvl={self.level}" if self.step is RestraintStep.HOST_LIMIT else ""
        return (f"{PREFIX}step={self.step.value},since={int(self.since)},"
                f"gpu={self.node}/{self.gpu},cause={self.cause},max={int(self.max_s)},"
                f"on={self.on_bound.value}{lvl}")

    @classmethod
    def parse(cls, admin_comment: str) -> Optional[Note]:
        """Our token in an ``AdminComment`` (the first whole one), else None; a token whose
        fields do not go together (a host-limit without a level or ending by requeue, a
        level on another step) is none of ours."""
        for m in _TOKEN.finditer(admin_comment or ""):
            try:
                return cls(RestraintStep(m["step"]), float(m["since"]), m["node"],
                           int(m["gpu"]), m["cause"], float(m["max"]), OnBound(m["on"]),
                           int(m["lvl"] or 0))
            except ValueError:
                continue
        return None

    def age(self, now: float) -> float:
        return max(0.0, now - self.since)

    def over_bound(self, now: float) -> bool:
        return self.age(now) >= self.max_s

    @classmethod
    def from_dict(cls, d: Dict[str, Any]) -> Note:
        """:meth:`to_dict`'s reverse (a saved snapshot's notes)."""
        return cls(RestraintStep(d["step"]), float(d["since"]), str(d["node"]), int(d["gpu"]),
                   str(d.get("cause") or ""), float(d["max_s"]), OnBound(d["on_bound"]),
                   int(d.get("level") or 0))

    def to_dict(self) -> Dict[str, Any]:
        out = {"step": self.step.value, "since": self.since, "node": self.node,
               "gpu": self.gpu, "cause": self.cause, "max_s": self.max_s,
               "on_bound": self.on_bound.value}
        if self.level:
            out["level"] = self.level
        return out


def write_note(slurm: Any, job: str, note: Optional[Note]) -> None:
    """Put ``note`` (None: remove ours) in ``job``'s ``AdminComment`` through ``slurm`` (a
    :class:`~slurmiso.slurm.client.SlurmCli`), keeping the site's own text there; a
    stand-in may take the note itself (``set_restraint_note``). A job Slurm no longer
    lists is left alone."""
    own = getattr(slurm, "set_restraint_note", None)
    if own is not None:
        own(job, note)
        return
    if not hasattr(slurm, "admin_comment"):
        return  # a Slurm without AdminComment (a test's stand-in)
    current = slurm.admin_comment(job)
    if current is None:
        return
    text = with_note(current, note)
    if text != current:
        slurm.set_admin_comment(job, text)


def with_note(admin_comment: str, note: Optional[Note]) -> str:
    """``admin_comment`` with our token replaced by ``note`` (None: removed); the site's
    own text is kept as it was."""
    rest = " ".join(_ANY_TOKEN.sub(" ", admin_comment or "").split())
    if note is None:
        return rest
    return f"{rest} {note.text()}".strip()


# ------------------------------------------------------------------------ the heartbeat
def _heartbeat_payload(node: str) -> bytes:
    return f"slurmiso-heartbeat v1 node={node}".encode()


def heartbeat_credential(node: str) -> Optional[str]:
    """The header value that proves this monitor (root) scraped ``node``; None where MUNGE
    cannot make one (then the agent stamps nothing: the node sees the monitor silent)."""
    from slurmiso.munge_token import MungeUnavailable, encode

    try:
        return encode(_heartbeat_payload(node), ttl_s=120)
    except MungeUnavailable as exc:
        log.warning("monitor: no heartbeat credential for %s: %s", node, exc)
        return None


def heartbeat_vouched(value: str, node: str, uid: Optional[int] = None) -> Optional[str]:
    """None when ``value`` is a credential ``uid`` made for ``node`` that munged decodes
    now (fresh, never decoded here before); else why not. ``uid`` defaults to this
    process's: the monitor and the agent run as the same user (root in the shipped units)."""
    from slurmiso.munge_token import MungeUnavailable, decode

    uid = os.geteuid() if uid is None else uid
    try:
        got = decode(value.strip())
    except MungeUnavailable as exc:
        return str(exc)
    if not got.ok:
        return got.why()
    if got.uid != uid:
        return f"made by uid {got.uid}, not {uid}"
    if got.payload != _heartbeat_payload(node):
        return "made for another node"
    return None


def heartbeat_path(state_dir: str) -> str:
    return os.path.join(state_dir, HEARTBEAT_FILE)


def write_heartbeat(state_dir: str, now: float) -> None:
    """Stamp the monitor's scrape (the file's content, a Unix time; root's file)."""
    from slurmiso.atomic import write_atomic

    os.makedirs(state_dir, exist_ok=True)
    write_atomic(heartbeat_path(state_dir), f"{now:.0f}\n")


def heartbeat_age(state_dir: str, now: float) -> Optional[float]:
    """Seconds since the monitor last scraped this node's agent; None: never, or unreadable
    (so: not alive)."""
    try:
        with open(heartbeat_path(state_dir), encoding="ascii") as f:
            stamp = float(f.read(32).strip())
    except (OSError, ValueError, UnicodeDecodeError):
        return None
    return max(0.0, now - stamp)


def alive_limit(interval_s: float) -> float:
    """How old the heartbeat may be for the monitor to count as alive: its own data age
    limit (``max(3 x interval, 60 s)``)."""
    return max(3.0 * interval_s, 60.0)


def monitor_alive(state_dir: str, interval_s: float, now: float) -> bool:
    age = heartbeat_age(state_dir, now)
    return age is not None and age <= alive_limit(interval_s)


def node_ends(state_dir: str, note: Note, interval_s: float, now: float) -> bool:
    """The rule :func:`end_over_bound` ends by: ``note`` is past its bound and no monitor is
    alive (with a live monitor the monitor owns its restraints)."""
    return note.over_bound(now) and not monitor_alive(state_dir, interval_s, now)


# ------------------------------------------------------------------- what Slurm shows now
@dataclass(frozen=True)
class NodeRestraint:
    """One job on the node with a restraint note: its Slurm state and the note."""

    job: str
    state: str
    note: Note

    def to_dict(self, now: float) -> Dict[str, Any]:
        return {"job": self.job, "state": self.state, "age_s": round(self.note.age(now), 1),
                "over_bound": self.note.over_bound(now), **self.note.to_dict()}


_JOB = re.compile(r"[0-9]{1,12}(_[0-9]{1,10})?(\+[0-9]{1,4})?")


def parse_squeue(out: str) -> List[NodeRestraint]:
    """``squeue -h -O JobID,State,admin_comment`` lines into restraints (lines without our
    token, or whose id or state is not Slurm's, are not restraints)."""
    found = []
    for line in out.splitlines():
        parts = line.split(None, 2)
        if len(parts) < 3 or not _JOB.fullmatch(parts[0]) or not parts[1].isalpha():
            continue
        note = Note.parse(parts[2])
        if note is not None:
            found.append(NodeRestraint(parts[0], parts[1].upper(), note))
    return found


def read_slurm_all(run: Callable[..., str]) -> List[NodeRestraint]:
    """The restraints Slurm shows on every node now: the monitor's read (its memory may have
    lost some: slurmiso/monitor/adopt.py)."""
    out = run("squeue", ["-h", "-t", "RUNNING,SUSPENDED", "-O",
                         f"JobID:40,State:24,admin_comment:{ADMIN_COMMENT_WIDTH}"])
    return parse_squeue(out)


def read_slurm(run: Callable[..., str], node: str) -> List[NodeRestraint]:
    """The restraints Slurm shows on ``node`` now (``run``: :meth:`SlurmCli.run`).
    ``admin_comment`` is squeue's ``-O`` name for it (22.05.8 refuses ``AdminComment``);
    an empty one prints ``(null)``."""
    out = run("squeue", ["-h", "-w", node, "-t", "RUNNING,SUSPENDED", "-O",
                         f"JobID:40,State:24,admin_comment:{ADMIN_COMMENT_WIDTH}"])
    return parse_squeue(out)


# ----------------------------------------------------------------- root's record of them
def save_book(state_dir: str, found: Sequence[NodeRestraint], now: float) -> None:
    from slurmiso.atomic import write_atomic

    os.makedirs(state_dir, exist_ok=True)
    data = {"read_at": now, "restraints": [dict(r.note.to_dict(), job=r.job, state=r.state)
                                           for r in found]}
    write_atomic(os.path.join(state_dir, BOOK_FILE), json.dumps(data, sort_keys=True) + "\n")


def load_book(state_dir: str) -> Dict[str, Any]:
    """``{"read_at": ts | None, "restraints": [NodeRestraint]}`` (empty when never read)."""
    try:
        with open(os.path.join(state_dir, BOOK_FILE), encoding="utf-8") as f:
            data = json.loads(f.read(1 << 20))
        items = [NodeRestraint(str(d["job"]), str(d["state"]), Note(
            RestraintStep(d["step"]), float(d["since"]), str(d["node"]), int(d["gpu"]),
            str(d["cause"]), float(d["max_s"]), OnBound(d["on_bound"]),
            int(d["level"]) if "level" in d else 0))
            for d in data["restraints"]]
        return {"read_at": float(data["read_at"]), "restraints": items}
    except (OSError, ValueError, KeyError, TypeError) as exc:
        if not isinstance(exc, FileNotFoundError):
            log.warning("restraints: %s unreadable: %s", BOOK_FILE, exc)
        return {"read_at": None, "restraints": []}


def refresh(slurm: Any, state_dir: str, node: str, now: float) -> Dict[str, Any]:
    """Read Slurm and keep root's record; Slurm not answering: the record as it was, with
    ``error`` saying why (its ``read_at`` says how old it is)."""
    from slurmiso.errors import SlurmisoError

    try:
        found = read_slurm(slurm.run, node)
    except SlurmisoError as exc:
        book = load_book(state_dir)
        book["error"] = str(exc)
        return book
    try:
        save_book(state_dir, found, now)
    except OSError as exc:  # not root: shown, not kept
        log.info("restraints: cannot keep %s: %s", BOOK_FILE, exc)
    return {"read_at": now, "restraints": found}


# ------------------------------------------------------------------- the bound, on the node
def end_over_bound(slurm: Any, state_dir: str, found: Sequence[NodeRestraint], now: float,
                   interval_s: float, unthrottle_signal: str, dry_run: bool,
                   journal: Any = None) -> List[str]:
    """End each restraint past its bound while no monitor is alive, as its note says
    (resume: ``scontrol resume`` / the unthrottle signal; requeue: resume first if
    suspended, then ``scontrol requeue``), clear its note, journal it. One line per job.
    With a live monitor nothing is done: the monitor owns its restraints."""
    if monitor_alive(state_dir, interval_s, now):
        return []
    age = heartbeat_age(state_dir, now)
    silent = "never" if age is None else f"{age:.0f}s ago"
    lines = []
    for r in found:
        if not r.note.over_bound(now) or r.note.step in _NODE_STEPS:
            continue  # the node's own rungs end these: slurmiso/agent/host_rung.py, park_rung.py
        how = _how(r)
        line = (f"job {r.job}: {r.note.step.value} by the ladder for {r.note.age(now):.0f}s "
                f"(bound {r.note.max_s:.0f}s, cause inference job {r.note.cause or '?'}), "
                f"monitor last seen {silent}: {how}")
        lines.append(line)
        if dry_run:
            continue
        from slurmiso.errors import SlurmisoError

        try:
            said = _end(slurm, r, unthrottle_signal)
        except SlurmisoError as exc:
            lines[-1] += f" -- FAILED: {exc}"
            _journal(journal, r, now, how, ok=False, error=str(exc))
            continue
        clear_note(slurm, r.job)
        _journal(journal, r, now, how, ok=True, note=said)
    return lines


#: The rungs the node itself applies and ends (its own record, not ``end_over_bound``).
_NODE_STEPS = frozenset({RestraintStep.HOST_LIMIT, RestraintStep.PARK})


def _how(r: NodeRestraint) -> str:
    if r.note.on_bound is OnBound.REQUEUE:
        return "requeued (checkpoint)"
    return "resumed" if r.state == "SUSPENDED" else "back to full speed"


def _end(slurm: Any, r: NodeRestraint, unthrottle_signal: str) -> str:
    """Resume: a suspended job is resumed, and every job gets the unthrottle signal (a job
    the ladder suspended was throttled first; the signal is idempotent and ignored by
    default, so one that was not loses nothing). Requeue: as the ladder requeues."""
    suspended = r.state == "SUSPENDED"
    if r.note.on_bound is OnBound.REQUEUE:
        return str(slurm.requeue_job(r.job, suspended))
    said = str(slurm.resume_job(r.job)) if suspended else "done"
    signalled = str(slurm.signal_job(r.job, unthrottle_signal))
    return said if suspended else signalled


def clear_note(slurm: Any, job: str) -> None:
    """Remove our token from the job's ``AdminComment``: the restraint is over (``slurm``
    None: nothing to ask)."""
    if slurm is None:
        return
    from slurmiso.errors import SlurmisoError

    try:
        write_note(slurm, job, None)
    except SlurmisoError as exc:
        log.warning("restraints: job %s: its AdminComment note was not removed: %s", job, exc)


def _journal(journal: Any, r: NodeRestraint, now: float, how: str, ok: bool,
             **extra: Any) -> None:
    if journal is None:
        return
    from slurmiso.state.journal import MONITOR_SOURCE

    step = r.note.step
    details = {"by": "node", "node": r.note.node, "gpu": f"{r.note.node}/{r.note.gpu}",
               "cause": r.note.cause, "bound": {"max_s": r.note.max_s,
                                                "on_bound": r.note.on_bound.value},
               "restraint": r.note.to_dict(), "ts": now,
               "throttled_s": round(r.note.age(now), 1) if step is RestraintStep.THROTTLE
               else None,
               "suspended_s": round(r.note.age(now), 1) if step is RestraintStep.SUSPEND
               else None}
    fields = {"source": MONITOR_SOURCE, "action": "ladder-end", "target": r.job,
              "reason": f"training restraint over: past its bound with no live monitor: {how}",
              "dry_run": False, "details": details, "ok": ok}
    fields.update({k: v for k, v in extra.items() if v})
    try:
        journal.append("monitor-action", **fields)
    except OSError as exc:
        log.warning("restraints: cannot write the journal: %s", exc)


# --------------------------------------------------------- what status and doctor show
def node_view(state_dir: str, node: str, interval_s: float, now: float,
              slurm: Any = None) -> Dict[str, Any]:
    """The node's restraints (from Slurm through root's record when ``slurm`` is given,
    else the record as last read) with their age and bound, and the monitor's heartbeat:
    plain data for ``slurmiso status`` and ``doctor``."""
    book = refresh(slurm, state_dir, node, now) if slurm is not None else load_book(state_dir)
    age = heartbeat_age(state_dir, now)
    out: Dict[str, Any] = {
        "read_at": book["read_at"],
        "restraints": [r.to_dict(now) for r in book["restraints"]],
        "heartbeat_age_s": None if age is None else round(age, 1),
        "monitor_alive": age is not None and age <= alive_limit(interval_s),
        "alive_limit_s": alive_limit(interval_s),
    }
    if "error" in book:
        out["error"] = book["error"]
    return out


def describe(r: Dict[str, Any]) -> str:
    """One restraint as an admin reads it: what, how long against its bound, and why."""
    what = {"suspend": "suspended", "park": "parked (GPU memory to host)",
            "host-limit": f"host-limited (level {r.get('level')})"}.get(r["step"], "throttled")
    over = "  -- PAST ITS BOUND" if r["over_bound"] else ""
    return (f"{what} by the ladder for {r['age_s']:.0f}s (bound {r['max_s']:.0f}s, then "
            f"{r['on_bound']}): inference job {r['cause'] or '?'} on {r['node']} GPU "
            f"{r['gpu']}{over}")
