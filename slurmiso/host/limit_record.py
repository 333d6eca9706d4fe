"""Root's record of the host limits this node applied: the truth of what to undo.

    >>> rec = load_record(state_dir)                                   # doctest: +SKIP
    >>> [(a.job, a.level, a.knobs()) for a in rec.applied]             # doctest: +SKIP
    [('4242', 1, ('cpu.max', 'cpu.weight'))]

One JSON file, :data:`RECORD_FILE`, in the node's state dir, replaced atomically. Each applied
limit keeps the job, the note it answers (``since``, ``level``), the job's cgroup directories
and their inode numbers (a requeued job's fresh cgroup at the same path is another cgroup),
and the plan's steps with their exact restore writes. ``done`` keeps the notes the node will not
act on again (refused, or ended at their bound), so each is journaled once.

Everything read back is checked as if hostile: a restore write must name a host-rung file
directly inside one of the entry's directories, with a short printable value. A file that
is not whole is :attr:`HostRecord.problems`; the entries that were whole are still returned,
so the caller can restore what it can (fail closed).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from slurmiso.host.rate_limit import WRITABLE, CgroupWrite, Plan, Step
from slurmiso.state import node_record

#: In the node's state dir: the host limits the node applied and must undo.
RECORD_FILE = "host-limits.json"
VERSION = 1
_VALUE = re.compile(r"[A-Za-z0-9 :=._-]{1,128}")


@dataclass(frozen=True)
class Applied:
    """One host limit in force on a job's cgroup, and how to undo it exactly."""

    job: str
    since: float
    level: int
    dirs: Tuple[str, ...]
    inodes: Tuple[int, ...]
    steps: Tuple[Step, ...]
    at: float
    #: Restores tried and failed so far (the first is journaled, every one retried).
    failed: int = 0

    def key(self) -> Tuple[str, float, int]:
        return (self.job, self.since, self.level)

    def knobs(self) -> Tuple[str, ...]:
        return tuple(s.knob for s in self.steps)

    def plan(self) -> Plan:
        return Plan(steps=self.steps)

    def to_dict(self) -> Dict[str, Any]:
        return {"job": self.job, "since": self.since, "level": self.level,
                "dirs": list(self.dirs), "inodes": list(self.inodes), "at": self.at,
                "failed": self.failed,
                "steps": [{"knob": s.knob,
                           "apply": [[w.path, w.value] for w in s.apply],
                           "restore": [[w.path, w.value] for w in s.restore]}
                          for s in self.steps]}


@dataclass
class HostRecord:
    """The record as read: whole entries, tombstones (key -> why) and what was not whole."""

    applied: List[Applied] = field(default_factory=list)
    done: Dict[Tuple[str, float, int], str] = field(default_factory=dict)
    problems: List[str] = field(default_factory=list)


def record_path(state_dir: str) -> str:
    return os.path.join(state_dir, RECORD_FILE)


def dir_inodes(dirs: Tuple[str, ...]) -> Optional[Tuple[int, ...]]:
    """The inode of each directory (not following a symlink); None if one is gone."""
    try:
        return tuple(os.lstat(d).st_ino for d in dirs)
    except OSError:
        return None


def _writes(raw: Any, dirs: Tuple[str, ...]) -> Tuple[CgroupWrite, ...]:
    if not isinstance(raw, list) or not raw:
        raise ValueError("no writes")
    out = []
    for item in raw:
        if not (isinstance(item, list) and len(item) == 2
                and all(isinstance(x, str) for x in item)):
            raise ValueError(f"a write is not [path, value]: {str(item)[:60]}")
        path, value = item
        if os.path.dirname(path) not in dirs or os.path.basename(path) not in WRITABLE:
            raise ValueError(f"write to {path[:120]!r}: not a host-rung file of the job's cgroup")
        if not _VALUE.fullmatch(value):
            raise ValueError(f"write of {value[:40]!r} to {path}: not a cgroup value")
        out.append(CgroupWrite(path, value))
    return tuple(out)


def _applied(d: Any) -> Applied:
    if not isinstance(d, dict):
        raise ValueError("an entry is not a mapping")
    dirs = tuple(d["dirs"])
    if not dirs or not all(isinstance(x, str) and os.path.isabs(x)
                           and os.path.normpath(x) == x for x in dirs):
        raise ValueError("its cgroup directories are not canonical absolute paths")
    inodes = tuple(int(i) for i in d["inodes"])
    if len(inodes) != len(dirs):
        raise ValueError("one inode per directory")
    steps = tuple(Step(str(s["knob"]), _writes(s["apply"], dirs), _writes(s["restore"], dirs))
                  for s in d["steps"])
    job = str(d["job"])
    if not re.fullmatch(r"[0-9]{1,12}(_[0-9]{1,10})?(\+[0-9]{1,4})?", job):
        raise ValueError(f"job {job[:20]!r} is not a Slurm job id")
    return Applied(job, float(d["since"]), int(d["level"]), dirs, inodes, steps,
                   float(d["at"]), int(d.get("failed", 0)))


def _done_key(d: Any) -> Tuple[Tuple[str, float, int], str]:
    return (str(d["job"]), float(d["since"]), int(d["level"])), str(d["why"])


def load_record(state_dir: str) -> HostRecord:
    """The record (empty when there is none); never raises. Each entry that is not whole is
    one line of :attr:`HostRecord.problems` (and left out)."""
    rec = HostRecord()
    entries, done = node_record.read(record_path(state_dir), VERSION, "applied", rec.problems)
    rec.applied = node_record.parse_each(entries, _applied, f"{RECORD_FILE}: applied",
                                         rec.problems)
    rec.done = dict(node_record.parse_each(done, _done_key, f"{RECORD_FILE}: done",
                                           rec.problems))
    return rec


def save_record(state_dir: str, rec: HostRecord) -> None:
    """Replace the record atomically (root's file); OSError is the caller's to report."""
    node_record.write(record_path(state_dir), VERSION, "applied",
                      [a.to_dict() for a in rec.applied],
                      [{"job": k[0], "since": k[1], "level": k[2], "why": why}
                       for k, why in sorted(rec.done.items())])


def quarantine(state_dir: str, now: float) -> Optional[str]:
    """Move a record that was not whole aside for a human (``host-limits.json.bad-<ts>``);
    where it went, or None if it could not be moved."""
    return node_record.quarantine(record_path(state_dir), now)
