"""Streaming parsers for ``sacct -P`` and ``sacct --json`` output.

Both yield one :class:`AcctRecord` per job *allocation* (one per attempt when ``-D`` shows
requeued attempts); job steps (``.batch``, ``.extern``, ``.0``) are folded into the record of
their job, because the audit counts jobs, not steps. Nothing is kept beyond the record being
built, so a million jobs never sit in memory.

Slurm versions differ and both parsers take what each gives:

- ``AllocTRES``: ``gres/gpu=2`` (22.05) or ``gres/gpu:a100=2,gres/gpu=2`` (24.11 adds typed
  entries); the untyped count wins, typed ones are summed when it is absent.
- ``--json`` (:mod:`slurmiso.audit.read.sacct_json`): the schema changes with ``data_parser``.
- ids: arrays ``123_4`` (pending ``123_[5-9]``), heterogeneous ``123+1`` (folded into ``123``).

Bad input never raises mid-stream: torn or garbage lines are skipped and counted in
:class:`ParseStats`, which the report shows. Only input with no usable header, or nothing
parseable at all, raises :class:`AuditInputError`.
"""

from __future__ import annotations

import itertools
import logging
import re
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterable, Iterator, List, NamedTuple, Optional, Tuple

from slurmiso.errors import UsageError

log = logging.getLogger(__name__)

#: ``sacct --format`` the audit asks for (and ``--help`` prints). ``-P`` output with a header.
SACCT_FIELDS: Tuple[str, ...] = (
    "JobID",
    "JobName",
    "User",
    "Account",
    "Partition",
    "QOS",
    "State",
    "Submit",
    "Eligible",
    "Start",
    "End",
    "ElapsedRaw",
    "TimelimitRaw",
    "AllocTRES",
    "NodeList",
    "TRESUsageInAve",
    "TRESUsageInTot",
    "Restarts",
)
#: The audit's ``--format`` before ``TRESUsageInTot`` and ``Restarts`` were added: a file saved
#: without a header in that order is still read.
LEGACY_FIELDS: Tuple[str, ...] = SACCT_FIELDS[:16]
#: sacct fields whose text the job's user writes (``-J``, ``--comment``, ``-D``, the command
#: line, ``-o``/``-e``/``-i``, ``--extra``, ``--container``). ``sacct -P`` prints them raw: a
#: newline in one ends the line, and what follows it reads as rows sacct never printed
#: (measured on 22.05.8: ``-J $'name\nwith|bar'`` printed ``4|name`` and ``with|bar|root|...``
#: as two lines). No live query asks for one; a saved file that holds one is flagged when a
#: line broke (``sacct-forgeable-rows``).
USER_FIELDS = frozenset({"JobName", "Comment", "WorkDir", "SubmitLine", "StdOut", "StdErr",
                         "StdIn", "Extra", "Container"})
#: What the live query asks for: the audit's fields less those a user writes (the audit reads
#: no figure from them).
LIVE_FIELDS: Tuple[str, ...] = tuple(f for f in SACCT_FIELDS if f not in USER_FIELDS)
#: Without these a record means nothing to the audit.
REQUIRED_FIELDS = ("JobID", "State")
#: Other fields sacct prints that we accept quietly (people pass ``--format`` of their own).
_TOLERATED = {"JobIDRaw", "Elapsed", "Timelimit", "ExitCode", "Flags", "Reason", "NNodes",
              "AllocCPUS", "ReqTRES", "Cluster", "UID", "Group", "WorkDir",
              "ReqCPUS", "ReqMem", "NCPUS", "AveCPU", "MaxRSS", "MaxVMSize", "CPUTimeRaw",
              "TotalCPU", "DerivedExitCode", "Priority", "Constraints", "ReqNodes",
              "TRESUsageInMax", "Comment", "Reservation", "SubmitLine", "StdOut", "StdErr",
              "StdIn", "Extra", "Container"}
