"""Slurm's text output read so that no field a job's user writes can make, move or hide a row.

Slurm accepts any byte but NUL in a job's comment, name, work directory and output paths, a
newline and ``|`` included, and prints them raw in ``squeue -o``, ``sacct -P`` and ``scontrol
show ... -o``. A reader that takes lines for rows then takes a comment for another job's row:
another user's suspended job read as running, a held job's owner lost, another job's comment
wiped (issue #33). The rules every reader of Slurm's text keeps, here once:

- a query that decides anything asks only for fields Slurm or an admin makes (states, ids,
  partition, QoS, account, node and GRES names Slurm validated, times, counts), so a row is
  one line whatever a user wrote;
- a user's field, when one is needed (the job's comment, for the monitor's note), comes in a
  query of its own, keyed by job id (:func:`comment_rows`), and is applied only to jobs the
  first query listed: a comment that forges a row leaves that job's comment, and the
  forger's, *unread* (``None``), never someone else's state or comment;
- rows are split on ``\\n`` alone (``str.splitlines`` also splits on ``\\r``, ``\\x1c``-``\\x1e``,
  ``\\x85`` and ``\\u2028``, which Slurm prints inside a field);
- a row whose job id is not Slurm's spelling (:data:`JOB_ID`) or whose field count is wrong is
  rejected, and a job id listed twice is rejected both times (which of two rows is Slurm's
  cannot be told); each is counted (:class:`RowCounts`) and logged at WARNING.

``--json`` would escape every field, but at the monitor's scale (60,000 jobs a cycle) it is
about 200 MB a read (3.4 KB a job from ``squeue --json`` on 22.05.8, which has it too), and
its schema differs in each release's data_parser; a query with no user field needs no
escaping.
"""

from __future__ import annotations

import logging
import re
from typing import Dict, Iterable, List, Mapping, Optional, Pattern, Sequence, Set

log = logging.getLogger(__name__)

#: A job id as squeue's ``%i``/``%A`` prints it: ``123``, an array task ``123_4``, a pending
#: array's tasks ``123_[5-9%2]`` (one record until they start; a long task list is cut with
#: ``...`` and, past 32 characters, loses its ``]``: src/squeue/print.c
#: ``_print_job_job_id``, src/common/slurm_protocol_defs.c, slurm-26-05-3-1), a
#: heterogeneous job's component ``123+1``.
JOB_ID = re.compile(r"[0-9]+(?:_[0-9]+|_\[[0-9,%:.-]+\]?|\+[0-9]+)?")
#: squeue's spelling of a job state (``%T``) and of a count (``%Q``, ``%D``).
STATE = re.compile(r"[A-Z_]+")
COUNT = re.compile(r"[0-9]+")
#: What squeue prints for a string field Slurm has no value for.
NO_VALUE = ("(null)", "N/A")
#: ... for a job with no comment (``printf("%s", NULL)``); "N/A" there is the user's.
NO_COMMENT = "(null)"
_SAMPLES = 3


def valid_job_id(text: str) -> bool:
    """Whether ``text`` is a job id as Slurm prints one (nothing before or after it)."""
    return JOB_ID.fullmatch(text) is not None


def lines_of(text: str) -> List[str]:
    """Slurm's output as rows: split on ``\\n`` only, the last line end dropped."""
    if not text:
        return []
    return (text[:-1] if text.endswith("\n") else text).split("\n")


class RowCounts:
    """Rows a reader rejected, by why, with a few samples for the log."""

    __slots__ = ("what", "malformed", "duplicate", "unread", "samples")

    def __init__(self, what: str) -> None:
        self.what = what  # the query, in words ("squeue", "squeue comments")
        self.malformed = 0
        self.duplicate = 0
        self.unread = 0  # jobs whose user field could not be told apart from a forged row
        self.samples: List[str] = []

    def reject(self, kind: str, line: str) -> None:
        setattr(self, kind, getattr(self, kind) + 1)
        if len(self.samples) < _SAMPLES:
            self.samples.append(f"{kind}: {line[:80]!r}")

    def unknown(self, source: str = "slurm") -> Dict[str, int]:
        """``source/reason`` -> count, as the monitor's snapshot counts unknown signals."""
        out = {f"{source}/{k}": getattr(self, k) for k in ("malformed", "duplicate", "unread")}
        return {k: n for k, n in out.items() if n}

    def merge(self, other: RowCounts) -> None:
        self.malformed += other.malformed
        self.duplicate += other.duplicate
        self.unread += other.unread
        self.samples.extend(other.samples[: max(0, _SAMPLES - len(self.samples))])

    def log(self) -> None:
        """One WARNING when anything was rejected: a forged row is an attack, a malformed one
        a Slurm this reader does not know."""
        if self.malformed or self.duplicate or self.unread:
            log.warning("%s: rejected %d malformed row(s) and %d row(s) of an id listed "
                        "twice; %d user field(s) left unread (%s)", self.what,
                        self.malformed, self.duplicate, self.unread, "; ".join(self.samples))


