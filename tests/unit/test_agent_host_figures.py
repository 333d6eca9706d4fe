"""The agent's host figures (issue 36 item 1): each job's cgroup found where Slurm lays it out,
never elsewhere; its figures exported per job, class and node; unknown figures absent with a
reason, never 0; the node's pressure and NICs beside them."""

from __future__ import annotations

import os
import shutil
from typing import Any, Dict

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from slurmiso.agent.host_figures import HostCollector, HostReport, gather_host
from slurmiso.exposition import host_series as h
from slurmiso.exposition.job_series import CLASS_UNRECORDED
from slurmiso.exposition.text import parse_prometheus_text
from slurmiso.host.cgroup_figures import CgroupVersion
from slurmiso.host.job_cgroups import job_cgroups, v2_scopes
from slurmiso.state.record import JobRecord

FIX = os.path.join(os.path.dirname(__file__), "..", "fixtures", "host")
V2 = os.path.join(FIX, "slurm-v2")
V1 = os.path.join(FIX, "v1")
PROC = os.path.join(FIX, "proc")
SYS = os.path.join(FIX, "sys")
SCOPE = os.path.join("system.slice", "n1_slurmstepd.scope")
SLUID = "s42DM918PDCP00"


def rec(cls: str, uid: int = -1, sluid: str = "") -> JobRecord:
    d: Dict[str, Any] = {"class": cls, "uid": uid, "resources": []}
    if sluid:
        d["fence"] = {"sluid": sluid}
    return JobRecord.from_dict(d)


def scrape(report: HostReport) -> Dict[Any, float]:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(HostCollector(lambda: report, report.node))
    text = generate_latest(registry).decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for s in parse_prometheus_text(text)}


def value(got: Dict[Any, float], name: str, **labels: str) -> Any:
    return got.get((name, tuple(sorted(labels.items()))))


def test_v2_jobs_are_found_in_the_nodes_stepd_scope_only() -> None:
    found = job_cgroups(V2, "n1")
    assert sorted(found) == ["4242", "4243"], "job_12x is no name Slurm writes"
    assert found["4242"].v2 == os.path.join(V2, SCOPE, "job_4242")
    assert found["4242"].version is CgroupVersion.V2
    # one slurmd on the host: the plain scope
    assert sorted(job_cgroups(V2, "")) == ["9"]
    assert v2_scopes(V2, "n2") == [os.path.join(V2, "system.slice", "slurmstepd.scope")]


def test_a_sluid_directory_is_a_job_only_through_its_record() -> None:
    assert "5" not in job_cgroups(V2, "n1", {})
    assert job_cgroups(V2, "n1", {SLUID: "5"})["5"].v2 == os.path.join(V2, SCOPE, SLUID)


def test_v1_jobs_are_found_per_controller_under_slurm_uid_job() -> None:
    found = job_cgroups(V1, "n1")  # no slurm_n1: the plain slurm/ tree
    assert list(found) == ["77"]
    dirs = found["77"].v1
    assert dirs is not None and found["77"].uid == 1000
    assert dirs.cpu == dirs.cpuacct == os.path.join(V1, "cpu,cpuacct", "slurm", "uid_1000",
                                                   "job_77")
    assert dirs.memory == os.path.join(V1, "memory", "slurm", "uid_1000", "job_77")
    assert dirs.blkio == os.path.join(V1, "blkio", "slurm", "uid_1000", "job_77")


def test_symlinks_odd_names_and_doubles_are_skipped(tmp_path: Any) -> None:
    """A job directory that is a symlink (to anything a user could write), or a v1 job filed
    under two uids, is nobody's to read."""
    root = str(tmp_path / "v2")
    shutil.copytree(V2, root)
    scope = os.path.join(root, SCOPE)
    elsewhere = str(tmp_path / "user-writable")
    shutil.copytree(os.path.join(scope, "job_4242"), elsewhere)
    os.symlink(elsewhere, os.path.join(scope, "job_666"))
    os.mkdir(os.path.join(scope, "job_7.bak"))
    assert sorted(job_cgroups(root, "n1")) == ["4242", "4243"]
    # the node scope itself a symlink: not Slurm's; the plain scope is used
    os.rename(scope, os.path.join(root, "system.slice", "moved"))
    os.symlink(os.path.join(root, "system.slice", "moved"), scope)
    assert sorted(job_cgroups(root, "n1")) == ["9"]

    v1 = str(tmp_path / "v1")
    shutil.copytree(V1, v1)
    shutil.copytree(os.path.join(v1, "memory", "slurm", "uid_1000", "job_77"),
                    os.path.join(v1, "memory", "slurm", "uid_1001", "job_77"))
    assert job_cgroups(v1, "") == {}
    assert job_cgroups(str(tmp_path / "nothing"), "") == {}


def test_v1_per_node_tree_wins(tmp_path: Any) -> None:
    """Several slurmd -N on one host: slurm_<node>/uid_U/job_J (the sandbox's layout)."""
    v1 = str(tmp_path / "v1")
    shutil.copytree(V1, v1)
    for c in ("cpu,cpuacct", "memory", "blkio"):
        os.rename(os.path.join(v1, c, "slurm"), os.path.join(v1, c, "slurm_n3"))
    assert list(job_cgroups(v1, "n3")) == ["77"]
    assert job_cgroups(v1, "n4") == {}


