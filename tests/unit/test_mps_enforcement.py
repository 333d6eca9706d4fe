"""What a hostile job meets on an MPS pool: the daemon's limits and a door only its user opens.

The MPS stand-in (:mod:`slurmiso.isolation.mps_sim`) grants a client what NVIDIA's daemon
would: the server's limits, narrowed but never raised by the client's variables, and a
connection only to a uid that may search the pipe directory. Clients run in a forked child
that has dropped to the job's uid (or a stranger's), the way a job's processes run.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from typing import Any, Callable, Dict, Iterator, Optional

import psutil
import pytest

from slurmiso.isolation import mps_sim
from slurmiso.isolation.base import Context
from slurmiso.isolation.mps import HANDLER
from tests.hookctx import make_context

ROOT = os.geteuid() == 0
#: The job's user, and another user on the same node (no passwd entry is needed to setuid).
JOB_UID = 65534 if ROOT else os.getuid()
STRANGER_UID = 65533
needs_root = pytest.mark.needs_root(
    reason="running a process as another uid (the prolog's own rights)")


@pytest.fixture()
def node() -> Iterator[str]:
    """A node dir other uids can traverse down to the daemon dirs (pytest's tmp is 0700),
    so that only the pipe directory's own owner and mode decide who gets in."""
    where = tempfile.mkdtemp(prefix="mps-enf-", dir="/tmp")
    os.chmod(where, 0o755)
    yield where
    for proc in psutil.process_iter(["pid", "cmdline"]):
        try:
            if proc.pid != os.getpid() and any(where in p for p in proc.info["cmdline"] or []):
                proc.kill()
        except psutil.Error:
            pass
    shutil.rmtree(where, ignore_errors=True)


def as_uid(uid: int, action: Callable[[], Any]) -> Dict[str, Any]:
    """Run ``action`` in a child that has dropped to ``uid``; its result or its OSError."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: never returns into pytest
        os.close(read_fd)
        try:
            if os.geteuid() != uid:
                os.setgroups([])
                os.setgid(uid)
                os.setuid(uid)
            out: Dict[str, Any] = {"ok": action()}
        except OSError as exc:
            out = {"error": type(exc).__name__, "errno": exc.errno}
        except BaseException as exc:  # anything else is reported, not swallowed
            out = {"error": repr(exc)}
        os.write(write_fd, json.dumps(out).encode())
        os._exit(0)
    os.close(write_fd)
    chunks = []
    while True:
        data = os.read(read_fd, 65536)
        if not data:
            break
        chunks.append(data)
    os.close(read_fd)
    os.waitpid(pid, 0)
    result: Dict[str, Any] = json.loads(b"".join(chunks))
    return result


def start(node: str, job_id: str, cls: str = "train", spank: Optional[Dict[str, str]] = None,
          uid: int = JOB_UID) -> Context:
    ctx = make_context(node, "mps", job_id=job_id, cls=cls, uid=uid, spank=spank)
    ctx.save()
    HANDLER.setup(ctx)
    return ctx


def job_env(ctx: Context, **changes: Optional[str]) -> Dict[str, str]:
    """The environment the job was given, then changed by the job: None unsets a variable."""
    env = dict(ctx.record.env)
    for name, value in changes.items():
        if value is None:
            env.pop(name, None)
        else:
            env[name] = value
    return env


def granted(ctx: Context, uid: int = JOB_UID, **changes: Optional[str]) -> Dict[str, Any]:
    env = job_env(ctx, **changes)
    return as_uid(uid, lambda: mps_sim.connect(env))


THREADS, MEM = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"


@pytest.mark.parametrize("changes", [
    {},  # as given
    {THREADS: None, MEM: None},  # unset
    {THREADS: "100", MEM: "0=80G"},  # raised
    {THREADS: "250", MEM: "0=99999999G,1=80G"},  # raised past any sense
    {THREADS: "lots", MEM: "all"},  # garbage
], ids=["as-given", "unset", "raised", "absurd", "garbage"])
def test_a_job_gets_its_class_limits_whatever_it_does_to_its_variables(
    node: str, changes: Dict[str, Optional[str]]
) -> None:
    train = start(node, "101")
    got = granted(train, **changes)
    assert "error" not in got, got
    assert got["ok"]["uid"] == JOB_UID  # the daemon knows the uid from the kernel
    assert (got["ok"]["active_thread_percentage"], got["ok"]["pinned_device_mem_limit_mb"]) == (
        60.0, {"0": 30720})
    HANDLER.teardown(train)


def test_a_job_may_narrow_its_own_limits(node: str) -> None:
    train = start(node, "101")
    got = granted(train, **{THREADS: "10", MEM: "0=1G"})
    assert (got["ok"]["active_thread_percentage"], got["ok"]["pinned_device_mem_limit_mb"]) == (
        10.0, {"0": 1024})
    HANDLER.teardown(train)


def test_classes_and_lowered_limits_of_one_user_get_daemons_of_their_own(node: str) -> None:
    """Daemon defaults bind all its clients, so different limits cannot share one."""
    train, infer = start(node, "101"), start(node, "102", cls="infer")
    low = start(node, "103", spank={"iso_mps_mem": "4G"})
    same = start(node, "104", spank={"iso_mps_mem": "4G"})
    pipes = [t.record.env["CUDA_MPS_PIPE_DIRECTORY"] for t in (train, infer, low, same)]
    assert len(set(pipes)) == 3 and pipes[2] == pipes[3]
    limits = {}
    for ctx in (train, infer, low):
        got = granted(ctx, **{THREADS: None, MEM: None})["ok"]
        limits[ctx.job_id] = (got["active_thread_percentage"], got["pinned_device_mem_limit_mb"])
    assert limits == {"101": (60.0, {"0": 30720}), "102": (100.0, {"0": 40960}),
                      "103": (60.0, {"0": 4096})}
    for ctx in (train, infer, low, same):
        HANDLER.teardown(ctx)
    assert os.listdir(os.path.join(node, "state", "mps")) == []


@needs_root
def test_another_uid_cannot_reach_the_daemon(node: str) -> None:
    train = start(node, "101")
    pipe = train.record.env["CUDA_MPS_PIPE_DIRECTORY"]
    pid = train.record.resources[0].daemon_pid
    for command in ("quit", "set_default_active_thread_percentage 100", "get_server_list"):
        got = as_uid(STRANGER_UID, lambda c=command: mps_sim.send_command(pipe, c))
        assert got == {"error": "PermissionError", "errno": 13}, (command, got)
    assert granted(train, uid=STRANGER_UID) == {"error": "PermissionError", "errno": 13}
    assert as_uid(STRANGER_UID, lambda: os.listdir(pipe))["error"] == "PermissionError"
    # The daemon is untouched and still holds the job's limits.
    assert psutil.pid_exists(pid)
    assert mps_sim.send_command(pipe, "get_default_active_thread_percentage") == "60.0\n"
    # Its own user gets in (the MPS server runs as that user and makes its pipes there).
    assert granted(train)["ok"]["uid"] == JOB_UID
    assert as_uid(JOB_UID, lambda: sorted(os.listdir(pipe)))["ok"] == [
        mps_sim.SOCKET, mps_sim.PID_FILE]
    HANDLER.teardown(train)
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


@needs_root
def test_two_users_on_one_gpu_cannot_reach_each_others_daemon(node: str) -> None:
    mine, theirs = start(node, "101"), start(node, "102", uid=STRANGER_UID)
    my_pipe = mine.record.env["CUDA_MPS_PIPE_DIRECTORY"]
    their_pipe = theirs.record.env["CUDA_MPS_PIPE_DIRECTORY"]
    assert my_pipe != their_pipe
    assert as_uid(JOB_UID, lambda: mps_sim.send_command(their_pipe, "quit"))["error"] == (
        "PermissionError")
    assert as_uid(STRANGER_UID, lambda: mps_sim.send_command(my_pipe, "quit"))["error"] == (
        "PermissionError")
    assert granted(theirs, uid=STRANGER_UID)["ok"]["uid"] == STRANGER_UID
    assert granted(mine)["ok"]["uid"] == JOB_UID
    HANDLER.teardown(mine)
    HANDLER.teardown(theirs)
    assert os.listdir(os.path.join(node, "state", "mps")) == []
