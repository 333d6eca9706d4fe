"""Golden-file tests of ``slurmiso audit`` on recorded sacct outputs (tests/fixtures/sacct).

Golden files live in tests/golden/audit/. A missing or different golden file fails the test;
``UPDATE_GOLDEN=1`` rewrites them (then review the diff before committing). The figures in
the goldens are also checked against an independent recount of the fixtures done here with the
``csv`` module (:func:`test_recorded_figures_match_an_independent_recount`), so a golden
cannot freeze a wrong figure.

The four hand-made fixtures spell one scenario as Slurm 22.05 and 24.11 print it (``-P`` and
``--json``); their reports must agree except where 24.11 accounts more (GPU utilisation).
``<release>-recorded.*`` were recorded from the sandbox's real Slurm 22.05.8, 24.11.5 and
26.05.5 (tests/integration/test_audit.py, ``SLURMISO_RECORD_FIXTURES=1``; each ``.cmd`` holds
the command).
"""

from __future__ import annotations

import copy
import json
import os
from typing import Any, Dict

import pytest

from tests.audit_helpers import HAND_MADE, JOURNAL, ROOT, SACCT, run_audit, utc  # noqa: F401
from tests.goldens import check_golden as _check

GOLDEN = os.path.join(ROOT, "tests", "golden", "audit")
RECORDED = [f"{v}-recorded.{ext}" for v in ("22.05", "24.11", "26.05") for ext in ("txt", "json")]


def check_golden(name: str, text: str) -> None:
    _check(os.path.join(GOLDEN, name), text)


def _report(fixture: str, fmt: str, capsys: Any, monkeypatch: Any) -> str:
    rc, out, err = run_audit(["--sacct-file", os.path.join(SACCT, fixture), "--journal", JOURNAL,
                              "--format", fmt], capsys, monkeypatch)
    assert rc == 1, err  # the scenario has findings at warning and above
    # paths differ between checkouts; golden files hold them relative to the repository
    return out.replace(ROOT + os.sep, "").replace(ROOT.replace("/", "\\/") + "\\/", "")


@pytest.mark.parametrize("fixture", HAND_MADE)
@pytest.mark.parametrize("fmt", ["text", "json"])
def test_hand_made_fixture_matches_golden(fixture, fmt, utc, capsys, monkeypatch):  # noqa: F811
    check_golden(f"{fixture}.{fmt}", _report(fixture, fmt, capsys, monkeypatch))


@pytest.mark.parametrize("fmt, ext", [("md", "md"), ("html", "html"), ("csv", "csv")])
def test_other_formats_match_golden(fmt, ext, utc, capsys, monkeypatch):  # noqa: F811
    check_golden(f"22.05-parsable.txt.{ext}", _report("22.05-parsable.txt", fmt, capsys,
                                                       monkeypatch))


def _comparable(report: Dict[str, Any]) -> Dict[str, Any]:
    r = copy.deepcopy(report)
    for key in ("inputs", "idle", "notes", "who", "gpu_efficiency"):  # util: 24.11 only
        r.pop(key)
    for c in [*r["classes"].values(), r["overall"]]:
        c.pop("idle_gpu_hours")
        c.pop("util_accounted_gpu_hours")
    r["findings"] = [f for f in r["findings"] if f["code"] != "idle-allocated-gpus"]
    return r


def test_all_versions_and_formats_report_the_same(utc, capsys, monkeypatch):  # noqa: F811
    reports = {f: json.loads(_report(f, "json", capsys, monkeypatch)) for f in HAND_MADE}
    base = _comparable(reports["22.05-parsable.txt"])
    for name, report in reports.items():
        assert _comparable(report) == base, name
        assert report["inputs"]["sacct"]["records"] == 19
    assert reports["24.11.json"]["inputs"]["sacct"]["slurm_version"] == "24.11.2"
    assert reports["22.05.json"]["inputs"]["sacct"]["slurm_version"] == "22.05.8"
    # 24.11 accounts GPU utilisation: job 1004 sat at 0% on 2 GPUs for 1.5 h
    assert reports["24.11-parsable.txt"]["idle"]["measured_gpu_hours"] == 3.0
    assert reports["22.05-parsable.txt"]["idle"]["accounted_gpu_hours"] == 0.0


