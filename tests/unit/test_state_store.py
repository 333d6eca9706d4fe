"""NodeState: round trips, path-injection and symlink guards, the node lock, kill -9 safety."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any, Dict, List

import pytest

from slurmiso.errors import StateError
from slurmiso.state import JobRecord, NodeState
from slurmiso.state import store as store_mod

REPO = str(Path(__file__).resolve().parents[2])


def _python(code: str, *args: str, **kwargs: object) -> subprocess.Popen:
    """Start ``code`` (with ``args`` in its sys.argv) in a fresh interpreter that imports
    this checkout of slurmiso."""
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.Popen(  # type: ignore[call-overload]
        [sys.executable, "-c", textwrap.dedent(code), *args], env=env, **kwargs
    )


@pytest.fixture
def state(tmp_path: Path) -> NodeState:
    return NodeState(str(tmp_path / "state"), lock_timeout=5)


def _temp_files(st: NodeState) -> List[str]:
    return [
        n
        for d in (st.state_dir, st.jobs_dir)
        if os.path.isdir(d)
        for n in os.listdir(d)
        if n.endswith(".tmp")
    ]


# -- round trips ---------------------------------------------------------------------------


def test_constructor_does_no_io(tmp_path: Path) -> None:
    NodeState(str(tmp_path / "nowhere"))
    assert not (tmp_path / "nowhere").exists()


def test_reads_of_missing_state_are_empty(state: NodeState) -> None:
    assert state.read_job("1") is None
    assert state.jobs() == {}
    assert state.allocations() == {}
    state.delete_job("1")  # idempotent: epilogs may run twice
    assert not os.path.exists(state.state_dir)


def _rec(**fields: Any) -> JobRecord:
    return JobRecord.from_dict(fields)


def test_job_round_trip(state: NodeState) -> None:
    record = _rec(**{"class": "infer", "gpus": [0, 1], "mig": {"gi": 3}})
    state.write_job("1234", record)
    state.write_job(77, _rec(**{"class": "train"}))
    state.write_job("1234_5", _rec(**{"class": "train"}))
    assert state.read_job("1234") == record
    assert state.read_job("1234").job_class == "infer"  # type: ignore[union-attr]
    assert state.read_job("1234").extra == {"mig": {"gi": 3}}  # type: ignore[union-attr]
    assert set(state.jobs()) == {"1234", "77", "1234_5"}
    state.write_job("1234", _rec(**{"class": "train"}))
    assert state.read_job("1234") == _rec(**{"class": "train"})
    state.delete_job("1234")
    assert state.read_job("1234") is None
    assert set(state.jobs()) == {"77", "1234_5"}


def test_allocations_round_trip(state: NodeState) -> None:
    state.set_allocations({"gpu0/mig/gi3": "1234", "gpu1": 99})
    assert state.allocations() == {"gpu0/mig/gi3": "1234", "gpu1": "99"}
    state.set_allocations({})
    assert state.allocations() == {}


def test_ensure_sets_modes_despite_umask(state: NodeState) -> None:
    old = os.umask(0o077)
    try:
        state.ensure()
        state.write_job("5", JobRecord("5"))
    finally:
        os.umask(old)
    for d in (state.state_dir, state.jobs_dir):
        assert os.stat(d).st_mode & 0o777 == 0o755
    assert os.stat(state.job_path("5")).st_mode & 0o777 == 0o644


# -- guards --------------------------------------------------------------------------------

BAD_IDS = ["../etc/passwd", "1;rm", "", "1/2", "1_", "_1", "1\n", "1.json", "-1", "١٢", "1 2"]


@pytest.mark.parametrize("job_id", BAD_IDS)
def test_job_id_injection_refused(state: NodeState, job_id: str) -> None:
    for call in (
        lambda: state.write_job(job_id, JobRecord()),
        lambda: state.read_job(job_id),
        lambda: state.delete_job(job_id),
        lambda: state.set_allocations({"gpu0": job_id}),
    ):
        with pytest.raises(StateError, match="not a Slurm job id"):
            call()
    assert not os.path.exists(os.path.join(os.path.dirname(state.state_dir), "etc"))


def test_symlinked_state_dir_refused(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    st = NodeState(str(tmp_path / "link"))
    with pytest.raises(StateError, match="symlink"):
        st.ensure()
    with pytest.raises(StateError, match="symlink"):
        st.write_job("1", JobRecord("1"))
    if os.geteuid() == 0:
        with pytest.raises(StateError, match="symlink"):
            st.read_job("1")
    assert list((tmp_path / "real").iterdir()) == []


@pytest.mark.needs_root(reason="a root-owned state dir")
def test_group_writable_state_dir_refused_as_root(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(store_mod, "_is_root", lambda: True)
    d = tmp_path / "state"
    d.mkdir()
    os.chmod(d, 0o775)
    assert os.stat(d).st_uid == 0
    with pytest.raises(StateError, match="writable by group or others"):
        NodeState(str(d)).ensure()
    with pytest.raises(StateError, match="writable by group or others"):
        NodeState(str(d)).allocations()  # root does not even read from such a dir
    os.chmod(d, 0o755)
    NodeState(str(d)).ensure()


@pytest.mark.needs_root(reason="root-owned ancestors of the state dir")
def test_user_writable_ancestor_refused_as_root(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(store_mod, "_is_root", lambda: True)
    parent = tmp_path / "shared"
    parent.mkdir()
    os.chmod(parent, 0o777)  # anyone could rename state/ and plant their own
    with pytest.raises(StateError, match="can be modified by non-root users"):
        NodeState(str(parent / "state")).ensure()
    assert not (parent / "state").exists()
    os.chmod(parent, 0o1777)  # sticky, like /tmp: others cannot rename root's entries
    NodeState(str(parent / "state")).ensure()


@pytest.mark.needs_root(reason="chown of the state dir to another uid")
def test_non_root_owned_state_dir_refused_as_root(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(store_mod, "_is_root", lambda: True)
    d = tmp_path / "state"
    d.mkdir(mode=0o755)
    os.chown(d, 65534, 65534)
    with pytest.raises(StateError, match="owned by uid 65534"):
        NodeState(str(d)).ensure()


def test_symlinked_job_file_is_not_followed(state: NodeState, tmp_path: Path) -> None:
    state.ensure()
    victim = tmp_path / "victim"
    victim.write_text('{"keep": 1}')
    os.symlink(victim, state.job_path("7"))
    with pytest.raises(StateError, match="symlink"):
        state.read_job("7")
    state.write_job("7", _rec(new=1))  # replaces the link, never writes through it
    assert victim.read_text() == '{"keep": 1}'
    assert state.read_job("7") == _rec(new=1)


def test_corrupt_file_names_file_and_fix(state: NodeState) -> None:
    state.write_job("9", _rec(a=1))
    Path(state.job_path("9")).write_text('{"a": 1, "b"')
    with pytest.raises(StateError) as info:
        state.read_job("9")
    assert state.job_path("9") in str(info.value) and "mv " in str(info.value)
    with pytest.raises(StateError, match="9.json"):
        state.jobs()
    Path(state.allocations_path).write_text("[1, 2]")
    with pytest.raises(StateError, match="allocations.json"):
        state.allocations()


def test_temp_files_ignored_and_cleaned(state: NodeState) -> None:
    state.write_job("3", _rec(a=1))
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stray = os.path.join(state.jobs_dir, f".3.json.{dead.pid}.deadbeef.tmp")
    live = os.path.join(state.jobs_dir, f".4.json.{os.getpid()}.cafe.tmp")
    for path in (stray, live):
        Path(path).write_text('{"half')
    assert state.jobs() == {"3": _rec(a=1)}
    NodeState(state.state_dir).ensure()
    assert not os.path.exists(stray)
    assert os.path.exists(live)  # its writer is alive: it is about to be renamed


# -- lock ----------------------------------------------------------------------------------


def test_locked_is_reentrant_and_serialises(state: NodeState) -> None:
    with state.locked(), state.locked():
        state.set_allocations({"gpu0": "1"})
    with state.locked():
        assert state.allocations() == {"gpu0": "1"}


def test_lock_timeout_names_lock_and_holder(state: NodeState) -> None:
    state.ensure()
    holder = _python(
        f"""
        import sys, time
        from slurmiso.state import NodeState
        with NodeState({state.state_dir!r}).locked():
            print("locked", flush=True)
            time.sleep(600)
        """,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        quick = NodeState(state.state_dir, lock_timeout=0.2)
        with pytest.raises(StateError) as info, quick.locked():
            pass
        # it gave up while the holder still held the lock (the holder ends only when killed
        # below): its own 0.2 s timeout ended the wait, on any machine
        assert holder.poll() is None
        message = str(info.value)
        assert state.lock_path in message
        if os.path.exists("/proc/locks"):
            assert f"pid {holder.pid}" in message
    finally:
        holder.kill()
        holder.wait()
    with NodeState(state.state_dir, lock_timeout=2).locked():  # a killed holder frees it
        pass


# -- kill -9 mid-write ---------------------------------------------------------------------

VERSIONS = """
from slurmiso.state.record import JobRecord

