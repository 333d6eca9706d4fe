"""``slurmiso run`` as the init of its job step, checked on real processes.

Signals sent to the wrapper reach the program and never kill the wrapper alone; orphans are
adopted; a SIGKILLed wrapper takes its program with it; nothing the program started outlives
the wrapper, even what ignores SIGTERM or left the process group. Liveness is read from
``/proc`` (a zombie counts as gone: it has ended and only waits to be reaped).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator, List

import pytest

from slurmiso.pids import pid_alive
from slurmiso.wrapper import procctl
from slurmiso.wrapper.signals import FORWARDED, JOB_CONTROL, NOT_FORWARDED, forwardable
from tests.waiting import wait_for

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ENV = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SLURMISO_"))}
ENV["PYTHONPATH"] = ROOT

linux_only = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="reads /proc and relies on prctl (Linux)"
)

# A program that records every signal it gets (handlers only set a flag, as they should),
# writes its pid, and exits 0 after the first one it was told to wait for.
RECORDER = r"""
import os, signal, sys, time
out, want = sys.argv[1], int(sys.argv[2])
got = []
for s in signal.valid_signals():
    if s not in (signal.SIGKILL, signal.SIGSTOP, signal.SIGCHLD):
        try:
            signal.signal(s, lambda n, f: got.append(n))
        except (OSError, ValueError):
            pass
with open(out + ".pid.tmp", "w") as fh:
    fh.write(str(os.getpid()))
os.replace(out + ".pid.tmp", out + ".pid")
deadline = time.monotonic() + 60
while want not in got and time.monotonic() < deadline:
    time.sleep(0.01)
with open(out, "w") as fh:
    fh.write(" ".join(map(str, got)))
