"""MPS isolation on a simulated node with real (simulated) MPS control daemons."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from typing import Any, Dict, Iterator, List, Optional, Tuple

import psutil
import pytest

from slurmiso.config.model import MpsShare
from slurmiso.errors import JobProblem, NodeFault
from slurmiso.isolation.base import Context, ReconcileContext
from slurmiso.isolation.mps import (
    HANDLER,
    DaemonKey,
    MpsIsolation,
    client_key,
    daemon_paths,
    entry_key,
    gpu_dir,
)
from slurmiso.isolation.mps_daemon import SimMpsControl
from slurmiso.state import JobRecord, Journal, Resource
from slurmiso.values import replace
from tests.hookctx import make_context

H100_MB = 81559
OTHER_UID = os.getuid() + 1
TRAIN = (60, 30720)  # the train class of tests/hookctx.py: thread %, pinned MiB
needs_root = pytest.mark.needs_root(
    reason="handing a pipe dir to another uid, as the prolog does")


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def wait_gone(pid: int, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while not gone(pid) and time.monotonic() < deadline:
        time.sleep(0.02)
    return gone(pid)


@pytest.fixture(autouse=True)
def no_leaked_daemons(tmp_path: Any) -> Iterator[None]:
    """Every daemon a test started is ended, even when the test failed halfway."""
    yield
    for proc in psutil.process_iter(["pid", "cmdline"]):
        try:
            cmd = proc.info["cmdline"] or []
            if proc.pid != os.getpid() and any(str(tmp_path) in part for part in cmd):
                proc.kill()
        except psutil.Error:
            pass


def job(tmp: Any, job_id: str, uid: Optional[int] = None, cls: str = "train",
        spank: Optional[Dict[str, str]] = None, gpus: tuple = (0,)) -> Context:
    ctx = make_context(str(tmp), "mps", job_id=job_id, cls=cls, uid=uid, spank=spank, gpus=gpus)
    ctx.save()  # the prolog writes the record before it calls the handler
    return ctx


def mps_entry(ctx: Context) -> Resource:
    (entry,) = [r for r in ctx.record.resources if r.kind == "mps"]
    return entry


def key_of(gpu: int = 0, uid: Optional[int] = None, limits: tuple = TRAIN) -> DaemonKey:
    return DaemonKey(gpu, os.getuid() if uid is None else uid, *limits)


def paths(tmp: Any, gpu: int = 0, uid: Optional[int] = None, limits: tuple = TRAIN) -> Dict[str, str]:
    return daemon_paths(os.path.join(str(tmp), "state"), key_of(gpu, uid, limits))


def pipe_dir(tmp: Any, gpu: int = 0, uid: Optional[int] = None, limits: tuple = TRAIN) -> str:
    return paths(tmp, gpu, uid, limits)["pipe"]


def daemon_pid(tmp: Any, gpu: int = 0, uid: Optional[int] = None,
               limits: tuple = TRAIN) -> Optional[int]:
    return SimMpsControl().running(pipe_dir(tmp, gpu, uid, limits))


def on_disk(ctx: Context, job_id: str) -> JobRecord:
    record = ctx.state.read_job(job_id)
    assert record is not None
    return record


def with_class(ctx: Context, **changes: Any) -> None:
    assert ctx.job_class is not None
    ctx.job_class = replace(ctx.job_class, **changes)


def running_pid(tmp: Any, gpu: int = 0) -> int:
    pid = daemon_pid(tmp, gpu)
    assert pid is not None, f"no MPS daemon runs for GPU {gpu}"
    return pid


def events(ctx: Context, name: str) -> List[Dict[str, Any]]:
    return list(Journal(ctx.config.paths.journal).read(events={name}))


def mps_keys(ctx: Context) -> List[str]:
    return sorted(k for k in ctx.state.allocations() if k.startswith("mps/"))


# -- setup ------------------------------------------------------------------------------------


def test_two_jobs_of_one_user_share_one_daemon(tmp_path: Any) -> None:
    a, b = job(tmp_path, "101"), job(tmp_path, "102")
    HANDLER.setup(a)
    HANDLER.setup(b)
    pid = running_pid(tmp_path)
    assert mps_entry(a).daemon_pid == mps_entry(b).daemon_pid == pid
    assert mps_entry(a).state == "ready"
    assert mps_keys(a) == [client_key(0, "101"), client_key(0, "102")]
    assert b.record.warnings == []  # same uid: no serialisation
    assert len(events(a, "mps-daemon-started")) == 1
    for name in ("pipe", "log"):  # the job's user and root only (was 1777: anyone could quit)
        st = os.stat(paths(tmp_path)[name])
        assert (oct(st.st_mode & 0o7777), st.st_uid) == ("0o700", os.getuid())
    base = os.stat(paths(tmp_path)["base"])
    assert (oct(base.st_mode & 0o7777), base.st_uid) == ("0o755", os.geteuid())


def test_job_env_and_record(tmp_path: Any) -> None:
    ctx = job(tmp_path, "101")
    HANDLER.setup(ctx)
    where = paths(tmp_path)
    assert ctx.record.env == {
        "CUDA_MPS_PIPE_DIRECTORY": where["pipe"],
        "CUDA_MPS_LOG_DIRECTORY": where["log"],
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "60",
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=30720M",
        "CUDA_VISIBLE_DEVICES": "0",
    }
    entry = mps_entry(ctx)
    assert {k: getattr(entry, k) for k in ("kind", "gpu", "thread_percentage", "memory_limit_mb")} == {
        "kind": "mps", "gpu": 0, "thread_percentage": 60, "memory_limit_mb": 30720}
    assert on_disk(ctx, "101").resources[0].state == "ready"  # persisted


def test_infer_class_gets_its_own_share(tmp_path: Any) -> None:
    ctx = job(tmp_path, "101", cls="infer")
    HANDLER.setup(ctx)
    assert ctx.record.env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "100"
    assert ctx.record.env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=40960M"


def test_setup_twice_changes_nothing(tmp_path: Any) -> None:
    ctx = job(tmp_path, "101")
    HANDLER.setup(ctx)
    before = JobRecord.from_dict(ctx.record.to_dict())
    HANDLER.setup(ctx)
    assert ctx.record.resources == before.resources
    assert len(events(ctx, "mps-daemon-started")) == 1


@needs_root
def test_second_user_gets_own_daemon_and_conflict_warning_on_both_jobs(tmp_path: Any) -> None:
    a, b = job(tmp_path, "101"), job(tmp_path, "102", uid=OTHER_UID)
    HANDLER.setup(a)
    HANDLER.setup(b)
    assert mps_entry(a).daemon_pid != mps_entry(b).daemon_pid
    assert os.stat(pipe_dir(tmp_path, uid=OTHER_UID)).st_uid == OTHER_UID
    assert any("time-sliced" in w and "101" in w for w in b.record.warnings)
    a_disk = on_disk(a, "101")
    assert any("time-sliced" in w and "102" in w for w in a_disk.warnings)
    (ev,) = events(a, "mps-user-conflict")
    assert (ev["job"], ev["uid"], ev["other_jobs"], ev["other_uids"]) == (
        "102", OTHER_UID, ["101"], [os.getuid()])
    assert mps_entry(b).state == "ready"  # warned, not refused


@pytest.mark.parametrize("option, limit", [("10G", 10240), ("512M", 512), ("30G", 30720)])
def test_iso_mps_mem_may_lower_the_limit(tmp_path: Any, option: str, limit: int) -> None:
    ctx = job(tmp_path, "101", spank={"iso_mps_mem": option})
    HANDLER.setup(ctx)
    assert ctx.record.env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == f"0={limit}M"
    assert mps_entry(ctx).memory_limit_mb == limit


def test_iso_mps_mem_above_class_limit_is_refused_and_leaves_nothing(tmp_path: Any) -> None:
    ctx = job(tmp_path, "101", spank={"iso_mps_mem": "31G"})
    with pytest.raises(JobProblem, match=r"31744 MiB\) is above the class limit of 30720 MiB"):
        HANDLER.setup(ctx)
    assert ctx.record.resources == [] and mps_keys(ctx) == []
    assert daemon_pid(tmp_path) is None


def test_no_class_limit_and_no_option_sets_no_pinned_limit(tmp_path: Any) -> None:
    ctx = job(tmp_path, "101")
    with_class(ctx, mps=MpsShare(thread_percentage=50))
    HANDLER.setup(ctx)
    assert "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT" not in ctx.record.env
    assert ctx.record.env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "50"
    other = job(tmp_path, "102", spank={"iso_mps_mem": "8G"})
    other.job_class = ctx.job_class
    HANDLER.setup(other)  # no class limit: the user may still volunteer one
    assert other.record.env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=8192M"


def test_pinned_memory_overflow_is_refused_with_the_numbers(tmp_path: Any) -> None:
    a, b, c = job(tmp_path, "101"), job(tmp_path, "102"), job(tmp_path, "103")
    HANDLER.setup(a)
    HANDLER.setup(b)
    pid = daemon_pid(tmp_path)
    with pytest.raises(JobProblem) as err:
        HANDLER.setup(c)
    msg = str(err.value)
    assert "2 job(s) already pin 61440 MiB" in msg and f"92160 MiB > {H100_MB} MiB" in msg
    assert c.record.resources == [] and client_key(0, "103") not in mps_keys(c)
    assert daemon_pid(tmp_path) == pid


def test_class_headroom_counts_against_the_gpu(tmp_path: Any) -> None:
    a, b = job(tmp_path, "101"), job(tmp_path, "102")
    for ctx in (a, b):
        with_class(ctx, memory_headroom_pct=30)
    HANDLER.setup(a)
    with pytest.raises(JobProblem, match=r"keeps 30% \(24467 MiB\) headroom"):
        HANDLER.setup(b)


def test_refused_first_job_starts_no_daemon_and_creates_no_dirs(tmp_path: Any) -> None:
    ctx = job(tmp_path, "101")
    with_class(ctx, memory_headroom_pct=90)
    with pytest.raises(JobProblem):
        HANDLER.setup(ctx)
    assert not os.path.exists(os.path.join(ctx.state.state_dir, "mps"))


@pytest.mark.parametrize("gpus", [(0, 1), ()])
def test_an_mps_job_needs_exactly_one_gpu(tmp_path: Any, gpus: tuple) -> None:
    ctx = job(tmp_path, "101", gpus=gpus)
    with pytest.raises(JobProblem, match=f"exactly one GPU on a node; job 101 has {len(gpus)}"):
        HANDLER.setup(ctx)


def test_second_gpu_gets_its_own_daemon(tmp_path: Any) -> None:
    a, b = job(tmp_path, "101", gpus=(0,)), job(tmp_path, "102", gpus=(1,))
    HANDLER.setup(a)
    HANDLER.setup(b)
    assert daemon_pid(tmp_path, 0) not in (None, daemon_pid(tmp_path, 1))
    HANDLER.teardown(a)
    assert daemon_pid(tmp_path, 0) is None and daemon_pid(tmp_path, 1) is not None
    HANDLER.teardown(b)


def test_killed_daemon_is_restarted_with_a_warning(tmp_path: Any) -> None:
    a, b = job(tmp_path, "101"), job(tmp_path, "102")
    HANDLER.setup(a)
    old = mps_entry(a).daemon_pid
    os.kill(old, signal.SIGKILL)
    assert wait_gone(old)
    HANDLER.setup(b)
    new = daemon_pid(tmp_path)
    assert new is not None and new != old and mps_entry(b).daemon_pid == new
    assert any("had died" in w and "using it: 101" in w for w in b.record.warnings)
    assert any("had died" in w for w in on_disk(a, "101").warnings)
    (ev,) = events(b, "mps-daemon-restarted")
    assert ev["clients"] == ["101"]


# -- teardown ---------------------------------------------------------------------------------


def test_last_job_out_stops_the_daemon(tmp_path: Any) -> None:
    a, b = job(tmp_path, "101"), job(tmp_path, "102")
    HANDLER.setup(a)
    HANDLER.setup(b)
    pid = running_pid(tmp_path)
    HANDLER.teardown(a)
    assert daemon_pid(tmp_path) == pid and not gone(pid)
    assert mps_keys(a) == [client_key(0, "102")]
    HANDLER.teardown(b)
    assert wait_gone(pid) and daemon_pid(tmp_path) is None
    assert mps_keys(a) == []
    assert [e["pid"] for e in events(a, "mps-daemon-stopped")] == [pid]
    assert not os.path.exists(paths(tmp_path)["base"])  # pipe and log dirs with it
    assert os.listdir(os.path.join(a.state.state_dir, "mps")) == []


def test_teardown_twice_is_harmless(tmp_path: Any) -> None:
    ctx = job(tmp_path, "101")
    HANDLER.setup(ctx)
    pid = mps_entry(ctx).daemon_pid
    HANDLER.teardown(ctx)
    HANDLER.teardown(ctx)
    assert wait_gone(pid) and mps_entry(ctx).state == "released"
    assert len(events(ctx, "mps-daemon-stopped")) == 1


def test_teardown_does_not_resurrect_a_deleted_record(tmp_path: Any) -> None:
    ctx = job(tmp_path, "101")
    HANDLER.setup(ctx)
    ctx.state.delete_job("101")
    HANDLER.teardown(ctx)
    assert ctx.state.read_job("101") is None


class _Killed(BaseException):
    """Stands for SIGKILL of the prolog: nothing after it runs."""


class _DiesAfterStart(SimMpsControl):
    def start(self, gpu_uuid: str, pipe_dir: str, log_dir: str) -> int:
        super().start(gpu_uuid, pipe_dir, log_dir)
        raise _Killed()


def test_teardown_after_setup_killed_between_daemon_start_and_save(tmp_path: Any) -> None:
    ctx = job(tmp_path, "101")
    with pytest.raises(_Killed):
        MpsIsolation(control_factory=lambda backend: _DiesAfterStart()).setup(ctx)
    pid = running_pid(tmp_path)  # the daemon exists, the record does not know its pid
    saved = on_disk(ctx, "101")
    assert saved.resources[0].state == "pending"
    assert saved.resources[0].daemon_pid is None
    epilog = make_context(str(tmp_path), "mps", job_id="101")
    epilog.record = saved
    HANDLER.teardown(epilog)
    assert wait_gone(pid) and daemon_pid(tmp_path) is None
    assert mps_keys(epilog) == []


class _Immortal(SimMpsControl):
    def stop(self, pipe_dir: str, timeout: float) -> None:
        pass  # like a daemon stuck in the driver: quit, SIGTERM and SIGKILL do nothing


def test_daemon_surviving_stop_is_a_node_fault(tmp_path: Any) -> None:
    ctx = job(tmp_path, "101")
    HANDLER.setup(ctx)
    stuck = MpsIsolation(control_factory=lambda backend: _Immortal())
    with pytest.raises(NodeFault, match="survived quit, SIGTERM and SIGKILL"):
        stuck.teardown(ctx)
    HANDLER.teardown(ctx)  # a retry with a working stop finishes the job
    assert daemon_pid(tmp_path) is None


# -- reconcile --------------------------------------------------------------------------------


def reconcile_ctx(ctx: Context, dry_run: bool = False, live: Optional[List[str]] = None) -> ReconcileContext:
    return ReconcileContext(config=ctx.config, pool=ctx.pool, state=ctx.state,
                            journal=ctx.journal, backend=ctx.backend, dry_run=dry_run,
                            live_jobs=live)


def test_reconcile_stops_an_orphan_daemon(tmp_path: Any) -> None:
    ctx = job(tmp_path, "101")
    HANDLER.setup(ctx)
    pid = running_pid(tmp_path)
    ctx.state.delete_job("101")  # the job vanished without an epilog
    dry = HANDLER.reconcile(reconcile_ctx(ctx, dry_run=True))
    assert [f.split(" (")[0] for f in dry] == [
        "drop MPS client registration of job 101 on GPU 0",
        f"stop MPS control daemon pid {pid} of GPU 0 in {key_of().name}",
        f"remove stale MPS directory {paths(tmp_path)['base']}",
    ]
    assert daemon_pid(tmp_path) == pid and mps_keys(ctx) == [client_key(0, "101")]
    assert HANDLER.reconcile(reconcile_ctx(ctx)) == dry
    assert wait_gone(pid) and mps_keys(ctx) == []
    assert not os.path.exists(gpu_dir(ctx.state.state_dir, 0))
    assert len(events(ctx, "mps-reconcile")) == 3
    assert HANDLER.reconcile(reconcile_ctx(ctx)) == []


def test_reconcile_keeps_a_daemon_with_live_clients(tmp_path: Any) -> None:
    ctx = job(tmp_path, "101")
    HANDLER.setup(ctx)
    assert HANDLER.reconcile(reconcile_ctx(ctx)) == []
    assert daemon_pid(tmp_path) is not None
    HANDLER.teardown(ctx)


def test_reconcile_trusts_slurm_when_it_says_the_job_is_gone(tmp_path: Any) -> None:
    ctx = job(tmp_path, "101")
    HANDLER.setup(ctx)
    fixes = HANDLER.reconcile(reconcile_ctx(ctx, live=["999"]))
    assert fixes[0].startswith("drop MPS client registration of job 101")
    assert daemon_pid(tmp_path) is None


def test_reconcile_removes_dirs_of_a_dead_daemon(tmp_path: Any) -> None:
    ctx = job(tmp_path, "101")
    HANDLER.setup(ctx)
    os.kill(mps_entry(ctx).daemon_pid, signal.SIGKILL)
    wait_gone(mps_entry(ctx).daemon_pid)
    ctx.state.delete_job("101")
    fixes = HANDLER.reconcile(reconcile_ctx(ctx))
    assert not any(f.startswith("stop") for f in fixes)
    assert fixes[-1].startswith("remove stale MPS directory")


@pytest.mark.parametrize("damage", [{"uid": None}, {"thread_percentage": None}, {"gpu": -1}])
def test_a_corrupt_mps_resource_is_a_node_fault_naming_the_job(
    tmp_path: Any, damage: Dict[str, Any]
) -> None:
    ctx = job(tmp_path, "101")
    HANDLER.setup(ctx)
    assert entry_key(mps_entry(ctx), "101") == key_of()
    for name, value in damage.items():
        setattr(mps_entry(ctx), name, value)
    with pytest.raises(NodeFault, match="job 101's record has a"):
        HANDLER.teardown(ctx)
    entry = mps_entry(ctx)
    entry.gpu, entry.uid, entry.thread_percentage = 0, os.getuid(), 60
    HANDLER.teardown(ctx)
    assert daemon_pid(tmp_path) is None


class _IgnoresLimits(SimMpsControl):
    """A daemon that accepts set_default_* and keeps allowing everything (an old driver)."""

    def set_limits(self, pipe_dir: str, thread_percentage: int, memory_limit_mb: int) -> None:
        from slurmiso.isolation import mps_sim
        from slurmiso.isolation.mps_daemon import apply_limits

        def send(command: str) -> str:
            return "" if command.startswith("set_") else mps_sim.send_command(pipe_dir, command)

        apply_limits(send, pipe_dir, thread_percentage, memory_limit_mb)


def test_a_daemon_that_does_not_confirm_its_limits_is_stopped_and_drains(tmp_path: Any) -> None:
    ctx = job(tmp_path, "101")
    handler = MpsIsolation(control_factory=lambda backend: _IgnoresLimits())
    with pytest.raises(NodeFault, match="did not take its limits: active thread percentage "
                       "100.0 instead of 60"):
        handler.setup(ctx)
    assert daemon_pid(tmp_path) is None  # no job ever reaches an unlimited daemon
    assert not os.path.exists(paths(tmp_path)["base"])
    assert "CUDA_MPS_PIPE_DIRECTORY" not in ctx.record.env


def test_reconcile_stops_a_daemon_of_the_old_shared_layout(tmp_path: Any) -> None:
    ctx = job(tmp_path, "101")
    legacy = os.path.join(gpu_dir(ctx.state.state_dir, 0))
    for name in ("pipe", "log"):
        os.makedirs(os.path.join(legacy, name))
    os.chmod(os.path.join(legacy, "pipe"), 0o1777)
    pid = SimMpsControl().start("GPU-x", os.path.join(legacy, "pipe"), os.path.join(legacy, "log"))
    fixes = HANDLER.reconcile(reconcile_ctx(ctx))
    assert fixes[0].startswith(f"stop MPS control daemon pid {pid} of GPU 0")
    assert wait_gone(pid) and not os.path.exists(legacy)


# -- what the job's user can do to its pipe directory -----------------------------------------


def _sleeper() -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])


def _rewrite_pid_file(pipe: str, text: str) -> None:
    target = os.path.join(pipe, "control.pid")
    with contextlib.suppress(FileNotFoundError):
        os.unlink(target)
    with open(target, "w") as fh:
        fh.write(text)


def _tamper(kind: str, pipe: str, decoy: int, other_pipe: str) -> None:
    """What a job may do to the pipe directory it owns, one way per case."""
    if kind == "pid-of-decoy":
        _rewrite_pid_file(pipe, f"{decoy}\n")
    elif kind == "pid-of-init":
        _rewrite_pid_file(pipe, "1\n")
    elif kind == "pid-garbage":
        _rewrite_pid_file(pipe, "x" * 5000)
    elif kind == "pid-file-removed":
        os.unlink(os.path.join(pipe, "control.pid"))
    elif kind == "pid-file-symlink":
        os.unlink(os.path.join(pipe, "control.pid"))
        os.symlink(f"/proc/{decoy}/stat", os.path.join(pipe, "control.pid"))
    elif kind == "emptied":
        for name in os.listdir(pipe):
            os.unlink(os.path.join(pipe, name))
    elif kind == "socket-to-another-daemon":
        os.unlink(os.path.join(pipe, "control"))
        os.symlink(os.path.join(other_pipe, "control"), os.path.join(pipe, "control"))
    elif kind == "filled":
        for i in range(400):
            open(os.path.join(pipe, f"junk{i}"), "w").close()
    elif kind == "dir-swapped-for-symlink":  # as root could: the parent is root's, not the job's
        os.rename(pipe, pipe + ".moved")
        os.symlink(other_pipe, pipe)
    else:
        raise AssertionError(kind)


TAMPERING = ("pid-of-decoy", "pid-of-init", "pid-garbage", "pid-file-removed",
             "pid-file-symlink", "emptied", "socket-to-another-daemon", "filled",
             "dir-swapped-for-symlink")


@pytest.mark.parametrize("kind", TAMPERING)
def test_a_job_rewriting_its_pipe_dir_cannot_keep_its_daemon_alive(
    tmp_path: Any, kind: str
) -> None:
    """Root names and stops the daemon it started from its own record, whatever the job left
    in the pipe directory it owns; nothing else is stopped (issue 22: 3 of 18 leaked)."""
    mine, theirs = job(tmp_path, "101"), job(tmp_path, "102", cls="infer")
    HANDLER.setup(mine)
    HANDLER.setup(theirs)
    pid, other = mps_entry(mine).daemon_pid, mps_entry(theirs).daemon_pid
    assert pid and other and pid != other
    decoy = _sleeper()
    try:
        _tamper(kind, mps_entry(mine).pipe_dir or "", decoy.pid, mps_entry(theirs).pipe_dir or "")
        HANDLER.teardown(mine)
        assert wait_gone(pid), f"{kind}: the job's daemon survived its epilog"
        assert not gone(other), f"{kind}: another job's daemon was stopped"
        assert decoy.poll() is None, f"{kind}: a process the job named was killed"
        assert [e["pid"] for e in events(mine, "mps-daemon-stopped")] == [pid]
        assert not os.path.lexists(paths(tmp_path)["base"])
        assert SimMpsControl().running(mps_entry(theirs).pipe_dir or "") == other
    finally:
        decoy.kill()
        decoy.wait()
    HANDLER.teardown(theirs)
    assert wait_gone(other)


def test_a_daemon_started_but_never_recorded_is_found_from_the_process_table(
    tmp_path: Any
) -> None:
    """A prolog killed between the daemon's start and root's record of it: the epilog finds
    the daemon by what the kernel says of it, never by the pipe directory's pid file."""
    from slurmiso.isolation.mps_daemon import identity_path

    ctx = job(tmp_path, "101")
    HANDLER.setup(ctx)
    pid = mps_entry(ctx).daemon_pid
    os.unlink(identity_path(mps_entry(ctx).pipe_dir or ""))
    _rewrite_pid_file(mps_entry(ctx).pipe_dir or "", "1\n")
    assert daemon_pid(tmp_path) == pid
    HANDLER.teardown(ctx)
    assert pid and wait_gone(pid)


