"""MPS control daemons: the simulated one for real, NVIDIA's through a fake binary."""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import textwrap
import threading
import time
from typing import Any, Dict, Iterator, List, Optional

import psutil
import pytest

from slurmiso.errors import NodeFault
from slurmiso.isolation import mps_sim
from slurmiso.isolation.mps_daemon import (
    NVIDIA_PID_FILE,
    NvidiaMpsControl,
    SimMpsControl,
    mps_control_for,
)

UUID = "GPU-11111111-2222-3333-4444-555555555555"


def gone(pid: int) -> bool:
    """Dead or a zombie (PID 1 in some containers does not reap reparented daemons)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def wait_gone(pid: int, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while not gone(pid) and time.monotonic() < deadline:
        time.sleep(0.02)
    return gone(pid)


def kill_processes_under(path: str) -> None:
    """End every process (but this one) whose command line names ``path`` (test finalizer)."""
    for proc in psutil.process_iter(["pid", "cmdline"]):
        try:
            if proc.pid != os.getpid() and any(path in part for part in proc.info["cmdline"] or []):
                proc.kill()
        except psutil.Error:
            pass


@pytest.fixture()
def dirs(tmp_path: Any) -> Iterator[Dict[str, str]]:
    pipe, log = tmp_path / "pipe", tmp_path / "log"
    pipe.mkdir()
    log.mkdir()
    yield {"pipe": str(pipe), "log": str(log)}
    kill_processes_under(str(tmp_path))
    # The fake NVIDIA daemon is a sleeper whose command line does not name tmp_path.
    pidfile = pipe / NVIDIA_PID_FILE
    if pidfile.exists():
        try:
            proc = psutil.Process(int(pidfile.read_text().strip()))
            if proc.pid != os.getpid() and "nvidia-cuda-mps-control" in proc.cmdline():
                proc.kill()
        except (psutil.Error, ValueError):
            pass


# -- simulated daemon -------------------------------------------------------------------------


def test_sim_start_running_stop_round_trip_leaves_no_process(dirs: Dict[str, str]) -> None:
    control = SimMpsControl()
    pid = control.start(UUID, dirs["pipe"], dirs["log"])
    assert psutil.pid_exists(pid) and not gone(pid)
    assert pid != os.getpid() and psutil.Process(pid).ppid() != os.getpid()  # detached
    assert control.running(dirs["pipe"]) == pid
    assert sorted(os.listdir(dirs["pipe"])) == [mps_sim.SOCKET, mps_sim.PID_FILE]
    control.stop(dirs["pipe"], timeout=5.0)
    assert wait_gone(pid)
    assert control.running(dirs["pipe"]) is None
    assert os.listdir(dirs["pipe"]) == []
    with open(os.path.join(dirs["log"], mps_sim.LOG_FILE)) as fh:
        logtext = fh.read()
    assert UUID in logtext and "command: quit" in logtext and "exiting" in logtext


def test_sim_daemon_gets_a_clean_environment(dirs: Dict[str, str], monkeypatch: Any) -> None:
    monkeypatch.setenv("SLURMISO_LEAK_CHECK", "1")
    control = SimMpsControl()
    pid = control.start(UUID, dirs["pipe"], dirs["log"])
    env = psutil.Process(pid).environ()
    control.stop(dirs["pipe"], 5.0)
    assert "SLURMISO_LEAK_CHECK" not in env
    assert env["CUDA_VISIBLE_DEVICES"] == UUID
    assert env["CUDA_MPS_PIPE_DIRECTORY"] == dirs["pipe"]
    assert env["CUDA_MPS_LOG_DIRECTORY"] == dirs["log"]


def test_sim_stop_without_daemon_is_fine(dirs: Dict[str, str], tmp_path: Any) -> None:
    control = SimMpsControl()
    control.stop(dirs["pipe"], 1.0)
    control.stop(str(tmp_path / "never-created"), 1.0)
    assert control.running(dirs["pipe"]) is None


def test_sim_killed_daemon_is_not_running_and_stop_clears_its_leftovers(dirs: Dict[str, str]) -> None:
    control = SimMpsControl()
    pid = control.start(UUID, dirs["pipe"], dirs["log"])
    os.kill(pid, signal.SIGKILL)
    assert wait_gone(pid)
    assert mps_sim.PID_FILE in os.listdir(dirs["pipe"])  # a corpse leaves its files
    assert control.running(dirs["pipe"]) is None
    control.stop(dirs["pipe"], 1.0)
    assert os.listdir(dirs["pipe"]) == []


def test_sim_sigterm_exits_cleanly(dirs: Dict[str, str]) -> None:
    control = SimMpsControl()
    pid = control.start(UUID, dirs["pipe"], dirs["log"])
    os.kill(pid, signal.SIGTERM)
    assert wait_gone(pid)
    deadline = time.monotonic() + 2
    while os.listdir(dirs["pipe"]) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert os.listdir(dirs["pipe"]) == []


def test_sim_servers_lists_started_servers(dirs: Dict[str, str]) -> None:
    control = SimMpsControl()
    control.start(UUID, dirs["pipe"], dirs["log"])
    assert control.servers(dirs["pipe"]) == []
    mps_sim.send_command(dirs["pipe"], "start_server -uid 1234")
    assert control.servers(dirs["pipe"]) == [100000]
    assert "invalid command" in mps_sim.send_command(dirs["pipe"], "bogus")
    control.stop(dirs["pipe"], 5.0)
    assert control.servers(dirs["pipe"]) == []


def test_sim_running_ignores_a_reused_pid(dirs: Dict[str, str]) -> None:
    with open(os.path.join(dirs["pipe"], mps_sim.PID_FILE), "w") as fh:
        fh.write(f"{os.getpid()}\n")  # alive, but it is pytest, not a daemon
    assert SimMpsControl().running(dirs["pipe"]) is None


def test_sim_start_failure_is_a_node_fault(tmp_path: Any) -> None:
    missing = str(tmp_path / "no-such-dir")
    with pytest.raises(NodeFault, match="did not start"):
        SimMpsControl().start(UUID, missing, missing)


def test_mps_control_for_follows_the_declared_capability() -> None:
    from slurmiso.gpu.nvml import NvmlBackend
    from slurmiso.gpu.sim import SimBackend

    assert isinstance(mps_control_for(SimBackend("/nonexistent")), SimMpsControl)
    assert isinstance(mps_control_for(NvmlBackend()), NvidiaMpsControl)  # no NVML call made


# -- NVIDIA daemon through a fake binary ------------------------------------------------------

_FAKE = """\
#!{python}
# Stand-in for nvidia-cuda-mps-control: records argv/env/stdin, daemonizes a sleeper.
import json, os, signal, subprocess, sys
MODE = {mode!r}
entry = {{"argv": sys.argv, "env": dict(os.environ)}}
pipe = os.environ.get("CUDA_MPS_PIPE_DIRECTORY", "/tmp/nvidia-mps")
pidfile = os.path.join(pipe, "nvidia-cuda-mps-control.pid")
rc = 0
if sys.argv[1:] == ["-d"]:
    if MODE == "fail":
        sys.stderr.write("boom: no GPU\\n")
        rc = 1
    else:
        p = subprocess.Popen(["nvidia-cuda-mps-control", "60"], executable={sleep!r},
                             start_new_session=True, stdin=subprocess.DEVNULL,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        with open(pidfile, "w") as fh:
            fh.write(str(p.pid))
else:
    entry["stdin"] = sys.stdin.read()
    words = entry["stdin"].split()
    state_path = os.path.join(pipe, "fake-state.json")
    state = json.load(open(state_path)) if os.path.exists(state_path) else {{}}
    if entry["stdin"].strip() == "quit" and MODE != "ignore_quit":
        os.kill(int(open(pidfile).read()), signal.SIGTERM)
    elif words[:1] == ["set_default_active_thread_percentage"] and MODE != "ignore_limits":
        state["threads"] = float(words[1])
    elif words[:1] == ["get_default_active_thread_percentage"]:
        print("%.1f" % state.get("threads", 100.0))
    elif words[:1] == ["set_default_device_pinned_mem_limit"] and MODE != "ignore_limits":
        state["mem" + words[1]] = words[2]
    elif words[:1] == ["get_default_device_pinned_mem_limit"]:
        print(state.get("mem" + words[1], "0M"))
    json.dump(state, open(state_path, "w"))
with open({record!r}, "a") as fh:
    fh.write(json.dumps(entry) + "\\n")
sys.exit(rc)
"""


def fake_binary(tmp_path: Any, mode: str = "") -> str:
    path = tmp_path / "bin" / "nvidia-cuda-mps-control"
    path.parent.mkdir(exist_ok=True)
    path.write_text(textwrap.dedent(_FAKE).format(
        python=sys.executable, mode=mode, sleep=shutil.which("sleep"),
        record=str(tmp_path / "calls.jsonl"),
    ))
    path.chmod(0o755)
    return str(path)


def calls(tmp_path: Any) -> List[Dict[str, Any]]:
    with open(tmp_path / "calls.jsonl") as fh:
        return [json.loads(line) for line in fh]


def _mps_env(env: Dict[str, str]) -> Dict[str, str]:
    # Python's C-locale coercion may add LC_CTYPE inside the fake; it is not ours.
    return {k: v for k, v in env.items() if k != "LC_CTYPE"}


def test_nvidia_start_runs_d_with_a_clean_env_and_stop_sends_quit(
    tmp_path: Any, dirs: Dict[str, str], monkeypatch: Any
) -> None:
    monkeypatch.setenv("SLURMISO_LEAK_CHECK", "1")
    binary = fake_binary(tmp_path)
    control = NvidiaMpsControl(binary=binary, start_timeout=5.0)
    pid = control.start(UUID, dirs["pipe"], dirs["log"])
    assert control.running(dirs["pipe"]) == pid
    expected = {
        "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
        "LANG": "C",
        "CUDA_VISIBLE_DEVICES": UUID,
        "CUDA_MPS_PIPE_DIRECTORY": dirs["pipe"],
        "CUDA_MPS_LOG_DIRECTORY": dirs["log"],
    }
    start = calls(tmp_path)[0]
    assert start["argv"] == [binary, "-d"]
    assert _mps_env(start["env"]) == expected
    control.stop(dirs["pipe"], timeout=5.0)
    assert wait_gone(pid)
    assert control.running(dirs["pipe"]) is None
    client_calls = calls(tmp_path)[1:]
    assert [c["stdin"].strip() for c in client_calls] == ["get_server_list", "quit"]
    assert all(c["argv"] == [binary] for c in client_calls)
    assert all(_mps_env(c["env"]) == expected for c in client_calls)


def test_nvidia_stop_kills_a_daemon_that_ignores_quit(tmp_path: Any, dirs: Dict[str, str]) -> None:
    control = NvidiaMpsControl(binary=fake_binary(tmp_path, "ignore_quit"))
    pid = control.start(UUID, dirs["pipe"], dirs["log"])
    control.stop(dirs["pipe"], timeout=0.5)
    # the daemon never quits by itself: that it is gone at all shows stop killed it (the
    # wait is a hang guard for the kill to land, not a speed test)
    assert wait_gone(pid, timeout=60.0)
    assert control.running(dirs["pipe"]) is None


def test_nvidia_start_failure_is_a_node_fault_naming_the_log(tmp_path: Any, dirs: Dict[str, str]) -> None:
    control = NvidiaMpsControl(binary=fake_binary(tmp_path, "fail"))
    with pytest.raises(NodeFault, match="boom: no GPU") as err:
        control.start(UUID, dirs["pipe"], dirs["log"])
    assert "control.log" in str(err.value)


def test_nvidia_missing_binary_says_to_install_mps(tmp_path: Any) -> None:
    control = NvidiaMpsControl(binary=str(tmp_path / "nope"))
    with pytest.raises(NodeFault, match="install the CUDA MPS package"):
        control.start(UUID, str(tmp_path), str(tmp_path))


def test_nvidia_default_binaries_are_absolute() -> None:
    from slurmiso.isolation.mps_daemon import NVIDIA_BINARIES

    assert NVIDIA_BINARIES[0] == "/usr/bin/nvidia-cuda-mps-control"
    assert all(os.path.isabs(b) for b in NVIDIA_BINARIES)


def test_nvidia_stop_and_running_without_daemon(tmp_path: Any, dirs: Dict[str, str]) -> None:
    control = NvidiaMpsControl(binary=fake_binary(tmp_path))
    assert control.running(dirs["pipe"]) is None
    control.stop(dirs["pipe"], 1.0)
    assert control.servers(dirs["pipe"]) == []
    assert not (tmp_path / "calls.jsonl").exists()  # nothing to talk to, nothing was run


# -- limits and an untrusted pipe directory ---------------------------------------------------


def test_nvidia_set_limits_sends_the_defaults_and_reads_them_back(
    tmp_path: Any, dirs: Dict[str, str]
) -> None:
    control = NvidiaMpsControl(binary=fake_binary(tmp_path), start_timeout=5.0)
    control.start(UUID, dirs["pipe"], dirs["log"])
    control.set_limits(dirs["pipe"], 60, 30720)
    assert [c["stdin"].strip() for c in calls(tmp_path)[1:]] == [
        "set_default_active_thread_percentage 60",
        "get_default_active_thread_percentage",
        "set_default_device_pinned_mem_limit 0 30720M",
        "get_default_device_pinned_mem_limit 0",
    ]
    control.stop(dirs["pipe"], 5.0)


def test_nvidia_daemon_that_does_not_take_its_limits_is_a_node_fault(
    tmp_path: Any, dirs: Dict[str, str]
) -> None:
    control = NvidiaMpsControl(binary=fake_binary(tmp_path, "ignore_limits"), start_timeout=5.0)
    control.start(UUID, dirs["pipe"], dirs["log"])
    with pytest.raises(NodeFault, match=r"did not take its limits: active thread percentage "
                       r"100.0 instead of 60; pinned memory limit 0.0 MiB instead of 30720"):
        control.set_limits(dirs["pipe"], 60, 30720)
    control.stop(dirs["pipe"], 5.0)


def test_sim_set_limits_are_what_a_new_server_gets(dirs: Dict[str, str]) -> None:
    control = SimMpsControl()
    control.start(UUID, dirs["pipe"], dirs["log"])
    control.set_limits(dirs["pipe"], 25, 2048)
    assert mps_sim.send_command(dirs["pipe"], "get_default_active_thread_percentage") == "25.0\n"
    assert mps_sim.send_command(dirs["pipe"], "get_default_device_pinned_mem_limit 0") == "2048M\n"
    with pytest.raises(NodeFault, match="out of range"):
        control.set_limits(dirs["pipe"], 0, 0)
    control.stop(dirs["pipe"], 5.0)


@pytest.mark.parametrize("plant", ["fifo", "symlink", "garbage"])
def test_a_hostile_pid_file_reads_as_no_daemon(dirs: Dict[str, str], plant: str) -> None:
    """The pipe dir is the user's: a FIFO must not hang the epilog, a symlink is not read."""
    target = os.path.join(dirs["pipe"], mps_sim.PID_FILE)
    if plant == "fifo":
        os.mkfifo(target)
    elif plant == "symlink":
        other = os.path.join(dirs["log"], "pid")
        with open(other, "w") as fh:
            fh.write(f"{os.getpid()}\n")
        os.symlink(other, target)
    else:
        with open(target, "w") as fh:
            fh.write("9" * 100000)
    answers: List[Optional[int]] = []
    reader = threading.Thread(target=lambda: answers.extend(
        [SimMpsControl().running(dirs["pipe"]), NvidiaMpsControl().running(dirs["pipe"])]),
        daemon=True)
    reader.start()
    # a FIFO opened for reading blocks until a writer comes, and none ever does: a reader
    # that opened it would never return; one that refused it returns at once (a hang guard)
    reader.join(60)
    assert answers == [None, None], "reading the planted pid file hung or found a daemon"


def test_stop_never_reaches_a_daemon_whose_pid_was_planted(tmp_path: Any) -> None:
    """A user writes another user's daemon pid into their own pid file: it must survive."""
    binary = fake_binary(tmp_path)
    control = NvidiaMpsControl(binary=binary, start_timeout=5.0)
    mine, theirs = tmp_path / "mine", tmp_path / "theirs"
    for d in (mine, theirs):
        (d / "pipe").mkdir(parents=True)
        (d / "log").mkdir()
    victim = control.start(UUID, str(theirs / "pipe"), str(theirs / "log"))
    (mine / "pipe" / NVIDIA_PID_FILE).write_text(f"{victim}\n")
    try:
        assert control.running(str(mine / "pipe")) is None
        control.stop(str(mine / "pipe"), 1.0)
        assert not gone(victim) and control.running(str(theirs / "pipe")) == victim
    finally:
        control.stop(str(theirs / "pipe"), 5.0)
    assert wait_gone(victim)
