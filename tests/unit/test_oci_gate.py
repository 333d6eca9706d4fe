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
#: What the TaskProlog exported for the job (its record): the container must carry it.
EXPECTED = dict(e.split("=", 1) for e in MPS_ENV)
#: The node and record as read_job finds them for a ready MPS job.
READY = oci_gate.Job(managed=True, relay=False, expected=EXPECTED)


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
    assert oci_gate.refusal(config(MPS_ENV, bind(MPS_ROOT)), True, EXPECTED) is None


@pytest.mark.parametrize("mounts, says", [
    ((), "no mount in the container's config.json covers it"),
    ((bind(MPS_ROOT, "/home/u/fake-mps"),), "from host /home/u/fake-mps"),
    ((bind(MPS_ROOT), {"destination": "/run", "type": "tmpfs", "source": "tmpfs"}),
     "mounts a tmpfs at /run over it"),
])
def test_mps_job_that_cannot_reach_its_pipe_is_refused_with_the_reason(
        mounts: Any, says: str) -> None:
    reason = oci_gate.refusal(config(MPS_ENV, *mounts), True, EXPECTED)
    assert reason is not None and says in reason, reason
    assert PIPE in reason and "slurmiso gen oci-conf --config-json" in reason


def test_container_without_the_task_prologs_verdict_is_refused_on_a_managed_node() -> None:
    """Slurm 22.05 wrote config.json before the TaskProlog: no SLURMISO_* in it at all."""
    cfg = config(["CUDA_VISIBLE_DEVICES=0"], bind(MPS_ROOT))
    reason = oci_gate.refusal(cfg, managed=True)
    assert reason is not None and "TaskProlog" in reason and "22.05" in reason
    assert oci_gate.refusal(cfg, managed=False) is None  # a node in no slurmiso pool


@pytest.mark.parametrize("env, lost", [
    ([e for e in MPS_ENV if not e.startswith("CUDA_MPS_")], "CUDA_MPS_PIPE_DIRECTORY"),
    (MPS_ENV + ["CUDA_VISIBLE_DEVICES=0,1"], "CUDA_VISIBLE_DEVICES"),
], ids=["mps-dropped", "gpus-changed"])
def test_a_container_without_the_task_prologs_exports_unchanged_is_refused(
        env: List[str], lost: str) -> None:
    """An EnvExclude that drops CUDA_MPS_* leaves no pipe directory to check: the record
    says which variables the container must carry, and the gate asks for each."""
    reason = oci_gate.refusal(config(env, bind(MPS_ROOT)), True, EXPECTED)
    assert reason is not None and f"lacks or changes {lost}" in reason, reason


def test_a_classed_container_whose_record_cannot_be_read_is_refused() -> None:
    reason = oci_gate.refusal(config(MPS_ENV, bind(MPS_ROOT)), True, None)
    assert reason is not None and "isolation record" in reason


def test_refused_job_runs_without_gpus_as_it_would_bare() -> None:
    """The TaskProlog's refusal (empty CUDA_VISIBLE_DEVICES) reached the container: the
    device cgroup keeps the GPUs closed, as for a bare job."""
    cfg = config(["CUDA_VISIBLE_DEVICES=", "SLURMISO_REFUSED=no record"])
    assert oci_gate.refusal(cfg, managed=True) is None


def test_a_container_that_claims_a_refusal_its_ready_record_did_not_make_is_refused() -> None:
    """The record is read whatever the environment claims: a container whose environment
    says "refused" (so no pipe to check) while the job holds a share must carry the share's
    exports, or not run."""
    cfg = config(["CUDA_VISIBLE_DEVICES=", "SLURMISO_REFUSED=x"])
    reason = oci_gate.refusal(cfg, True, EXPECTED)
    assert reason is not None and "CUDA_MPS_PIPE_DIRECTORY" in reason, reason
    assert "SLURMISO_CLASS" in reason


def test_without_a_record_the_container_must_carry_the_task_prologs_refusal() -> None:
    from slurmiso.hooks.task_prolog import exports_of

    expected = exports_of(None, "42")
    assert expected["CUDA_VISIBLE_DEVICES"] == "" and "no isolation record" in \
        expected["SLURMISO_REFUSED"]
    refused = config([f"{k}={v}" for k, v in expected.items()])
    assert oci_gate.refusal(refused, True, expected) is None
    reason = oci_gate.refusal(config(MPS_ENV, bind(MPS_ROOT)), True, expected)
    assert reason is not None and "SLURMISO_REFUSED" in reason, reason


