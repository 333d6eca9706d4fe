"""Nothing of the program outlives ``slurmiso run``, however the wrapper ends (issue 22).

Outside a cgroup (interactive use, containers) nobody else cleans up, so every case here runs
the real wrapper as its own process on a program that builds the whole class of trees a
training job builds: a plain worker in its group, an orphan left in the group, a child that
moved to its own session (``setsid``), and a double-forked daemon; every one of them ignores
SIGTERM, SIGINT and SIGHUP, so only a deliberate SIGKILL ends it. The wrapper is then
stopped or SIGKILLed at points the test waits for (files the program writes, processes seen
in ``/proc``), never after a fixed sleep.

"Nothing remains" is read from ``/proc``, not only from the pids the program wrote: every
process of the run carries a token in its environment (``/proc/PID/environ`` is the
environment it started with), so even a process that was forked a moment before the kill,
before it could write anything, is seen. A zombie counts as gone (it has ended; only its
reaping is left).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Iterator, List

import pytest

from slurmiso.pids import pid_alive
from slurmiso.wrapper import procctl
from tests.waiting import wait_for

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BASE_ENV = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SLURMISO_"))}
BASE_ENV["PYTHONPATH"] = ROOT
TOKEN_VAR = "SLURMISO_TEST_TREE"
#: How long a tree may take to disappear; generous (a loaded CI machine), only polled.
GONE_S = 10.0
EVERY_KIND = "child,orphan,setsid,daemon"

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="reads /proc and relies on prctl (Linux)"
)

# The program. It notes its pid, starts each kind of descendant in turn (each notes its own
# pid once it runs as what it is), writes "ready" once all are noted, and then waits. On the
# checkpoint signal it notes "asked" and never reports a checkpoint (so the wrapper waits out
# the grace); SIGINT and SIGHUP keep their default (the program dies of them, as a program
# does on Ctrl-C); SIGTERM is ignored by the wrapper's doing. With "exit=N" it exits N
# once ready, leaving its descendants behind.
TREE = r"""
import os, signal, sys, time
d, kinds, then = sys.argv[1], sys.argv[2].split(","), sys.argv[3]

def note(name):
    tmp = os.path.join(d, name + ".tmp")
    with open(tmp, "w") as fh:
        fh.write(str(os.getpid()))
    os.replace(tmp, os.path.join(d, name + ".pid"))

def linger():  # a descendant: only SIGKILL ends it (or two minutes, if the test leaked it)
    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(s, signal.SIG_IGN)
    end = time.monotonic() + 120
    while time.monotonic() < end:
        time.sleep(0.05)
    os._exit(0)

def wait_noted(name):
    path = os.path.join(d, name + ".pid")
    while not os.path.exists(path):
        time.sleep(0.002)

signal.signal(signal.SIGUSR2, lambda n, f: open(os.path.join(d, "asked"), "w").close())
note("program")
for kind in kinds:
    if kind == "child":  # a worker in the program's group
        if os.fork() == 0:
            note("child"); linger()
    elif kind == "orphan":  # its parent exits: it stays in the group, re-parented
        if os.fork() == 0:
            if os.fork() == 0:
                note("orphan"); linger()
            os._exit(0)
        os.wait()
    elif kind == "setsid":  # leaves the group and the session; its parent stays
        if os.fork() == 0:
            os.setsid(); note("setsid"); linger()
    elif kind == "daemon":  # the classic double fork: new session, then orphaned
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                note("daemon"); linger()
            os._exit(0)
        os.wait()
    wait_noted(kind)
open(os.path.join(d, "ready"), "w").close()
if then.startswith("exit="):
    sys.exit(int(then[5:]))
end = time.monotonic() + 120
while time.monotonic() < end:
    time.sleep(0.05)
