"""The agent's watch on a below-normal job's own MPS priority (slurmiso/agent/mps_priority.py):
a process that started with a raised ``CUDA_MPS_CLIENT_PRIORITY`` is ended and journaled;
the job's other processes, other jobs' and normal-priority jobs' are left alone.

The processes are real (they must die); which job's cgroup each is in and what environment
it started with are given by a /proc tree the test writes, as the kernel would show them."""

from __future__ import annotations

import os
import subprocess
from typing import Any, Dict, Iterator, List

import pytest

from slurmiso.agent.mps_priority import EV_REFUSED, assigned, priority_round, started_with
from slurmiso.state import JobRecord, Journal, Resource, ResourceState


def record(job: str, priority: int, namespace: bool = True) -> JobRecord:
    rec = JobRecord(job, mode="mps", gpus=[0])
    rec.status = "ready"  # type: ignore[assignment]
    extra: Dict[str, Any] = {"priority": priority}
    if namespace:
        extra.update(arrangement="shared-v3", namespace=f"job_{job}_0123456789abcdef")
    rec.resources.append(Resource("mps", ResourceState.READY, gpu=0, uid=1000,
                                  thread_percentage=60, extra=extra))
    return rec


@pytest.fixture()
def sleepers() -> Iterator[List[subprocess.Popen]]:
    procs: List[subprocess.Popen] = []
    yield procs
    for p in procs:
        p.kill()
        p.wait()


def fake(proc: str, pid: int, job: str, env: Dict[str, str]) -> None:
    folder = os.path.join(proc, str(pid))
    os.makedirs(folder)
    with open(os.path.join(folder, "cgroup"), "w") as fh:
        fh.write(f"0::/system.slice/slurmstepd.scope/job_{job}/step_batch/user/task_0\n")
    with open(os.path.join(folder, "environ"), "wb") as fh:
        fh.write(b"\0".join(f"{k}={v}".encode() for k, v in env.items()) + b"\0")


def test_a_raised_priority_is_ended_and_journaled_the_rest_left(
        tmp_path: Any, sleepers: List[subprocess.Popen]) -> None:
    proc = str(tmp_path / "proc")
    for _ in range(4):
        sleepers.append(subprocess.Popen(["sleep", "60"]))
    raised, kept, other_job, normal_job = sleepers
    fake(proc, raised.pid, "7", {"PATH": "/bin", "CUDA_MPS_CLIENT_PRIORITY": "0"})
    fake(proc, kept.pid, "7", {"CUDA_MPS_CLIENT_PRIORITY": "1"})
    fake(proc, other_job.pid, "8", {"CUDA_MPS_CLIENT_PRIORITY": "0"})  # no record here
    fake(proc, normal_job.pid, "9", {"CUDA_MPS_CLIENT_PRIORITY": "0"})  # infer: 0 is its own
    records = {"7": record("7", 1), "9": record("9", 0)}
    journal = Journal(str(tmp_path / "journal.jsonl"))
    lines = priority_round(records, "n2", journal, proc=proc, now=5.0)
    assert raised.wait(timeout=10) == -9
    assert [p.poll() for p in (kept, other_job, normal_job)] == [None, None, None]
    assert lines == [f"job 7: {EV_REFUSED}: process {raised.pid} started with "
                     "CUDA_MPS_CLIENT_PRIORITY='0' above its class's 1 (below normal) on a "
                     "shared MPS server: ended"]
    (event,) = journal.read(events={EV_REFUSED})
    assert (event["target"], event["details"]["pid"], event["details"]["value"]) == (
        "7", raised.pid, "0")


def test_a_pid_that_now_names_another_process_is_not_ended(
        tmp_path: Any, sleepers: List[subprocess.Popen]) -> None:
    """What /proc said at the scan is read again through the pidfd before the signal."""
    from slurmiso.agent import mps_priority

    proc = str(tmp_path / "proc")
    sleepers.append(subprocess.Popen(["sleep", "60"]))
    (p,) = sleepers
    fake(proc, p.pid, "7", {"CUDA_MPS_CLIENT_PRIORITY": "0"})
    assert mps_priority._end(p.pid, proc, "something else") is False
    assert p.poll() is None


def test_only_below_normal_jobs_on_a_shared_server_are_watched() -> None:
    records = {"1": record("1", 1), "2": record("2", 0), "3": record("3", 1, namespace=False)}
    assert assigned(records) == {"1": (1, "")}
    records["1"].status = "refused"  # type: ignore[assignment]
    assert assigned(records) == {}


def test_started_with_reads_the_variable_or_none(tmp_path: Any) -> None:
    proc = str(tmp_path)
    fake(proc, 11, "1", {"A": "b", "CUDA_MPS_CLIENT_PRIORITY": "1"})
    fake(proc, 12, "1", {"A": "CUDA_MPS_CLIENT_PRIORITY=0"})
    assert (started_with(11, proc), started_with(12, proc), started_with(13, proc)) == (
        "1", None, None)


def test_an_environment_padded_to_hide_the_variable_is_read_whole(tmp_path: Any) -> None:
    """A job can put up to 6 MiB of environment before its priority (Linux's cap on argv and
    environment together): the watch still finds it."""
    proc = str(tmp_path)
    padding = {f"PAD{i}": "x" * (127 << 10) for i in range(40)}  # 5 MiB, each under 128 KiB
    fake(proc, 21, "1", {**padding, "CUDA_MPS_CLIENT_PRIORITY": "0"})
    assert started_with(21, proc) == "0"
