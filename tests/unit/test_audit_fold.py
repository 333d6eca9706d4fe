"""The audit's batched fold (``Aggregator.add_all``: the kernel folds records a batch of
columns at a time) against the plain record path it must equal.

The record path (``parse_parsable`` yields records, ``Aggregator.add`` folds each, one at a
time) is the straightforward reference. On randomised dumps full of what real and hostile files contain
(bad and ``Unknown`` times, negative durations, End before Start, BOM, torn, short and long
rows, a ``|`` in JobName, het jobs, arrays, steps before their job, odd TRES and usage
strings, several headers and windows) both must leave the aggregator, the parse statistics
and the built report exactly equal: every float summed in the same order.
"""

from __future__ import annotations

import io
import json
import random
import time
from typing import Any, Dict, List, Optional, Tuple

import pytest

from slurmiso.audit.figures.aggregate import Aggregator
from slurmiso.audit.figures.findings import input_findings, job_findings
from slurmiso.audit.figures.report import build_report
from slurmiso.audit.read.collect import ParsableSource, records_from
from slurmiso.audit.read.digest import JournalDigest
from slurmiso.audit.read.sacct import (
    SACCT_FIELDS,
    AuditInputError,
    ParseStats,
    fold_parsable,
    gpu_usage,
)
from slurmiso.config import load_config
from tests.audit_helpers import CONFIG, utc  # noqa: F401

CFG = load_config(CONFIG)
T0 = 1714000000.0  # 2024-04-24T23:06:40Z
EXTRA = ["JobIDRaw", "Elapsed", "Timelimit", "ExitCode", "NNodes", "Cluster"]

_TIMES = ["Unknown", "None", "", "N/A", "2024-04-2", "garbage-time-value!", "2024-13-45T99:99:99",
          "2024-04-25T10:6x:00", "2024-04-25T10:00:5x", "2024-04-25T10:00:+5",
          "2024-04-25T10:00:00.25", "2024-04-25T10:00", "2024-04-25 10:00:00"]
_TRES = ["", "billing=4,cpu=4,mem=16G,node=1", "cpu=4,gres/gpu=2,node=1",
         "gres/gpu:a100=8,gres/gpu=8", "gres/gpu:a100=2,gres/gpu:h100=1", "gres/mps=50",
         "gres/shard=3,gres/gpu=1", "gres/gpu=-1", "gres/mps=nan", "gres/gpu=x",
         "gres/mps:x=25,gres/shard:y=2", "gres/gpu=0.5"]
_USAGE = ["", "", "", "cpu=00:00:05,mem=1G", "cpu=1,gres/gpumem=1024M,gres/gpuutil=37,mem=1G",
          "gres/gpuutil=0", "gres/gpuutil=250,gres/gpumem=2G", "gres/gpumem=3.5G",
          "gres/gpuutil=12,gres/gpuutil=88", "xgres/gpuutil=5,gres/gpu=1", "gres/gpuutil=",
          "gres/gpuutil=7K", "gres/gpuutil=1e3,gres/gpumem=x", "gres/gpuutil=nan"]
_STATES = ["COMPLETED"] * 6 + ["FAILED", "PREEMPTED", "PREEMPTED", "REQUEUED", "TIMEOUT",
                                "CANCELLED by 1001", "cancelled", "", "RUNNING", "PENDING"]


def _stamp(ts: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(ts))


def _time(rnd: random.Random, ts: float) -> str:
    return rnd.choice(_TIMES) if rnd.random() < 0.03 else _stamp(ts)


def _row(rnd: random.Random, header: List[str], job: str, step: str = "") -> str:
    """One line of a dump with columns in ``header`` order."""
    submit = T0 + rnd.randrange(0, 6 * 86400)
    start = submit + rnd.choice([0, 5, 300, 4000, -30, -1])  # a few negative waits
    run = rnd.choice([0, 1, 59, 600, 3600, 3601, 7300, 90000])
    end = start + run + rnd.choice([0, 0, 0, 1, 3, -run - 10])
    elapsed = rnd.choice([str(run)] * 8 + ["", "-5", "12x", str(run + 100), "+7", "\u00b2"])
    fields: Dict[str, str] = {
        "JobID": job + step,
        "JobName": rnd.choice(["train", "a|b", "x||y", ""]),
        "User": f"u{rnd.randrange(5)}",
        "Account": rnd.choice(["research", "prod", "a2"]),
        "Partition": rnd.choice(["train", "infer", "mixed", "elastic", "other", "train,infer", ""]),
        "QOS": rnd.choice(["train", "infer", "normal", "debug", "", "Unknown"]),
        "State": rnd.choice(_STATES),
        "Submit": _time(rnd, submit),
        "Eligible": rnd.choice(["same"] * 6 + ["later", "bad"]),
        "Start": rnd.choice(["None"] * 1 + [_time(rnd, start)] * 12),
        "End": rnd.choice(["Unknown"] + [_time(rnd, end)] * 12),
        "ElapsedRaw": elapsed,
        "TimelimitRaw": rnd.choice(["1440", "", "UNLIMITED", "\u00b2", "60"]),
        "AllocTRES": rnd.choice(_TRES),
        "NodeList": rnd.choice(["gpu033", "gpu001", "gpu[017-018]", "None assigned", "nowhere",
                                ""]),
        "TRESUsageInAve": rnd.choice(_USAGE),
        "TRESUsageInTot": rnd.choice(_USAGE),
        "Restarts": rnd.choice(["0"] * 6 + ["1", "3", "", "-1", "\u00b2"]),
    }
    if fields["Eligible"] == "same":
        fields["Eligible"] = fields["Submit"]
    elif fields["Eligible"] == "later":
        fields["Eligible"] = _stamp(submit + 60)
    else:
        fields["Eligible"] = rnd.choice(_TIMES)
    line = "|".join(fields.get(name, "x") for name in header)
    r = rnd.random()
    if r < 0.01:
        line = line.rsplit("|", 1)[0]  # a field short
    elif r < 0.015:
        line += "|extra"
    return line + rnd.choice(["\n"] * 20 + ["\r\n"])