def test_scenario_numbers(utc, capsys, monkeypatch):  # noqa: F811
    """The scenario's expected figures, worked out by hand from make_fixtures.SCENARIO."""
    r = json.loads(_report("22.05-parsable.txt", "json", capsys, monkeypatch))
    train = r["classes"]["train"]
    # 1002 (2 attempts), 1003 (4), 1004, 1005_1, 1005_2, 1005_[3-4], 1022 (qos normal ->
    # default class), 1024, 1025
    assert (train["jobs"], train["attempts"], train["requeues"], train["preemptions"]) == (
        9, 13, 4, 5)
    # 1002: last good checkpoint 1770 s before preemption on 8 GPUs (journal) = 3.933 h
    assert train["lost_gpu_hours"] == pytest.approx(3.933, abs=1e-3)
    # 1003: 600+900+300 s on 4 GPUs, 1004: 5400 s on 2 GPUs, no checkpoints = 5.0 h
    assert train["lost_gpu_hours_estimated"] == pytest.approx(5.0)
    assert r["classes"]["debug"]["jobs"] == 2  # het job 1010 (2 components) + 1021
    assert r["classes"]["debug"]["requeues"] == 0
    assert r["classes"]["infer"]["wait_p99_s"] == 5.0
    codes = {f["code"]: f for f in r["findings"]}
    assert codes["training-not-requeued"]["subjects"] == ["1004"]
    assert codes["repeated-preemption"]["subjects"] == ["1003"]
    assert codes["long-infer-jobs"]["subjects"] == ["1020"]
    assert codes["training-without-checkpoint"]["subjects"] == ["1003", "1004"]
    assert r["checkpoints"]["train"]["failed"] == 1
    assert r["monitor_actions"] == {"hold": 2, "release": 1}


@pytest.mark.parametrize("fixture", RECORDED)
def test_recorded_sandbox_output_matches_golden(fixture, utc, capsys, monkeypatch):  # noqa: F811
    path = os.path.join(SACCT, fixture)
    rc, out, err = run_audit(["--sacct-file", path, "--journal", JOURNAL, "--format", "json"],
                             capsys, monkeypatch)
    assert rc in (0, 1), err
    report = json.loads(out)
    assert report["inputs"]["sacct"]["bad"] == 0 and not report["inputs"]["sacct"]["truncated"]
    report["inputs"]["sacct"]["source"] = fixture
    report["inputs"]["journals"] = []
    check_golden(f"{fixture}.json", json.dumps(report, indent=2, sort_keys=True) + "\n")


@pytest.mark.parametrize("fixture", RECORDED)
def test_recorded_preemption_is_one_job_two_attempts(fixture, utc, capsys, monkeypatch):  # noqa: F811
    """Real 22.05 records the cancelled requeued attempt with QOS Unknown, no partition, no
    node and Start=End: it stays in the preempted job's class and counts as not started."""
    rc, out, _ = run_audit(["--sacct-file", os.path.join(SACCT, fixture), "--format", "json",
                            "--journal", JOURNAL], capsys, monkeypatch)
    train = json.loads(out)["classes"]["train"]
    assert (train["jobs"], train["attempts"], train["requeues"], train["preemptions"],
            train["started"]) == (1, 2, 1, 1, 1)


DUMPS = ["22.05-recorded.txt", "24.11-parsable.txt", "synthetic-week.txt"]