"""


class Run:
    """One ``slurmiso run`` of :data:`TREE`, in a session of its own (its group can be
    signalled as a shell signals a job), tagged with a token every process inherits."""

    def __init__(self, tmp: Path, kinds: str = EVERY_KIND, then: str = "wait",
                 grace: float = 30.0) -> None:
        self.dir = tmp
        self.token = uuid.uuid4().hex
        script = tmp / "tree.py"
        script.write_text(TREE)
        argv = [sys.executable, "-m", "slurmiso", "run", "--grace", str(grace),
                "--ckpt-dir", str(tmp / "ckpt"), "--",
                sys.executable, str(script), str(tmp), kinds, then]
        env = dict(BASE_ENV, **{TOKEN_VAR: self.token})
        self.proc = subprocess.Popen(argv, env=env, cwd=str(tmp), start_new_session=True)
        self.pid = self.proc.pid

    def has(self, name: str) -> bool:
        return (self.dir / name).exists()

    def noted(self) -> List[int]:
        return [int(p.read_text()) for p in self.dir.glob("*.pid")]

    def alive(self) -> List[int]:
        """Every live process of this run (the wrapper included until it exits)."""
        return tree_processes(self.token)

    def kill(self, sig: int = signal.SIGKILL, group: bool = False) -> None:
        try:
            if group:
                os.killpg(self.pid, sig)
            else:
                os.kill(self.pid, sig)
        except ProcessLookupError:
            pass

    def wait(self, timeout: float = GONE_S) -> int:
        return self.proc.wait(timeout)


def tree_processes(token: str) -> List[int]:
    """Live processes whose environment carries ``token``."""
    needle = f"{TOKEN_VAR}={token}".encode()
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as fh:
                env = fh.read()
        except OSError:  # gone, or not ours
            continue
        if needle in env.split(b"\0"):
            st = procctl.read_stat(int(name))
            if st is not None and st[0] != "Z":
                found.append(int(name))
    return found


def signals_taken(pid: int) -> bool:
    """Whether ``pid`` has no signal pending that it does not block (or is gone): from that
    moment every signal sent to it has been acted on (handled, ignored, or fatal)."""
    try:
        fields = dict(line.split(":", 1) for line in
                      Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    except OSError:
        return True
    pending = int(fields["SigPnd"], 16) | int(fields["ShdPnd"], 16)
    return pending & ~int(fields["SigBlk"], 16) == 0


def assert_all_gone(run: Run, context: str) -> None:
    """Poll (up to :data:`GONE_S`) until no process of the run is left; two empty scans in a
    row, so a fork racing one scan cannot hide a survivor."""
    deadline = time.monotonic() + GONE_S
    empty = 0
    left: List[int] = []
    while empty < 2:
        left = run.alive()
        empty = 0 if left else empty + 1
        if left and time.monotonic() > deadline:
            break
        time.sleep(0.02)
    described = {pid: _describe(pid) for pid in left}
    assert not left, f"{context}: still running after {GONE_S:g}s: {described}"


def _describe(pid: int) -> str:
    try:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        cmd = "?"
    st = procctl.read_stat(pid)
    return f"{cmd.strip()[:80]} (state, ppid, pgid {st})"


@pytest.fixture
def runs() -> Iterator[List[Run]]:
    """Runs to clean up after the test, whatever happened: what a broken wrapper left
    running is SIGKILLed here, so one failure does not leak into the next test."""
    made: List[Run] = []
    yield made
    for run in made:
        for _ in range(50):
            left = run.alive()
            if not left:
                break
            for pid in left:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.02)
        if run.proc.poll() is None:
            run.proc.kill()
        run.proc.wait(10)


def _start(runs: List[Run], tmp: Path, **kw: object) -> Run:
    run = Run(tmp, **kw)  # type: ignore[arg-type]
    runs.append(run)
    return run


def _ready(run: Run) -> None:
    wait_for(lambda: run.has("ready"), "the program's readiness marker")
    assert len(run.noted()) == 1 + len(EVERY_KIND.split(","))  # the whole tree runs


# -- the wrapper SIGKILLed: at once, during start-up, and while it runs -----------------------


def _wrapper_has_a_child(run: Run) -> bool:
    return bool(procctl.children(run.pid)) or run.proc.poll() is not None


KILL_POINTS = {
    # right after start: the interpreter is still starting (nothing forked yet, usually)
    "at-once": lambda run: True,
    # the first process the wrapper forked exists (in the fork/prctl/exec window, often)
    "first-fork": _wrapper_has_a_child,
    # the program runs, before it started anything
    "program-started": lambda run: run.has("program.pid"),
    # the program is part-way through starting its descendants
    "mid-spawn": lambda run: run.has("child.pid"),
    # everything is running
    "ready": lambda run: run.has("ready"),
}


@pytest.mark.parametrize("point", sorted(KILL_POINTS))
def test_sigkilled_wrapper_at_any_point_leaves_nothing(
    tmp_path: Path, runs: List[Run], point: str
) -> None:
    run = _start(runs, tmp_path)
    wait_for(lambda: KILL_POINTS[point](run), f"kill point {point}")
    run.kill(signal.SIGKILL)
    assert run.wait() == -signal.SIGKILL
    assert_all_gone(run, f"wrapper SIGKILLed at {point}")


@pytest.mark.parametrize("kind", EVERY_KIND.split(","))
def test_each_kind_of_descendant_dies_with_a_sigkilled_wrapper(
    tmp_path: Path, runs: List[Run], kind: str
) -> None:
    run = _start(runs, tmp_path, kinds=kind)
    wait_for(lambda: run.has("ready"), "the program's readiness marker")
    (descendant,) = [int((tmp_path / f"{kind}.pid").read_text())]
    assert pid_alive(descendant)
    run.kill(signal.SIGKILL)
    run.wait()
    assert_all_gone(run, f"a {kind} of the program, wrapper SIGKILLed")


def test_sigkill_to_the_wrappers_whole_group(tmp_path: Path, runs: List[Run]) -> None:
    """``kill -9 -PGID`` (a shell's ``kill -9 %1``): everything in the wrapper's group dies at
    once, so whatever cleans up must not be in that group."""
    run = _start(runs, tmp_path)
    _ready(run)
    run.kill(signal.SIGKILL, group=True)
    run.wait()
    assert_all_gone(run, "the wrapper's group SIGKILLed")


# -- a stop, then SIGKILL inside the grace ------------------------------------------------


@pytest.mark.parametrize("group", [False, True], ids=["to-wrapper", "to-group"])
def test_sigterm_then_sigkill_within_the_grace(
    tmp_path: Path, runs: List[Run], group: bool
) -> None:
    """Preempted (SIGTERM), then killed while the program is being waited for (a scheduler
    with a short grace, or an impatient user), to the wrapper or to its whole group."""
    run = _start(runs, tmp_path)
    _ready(run)
    run.kill(signal.SIGTERM, group=group)
    wait_for(lambda: run.has("asked"), "the checkpoint signal to reach the program")
    run.kill(signal.SIGKILL, group=group)
    run.wait()
    assert_all_gone(run, f"SIGTERM then SIGKILL {'to the group' if group else ''}")


def test_stop_without_checkpoint_ends_everything_and_exits_143(
    tmp_path: Path, runs: List[Run]
) -> None:
    run = _start(runs, tmp_path, grace=2.0)  # 1 s to checkpoint; the program never reports
    _ready(run)
    run.kill(signal.SIGTERM)
    assert run.wait() == 143
    assert_all_gone(run, "a stop whose grace ran out")


# -- interactive: Ctrl-C, hang-up, and the kill -9 that often follows -------------------------


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGHUP], ids=["INT", "HUP"])
@pytest.mark.parametrize("group", [False, True], ids=["to-wrapper", "to-group"])
def test_interactive_signal_ends_the_program_and_everything_it_started(
    tmp_path: Path, runs: List[Run], sig: int, group: bool
) -> None:
    """The program dies of the signal; its descendants ignore it (and SIGTERM) and are
    SIGKILLed after the bound; the wrapper exits with the program's status."""
    run = _start(runs, tmp_path)
    _ready(run)
    run.kill(sig, group=group)
    assert run.wait(GONE_S + 5) == 128 + int(sig)
    assert_all_gone(run, f"{signal.Signals(sig).name}")


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGHUP], ids=["INT", "HUP"])
def test_interactive_signal_then_sigkill_while_leftovers_are_ended(
    tmp_path: Path, runs: List[Run], sig: int
) -> None:
    """Ctrl-C, then ``kill -9`` while the wrapper is still giving the leftovers their
    SIGTERM bound: the leftovers must not survive the wrapper's death."""
    run = _start(runs, tmp_path)
    _ready(run)
    program = int((tmp_path / "program.pid").read_text())
    run.kill(sig, group=True)
    wait_for(lambda: not pid_alive(program), "the program to die of the signal")
    run.kill(signal.SIGKILL, group=True)
    run.wait()
    assert_all_gone(run, f"{signal.Signals(sig).name} then SIGKILL")


