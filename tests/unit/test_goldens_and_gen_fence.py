"""Golden-file discipline, and the generated device-fence configuration."""

from __future__ import annotations

import os
from typing import Any

import pytest

from slurmiso.cli.main import main
from tests.goldens import check_golden

EXAMPLE = os.path.join(os.path.dirname(__file__), "..", "..", "etc", "slurmiso.yaml")


def test_missing_golden_fails_and_is_not_written(tmp_path: Any, monkeypatch: Any) -> None:
    monkeypatch.delenv("UPDATE_GOLDEN", raising=False)
    path = str(tmp_path / "g" / "x.txt")
    with pytest.raises(AssertionError, match="missing"):
        check_golden(path, "text\n")
    assert not os.path.exists(path)


def test_update_golden_writes_then_compares(tmp_path: Any, monkeypatch: Any) -> None:
    path = str(tmp_path / "g" / "x.txt")
    monkeypatch.setenv("UPDATE_GOLDEN", "1")
    with pytest.warns(UserWarning, match="rewritten"):
        check_golden(path, "one\n")
    monkeypatch.delenv("UPDATE_GOLDEN")
    check_golden(path, "one\n")
    with pytest.raises(AssertionError, match="differs"):
        check_golden(path, "two\n")


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_gen_cgroup_conf(capsys: Any, version: str) -> None:
    assert main(["gen", "cgroup-conf", "--cgroup", version]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert f"CgroupPlugin=cgroup/{version}" in lines
    assert {"ConstrainDevices=yes", "ConstrainCores=yes", "ConstrainRAMSpace=yes"} <= set(lines)


def test_gen_plugstack_loads_the_fence(capsys: Any) -> None:
    assert main(["-c", EXAMPLE, "gen", "plugstack", "--fence-plugin", "/x/slurmiso_fence.so"]) == 0
    out = capsys.readouterr().out
    line = next(ln for ln in out.splitlines() if "slurmiso_fence.so" in ln)
    assert line.startswith("required /x/slurmiso_fence.so state_dir=/run/slurmiso")
    assert main(["-c", EXAMPLE, "gen", "plugstack", "--fence-plugin", ""]) == 0
    assert "slurmiso_fence" not in capsys.readouterr().out


def test_gen_slurm_conf_names_the_device_constraint(capsys: Any) -> None:
    assert main(["-c", EXAMPLE, "gen", "slurm-conf", "--slurm-version", "22.05.8"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "ProctrackType=proctrack/cgroup" in lines
    assert "TaskPlugin=task/cgroup,task/affinity" in lines
