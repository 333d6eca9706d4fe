"""The host rung on the node: apply each host-limit note to its training job's cgroup, and
undo it exactly when the note goes, the job ends, or its bound passes with no live monitor.

    >>> rung = HostRung(state_dir, "n1", levels, ("train",), 30, journal)   # doctest: +SKIP
    >>> rung.round(book["restraints"], NodeState(state_dir).jobs(), now)    # doctest: +SKIP
    ['job 4242: host-limit: host limit level 1 applied']

Run by the agent's restraint watch after each read of Slurm (docs/host-contention.md).
Root's record (:mod:`slurmiso.host.limit_record`) is written before a limit is applied and
read back each round, so a restarted agent undoes what an earlier one did and applies
nothing twice. A job is limited only when the hooks' record on this node says its class is a
training class, only in the cgroup :func:`~slurmiso.host.job_cgroups.job_cgroups` finds
where Slurm puts it, and only through the writers' checks (no symlink, no file outside the
host-rung set, never ``memory.max``). Each apply, end and refusal is one journal line.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import (
    TYPE_CHECKING,
    Any,
    Callable,
    Dict,
    Iterable,
    List,
    Mapping,
    Optional,
    Sequence,
    Tuple,
)

from slurmiso.agent.node_journal import say
from slurmiso.errors import HostLimitError
from slurmiso.host.cgroup_figures import CgroupVersion
from slurmiso.host.cgroup_writer import CgroupWriter, FileCgroupWriter, apply_plan, restore_plan
from slurmiso.host.job_cgroups import JobCgroup, job_cgroups
from slurmiso.host.limit_record import (
    Applied,
    HostRecord,
    dir_inodes,
    load_record,
    quarantine,
    save_record,
)
from slurmiso.host.rate_limit import LimitRequest, plan_limit, read_settings
from slurmiso.restraints import NodeRestraint, Note, RestraintStep, clear_note, node_ends
from slurmiso.sluid import is_sluid

if TYPE_CHECKING:
    from slurmiso.config.model import HostLimitLevel

log = logging.getLogger(__name__)

#: Journal events (the node's journal).
EV_APPLY = "host-limit"
EV_END = "host-limit-end"
EV_REFUSED = "host-limit-refused"
_Key = Tuple[str, float, int]


def request_for(level: HostLimitLevel) -> LimitRequest:
    """A ``monitor.ladder.host_limit.levels[i]`` (config) as the planner's request."""
    mem = level.memory_high_mb
    return LimitRequest(cpu_cores=level.cpu_cores, cpu_weight=level.cpu_weight,
                        io_weight=level.io_weight,
                        io_bps={dev: mib << 20 for dev, mib in level.io_mbps},
                        memory_high_bytes=None if mem is None else mem << 20)


def cgroup_dirs(cg: JobCgroup) -> Tuple[str, ...]:
    """The job's directories the host rung may write: v2's one, or v1's cpu and blkio."""
    if cg.version is CgroupVersion.V2:
        return (cg.v2,) if cg.v2 else ()
    v1 = cg.v1
    return tuple(d for d in ((v1.cpu, v1.blkio) if v1 else ()) if d)


def _key(note: Note, job: str) -> _Key:
    return (job, note.since, note.level)


