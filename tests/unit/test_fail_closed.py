"""Fail closed (issue 13): every way a job can miss its isolation ends with the job refused
(a record the task prolog turns into hidden GPUs) or the node drained with a one-line reason
naming the broken file -- never "internal error: KeyError", never a silent exit 0 that leaks
a GPU instance."""

from __future__ import annotations

import io
import json
import os
import shutil
import stat
from typing import Any, Callable, Dict, List

import pytest
import yaml

from slurmiso.gpu.sim import SimBackend
from slurmiso.hooks import runner, task_prolog
from slurmiso.hooks.runner import run_hook
from tests.hookctx import Drains, job_env, state, write_config


def mig_dynamic_config(tmp: str) -> str:
    cfg = write_config(tmp, "mig-dynamic", model="H100-80GB")
    with open(cfg) as fh:
        data = yaml.safe_load(fh)
    data["classes"][2].update(isolation="mig", mig_profile="3g.40gb")
    with open(cfg, "w") as fh:
        yaml.safe_dump(data, fh)
    SimBackend(f"{tmp}/sim/node1.json").set_mig_mode(0, True)
    return cfg


# ------------------------------------------------------------------ refusals leave a record
def test_qos_lookup_that_times_out_refuses_the_job_with_a_record(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    tmp = str(tmp_path)
    cfg = write_config(tmp, "exclusive")
    bindir = tmp_path / "bin"
    bindir.mkdir()
    fake = bindir / "squeue"
    fake.write_text("#!/bin/sh\nexec sleep 30\n")
    fake.chmod(0o755)
    monkeypatch.setenv("SLURMISO_SLURM_BIN", str(bindir))
    monkeypatch.setattr(runner, "QOS_LOOKUP_TIMEOUT_S", 0.3)
    env = job_env()
    del env["SLURM_JOB_QOS"]  # Slurm 22.05 does not export it: the prolog must ask
    drains = Drains()
    assert run_hook("prolog", env, cfg, drains) == 0
    rec = state(tmp).read_job("42")
    assert rec is not None and rec.status == "refused"
    assert "cannot learn the job's QoS" in rec.reason and "did not answer" in rec.reason
    assert rec.fence == {"uid": os.getuid(), "gpus": [0], "slurm_visible_devices": ""}
    assert task_prolog.lines_for(rec, "42")[0] == "export CUDA_VISIBLE_DEVICES="
    assert drains.calls == [] and state(tmp).allocations() == {}


def _task_prolog_output(monkeypatch: pytest.MonkeyPatch, cfg: str, **env: str) -> List[str]:
    monkeypatch.setenv("SLURMISO_CONFIG", cfg)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    out = io.StringIO()
    assert task_prolog.main([], out) == 0
    return out.getvalue().splitlines()


def test_task_prolog_treats_a_missing_record_as_refused(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The old task prolog printed nothing for a job without a record: raw GPU."""
    tmp = str(tmp_path)
    cfg = write_config(tmp, "exclusive")
    lines = _task_prolog_output(monkeypatch, cfg, SLURM_JOB_ID="77", SLURMD_NODENAME="node1")
    assert lines[0] == "export CUDA_VISIBLE_DEVICES="
    assert any("refused" in ln and "no isolation record" in ln for ln in lines)


def test_task_prolog_of_a_node_outside_every_pool_says_nothing(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = write_config(str(tmp_path), "exclusive")
    assert _task_prolog_output(monkeypatch, cfg, SLURM_JOB_ID="77",
                               SLURMD_NODENAME="login1") == []


def test_task_prolog_hides_gpus_when_the_record_is_unreadable(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    tmp = str(tmp_path)
    cfg = write_config(tmp, "exclusive")
    assert run_hook("prolog", job_env(), cfg, Drains()) == 0
    with open(state(tmp).job_path("42"), "w") as fh:
        fh.write("{not json")
    lines = _task_prolog_output(monkeypatch, cfg, SLURM_JOB_ID="42", SLURMD_NODENAME="node1")
    assert lines[0] == "export CUDA_VISIBLE_DEVICES="
    assert any("cannot read this job's isolation record" in ln for ln in lines)


def test_prolog_with_a_bad_job_id_leaves_no_record_and_the_task_prolog_refuses(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    tmp = str(tmp_path)
    cfg = write_config(tmp, "exclusive")
    drains = Drains()
    assert run_hook("prolog", job_env(job="../42"), cfg, drains) == 0 and drains.calls == []
    lines = _task_prolog_output(monkeypatch, cfg, SLURM_JOB_ID="../42", SLURMD_NODENAME="node1")
    assert lines[0] == "export CUDA_VISIBLE_DEVICES="


# ---------------------------------------------------------------------- corrupt state drains
def _record_path(tmp: str) -> str:
    return state(tmp).job_path("42")


def _edit_json(path: str, change: Callable[[Any], Any]) -> None:
    with open(path) as fh:
        data = json.load(fh)
    data = change(data)
    with open(path, "w") as fh:
        json.dump(data, fh)


def _write(path: str, text: str) -> None:
    os.unlink(path)
    with open(path, "w") as fh:
        fh.write(text)


def _set(key: str, value: Any) -> Callable[[Any], Any]:
    def change(data: Any) -> Any:
        data[key] = value
        return data
    return change


def _res(key: str, value: Any = None, drop: bool = False) -> Callable[[Any], Any]:
    def change(data: Any) -> Any:
        res = data["resources"][0]
        if drop:
            del res[key]
        else:
            res[key] = value
        return data
    return change


def _sim(change: Callable[[Any], Any]) -> Callable[[str], None]:
    return lambda tmp: _edit_json(f"{tmp}/sim/node1.json", change)


def _sim_gpu(key: str, drop_from_instance: bool = False) -> Callable[[Any], Any]:
    def change(data: Any) -> Any:
        if drop_from_instance:
            del data["gpus"][0]["instances"][0][key]
        else:
            del data["gpus"][0][key]
        return data
    return change


REC = "jobs/42.json"
ALLOC = "allocations.json"
SIM = "sim/node1.json"
#: (description, corrupt(tmp), text the one-line drain reason must hold)
CORRUPTIONS: List[Any] = [
    ("record not JSON", lambda t: _write(_record_path(t), "{\"job_id\": "), REC),
    ("record empty", lambda t: _write(_record_path(t), ""), REC),
    ("record binary", lambda t: _write(_record_path(t), "\x00\xff\x01"), REC),
    ("record a list", lambda t: _write(_record_path(t), "[1, 2]"), REC),
    ("record status a number", lambda t: _edit_json(_record_path(t), _set("status", 5)), REC),
    ("record unknown status", lambda t: _edit_json(_record_path(t), _set("status", "x")), REC),
    ("record status released (never written)",
     lambda t: _edit_json(_record_path(t), _set("status", "released")), REC),
    ("record of a newer schema", lambda t: _edit_json(_record_path(t), _set("schema", 99)), REC),
    ("record schema a string", lambda t: _edit_json(_record_path(t), _set("schema", "2")), REC),
    ("resource state unknown",
     lambda t: _edit_json(_record_path(t), _res("state", "gone")), REC),
    ("record resources a string",
     lambda t: _edit_json(_record_path(t), _set("resources", "x")), REC),
    ("record gpus not ints", lambda t: _edit_json(_record_path(t), _set("gpus", ["a"])), REC),
    ("record env a list", lambda t: _edit_json(_record_path(t), _set("env", [])), REC),
    ("record claims not keys", lambda t: _edit_json(_record_path(t), _set("claims", [1])), REC),
    ("resource without gi", lambda t: _edit_json(_record_path(t), _res("gi", drop=True)), REC),
    ("resource gi a string", lambda t: _edit_json(_record_path(t), _res("gi", "1")), REC),
    ("resource without gpu", lambda t: _edit_json(_record_path(t), _res("gpu", drop=True)), REC),
    ("resource without profile",
     lambda t: _edit_json(_record_path(t), _res("profile", drop=True)), REC),
    ("resource not an object",
     lambda t: _edit_json(_record_path(t), _set("resources", [7])), REC),
    ("record a symlink", lambda t: (os.unlink(_record_path(t)),
                                    os.symlink("/etc/hostname", _record_path(t))), REC),
    ("record a directory", lambda t: (os.unlink(_record_path(t)), os.mkdir(_record_path(t))),
     REC),
    ("allocations not JSON", lambda t: _write(f"{t}/state/node1/{ALLOC}", "{{"), ALLOC),
    ("allocations a list",
     lambda t: _edit_json(f"{t}/state/node1/{ALLOC}", _set("allocations", [])), ALLOC),
    ("allocations values not job ids",
     lambda t: _edit_json(f"{t}/state/node1/{ALLOC}", _set("allocations", {"k": 5})), ALLOC),
    ("sim state not JSON", lambda t: _write(f"{t}/{SIM}", "{"), SIM),
    ("sim state wrong version", _sim(_set("version", 99)), SIM),
    ("sim gpu without instances", _sim(_sim_gpu("instances")), SIM),
    ("sim gpu without mig flag", _sim(_sim_gpu("mig_enabled")), SIM),
    ("sim instance without gi_id", _sim(_sim_gpu("gi_id", drop_from_instance=True)), SIM),
    ("sim instance without start", _sim(_sim_gpu("start", drop_from_instance=True)), SIM),
    ("sim processes garbage", _sim(_set("processes", [{"pid": "x"}])), SIM),
    ("sim node name missing", _sim(lambda d: {k: v for k, v in d.items() if k != "node"}), SIM),
    ("sim load without memory",
     _sim(lambda d: (d["gpus"][0]["load"].pop("memory_mb"), d)[1]), SIM),
    ("journal is a directory", lambda t: (os.unlink(f"{t}/journal-node1.jsonl"),
                                          os.mkdir(f"{t}/journal-node1.jsonl")),
     "journal-node1.jsonl"),
    ("jobs dir deleted", lambda t: shutil.rmtree(f"{t}/state/node1/jobs"), "jobs"),
    ("record deleted", lambda t: os.unlink(_record_path(t)), "no record"),
    ("record and allocations deleted",
     lambda t: (os.unlink(_record_path(t)), os.unlink(f"{t}/state/node1/{ALLOC}")),
     "belong to no job record"),
]


@pytest.mark.parametrize("desc,corrupt,names", CORRUPTIONS, ids=[c[0] for c in CORRUPTIONS])
def test_corrupt_state_drains_with_a_reason_naming_the_file(
    tmp_path: Any, desc: str, corrupt: Callable[[str], Any], names: str
) -> None:
    tmp = str(tmp_path)
    cfg = mig_dynamic_config(tmp)
    assert run_hook("prolog", job_env(gpus="0"), cfg, Drains()) == 0
    rec = state(tmp).read_job("42")
    assert rec is not None and rec.status == "ready", rec
    sim = SimBackend(f"{tmp}/sim/node1.json")
    assert len(sim.instances()) == 1
    corrupt(tmp)
    drains = Drains()
    assert run_hook("epilog", job_env(gpus="0"), cfg, drains) == 1, desc
    assert len(drains.calls) == 1
    reason = drains.calls[0][1]
    assert "\n" not in reason and "internal error" not in reason, reason
    assert names in reason, reason


def test_a_real_node_fault_still_drains_among_hostile_jobs(tmp_path: Any) -> None:
    """Hostile input refuses jobs without draining; a lost GPU still drains."""
    tmp = str(tmp_path)
    cfg = write_config(tmp, "exclusive")
    drains = Drains()
    env: Dict[str, str] = job_env(job="50", SPANK_SLURMISO_MPS_MEM="9" * 310)
    assert run_hook("prolog", env, cfg, drains) == 0 and drains.calls == []
    SimBackend(f"{tmp}/sim/node1.json").set_lost(1, True)
    assert run_hook("prolog", job_env(job="51", gpus="1"), cfg, drains) == 1
    assert len(drains.calls) == 1 and "GPU 1" in drains.calls[0][1]


def test_the_record_reads_back_what_the_prolog_writes(tmp_path: Any) -> None:
    from slurmiso.state.record import SCHEMA, JobRecord

    tmp = str(tmp_path)
    cfg = mig_dynamic_config(tmp)
    assert run_hook("prolog", job_env(gpus="0"), cfg, Drains()) == 0
    with open(_record_path(tmp)) as fh:
        data = json.load(fh)
    assert data["schema"] == SCHEMA and JobRecord.from_dict(data).to_dict() == data
    assert stat.S_ISREG(os.stat(_record_path(tmp)).st_mode)
