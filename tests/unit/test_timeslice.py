"""The GPU time slice of timeslice pools (issue 35, item 4): config, the prolog's once-a-boot
setting through the backend, nvidia-smi's argv and failures, and doctor's check."""

from __future__ import annotations

import json
import os
import stat
from typing import Any, Dict, List

import pytest
import yaml

from slurmiso.config import load_config
from slurmiso.config.model import TIMESLICES
from slurmiso.errors import ConfigError, GpuError
from slurmiso.gpu.sim import SimBackend
from slurmiso.gpu.timeslice import RECORD, SmiTimeslice, Timeslice, ensure, read_record, stale
from slurmiso.hooks.runner import run_hook
from tests.hookctx import Drains, job_env, journal, state, write_config


def test_the_names_are_nvidia_smis_codes_in_order() -> None:
    """nvidia-smi compute-policy --help: 0=DEFAULT, 1=SHORT, 2=MEDIUM, 3=LONG."""
    assert [(t.value, t.code) for t in Timeslice] == [
        ("default", 0), ("short", 1), ("medium", 2), ("long", 3)]
    assert tuple(t.value for t in Timeslice) == TIMESLICES
    with pytest.raises(ValueError, match="one of default, short, medium, long"):
        Timeslice.parse("tiny")


class Setter:
    """Counts the settings asked of it; ``fail_on`` GPUs raise as nvidia-smi's failure does."""

    def __init__(self, fail_on: tuple = ()) -> None:
        self.calls: List[tuple] = []
        self.fail_on = fail_on

    def set_compute_timeslice(self, index: int, value: Timeslice) -> None:
        if index in self.fail_on:
            raise GpuError(f"GPU {index}: nvidia-smi compute-policy exited 3")
        self.calls.append((index, value))


def uuid(i: int) -> str:
    return f"GPU-{i}"


def test_set_once_a_boot_and_again_after_a_reboot_or_a_change(tmp_path: Any) -> None:
    st = str(tmp_path)
    s = Setter()
    assert ensure(s, st, [0, 1], uuid, Timeslice.SHORT, "boot-a") == [0, 1]
    assert ensure(s, st, [1, 0], uuid, Timeslice.SHORT, "boot-a") == []
    assert ensure(s, st, [1], uuid, Timeslice.SHORT, "boot-b") == [1]  # rebooted: driver forgot
    assert ensure(s, st, [0], uuid, Timeslice.LONG, "boot-b") == [0]  # the config changed
    assert s.calls == [(0, Timeslice.SHORT), (1, Timeslice.SHORT), (1, Timeslice.SHORT),
                       (0, Timeslice.LONG)]
    assert read_record(st) == {"GPU-0": {"value": "long", "boot": "boot-b"},
                               "GPU-1": {"value": "short", "boot": "boot-b"}}
    assert oct(os.stat(os.path.join(st, RECORD)).st_mode & 0o777) == "0o644"


def test_without_a_boot_id_every_job_sets_it_again(tmp_path: Any) -> None:
    s = Setter()
    for _ in range(2):
        ensure(s, str(tmp_path), [0], uuid, Timeslice.SHORT, "")
    assert len(s.calls) == 2


def test_a_failure_keeps_what_was_set_before_it(tmp_path: Any) -> None:
    st = str(tmp_path)
    with pytest.raises(GpuError, match="exited 3"):
        ensure(Setter(fail_on=(1,)), st, [0, 1], uuid, Timeslice.SHORT, "b")
    assert read_record(st) == {"GPU-0": {"value": "short", "boot": "b"}}


@pytest.mark.parametrize("text", ["", "[1, 2]", "{not json", '{"GPU-0": 7}'])
def test_an_unreadable_record_sets_every_gpu_again(tmp_path: Any, text: str) -> None:
    with open(os.path.join(str(tmp_path), RECORD), "w") as fh:
        fh.write(text)
    s = Setter()
    assert ensure(s, str(tmp_path), [0], uuid, Timeslice.SHORT, "b") == [0]


def fake_smi(folder: str, rc: int = 0, said: str = "") -> str:
    """An nvidia-smi that logs its argv, says ``said`` on stderr and exits ``rc``."""
    path = os.path.join(folder, "nvidia-smi")
    with open(path, "w") as fh:
        fh.write(f"#!/bin/sh\necho \"$@\" >> {folder}/argv\necho '{said}' >&2\nexit {rc}\n")
    os.chmod(path, stat.S_IRWXU)
    return path


def test_the_real_setter_runs_nvidia_smi_on_the_gpus_uuid(tmp_path: Any) -> None:
    folder = str(tmp_path)
    SmiTimeslice(lambda i: f"GPU-abc-{i}", fake_smi(folder)).set_compute_timeslice(
        3, Timeslice.MEDIUM)
    with open(os.path.join(folder, "argv")) as fh:
        assert fh.read().split() == ["compute-policy", "-i", "GPU-abc-3", "--set-timeslice", "2"]