class HostRung:
    """One node's executor of host-limit notes; :meth:`round` is one pass."""

    def __init__(self, state_dir: str, node: str, levels: Sequence[HostLimitLevel],
                 training_classes: Iterable[str], interval_s: float, journal: Any = None,
                 cgroup_root: str = "/sys/fs/cgroup", slurm: Any = None,
                 writer_for: Callable[[Iterable[str]], CgroupWriter] = FileCgroupWriter,
                 max_s: float = float("inf")) -> None:
        self.state_dir = state_dir
        #: The node's own bound (``monitor.ladder.host_limit.max``): a note's is trusted only
        #: up to it.
        self.max_s = max_s
        self.node = node
        self.levels = tuple(levels)
        self.training = frozenset(training_classes)
        self.interval_s = interval_s
        self.journal = journal
        self.cgroup_root = cgroup_root
        self.slurm = slurm
        self.writer_for = writer_for
        self.lines: List[str] = []

    # -------------------------------------------------------------------------- one round
    def round(self, book: Sequence[NodeRestraint], records: Mapping[str, Any],
              now: float) -> List[str]:
        """Undo what must end, then apply what is asked; one line per thing done."""
        self.lines = []
        rec = load_record(self.state_dir)
        sluids = {str(r.fence.get("sluid")): str(job) for job, r in records.items()
                  if is_sluid(str(getattr(r, "fence", {}).get("sluid") or ""))}
        found = job_cgroups(self.cgroup_root, self.node, sluids)
        wanted = {r.job: self._bounded(r.note, now) for r in book
                  if r.note.step is RestraintStep.HOST_LIMIT}
        if rec.problems:
            self._fail_closed(rec, wanted, now)
            return self.lines
        changed = self._end(rec, wanted, now)
        changed |= self._start(rec, wanted, records, found, now)
        live = {_key(n, j) for j, n in wanted.items()}
        gone = [k for k in rec.done if k not in live]
        for k in gone:  # the note left Slurm: nothing more to remember of it
            del rec.done[k]
        if changed or gone:
            self._save(rec)
        return self.lines

    def _bounded(self, note: Note, now: float) -> Note:
        """The note as far as the node trusts it: its bound at most the node's own, and a
        note stamped in the future (beyond a clock skew of an interval) already past it."""
        bound = min(note.max_s, self.max_s)
        if note.since > now + max(60.0, self.interval_s):
            bound = 0.0
        return note if bound == note.max_s else replace(note, max_s=bound)

    # ------------------------------------------------------------------------- the ends
    def _end(self, rec: HostRecord, wanted: Dict[str, Note], now: float) -> bool:
        keep: List[Applied] = []
        for a in rec.applied:
            note = wanted.get(a.job)
            if not self._same_cgroup(a):
                self._say(EV_END, a.job, now, True, "the job's cgroup is gone (the job "
                          "ended or was requeued): nothing to restore, record dropped",
                          level=a.level, dirs=list(a.dirs), knobs=list(a.knobs()))
                continue
            if note is None or _key(note, a.job) != a.key():
                left = self._restore(a, "its note was removed or changed (the monitor "
                                     "released it): restored", now, note)
            elif node_ends(self.state_dir, note, self.interval_s, now):
                rec.done[a.key()] = "ended at its bound by the node"
                left = self._restore(a, f"past its bound ({note.max_s:.0f}s, "
                                     f"{note.age(now):.0f}s old) with no live monitor: "
                                     "restored", now, note)
                if left is None:
                    clear_note(self.slurm, a.job)
            elif a.key() in rec.done:  # its apply failed: the originals go back until sure
                left = self._restore(a, f"{rec.done[a.key()]}: restored", now, note)
            else:
                left = a
            if left is not None:
                keep.append(left)
        changed = keep != rec.applied
        rec.applied = keep
        return changed

    @staticmethod
    def _same_cgroup(a: Applied) -> bool:
        """The directories the limit went to are still there, the very same ones (their
        inodes): decided on the record's own paths, never on whether a scan of Slurm's
        layout found the job again (a duplicate or unreadable entry there must not drop a
        limit unrestored)."""
        return dir_inodes(a.dirs) == a.inodes

    def _restore(self, a: Applied, why: str, now: float,
                 note: Optional[Note]) -> Optional[Applied]:
        """Put the job's knobs back exactly: None when done, else the entry to keep and
        retry (its first failure is journaled, each one logged)."""
        try:
            restore_plan(self.writer_for(a.dirs), a.plan())
        except HostLimitError as exc:
            log.warning("host rung: job %s: restore failed: %s", a.job, exc)
            if not a.failed:
                self._say(EV_END, a.job, now, False, f"{why} -- FAILED, kept to retry: {exc}",
                          level=a.level, knobs=list(a.knobs()), note=note)
            return replace(a, failed=a.failed + 1)
        self._say(EV_END, a.job, now, True, why, level=a.level, knobs=list(a.knobs()),
                  dirs=list(a.dirs), note=note)
        return None

    # ----------------------------------------------------------------------- the starts
    def _start(self, rec: HostRecord, wanted: Dict[str, Note], records: Mapping[str, Any],
               found: Dict[str, JobCgroup], now: float) -> bool:
        applied = {a.key() for a in rec.applied}
        busy = {a.job for a in rec.applied}  # an earlier limit not yet undone: wait for it
        changed = False
        for job, note in sorted(wanted.items()):
            key = _key(note, job)
            if key in applied or key in rec.done or job in busy:
                continue
            changed = True
            why = self._refusal(job, note, records.get(job), found.get(job), now)
            if why is None:
                why = self._apply(rec, job, note, found[job], now)
            if why is not None:
                rec.done[key] = why
                self._say(EV_REFUSED, job, now, False, why, level=note.level, note=note)
        return changed

    def _refusal(self, job: str, note: Note, record: Any, cg: Optional[JobCgroup],
                 now: float) -> Optional[str]:
        """Why this note is not applied here, or None."""
        if note.node != self.node:
            return f"its contention is on node {note.node}, not here: not applied"
        if node_ends(self.state_dir, note, self.interval_s, now):
            return "past its bound with no live monitor: not applied"
        if record is None:
            return "no slurmiso record of the job on this node: its class is unknown, so not " \
                   "limited"
        if record.job_class not in self.training:
            return f"class {record.job_class or '?'} is not a training class: never limited"
        if not 1 <= note.level <= len(self.levels):
            return (f"level {note.level} is not configured here (monitor.ladder.host_limit."
                    f"levels has {len(self.levels)})")
        if cg is None:
            return "no cgroup of the job where Slurm puts it: not limited"
        if min(cg.uid, record.uid) >= 0 and cg.uid != record.uid:
            return f"its cgroup is filed under uid {cg.uid}, its record says {record.uid}"
        return None

    def _apply(self, rec: HostRecord, job: str, note: Note, cg: JobCgroup,
               now: float) -> Optional[str]:
        """Record, then write; None when applied, else why not (nothing left changed)."""
        dirs = cgroup_dirs(cg)
        inodes = dir_inodes(dirs)
        target: Any = cg.v2 if cg.version is CgroupVersion.V2 else cg.v1
        if not dirs or inodes is None or target is None:
            return "the job's cgroup went while being read: not limited"
        plan = plan_limit(read_settings(cg.version, target), request_for(
            self.levels[note.level - 1]))
        if not plan.steps:
            return "nothing to tighten: " + "; ".join(plan.skipped)
        entry = Applied(job, note.since, note.level, dirs, inodes, plan.steps, now)
        rec.applied.append(entry)
        if not self._save(rec):  # no record, no limit: it could never be undone for sure
            rec.applied.remove(entry)
            return "the record could not be written: not limited"
        try:
            apply_plan(self.writer_for(dirs), plan)
        except HostLimitError as exc:
            # apply_plan tried to put back what it had changed; the entry stays, marked done,
            # so the next rounds restore the originals until that is sure (a write that
            # failed both ways must not be left as a limit nobody undoes)
            rec.done[entry.key()] = f"its apply failed ({exc})"
            return f"not limited: {exc}"
        self._say(EV_APPLY, job, now, True, f"host limit level {note.level} applied",
                  level=note.level, knobs=list(entry.knobs()), dirs=list(dirs), note=note,
                  writes=[[w.path, w.value] for s in plan.steps for w in s.apply],
                  skipped=list(plan.skipped))
        return None

    # ----------------------------------------------------------------------- fail closed
    def _fail_closed(self, rec: HostRecord, wanted: Dict[str, Note], now: float) -> None:
        """A record that is not whole: restore every entry that was, move the file aside for
        a human, and start a fresh record holding what could not be restored yet (retried)
        and a tombstone for every host-limit note in force: none is applied again from a
        baseline an entry lost here may still be limiting."""
        keep = [left for a in rec.applied if self._same_cgroup(a) and (left := self._restore(
            a, "the record is not whole: restored (fail closed)", now, None)) is not None]
        moved = quarantine(self.state_dir, now)
        tombstones = {_key(n, j): "the record was not whole: not applied from a baseline "
                      "that may still be limited" for j, n in wanted.items()}
        self._save(HostRecord(applied=keep, done=tombstones))
        self._say(EV_END, "", now, False, "host-limit record not whole: "
                  + "; ".join(rec.problems[:5]) + f"; moved to {moved or '(not moved)'}; "
                  "what it named and could be checked was restored")

    # ----------------------------------------------------------------------------- I/O
    def _save(self, rec: HostRecord) -> bool:
        try:
            save_record(self.state_dir, rec)
        except OSError as exc:
            log.warning("host rung: cannot write its record: %s", exc)
            return False
        return True

    def _say(self, event: str, job: str, now: float, ok: bool, why: str,
             note: Optional[Note] = None, **details: Any) -> None:
        say(self.lines, self.journal, self.node, event, job, now, ok, why, note, **details)
