"""The audit splits MPS sharing into concurrent (one user's jobs) and serialised (several
users', time-sliced between their MPS servers), from the hooks' job-end lines."""

from __future__ import annotations

from typing import Any, Dict, List

import pytest

from slurmiso.audit.figures.findings import _journal_findings
from slurmiso.audit.figures.mps_sharing import interval_of, sharing
from slurmiso.audit.read.digest import JournalDigest

T0 = 1_714_550_400.0  # 2024-05-01T08:00:00Z


def job_end(job: str, uid: int, start: float, end: float, gpu: int = 0, node: str = "gpu001",
            mode: str = "mps", outcome: str = "released") -> Dict[str, Any]:
    return {"ts": "2024-05-01T12:00:00.000Z", "host": node, "event": "job-end", "job": job,
            "node": node, "outcome": outcome, "class": "infer", "pool": "serve", "mode": mode,
            "gpus": [gpu], "uid": uid, "restart_count": 0, "resources": [], "warnings": [],
            "times": {"prolog_start": T0 + start - 1, "prolog_end": T0 + start,
                      "epilog_end": T0 + end}, "epilog_ms": 12.0}


@pytest.mark.parametrize("recs,concurrent,serialised", [
    ([job_end("1", 1000, 0, 100)], 0, 0),  # alone: no sharing
    ([job_end("1", 1000, 0, 100), job_end("2", 1000, 50, 150)], 50, 0),  # one user
    ([job_end("1", 1000, 0, 100), job_end("2", 1001, 50, 150)], 0, 50),  # two users
    # three jobs: [0,100) u1000, [20,60) u1000, [40,120) u1001
    ([job_end("1", 1000, 0, 100), job_end("2", 1000, 20, 60), job_end("3", 1001, 40, 120)],
     20, 60),
    # back to back is no overlap; another GPU is no overlap
    ([job_end("1", 1000, 0, 100), job_end("2", 1001, 100, 200),
      job_end("3", 1001, 0, 100, gpu=1)], 0, 0),
])
def test_sweep(recs: List[Dict[str, Any]], concurrent: float, serialised: float) -> None:
    spans = [s for s in (interval_of(r) for r in recs) if s is not None]
    got = sharing(spans)
    assert (got.concurrent_s, got.serialised_s) == (concurrent, serialised)


@pytest.mark.parametrize("change", [
    {"mode": "exclusive"}, {"outcome": "refused"}, {"gpus": [0, 1]}, {"times": {}},
    {"uid": None}, {"times": {"prolog_end": T0 + 5, "epilog_end": T0 + 5}},
])
def test_lines_that_are_no_interval(change: Dict[str, Any]) -> None:
    rec = job_end("1", 1000, 0, 100)
    rec.update(change)
    assert interval_of(rec) is None


def test_worst_gpus_named_and_finding() -> None:
    digest = JournalDigest()
    for rec in (job_end("1", 1000, 0, 7200), job_end("2", 1001, 0, 3600),
                job_end("3", 1000, 0, 1800, node="gpu002"),
                job_end("4", 1000, 900, 1800, node="gpu002")):
        digest.add(rec)
    got = sharing(digest.mps_intervals)
    assert got.worst == (("gpu001", 0, 3600.0),) and got.gpus == 2
    (f,) = [f for f in _journal_findings(digest) if f.code == "mps-sharing"]
    assert f.severity == "warning" and "1.2 GPU-hours on 2 GPU(s)" in f.message
    assert "0.2 h concurrent" in f.message and "1.0 h (80%) serialised" in f.message
    assert "gpu001 GPU 0 (1.0 h)" in f.message and "service account" in f.fix
    assert f.subjects == ("gpu001",)


def test_one_users_sharing_is_info() -> None:
    digest = JournalDigest()
    digest.add(job_end("1", 1000, 0, 3600))
    digest.add(job_end("2", 1000, 0, 3600))
    (f,) = [f for f in _journal_findings(digest) if f.code == "mps-sharing"]
    assert f.severity == "info" and "0 h (0%) serialised" in f.message.replace(".0 h", " h")


def test_a_forged_job_end_is_not_counted() -> None:
    digest = JournalDigest()
    forged = dict(job_end("1", 1000, 0, 100), source="job")
    digest.add(forged)
    digest.add(dict(job_end("2", 1001, 0, 100), source="job"))
    assert digest.mps_intervals == [] and digest.rejected == 2


def test_users_on_a_shared_mps_v3_server_run_concurrently() -> None:
    """A shared server (mps_server: shared) runs every user's clients together: two users'
    overlap there is concurrent, not serialised; beside a per-class job it is not."""
    shared = [{"kind": "mps", "state": "released", "gpu": 0, "arrangement": "shared-v3",
               "namespace": "job_1_0123456789abcdef"}]
    a, b = job_end("1", 1000, 0, 100), job_end("2", 1001, 50, 150)
    a["resources"], b["resources"] = shared, shared
    got = sharing([s for s in map(interval_of, (a, b)) if s is not None])
    assert (got.concurrent_s, got.serialised_s) == (50, 0)
    c = job_end("3", 1002, 60, 90)  # a per-class daemon's job on that GPU (a fallback)
    got = sharing([s for s in map(interval_of, (a, b, c)) if s is not None])
    assert (got.concurrent_s, got.serialised_s) == (20, 30)