_MAX_BAD_SAMPLES = 5


class AuditInputError(UsageError):
    """Input the audit cannot use at all (no header, not sacct output, unreadable file)."""

    kind = "audit-input"


class AcctRecord(NamedTuple):
    """One job allocation (one attempt) as the audit needs it. Times are Unix seconds."""

    job: str  # job id with array task (``123_4``); het components folded to the leader
    name: str
    user: str
    account: str
    partition: str
    qos: str
    state: str  # first word, upper case: ``CANCELLED by 0`` -> ``CANCELLED``
    submit: Optional[float]
    eligible: Optional[float]
    start: Optional[float]
    end: Optional[float]
    elapsed: float  # seconds the attempt ran
    timelimit_s: Optional[int]
    gpus: float  # whole GPUs (gres/gpu)
    mps: int  # gres/mps units
    shards: int  # gres/shard units
    nodes: str
    gpu_util: Optional[float] = None  # max over steps of gres/gpuutil (%), when accounted
    steps: int = 0
    component: int = 0  # het job component offset (``123+1`` -> 1): part of the leader's run
    restarts: int = 0  # sacct ``Restarts``: times this job was requeued before this record
    gpu_mem: Optional[float] = None  # max over steps of gres/gpumem (bytes), when accounted


@dataclass
class ParseStats:
    """What the parser met besides good records; the report prints it under "inputs"."""

    source: str = ""
    format: str = ""
    lines: int = 0
    records: int = 0
    steps: int = 0
    orphan_steps: int = 0
    bad: int = 0
    bad_samples: List[str] = field(default_factory=list)
    unknown_fields: List[str] = field(default_factory=list)
    truncated: bool = False
    slurm_version: str = ""
    fields: List[str] = field(default_factory=list)  # the -P header, when there was one

    def bad_line(self, where: str, why: str) -> None:
        self.bad += 1
        if len(self.bad_samples) < _MAX_BAD_SAMPLES:
            self.bad_samples.append(f"{where}: {why}")

    def to_dict(self) -> Dict[str, Any]:
        return dict(self.__dict__)

    def merge(self, other: ParseStats) -> None:
        """Add the counts of the input that follows (:mod:`slurmiso.audit.read.parallel`, which
        sets ``lines`` and the header's fields itself); samples stay in input order."""
        self.records += other.records
        self.steps += other.steps
        self.orphan_steps += other.orphan_steps
        self.bad += other.bad
        room = _MAX_BAD_SAMPLES - len(self.bad_samples)
        if room > 0:
            self.bad_samples.extend(other.bad_samples[:room])
        self.truncated = self.truncated or other.truncated


# -- shared value parsing -----------------------------------------------------------------

_hour_cache: Dict[str, float] = {}
#: ``:MM:SS`` -> seconds into the hour: a stamp whose hour is cached is that hour's base plus
#: these, the same whole seconds (and so the same float) ``parse_time`` adds
_TWO = [f"{n:02d}" for n in range(60)]
_MMSS = {":" + m + ":" + s: i * 60 + j for i, m in enumerate(_TWO) for j, s in enumerate(_TWO)}


def parse_time(text: str) -> Optional[float]:
    """``2024-05-01T12:34:56`` (sacct's local time) -> Unix seconds; ``Unknown``/``None`` -> None.

    ``time.mktime`` runs once per distinct hour (cached), the rest is arithmetic: strptime per
    field would dominate the parse of a million records.
    """
    if len(text) < 19 or text[10] != "T":
        return None
    base = _hour_cache.get(text[:13])
    if base is None:
        try:
            tm = time.strptime(text[:13], "%Y-%m-%dT%H")
        except ValueError:
            return None
        base = time.mktime(tm)
        if len(_hour_cache) > 100_000:
            _hour_cache.clear()
        _hour_cache[text[:13]] = base
    try:
        return base + int(text[14:16]) * 60 + int(text[17:19])
    except ValueError:
        return None