def job_version(tag):
    return JobRecord.from_dict(
        {"tag": tag, "blob": tag * 400_000, "items": [tag + str(i) for i in range(20_000)]})

def alloc_version(jobid):
    return {f"gpu{g}/mig/gi{i}": jobid for g in range(8) for i in range(2_000)}
"""


def _versions() -> Dict[str, Any]:
    """The two complete versions, built by the same code the writer process runs."""
    ns: Dict[str, Any] = {}
    exec(VERSIONS, ns)
    return ns


#: Where in :func:`slurmiso.atomic.write_atomic` the writer dies: every distinct state a
#: SIGKILL can leave on disk (what is on disk changes only at these system calls).
KILL_POINTS = ("created", "half-written", "written", "synced", "renamed")

_KILLED_WRITER = VERSIONS + """
import os, signal, sys
from slurmiso.state import NodeState

target, point, version = sys.argv[1], sys.argv[2], int(sys.argv[3])
real_open, real_write, real_fsync, real_replace = os.open, os.write, os.fsync, os.replace
temp_fds = []

def is_temp(path):
    name = os.path.basename(path)
    return name.startswith("." + target + ".") and name.endswith(".tmp")

def die(at):
    if at == point:
        os.kill(os.getpid(), signal.SIGKILL)

def open_(path, flags, mode=0o777, *, dir_fd=None):
    fd = real_open(path, flags, mode, dir_fd=dir_fd)
    if is_temp(path):
        temp_fds.append(fd)
        die("created")
    return fd

