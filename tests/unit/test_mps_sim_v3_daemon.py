"""The MPS stand-in's protocol 3 behind its sockets (issue 35, item 7): a real detached
daemon, v3 verbs over its control socket, a socket per server and namespace, and clients
of different users routed by the socket they reach. Closing a namespace's directory keeps a
user out of it: the file system decides, as for NVIDIA's daemon."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Dict, Iterator, List

import pytest

from slurmiso.isolation import mps_sim
from tests.unit.test_mps_enforcement import JOB_UID, STRANGER_UID, as_uid, needs_root, node
from tests.unit.test_mps_sim_v3 import needs_tomllib

__all__ = ["node"]  # the fixture, used by name


@pytest.fixture()
def daemon(node: str) -> Iterator[str]:
    """A multi-user protocol-3 stand-in whose pipe directory anyone may search."""
    pipe, logs = os.path.join(node, "pipe"), os.path.join(node, "log")
    for folder in (pipe, logs):
        os.makedirs(folder)
        os.chmod(folder, 0o755)
    assert mps_sim.main(["--pipe-dir", pipe, "--log-dir", logs, "--gpu-uuid", "GPU-x",
                         "-p", "3", "-m"]) == 0
    yield pipe
    mps_sim.send_command(pipe, "quit")


def ctl(pipe: str, line: str) -> str:
    """``nvidia-cuda-mps-control <verb>`` with this pipe directory, as the stand-in's CLI."""
    cp = subprocess.run([sys.executable, "-m", "slurmiso.isolation.mps_sim", *line.split()],
                        env=dict(os.environ, CUDA_MPS_PIPE_DIRECTORY=pipe),
                        capture_output=True, text=True, timeout=30, check=False)
    assert cp.returncode == 0, cp.stderr
    return cp.stdout


def client(directory: str, **env: str) -> Dict[str, object]:
    return mps_sim.connect(dict(env, CUDA_MPS_PIPE_DIRECTORY=directory))


def test_verbs_make_a_socket_per_server_and_namespace(daemon: str) -> None:
    ctl(daemon, "server create shared --uid=0")
    ctl(daemon, "namespace create train --server=shared")
    ctl(daemon, "namespace set train --server=shared --client-priority=1 "
                "--active-thread-percentage=60 --pinned-memory-limit=24G")
    for folder in ("shared", "shared/default", "shared/train"):
        assert os.path.exists(os.path.join(daemon, folder, "control")), folder
    assert ctl(daemon, "namespace get train shared client-priority") == "1\n"
    got = client(os.path.join(daemon, "shared", "train"))
    assert (got["namespace"], got["client_priority"], got["active_thread_percentage"]) == (
        "train", 1, 60.0)
    assert client(os.path.join(daemon, "shared"))["namespace"] == "default"
    rc, out = mps_sim.v3_command(daemon, ["namespace", "delete", "train", "--server=shared"])
    assert rc == 1 and "active clients" in out  # the client above is still registered
    assert mps_sim.v3_command(daemon, ["namespace", "delete", "train", "--server=shared",
                                       "--force"]) == (0, "")
    assert not os.path.exists(os.path.join(daemon, "shared", "train"))


@needs_root
def test_users_reach_only_the_namespaces_whose_directory_lets_them(daemon: str) -> None:
    ctl(daemon, "server create shared --uid=0")
    for ns, prio in (("infer", 0), ("train", 1)):
        ctl(daemon, f"namespace create {ns} --server=shared")
        ctl(daemon, f"namespace set {ns} --server=shared --client-priority={prio}")
    infer, train = (os.path.join(daemon, "shared", ns) for ns in ("infer", "train"))
    os.chmod(infer, 0o700)  # closed: root's alone (the prolog would open it to its jobs)
    os.chown(train, STRANGER_UID, -1)
    os.chmod(train, 0o700)

    def reach(directory: str, **env: str) -> Dict[str, object]:
        return client(directory, **env)

    trainer = as_uid(STRANGER_UID, lambda: reach(train))
    assert trainer["ok"]["client_priority"] == 1  # type: ignore[index]
    assert trainer["ok"]["uid"] == STRANGER_UID  # type: ignore[index]
    # its own variable wins over the namespace's (NVIDIA documents so): slurmiso must watch
    raised = as_uid(STRANGER_UID, lambda: reach(train, CUDA_MPS_CLIENT_PRIORITY="0"))
    assert raised["ok"]["client_priority"] == 0  # type: ignore[index]
    # the inference namespace's directory is closed to it: no way in
    assert as_uid(STRANGER_UID, lambda: reach(infer))["error"] == "PermissionError"
    assert as_uid(JOB_UID, lambda: reach(train))["error"] == "PermissionError"
    lines: List[str] = ctl(daemon, "client list --format=csv,noheader").splitlines()
    assert [line.split(",")[3] for line in lines] == ["train", "train"]


@needs_tomllib
def test_a_daemon_started_with_a_configuration_file_listens_for_its_namespaces(
        node: str) -> None:
    from tests.unit.test_mps_sim_v3 import CONFIG

    pipe, logs, conf = (os.path.join(node, x) for x in ("pipe", "log", "mps.toml"))
    for folder in (pipe, logs):
        os.makedirs(folder)
    with open(conf, "w") as fh:
        fh.write(CONFIG)
    assert mps_sim.main(["--pipe-dir", pipe, "--log-dir", logs, "--gpu-uuid", "GPU-x",
                         "-p", "3", "-m", "-a", conf]) == 0
    try:
        got = client(os.path.join(pipe, "shared", "train"))
        assert (got["client_priority"], got["pinned_device_mem_limit_mb"]) == (1, {"0": 24576})
    finally:
        mps_sim.send_command(pipe, "quit")
    with open(conf, "w") as fh:
        fh.write(CONFIG.replace('"1.0"', '"9"'))
    other = os.path.join(node, "pipe2")
    os.makedirs(other)
    assert mps_sim.main(["--pipe-dir", other, "--log-dir", logs, "--gpu-uuid", "GPU-x",
                         "-p", "3", "-a", conf]) == 1  # refused before it listens
    assert os.listdir(other) == []
