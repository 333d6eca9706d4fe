"""The monitor's throttle on the wrapper's side (issue 24, step 5.2), on real processes.

The wrapper owns the throttle and unthrottle signals (URG and WINCH unless the config says
otherwise): it never passes them on; it creates ``$SLURMISO_THROTTLE_FILE`` on the first and
removes it on the second, each a set or a clear, never a toggle; it never follows a symlink
planted at that name and never stops over it. Nothing here times anything: each step waits
for a file or a marker with a generous deadline.
"""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable, List, Optional

import pytest

from slurmiso import checkpoint
from slurmiso.hooks.events import parse_line
from slurmiso.wrapper import throttle as thr
from slurmiso.wrapper.signals import JobEnvironment, SignalHandler
from slurmiso.wrapper.supervisor import Settings, Supervisor
from tests.unit.test_wrapper_init import ENV, ROOT, cleanup, linux_only
from tests.waiting import wait_for

__all__ = ["cleanup"]  # the fixture, used by name

URG, WINCH = int(signal.SIGURG), int(signal.SIGWINCH)
DEADLINE_S = 30.0

# A program that marks any URG or WINCH it gets (its handlers only set a flag), says when it
# is ready (with its view of the throttle file), writes throttled() to a file whenever it
# changes, and exits when told to: 0 if it never got either signal, 7 if it did.
PROGRAM = r"""
import os, signal, sys, time
from slurmiso import checkpoint
out = sys.argv[1]
got = []
for s in (signal.SIGURG, signal.SIGWINCH):
    signal.signal(s, lambda n, f: got.append(n))
def put(name, text):
    with open(f"{out}/{name}.tmp", "w") as fh:
        fh.write(text)
    os.replace(f"{out}/{name}.tmp", f"{out}/{name}")
put("ready", f"{os.environ.get('SLURMISO_THROTTLE_FILE', '')}\n{checkpoint.throttled()}")
seen, deadline = None, time.monotonic() + 120
while not os.path.exists(f"{out}/stop") and time.monotonic() < deadline:
    now = checkpoint.throttled()
    if now != seen:
        seen = now
        put("state", str(now))
    if got:
        put("got", " ".join(map(str, got)))
    time.sleep(0.01)
sys.exit(7 if got else 0)
"""


class Run:
    """One ``slurmiso run`` of :data:`PROGRAM` in ``tmp``."""

    def __init__(self, tmp: Path, pids: List[int], pre: Optional[List[str]] = None,
                 post: Optional[List[str]] = None) -> None:
        self.tmp = tmp
        self.out = tmp / "out"
        self.out.mkdir(exist_ok=True)
        self.ckpt = tmp / "ckpt"
        self.events = tmp / "events.jsonl"
        self.log = tmp / "wrapper.log"
        self.file = Path(thr.throttle_path(str(self.ckpt)))
        argv = [sys.executable, "-m", "slurmiso", *(pre or []), "run", "--grace", "5",
                "--ckpt-dir", str(self.ckpt), "--events", str(self.events), *(post or []),
                "--", sys.executable, "-c", PROGRAM, str(self.out)]
        with open(self.log, "w") as err:  # the job's output, read while it runs
            self.proc = subprocess.Popen(argv, env=ENV, cwd=str(tmp), stderr=err)
        pids.append(self.proc.pid)
        # the program runs, so the wrapper's handlers are in place (installed before it starts)
        wait_for(lambda: (self.out / "ready").exists() or self.proc.poll() is not None,
                 "the program to start", timeout=DEADLINE_S)
        assert self.proc.poll() is None, _read(self.log)
        path, at_start = (self.out / "ready").read_text().split("\n")
        assert path == str(self.file)
        self.throttled_at_start = at_start == "True"

    def send(self, sig: int) -> None:
        """One signal to the wrapper. Wait for it to be acted on before the next: two that are
        pending at once are delivered in signal-number order, whatever order they came in."""
        os.kill(self.proc.pid, sig)

    def logged(self, text: str, times: int) -> None:
        self.wait_for(lambda: _read(self.log).count(text) >= times,
                      f"{text!r} not {times} times in the wrapper's output")

    def wait_for(self, cond: Callable[[], bool], what: str) -> None:
        wait_for(cond, what, timeout=DEADLINE_S)
        assert self.proc.poll() is None, "the wrapper ended"

    def program_sees(self, state: bool) -> None:
        self.wait_for(lambda: _read(self.out / "state") == str(state),
                      f"the program never saw throttled() == {state}")

    def finish(self) -> str:
        """Tell the program to exit; the wrapper's status is the program's: 0 means it never
        got a throttle signal. Returns the wrapper's output."""
        (self.out / "stop").touch()
        self.proc.wait(timeout=DEADLINE_S)
        err = _read(self.log)
        assert not (self.out / "got").exists(), f"the program got {_read(self.out / 'got')}"
        assert self.proc.returncode == 0, err
        return err

    def journal(self) -> List[Any]:
        if not self.events.exists():
            return []
        lines = [json.loads(ln) for ln in self.events.read_text().splitlines() if ln.strip()]
        return [(r["event"], r.get("signal")) for r in lines if "throttle" in r["event"]]


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except FileNotFoundError:
        return ""


