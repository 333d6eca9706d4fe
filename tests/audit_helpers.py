"""Shared by the audit tests: fixture paths, a UTC clock, and running ``slurmiso audit``
in-process (``slurmiso.cli.main.main``) with captured output."""

from __future__ import annotations

import os
import time
from typing import Iterator, List, Tuple

import pytest

from slurmiso.audit.read import sacct as sacct_mod

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SACCT = os.path.join(ROOT, "tests", "fixtures", "sacct")
JOURNAL = os.path.join(ROOT, "tests", "fixtures", "audit", "journal.jsonl")
CONFIG = os.path.join(ROOT, "tests", "fixtures", "audit", "slurmiso.yaml")
#: The report's "generated" time in golden files: a fixed clock after the fixtures' jobs.
NOW = 1714608000.0  # 2024-05-02T00:00:00Z
HAND_MADE = ["22.05-parsable.txt", "24.11-parsable.txt", "22.05.json", "24.11.json"]


@pytest.fixture
def utc(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """sacct -P times are local: pin the zone to UTC (and the parser's hour cache with it)."""
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    sacct_mod._hour_cache.clear()
    yield
    monkeypatch.undo()
    time.tzset()
    sacct_mod._hour_cache.clear()


def run_audit(args: List[str], capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch,
              now: float = NOW, config: str = CONFIG) -> Tuple[int, str, str]:
    """(exit code, stdout, stderr) of ``slurmiso -c CONFIG audit ARGS`` run in this process."""
    from slurmiso.cli import audit as audit_cli
    from slurmiso.cli.main import main

    capsys.readouterr()
    with monkeypatch.context() as m:
        m.setattr(audit_cli.time, "time", lambda: now)
        rc = main(["-c", config, "audit", *args])
    out, err = capsys.readouterr()
    return rc, out, err


def write_week(path: str, seed: int = 16) -> None:
    """A deterministic ``sacct -a -D -P`` dump of ten days with a three-day gap (no jobs from
    day 4 to day 7): serving jobs waiting seconds, training jobs waiting hours, preemptions
    with requeued attempts, idle GPUs in ``TRESUsageInTot``. Times are UTC (tests pin TZ)."""
    import calendar
    import random

    from slurmiso.audit.read.sacct import SACCT_FIELDS

    rnd = random.Random(seed)
    t0 = calendar.timegm((2024, 4, 22, 0, 0, 0))
    users = [("alice", "vision"), ("bob", "nlp"), ("carol", "nlp"), ("dave", "speech")]

    def stamp(ts: float) -> str:
        return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ts))

    rows = ["|".join(SACCT_FIELDS)]
    job = 5000
    for day in [0, 1, 2, 3, 7, 8, 9]:
        for k in range(24):
            job += 1
            user, account = users[rnd.randrange(len(users))]
            serve = k % 3 == 0
            submit = t0 + day * 86400 + k * 3600 + rnd.randrange(600)
            wait = rnd.randrange(2, 40) if serve else rnd.randrange(60, 4 * 3600)
            run = rnd.randrange(600, 3 * 3600)
            start, end = submit + wait, submit + wait + run
            util = 0 if (job % 11 == 0) else rnd.randrange(20, 100)
            if serve:
                fields = dict(Partition="infer", QOS="infer", AllocTRES="gres/mps=50",
                              NodeList="gpu003")
            else:
                gpus = rnd.choice([1, 2, 4, 8])
                fields = dict(Partition="train", QOS="train",
                              AllocTRES=f"gres/gpu:a100={gpus},gres/gpu={gpus}",
                              NodeList=f"gpu0{40 + k % 20}")
            base = dict(JobName=f"run{job}", User=user, Account=account, TimelimitRaw="1440",
                        TRESUsageInAve="", Submit=stamp(submit), Eligible=stamp(submit))
            preempted = not serve and job % 5 == 0
            attempts = [(start, start + run // 3, "PREEMPTED"), (start + run // 3 + 120,
                         end + 120, "COMPLETED")] if preempted else [(start, end, "COMPLETED")]
            for n, (s, e, state) in enumerate(attempts):
                rec = dict(base, **fields, JobID=str(job), State=state, Start=stamp(s),
                           End=stamp(e), ElapsedRaw=str(int(e - s)), Restarts=str(n),
                           TRESUsageInTot="")
                if n:
                    rec["Eligible"] = stamp(s - 120)
                rows.append("|".join(rec.get(f, "") for f in SACCT_FIELDS))
                step = dict(rec, JobID=f"{job}.batch", JobName="batch", User="", QOS="",
                            Partition="", TRESUsageInTot=f"cpu=00:10:00,gres/gpumem=1024M,"
                            f"gres/gpuutil={util},mem=2G")
                rows.append("|".join(step.get(f, "") for f in SACCT_FIELDS))
    with open(path, "w") as fh:
        fh.write("\n".join(rows) + "\n")