def test_last_entry_of_a_name_wins_as_in_the_runtime() -> None:
    env = MPS_ENV + ["CUDA_MPS_PIPE_DIRECTORY=/elsewhere/pipe"]
    reason = oci_gate.refusal(config(env, bind(MPS_ROOT)), True,
                              dict(EXPECTED, CUDA_MPS_PIPE_DIRECTORY="/elsewhere/pipe"))
    assert reason is not None and "/elsewhere/pipe" in reason


@pytest.mark.parametrize("bad", [
    {"process": {"env": "CUDA_VISIBLE_DEVICES=0"}},
    {"process": {"env": [1, 2]}},
    {"process": []},
    [],
    {"process": {"env": MPS_ENV}, "mounts": {"destination": MPS_ROOT}},
])
def test_unreadable_config_is_a_refusal(bad: Any) -> None:
    reason = oci_gate.refusal(bad, True, EXPECTED)
    assert reason is not None and "cannot read the container's config.json" in reason, reason


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
    monkeypatch.setattr(oci_gate, "read_job", lambda node, env: READY)
    bundle = _bundle(tmp_path, config(MPS_ENV))
    assert oci_gate.main(["n2", bundle, *_runtime(tmp_path)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("slurmiso: container refused: MPS pipe")
    assert not (tmp_path / "ran").exists()


@pytest.mark.parametrize("text, says", [
    ("{not json", "is not JSON"),
    ("x" * ((1 << 20) + 2), "over 1048576 bytes"),
], ids=["not-json", "too-large"])
def test_main_refuses_a_file_it_cannot_read(tmp_path: Any, capsys: Any, monkeypatch: Any,
                                            text: str, says: str) -> None:
    monkeypatch.setattr(oci_gate, "read_job", lambda node, env: READY)
    assert oci_gate.main(["n2", _bundle(tmp_path, text), *_runtime(tmp_path)]) == 1
    assert says in capsys.readouterr().err


def test_main_refuses_a_symlinked_config(tmp_path: Any, capsys: Any, monkeypatch: Any) -> None:
    monkeypatch.setattr(oci_gate, "read_job", lambda node, env: READY)
    real = tmp_path / "real.json"
    real.write_text(json.dumps(config(MPS_ENV, bind(MPS_ROOT))))
    os.symlink(real, tmp_path / "config.json")
    assert oci_gate.main(["n2", str(tmp_path), *_runtime(tmp_path)]) == 1
    assert "cannot open" in capsys.readouterr().err


def test_main_refuses_a_fifo_in_one_line(tmp_path: Any, capsys: Any, monkeypatch: Any) -> None:
    monkeypatch.setattr(oci_gate, "read_job", lambda node, env: READY)
    os.mkfifo(tmp_path / "config.json")
    assert oci_gate.main(["n2", str(tmp_path), *_runtime(tmp_path)]) == 1
    assert "is not a regular file" in capsys.readouterr().err


def test_main_execs_the_runtime_unchanged_when_the_share_holds(tmp_path: Any) -> None:
    """Run in a child: a passing gate replaces its process with the runtime (a job the
    TaskProlog refused: no record to check, GPUs closed by the device cgroup)."""
    import subprocess
    import sys

    bundle = _bundle(tmp_path, config(["CUDA_VISIBLE_DEVICES=", "SLURMISO_REFUSED=x"]))
    runtime = _runtime(tmp_path)
    env = dict(os.environ, SLURMISO_CONFIG=str(tmp_path / "absent.yaml"))  # unknown: strict
    cp = subprocess.run([sys.executable, "-m", "slurmiso.hooks.oci_gate", "n2", bundle,
                         *runtime], env=env, capture_output=True, text=True, timeout=60)
    assert cp.returncode == 0, cp.stderr
    assert (tmp_path / "ran").read_text().split() == runtime[1:]


def test_unknown_config_counts_as_a_managed_node(tmp_path: Any, monkeypatch: Any) -> None:
    monkeypatch.setenv("SLURMISO_CONFIG", str(tmp_path / "absent.yaml"))
    assert oci_gate.read_job("n2", {"SLURMISO_CLASS": "train"}) == oci_gate.Job(True, False, None)


@pytest.mark.parametrize("argv", [[], ["n2"], ["n2", "/b"], ["--node", "n2", "/b", "crun"]])
def test_usage_errors_exit_2(argv: List[str], capsys: Any) -> None:
    assert oci_gate.main(argv) == 2
    assert "RunTimeRun" in capsys.readouterr().err


EXAMPLE = os.path.join(os.path.dirname(__file__), "..", "..", "etc", "slurmiso.yaml")


def _node_with_record(tmp_path: Any, monkeypatch: Any, uid: int) -> None:
    """The example config with its state dir in ``tmp_path``, and a ready record of job 42
    for ``uid`` on gpu001 (a node of the example's pools)."""
    from slurmiso.config import load_config
    from slurmiso.state import NodeState
    from slurmiso.state.record import JobRecord, RecordStatus

    with open(EXAMPLE, encoding="utf-8") as fh:
        text = fh.read().replace("state_dir: /run/slurmiso ", f"state_dir: {tmp_path} ", 1)
    (tmp_path / "slurmiso.yaml").write_text(text)
    monkeypatch.setenv("SLURMISO_CONFIG", str(tmp_path / "slurmiso.yaml"))
    cfg = load_config()
    assert cfg.paths.state_dir == str(tmp_path)
    rec = JobRecord("42", RecordStatus.READY, uid=uid, job_class="train",
                    env={"CUDA_VISIBLE_DEVICES": "0", "CUDA_MPS_PIPE_DIRECTORY": PIPE})
    NodeState(cfg.paths.state_dir_for("gpu001")).write_job("42", rec)


JOB_ENV = {"SLURM_JOB_ID": "42", "SLURMD_NODENAME": "gpu001", "SLURMISO_CLASS": "train"}


def test_the_record_of_the_users_own_job_gives_what_the_container_must_carry(
        tmp_path: Any, monkeypatch: Any) -> None:
    _node_with_record(tmp_path, monkeypatch, os.getuid())
    job = oci_gate.read_job("gpu001", JOB_ENV)
    assert job.managed and job.relay  # train: preemptible, throttled by the ladder
    assert job.expected == {"CUDA_VISIBLE_DEVICES": "0", "CUDA_MPS_PIPE_DIRECTORY": PIPE,
                            "NVIDIA_VISIBLE_DEVICES": "void",  # the record readied no device
                            "SLURMISO_CLASS": "train"}
    # the record's class decides, not what the environment claims
    assert oci_gate.read_job("gpu001", dict(JOB_ENV, SLURMISO_CLASS="infer")).relay is True
    assert oci_gate.read_job("login1", JOB_ENV) == oci_gate.Job(False, False, None)


def test_another_users_record_is_not_the_containers(tmp_path: Any, monkeypatch: Any) -> None:
    """A container claiming another user's job id reads no record: refused if classed."""
    _node_with_record(tmp_path, monkeypatch, os.getuid() + 1)
    assert oci_gate.read_job("gpu001", JOB_ENV).expected is None


def test_a_job_with_no_record_is_expected_to_carry_its_refusal(
        tmp_path: Any, monkeypatch: Any) -> None:
    _node_with_record(tmp_path, monkeypatch, os.getuid())
    job = oci_gate.read_job("gpu001", dict(JOB_ENV, SLURM_JOB_ID="43"))
    assert job.managed and not job.relay
    assert job.expected is not None and job.expected["CUDA_VISIBLE_DEVICES"] == ""
    assert "SLURMISO_CLASS" not in job.expected and "SLURMISO_REFUSED" in job.expected


def test_the_runtime_does_not_inherit_pythons_ignored_sigpipe(tmp_path: Any) -> None:
    import signal
    import subprocess
    import sys

    bundle = _bundle(tmp_path, config(["CUDA_VISIBLE_DEVICES=", "SLURMISO_REFUSED=x"]))
    runtime = tmp_path / "runtime.sh"
    runtime.write_text(f"#!/bin/sh\ngrep ^SigIgn: /proc/self/status > {tmp_path}/ign\n")
    runtime.chmod(0o755)
    env = dict(os.environ, SLURMISO_CONFIG=EXAMPLE)
    cp = subprocess.run([sys.executable, "-m", "slurmiso.hooks.oci_gate", "gpu001",
                         bundle, str(runtime)], env=env, capture_output=True, text=True,
                        timeout=60)
    assert cp.returncode == 0, cp.stderr
    mask = int((tmp_path / "ign").read_text().split()[1], 16)
    assert not mask & (1 << (signal.SIGPIPE - 1)), hex(mask)


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
                                             ("paused", False), ("created", False),
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