# -- through the wrapper ---------------------------------------------------------------------


@linux_only
def test_throttle_creates_the_file_unthrottle_removes_it_and_the_program_gets_neither(
    tmp_path: Path, cleanup: List[int]
) -> None:
    run = Run(tmp_path, cleanup)
    assert not run.throttled_at_start and not run.file.exists()
    run.send(URG)
    run.wait_for(run.file.exists, "SIGURG did not create the throttle file")
    body = json.loads(run.file.read_text())
    assert body["reason"] == "monitor ladder throttle" and body["signal"] == "SIGURG"
    assert os.stat(run.file).st_mode & 0o777 == 0o644
    run.program_sees(True)
    run.send(WINCH)
    run.wait_for(lambda: not run.file.exists(), "SIGWINCH did not remove the throttle file")
    run.program_sees(False)
    err = run.finish()
    assert "throttled by the monitor" in err and "back to full speed" in err
    assert run.journal() == [("throttle", "URG"), ("unthrottle", "WINCH")]
    recs = [json.loads(ln) for ln in run.events.read_text().splitlines()]
    unthrottle = next(r for r in recs if r["event"] == "unthrottle")
    assert isinstance(unthrottle["throttled_s"], float) and unthrottle["throttled_s"] >= 0
    # the epilog folds both into the journal (they are the wrapper's own event names)
    for line in run.events.read_bytes().splitlines():
        assert parse_line(line) is not None


@linux_only
def test_repeated_and_out_of_order_signals_never_invert_the_state(
    tmp_path: Path, cleanup: List[int]
) -> None:
    run = Run(tmp_path, cleanup)
    run.send(WINCH)  # an unthrottle with nothing throttled: nothing to remove, no event
    run.logged("SIGWINCH: not throttled", 1)
    run.send(URG)
    run.wait_for(run.file.exists, "SIGURG did not create the throttle file")
    run.send(URG)  # again: still throttled, one event
    run.logged("SIGURG: already throttled", 1)
    run.send(URG)
    run.logged("SIGURG: already throttled", 2)
    run.program_sees(True)
    run.send(WINCH)
    run.wait_for(lambda: not run.file.exists(), "one SIGWINCH did not undo three SIGURGs")
    run.send(WINCH)  # again: still at full speed
    run.logged("SIGWINCH: not throttled", 2)
    assert not run.file.exists()
    run.program_sees(False)
    run.send(URG)  # and throttled again after all that
    run.wait_for(run.file.exists, "a later SIGURG did not throttle again")
    run.program_sees(True)
    err = run.finish()
    assert not run.file.exists(), "the wrapper leaves no throttle file behind at its exit"
    assert run.journal() == [("throttle", "URG"), ("unthrottle", "WINCH"), ("throttle", "URG")]
    assert "Traceback" not in err


@linux_only
def test_a_symlink_planted_at_the_throttle_file_is_never_followed(
    tmp_path: Path, cleanup: List[int]
) -> None:
    precious = tmp_path / "precious"
    precious.write_text("the user's own file\n")
    run = Run(tmp_path, cleanup)
    run.file.symlink_to(precious)
    run.send(URG)
    run.wait_for(lambda: run.file.exists() and not run.file.is_symlink(),
                 "the planted symlink was not replaced by the throttle file")
    assert precious.read_text() == "the user's own file\n"
    run.send(WINCH)
    run.wait_for(lambda: not os.path.lexists(run.file), "the throttle file was not removed")
    assert precious.read_text() == "the user's own file\n"
    run.finish()


@linux_only
def test_a_throttle_file_that_cannot_be_made_is_logged_once_and_the_job_goes_on(
    tmp_path: Path, cleanup: List[int]
) -> None:
    run = Run(tmp_path, cleanup)
    run.file.mkdir()  # a directory at the name: it can be neither replaced nor unlinked
    for i, sig in enumerate((URG, WINCH, URG, WINCH)):
        run.send(sig)  # each one still turns the wrapper's state, and is journaled
        run.wait_for(lambda n=i + 1: len(run.journal()) == n, f"signal {i + 1} not acted on")
    err = run.finish()
    assert err.count("cannot create the throttle file") == 1, err  # once, not per signal
    assert "Traceback" not in err and run.file.is_dir()


@linux_only
@pytest.mark.parametrize("left", ["file", "symlink"])
def test_a_throttle_file_an_earlier_attempt_left_is_removed_at_start(
    tmp_path: Path, cleanup: List[int], left: str
) -> None:
    """A requeued job starts at full speed (the monitor ended its restraint when the job
    stopped running; it throttles again if it must)."""
    precious = tmp_path / "precious"
    precious.write_text("kept\n")
    stale = Path(thr.throttle_path(str(tmp_path / "ckpt")))
    stale.parent.mkdir(parents=True)
    if left == "file":
        stale.write_text('{"reason": "monitor ladder throttle"}\n')
    else:
        stale.symlink_to(precious)
    run = Run(tmp_path, cleanup)
    assert not run.throttled_at_start and not os.path.lexists(stale)
    assert precious.read_text() == "kept\n"
    run.finish()


