"""Host rung planning and writing: exact undo, tighten only, never memory.max, path checks."""

from __future__ import annotations

import os
import pathlib
import shutil
from typing import Dict

import pytest

from slurmiso.errors import HostLimitError, HostLimitRefused
from slurmiso.host.cgroup_figures import CgroupVersion, V1Dirs
from slurmiso.host.cgroup_writer import (
    FakeCgroupWriter,
    FileCgroupWriter,
    apply_plan,
    restore_plan,
)
from slurmiso.host.rate_limit import (
    CgroupWrite,
    LimitRequest,
    plan_limit,
    read_settings,
)

FIX = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "fixtures",
                   "host")
FULL = LimitRequest(cpu_cores=4.0, cpu_weight=10, io_weight=50, io_bps={"8:0": 50 * 2**20},
                    memory_high_bytes=16 * 2**30)


@pytest.fixture()
def v2_job(tmp_path: pathlib.Path) -> str:
    job = tmp_path / "slurmstepd.scope" / "job_4242"
    shutil.copytree(os.path.join(FIX, "v2", "job_4242"), str(job))
    return str(job)


def _files(job: str) -> Dict[str, str]:
    return {os.path.join(job, n): pathlib.Path(os.path.join(job, n)).read_text() for n in os.listdir(job)}


def test_v2_plan_writes_every_knob_and_never_memory_max(v2_job: str) -> None:
    plan = plan_limit(read_settings(CgroupVersion.V2, v2_job), FULL)
    writes = {(os.path.basename(w.path), w.value) for s in plan.steps for w in s.apply}
    assert writes == {
        ("cpu.max", "400000 100000"),
        ("cpu.weight", "10"),
        ("io.weight", "default 50"),
        ("io.weight", "8:16 50"),  # the override above the new default is lowered too
        ("io.max", f"8:0 rbps={50 * 2**20} wbps={50 * 2**20}"),
        ("memory.high", str(16 * 2**30)),
    }
    assert plan.skipped == ()
    assert not any(w.path.endswith("memory.max") for s in plan.steps for w in s.apply + s.restore)


def test_restore_exactly_undoes_the_limit(v2_job: str) -> None:
    """Apply then restore on a fake with the kernel's keyed-file semantics: same files."""
    before = _files(v2_job)
    plan = plan_limit(read_settings(CgroupVersion.V2, v2_job),
                      LimitRequest(cpu_cores=2.5, cpu_weight=20, io_weight=10,
                                   io_bps={"8:16": 2**20, "8:0": 2**30},
                                   memory_high_bytes=2**33))
    fake = FakeCgroupWriter([v2_job], before)
    apply_plan(fake, plan)
    limited = dict(fake.files)
    assert limited != before
    io_max = limited[os.path.join(v2_job, "io.max")]
    # 8:16 had rbps=2097152: tightened to 1 MiB; wiops=120 kept
    assert "8:16 rbps=1048576 wbps=1048576 riops=max wiops=120" in io_max
    restore_plan(fake, plan)
    for path, text in before.items():
        if os.path.basename(path) in ("io.max",):
            # 8:0 had no line: restore writes its limits back to max, as the kernel shows it
            assert "8:16 rbps=2097152 wbps=max riops=max wiops=120" in fake.files[path]
            assert "8:0 rbps=max wbps=max riops=max wiops=max" in fake.files[path]
        else:
            assert fake.files[path].split() == text.split(), path


def test_tighten_only_and_unreadable_is_not_written(v2_job: str) -> None:
    with open(os.path.join(v2_job, "cpu.max"), "w") as fh:
        fh.write("100000 100000\n")  # already 1 core
    os.remove(os.path.join(v2_job, "memory.high"))
    plan = plan_limit(read_settings(CgroupVersion.V2, v2_job),
                      LimitRequest(cpu_cores=4.0, memory_high_bytes=2**30, cpu_weight=500))
    assert plan.steps == ()
    assert any(s.startswith("cpu.max: already 100000 100000") for s in plan.skipped)
    assert any(s.startswith("memory.high: unreadable") for s in plan.skipped)
    assert any(s.startswith("cpu.weight: already 100") for s in plan.skipped)


def test_malformed_setting_is_skipped_not_guessed(v2_job: str) -> None:
    with open(os.path.join(v2_job, "io.weight"), "w") as fh:
        fh.write("default 100\n8:16 lots\n")
    with open(os.path.join(v2_job, "cpu.max"), "w") as fh:
        fh.write("max\n")
    plan = plan_limit(read_settings(CgroupVersion.V2, v2_job),
                      LimitRequest(cpu_cores=1.0, io_weight=10, cpu_weight=0))
    assert plan.steps == ()
    assert len(plan.skipped) == 3