def parse_tres(text: str) -> Tuple[float, int, int]:
    """(gpus, mps units, shard units) from an ``AllocTRES`` string."""
    if "gres/" not in text:
        return 0.0, 0, 0
    gpu: Optional[float] = None
    typed = 0.0
    mps = shards = 0
    for item in text.split(","):
        if not item.startswith("gres/"):
            continue
        key, _, value = item.partition("=")
        try:
            count = float(value)
        except ValueError:
            continue
        name = key[5:]
        if name == "gpu":
            gpu = count
        elif name.startswith("gpu:"):
            typed += count
        elif name.split(":", 1)[0] == "mps":
            mps += int(count)
        elif name.split(":", 1)[0] == "shard":
            shards += int(count)
    return (gpu if gpu is not None else typed), mps, shards


def gpu_usage(text: str) -> Tuple[Optional[float], Optional[float]]:
    """(``gres/gpuutil`` %, ``gres/gpumem`` bytes) from a ``TRESUsageIn*`` string; None where
    Slurm did not account it (``AccountingStorageTRES`` without ``gres/gpu``, or MIG)."""
    if "gres/gpu" not in text:
        return None, None
    util = mem = None
    for kind, value in _GPU_USAGE.findall(text):  # a repeated item: the last one counts
        if kind == "util":
            util = tres_number(value)
        else:
            mem = tres_number(value)
    return util, mem


#: The two GPU items of a ``TRESUsageIn*`` string (``a=1,gres/gpuutil=73,gres/gpumem=1G``).
_GPU_USAGE = re.compile(r"(?:^|,)gres/gpu(util|mem)=([^,]*)")


def row_usage(ave: str, tot: str) -> Tuple[Optional[float], Optional[float]]:
    """A job row's own (``gres/gpuutil``, ``gres/gpumem``): from ``TRESUsageInAve``, else
    from ``TRESUsageInTot`` (where Ave is empty, or names neither)."""
    util = mem = None
    usage = ave or tot
    if usage and "gres/gpu" in usage:
        util, mem = gpu_usage(usage)
        if util is None and mem is None and tot:
            util, mem = gpu_usage(tot)
    elif not ave and tot and "gres/gpu" in tot:
        util, mem = gpu_usage(tot)
    return util, mem


def tres_number(text: str) -> Optional[float]:
    """A TRES count; sacct may print memory with a unit suffix (``1.50G``)."""
    if text[-1:].isdigit():
        try:
            return float(text)
        except ValueError:
            return None
    scale = {"K": 1024.0, "M": 1024.0 ** 2, "G": 1024.0 ** 3, "T": 1024.0 ** 4}.get(text[-1:])
    try:
        return float(text[:-1]) * scale if scale else None
    except ValueError:
        return None


#: Every value sacct prints for a time that has not happened (or is not known).
NO_TIME = frozenset(("", "Unknown", "None", "N/A"))
#: sacct times are whole seconds: allow this much disagreement between its own figures.
SLACK_S = 2.0


def problem(rec: AcctRecord) -> Optional[str]:
    """Why ``rec`` cannot be summed (negative or inconsistent durations), or None.

    Shared by both parsers: a record that fails here is counted bad, sampled and left out of
    every sum, never clamped to zero.
    """
    if rec.elapsed < 0:
        return f"negative ElapsedRaw {rec.elapsed:g}"
    if rec.gpus < 0 or rec.mps < 0 or rec.shards < 0:
        return "negative GPU count in AllocTRES"
    if rec.start is not None and rec.end is not None:
        if rec.end < rec.start:
            return "End before Start"
        if rec.elapsed > rec.end - rec.start + SLACK_S:
            return f"ElapsedRaw {rec.elapsed:g} longer than End-Start {rec.end - rec.start:g}"
    since = rec.eligible if rec.eligible is not None else rec.submit
    ran = rec.nodes != "None assigned"  # 22.05: a requeue cancelled while pending has Start=End
    if ran and rec.start is not None and since is not None and rec.start < since - SLACK_S:
        return "Start before Eligible/Submit (negative wait)"
    if rec.restarts < 0:
        return "negative Restarts"
    return None