@linux_only
def test_the_configs_ladder_signals_are_the_ones_the_wrapper_owns(
    tmp_path: Path, cleanup: List[int]
) -> None:
    example = Path(ROOT, "etc", "slurmiso.yaml").read_text()
    swapped = re.sub(r"(?m)^(\s+)throttle_signal: URG\b", r"\1throttle_signal: WINCH", example)
    swapped = re.sub(r"(?m)^(\s+)unthrottle_signal: WINCH\b", r"\1unthrottle_signal: URG",
                     swapped)
    assert "  throttle_signal: WINCH" in swapped and "unthrottle_signal: URG" in swapped
    cfg = tmp_path / "slurmiso.yaml"
    cfg.write_text(swapped)
    run = Run(tmp_path, cleanup, pre=["-c", str(cfg)])
    run.send(WINCH)
    run.wait_for(run.file.exists, "the config's throttle signal (WINCH) created no file")
    run.program_sees(True)
    run.send(URG)
    run.wait_for(lambda: not run.file.exists(), "the config's unthrottle (URG) removed nothing")
    run.program_sees(False)
    run.finish()
    assert run.journal() == [("throttle", "WINCH"), ("unthrottle", "URG")]


# -- the parts -------------------------------------------------------------------------------


def test_checkpoint_throttled_is_whether_the_file_exists(tmp_path: Path, monkeypatch) -> None:
    path = tmp_path / "throttle"
    monkeypatch.delenv(checkpoint.THROTTLE_ENV, raising=False)
    assert checkpoint.throttled() is False  # not under the wrapper
    monkeypatch.setenv(checkpoint.THROTTLE_ENV, str(path))
    assert checkpoint.throttled() is False
    path.write_text("{}")
    assert checkpoint.throttled() is True
    path.unlink()
    path.symlink_to(tmp_path / "nowhere")  # the name is what counts, not a target
    assert checkpoint.throttled() is True
    path.unlink()
    assert checkpoint.throttled() is False
    assert checkpoint.THROTTLE_ENV == thr.THROTTLE_ENV  # the program and the wrapper agree
    assert "throttled" in checkpoint.__all__


def test_throttle_file_sets_and_clears_idempotently(tmp_path: Path) -> None:
    t = iter(range(100))
    f = thr.ThrottleFile(str(tmp_path / "throttle"), clock=lambda: float(next(t)))
    assert f.clear() is None and not f.throttled  # nothing to clear
    assert f.set("SIGURG") is True and f.set("SIGURG") is False and f.throttled
    assert (tmp_path / "throttle").exists()
    (tmp_path / "throttle").unlink()  # gone behind the wrapper's back: the next set remakes it
    assert f.set("SIGURG") is False and (tmp_path / "throttle").exists()
    assert f.clear() == 1.0 and not (tmp_path / "throttle").exists()  # since the first set
    assert f.clear() is None
    assert [p.name for p in tmp_path.iterdir()] == []  # no temp file left either


def test_throttle_file_errors_are_logged_once_and_never_raised(tmp_path: Path, caplog) -> None:
    f = thr.ThrottleFile(str(tmp_path / "gone" / "throttle"))  # its directory does not exist
    with caplog.at_level(logging.DEBUG, logger="slurmiso.wrapper.throttle"):
        for _ in range(3):
            f.set("SIGURG")
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and "cannot create the throttle file" in warnings[0].getMessage()
    assert f.throttled  # the monitor asked: the wrapper's view follows the signals
    assert f.clear() is not None and f.clear() is None  # clearing it raises nothing either
    assert len([r for r in caplog.records if r.levelno >= logging.WARNING]) == 1


def test_own_signals_are_queued_in_order_and_never_forwarded() -> None:
    h = SignalHandler(JobEnvironment(job_id="7"), {int(signal.SIGTERM): "preempted"},
                      own=[URG, WINCH, int(signal.SIGTERM)])
    assert URG not in h.forward and WINCH not in h.forward
    assert h.own == (URG, WINCH)  # a stop signal stays a stop signal
    for s in (URG, WINCH, URG, int(signal.SIGHUP)):
        h.handle(s)
    assert h.take_own() == [URG, WINCH, URG] and h.take_own() == []
    assert h.take_forward() == [int(signal.SIGHUP)]


def test_a_throttle_signal_that_is_a_stop_signal_keeps_its_stop_meaning(
    tmp_path: Path, caplog
) -> None:
    settings = Settings(ckpt_dir=str(tmp_path), warn_signal=signal.SIGURG)
    with caplog.at_level(logging.WARNING, logger="slurmiso.wrapper.supervisor"):
        sup = Supervisor(["true"], settings, JobEnvironment(), {})
    assert sup._own == {WINCH: "unthrottle"}
    assert "SIGURG is the time-limit --signal here" in caplog.text
    default = Supervisor(["true"], Settings(ckpt_dir=str(tmp_path)), JobEnvironment(), {})
    assert default._own == {URG: "throttle", WINCH: "unthrottle"}