def recount(path: str) -> Dict[str, Any]:
    """Attempts, jobs, preemptions and GPU-hours of a ``sacct -P`` dump, counted here with the
    ``csv`` module and nothing of the audit's: the golden figures are checked against this.
    GPU equivalents: untyped ``gres/gpu`` (else the typed ones summed), ``gres/mps`` / 100 and
    ``gres/shard`` / 7 (the fixture config's mps_shares_per_gpu and shards_per_gpu)."""
    import csv

    attempts = preempted = 0
    jobs = set()
    gpu_hours = 0.0
    with open(path, encoding="utf-8-sig", newline="") as fh:
        reader = csv.reader(fh, delimiter="|", quoting=csv.QUOTE_NONE)
        header = next(reader)
        # the live query's fields have no JobName (a user's text); older files do
        name = header.index("JobName") if "JobName" in header else -1
        for cells in reader:
            extra = len(cells) - len(header)  # a '|' inside a job name: glue it back
            if extra > 0 and name >= 0:
                cells = (cells[:name] + ["|".join(cells[name:name + extra + 1])]
                         + cells[name + extra + 1:])
            r = dict(zip(header, cells))
            jid = r["JobID"]
            if "." in jid:
                continue
            leader, _, component = jid.partition("+")
            tres = dict(i.split("=", 1) for i in r["AllocTRES"].split(",") if "=" in i)
            typed = sum(float(v) for k, v in tres.items() if k.startswith("gres/gpu:"))
            gpus = float(tres.get("gres/gpu", typed))
            gpus += float(tres.get("gres/mps", 0)) / 100 + float(tres.get("gres/shard", 0)) / 7
            if r["Start"] not in ("Unknown", "None") and r["NodeList"] != "None assigned":
                gpu_hours += gpus * int(r["ElapsedRaw"] or 0) / 3600
            if component and component != "0":
                continue
            attempts += 1
            jobs.add(leader)
            preempted += r["State"] == "PREEMPTED"
    return {"attempts": attempts, "jobs": len(jobs), "preemptions": preempted,
            "gpu_hours": gpu_hours}


@pytest.mark.parametrize("fixture", DUMPS)
def test_recorded_figures_match_an_independent_recount(fixture, utc, capsys, monkeypatch):  # noqa: F811
    path = os.path.join(SACCT, fixture)
    rc, out, err = run_audit(["--sacct-file", path, "--journal", JOURNAL, "--format", "json"],
                             capsys, monkeypatch)
    overall = json.loads(out)["overall"]
    want = recount(path)
    assert {k: overall[k] for k in ("attempts", "jobs", "preemptions")} == {
        k: want[k] for k in ("attempts", "jobs", "preemptions")}, err
    assert overall["gpu_hours"] == pytest.approx(want["gpu_hours"], abs=2e-3)


def test_synthetic_week_matches_golden(utc, capsys, monkeypatch):  # noqa: F811
    rc, out, err = run_audit(["--sacct-file", os.path.join(SACCT, "synthetic-week.txt"),
                              "--journal", JOURNAL, "--format", "json"], capsys, monkeypatch)
    assert rc in (0, 1), err
    report = json.loads(out)
    report["inputs"]["sacct"]["source"] = "synthetic-week.txt"
    report["inputs"]["journals"] = []
    check_golden("synthetic-week.txt.json", json.dumps(report, indent=2, sort_keys=True) + "\n")
def _paths(node: Any, prefix: str = "") -> set:
    out = set()
    if isinstance(node, dict):
        for key, value in node.items():
            out.add(f"{prefix}/{key}")
            out |= _paths(value, f"{prefix}/{key}")
    elif isinstance(node, list) and node:
        out |= _paths(node[0], prefix + "[]")
    return out


def test_hand_made_24_11_json_uses_only_what_real_24_11_prints() -> None:
    """24.11.json spells the scenario from the v0.0.42 documentation; every field it uses must
    be one the recorded 24.11.5 output has, with the same data_parser."""
    with open(os.path.join(SACCT, "24.11.json")) as fh:
        hand = json.load(fh)
    with open(os.path.join(SACCT, "24.11-recorded.json")) as fh:
        real = json.load(fh)
    assert hand["meta"]["plugin"]["data_parser"] == real["meta"]["plugin"]["data_parser"]
    missing = _paths(hand["jobs"][0]) - _paths(real["jobs"][0])
    assert not missing, sorted(missing)
