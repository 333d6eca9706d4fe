"""Restraints Slurm shows that the monitor does not remember: adopted, so the ladder ends them.

Each restraint the ladder takes is noted in the job's ``AdminComment``
(:mod:`slurmiso.restraints`), and the monitor's memory says what it holds. The memory can be
lost: its state file lives under ``/run`` (a reboot of the monitor's host empties it), or an
admin moves it aside. A node ends a note past its bound only while *no* monitor is alive
(``node_ends``), so a live monitor that forgot a suspend would leave that job suspended for
ever. So each cycle the monitor reads every running or suspended job's note
(:attr:`Snapshot.notes`) and takes into its memory the ones it does not hold, as they are
noted, with the GPU's rung at the noted step where the memory has none. The ladder then
releases them after their calm dwell, or keeps them where the GPU is still hot. Pure, like
the rest of :func:`~slurmiso.monitor.decide.decide`.
"""

from __future__ import annotations

import logging
from typing import List

from slurmiso.monitor.attribution import gpu_key
from slurmiso.monitor.ladder_state import HostLimited, Restraint, Rung
from slurmiso.monitor.policy import Memory
from slurmiso.monitor.snapshot import Snapshot
from slurmiso.restraints import Note, RestraintStep

log = logging.getLogger(__name__)

WHY = "noted in Slurm, not in the monitor's memory (lost, or moved aside): adopted to end it"


def adopt_notes(snap: Snapshot, mem: Memory) -> List[str]:
    """Take into ``mem`` each noted restraint of a live job that it does not hold; the jobs
    adopted. Nothing where the notes are unknown (``snap.notes`` None)."""
    if snap.notes is None:
        return []
    live = {j.id: j for j in snap.jobs}
    adopted: List[str] = []
    for job, note in sorted(snap.notes.items()):
        info = live.get(job)
        if info is None or note.node not in info.nodes or job in mem.ladder_exempt:
            continue
        if note.step is RestraintStep.HOST_LIMIT:
            if job not in mem.host_limited and job not in mem.restrained:
                mem.host_limited[job] = HostLimited(note.node, max(1, note.level), note.since,
                                                    note.gpu, note.cause, why=WHY)
                adopted.append(job)
        elif job not in mem.restrained:
            mem.restrained[job] = _restraint(note, info.state == "SUSPENDED")
            key = gpu_key(note.node, note.gpu)
            if key not in mem.ladder:  # the GPU's rung at the noted step: a breach still
                mem.ladder[key] = Rung(note.step.value, note.since, cause=note.cause,
                                       causes=(note.cause,) if note.cause else (), why=WHY)
            adopted.append(job)
    if adopted:
        log.warning("monitor: restraints noted in Slurm but not in memory, adopted to end "
                    "them: %s", ", ".join(adopted[:20]))
    return adopted


def _restraint(note: Note, suspended_now: bool) -> Restraint:
    """The restraint a note stands for. A suspend or park note's job was throttled on the way
    (the ladder's order), so it is unthrottled too (a release the program ignores if it was
    not); a suspend is owned only while Slurm shows the job suspended (else someone else
    resumed it)."""
    since = note.since
    return Restraint(note.node, note.gpu, note.cause, why=WHY, throttled_since=since,
                     suspended_since=since if note.step is RestraintStep.SUSPEND
                     and suspended_now else None,
                     parked_since=since if note.step is RestraintStep.PARK else None)
