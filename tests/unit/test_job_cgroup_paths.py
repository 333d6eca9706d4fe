"""Which job a process belongs to, from its cgroup, with both of Slurm's v2 namings.

Slurm's cgroup/v2 plugin names a job's directory ``job_<id>`` up to 25.11 (and on 26.05 with
``CgroupJobIdPaths=yes``), and by the job's SLUID on 26.05 (``cgroup_p_step_create``:
``print_sluid(step->step_id.sluid)``, e.g. ``s42DM918PDCP00``, measured in the 26.05 sandbox on
cgroup v2); cgroup v1 keeps ``slurm_<node>/uid_<u>/job_<id>``. A fake /proc per test.
"""

from __future__ import annotations

import os
from types import SimpleNamespace
from typing import Dict, Optional

import pytest

from slurmiso import sluid as S
from slurmiso.gpu.backend import GpuProcess
from slurmiso.isolation import processes as P
from slurmiso.slurm.jobenv import JobEnv

SLUID = "s42DM918PDCP00"
OTHER = "s42DM918PDCQ00"
SCOPE = "/system.slice/n1_slurmstepd.scope"
HYBRID_HEAD = "9:name=systemd:/\n5:devices:/\n4:memory:/\n"


def fake_proc(tmp_path, procs: Dict[int, Dict[str, Optional[str]]]) -> str:
    root = tmp_path / "proc"
    for pid, files in procs.items():
        d = root / str(pid)
        d.mkdir(parents=True)
        if files.get("cgroup") is not None:
            (d / "cgroup").write_text(files["cgroup"] or "")
        if files.get("environ") is not None:
            (d / "environ").write_bytes((files["environ"] or "").encode().replace(b"\n", b"\0"))
    return str(root)


@pytest.mark.parametrize("cgroup, job", [
    ("5:devices:/slurm_n1/uid_1001/job_2605001/step_batch/task_0\n0::/\n", "2605001"),
    (f"0::{SCOPE}/job_2411003/step_0/user/task_0\n", "2411003"),
    (f"0::{SCOPE}/{SLUID}/step_batch/user/task_0\n", SLUID),
    (HYBRID_HEAD + f"0::/x.slice/n4_slurmstepd.scope/{SLUID}/step_extern/user/task_special\n",
     SLUID),
    ("0::/user.slice/session-3.scope\n", None),
    (f"0::{SCOPE}/s42dm918pdcp00/step_0/user/task_0\n", None),  # not print_sluid's form
])
def test_job_of_pid_reads_both_v2_namings_and_v1(tmp_path, cgroup: str,
                                                 job: Optional[str]) -> None:
    proc = fake_proc(tmp_path, {10: {"cgroup": cgroup}})
    assert P.job_of_pid(10, proc) == job


def test_a_job_id_cgroup_wins_over_the_environment(tmp_path) -> None:
    proc = fake_proc(tmp_path, {10: {"cgroup": f"0::{SCOPE}/job_7/step_0/user/task_0\n",
                                     "environ": "SLURM_JOB_ID=8\n"}})
    assert P.job_of_pid(10, proc) == "7"


def test_sluid_cgroup_belongs_to_the_job_with_that_sluid_only(tmp_path) -> None:
    proc = fake_proc(tmp_path, {
        10: {"cgroup": f"0::{SCOPE}/{SLUID}/step_0/user/task_0\n", "environ": ""},
        11: {"cgroup": f"0::{SCOPE}/{OTHER}/step_0/user/task_0\n",
             "environ": "SLURM_JOB_ID=2605001\n"},  # claims our job id: its cgroup says not
    })
    assert P.belongs_to(10, "2605001", SLUID, proc)  # env -i'd process: its cgroup decides
    assert not P.belongs_to(11, "2605001", SLUID, proc)
    gp = [GpuProcess(10, 0, 100), GpuProcess(11, 0, 100)]
    assert [p.pid for p in P.foreign_processes(gp, "2605001", proc, sluid=SLUID)] == [11]
    assert [p.pid for p in P.job_processes(gp, "2605001", -1, proc, sluid=SLUID)] == [10]


def test_without_the_jobs_sluid_a_sluid_cgroup_falls_back_to_the_environment(tmp_path) -> None:
    """A caller that does not know the SLUID (an older record) does as before: environ."""
    proc = fake_proc(tmp_path, {
        10: {"cgroup": f"0::{SCOPE}/{SLUID}/step_0/user/task_0\n",
             "environ": "SLURM_JOB_ID=2605001\n"},
        11: {"cgroup": f"0::{SCOPE}/{SLUID}/step_0/user/task_0\n", "environ": ""},
    })
    assert P.belongs_to(10, "2605001", "", proc)
    assert not P.belongs_to(11, "2605001", "", proc)
    # ... but never to let a process share the job's GPU: what a process says of itself is
    # no proof, so the foreign-process check counts both as foreign without the SLUID
    gp = [GpuProcess(10, 0, 100), GpuProcess(11, 0, 100)]
    assert [p.pid for p in P.foreign_processes(gp, "2605001", proc)] == [10, 11]


