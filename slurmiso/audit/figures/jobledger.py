"""What the audit keeps per job while more of its attempts may come, and the bounded tallies
it settles each job into.

Findings about jobs (preempted and never requeued, preempted without a checkpoint, preempted
again and again, restarted without their earlier attempts) need each job's attempts,
preemptions, class and ``Restarts`` together. Keeping those per job for the whole input
makes memory grow with the number of jobs (16 MB per million rows before this module).
But sacct lists a job's attempts together: slurmdbd orders its job query "by id_job,
time_submit desc" so that duplicates are easy to find (``as_mysql_jobacct_process.c``). So
a job's facts are kept only while it is among the last :data:`WINDOW` to :data:`WINDOW`
x 2 distinct jobs, then settled: each finding keeps a count and the first ids it shows
(:class:`Tally`), whatever the number of jobs.

An attempt of a job that already left the window (input not in sacct's order: files joined
by hand, or sorted) is counted as *late*; the ``sacct-attempts-apart`` finding names those
jobs, whose findings may then count an attempt apart. Nothing else depends on the order:
every figure but these findings is exact whatever it is.
"""

from __future__ import annotations

import bisect
from enum import Enum
from typing import Any, Dict, FrozenSet, List, Optional, Tuple

#: Distinct jobs a job's facts are kept after its last attempt (between 1x and 2x this).
WINDOW = 4096
#: Ids a finding names (the first, in natural order); the count covers them all.
SHOW = 50


class JobMark(str, Enum):
    """What a settled job counts in: one tally each."""

    NOT_REQUEUED = "not-requeued"  # preemptible, preempted, no later attempt
    NO_CHECKPOINT = "no-checkpoint"  # preemptible, preempted, never reported a checkpoint
    REPEATED = "repeated-preemption"  # preempted threshold+ times without progress
    RESTARTED = "restarted"  # sacct Restarts > 0
    MISSING = "missing-attempts"  # Restarts > 0, and no earlier attempt in the input
    LATE = "late"  # an attempt listed after the job left the window


def natural(job: str) -> Tuple[int, int, str]:
    """The order findings list job ids in: by number (``123_4``, ``123+1``: by 123)."""
    head = job.split("_")[0].split("+")[0]
    return (0, int(head), job) if head.isdecimal() else (1, 0, job)


class Tally:
    """A count of jobs and the first :data:`SHOW` distinct of them in natural order."""

    __slots__ = ("count", "ids", "_keys")

    def __init__(self) -> None:
        self.count = 0
        self.ids: List[str] = []
        self._keys: List[Tuple[int, int, str]] = []

    def add(self, job: str) -> None:
        self.count += 1
        self._keep(job)

    def _keep(self, job: str) -> None:
        key = natural(job)
        keys = self._keys
        if len(keys) >= SHOW and key >= keys[-1]:
            return
        at = bisect.bisect_left(keys, key)
        if at < len(keys) and keys[at] == key:
            return
        keys.insert(at, key)
        self.ids.insert(at, job)
        if len(keys) > SHOW:
            keys.pop()
            self.ids.pop()

    def merge(self, other: Tally) -> None:
        self.count += other.count
        for job in other.ids:
            self._keep(job)


class JobFacts:
    """One job's attempts so far, its preemptions (and the class they were in) and the
    largest ``Restarts`` seen."""

    __slots__ = ("attempts", "preemptions", "cls", "restarts")

    def __init__(self, attempts: int) -> None:
        self.attempts = attempts
        self.preemptions = 0
        self.cls = ""
        self.restarts = 0


#: A job in the window: None until one of its facts is worth keeping.
_Entry = Optional[JobFacts]


class Rules:
    """What a preempted job is judged by: the config's and the journals' terms."""

    def __init__(self, preemptible: FrozenSet[str], threshold: int, digest: Any) -> None:
        self.preemptible = preemptible
        self.threshold = threshold
        self.digest = digest

    def marks(self, job: str, facts: JobFacts) -> List[JobMark]:
        out: List[JobMark] = []
        digest = self.digest
        if facts.preemptions:
            preemptible = facts.cls in self.preemptible
            requeued = facts.attempts > facts.preemptions or job in digest.requeued_jobs
            if preemptible and not requeued:
                out.append(JobMark.NOT_REQUEUED)
            if digest.records and preemptible and job not in digest.checkpointing_jobs:
                out.append(JobMark.NO_CHECKPOINT)
            if (digest.records and facts.preemptions >= self.threshold
                    and not digest.made_progress(job)):
                out.append(JobMark.REPEATED)
        if facts.restarts > 0:
            out.append(JobMark.RESTARTED)
            if facts.attempts <= 1:
                out.append(JobMark.MISSING)
        return out


class JobLedger:
    """The window of recent jobs (two generations of dicts, swapped at batch ends) and the
    tallies of the jobs settled out of it. Pickled (a part of a parallel fold), it carries
    its tallies only, every job settled first."""

    def __init__(self, rules: Optional[Rules] = None, window: int = WINDOW) -> None:
        self.rules = rules
        self.window = window
        #: job -> facts, of the jobs met since the last swap; then of those before it
        self.young: Dict[str, _Entry] = {}
        self.old: Dict[str, _Entry] = {}
        self.tallies: Dict[JobMark, Tally] = {mark: Tally() for mark in JobMark}

    def __getstate__(self) -> Dict[str, Any]:
        self.finish()
        return {"window": self.window, "tallies": self.tallies}

    def __setstate__(self, state: Dict[str, Any]) -> None:
        self.__init__(None, state["window"])  # type: ignore[misc]
        self.tallies = state["tallies"]

    def facts(self, job: str) -> JobFacts:
        """The job's facts, made where it had none worth keeping (it is in the window: the
        kernel met it first)."""
        young = self.young
        entry = young.get(job)
        if entry is None:
            entry = self.old.pop(job, None)  # settled from one generation only
            if entry is None:
                entry = JobFacts(1)
            young[job] = entry
        return entry

    def peek(self, job: str) -> Optional[JobFacts]:
        entry = self.young.get(job)
        return entry if entry is not None else self.old.get(job)

    def again(self, job: str) -> JobFacts:
        """Another attempt of a job met before: counted, or counted late where the job has
        left the window."""
        if job in self.young or job in self.old:
            facts = self.facts(job)
            facts.attempts += 1
            return facts
        self.tallies[JobMark.LATE].add(job)
        facts = self.young[job] = JobFacts(2)  # at least its second attempt
        return facts

    def tick(self) -> None:
        """At a batch's end: once the young generation is full, settle the old one."""
        if len(self.young) >= self.window:
            self._settle(self.old)
            self.old, self.young = self.young, {}

    def finish(self) -> Dict[JobMark, Tally]:
        """Settle every job still in the window; the tallies."""
        for generation in (self.old, self.young):
            self._settle(generation)
            generation.clear()
        return self.tallies

    def _settle(self, generation: Dict[str, _Entry]) -> None:
        rules, tallies = self.rules, self.tallies
        if rules is None:
            return
        for job, facts in generation.items():
            if facts is not None:
                for mark in rules.marks(job, facts):
                    tallies[mark].add(job)

    def merge(self, other: JobLedger) -> None:
        """Add the tallies of a part that follows (its jobs are not this one's)."""
        self.finish()
        for mark, tally in other.finish().items():
            self.tallies[mark].merge(tally)