def job_key(job_id: str) -> Tuple[str, str]:
    """(job key, step) from a sacct JobID: ``123+1.batch`` -> (``123``, ``batch``)."""
    base, _, step = job_id.partition(".")
    if "+" in base:
        base = base.split("+", 1)[0]
    return base, step


def het_offset(job_id: str) -> int:
    at = job_id.find("+")
    if at < 0:
        return 0
    digits = job_id[at + 1 :].split(".", 1)[0]
    return int(digits) if digits.isdecimal() else 0


def checked_record(
    make: Callable[[List[str], str], AcctRecord], parts: List[str], job_id: str,
) -> Tuple[str, Optional[AcctRecord], Optional[str]]:
    """(job key, record, why it is a bad row or None) for one job row's fields: the one check
    every reader of ``-P`` rows applies."""
    key = job_id.split("+", 1)[0] if "+" in job_id else job_id
    try:
        record = make(parts, key)
        if "+" in job_id:
            record = record._replace(component=het_offset(job_id))
        return key, record, problem(record)
    except (ValueError, IndexError) as exc:
        return key, None, str(exc)


def state_word(text: str) -> str:
    return text.split(" ", 1)[0].upper() if text else "UNKNOWN"


def _int(text: str) -> Optional[int]:
    try:
        return int(text)
    except ValueError:
        return None


# -- sacct -P ----------------------------------------------------------------------------


def detect_format(head: str) -> str:
    """``json`` or ``parsable`` from the first characters of a sacct output."""
    return "json" if head.lstrip()[:1] in ("{", "[") else "parsable"


def fold_parsable(lines: Iterable[str], stats: ParseStats, agg: Any) -> None:
    """Fold ``sacct -P`` output (header first) into the aggregator ``agg``, one record at
    a time as :func:`parse_parsable` streams them: memory holds one job's rows."""
    agg.add_all(parse_parsable(lines, stats))


def parse_parsable(lines: Iterable[str], stats: ParseStats) -> Iterator[AcctRecord]:
    """Records from ``sacct -P`` (``--parsable2``) output with its header line, streamed:
    a job's record is yielded once its steps (the rows that follow it) are read."""
    stats.format = stats.format or "parsable"
    it = iter(lines)
    head_lines, header, idx, first = _header(it, stats)
    if first is not None:  # no header line (sacct -n): the first line is already data
        head_lines -= 1
        it = itertools.chain((first,), it)
    make = record_maker(idx, len(header))
    i_job = idx["JobID"]
    ave, tot = idx.get("TRESUsageInAve", -1), idx.get("TRESUsageInTot", -1)
    job: Optional[_Job] = None  # the job whose steps may follow
    steps = 0
    for number, parts in _rows(it, head_lines, idx, len(header), stats):
        job_id = parts[i_job]
        dot = job_id.find(".")
        if dot >= 0:  # a step: fold its GPU usage into its job
            if job is not None and job.key == job_id[:dot].split("+", 1)[0]:
                job.step(parts, ave, tot)
                steps += 1
            else:
                stats.orphan_steps += 1
            continue
        parts.append("")  # what a field the header lacks reads (see record_maker)
        key, record, why = checked_record(make, parts, job_id)
        if why is not None:
            stats.bad_line(f"line {number} (job {job_id})", why)
        if job is not None:
            stats.records += 1
            yield job.done()
        job = None if record is None or why is not None else _Job(record, key)
    if job is not None:
        stats.records += 1
        yield job.done()
    stats.steps += steps


