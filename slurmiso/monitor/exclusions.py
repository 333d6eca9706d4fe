"""nodes admission (pure): each pending training job's ExcNodeList is its own plus the
blocked (hot or unknown) nodes of its partitions, with a comment a user can read; restored
when they calm. The record of what was set stays until Slurm shows the job's own list back,
so a failed or cut-short restore is retried, never taken for someone else's change.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any, Dict, FrozenSet, List, Optional, Set, Tuple

from slurmiso.hostlist import compress, expand
from slurmiso.monitor.action import Action, ActionKind
from slurmiso.monitor.policy import Memory
from slurmiso.monitor.snapshot import JobInfo, Snapshot

#: What the monitor's own waiting note starts with (``exclusions`` writes it; a job's own
#: comment is never replaced or removed).
NOTE_PREFIX = "slurmiso:"


def comment_is_free(comment: Optional[str]) -> bool:
    """Whether the monitor may write its note into a job's comment: it is empty, or a note of
    the monitor's own (a comment the user or an admin wrote is never replaced, nor one that
    could not be read: None)."""
    return comment is not None and (not comment or comment.startswith(NOTE_PREFIX))


def note_is_ours(comment: Optional[str]) -> bool:
    """Whether a job's comment is the monitor's own note, which it removes when the note no
    longer holds (an unread comment, None, is never removed)."""
    return comment is not None and comment.startswith(NOTE_PREFIX)


@lru_cache(maxsize=4096)
def nodeset(expr: str) -> FrozenSet[str]:
    expr = expr.strip()
    if not expr or expr in ("(null)", "N/A"):
        return frozenset()
    try:
        return frozenset(expand(expr))
    except Exception:  # noqa: BLE001 - a list we cannot read is one we must not rewrite
        return frozenset({expr})


def members(snap: Snapshot, parts: Tuple[str, ...],
            cache: Dict[Tuple[str, ...], FrozenSet[str]]) -> FrozenSet[str]:
    """The nodes of a set of partitions (cached per set: 20,000 jobs share a few)."""
    if parts not in cache:
        cache[parts] = frozenset(n for p in parts for n in snap.partitions.get(p, ()))
    return cache[parts]


def exclusions(snap: Snapshot, mem: Memory, waiting: List[JobInfo], overridden: Set[str],
                blocked: Dict[str, str], cache: Dict[Tuple[str, ...], FrozenSet[str]],
                ) -> List[Action]:
    """nodes admission: each pending training job's ExcNodeList = its own + the blocked
    nodes of its partitions, with a comment a user can read; restored when they calm."""
    actions = []
    per_parts: Dict[Tuple[str, ...], Tuple[FrozenSet[str], str, str]] = {}
    shared: Dict[Tuple[Any, ...], Tuple[str, Dict[str, Any], Dict[str, Any]]] = {}
    for job in waiting:
        if job.id in overridden:
            continue
        rec = mem.excluded.get(job.id)
        if rec is not None and job.exc_nodes != rec["set"] and \
                nodeset(job.exc_nodes) != nodeset(rec["set"]):
            del mem.excluded[job.id]  # someone else changed it: theirs from now on
            overridden.add(job.id)
            continue
        if job.partitions not in per_parts:
            bad = frozenset(n for n in members(snap, job.partitions, cache) if n in blocked)
            text = bad_str = ""
            if bad:
                bad_str = compress(sorted(bad))
                first = sorted(bad)[0]
                text = (f"slurmiso: waits for calm GPUs; kept off {bad_str} "
                        f"while inference needs them ({blocked[first]})")[:250]
            per_parts[job.partitions] = (bad, text, bad_str)
        bad, text, bad_str = per_parts[job.partitions]
        user = rec["user"] if rec else job.exc_nodes
        if not user and job.exc_nodes == bad_str:
            if not bad:
                mem.excluded.pop(job.id, None)
            continue  # already as wanted (the common case: one string compare)
        want = bad | nodeset(user) if user else bad
        if want == nodeset(job.exc_nodes):
            if not bad and rec is not None:
                del mem.excluded[job.id]
            continue
        if not bad and rec is None:
            continue
        want_str = (bad_str if not user else compress(sorted(want))) if bad else user
        own_comment = rec["comment"] if rec else job.comment
        comment: Optional[str] = None
        if comment_is_free(own_comment):
            comment = text if bad else ""
        # The record stays until Slurm shows the job's own list back (a restore that fails
        # or is cut short by a crash is retried, never taken for someone else's change).
        # Records and details are read-only once made: jobs alike share one of each.
        key = (job.partitions, want_str, rec["set"] if rec else None, user, own_comment)
        if key not in shared:
            reason = (text or "kept off hot nodes") if bad else \
                "its nodes are calm again: own exclusions restored"
            shared[key] = (reason, {"set": want_str, "user": user, "comment": own_comment},
                           {"nodes": want_str, "comment": comment,
                            "partition": ",".join(job.partitions), "previous": key[2],
                            "user": user, "own_comment": own_comment})
        reason, record, details = shared[key]
        mem.excluded[job.id] = record
        actions.append(Action(ActionKind.EXCLUDE, job.id, reason, details))
    return actions


def forget_started(snap: Snapshot, mem: Memory) -> List[Action]:
    """Drop the records of excluded jobs that are no longer pending (started, ended,
    cancelled): nothing is restored on a job that runs, and a daemon that runs for months
    must not keep one record per job it ever excluded. A job that started with the
    monitor's waiting note still in its comment gets the note removed, so ``squeue`` never
    shows a running job as waiting for calm GPUs (measured: Slurm clears a running job's
    comment with ``Comment=`` but refuses any ``ExcNodeList`` change once it runs)."""
    if not mem.excluded:
        return []
    jobs = {j.id: j for j in snap.jobs}
    actions = []
    for jid in list(mem.excluded):
        job = jobs.get(jid)
        if job is not None and job.pending:
            continue
        del mem.excluded[jid]
        if job is not None and job.comment is not None and note_is_ours(job.comment):
            actions.append(Action(ActionKind.UNCOMMENT, jid,
                                  "started: the monitor's waiting note is removed",
                                  {"comment": job.comment[:250]}))
    return actions