def test_job_id_cgroups_ignore_the_sluid(tmp_path) -> None:
    """26.05 with CgroupJobIdPaths=yes: job_<id> dirs, the hook still has a SLUID."""
    proc = fake_proc(tmp_path, {10: {"cgroup": f"0::{SCOPE}/job_2605001/step_0/user/task_0\n"}})
    assert P.belongs_to(10, "2605001", SLUID, proc)
    assert not P.belongs_to(10, "2605002", SLUID, proc)


def test_uid_filter_still_applies(tmp_path) -> None:
    proc = fake_proc(tmp_path, {10: {"cgroup": f"0::{SCOPE}/{SLUID}/step_0/user/task_0\n"}})
    uid = os.stat(os.path.join(proc, "10")).st_uid
    gp = [GpuProcess(10, 0, 100)]
    assert P.job_processes(gp, "1", uid, proc, sluid=SLUID) == gp
    assert P.job_processes(gp, "1", uid + 1, proc, sluid=SLUID) == []


@pytest.mark.parametrize("text, ok", [
    (SLUID, True), ("s0000000000000", True), ("S42DM918PDCP00", False),
    ("s42DM918PDCP0", False), ("s42DM918PDCP000", False), ("s42DM918PDCPI0", False),
    ("s42DM918PDCPL0", False), ("s42DM918PDCPO0", False), ("s42DM918PDCPU0", False),
    ("", False), ("job_123", False), ("s42DM918PDCP0\n", False),
])
def test_is_sluid_is_print_sluids_form(text: str, ok: bool) -> None:
    assert S.is_sluid(text) is ok
    assert S.valid_sluid(text) == (text if ok else "")


@pytest.mark.parametrize("cgroup, job", [
    # the first component naming a job counts: a job's delegated subtree cannot name another
    (f"0::{SCOPE}/{SLUID}/step_0/user/task_0/job_99\n", SLUID),
    (f"0::{SCOPE}/job_7/step_0/user/task_0/{OTHER}\n", "7"),
    (f"0::{SCOPE}/{SLUID}/step_0/user/{OTHER}\n", SLUID),
    ("0::/system.slice/job_1234567890123/step_0\n", None),  # no Slurm job id is 13 digits
])
def test_the_first_job_component_counts_for_the_epilog_and_the_monitor(
        tmp_path, cgroup: str, job: Optional[str]) -> None:
    """One parser (slurmiso/sluid.py) answers both: the epilog's process checks and the
    monitor's GPU owners (where a record's SLUID maps back to its job id)."""
    from slurmiso.agent.gpu_owners import rows

    proc = fake_proc(tmp_path, {10: {"cgroup": cgroup}})
    assert P.job_of_pid(10, proc) == job
    assert S.job_of_cgroup(cgroup) == job
    rec = SimpleNamespace(resources=[], job_class="train", uid=-1, fence={"sluid": SLUID})
    gp = [GpuProcess(10, 0, 100)]
    got = rows({"2605001": rec}, gp, [], proc=proc)
    owner = "2605001" if job == SLUID else ("" if job is None else job)
    assert {row[0] for row in got} == {owner}


@pytest.mark.parametrize("name, job", [
    ("job_12", "12"), (SLUID, SLUID), ("job_", None), ("job_12x", None), ("step_0", None),
    ("job_\u0661", None),  # a digit, but not an ASCII one
])
def test_job_of_dir(name: str, job: Optional[str]) -> None:
    assert S.job_of_dir(name) == job


def test_hook_env_reads_slurm_job_sluid_and_refuses_a_malformed_one() -> None:
    base = {"SLURM_JOB_ID": "2605001", "SLURMD_NODENAME": "n1", "SLURM_JOB_UID": "1001"}
    assert JobEnv.from_env(dict(base, SLURM_JOB_SLUID=SLUID)).sluid == SLUID
    assert JobEnv.from_env(dict(base, SLURM_JOB_SLUID="s; rm -rf /")).sluid == ""
    assert JobEnv.from_env(base).sluid == ""  # before 26.05


@pytest.mark.parametrize("cgroup, refused", [
    # PrologFlags=RunInJob: the extern slurmstepd forks the Prolog in the job's own cgroup
    (f"0::{SCOPE}/{SLUID}/step_extern/slurm\n", True),
    (f"0::{SCOPE}/job_2605001/step_extern/slurm\n", True),
    ("5:devices:/slurm_n2/uid_0/job_2605001/step_extern\n0::/\n", True),
    # without it: slurmd's own cgroup
    (f"0::{SCOPE}/slurmd\n", False),
    ("5:devices:/slurm_n2/system\n0::/\n", False),
    # a test run inside some other Slurm job is not a RunInJob prolog
    (f"0::{SCOPE}/job_99/step_0/user/task_0\n", False),
])
def test_mps_prolog_refuses_to_start_a_daemon_in_its_jobs_cgroup(tmp_path, cgroup: str,
                                                                refused: bool) -> None:
    from slurmiso.errors import NodeFault
    from slurmiso.isolation.mps import refuse_run_in_job

    proc = fake_proc(tmp_path, {os.getpid(): {"cgroup": cgroup}})
    if refused:
        with pytest.raises(NodeFault, match="RunInJob") as err:
            refuse_run_in_job("2605001", 0, SLUID, proc)
        assert "PrologFlags=Alloc,Contain" in (err.value.hint or "")
    else:
        refuse_run_in_job("2605001", 0, SLUID, proc)
