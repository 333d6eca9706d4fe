"""The typed, versioned job record (state/record.py) and the one job-environment reader
(slurm/jobenv.py) that hooks, wrapper and checkpoint helper share (issue 14)."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from typing import Any, Dict

import pytest

from slurmiso import checkpoint
from slurmiso.errors import StateError
from slurmiso.slurm.jobenv import HOOK_VARS, STEP_VARS, JobEnv, JobEnvironment
from slurmiso.state import JobRecord, NodeState, RecordStatus, Resource, ResourceState
from slurmiso.state.record import SCHEMA, RecordError

#: A record exactly as slurmiso 0.1's prolog wrote it (schema 1) for a mig-dynamic job whose
#: second instance was being created when the node went down.
V1: Dict[str, Any] = {
    "schema": 1, "job_id": "42", "uid": 1000, "user": "alice", "node": "node1",
    "partition": "gpu", "account": "research", "pool": "p", "mode": "mig-dynamic",
    "gpus": [0, 1], "restart_count": 2, "status": "ready", "qos": "train",
    "class": "train", "class_reason": "qos train", "late_epilogs": 1,
    "env": {"CUDA_VISIBLE_DEVICES": "MIG-aaa"}, "claims": ["mig/0/gi1"],
    "warnings": ["w"], "times": {"prolog_start": 1.5, "prolog_end": 2.0},
    "fence": {"uid": 1000, "gpus": [0, 1], "slurm_visible_devices": "0,1"},
    "events_file": "/home/alice/.slurmiso-events.42", "updated": 2.0,
    "resources": [
        {"kind": "mig-dynamic", "gpu": 0, "profile": "3g.40gb", "start": 0, "gi": 1,
         "ci": 0, "uuid": "MIG-aaa", "state": "ready"},
        {"kind": "mig-dynamic", "gpu": 1, "profile": "3g.40gb", "start": 4,
         "state": "pending"},
        {"kind": "mig-dynamic", "gpu": 1, "profile": "1g.10gb", "gi": 9, "state": "released"},
    ],
}


def _write_raw(state: NodeState, job: str, data: Any) -> None:
    state.ensure()
    with open(state.job_path(job), "w") as fh:
        json.dump(data, fh)


def test_a_schema_1_file_loads_typed_and_is_rewritten_as_schema_2(tmp_path: Any) -> None:
    state = NodeState(str(tmp_path))
    _write_raw(state, "42", V1)
    rec = state.read_job("42")
    assert rec is not None
    assert (rec.status, rec.job_class, rec.restart_count, rec.late_epilogs) == (
        RecordStatus.READY, "train", 2, 1)
    assert [r.state for r in rec.resources] == [
        ResourceState.READY, ResourceState.PENDING, ResourceState.RELEASED]
    ready = rec.resources[0]
    assert (ready.gpu, ready.gi, ready.ci, ready.uuid, ready.is_mig) == (0, 1, 0, "MIG-aaa", True)
    assert rec.resources[1].gi is None  # pending: intent only
    state.write_job("42", rec)
    with open(state.job_path("42")) as fh:
        on_disk = json.load(fh)
    # the same keys, version 2: nothing the old file said is lost
    assert on_disk == {**V1, "schema": SCHEMA}
    assert SCHEMA == 2


def test_the_v1_released_status_migrates_to_releasing() -> None:
    """0.1 checked status "released" but never wrote it; a file that has it is mid-epilog."""
    rec = JobRecord.from_dict({**V1, "status": "released"})
    assert rec.status is RecordStatus.RELEASING
    with pytest.raises(RecordError, match="status 'released'"):
        JobRecord.from_dict({**V1, "schema": 2, "status": "released"})


def test_record_and_resource_states_are_separate_enums() -> None:
    assert {s.value for s in RecordStatus} == {"preparing", "ready", "refused", "releasing"}
    assert {s.value for s in ResourceState} == {"pending", "ready", "released", "kept"}
    with pytest.raises(RecordError, match="state 'refused'"):
        Resource.from_dict({"kind": "gpu", "gpu": 0, "state": "refused"})


@pytest.mark.parametrize("schema", [3, 99, 0, "2", True, None.__class__.__name__])
def test_an_unknown_version_is_corruption_naming_the_file(tmp_path: Any, schema: Any) -> None:
    state = NodeState(str(tmp_path))
    _write_raw(state, "42", {**V1, "schema": schema})
    with pytest.raises(StateError) as info:
        state.read_job("42")
    assert state.job_path("42") in str(info.value) and "schema version" in str(info.value)
    with pytest.raises(StateError, match="42.json"):
        state.jobs()


@pytest.mark.parametrize("field, value", [
    ("uid", True), ("restart_count", "2"), ("late_epilogs", 1.5), ("times", {"x": "now"}),
    ("env", {"A": 1}), ("updated", "yesterday"), ("warnings", "w"),
])
def test_wrong_types_are_refused_with_the_field(field: str, value: Any) -> None:
    with pytest.raises(RecordError, match=field):
        JobRecord.from_dict({**V1, field: value})


def test_round_trip_keeps_unknown_fields() -> None:
    data = {**V1, "schema": 2, "future": {"x": 1}}
    data["resources"] = [dict(V1["resources"][0], note="kept")]
    assert JobRecord.from_dict(data).to_dict() == data


# -- one job-environment reader ------------------------------------------------------------


def test_the_hooks_read_one_variable_per_fact() -> None:
    """The Prolog/Epilog restart count is SLURM_JOB_RESTART_COUNT only (the old reader fell
    back to the step's SLURM_RESTART_COUNT), the job id SLURM_JOB_ID only; GPU indices are
    SLURM_JOB_GPUS, CUDA_VISIBLE_DEVICES only where Slurm set no SLURM_JOB_GPUS (mps)."""
    base = {"SLURM_JOB_ID": "7", "SLURMD_NODENAME": "n1"}
    job = JobEnv.from_env({**base, "SLURM_RESTART_COUNT": "4", "CUDA_VISIBLE_DEVICES": "1"})
    assert (job.restart_count, job.gpus) == (0, (1,))
    job = JobEnv.from_env({**base, "SLURM_JOB_RESTART_COUNT": "3", "SLURM_JOB_GPUS": "1",
                           "CUDA_VISIBLE_DEVICES": "0"})
    assert (job.job_id, job.node, job.restart_count, job.gpus) == ("7", "n1", 3, (1,))
    with pytest.raises(Exception, match="not a Slurm job id"):
        JobEnv.from_env({"SLURM_JOBID": "7"})
    assert HOOK_VARS["restart_count"] != STEP_VARS["restart_count"]


def test_wrapper_and_checkpoint_helper_agree_on_random_environments(monkeypatch: Any) -> None:
    rng = random.Random(14)
    names = ["SLURM_RESTART_COUNT", "SLURM_JOB_RESTART_COUNT", "SLURMISO_RESTART_COUNT"]
    values = ["", "0", "3", "-1", " 2", "x", "9" * 20, "٣"]
    for _ in range(200):
        env = {n: rng.choice(values) for n in names if rng.random() < 0.7}
        for n in names:
            monkeypatch.delenv(n, raising=False)
        for n, v in env.items():
            monkeypatch.setenv(n, v)
        wrapper = JobEnvironment.from_env(dict(os.environ)).restart_count
        assert checkpoint.restart_count() == wrapper, env
        expect = int(env["SLURM_RESTART_COUNT"]) if env.get(
            "SLURM_RESTART_COUNT", "") in ("0", "3") else 0
        assert wrapper == expect, env


def test_the_task_prolog_reads_the_record_of_the_steps_job(tmp_path: Any) -> None:
    from slurmiso.hooks.task_prolog import lines_for

    rec = JobRecord.from_dict({**V1, "schema": 2})
    lines = lines_for(rec, "42")
    assert "export CUDA_VISIBLE_DEVICES=MIG-aaa" in lines
    assert "export SLURMISO_CLASS=train" in lines
    rec.status, rec.reason = RecordStatus.REFUSED, "too big"
    assert "print slurmiso: job 42 refused: too big" in lines_for(rec, "42")


def test_the_record_module_imports_nothing_heavy() -> None:
    code = ("import sys; before = set(sys.modules); "
            "import slurmiso.state.record, slurmiso.slurm.jobenv; "
            "print(sorted(m for m in ('dataclasses', 'yaml', 'pathlib', 'importlib.resources', "
            "'inspect') if m in set(sys.modules) - before))")
    env = dict(os.environ, PYTHONPATH=os.getcwd())
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=env, check=True).stdout.strip()
    assert out == "[]"


@pytest.mark.parametrize("status", ["ready", "released"])
def test_a_job_started_before_the_upgrade_ends_cleanly_after_it(tmp_path: Any,
                                                                status: str) -> None:
    """The prolog of slurmiso 0.1 wrote schema 1; the epilog of this version releases it."""
    from slurmiso.hooks.runner import run_hook
    from tests.hookctx import Drains
    from tests.killrounds import NODE, hook_env, leftovers, setup_node

    tmp = str(tmp_path)
    cfg = setup_node(tmp)
    env = hook_env(tmp, cfg, "42", 0, 0)
    assert run_hook("prolog", env, cfg, Drains()) == 0
    state = NodeState(f"{tmp}/state/{NODE}")
    with open(state.job_path("42")) as fh:
        data = json.load(fh)
    data.update(schema=1, status=status, late_epilogs=0)
    _write_raw(state, "42", data)
    drains = Drains()
    assert run_hook("epilog", env, cfg, drains) == 0 and drains.calls == []
    assert leftovers(tmp) == []