def test_v2_job_figures_are_exported_with_class_and_unknowns() -> None:
    records = {"4242": rec("train", 1000), "4243": rec("infer"), "50": rec("train")}
    got = scrape(gather_host(records, "n1", V2, PROC, SYS))
    who = {"job": "4242", "class": "train", "node": "n1"}
    assert value(got, h.M_JOB_CPU, **who) == pytest.approx(8420.000123)
    assert value(got, h.M_JOB_CPU_THROTTLED, **who) == pytest.approx(96.0)
    assert value(got, h.M_JOB_CPU_THROTTLED_PERIODS, **who) == 1250
    assert value(got, h.M_JOB_MEM_CURRENT, **who) == 34359738368
    assert value(got, h.M_JOB_MEM_PEAK, **who) == 42949672960
    assert value(got, h.M_JOB_MEM_EVENTS, event="oom_kill", **who) == 1
    assert value(got, h.M_JOB_IO_BYTES, direction="write", **who) == 1073857024
    assert value(got, h.M_JOB_IO_OPS, direction="read", **who) == 9142
    assert value(got, h.M_JOB_PSI, resource="cpu", kind="some", **who) == pytest.approx(0.2351)
    assert value(got, h.M_JOB_PSI_STALLED, resource="cpu", kind="some",
                 **who) == pytest.approx(48.211533)
    assert not any(k[0] == h.M_JOB_HOST_UNKNOWN and ("job", "4242") in k[1] for k in got)
    # 4243 has only cpu.stat and memory.current: the rest is absent, each with its reason
    part = {"job": "4243", "class": "infer", "node": "n1"}
    assert value(got, h.M_JOB_CPU, **part) is not None
    assert value(got, h.M_JOB_MEM_PEAK, **part) is None, "absent, never 0"
    assert value(got, h.M_JOB_PSI, resource="io", kind="some", **part) is None
    assert value(got, h.M_JOB_HOST_UNKNOWN, figure="memory_peak", reason=h.R_UNREADABLE,
                 **part) == 1
    assert value(got, h.M_JOB_HOST_UNKNOWN, figure="pressure_io_some",
                 reason=h.R_UNREADABLE, **part) == 1
    # a recorded job Slurm's layout does not show: every figure unknown, none exported
    gone = {"job": "50", "class": "train", "node": "n1"}
    assert value(got, h.M_JOB_CPU, **gone) is None
    assert value(got, h.M_JOB_HOST_UNKNOWN, figure="cpu", reason=h.R_NO_CGROUP, **gone) == 1


def test_a_job_without_a_record_is_unrecorded_and_the_node_is_beside_it() -> None:
    got = scrape(gather_host({}, "n1", V2, PROC, SYS))
    assert value(got, h.M_JOB_CPU, job="4242", node="n1", **{"class": CLASS_UNRECORDED})
    assert value(got, h.M_HOST_UP, node="n1") == 1
    assert value(got, h.M_NODE_PSI, node="n1", resource="cpu",
                 kind="some") == pytest.approx(0.412)
    assert value(got, h.M_NODE_NET_BYTES, node="n1", device="eth0",
                 direction="receive") == 9876543210
    assert value(got, h.M_NODE_NET_SPEED, node="n1", device="eth0") == 25_000 * 1e6 / 8
    assert value(got, h.M_NODE_NET_SPEED, node="n1", device="veth1") is None, "-1: unknown"


def test_v1_exports_its_equivalents_and_names_what_v1_lacks() -> None:
    got = scrape(gather_host({"77": rec("train", 1000)}, "n1", V1, PROC, SYS))
    who = {"job": "77", "class": "train", "node": "n1"}
    assert value(got, h.M_JOB_CPU, **who) is not None
    assert value(got, h.M_JOB_MEM_CURRENT, **who) is not None
    assert value(got, h.M_JOB_IO_BYTES, direction="read", **who) is not None
    assert value(got, h.M_JOB_PSI, resource="cpu", kind="some", **who) is None
    for fig in ("pressure_cpu_some", "pressure_memory_full", "memory_oom", "memory_high"):
        assert value(got, h.M_JOB_HOST_UNKNOWN, figure=fig, reason=h.R_CGROUP_V1, **who) == 1
    # filed under another uid than the record's: not read
    got = scrape(gather_host({"77": rec("train", 2000)}, "n1", V1, PROC, SYS))
    assert value(got, h.M_JOB_CPU, job="77", node="n1", **{"class": "train"}) is None


def test_a_failed_read_is_up_0_and_nothing_else() -> None:
    from slurmiso.errors import SlurmisoError

    def broken() -> HostReport:
        raise SlurmisoError("state dir unreadable")

    registry = CollectorRegistry(auto_describe=False)
    registry.register(HostCollector(broken, "n1"))
    samples = parse_prometheus_text(generate_latest(registry).decode())
    assert [(s.name, s.value) for s in samples] == [(h.M_HOST_UP, 0.0)]


def test_a_sluid_job_is_exported_under_the_id_its_record_gives() -> None:
    """Slurm 26.05 names the job's v2 directory by its SLUID: the record that names it gives
    the job id and class; without one the directory is nobody's (no id to export it under)."""
    got = scrape(gather_host({"5": rec("infer", sluid=SLUID)}, "n1", V2, PROC, SYS))
    assert value(got, h.M_JOB_PSI, job="5", node="n1", resource="cpu", kind="some",
                 **{"class": "infer"}) == pytest.approx(0.2351)
    got = scrape(gather_host({}, "n1", V2, PROC, SYS))
    assert not any(("job", SLUID) in k[1] for k in got)