# -- the program's own end, and a helper of the wrapper that dies ----------------------------


def test_normal_exit_passes_the_status_and_ends_every_kind_left_behind(
    tmp_path: Path, runs: List[Run]
) -> None:
    run = _start(runs, tmp_path, then="exit=3")
    assert run.wait(GONE_S + 5) == 3
    assert len(run.noted()) == 5
    assert_all_gone(run, "the program exited, leaving descendants")


def test_wrappers_own_child_sigkilled_the_wrapper_ends_the_rest(
    tmp_path: Path, runs: List[Run]
) -> None:
    """Whatever the wrapper's direct child is (the program, or a helper between them), its
    SIGKILL ends the run as a SIGKILLed program (137) and nothing is left."""
    run = _start(runs, tmp_path)
    _ready(run)
    direct = int((tmp_path / "program.pid").read_text())
    while True:  # up from the program to the wrapper's child it descends from
        st = procctl.read_stat(direct)
        assert st is not None, "the program's line of parents broke"
        if st[1] == run.pid:
            break
        direct = st[1]
    os.kill(direct, signal.SIGKILL)
    assert run.wait(GONE_S + 5) == 128 + int(signal.SIGKILL)
    assert_all_gone(run, "the wrapper's direct child SIGKILLed")


def test_signals_slurm_sends_every_process_do_not_end_the_run(
    tmp_path: Path, runs: List[Run]
) -> None:
    """Slurm signals every process of the step (SIGTERM on preemption, the --signal USR1,
    scancel --signal): none of them may kill a helper of the wrapper and with it the program;
    the checkpoint signal still reaches the program."""
    run = _start(runs, tmp_path, grace=2.0)
    _ready(run)
    everyone = run.alive()
    program = int((tmp_path / "program.pid").read_text())
    helpers = [p for p in everyone if p not in run.noted() and p != run.pid]
    for sig in (signal.SIGUSR1, signal.SIGHUP, signal.SIGINT, signal.SIGQUIT, signal.SIGTERM):
        for pid in helpers:
            os.kill(pid, sig)
    # Not a sleep: wait until each helper has taken its signals (none left pending and
    # unblocked), so a helper those signals kill has died by the time of the check.
    wait_for(lambda: all(signals_taken(pid) for pid in helpers), "the helpers to take Slurm's signals")
    assert all(pid_alive(pid) for pid in helpers), [_describe(p) for p in helpers]
    assert pid_alive(program) and run.proc.poll() is None
    for pid in everyone:
        os.kill(pid, signal.SIGTERM)  # the preemption itself, to every process
    wait_for(lambda: run.has("asked"), "the checkpoint signal to reach the program")
    assert run.wait() == 143
    assert_all_gone(run, "preempted after Slurm's signals to every process")
