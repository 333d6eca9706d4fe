"""doctor's host checks (issue 36): Slurm's CPU and memory constraint, and class host quotas
on a cgroup version that can carry them."""

from __future__ import annotations

import os
from typing import Any, Dict, List

from slurmiso.config import load_config
from slurmiso.doctor import Finding
from slurmiso.doctor.host import check_host_constraints, check_host_quotas

EXAMPLE = os.path.join(os.path.dirname(__file__), "..", "..", "etc", "slurmiso.yaml")
GOOD = {"ConstrainCores": "yes", "ConstrainRAMSpace": "yes", "CgroupPlugin": "cgroup/v2"}


def _run(config: Dict[str, str]) -> List[Finding]:
    cfg = load_config(EXAMPLE)
    snap: Dict[str, Any] = {"config": config}
    return check_host_constraints(snap, cfg) + check_host_quotas(snap, cfg)


def test_a_constrained_v2_node_has_no_problem_and_says_who_writes_the_quotas() -> None:
    (info,) = _run(GOOD)
    assert (info.severity, info.code) == ("info", "host-quota")
    assert "train" in info.message and "node agent" in info.message


def test_each_missing_constraint_is_a_warning_naming_the_fix() -> None:
    found = _run(dict(GOOD, ConstrainCores="no", ConstrainRAMSpace="(null)"))
    warns = [f for f in found if f.is_problem]
    assert [f.code for f in warns] == ["host-constrain", "host-constrain"]
    assert "ConstrainCores" in warns[0].message and "every CPU" in warns[0].message
    assert "ConstrainRAMSpace" in warns[1].message
    assert all("gen cgroup-conf" in f.fix for f in warns)


def test_quotas_on_cgroup_v1_are_said_to_do_nothing_there() -> None:
    (info,) = _run(dict(GOOD, CgroupPlugin="cgroup/v1"))
    assert info.severity == "info" and "no cpu or blkio" in info.message
    assert "cgroup/v2" in info.fix


def test_a_snapshot_without_slurms_config_says_nothing() -> None:
    cfg = load_config(EXAMPLE)
    assert check_host_constraints({}, cfg) == [] and check_host_quotas({}, cfg) == []