def test_a_recorded_pid_reused_by_another_process_is_not_the_daemon(tmp_path: Any) -> None:
    from slurmiso.isolation.mps_daemon import identity_path

    ctx = job(tmp_path, "101")
    HANDLER.setup(ctx)
    decoy = _sleeper()
    try:
        where = identity_path(mps_entry(ctx).pipe_dir or "")
        with open(where) as fh:
            record = json.load(fh)
        with open(where, "w") as fh:  # the daemon's start time, another process's pid
            json.dump({"pid": decoy.pid, "start": record["start"]}, fh)
        assert daemon_pid(tmp_path) is None
        HANDLER.teardown(ctx)
        assert decoy.poll() is None
    finally:
        decoy.kill()
        decoy.wait()


@needs_root
def test_root_takes_the_pipe_dir_back_before_it_talks_through_it(tmp_path: Any) -> None:
    """Checked, then used by name: while the job's user still owns the pipe directory a
    symlink can be swapped in between. Stop makes it root's (0700) first."""
    from slurmiso.isolation import mps_daemon

    ctx = job(tmp_path, "101", uid=OTHER_UID)
    HANDLER.setup(ctx)
    pipe = mps_entry(ctx).pipe_dir or ""
    assert os.stat(pipe).st_uid == OTHER_UID  # the premise: the job's user owns it
    os.chmod(pipe, 0o755)  # as that user may
    seen: List[Tuple[int, int]] = []
    real = mps_daemon.control_socket_ok

    def spy(path: str, required: bool = False) -> bool:
        st = os.stat(path)
        seen.append((st.st_uid, st.st_mode & 0o777))
        return real(path, required)

    mps_daemon.control_socket_ok = spy  # type: ignore[assignment]
    try:
        HANDLER.teardown(ctx)
    finally:
        mps_daemon.control_socket_ok = real  # type: ignore[assignment]
    assert seen and seen[0] == (os.geteuid(), 0o700), seen
    assert daemon_pid(tmp_path) is None