sys.exit(0 if want in got else 5)
"""


def _wrapper(tmp: Path, *cmd: str, grace: float = 3.0) -> subprocess.Popen[bytes]:
    argv = [sys.executable, "-m", "slurmiso", "run", "--grace", str(grace),
            "--ckpt-dir", str(tmp / "ckpt"), "--", *cmd]
    return subprocess.Popen(argv, env=ENV, cwd=str(tmp))


def _pid(path: Path) -> int:
    def written() -> bool:
        return path.exists() and path.read_text().strip().isdigit()

    wait_for(written, f"a pid in {path}")
    return int(path.read_text())


@pytest.fixture
def cleanup() -> Iterator[List[int]]:
    """Pids to SIGKILL after the test, with their descendants, whatever happened (the old
    wrapper left them running)."""
    pids: List[int] = []
    yield pids
    todo, seen = list(pids), set()
    while todo:
        pid = todo.pop()
        if pid not in seen:
            seen.add(pid)
            todo.extend(procctl.children(pid))
    for pid in seen:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


# -- which signals ---------------------------------------------------------------------------


def test_every_catchable_signal_is_forwarded_but_faults_and_chld() -> None:
    names = {signal.Signals(s).name for s in FORWARDED if s < signal.SIGRTMIN}
    assert {"SIGUSR1", "SIGUSR2", "SIGALRM", "SIGVTALRM", "SIGPROF", "SIGHUP", "SIGINT",
            "SIGQUIT", "SIGCONT", "SIGWINCH", "SIGURG", "SIGXCPU", "SIGPWR", "SIGTSTP"} <= names
    assert int(signal.SIGRTMIN) in FORWARDED and int(signal.SIGRTMAX) in FORWARDED
    for never in ("SIGKILL", "SIGSTOP", "SIGCHLD", "SIGSEGV", "SIGBUS", "SIGFPE", "SIGPIPE"):
        assert int(getattr(signal, never)) not in FORWARDED
    # everything valid is either forwarded or deliberately left alone
    assert set(forwardable()) | NOT_FORWARDED == {int(s) for s in signal.valid_signals()}
    assert set(FORWARDED) >= JOB_CONTROL


# -- signals to the wrapper ------------------------------------------------------------------


@linux_only
@pytest.mark.parametrize(
    "sig",
    [signal.SIGUSR2, signal.SIGALRM, signal.SIGVTALRM, signal.SIGPWR,
     signal.SIGRTMIN + 3, signal.SIGHUP],
)
def test_a_signal_to_the_wrapper_reaches_the_program_and_does_not_kill_the_wrapper(
    tmp_path: Path, cleanup: List[int], sig: int
) -> None:
    out = tmp_path / "got"
    proc = _wrapper(tmp_path, sys.executable, "-c", RECORDER, str(out), str(int(sig)))
    cleanup.append(proc.pid)
    # the program runs, so the wrapper's handlers are up: it installs them before it starts
    # the program (a signal before its loop stays pending and is passed on from there)
    cleanup.append(_pid(tmp_path / "got.pid"))
    os.kill(proc.pid, sig)
    assert proc.wait(10) == 0  # the program's own status: it got the signal and finished
    assert str(int(sig)) in out.read_text().split()


@linux_only
def test_job_control_stops_and_continues_program_and_wrapper(
    tmp_path: Path, cleanup: List[int]
) -> None:
    pidfile = tmp_path / "pid"
    code = (f"import os, time; open({str(pidfile)!r}, 'w').write(str(os.getpid())); "
            "time.sleep(120)")  # default dispositions: SIGTSTP stops it
    proc = _wrapper(tmp_path, sys.executable, "-c", code)
    cleanup.append(proc.pid)
    prog = _pid(pidfile)
    cleanup.append(prog)  # it runs: the wrapper's handlers are up (installed before it)

    def state(pid: int) -> str:
        st = procctl.read_stat(pid)
        return st[0] if st else "gone"

    os.kill(proc.pid, signal.SIGTSTP)  # Ctrl-Z: the program stops, and so does the wrapper
    wait_for(lambda: state(prog) == "T" and state(proc.pid) == "T",
             "the program and the wrapper stopped")
    os.kill(proc.pid, signal.SIGCONT)  # fg: both run again
    wait_for(lambda: state(prog) != "T" and state(proc.pid) != "T",
             "the program and the wrapper running again")
    os.kill(proc.pid, signal.SIGINT)  # Ctrl-C, passed on: the program dies of it
    assert proc.wait(10) == 128 + int(signal.SIGINT)


# -- the wrapper dies -----------------------------------------------------------------------


@linux_only
def test_a_sigkilled_wrapper_takes_its_program_with_it(tmp_path: Path, cleanup: List[int]) -> None:
    pidfile = tmp_path / "pid"
    code = ("import os, signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
            f"open({str(pidfile)!r}, 'w').write(str(os.getpid())); time.sleep(120)")
    proc = _wrapper(tmp_path, sys.executable, "-c", code)
    cleanup.append(proc.pid)
    prog = _pid(pidfile)
    cleanup.append(prog)
    assert pid_alive(prog)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(10)
    wait_for(lambda: not pid_alive(prog), "the program to end with its wrapper")


# -- what the program leaves behind --------------------------------------------------------


@linux_only
def test_orphans_are_adopted_by_the_wrapper_and_ended_with_it(
    tmp_path: Path, cleanup: List[int]
) -> None:
    """A helper that double-forks into its own session is the wrapper's to end: it is
    adopted by the wrapper's guardian (the wrapper's child and a subreaper, issue 22), so it
    stays in the wrapper's tree."""
    orphan_file = tmp_path / "orphan"
    script = (f'sh -c \'setsid sleep 300 & echo $! > {orphan_file}\'; '
              'exec python3 -c "import time; time.sleep(300)"')
    proc = _wrapper(tmp_path, "sh", "-c", script, grace=2.0)
    cleanup.append(proc.pid)
    orphan = _pid(orphan_file)
    cleanup.append(orphan)
    # its parent (the inner sh) has exited: the guardian, a subreaper, is its parent now
    (guardian,) = procctl.children(proc.pid)
    wait_for(lambda: (procctl.read_stat(orphan) or ("", 0, 0))[1] == guardian,
             "the orphan adopted by the guardian")
    assert Path(f"/proc/{guardian}/comm").read_text().strip() == "slurmiso-guard"
    st = procctl.read_stat(orphan)
    assert st is not None and st[2] != proc.pid  # and it left the program's group
    os.kill(proc.pid, signal.SIGTERM)  # a stop: no checkpoint is reported, grace runs out
    assert proc.wait(10) == 143
    assert not pid_alive(orphan)


@linux_only
@pytest.mark.parametrize("escape", ["", "setsid "])
def test_background_children_do_not_survive_a_normal_exit(
    tmp_path: Path, cleanup: List[int], escape: str
) -> None:
    """They inherit SIGTERM ignored from the program: SIGKILL after the bound ends them."""
    bg_file = tmp_path / "bg"
    proc = _wrapper(tmp_path, "sh", "-c", f"{escape}sleep 300 & echo $! > {bg_file}; exit 0")
    cleanup.append(proc.pid)
    bg = _pid(bg_file)
    cleanup.append(bg)
    assert proc.wait(15) == 0  # the program's status, not the leftovers'
    assert not pid_alive(bg), "a background child outlived the wrapper"