def job_rows(text: str, fields: Sequence[str], counts: RowCounts, free_last: bool = False,
             shapes: Optional[Mapping[str, Pattern[str]]] = None,
             ) -> Dict[str, Dict[str, str]]:
    """Rows of ``squeue -h -o "%i|..."`` output (the job id first) as job id -> field -> value,
    in Slurm's order. ``free_last``: the last field may hold ``|`` (a reason an admin wrote);
    ``shapes``: field -> what Slurm prints there (a state word, a number), so a ``|`` where
    none was expected, which would shift the fields after it, is a malformed row. Rows of a
    bad id, field count or shape, and every row of an id listed twice, are left out and
    counted."""
    n = len(fields)
    checks = [(fields.index(f), p) for f, p in (shapes or {}).items()]
    rows: Dict[str, Dict[str, str]] = {}
    twice: Set[str] = set()
    for line in lines_of(text):
        parts = line.split("|", n - 1) if free_last else line.split("|")
        jid = parts[0]
        if (len(parts) != n or not valid_job_id(jid)
                or any(p.fullmatch(parts[i].strip()) is None for i, p in checks)):
            counts.reject("malformed", line)
            continue
        if jid in rows or jid in twice:
            counts.reject("duplicate", line)
            if rows.pop(jid, None) is not None:
                counts.duplicate += 1  # the first row of that id is rejected too
            twice.add(jid)
            continue
        rows[jid] = dict(zip(fields, (p.strip() for p in parts)))
    return rows


#: ``squeue -o`` of the comment query: the id twice, so that a line of a comment is taken for
#: a row only when it was written to look like one (then its job's comment is unread).
COMMENT_FORMAT = "%i|%i|%k"
_COMMENT_ROW = re.compile(r"([^|\n]*)\|\1\|")


def comment_rows(text: str, wanted: Iterable[str], counts: RowCounts
                 ) -> Dict[str, Optional[str]]:
    """Each wanted job's comment from ``squeue -o COMMENT_FORMAT`` output, run after the query
    that listed the wanted jobs, with the same states.

    A line that does not start a row continues the comment before it (a comment with a
    newline). A row is believed only for a wanted job listed once: a job whose row appears
    twice (a comment wrote one for it) is unread, and so is every job whose comment a row
    of a job listed twice or of a job not wanted came right after (where a forged row
    begins, the comment it is written in was cut). A job not wanted may be real (submitted
    between the two queries): its row only costs the job before it its comment this cycle.
    Unread is ``None``: never taken for empty or for the monitor's own note. A wanted job
    with no row (it ended between the queries) is unread too; one that ended and whose only
    row a comment forged reads that text, which can only move the monitor to act on a job
    that has ended (Slurm refuses). Slurm's "no comment" (``(null)``) reads as ``""``.
    """
    want = set(wanted)
    parts: Dict[str, List[str]] = {}
    after: Dict[str, str] = {}  # job -> the job whose row came just before its first row
    unread: Set[str] = set()
    current: Optional[List[str]] = None
    before = ""  # the job whose comment the next line may continue
    for line in lines_of(text):
        m = _COMMENT_ROW.match(line)
        jid = m.group(1) if m else ""
        if m is None or not valid_job_id(jid):
            if current is None:
                counts.reject("malformed", line)
            else:
                current.append(line)
            continue
        current = [line[m.end():]]
        if jid in parts:
            counts.reject("duplicate", line)
            unread.update((jid, before, after[jid]))
        else:
            parts[jid] = current
            after[jid] = before
            if jid not in want:
                unread.add(before)
        before = jid
    out: Dict[str, Optional[str]] = {}
    for jid in want:
        got = parts.get(jid)
        if got is None or jid in unread:
            out[jid] = None
            counts.unread += 1
            continue
        comment = "\n".join(got)
        out[jid] = "" if comment == NO_COMMENT else comment
    return out


def split_kv_line(line: str) -> Dict[str, str]:
    """``scontrol show node|partition -o`` text: ``Key=Value Key2=Value two`` -> fields.
    Values may hold spaces, so a token ``Key=`` starts a field; a key seen before starts
    none: its token is text of the value before it. Slurm prints each key once, and free
    text (a node's ``Reason``, ``Comment``, ``Extra``) after the keys that decide anything, so
    a reason ``x State=IDLE NodeAddr=evil`` changes neither ``State`` nor ``NodeAddr``."""
    out: Dict[str, str] = {}
    key: Optional[str] = None
    for token in line.strip().split(" "):
        name, sep, value = token.partition("=")
        if sep and name not in out and name.replace("/", "").replace(":", "").isalnum():
            key = name
            out[key] = value
        elif key is not None:
            out[key] += " " + token
    return out