def dump(seed: int, rows: int = 600) -> Tuple[str, List[str]]:
    rnd = random.Random(seed)
    header = list(SACCT_FIELDS) + EXTRA
    shape = seed % 5
    if shape == 1:
        rnd.shuffle(header)
    elif shape == 2:  # the legacy --format: no TRESUsageInTot, no Restarts
        header = list(SACCT_FIELDS[:16])
    elif shape == 3:  # columns missing
        header = [h for h in header if h not in ("Eligible", "ElapsedRaw", "NodeList")]
    lines: List[str] = []
    if shape != 4 or rnd.random() < 0.5:  # shape 4: sometimes no header at all (sacct -n)
        lines.append(("\ufeff" if rnd.random() < 0.3 else "") + "|".join(header) + "\n")
    else:
        header = list(SACCT_FIELDS)
    job = 100
    while len(lines) < rows:
        r = rnd.random()
        if r < 0.6:
            job += 1
            jid = str(job)
        elif r < 0.7:
            jid = str(job - rnd.randrange(5))  # a requeued attempt
        elif r < 0.78:
            jid = f"{job - rnd.randrange(3)}_{rnd.randrange(4)}"
        elif r < 0.8:
            jid = f"{job}_[3-9]"
        elif r < 0.86:
            jid = f"{job}+{rnd.randrange(3)}"
        else:
            jid = rnd.choice([str(job), f"{job}+1", "", "abc", str(job + 5)])
            lines.append(_row(rnd, header, jid, rnd.choice([".batch", ".0", ".extern"])))
            continue
        lines.append(_row(rnd, header, jid))
        for _ in range(rnd.choice([0, 0, 1, 2, 3])):
            lines.append(_row(rnd, header, jid.split("+")[0] if rnd.random() < 0.2 else jid,
                              rnd.choice([".batch", ".0", ".1", ".extern"])))
        if rnd.random() < 0.01:
            lines.append(rnd.choice(["\n", "   \n", "garbage\n", "|\n"]))
    if seed % 3 == 0:
        lines[-1] = lines[-1].rstrip("\r\n")[: rnd.randrange(1, 40)]  # torn last line
    return "".join(lines), header


def digest_for(seed: int, last_job: int = 400) -> JournalDigest:
    """A random journal over jobs 100..``last_job``: classes, checkpoints, preemptions."""
    rnd = random.Random(seed)
    d = JournalDigest()
    for job in range(100, last_job):
        if rnd.random() < 0.1:
            d.job_class[str(job)] = rnd.choice(["infer", "train", "ghost"])
        if rnd.random() < 0.1:
            d.checkpoints_ok[str(job)] = sorted(T0 + rnd.randrange(0, 6 * 86400)
                                                for _ in range(3))
        if rnd.random() < 0.05:
            d.checkpointing_jobs.add(str(job))
        if rnd.random() < 0.1:
            d.preempted_at[str(job)] = sorted(T0 + rnd.randrange(0, 6 * 86400)
                                              for _ in range(2))
    # the monitor's ladder requeued some jobs every half hour, so that most of their REQUEUED
    # attempts meet one (its own draws: the figures above stay as they were)
    ladder = random.Random(seed + 1000)
    every = [T0 + k * 1800.0 for k in range(6 * 48)]
    for job in range(100, last_job):
        if ladder.random() < 0.5:
            d.ladder.requeued_at[str(job)] = every
    return d