def _header(it: Iterator[str], stats: ParseStats) -> Tuple[int, List[str], Dict[str, int],
                                                          Optional[str]]:
    """(lines read, header, column index, the first line where it is data: ``sacct -n``);
    :class:`AuditInputError` where there is no line but blank ones."""
    number = 0
    for line in it:
        number += 1
        text = line.rstrip("\r\n")
        if not text or text.isspace():
            continue
        bom = text.startswith("\ufeff")  # a BOM from an editor or Windows tool
        parts = (text[1:] if bom else text).split("|")
        header, idx = read_header(parts, stats)
        return number, header, idx, (None if "JobID" in parts else line[1:] if bom else line)
    stats.lines = number
    raise AuditInputError(f"{stats.source or 'sacct output'}: empty, no header line found")


def _rows(it: Iterator[str], after: int, idx: Dict[str, int], ncol: int,
          stats: ParseStats) -> Iterator[Tuple[int, List[str]]]:
    """(line number, fields) of each row after line ``after``, fitted to the header's
    ``ncol`` columns; blank lines skipped, rows past repair counted (``fitted_row``)."""
    # split a row only as far as the last column read where the header has them all: the
    # rest stays one string (14 fewer a row of a 32-column dump), whose bars say the row
    # has every column (else it is split whole and checked)
    read = [idx.get(name, ncol) for name in SACCT_FIELDS]
    upto = max(read) + 1 if max(read) < ncol - 2 else 0
    rest = ncol - 1 - upto
    number = after
    for number, line in enumerate(it, after + 1):
        complete = line[-1:] == "\n"
        text = line.rstrip("\r\n")
        if not text or text.isspace():
            continue
        if upto:
            parts = text.split("|", upto)
            if len(parts) == upto + 1 and parts[upto].count("|") == rest and complete:
                yield number, parts
                continue
        parts = text.split("|")
        if len(parts) != ncol:
            fitted = fitted_row(parts, ncol, idx, complete, f"line {number}", stats)
            if fitted is None:
                continue
            parts = fitted
        if not complete:  # sacct ends every line; a last line without one was cut short
            stats.truncated = True
        yield number, parts
    stats.lines = number


class _Job:
    """A job row's record while its steps are read: their count and GPU usage so far."""

    __slots__ = ("rec", "key", "steps", "util", "mem")

    def __init__(self, rec: AcctRecord, key: str) -> None:
        self.rec = rec
        self.key = key
        self.steps = 0
        self.util = rec.gpu_util
        self.mem = rec.gpu_mem

    def step(self, parts: List[str], ave: int, tot: int) -> None:
        """Fold in a step's GPU usage: the max over steps (Ave, else Tot)."""
        self.steps += 1
        util = mem = None
        if ave >= 0 and "gres/gpu" in parts[ave]:
            util, mem = gpu_usage(parts[ave])
        if tot >= 0 and (util is None or mem is None) and "gres/gpu" in parts[tot]:
            tutil, tmem = gpu_usage(parts[tot])
            util = util if util is not None else tutil
            mem = mem if mem is not None else tmem
        if util is not None or mem is not None:
            self.util = _max(self.util, util)
            self.mem = _max(self.mem, mem)

    def done(self) -> AcctRecord:
        if not self.steps:
            return self.rec
        return self.rec._replace(steps=self.steps, gpu_util=self.util, gpu_mem=self.mem)


def _max(a: Optional[float], b: Optional[float]) -> Optional[float]:
    if a is None:
        return b
    return a if b is None or a >= b else b