def write(fd, data):
    if fd in temp_fds and point == "half-written":
        real_write(fd, bytes(data[: len(data) // 2]))
        die("half-written")
    return real_write(fd, data)

def fsync(fd):
    if fd in temp_fds:
        die("written")
    real_fsync(fd)
    if fd in temp_fds:
        die("synced")

def replace(src, dst, **kwargs):
    real_replace(src, dst, **kwargs)
    if os.path.basename(dst) == target:
        die("renamed")  # before the directory is synced

os.open, os.write, os.fsync, os.replace = open_, write, fsync, replace
st = NodeState(sys.argv[4])
if target == "42.json":
    st.write_job("42", job_version("AB"[version]))
else:
    st.set_allocations(alloc_version(("1001", "2002")[version]))
print("not killed", flush=True)
"""


@pytest.mark.parametrize("target", ["42.json", "allocations.json"])
def test_kill_9_mid_write_leaves_a_complete_version(state: NodeState, target: str) -> None:
    """SIGKILL a writer at each step of an atomic replace: before the rename the old version
    is whole, after it the new one is, and the temp file left behind is cleaned up.

    The kills land at chosen system calls, not after random sleeps: a faster or a busier
    machine used to move them off the write (issue 22), so the test's premise ("a kill
    landed mid-write") held only on some machines.
    """
    ns = _versions()
    jobs = [ns["job_version"](tag) for tag in "AB"]
    allocs = [ns["alloc_version"](job_id) for job_id in ("1001", "2002")]
    state.write_job("42", jobs[0])
    state.set_allocations(allocs[0])
    current, seen, leftovers = 0, set(), 0
    for round_, point in enumerate(KILL_POINTS * 2):  # each point from either version
        new = 1 - current
        proc = _python(_KILLED_WRITER, target, point, str(new), state.state_dir,
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == -signal.SIGKILL, f"{point}: {out}{err}"
        if point == "renamed":
            current = new
        job, table = state.read_job("42"), state.allocations()
        if target == "42.json":
            assert job == jobs[current], f"round {round_} ({point}): not the expected version"
            assert table == allocs[0]
            assert job is not None
            seen.add(job.extra["tag"])
        else:
            assert table == allocs[current], f"round {round_} ({point}): not the expected version"
            assert job == jobs[0]
            seen.add(table["gpu0/mig/gi0"])
        temps = _temp_files(state)
        assert len(temps) == (point != "renamed"), f"{point}: {temps}"
        if point == "half-written":  # a torn file did exist: readers ignored it
            torn = [Path(d, n) for d in (state.state_dir, state.jobs_dir) for n in temps
                    if Path(d, n).exists()]
            assert torn and torn[0].stat().st_size > 0
            with pytest.raises(ValueError):
                json.loads(torn[0].read_bytes())
        if temps:
            leftovers += 1
            assert state.cleanup_temp() == 1  # its writer is dead
            assert _temp_files(state) == []
    assert json.loads(Path(state.job_path("42")).read_text())["schema"] == 2
    # The test only proves something if kills landed mid-write and both versions were seen.
    assert leftovers == 8, "no kill landed mid-write"
    assert len(seen) == 2, f"only saw {seen}"