def state(agg: Aggregator, stats: ParseStats) -> Dict[str, Any]:
    """Everything the aggregator and the parser keep, in insertion order (floats exact)."""
    def obj(o: Any) -> Any:
        names = getattr(o, "__slots__", None) or list(vars(o))
        return {n: getattr(o, n) for n in names}

    classes = {}
    for name, c in agg.classes.items():
        d = dict(vars(c))
        d["wait"] = obj(c.wait)
        d["wait"]["counts"] = list(c.wait.counts.items())
        classes[name] = d
    return {
        "classes": list(classes.items()),
        "pools": list(agg.pools.items()),
        "series": list(agg.series.items()),
        "jobs": (agg.seen.count, list(agg.seen._bits), sorted(agg.seen._tasks.items()),
                 sorted(agg.seen._other)),
        "jobs_settled": [(mark.value, tally.count, tally.ids)
                         for mark, tally in agg.job_tallies().items()],
        "users": [(k, obj(v)) for k, v in agg.users.items()],
        "accounts": [(k, obj(v)) for k, v in agg.accounts.items()],
        "inefficient": agg.inefficient,
        "ladder_lost": sorted(agg.ladder_lost.items()),
        "scalars": (agg.outside_window, agg.first_time, agg.last_time),
        "stats": stats.to_dict(),
    }


def both(text: str, seed: int, since: Optional[float], until: Optional[float]
         ) -> Tuple[Tuple[Aggregator, ParseStats], Tuple[Aggregator, ParseStats]]:
    out = []
    for fused in (False, True):
        stats = ParseStats(source="dump")
        agg = Aggregator(CFG, digest_for(seed), since=since, until=until)
        source = records_from(io.StringIO(text), stats)
        assert isinstance(source, ParsableSource)
        if fused:
            agg.add_all(source)  # folds by batches of columns
        else:
            for rec in source:  # the records, one by one
                agg.add(rec)
        out.append((agg, stats))
    return out[0], out[1]


@pytest.mark.parametrize("seed", range(40))
def test_fold_equals_the_record_path(seed: int, utc: None) -> None:  # noqa: F811
    text, _ = dump(seed)
    rnd = random.Random(seed)
    since = rnd.choice([None, T0 + 86400, T0 + 2 * 86400 + 1234.5])
    until = rnd.choice([None, T0 + 4 * 86400, T0 + 3 * 86400 + 17])
    try:
        (ref, ref_stats), (got, got_stats) = both(text, seed, since, until)
    except AuditInputError as exc:  # a headerless dump whose first row is torn
        with pytest.raises(AuditInputError, match=str(exc).split(" (")[0]):
            fold_parsable(io.StringIO(text), ParseStats(source="dump"), Aggregator(CFG))
        text = "|".join(SACCT_FIELDS) + "\n" + text
        (ref, ref_stats), (got, got_stats) = both(text, seed, since, until)
    assert ref_stats.records > 50  # the dump is mostly good rows ...
    assert ref_stats.bad > 5 and ref_stats.steps > 20  # ... with bad rows and steps
    assert state(got, got_stats) == state(ref, ref_stats)

    def report(agg: Aggregator, stats: ParseStats) -> str:
        findings = input_findings(stats, [], agg, agg.digest) + job_findings(CFG, agg,
                                                                             agg.digest)
        return json.dumps(build_report(agg, agg.digest, stats, [], findings, since=since,
                                       until=until, generated=T0, severity="warning"))

    assert report(got, got_stats) == report(ref, ref_stats)


def test_fold_without_a_header_line_is_the_same_error(utc: None) -> None:  # noqa: F811
    for text in ("", "\n  \n"):
        stats = ParseStats(source="x")
        with pytest.raises(AuditInputError, match="no header"):
            fold_parsable(io.StringIO(text), stats, Aggregator(CFG))
        assert stats.lines == text.count("\n")


@pytest.mark.parametrize("usage", _USAGE + [
    "gres/gpuutil=5", "a=1,gres/gpuutil=9", "gres/gpuutil=9,b=2", "gres/gpuutil=1,xgres/gpuutil=2",
    "gres/gpuutil=3.5M,gres/gpuutil=4", "gres/gpuutil=\u00b2", "gres/gpuutil=\u0663"])
def test_a_steps_utilisation_is_read_as_gpu_usage_reads_it(usage: str, utc: None  # noqa: F811
                                                           ) -> None:
    header = list(SACCT_FIELDS)
    job = ["7", "n", "u", "a", "train", "train", "COMPLETED", "2024-04-25T10:00:00",
           "2024-04-25T10:00:00", "2024-04-25T10:00:05", "2024-04-25T11:00:05", "3600", "60",
           "gres/gpu=2", "gpu033", "", "", "0"]
    text = "|".join(header) + "\n" + "|".join(job) + "\n"
    for column in ("TRESUsageInAve", "TRESUsageInTot"):
        step = job[:]
        step[0] = "7.0"
        step[header.index(column)] = usage
        text += "|".join(step) + "\n"
    (ref, ref_stats), (got, got_stats) = both(text, 0, None, None)
    assert state(got, got_stats) == state(ref, ref_stats)
    util = gpu_usage(usage)[0]
    assert ref.classes["train"].util_gpu_hours == (2.0 if util is not None else 0.0)
