"""The probe's host figures (issue 36): a run's job cgroup found from /proc/self/cgroup as
Slurm's cgroup/v2 lays it out, its stall shares from PSI totals (tests/fixtures/host), and
the node's pressure where the job's cgroup has none."""

from __future__ import annotations

import os
import pathlib
import shutil

from slurmiso.probe.hostfigs import figures, job_cgroup, snapshot
from slurmiso.probe.render import host_rows

FIX = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "fixtures",
                   "host")
JOB = "system.slice/n1_slurmstepd.scope/job_4242"


def _tree(tmp: pathlib.Path) -> pathlib.Path:
    shutil.copytree(os.path.join(FIX, "slurm-v2"), str(tmp / "cg"), symlinks=True)
    return tmp / "cg"


def test_the_job_directory_is_the_nearest_job_ancestor(tmp_path: pathlib.Path) -> None:
    root = _tree(tmp_path)
    (root / JOB / "step_0" / "user" / "task_0").mkdir(parents=True)
    text = f"0::/{JOB}/step_0/user/task_0\n"
    assert job_cgroup(text, str(root)) == str(root / JOB)
    assert job_cgroup("0::/user.slice/session-1.scope\n", str(root)) is None  # no job
    sluid = root / "s.slice" / "n2_slurmstepd.scope" / "s021M97FNEY500"  # Slurm 26.05
    (sluid / "step_batch" / "user" / "task_0").mkdir(parents=True)
    assert job_cgroup("0::/s.slice/n2_slurmstepd.scope/s021M97FNEY500/step_batch/user/"
                      "task_0\n", str(root)) == str(sluid)
    assert job_cgroup("4:memory:/slurm/uid_1000/job_7\n", str(root)) is None  # v1: none
    assert job_cgroup(f"0::/{JOB}/../../x/job_1\n", str(root)) is None  # never climbs out


def test_stall_shares_come_from_the_jobs_psi_totals(tmp_path: pathlib.Path) -> None:
    job = _tree(tmp_path) / JOB
    before = snapshot(str(job))
    assert before["scope"] == "job" and before["stall_us"]["cpu"] is not None
    psi = (job / "cpu.pressure").read_text().split("\n")
    total = before["stall_us"]["cpu"] + 2_500_000  # 2.5 s of CPU stall during a 10 s run
    psi[0] = " ".join(w if not w.startswith("total=") else f"total={total}"
                      for w in psi[0].split())
    (job / "cpu.pressure").write_text("\n".join(psi))
    (job / "memory.peak").write_text(f"{3 << 30}\n")
    fig = figures(before, snapshot(str(job)), 10.0, 19.5)
    assert fig["scope"] == "job" and fig["cpu_cores"] == 1.95
    assert fig["stall"]["cpu"] == 0.25 and fig["stall"]["memory"] == 0.0
    assert fig["memory_peak_mb"] == 3072.0


def test_without_the_jobs_psi_the_nodes_is_used_and_said(tmp_path: pathlib.Path) -> None:
    node = tmp_path / "pressure"
    node.mkdir()
    for res in ("cpu", "memory", "io"):
        (node / res).write_text("some avg10=0.00 avg60=0.00 avg300=0.00 total=1000\n")
    before = snapshot(None, str(node))
    (node / "io").write_text("some avg10=9.00 avg60=1.00 avg300=0.00 total=2001000\n")
    fig = figures(before, snapshot(None, str(node)), 4.0, None)
    assert fig["scope"] == "node" and fig["stall"]["io"] == 0.5 and fig["cpu_cores"] is None
    assert fig["memory_peak_mb"] is None  # the node has no job peak


def test_no_psi_anywhere_is_no_figure_never_zero(tmp_path: pathlib.Path) -> None:
    fig = figures(snapshot(None, str(tmp_path / "absent")),
                  snapshot(None, str(tmp_path / "absent")), 4.0, 2.0)
    assert fig["scope"] is None and set(fig["stall"].values()) == {None}
    assert fig["cpu_cores"] == 0.5


def test_a_counter_that_went_backwards_is_unknown() -> None:
    a = {"scope": "job", "stall_us": {"cpu": 500, "memory": 0, "io": 0}}
    b = {"scope": "job", "stall_us": {"cpu": 100, "memory": 0, "io": 0}}
    assert figures(a, b, 1.0, 1.0)["stall"]["cpu"] is None


def test_the_report_shows_alone_against_beside_training() -> None:
    fig = {"scope": "job", "cpu_cores": 0.9, "stall": {"cpu": 0.01, "memory": 0.0, "io": None}}
    mixed = dict(fig, stall={"cpu": 0.25, "memory": 0.0, "io": None})
    report = {"modes": [{"mode": "mps", "pool": "p", "host": {
        "infer": {"solo": fig, "mixed": mixed}, "train": {"solo": None, "mixed": None}}},
        {"mode": "mig-static", "pool": "q", "skipped": "no MIG pool"}]}
    assert host_rows(report) == [["mps", "p", "infer", "job", "0.90 -> 0.90", "1.0% -> 25.0%",
                                  "0.0% -> 0.0%", "- -> -"]]