def read_header(parts: List[str], stats: ParseStats) -> Tuple[List[str], Dict[str, int]]:
    """(the columns, name -> index) of a ``-P`` header line split on ``|``; a line of data
    as long as the audit's own ``--format`` is read as that order (``sacct -n``)."""
    if "JobID" not in parts:
        for names in (SACCT_FIELDS, LIVE_FIELDS, LEGACY_FIELDS):
            if len(parts) == len(names):
                log.warning("%s: no header line; assuming the audit's own --format order",
                            stats.source or "sacct output")
                return list(names), {n: i for i, n in enumerate(names)}
        raise AuditInputError(
            f"{stats.source or 'sacct output'}: no header line naming JobID",
            hint="save sacct output with its header (-P without -n), or use --json",
        )
    unknown = [p for p in parts if p not in SACCT_FIELDS and p not in _TOLERATED]
    if unknown:
        stats.unknown_fields = unknown
        log.warning("%s: ignoring unknown sacct field(s): %s", stats.source or "sacct output",
                    ", ".join(unknown))
    missing = [f for f in REQUIRED_FIELDS if f not in parts]
    if missing:
        raise AuditInputError(f"{stats.source}: sacct output lacks field(s) {', '.join(missing)}")
    stats.fields = list(parts)
    return parts, {name: i for i, name in enumerate(parts) if name}


def repair_row(parts: List[str], ncol: int, idx: Dict[str, int]) -> Optional[List[str]]:
    """A ``|`` inside JobName shifts the columns: glue it back when that explains the count."""
    name = idx.get("JobName")
    extra = len(parts) - ncol
    if extra <= 0 or name is None:
        return None
    return parts[:name] + ["|".join(parts[name : name + extra + 1])] + parts[name + extra + 1 :]


def fitted_row(parts: List[str], ncol: int, idx: Dict[str, int], complete: bool, where: str,
               stats: ParseStats) -> Optional[List[str]]:
    """A row of the wrong length made right (:func:`repair_row`), or None after counting it
    bad: cut short (the output's last line, without its line end) or a field count sacct
    never prints."""
    repaired = repair_row(parts, ncol, idx)
    if repaired is None:
        if not complete:
            stats.truncated = True
            stats.bad_line(where, "truncated (output ends mid-line)")
        else:
            stats.bad_line(where, f"{len(parts)} fields, want {ncol}")
    return repaired


def record_maker(idx: Dict[str, int], ncol: int) -> Callable[[List[str], str], AcctRecord]:
    """A function ``(parts, key) -> AcctRecord`` for this header, with every column index bound
    once: the hot loop of a million rows then makes no lookups by name. ``parts`` must carry
    one extra ``""`` at index ``ncol``, which a field the header lacks reads."""
    return _RecordMaker(idx, ncol).make