def test_v1_plan_and_what_v1_cannot_do(tmp_path: pathlib.Path) -> None:
    root = tmp_path / "v1"
    shutil.copytree(os.path.join(FIX, "v1"), str(root))
    job = os.path.join("slurm", "uid_1000", "job_77")
    dirs = V1Dirs(cpu=str(root / "cpu,cpuacct" / job), blkio=str(root / "blkio" / job),
                  memory=str(root / "memory" / job))
    plan = plan_limit(read_settings(CgroupVersion.V1, dirs), FULL)
    writes = {(os.path.basename(w.path), w.value) for s in plan.steps for w in s.apply}
    assert writes == {("cpu.cfs_quota_us", "400000"), ("cpu.shares", "102"),
                      ("blkio.weight", "250")}
    restores = {(os.path.basename(w.path), w.value) for s in plan.steps for w in s.restore}
    assert restores == {("cpu.cfs_quota_us", "-1"), ("cpu.shares", "1024"),
                        ("blkio.weight", "500")}
    assert any("cgroup v1 has none" in s for s in plan.skipped)
    assert any("not on cgroup v1" in s for s in plan.skipped)
    writer = FileCgroupWriter([str(root)])
    apply_plan(writer, plan)
    assert pathlib.Path(os.path.join(dirs.cpu or "", "cpu.cfs_quota_us")).read_text() == "400000"
    restore_plan(writer, plan)
    assert pathlib.Path(os.path.join(dirs.cpu or "", "cpu.cfs_quota_us")).read_text() == "-1"
    assert pathlib.Path(os.path.join(dirs.memory or "", "memory.limit_in_bytes")).read_text() == "8589934592\n"


def test_writer_refuses_paths_outside_root_and_forbidden_files(v2_job: str) -> None:
    writer = FileCgroupWriter([v2_job])
    outside = os.path.join(os.path.dirname(v2_job), "cpu.max")
    open(outside, "w").close()
    for path in (outside,
                 os.path.join(v2_job, "..", "cpu.max"),
                 os.path.join(v2_job, "memory.max"),
                 v2_job + "_evil/cpu.max",
                 "cpu.max"):
        with pytest.raises(HostLimitRefused):
            writer.write(CgroupWrite(path, "1 100000"))
    assert pathlib.Path(os.path.join(v2_job, "memory.max")).read_text() == "max\n"


def test_writer_refuses_symlinks(v2_job: str, tmp_path: pathlib.Path) -> None:
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "cpu.max").write_text("max 100000\n")
    os.symlink(str(victim), os.path.join(v2_job, "step_0"))
    os.remove(os.path.join(v2_job, "cpu.weight"))
    os.symlink(str(victim / "cpu.max"), os.path.join(v2_job, "cpu.weight"))
    writer = FileCgroupWriter([v2_job])
    for path in (os.path.join(v2_job, "step_0", "cpu.max"), os.path.join(v2_job, "cpu.weight")):
        with pytest.raises(HostLimitRefused, match="symlink"):
            writer.write(CgroupWrite(path, "1"))
    assert (victim / "cpu.max").read_text() == "max 100000\n"


def test_writer_refuses_a_bad_root() -> None:
    with pytest.raises(HostLimitRefused):
        FileCgroupWriter(["/"])
    with pytest.raises(HostLimitRefused):
        FileCgroupWriter(["relative/job_1"])


def test_real_writer_does_not_create_missing_files(v2_job: str) -> None:
    os.remove(os.path.join(v2_job, "memory.high"))
    with pytest.raises(HostLimitError):
        FileCgroupWriter([v2_job]).write(CgroupWrite(os.path.join(v2_job, "memory.high"), "1"))
    assert not os.path.exists(os.path.join(v2_job, "memory.high"))


def test_failed_step_undoes_what_was_applied(v2_job: str) -> None:
    before = _files(v2_job)
    plan = plan_limit(read_settings(CgroupVersion.V2, v2_job),
                      LimitRequest(cpu_cores=4.0, cpu_weight=10, memory_high_bytes=2**30))
    fake = FakeCgroupWriter([v2_job], before)
    fake.fail_on[os.path.join(v2_job, "memory.high")] = "Device or resource busy"
    with pytest.raises(HostLimitError, match="error limiting memory.high"):
        apply_plan(fake, plan)
    for name in ("cpu.max", "cpu.weight", "memory.high"):
        path = os.path.join(v2_job, name)
        assert fake.files[path].split() == before[path].split()
