"""The park rung on the node: park each park note's training job's CUDA processes (their GPU
memory to host, cuda-checkpoint), and release them when the note goes, the job ends, or its
bound passes with no live monitor.

    >>> rung = ParkRung(state_dir, "n1", ("train",), 30, journal, tool=SimTool(sim),
    ...                 processes=sim.processes)                          # doctest: +SKIP
    >>> rung.round(book["restraints"], NodeState(state_dir).jobs(), now)  # doctest: +SKIP
    ['job 4242: park: 2 CUDA processes parked']

Run by the agent's restraint watch after each read of Slurm, beside the host rung
(docs/park.md). Root's record (:mod:`slurmiso.agent.park_record`) is written before a process
is touched and read back each round, so a restarted agent releases what an earlier one
parked and parks nothing twice. All of a job's processes are parked or none
(:func:`slurmiso.gpu.park.park`); a note that cannot be parked is refused once, journaled
with its reason: the monitor falls back to suspend. A job is parked only when the hooks'
record on this node says its class is a training class, and only its processes: those whose
cgroup is the job's and whose uid is the job's user's.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence

from slurmiso.agent.node_journal import say
from slurmiso.agent.park_record import (
    Key,
    Parked,
    ParkRecord,
    load_record,
    quarantine,
    save_record,
)
from slurmiso.errors import SlurmisoError
from slurmiso.gpu.cuda_checkpoint import CheckpointTool
from slurmiso.gpu.park import park, release
from slurmiso.pids import start_ticks
from slurmiso.restraints import NodeRestraint, Note, OnBound, RestraintStep, clear_note, node_ends
from slurmiso.sluid import is_sluid, job_of_cgroup, read_cgroup

log = logging.getLogger(__name__)

#: Journal events (the node's journal).
EV_PARK = "park"
EV_END = "park-end"
EV_REFUSED = "park-refused"
#: Said on every refusal of a note this node was asked to park.
FALLBACK = "falls back to suspend"
_AT_BOUND = "ended at its bound by the node"


def _key(note: Note, job: str) -> Key:
    return (job, note.since)


class ParkRung:
    """One node's executor of park notes; :meth:`round` is one pass.

    ``tool``: cuda-checkpoint (:class:`~slurmiso.gpu.cuda_checkpoint.CliTool`, or
    :class:`~slurmiso.gpu.cuda_checkpoint.SimTool` on the simulated node); ``processes``:
    the GPU backend's compute processes (``GpuBackend.processes``); ``cgroup``, ``uid_of``
    and ``start_of`` read ``/proc`` unless given (tests)."""

    def __init__(self, state_dir: str, node: str, training_classes: Iterable[str],
                 interval_s: float, journal: Any = None, slurm: Any = None, *,
                 tool: CheckpointTool, processes: Callable[[], Iterable[Any]],
                 cgroup: Optional[Callable[[int], Optional[str]]] = None,
                 uid_of: Optional[Callable[[int], Optional[int]]] = None,
                 start_of: Callable[[int], Optional[int]] = start_ticks,
                 proc: str = "/proc") -> None:
        from slurmiso.agent.gpu_owners import pid_uid

        self.state_dir = state_dir
        self.node = node
        self.training = frozenset(training_classes)
        self.interval_s = interval_s
        self.journal = journal
        self.slurm = slurm
        self.tool = tool
        self.processes = processes
        self.cgroup = cgroup or (lambda pid: read_cgroup(pid, proc))
        self.uid_of = uid_of or (lambda pid: pid_uid(pid, proc))
        self.start_of = start_of
        self.lines: List[str] = []

    # -------------------------------------------------------------------------- one round
    def round(self, book: Sequence[NodeRestraint], records: Mapping[str, Any],
              now: float) -> List[str]:
        """Release what must end, then park what is asked; one line per thing done."""
        self.lines = []
        rec = load_record(self.state_dir)
        wanted = {r.job: self._bounded(r.note, now) for r in book
                  if r.note.step is RestraintStep.PARK}
        if rec.problems:
            self._fail_closed(rec, wanted, now)
            return self.lines
        changed = self._end(rec, wanted, now)
        changed |= self._start(rec, wanted, records, now)
        live = {_key(n, j) for j, n in wanted.items()}
        gone = [k for k in rec.done if k not in live]
        for k in gone:  # the note left Slurm: nothing more to remember of it
            del rec.done[k]
        if changed or gone:
            self._save(rec)
        return self.lines

    def _bounded(self, note: Note, now: float) -> Note:
        """A note stamped in the future (beyond a clock skew of an interval) is already past
        its bound: the node never holds a job parked on a clock it cannot trust."""
        if note.since > now + max(60.0, self.interval_s):
            return replace(note, max_s=0.0)
        return note

    def _live(self, p: Parked) -> List[int]:
        """The entry's processes still running: the same pid *and* start time."""
        return [pid for pid, start in p.procs if self.start_of(pid) == start]

    # ------------------------------------------------------------------------- the ends
    def _end(self, rec: ParkRecord, wanted: Dict[str, Note], now: float) -> bool:
        keep: List[Parked] = []
        for p in rec.parked:
            left = self._end_one(rec, p, wanted.get(p.job), now)
            if left is not None:
                keep.append(left)
        changed = keep != rec.parked
        rec.parked = keep
        return changed

    def _end_one(self, rec: ParkRecord, p: Parked, note: Optional[Note],
                 now: float) -> Optional[Parked]:
        """The entry to keep (still parked, or a release to retry), or None."""
        live = self._live(p)
        if not live:
            self._say(EV_END, p.job, now, True, "the job's processes are gone (the job ended "
                      "or was requeued): nothing to release, record dropped",
                      pids=list(p.pids()))
            return None
        if not p.whole:  # the agent stopped mid-park: never leave a job half parked
            rec.done[p.key()] = "its park was cut short"
            return self._release(p, live, "its park was cut short (the agent stopped "
                                 "mid-way): released", now, note)
        if note is None or _key(note, p.job) != p.key():
            return self._release(p, live, "its note was removed or changed (the monitor "
                                 "released it): released", now, note)
        if node_ends(self.state_dir, note, self.interval_s, now):
            rec.done[p.key()] = _AT_BOUND
            left = self._release(p, live, f"past its bound ({note.max_s:.0f}s, "
                                 f"{note.age(now):.0f}s old) with no live monitor: released",
                                 now, note)
        elif p.key() in rec.done:  # an earlier release failed: retried until sure
            left = self._release(p, live, f"{rec.done[p.key()]}: released", now, note)
        else:
            return p
        if left is None and rec.done.get(p.key()) == _AT_BOUND:
            self._after_bound(p.job, note)  # once the processes are back, however late
        return left

    def _after_bound(self, job: str, note: Note) -> None:
        """The note's own ending once the processes are back: requeue (the job checkpoints
        on the signal, which it can only do running) or nothing more; then clear the note."""
        if note.on_bound is OnBound.REQUEUE and self.slurm is not None:
            try:
                self.slurm.requeue_job(job, False)
            except SlurmisoError as exc:
                log.warning("park rung: job %s: requeue at its bound failed: %s", job, exc)
        clear_note(self.slurm, job)

    def _release(self, p: Parked, live: List[int], why: str, now: float,
                 note: Optional[Note]) -> Optional[Parked]:
        """Bring the live processes back: None when done, else the entry to keep and retry
        (its first failure is journaled, each one logged)."""
        problems = release(self.tool, live)
        if problems:
            log.warning("park rung: job %s: release failed: %s", p.job, "; ".join(problems))
            if not p.failed:
                self._say(EV_END, p.job, now, False, f"{why} -- FAILED, kept to retry: "
                          + "; ".join(problems[:5]), pids=live, note=note)
            return replace(p, failed=p.failed + 1)
        skipped = sorted(set(p.pids()) - set(live))
        self._say(EV_END, p.job, now, True, why, pids=live, skipped=skipped, note=note)
        return None

    # ----------------------------------------------------------------------- the starts
    def _start(self, rec: ParkRecord, wanted: Dict[str, Note], records: Mapping[str, Any],
               now: float) -> bool:
        held = {p.key() for p in rec.parked}
        busy = {p.job for p in rec.parked}  # an earlier park not yet released: wait for it
        changed = False
        for job, note in sorted(wanted.items()):
            key = _key(note, job)
            if key in held or key in rec.done or job in busy:
                continue
            changed = True
            why = self._refusal(note, records.get(job), now)
            if why is None:
                why = self._park(rec, job, note, records[job], now)
            if why is not None:
                rec.done[key] = why
                if note.node == self.node:
                    why = f"{why}; the monitor {FALLBACK}"
                self._say(EV_REFUSED, job, now, False, why, note=note)
        return changed

    def _refusal(self, note: Note, record: Any, now: float) -> Optional[str]:
        """Why this note is not parked here, or None."""
        if note.node != self.node:
            return f"its contention is on node {note.node}, not here: not parked"
        if node_ends(self.state_dir, note, self.interval_s, now):
            return "past its bound with no live monitor: not parked"
        if record is None:
            return "no slurmiso record of the job on this node: its class is unknown, so not " \
                   "parked"
        if record.job_class not in self.training:
            return f"class {record.job_class or '?'} is not a training class: never parked"
        return self.tool.unusable()

    def _job_pids(self, job: str, record: Any) -> List[int]:
        """The job's CUDA processes on this node, each once: in the job's cgroup (the first
        component naming a job) and, where the record knows it, run by the job's user."""
        sluids = {str(record.fence.get("sluid")): job} if is_sluid(
            str(getattr(record, "fence", {}).get("sluid") or "")) else {}
        out: List[int] = []
        for p in self.processes():
            pid = int(p.pid)
            text = self.cgroup(pid)
            if pid in out or text is None or job_of_cgroup(text, sluids) != job:
                continue
            if record.uid >= 0 and self.uid_of(pid) not in (record.uid, None):
                continue
            out.append(pid)
        return out

    def _park(self, rec: ParkRecord, job: str, note: Note, record: Any,
              now: float) -> Optional[str]:
        """Record, then park; None when parked, else why not (nothing left parked)."""
        try:
            pids = self._job_pids(job, record)
        except SlurmisoError as exc:
            return f"the GPU's processes cannot be listed: {exc}"
        if not pids:
            return "the job has no CUDA process on this node to park"
        starts = [self.start_of(pid) for pid in pids]
        if any(s is None for s in starts):
            return "a process of the job has no start time to record (it ended?): not parked"
        entry = Parked(job, note.since, tuple((pid, int(s or 0)) for pid, s in
                                              zip(pids, starts)), now)
        rec.parked.append(entry)
        if not self._save(rec):  # no record, no park: it could never be released for sure
            rec.parked.remove(entry)
            return "the record could not be written: not parked"
        out = park(self.tool, pids)
        rec.parked.remove(entry)
        if not out.ok:
            damaged = (f" (the driver could not bring back pids {list(out.damaged)})"
                       if out.damaged else "")
            self._save(rec)
            return f"not parked: {out.refused}{damaged}"
        rec.parked.append(replace(entry, whole=True))
        self._save(rec)
        self._say(EV_PARK, job, now, True, f"{len(pids)} CUDA processes parked", pids=pids,
                  note=note)
        return None

    # ----------------------------------------------------------------------- fail closed
    def _fail_closed(self, rec: ParkRecord, wanted: Dict[str, Note], now: float) -> None:
        """A record that is not whole: release every entry that was, move the file aside for
        a human, and start a fresh record holding what could not be released yet (retried)
        and a tombstone for every park note in force: none is parked again from a record
        that may have lost a park."""
        keep = []
        for p in rec.parked:
            live = self._live(p)
            left = self._release(p, live, "the park record is not whole: released (fail "
                                 "closed)", now, None) if live else None
            if left is not None:
                keep.append(left)
        moved = quarantine(self.state_dir, now)
        tombstones = {_key(n, j): "the park record was not whole: not parked"
                      for j, n in wanted.items()}
        self._save(ParkRecord(parked=keep, done=tombstones))
        self._say(EV_END, "", now, False, "park record not whole: "
                  + "; ".join(rec.problems[:5]) + f"; moved to {moved or '(not moved)'}; "
                  "what it named and could be checked was released")

    # ----------------------------------------------------------------------------- I/O
    def _save(self, rec: ParkRecord) -> bool:
        try:
            save_record(self.state_dir, rec)
        except OSError as exc:
            log.warning("park rung: cannot write its record: %s", exc)
            return False
        return True

    def _say(self, event: str, job: str, now: float, ok: bool, why: str,
             note: Optional[Note] = None, **details: Any) -> None:
        say(self.lines, self.journal, self.node, event, job, now, ok, why, note, **details)
