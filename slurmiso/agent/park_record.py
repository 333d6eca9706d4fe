"""Root's record of the parks this node made: the truth of which processes to release.

    >>> rec = load_record(state_dir)                                   # doctest: +SKIP
    >>> [(p.job, p.pids()) for p in rec.parked]                        # doctest: +SKIP
    [('4242', (5001, 5002))]

One JSON file, :data:`RECORD_FILE`, in the node's state dir, replaced atomically and written
*before* cuda-checkpoint touches a process (write-ahead). Each entry keeps the job, the note
it answers (``since``), and each process as (pid, start time in clock ticks): a pid whose
start time no longer matches is another process, never touched. ``whole`` is False until the
park finished: an entry read back that is not whole is a park cut short (the agent stopped
mid-way), released at once. ``done`` keeps the notes the node will not act on again
(refused, or ended), so each is journaled once.

Everything read back is checked as if hostile; a file that is not whole is
:attr:`ParkRecord.problems`, with the whole entries still returned (fail closed).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from slurmiso.state import node_record

#: In the node's state dir: the parks the node made and must release.
RECORD_FILE = "parks.json"
VERSION = 1
_JOB = re.compile(r"[0-9]{1,12}(_[0-9]{1,10})?(\+[0-9]{1,4})?")
#: (job, note's since)
Key = Tuple[str, float]


@dataclass(frozen=True)
class Parked:
    """One job's processes parked (or being parked) by cuda-checkpoint."""

    job: str
    since: float
    #: (pid, start time in clock ticks since boot) of each process, in park order.
    procs: Tuple[Tuple[int, int], ...]
    at: float
    #: False from the write-ahead until every process is parked.
    whole: bool = False
    #: Releases tried and failed so far (the first is journaled, every one retried).
    failed: int = 0

    def key(self) -> Key:
        return (self.job, self.since)

    def pids(self) -> Tuple[int, ...]:
        return tuple(p for p, _ in self.procs)

    def to_dict(self) -> Dict[str, Any]:
        return {"job": self.job, "since": self.since, "procs": [list(p) for p in self.procs],
                "at": self.at, "whole": self.whole, "failed": self.failed}


@dataclass
class ParkRecord:
    """The record as read: whole entries, tombstones (key -> why) and what was not whole."""

    parked: List[Parked] = field(default_factory=list)
    done: Dict[Key, str] = field(default_factory=dict)
    problems: List[str] = field(default_factory=list)


def record_path(state_dir: str) -> str:
    return os.path.join(state_dir, RECORD_FILE)


def _parked(d: Any) -> Parked:
    if not isinstance(d, dict):
        raise ValueError("an entry is not a mapping")
    job = str(d["job"])
    if not _JOB.fullmatch(job):
        raise ValueError(f"job {job[:20]!r} is not a Slurm job id")
    procs = []
    for item in d["procs"]:
        if not (isinstance(item, list) and len(item) == 2
                and all(type(x) is int and x > 0 for x in item)):
            raise ValueError(f"a process is not [pid, start]: {str(item)[:60]}")
        procs.append((item[0], item[1]))
    if not procs:
        raise ValueError("no process")
    whole, failed = d["whole"], d.get("failed", 0)
    if not isinstance(whole, bool) or type(failed) is not int:
        raise ValueError("whole or failed is not what it should be")
    return Parked(job, float(d["since"]), tuple(procs), float(d["at"]), whole, failed)


def _done_key(d: Any) -> Tuple[Key, str]:
    return (str(d["job"]), float(d["since"])), str(d["why"])


def load_record(state_dir: str) -> ParkRecord:
    """The record (empty when there is none); never raises. Each entry that is not whole is
    one line of :attr:`ParkRecord.problems` (and left out)."""
    rec = ParkRecord()
    entries, done = node_record.read(record_path(state_dir), VERSION, "parked", rec.problems)
    rec.parked = node_record.parse_each(entries, _parked, f"{RECORD_FILE}: parked",
                                        rec.problems)
    rec.done = dict(node_record.parse_each(done, _done_key, f"{RECORD_FILE}: done",
                                           rec.problems))
    return rec


def save_record(state_dir: str, rec: ParkRecord) -> None:
    """Replace the record atomically (root's file); OSError is the caller's to report."""
    node_record.write(record_path(state_dir), VERSION, "parked",
                      [p.to_dict() for p in rec.parked],
                      [{"job": k[0], "since": k[1], "why": why}
                       for k, why in sorted(rec.done.items())])


def quarantine(state_dir: str, now: float) -> Optional[str]:
    """Move a record that was not whole aside for a human (``parks.json.bad-<ts>``); where
    it went, or None if it could not be moved."""
    return node_record.quarantine(record_path(state_dir), now)