def test_a_refusal_by_nvidia_smi_is_one_clear_error(tmp_path: Any) -> None:
    smi = fake_smi(str(tmp_path), rc=2, said="Insufficient Permissions")
    with pytest.raises(GpuError, match=r"GPU 0: .*--set-timeslice 1 exited 2: "
                                       "Insufficient Permissions"):
        SmiTimeslice(uuid, smi).set_compute_timeslice(0, Timeslice.SHORT)


def test_no_nvidia_smi_is_one_clear_error(monkeypatch: Any) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(GpuError, match="nvidia-smi is not on PATH"):
        SmiTimeslice(uuid).set_compute_timeslice(0, Timeslice.SHORT)


def _config(tmp: str, mode: str, value: Any) -> str:
    path = write_config(tmp, mode)
    with open(path) as fh:
        data = yaml.safe_load(fh)
    data["pools"][0]["timeslice"] = value
    with open(path, "w") as fh:
        yaml.safe_dump(data, fh)
    return path


@pytest.mark.parametrize("mode,value,error", [
    ("mps", "short", "only a timeslice pool's GPUs take turns by time slice (pool p is mps): "
                     "remove it, or set mode: timeslice"),
    ("timeslice", "tiny", "'tiny' is not allowed (allowed: default, short, medium, long)"),
])
def test_check_config_refuses_a_time_slice_it_cannot_honour(tmp_path: Any, mode: str,
                                                            value: str, error: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(_config(str(tmp_path), mode, value))
    assert error in str(err.value) and "pools[0].timeslice" in str(err.value)


def test_the_prolog_sets_the_pools_time_slice_once_a_boot(tmp_path: Any) -> None:
    """Two jobs on GPU 1: the first job's prolog sets it (journaled), the second finds this
    boot's record and leaves the GPU alone; GPU 0 stays as the driver had it."""
    tmp = str(tmp_path)
    cfg = _config(tmp, "timeslice", "short")
    sim = SimBackend(f"{tmp}/sim/node1.json")
    for job in ("42", "43"):
        assert run_hook("prolog", job_env(job, qos="train", gpus="1"), cfg, Drains()) == 0
        assert state(tmp).read_job(job).status == "ready"
    assert (sim.compute_timeslice(0), sim.compute_timeslice(1)) == ("default", "short")
    sets = [e for e in journal(tmp) if e["event"] == "timeslice-set"]
    assert [(e["job"], e["gpus"], e["value"]) for e in sets] == [("42", [1], "short")]


def test_a_failed_setting_warns_and_runs_the_job(tmp_path: Any, monkeypatch: Any) -> None:
    tmp = str(tmp_path)
    cfg = _config(tmp, "timeslice", "long")

    def refuse(self: Any, index: int, value: Timeslice) -> None:
        raise GpuError(f"GPU {index}: nvidia-smi compute-policy exited 9: Not Supported")

    monkeypatch.setattr(SimBackend, "set_compute_timeslice", refuse)
    assert run_hook("prolog", job_env(qos="train", gpus="0"), cfg, Drains()) == 0
    rec = state(tmp).read_job("42")
    assert rec.status == "ready"
    assert rec.warnings[0] == ("the GPU time slice stays as it was, not long: GPU 0: "
                               "nvidia-smi compute-policy exited 9: Not Supported")


def _snap(record: Dict[str, Any], boot: str) -> Dict[str, Any]:
    return {"gpu_node": {"node": "node1", "pool": "p",
                         "devices": [{"index": 0, "uuid": "GPU-0"}, {"index": 1, "uuid": "GPU-1"}],
                         "timeslice": {"record": record, "boot": boot}}}


def test_doctor_names_the_gpus_not_set_this_boot(tmp_path: Any) -> None:
    from slurmiso.doctor.gpus import check_timeslice

    cfg = load_config(_config(str(tmp_path), "timeslice", "short"))
    ok = {"GPU-0": {"value": "short", "boot": "b2"}, "GPU-1": {"value": "short", "boot": "b2"}}
    assert check_timeslice(_snap(ok, "b2"), cfg) == []
    off = {"GPU-0": {"value": "short", "boot": "b1"}, "GPU-1": {"value": "long", "boot": "b2"}}
    (found,) = check_timeslice(_snap(off, "b2"), cfg)
    assert found.code == "timeslice" and found.severity == "info"
    assert "GPU 0: set to short before the last reboot; GPU 1: set to long" in found.message
    (found,) = check_timeslice(_snap({}, "b2"), cfg)
    assert "GPU 0: never set by slurmiso; GPU 1: never set by slurmiso" in found.message


def test_stale_is_empty_only_when_every_gpu_matches() -> None:
    rec = {"U0": {"value": "short", "boot": "b"}}
    assert stale(rec, {0: "U0"}, Timeslice.SHORT, "b") == {}
    assert stale(rec, {0: "U0", 1: "U1"}, Timeslice.SHORT, "b") == {1: "never set by slurmiso"}
    assert json.dumps(stale(rec, {0: "U0"}, Timeslice.DEFAULT, "b")) == '{"0": "set to short"}'