@linux_only
def test_leftovers_get_sigterm_before_sigkill(tmp_path: Path, cleanup: List[int]) -> None:
    """A leftover that handles SIGTERM gets the chance to."""
    marks = tmp_path / "marks"
    bg = ("import os, signal, sys, time\n"
          "def h(n, f):\n"
          f"    open({str(marks)!r}, 'a').write(f'term {{time.time()}}\\n'); sys.exit(0)\n"
          "signal.signal(signal.SIGTERM, h)\n"
          f"open({str(marks)!r} + '.pid', 'w').write(str(os.getpid()))\n"
          "time.sleep(300)\n")
    (tmp_path / "bg.py").write_text(bg)
    script = (f"{sys.executable} {tmp_path / 'bg.py'} & "
              f"while [ ! -s {marks}.pid ]; do sleep 0.01; done; exit 3")
    proc = _wrapper(tmp_path, "sh", "-c", script)
    cleanup.append(proc.pid)
    assert proc.wait(15) == 3
    leftover = _pid(Path(f"{marks}.pid"))
    cleanup.append(leftover)
    word, _when = marks.read_text().split()
    assert word == "term"  # it got SIGTERM, and its handler ran
    assert not pid_alive(leftover)
    # that the wrapper then stops waiting at once, not at the bound, is counted in polls, not
    # timed: test_terminate_returns_as_soon_as_nothing_is_left


def test_terminate_returns_as_soon_as_nothing_is_left(monkeypatch: pytest.MonkeyPatch) -> None:
    """Child.terminate polls until the program's processes are gone: with a bound of 600 s
    and the leftovers gone after one poll, it sleeps once and sends no SIGKILL."""
    from slurmiso.wrapper import child as child_mod

    child = child_mod.Child.__new__(child_mod.Child)
    left = iter([True, True, False])  # before SIGTERM, at the first check, after one poll
    sent: List[int] = []
    slept: List[float] = []
    monkeypatch.setattr(child, "anything_left", lambda: next(left), raising=False)
    monkeypatch.setattr(child, "_send_all", sent.append, raising=False)
    child.terminate(600.0, slept.append)
    assert sent == [int(signal.SIGTERM), int(signal.SIGCONT)] and len(slept) == 1


# -- procctl ---------------------------------------------------------------------------------


def test_read_stat_handles_odd_command_names(tmp_path: Path) -> None:
    d = tmp_path / "123"
    d.mkdir()
    (d / "stat").write_bytes(b"123 (evil) S 9 9 (x) R 1 2 3 4) S 77 88 1 0 0\n")
    assert procctl.read_stat(123, str(tmp_path)) == ("S", 77, 88)
    assert procctl.read_stat(124, str(tmp_path)) is None
    (tmp_path / "125").mkdir()
    (tmp_path / "125" / "stat").write_bytes(b"125 (z) Z 77 125 125\n")
    assert procctl.children(77, str(tmp_path)) == [123]  # the zombie is not counted
    assert not pid_alive(125, str(tmp_path)) and pid_alive(123, str(tmp_path))


def test_pid_alive_on_the_live_system() -> None:
    """One pid_alive (slurmiso/pids.py) for the hooks, the sim, the store and the wrapper: a
    running process is alive; a zombie and a reaped one are not."""
    assert pid_alive(os.getpid()) and not pid_alive(0) and not pid_alive(-1)
    child = subprocess.Popen(["true"])
    while procctl.read_stat(child.pid) != ("Z", os.getpid(), os.getpgrp()):
        time.sleep(0.01)  # a readiness wait: until the child is a zombie, not for a time
    assert not pid_alive(child.pid), "a zombie counts as dead"
    child.wait()
    assert not pid_alive(child.pid)


def test_other_systems_get_a_reason_not_a_crash(monkeypatch) -> None:
    monkeypatch.setattr(sys, "platform", "darwin")
    why = procctl.unavailable()
    assert why is not None and "darwin has no prctl()" in why
    assert procctl.set_subreaper() == why
    assert procctl.is_subreaper() is False


@linux_only
def test_subreaper_flag_is_set_and_cleared() -> None:
    before = procctl.is_subreaper()
    try:
        assert procctl.set_subreaper(True) is None and procctl.is_subreaper()
        assert procctl.set_subreaper(False) is None and not procctl.is_subreaper()
    finally:
        procctl.set_subreaper(before)