class _RecordMaker:
    """:func:`record_maker`'s function and what it keeps: column indices, caches."""

    def __init__(self, idx: Dict[str, int], ncol: int) -> None:
        def at(name: str) -> int:
            return idx.get(name, ncol)

        self.i_name, self.i_user, self.i_acct, self.i_part, self.i_qos, self.i_state = (
            at("JobName"), at("User"), at("Account"), at("Partition"), at("QOS"),
            idx["State"])
        self.i_submit, self.i_elig, self.i_start, self.i_end = (
            at("Submit"), at("Eligible"), at("Start"), at("End"))
        self.i_elapsed, self.i_limit, self.i_tres, self.i_nodes = (
            at("ElapsedRaw"), at("TimelimitRaw"), at("AllocTRES"), at("NodeList"))
        self.i_ave, self.i_tot, self.i_restarts = (
            at("TRESUsageInAve"), at("TRESUsageInTot"), at("Restarts"))
        self.tres: Dict[str, Tuple[float, int, int]] = {}
        self.states: Dict[str, str] = {}

    @staticmethod
    def when(text: str, name: str) -> Optional[float]:
        if text in NO_TIME:
            return None
        base = _hour_cache.get(text[:13]) if len(text) == 19 and text[10] == "T" else None
        if base is not None:
            into = _MMSS.get(text[13:])
            if into is not None:
                return base + into
            try:
                return base + int(text[14:16]) * 60 + int(text[17:19])
            except ValueError:
                pass
        value = parse_time(text)
        if value is None:
            raise ValueError(f"bad {name} time {text[:32]!r}")
        return value

    def run_time(self, text: str, name: str) -> Optional[float]:
        """Start or End: a cached hour's stamp is read by int(), whose message a bad
        minute or second then gives (the message a bad row is sampled with)."""
        base = _hour_cache.get(text[:13])
        if base is not None and len(text) == 19 and text[16] == ":":
            into = _MMSS.get(text[13:])  # the same whole seconds int() would read
            return base + (into if into is not None
                           else int(text[14:16]) * 60 + int(text[17:19]))
        return self.when(text, name)

    def cached(self, parts: List[str]) -> Optional[Tuple[float, float, float, float]]:
        """(Start, End, Submit, Eligible) where each stamp's hour is cached (two dict hits
        a stamp: the values ``when`` computes), else None."""
        hours, mmss = _hour_cache, _MMSS
        try:
            start = hours[(text := parts[self.i_start])[:13]] + mmss[text[13:]]
            end = hours[(text := parts[self.i_end])[:13]] + mmss[text[13:]]
            submit = hours[(text := parts[self.i_submit])[:13]] + mmss[text[13:]]
            if parts[self.i_elig] == text:
                return start, end, submit, submit
            return start, end, submit, hours[(text := parts[self.i_elig])[:13]] + mmss[text[13:]]
        except KeyError:
            return None

    def run(self, parts: List[str], got: Optional[Tuple[float, float, float, float]]
            ) -> Tuple[Optional[float], Optional[float], float]:
        """(Start, End, ElapsedRaw): a bad row's message names the first problem in the
        order Start, End, ElapsedRaw, AllocTRES, Submit, Eligible."""
        start: Optional[float]
        end: Optional[float]
        if got is not None:
            start, end = got[0], got[1]
        else:
            start = self.run_time(parts[self.i_start], "Start")
            end = self.run_time(parts[self.i_end], "End")
        raw = parts[self.i_elapsed]
        if raw:
            try:
                elapsed = float(int(raw))
            except ValueError:
                raise ValueError(f"bad ElapsedRaw {raw[:32]!r}") from None
        else:
            elapsed = end - start if start is not None and end is not None else 0.0
        return start, end, elapsed

    def queued(self, parts: List[str], got: Optional[Tuple[float, float, float, float]]
               ) -> Tuple[Optional[float], Optional[float]]:
        """(Submit, Eligible)."""
        if got is not None:
            return got[2], got[3]
        submitted = self.when(parts[self.i_submit], "Submit")
        return submitted, (self.when(parts[self.i_elig], "Eligible")
                           if parts[self.i_elig] != parts[self.i_submit] else submitted)

    def make(self, parts: List[str], key: str) -> AcctRecord:
        got = self.cached(parts)
        start, end, elapsed = self.run(parts, got)
        text = parts[self.i_tres]
        tres = self.tres.get(text)
        if tres is None:
            tres = parse_tres(text)
            if len(self.tres) < 10_000:
                self.tres[text] = tres
        submitted, eligible = self.queued(parts, got)
        ave, tot = parts[self.i_ave], parts[self.i_tot]
        util, mem = row_usage(ave, tot) if ave or tot else (None, None)
        state = self.states.get(parts[self.i_state])
        if state is None:
            state = state_word(parts[self.i_state])
            if len(self.states) < 10_000:
                self.states[parts[self.i_state]] = state
        limit, restarts = parts[self.i_limit], parts[self.i_restarts]
        return tuple.__new__(AcctRecord, (
            key, parts[self.i_name], parts[self.i_user], parts[self.i_acct],
            parts[self.i_part], parts[self.i_qos], state, submitted, eligible, start, end,
            elapsed, int(limit) * 60 if limit.isdecimal() else None,
            tres[0], tres[1], tres[2], parts[self.i_nodes], util, 0, 0,
            int(restarts) if restarts.isdecimal() else 0, mem))
