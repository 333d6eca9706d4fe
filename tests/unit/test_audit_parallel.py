"""A large ``sacct -P`` file folded in parallel parts (slurmiso.audit.read.parallel) against the
serial fold of the same file: every integer figure, list and bad-line message (with its line
number) equal, every float within 1e-9 relative (the parts' sums are added in another
order); where a job id spans two parts or a worker fails, the serial fold itself, exactly.
"""

from __future__ import annotations

import logging
import math
import os
import random
from typing import Any, Dict, List, Optional, Tuple

import pytest

from slurmiso.audit.figures.aggregate import Aggregator
from slurmiso.audit.figures.jobledger import WINDOW, JobMark
from slurmiso.audit.figures.jobset import JobSet
from slurmiso.audit.read import parallel
from slurmiso.audit.read.collect import read_sacct_file
from slurmiso.audit.read.digest import JournalDigest
from slurmiso.audit.read.sacct import SACCT_FIELDS, ParseStats
from tests.audit_helpers import utc  # noqa: F401
from tests.unit.test_audit_fold import CFG, EXTRA, T0, _row, state
from tests.unit.test_audit_fold import digest_for as fold_digest_for

GOOD = ["n", "u1", "research", "train", "train", "COMPLETED", "2024-04-25T10:00:00",
        "2024-04-25T10:00:00", "2024-04-25T10:00:05", "2024-04-25T11:00:05", "3600", "60",
        "gres/gpu=2", "gpu033", "", "", "0"]


def big_dump(seed: int, rows: int, header: Optional[List[str]] = None) -> Tuple[str, List[str]]:
    """A dump of whole jobs in job-id order, as ``sacct -D`` lists them: requeued attempts,
    het components, array tasks and steps next to their job; bad, torn and blank lines."""
    rnd = random.Random(seed)
    if header is None:
        header = list(SACCT_FIELDS) + EXTRA + ["Bogus"]  # an unknown field: logged, kept
        if seed % 2:
            rnd.shuffle(header)  # JobID not first
    lines = [("\ufeff" if seed % 3 == 1 else "") + "|".join(header) + "\n"]
    job = 100
    while len(lines) < rows:
        job += 1
        r = rnd.random()
        if r < 0.1:
            ids = [f"{job}_{k}" for k in range(rnd.randrange(1, 4))]
        elif r < 0.12:
            ids = [f"{job}_[3-9]"]
        elif r < 0.2:
            ids = [f"{job}+{k}" for k in range(rnd.randrange(1, 3))]
        else:
            ids = [str(job)]
        for jid in ids:
            for _ in range(rnd.choice([1, 1, 1, 2, 3])):  # requeued attempts
                lines.append(_row(rnd, header, jid))
                for _ in range(rnd.choice([0, 0, 1, 2])):
                    lines.append(_row(rnd, header,
                                      jid.split("+")[0] if rnd.random() < 0.2 else jid,
                                      rnd.choice([".batch", ".0", ".extern"])))
        r = rnd.random()
        if r < 0.01:
            lines.append(rnd.choice(["\n", "   \n", "garbage\n", "|\n"]))
        elif r < 0.02:
            lines.append(_row(rnd, header, str(job + 7), ".batch"))  # an orphan step
    if seed % 2 == 0:
        lines[-1] = lines[-1].rstrip("\r\n")[: rnd.randrange(1, 40)]  # torn last line
    return "".join(lines), header


def digest_for(seed: int) -> JournalDigest:
    """test_audit_fold's journal, over every job of a big dump (every part meets some)."""
    return fold_digest_for(seed, last_job=8000)


def figures(agg: Aggregator, stats: ParseStats) -> Dict[str, Any]:
    """test_audit_fold's state, less what only the order of work decides: the heap's layout,
    how far the id bitmaps grew, and the order the series points were made in (a part's
    GPU-hours settle into points when it is merged; the report sorts them)."""
    got = state(agg, stats)
    got["series"] = sorted(got["series"])
    seen = agg.seen
    got["jobs"] = (seen.count, bytes(seen._bits).rstrip(b"\0"),
                   sorted((k, bytes(v).rstrip(b"\0")) for k, v in seen._tasks.items()),
                   sorted(seen._other))
    got["inefficient"] = sorted(agg.inefficient)
    return got


