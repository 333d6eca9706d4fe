"""``slurmiso audit`` against the real sandbox: a train job preempted by an infer job is
counted as a preemption and a requeue, from live ``sacct`` and from a saved file.

Takes ~40 s: Slurm requeues a preempted batch job only when its GraceTime (30 s) runs out
(see test_sandbox.test_infer_job_preempts_and_requeues_train_job). Set
``SLURMISO_RECORD_FIXTURES=1`` to copy this run's sacct output (both formats) into
tests/fixtures/sacct/<release>-recorded.* for the golden tests, and ``squeue --json`` and
``scontrol show node --json`` into tests/fixtures/slurm/<release>/ (each with a ``.cmd``).
"""

from __future__ import annotations

import json
import os
import shutil
import time

from slurmiso.audit.read.collect import known_fields

FIXTURES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                        "fixtures", "sacct")


def test_audit_counts_the_preemption_and_requeue(sandbox, submit, wait_for, tmp_path):
    debug = submit("#!/bin/bash\nsleep 1\n", "-p", "gpu", "--gres=gpu:1", "--qos=debug")
    wait_for(debug, timeout=60)
    train = submit("#!/bin/bash\necho attempt ${SLURM_RESTART_COUNT:-0}\nsleep 300\n",
                   "-p", "gpu", "--gres=gpu:2", "--qos=train")
    wait_for(train, {"RUNNING"}, timeout=30)
    infer = submit("#!/bin/bash\nsleep 1\n", "-p", "gpu", "--gres=gpu:1", "--qos=infer")
    wait_for(infer, timeout=75)
    deadline = time.monotonic() + 30
    while "PREEMPTED" not in [r["State"] for r in sandbox.sacct(train)]:
        assert time.monotonic() < deadline, sandbox.sacct(train)
        time.sleep(0.5)
    sandbox.cmd("scancel", train)  # the requeued attempt need not run: 2 attempts recorded

    # live: sacct over the last hour (other tests' jobs may be in it too: at least ours).
    # slurmdbd records the cancelled requeue asynchronously: poll until it has settled.
    deadline = time.monotonic() + 30
    while True:
        cp = sandbox.slurmiso("audit", "--since", "1h", "--format", "json")
        assert cp.returncode in (0, 1), cp.stderr
        live = json.loads(cp.stdout)
        if live["classes"].get("train", {}).get("preemptions", 0) >= 1:
            break
        assert time.monotonic() < deadline, (live["classes"], sandbox.sacct(train))
        time.sleep(1)
    assert live["classes"]["train"]["preemptions"] >= 1, live["classes"]
    # Not asserted live: a requeued attempt Slurm holds back (BeginTime +120 s) and that is
    # cancelled before it was eligible may be missing from a live `sacct -S` window (seen on
    # a fresh sandbox); the saved file below (`-D`, this job only) must count it exactly.
    assert live["inputs"]["sacct"]["bad"] == 0 and not live["inputs"]["sacct"]["truncated"]

    # exact: the same through a saved file holding only this test's jobs
    ids = ",".join([debug, train, infer])
    saved = {}
    fields = ",".join(known_fields(sandbox.cmd("sacct", "--helpformat")))
    for ext, fmt in (("txt", ["-P", "--format=" + fields]), ("json", ["--json"])):
        path = tmp_path / f"sacct.{ext}"
        path.write_text(sandbox.cmd("sacct", "-a", "-D", "-S", "now-1hour", "-j", ids, *fmt))
        saved[ext] = str(path)
        cp = sandbox.slurmiso("audit", "--sacct-file", str(path), "--format", "json")
        assert cp.returncode in (0, 1), cp.stderr
        report = json.loads(cp.stdout)
        train_stats = report["classes"]["train"]
        assert (train_stats["jobs"], train_stats["preemptions"], train_stats["requeues"]) == (
            1, 1, 1), (ext, report["classes"])
        assert train_stats["lost_gpu_hours_estimated"] > 0  # no checkpoint: whole run lost
        assert report["classes"]["infer"]["jobs"] == 1 and report["classes"]["debug"]["jobs"] == 1
        _check_scenario_golden(saved[ext], report)
    if os.environ.get("SLURMISO_RECORD_FIXTURES"):
        record_fixtures(sandbox, saved, ids)


def _check_scenario_golden(path: str, report: dict) -> None:
    """The preemption scenario's golden (tests/golden/audit/sandbox-preemption.json): per class
    (jobs, attempts, requeues, preemptions), which do not vary between runs, and the figures
    checked against the independent csv recount of the saved ``-P`` file."""
    from tests.unit.test_audit_golden import check_golden, recount

    figures = {name: [c[k] for k in ("jobs", "attempts", "requeues", "preemptions")]
               for name, c in report["classes"].items() if c["attempts"]}
    check_golden("sandbox-preemption.json", json.dumps(figures, indent=2, sort_keys=True) + "\n")
    if path.endswith(".txt"):
        want = recount(path)
        overall = report["overall"]
        assert [overall[k] for k in ("attempts", "jobs", "preemptions")] == [
            want[k] for k in ("attempts", "jobs", "preemptions")]
        assert abs(overall["gpu_hours"] - want["gpu_hours"]) < 2e-3


def record_fixtures(sandbox, saved, ids) -> None:
    """Copy this run's outputs into the fixtures, named by the sandbox's Slurm release, each
    with a ``.cmd`` sibling holding the command that produced it."""
    release = ".".join(sandbox.cmd("scontrol", "--version").split()[-1].split(".")[:2])
    base = os.path.join(FIXTURES, f"{release}-recorded")
    sacct = f"sacct -a -D -S now-1hour -j {ids}"
    fields = ",".join(known_fields(sandbox.cmd("sacct", "--helpformat")))
    for ext, fmt in (("txt", "-P --format=" + fields), ("json", "--json")):
        shutil.copy(saved[ext], f"{base}.{ext}")
        with open(f"{base}.{ext}.cmd", "w") as fh:
            fh.write(f"{sacct} {fmt}\n")
    other = os.path.join(os.path.dirname(FIXTURES), "slurm", release)
    os.makedirs(other, exist_ok=True)
    for name, argv in (("squeue.json", ["squeue", "--json"]),
                       ("node-n1.json", ["scontrol", "show", "node", "n1", "--json"])):
        with open(os.path.join(other, name), "w") as fh:
            fh.write(sandbox.cmd(*argv))
        with open(os.path.join(other, f"{name}.cmd"), "w") as fh:
            fh.write(" ".join(argv) + "\n")
