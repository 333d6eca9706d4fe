"""slurmiso-oci-gate: the last word before the OCI runtime starts a job's container.

The config.json fixtures follow the OCI runtime-spec (config.md: ``process.env`` is a list of
``NAME=value`` strings, ``mounts`` in mount order), shaped as slurmstepd 23.02+ writes them
(container.c ``_modify_config``: the bundle's mounts, then Slurm's, then the step's whole
environment in ``process.env``). The file is the user's, so every oddity is a refusal.
"""

from __future__ import annotations

import copy
import json
import os
import stat
from typing import Any, Dict, List

import pytest

from slurmiso.hooks import oci_gate
from tests.unit.test_ocispec_pipe import BASE, MPS_ROOT, PIPE, bind

MPS_ENV = [f"CUDA_MPS_PIPE_DIRECTORY={PIPE}", "CUDA_VISIBLE_DEVICES=0", "SLURMISO_CLASS=infer"]


def config(env: List[str], *mounts: Dict[str, Any]) -> Dict[str, Any]:
    cfg = copy.deepcopy(BASE)
    cfg["process"]["env"] = ["PATH=/usr/bin:/bin", *env]
    cfg["mounts"].extend(mounts)
    # what slurmstepd appends after the bundle's own mounts (batch step: the script)
    cfg["mounts"].append({"destination": "/tmp/slurm/startup", "type": "none",
                          "source": "/var/spool/slurmd/job00042/slurm_script",
                          "options": ["bind", "ro"]})
    return cfg


def test_mps_job_whose_bundle_binds_the_pipe_root_runs() -> None:
    assert oci_gate.refusal(config(MPS_ENV, bind(MPS_ROOT)), managed=True) is None


@pytest.mark.parametrize("mounts, says", [
    ((), "no mount in the container's config.json covers it"),
    ((bind(MPS_ROOT, "/home/u/fake-mps"),), "from host /home/u/fake-mps"),
    ((bind(MPS_ROOT), {"destination": "/run", "type": "tmpfs", "source": "tmpfs"}),
     "mounts a tmpfs at /run over it"),
])
def test_mps_job_that_cannot_reach_its_pipe_is_refused_with_the_reason(
        mounts: Any, says: str) -> None:
    reason = oci_gate.refusal(config(MPS_ENV, *mounts), managed=True)
    assert reason is not None and says in reason, reason
    assert PIPE in reason and "slurmiso gen oci-conf --config-json" in reason


def test_container_without_the_task_prologs_verdict_is_refused_on_a_managed_node() -> None:
    """Slurm 22.05 wrote config.json before the TaskProlog: no SLURMISO_* in it at all."""
    cfg = config(["CUDA_VISIBLE_DEVICES=0"], bind(MPS_ROOT))
    reason = oci_gate.refusal(cfg, managed=True)
    assert reason is not None and "TaskProlog" in reason and "22.05" in reason
    assert oci_gate.refusal(cfg, managed=False) is None  # a node in no slurmiso pool


def test_refused_job_runs_without_gpus_as_it_would_bare() -> None:
    """The TaskProlog's refusal (empty CUDA_VISIBLE_DEVICES) reached the container: the
    device cgroup keeps the GPUs closed, as for a bare job."""
    cfg = config(["CUDA_VISIBLE_DEVICES=", "SLURMISO_REFUSED=no record"])
    assert oci_gate.refusal(cfg, managed=True) is None


def test_last_entry_of_a_name_wins_as_in_the_runtime() -> None:
    env = MPS_ENV + ["CUDA_MPS_PIPE_DIRECTORY=/elsewhere/pipe"]
    reason = oci_gate.refusal(config(env, bind(MPS_ROOT)), managed=True)
    assert reason is not None and "/elsewhere/pipe" in reason


@pytest.mark.parametrize("bad", [
    {"process": {"env": "CUDA_VISIBLE_DEVICES=0"}},
    {"process": {"env": [1, 2]}},
    {"process": []},
    [],
    {"process": {"env": MPS_ENV}, "mounts": {"destination": MPS_ROOT}},
])
def test_unreadable_config_is_a_refusal(bad: Any) -> None:
    reason = oci_gate.refusal(bad, managed=True)
    assert reason is not None and ("cannot read" in reason or "config.json" in reason), reason


def _bundle(tmp_path: Any, cfg: Any) -> str:
    (tmp_path / "config.json").write_text(json.dumps(cfg) if not isinstance(cfg, str) else cfg)
    return str(tmp_path)