def assert_close(got: Any, want: Any, where: str = "") -> None:
    if isinstance(want, float) and isinstance(got, float):
        assert math.isclose(got, want, rel_tol=1e-9, abs_tol=1e-12), (where, got, want)
    elif isinstance(want, dict):
        assert isinstance(got, dict) and list(got) == list(want), where
        for k in want:
            assert_close(got[k], want[k], f"{where}.{k}")
    elif isinstance(want, (list, tuple)):
        assert type(got) is type(want) and len(got) == len(want), (where, got, want)
        for i, (g, w) in enumerate(zip(got, want)):
            assert_close(g, w, f"{where}[{i}]")
    else:
        assert got == want, (where, got, want)


def fold(path: str, seed: int, workers: int, since: Optional[float] = None,
         until: Optional[float] = None) -> Tuple[Aggregator, ParseStats]:
    os.environ[parallel.ENV_WORKERS] = str(workers)
    try:
        stats = ParseStats()
        agg = Aggregator(CFG, digest_for(seed), since=since, until=until)
        agg.add_all(read_sacct_file(path, stats))
        return agg, stats
    finally:
        del os.environ[parallel.ENV_WORKERS]


@pytest.fixture
def small_parts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(parallel, "MIN_BYTES", 0)


@pytest.mark.parametrize("seed", range(4))
def test_parallel_fold_equals_the_serial_fold(seed: int, tmp_path: Any, utc: None,  # noqa: F811
                                              small_parts: None,
                                              caplog: pytest.LogCaptureFixture) -> None:
    text, _ = big_dump(seed, 16000)
    path = str(tmp_path / "sacct.txt")
    with open(path, "w", encoding="utf-8", newline="") as fh:
        fh.write(text)
    assert os.path.getsize(path) > 3_000_000
    since, until = [(None, None), (T0 + 86400, None), (None, T0 + 4 * 86400),
                    (T0 + 2 * 86400 + 1234.5, T0 + 3 * 86400 + 17)][seed]
    workers = 2 + seed % 2
    ref, ref_stats = fold(path, seed, 1, since, until)
    caplog.set_level(logging.INFO, logger="slurmiso.audit.read.parallel")
    got, got_stats = fold(path, seed, workers, since, until)
    assert f"folded in {workers} parallel parts" in caplog.text
    assert ref_stats.records > 2000 and ref_stats.bad > 100 and ref_stats.steps > 1000
    jobs = ref.job_tallies()  # preempted jobs and requeued attempts, settled per job
    assert jobs[JobMark.NOT_REQUEUED].count and jobs[JobMark.RESTARTED].count
    assert sum(c.attempts - c.jobs for c in ref.classes.values()) > 0
    assert not jobs[JobMark.LATE].count and bool(ref.outside_window) == (seed > 0)
    assert len(ref_stats.bad_samples) == 5 and ref_stats.orphan_steps
    # the journal at work: its classes, lost work from its checkpoints
    assert ref.classes["ghost"].attempts > 10
    assert sum(c.lost_gpu_hours for c in ref.classes.values()) > 0
    assert sum(row[0] for row in ref.ladder_lost.values()) > 0  # the ladder's requeues too
    assert_close(figures(got, got_stats), figures(ref, ref_stats))
    assert got_stats.to_dict() == ref_stats.to_dict()  # line numbers included


def test_a_job_id_in_two_parts_is_folded_serially(tmp_path: Any, utc: None,  # noqa: F811
                                                  small_parts: None,
                                                  caplog: pytest.LogCaptureFixture) -> None:
    header = list(SACCT_FIELDS) + EXTRA
    text, _ = big_dump(4, 8000, header)
    first, rest = text.split("\n", 1)
    row = "|".join(["100", *GOOD] + ["x"] * len(EXTRA)) + "\n"  # 100: no other row has it
    text = first + "\n" + row + rest.rstrip("\n") + "\n" + row.replace("COMPLETED", "FAILED")
    path = str(tmp_path / "sacct.txt")
    with open(path, "w", encoding="utf-8", newline="") as fh:
        fh.write(text)
    ref, ref_stats = fold(path, 4, 1)
    assert ref.seen.count < WINDOW  # so its two attempts, listed apart, are one job's
    assert not ref.job_tallies()[JobMark.LATE].count
    caplog.set_level(logging.INFO, logger="slurmiso.audit.read.parallel")
    got, got_stats = fold(path, 4, 3)
    assert "a job id appears in two of its 3 parts" in caplog.text
    assert state(got, got_stats) == state(ref, ref_stats)  # the serial fold: exactly


@pytest.mark.parametrize("how", ["raise", "kill"])
def test_a_failed_worker_means_a_serial_fold(how: str, tmp_path: Any, utc: None,  # noqa: F811
                                             small_parts: None, monkeypatch: pytest.MonkeyPatch,
                                             caplog: pytest.LogCaptureFixture) -> None:
    text, _ = big_dump(5, 8000)
    path = str(tmp_path / "sacct.txt")
    with open(path, "w", encoding="utf-8", newline="") as fh:
        fh.write(text)
    ref, ref_stats = fold(path, 5, 1)
    me = os.getpid()
    real = parallel._fold_part

    def failing(*args: Any) -> Any:
        if os.getpid() != me:  # in a worker
            if how == "kill":
                os._exit(9)
            raise RuntimeError("boom")
        return real(*args)

    monkeypatch.setattr(parallel, "_fold_part", failing)
    caplog.set_level(logging.INFO, logger="slurmiso.audit.read.parallel")
    got, got_stats = fold(path, 5, 2)
    assert "a worker failed" in caplog.text
    assert ("exit status 9" if how == "kill" else "RuntimeError: boom") in caplog.text
    assert state(got, got_stats) == state(ref, ref_stats)


def test_what_stays_serial(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    text, _ = big_dump(6, 2000)
    path = str(tmp_path / "sacct.txt")
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(text)
    monkeypatch.setenv(parallel.ENV_WORKERS, "4")
    assert parallel.parts_for(path) == 1  # under MIN_BYTES
    monkeypatch.setattr(parallel, "MIN_BYTES", 0)
    assert parallel.parts_for(path) == 4
    monkeypatch.setenv(parallel.ENV_WORKERS, "1")
    assert parallel.parts_for(path) == 1
    monkeypatch.setenv(parallel.ENV_WORKERS, "4")
    with open(path, "w", encoding="utf-8") as fh:  # a short header: records_from's read-ahead
        fh.write("JobID|State\n" + "1|COMPLETED\n" * 1000)
    assert parallel.parts_for(path) == 1
    fifo = str(tmp_path / "fifo")
    os.mkfifo(fifo)
    assert not parallel.fold_file(fifo, ParseStats(), Aggregator(CFG))
    agg = Aggregator(CFG)
    agg.seen.add("5")
    assert not parallel.fold_file(path, ParseStats(), agg)  # merging starts from nothing


def test_jobset_merge_and_overlaps() -> None:
    ids = ["1", "9", "800", "70000", "5_1", "5_300", "6_2", "7_[1-3]", "x", str(1 << 28)]
    rnd = random.Random(3)
    for _ in range(30):
        a_ids = rnd.sample(ids, rnd.randrange(len(ids)))
        b_ids = rnd.sample(ids, rnd.randrange(len(ids)))
        a, b, both = JobSet(), JobSet(), JobSet()
        for job in a_ids:
            a.add(job)
            both.add(job)
        for job in b_ids:
            b.add(job)
            both.add(job)
        assert a.overlaps(b) == bool(set(a_ids) & set(b_ids)) == b.overlaps(a)
        a.merge(b)
        assert a.count == both.count == len(set(a_ids) | set(b_ids))
        assert all(job in a for job in ids if job in both)
        assert not any(job in a for job in ids if job not in both)