def _runtime(tmp_path: Any) -> List[str]:
    """A stand-in runtime that records that it ran (the gate execs it)."""
    marker = tmp_path / "ran"
    script = tmp_path / "runtime.sh"
    script.write_text(f"#!/bin/sh\necho \"$@\" > {marker}\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return [str(script), "run", "--bundle", str(tmp_path), "n2.u.42.0.0"]


def test_main_refuses_with_one_line_and_never_starts_the_runtime(
        tmp_path: Any, capsys: Any, monkeypatch: Any) -> None:
    monkeypatch.setattr(oci_gate, "node_managed", lambda node: True)
    bundle = _bundle(tmp_path, config(MPS_ENV))
    assert oci_gate.main(["n2", bundle, *_runtime(tmp_path)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("slurmiso: container refused: MPS pipe")
    assert not (tmp_path / "ran").exists()


@pytest.mark.parametrize("text, says", [
    ("{not json", "is not JSON"),
    ("x" * ((1 << 20) + 2), "over 1048576 bytes"),
])
def test_main_refuses_a_file_it_cannot_read(tmp_path: Any, capsys: Any, monkeypatch: Any,
                                            text: str, says: str) -> None:
    monkeypatch.setattr(oci_gate, "node_managed", lambda node: True)
    assert oci_gate.main(["n2", _bundle(tmp_path, text), *_runtime(tmp_path)]) == 1
    assert says in capsys.readouterr().err


def test_main_refuses_a_symlinked_config(tmp_path: Any, capsys: Any, monkeypatch: Any) -> None:
    monkeypatch.setattr(oci_gate, "node_managed", lambda node: True)
    real = tmp_path / "real.json"
    real.write_text(json.dumps(config(MPS_ENV, bind(MPS_ROOT))))
    os.symlink(real, tmp_path / "config.json")
    assert oci_gate.main(["n2", str(tmp_path), *_runtime(tmp_path)]) == 1
    assert "cannot open" in capsys.readouterr().err


def test_main_execs_the_runtime_unchanged_when_the_share_holds(tmp_path: Any) -> None:
    """Run in a child: a passing gate replaces its process with the runtime."""
    import subprocess
    import sys

    bundle = _bundle(tmp_path, config(MPS_ENV, bind(MPS_ROOT)))
    runtime = _runtime(tmp_path)
    env = dict(os.environ, SLURMISO_CONFIG=str(tmp_path / "absent.yaml"))  # unknown: strict
    cp = subprocess.run([sys.executable, "-m", "slurmiso.hooks.oci_gate", "n2", bundle,
                         *runtime], env=env, capture_output=True, text=True, timeout=60)
    assert cp.returncode == 0, cp.stderr
    assert (tmp_path / "ran").read_text().split() == runtime[1:]


def test_unknown_config_counts_as_a_managed_node(tmp_path: Any, monkeypatch: Any) -> None:
    monkeypatch.setenv("SLURMISO_CONFIG", str(tmp_path / "absent.yaml"))
    assert oci_gate.node_managed("n2") is True


@pytest.mark.parametrize("argv", [[], ["n2"], ["n2", "/b"], ["--node", "n2", "/b", "crun"]])
def test_usage_errors_exit_2(argv: List[str], capsys: Any) -> None:
    assert oci_gate.main(argv) == 2
    assert "RunTimeRun" in capsys.readouterr().err


EXAMPLE = os.path.join(os.path.dirname(__file__), "..", "..", "etc", "slurmiso.yaml")


def test_only_a_class_the_ladder_throttles_gets_the_relay(monkeypatch: Any) -> None:
    monkeypatch.setenv("SLURMISO_CONFIG", EXAMPLE)  # train: preemptible; infer: not
    assert oci_gate.relayed({"SLURMISO_CLASS": "train"}, managed=True) is True
    assert oci_gate.relayed({"SLURMISO_CLASS": "infer"}, managed=True) is False
    assert oci_gate.relayed({"SLURMISO_CLASS": "train"}, managed=False) is False
    assert oci_gate.relayed({"SLURMISO_CLASS": "no-such"}, managed=True) is False
    assert oci_gate.relayed({}, managed=True) is False


def _fake_runtime(tmp_path: Any, status: str) -> List[str]:
    """A runtime stand-in with crun's state/delete/run commands: state prints ``status``
    (``absent``: exits 1 as crun does for an unknown name); every call is logged."""
    log = tmp_path / "calls"
    script = tmp_path / "rt"
    script.write_text(
        "#!/bin/sh\n"
        f'echo "$*" >> {log}\n'
        'for a; do case "$a" in state) '
        f'[ {status} = absent ] && exit 1; echo \'{{"id": "x", "status": "{status}"}}\'; exit 0;; '
        "esac; done\n")
    script.chmod(0o755)
    return [str(script), "--root=/run/user/1000/", "run", "--bundle", "/b", "n1.u.42.0.0"]


@pytest.mark.parametrize("status, deleted", [("stopped", True), ("running", False),
                                             ("absent", False)])
def test_a_stopped_container_of_the_same_name_is_deleted_first(
        tmp_path: Any, status: str, deleted: bool) -> None:
    """A requeued attempt reuses %n.%u.%j.%s.%t: a runtime SIGKILLed at the end of a
    preemption's grace left its state, and the run would fail "already exists"."""
    said = oci_gate.clear_stale(_fake_runtime(tmp_path, status))
    calls = (tmp_path / "calls").read_text().splitlines()
    assert calls[0] == "--root=/run/user/1000/ state n1.u.42.0.0"
    if deleted:
        assert calls[1:] == ["--root=/run/user/1000/ delete --force n1.u.42.0.0"]
        assert "n1.u.42.0.0" in said and "stopped" in said
    else:
        assert calls[1:] == [] and said == ""
